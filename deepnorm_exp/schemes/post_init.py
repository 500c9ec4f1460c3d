"""Post-LN-init (Wang et al., 2022, "DeepNet", arXiv 2203.00555, section 3): Post-LN's architecture with a
better initialisation, the paper's own control for what makes Post-LN unstable.

x_{l+1} = LN(x_l + G(x_l)), as Post-LN; every projection of layer l (1-based, of a stack of N) starts as a
Xavier-normal draw divided by k_l = N - l + 1, i.e. N(0, 1 / (k_l^2 d')) with d' the mean of the input and
output widths (the paper's formula for the FFN's output projection, "the weights of l-th layer" for the
rest). Unlike Fixup-style rules the *lower* layers are narrowed most: the paper says this separates the
gradient's scale from the model update's. Figures 3 and 4 run it beside Post-LN, with warm-up (it converges
at 18L-18L where Post-LN does not). Read here as the paper writes it: q, k and v at the same gain as the rest
(no fairseq 1/sqrt(2)), biases 0, each stack's layers counted in that stack (the decoder's cross-attention
is part of its layer). No official code of it was published.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import register
from .base import NormedConfig
from .post import PostNorm


@dataclass
class PostInitConfig(NormedConfig):
    name: str = "post_init"


@register("post_init")
class PostLNInit(PostNorm):
    Config = PostInitConfig

    def gain(self, role: str, stack: str, layer: int) -> float:
        # k_l = N - l + 1 with l = layer + 1; at least 1, for the shape probes the memory estimate builds with
        # more layers than the stack has (train/memory.py), where the draw is never used
        return 1.0 / max(self.depths[stack] - layer, 1)
