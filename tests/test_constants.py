"""DeepNorm's constants against the paper's table (arXiv 2203.00555, Table 1) and the named presets."""

import math

import pytest

from deepnorm_exp.errors import ConfigError
from deepnorm_exp.constant_roles import ROLES
from deepnorm_exp.schemes import build_scheme
from deepnorm_exp.schemes.deepnorm import deepnorm_constants


@pytest.mark.parametrize("m", [1, 6, 12, 18, 100, 1000, 2500])
def test_decoder_only_constants_follow_the_paper(m):
    scheme = build_scheme({"name": "deepnorm"}, {"decoder": m}, 1e-5)
    assert scheme.residual_multiplier("decoder") == pytest.approx((2 * m) ** 0.25, rel=1e-12)  # alpha
    assert scheme.init_gain("decoder") == pytest.approx((8 * m) ** -0.25, rel=1e-12)  # beta
    assert scheme.constants() == {"residual_multiplier": {"decoder": scheme.residual_multiplier("decoder")},
                                  "branch_multiplier": {"decoder": 1.0},
                                  "init_gain": {"decoder": scheme.init_gain("decoder")}}


def test_known_values_at_depth_1000():
    alpha, beta = deepnorm_constants({"decoder": 1000}, "decoder")
    assert alpha == pytest.approx(6.6874, abs=1e-4)  # 2000 ** 0.25
    assert beta == pytest.approx(0.105737, abs=1e-6)  # 8000 ** -0.25


@pytest.mark.parametrize("n", [1, 6, 18, 100])
def test_encoder_only_constants(n):
    assert deepnorm_constants({"encoder": n}, "encoder") == pytest.approx(((2 * n) ** 0.25, (8 * n) ** -0.25))


@pytest.mark.parametrize("n,m", [(6, 6), (18, 6), (6, 18), (100, 100), (500, 500)])
def test_encoder_decoder_constants(n, m):
    depths = {"encoder": n, "decoder": m}
    enc, dec = deepnorm_constants(depths, "encoder"), deepnorm_constants(depths, "decoder")
    assert enc == pytest.approx((0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)))
    assert dec == pytest.approx(((3 * m) ** 0.25, (12 * m) ** -0.25))
    ts_alpha, ts_beta = deepnorm_constants(depths, "encoder", "torchscale")
    assert ts_alpha == pytest.approx(enc[0])
    assert ts_beta == pytest.approx(1.15 * (n**4 * m) ** (-1 / 16))
    assert deepnorm_constants(depths, "decoder", "torchscale") == pytest.approx(dec)


def test_glm130b_preset():
    scheme = build_scheme({"name": "deepnorm", "constants": "glm130b"}, {"decoder": 70}, 1e-5)
    assert scheme.residual_multiplier("decoder") == pytest.approx(math.sqrt(140))
    assert scheme.init_gain("decoder") == pytest.approx(1 / math.sqrt(140))
    with pytest.raises(ConfigError, match="single stack"):
        deepnorm_constants({"encoder": 6, "decoder": 6}, "encoder", "glm130b")


def test_explicit_alpha_beta_override_the_preset():
    scheme = build_scheme({"name": "deepnorm", "alpha": 3.0, "beta": 0.5}, {"decoder": 24}, 1e-5)
    assert (scheme.residual_multiplier("decoder"), scheme.init_gain("decoder")) == (3.0, 0.5)
    only_beta = build_scheme({"name": "deepnorm", "beta": 0.5}, {"decoder": 24}, 1e-5)
    assert only_beta.residual_multiplier("decoder") == pytest.approx(48**0.25)


@pytest.mark.parametrize("name", ["post", "pre"])
def test_post_and_pre_have_unit_constants(name):
    scheme = build_scheme({"name": name}, {"decoder": 100}, 1e-5)
    assert scheme.constants() == {role: {"decoder": 1.0} for role in ROLES}


@pytest.mark.parametrize("section,key", [
    ({"name": "deepnorm", "constants": "fairseq"}, "norm.constants"),
    ({"name": "deepnorm", "alpha": -1.0}, "norm.alpha"),
    ({"name": "deepnorm", "beta": 0.0}, "norm.beta"),
    ({"name": "deepnorm", "gamma": 1.0}, "norm.gamma"),
    ({"name": "nonorm"}, "norm"),
])
def test_bad_scheme_sections_name_the_key(section, key):
    with pytest.raises(ConfigError) as err:
        build_scheme(section, {"decoder": 6}, 1e-5)
    assert err.value.key == key
