"""Reference solutions of exercise ex04 (multi-head attention): the library's, re-exported.

Chapters 5 to 7 build on the same module, so it lives once, in ``attention_course.multi_head``.
"""

from attention_course.multi_head import (
    MultiHeadAttention,
    attention_entropy,
    load_torch_weights,
    merge_heads,
    mha_parameter_count,
    split_heads,
)

__all__ = [
    "MultiHeadAttention",
    "attention_entropy",
    "load_torch_weights",
    "merge_heads",
    "mha_parameter_count",
    "split_heads",
]
