"""Reference solutions of exercise ex08 (positional information): the library's, re-exported."""

from attention_course.positions import (
    alibi_bias,
    alibi_slopes,
    apply_rope,
    sinusoidal_encoding,
)

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "sinusoidal_encoding",
]
