"""The mechanism claims at the paper's shape and window (analysis/early_window.py), each on hand-made records
where it holds and where it is false: figure 5's contrast across depth with warm-up, figure 4's at 18L-18L
without warm-up against Post-LN with warm-up and Post-LN-init."""

import numpy as np
import pandas as pd

from deepnorm_exp.analysis import claims, early_window as early
from deepnorm_exp.analysis.claims import Evidence

NORMS = ("post", "post_init", "deepnorm", "pre")
DEPTHS = (6, 18, 100)
BLOCKS = 10  # per stack: the bottom and top tenth are one block each


def update(norm, depth, warm):
    """The accumulated model update, the same at every step of the window: with warm-up Post-LN's grows as
    sqrt(depth / 6) from 2 while DeepNorm's stays 1; without warm-up Post-LN's is 8 (under the saturation,
    0.8 sqrt(2 * 64) = 9.05), its remedies' lower."""
    if warm:
        return 2.0 * (depth / 6) ** 0.5 if norm in ("post", "pre") else 1.0
    return {"post": 8.0, "post_init": 3.0, "deepnorm": 2.0, "pre": 2.5}[norm]


def late(norm, depth, warm):
    """Per-step change over steps 11-30 over step 1's: Post-LN without warm-up nearly stops."""
    return 0.05 if (norm, warm) == ("post", False) else 0.5


def ln_growth(norm, depth, warm):
    return 1.5 if (norm, warm) == ("post", False) else 1.05


def bottom_over_top(norm, depth, warm):
    """The decoder's bottom block's gradient over its top block's (the rest at 1)."""
    return {("post", False): 0.1, ("post", True): 0.8, ("post_init", False): 1.2}.get((norm, warm),
                                                                                      2.0 if norm == "pre" else 1.0)


def records(update=update, late=late, ln_growth=ln_growth, bottom_over_top=bottom_over_top, ln_start=None,
            norms=NORMS) -> Evidence:
    runs, scalars, layers = [], [], []
    for norm in norms:
        for depth in DEPTHS:
            for warm in (False, True):
                for seed in (0, 1):
                    name = f"{norm}-L{depth}-w{int(warm)}-s{seed}"
                    runs.append(dict(run_name=name, norm=norm, depth=depth, seed=seed, status="completed",
                                     **{"train.warmup_steps": 4000 if warm else 0, "model.d_model": 64}))
                    u, jitter = update(norm, depth, warm), 1 + 0.01 * seed
                    scalars += [dict(run_name=name, norm=norm, depth=depth, step=step, model_update=u * jitter,
                                     model_update_step=jitter if step == 1 else late(norm, depth, warm) * jitter)
                                for step in range(1, early.WINDOW + 1)]
                    start = (ln_start or (lambda *_: 10.0))(norm, depth, warm)
                    for stack, flip in (("encoder", True), ("decoder", False)):
                        ratio = bottom_over_top(norm, depth, warm)
                        for block in range(BLOCKS):
                            grad = (1 / ratio if flip else ratio) if block == 0 else 1.0
                            position = block + (BLOCKS if stack == "decoder" else 0)
                            layers += [dict(run_name=name, norm=norm, depth=depth, stack=stack, position=position,
                                            step=0, ln_input_norm=start, grad_norm=np.nan),
                                       dict(run_name=name, norm=norm, depth=depth, stack=stack, position=position,
                                            step=early.WINDOW, grad_norm=grad * jitter,
                                            ln_input_norm=start * ln_growth(norm, depth, warm) * jitter)]
    e = Evidence("/nonexistent")
    for kind, frame in (("runs", runs), ("scalars", scalars), ("layers", layers)):
        e._cache[kind, early.STUDY] = pd.DataFrame(frame)
    e._cache["finished", early.STUDY] = True
    return e


CHECKS = (early.post_update_larger_than_deepnorms, early.deepnorm_update_flat_with_depth,
          early.post_update_then_stops, early.warmup_and_init_hold_post_back, early.post_ln_inputs_grow,
          early.post_gradient_vanishes, early.pre_bottom_gradients_larger)


