"""Each scheme's residual rule, computed by hand on a real sublayer, and the scheme/model contract."""

import pytest
import torch
from torch import nn

import deepnorm_exp
from omegaconf import open_dict
from deepnorm_exp.models.layers import AttentionSettings, FeedForward, SelfAttention
from deepnorm_exp.schemes import SCHEMES, build_scheme, register
from deepnorm_exp.schemes.base import NormScheme
from deepnorm_exp.schemes.pre import PreNormResidual


def manual_layer_norm(x, norm):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


@pytest.fixture
def x():
    torch.manual_seed(0)
    return torch.randn(2, 5, 16)


@pytest.mark.parametrize("sublayer_cls", [lambda: SelfAttention(AttentionSettings(16, 2)), lambda: FeedForward(16, 32, 0.0)])
def test_deepnorm_sublayer_is_layer_norm_of_alpha_x_plus_g(x, sublayer_cls):
    scheme = build_scheme({"name": "deepnorm"}, {"decoder": 50}, 1e-5)
    block = scheme.wrap(sublayer_cls(), "decoder", 0)
    with torch.no_grad():  # give the norm non-trivial affine parameters so they are part of the check
        block.norm.weight.uniform_(0.5, 1.5)
        block.norm.bias.uniform_(-0.5, 0.5)
    alpha = 100**0.25
    expected = manual_layer_norm(alpha * x + block.sublayer(x), block.norm)
    torch.testing.assert_close(block(x), expected)


def test_post_ln_is_layer_norm_of_x_plus_g(x):
    block = build_scheme({"name": "post"}, {"decoder": 50}, 1e-5).wrap(FeedForward(16, 32, 0.0), "decoder", 0)
    torch.testing.assert_close(block(x), manual_layer_norm(x + block.sublayer(x), block.norm))


def test_pre_ln_is_x_plus_g_of_layer_norm(x):
    block = build_scheme({"name": "pre"}, {"decoder": 50}, 1e-5).wrap(FeedForward(16, 32, 0.0), "decoder", 0)
    assert isinstance(block, PreNormResidual)
    torch.testing.assert_close(block(x), x + block.sublayer(manual_layer_norm(x, block.norm)))


def test_final_norm_only_where_the_scheme_needs_one():
    kinds = {name: type(build_scheme({"name": name}, {"decoder": 4}, 1e-5).final_norm(16, "decoder"))
             for name in ("post", "pre", "deepnorm")}
    assert kinds == {"post": nn.Identity, "pre": nn.LayerNorm, "deepnorm": nn.Identity}


def test_norm_epsilon_reaches_every_layer_norm():
    model = deepnorm_exp.build_model(deepnorm_exp.compose(["norm=pre", "depth=2", "model.norm_eps=1e-3"]))
    eps = {m.eps for m in model.modules() if isinstance(m, nn.LayerNorm)}
    assert eps == {1e-3}


def test_a_new_scheme_needs_no_model_or_trainer_change():
    """A scheme defined here, outside the package, builds a model that runs: the model asks, never tests names."""

    class ScaledResidual(nn.Module):
        def __init__(self, sublayer, scale):
            super().__init__()
            self.sublayer, self.scale = sublayer, scale

        def forward(self, x):
            return x + self.scale * self.sublayer(x)

    @register("test_scaled_residual")
    class Scaled(NormScheme):
        def residual(self, sublayer, stack, layer):
            return ScaledResidual(sublayer, 1.0 / (layer + 1))

    try:
        cfg = deepnorm_exp.compose(["depth=3"], check=False)
        with open_dict(cfg):  # no conf/norm/ file: the section by hand, the name only
            cfg.norm = {"name": "test_scaled_residual"}
        model = deepnorm_exp.build_model(cfg)
        assert [b.attn.scale for b in model.blocks] == [1.0, 0.5, 1 / 3]
        logits = model(torch.randint(0, 256, (2, 8)))
        assert logits.shape == (2, 8, 256) and torch.isfinite(logits).all()
    finally:
        SCHEMES._items.pop("test_scaled_residual")


def test_model_source_never_names_a_scheme():
    import inspect

    from deepnorm_exp.models import decoder, encdec, layers

    for module in (decoder, encdec, layers):
        source = inspect.getsource(module).lower()
        for name in SCHEMES.names():
            assert f'"{name}"' not in source and f"'{name}'" not in source, (module.__name__, name)


def test_registry_lists_the_shipped_schemes():
    assert {"post", "pre", "deepnorm"} <= set(SCHEMES.names())


def test_a_field_a_scheme_config_redeclares_keeps_its_rule():
    """A dataclass field redeclared in a subclass (dsinit's `base = "post"`) replaces the parent's field and
    its metadata: a plain default there would drop the rule (`choices`) without a word."""
    import dataclasses

    for name in SCHEMES.names():
        config = SCHEMES.get(name).Config
        own = {f.name: f.metadata for f in dataclasses.fields(config)}
        for parent in config.__mro__[1:]:
            if dataclasses.is_dataclass(parent):
                for inherited in dataclasses.fields(parent):
                    for rule in ("choices", "check", "null"):
                        if rule in inherited.metadata:
                            assert own[inherited.name].get(rule) == inherited.metadata[rule], (name, inherited.name)


@pytest.mark.parametrize("key", ["layer", "base", "init", "rule", "constants", "omega_param"])
def test_a_scheme_key_outside_its_choices_is_one_line_naming_them(key):
    """Each scheme with `key` refuses a value outside its rule's choices, naming the full key and the choices."""
    import dataclasses

    from deepnorm_exp.errors import ConfigError

    having = [name for name in SCHEMES.names()
              if key in {f.name for f in dataclasses.fields(SCHEMES.get(name).Config)}]
    assert having
    for name in having:
        with pytest.raises(ConfigError, match=rf"norm\.{key}=bogus is invalid: choose one of"):
            deepnorm_exp.compose([f"norm={name}", f"norm.{key}=bogus"])


def test_a_keys_own_rule_is_said_before_a_check_across_keys_reads_it():
    """norm.base=Post is the mistake, not embedding_norm (whose check reads base): each key's rule holds first."""
    from deepnorm_exp.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^norm\.base=Post is invalid: choose one of"):
        deepnorm_exp.compose(["norm=deepscalelm", "norm.base=Post", "norm.embedding_norm=true"])


@pytest.mark.parametrize("model", ["decoder", "encdec"])
def test_every_schemes_parameters_are_at_least_one_dimensional_as_fsdp2_shards_them(model):
    """fully_shard refuses a 0-d parameter (it shards on dim 0): hyper_connections' scales were 0-d, so
    train.parallel=fsdp failed at its first run on 2 ranks."""
    for name in SCHEMES.names():
        built = deepnorm_exp.build_model(deepnorm_exp.compose([f"norm={name}", "depth=2", f"model={model}"]))
        scalars = [n for n, p in built.named_parameters() if p.dim() == 0]
        assert not scalars, (name, scalars)
