"""Reference solutions of exercise ex06 (cross-attention and the decoder layer): the library's, re-exported.

``MultiHeadAttention`` is exercise 4's module, which the exercise carries over: cross-attention builds on it.
"""

from attention_course.cross_attention import CrossAttention, DecoderLayer
from attention_course.multi_head import MultiHeadAttention

__all__ = ["CrossAttention", "DecoderLayer", "MultiHeadAttention"]
