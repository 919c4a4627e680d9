"""Reference solutions of exercise ex09 (heads that are convolutions): the library's, re-exported."""

from attention_course.conv_heads import (
    attention_conv2d,
    quadratic_relative_encoding,
)

__all__ = ["attention_conv2d", "quadratic_relative_encoding"]