def test_every_mechanism_claim_reads_the_early_study_and_holds_on_records_where_it_does():
    e = records()
    assert {c.study for c in claims.CLAIMS if c.check in CHECKS} == {early.STUDY}
    assert len([c for c in claims.CLAIMS if c.check in CHECKS]) == len(CHECKS)
    for check in CHECKS:
        assert check(e)[0] is True, check.__name__
    met, numbers = early.deepnorm_update_flat_with_depth(e)
    assert numbers.endswith("Post-LN 4.08/4.08, DeepNorm 1/1")  # sqrt(100 / 6) = 4.08, seed by seed


def test_figure_5_post_ln_not_above_deepnorm_at_one_depth_is_false():
    def same_at_100(norm, depth, warm):
        return 1.0 if (warm and depth == 100) else update(norm, depth, warm)
    met, numbers = early.post_update_larger_than_deepnorms(records(update=same_at_100))
    assert met is False and "L100 1/1.01 vs 1/1.01" in numbers


def test_figure_5_growth_is_post_lns_against_deepnorms_not_deepnorms_against_zero():
    """Both grow 4.08x from L6 to L100 (with Adam every update grows somewhat): DeepNorm growing is not the
    claim's failure, growing as much as Post-LN is."""
    def both_grow(norm, depth, warm):
        return (2.0 if norm == "post" else 1.0) * (depth / 6) ** 0.5 if warm else 1.0
    assert early.deepnorm_update_flat_with_depth(records(update=both_grow))[0] is False

    def deepnorm_grows_less(norm, depth, warm):
        return update(norm, depth, warm) * (1.5 if warm and norm == "deepnorm" and depth == 100 else 1.0)
    assert early.deepnorm_update_flat_with_depth(records(update=deepnorm_grows_less))[0] is True

    def post_saturated(norm, depth, warm):
        return 10.0 if (norm, depth, warm) == ("post", 100, True) else update(norm, depth, warm)
    met, numbers = early.deepnorm_update_flat_with_depth(records(update=post_saturated))
    assert met is None and "saturated at L100" in numbers


def test_figure_4a_stopping_is_against_post_ln_init_and_deepnorm_on_the_same_schedule():
    met, numbers = early.post_update_then_stops(records(late=lambda *_: 0.5))
    assert met is False and "Post-LN without warm-up 0.5/0.5" in numbers
    assert early.post_update_then_stops(records(norms=("post", "deepnorm", "pre")))[0] is None


def test_figure_4a_warmup_and_init_each_must_hold_post_ln_back():
    def init_no_help(norm, depth, warm):
        return 9.0 if (norm, warm) == ("post_init", False) else update(norm, depth, warm)
    assert early.warmup_and_init_hold_post_back(records(update=init_no_help))[0] is False

    def both_saturated(norm, depth, warm):
        return 10.0 if (norm, warm) in (("post", False), ("post_init", False)) else update(norm, depth, warm)
    met, numbers = early.warmup_and_init_hold_post_back(records(update=both_saturated))
    assert met is True and numbers.endswith("(1 comparison(s) saturated on both sides, left out)")


def test_figure_4bc_reads_growth_within_the_run_not_a_level_present_at_step_0():
    """Post-LN without warm-up starting at 3x the others' LN input and growing as little as they do: a large
    level, no growth, false."""
    e = records(ln_growth=lambda *_: 1.05, ln_start=lambda n, d, w: 30.0 if (n, w) == ("post", False) else 10.0)
    met, numbers = early.post_ln_inputs_grow(e)
    assert met is False and numbers.endswith("Post-LN's level without warm-up 3.94/3.98 sqrt(d)")  # 31.5 / 8


def test_figure_4d_and_pre_ln_read_the_decoder_not_the_encoder():
    """The encoder's blocks hold the inverse ratio: reading them would reverse both verdicts."""
    assert early.post_gradient_vanishes(records(bottom_over_top=lambda n, d, w: 1.0))[0] is False
    met, numbers = early.pre_bottom_gradients_larger(records(bottom_over_top=lambda n, d, w: 0.5))
    assert met is False and "L100 0.5/0.5" in numbers
