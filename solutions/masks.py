"""Reference solutions of exercise ex03 (masks): the library's, re-exported."""

from attention_course.masks import (
    causal_mask,
    combine_masks,
    masked_attention,
    padding_mask,
)

__all__ = [
    "causal_mask",
    "combine_masks",
    "masked_attention",
    "padding_mask",
]
