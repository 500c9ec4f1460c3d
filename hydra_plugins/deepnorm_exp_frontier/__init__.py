"""Hydra plugin package for deepnorm_exp (Hydra only loads plugins from the `hydra_plugins` namespace)."""
