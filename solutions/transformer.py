"""Reference solutions of exercise ex07 (the transformer block and generation): the library's, re-exported.

``MultiHeadAttention`` is exercise 4's module, which the exercise carries over: the block's attention.
"""

from attention_course.multi_head import MultiHeadAttention
from attention_course.transformer import TransformerBlock, generate

__all__ = ["MultiHeadAttention", "TransformerBlock", "generate"]
