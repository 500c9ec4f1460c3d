"""Collapse at initialisation: the mean cosine similarity between the final hidden states of different
positions (rank collapse, Dong et al. 2021; Noci et al. 2022), per scheme, baseline init and depth, before any
step. 1 means every position carries the same vector: the model's output cannot depend on the input yet.

    python -m benchmarks.init_collapse [--depths 6 12 18 24 48] [--seeds 3]

The numbers behind issue 24's choice of the baselines' init (norm.init=fairseq against xavier). Never a test.
"""

from __future__ import annotations

import argparse

import torch

import deepnorm_exp
from deepnorm_exp.build import build_model

SCHEMES = (("post", "xavier"), ("post", "fairseq"), ("pre", "xavier"), ("pre", "fairseq"), ("deepnorm", None))


def position_cosine(hidden: torch.Tensor) -> float:
    """Mean over sequences and over ordered pairs of distinct positions of cos(h_i, h_j); hidden: (b, t, d)."""
    unit = torch.nn.functional.normalize(hidden.double(), dim=-1)
    similarity = unit @ unit.transpose(1, 2)
    t = similarity.shape[1]
    off_diagonal = similarity.sum((1, 2)) - similarity.diagonal(dim1=1, dim2=2).sum(1)
    return float((off_diagonal / (t * (t - 1))).mean())


def at_init(norm: str, init: str | None, depth: int, seeds: int) -> float:
    values = []
    for seed in range(seeds):
        overrides = [f"norm={norm}", f"depth={depth}", f"seed={seed}"] + ([f"norm.init={init}"] if init else [])
        cfg = deepnorm_exp.compose(overrides)
        torch.manual_seed(seed)
        model = build_model(cfg).eval()
        tokens = torch.randint(0, cfg.model.vocab_size, (8, 65), generator=torch.Generator().manual_seed(123))
        with torch.no_grad():
            values.append(position_cosine(model.features({"tokens": tokens})))
    return sum(values) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", type=int, nargs="+", default=[6, 12, 18, 24, 48])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    print("| depth | " + " | ".join(f"{n} {i or 'paper'}" for n, i in SCHEMES) + " |")
    print("|---|" + "---|" * len(SCHEMES))
    for depth in args.depths:
        print(f"| {depth} | " + " | ".join(f"{at_init(n, i, depth, args.seeds):.3f}" for n, i in SCHEMES) + " |")


if __name__ == "__main__":
    main()
