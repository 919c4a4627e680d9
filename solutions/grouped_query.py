"""Reference solutions of exercise ex05 (grouped-query attention): the library's, re-exported."""

from attention_course.grouped_query import (
    GroupedQueryAttention,
    gqa_from_mha,
    kv_cache_bytes,
    repeat_kv,
)

__all__ = [
    "GroupedQueryAttention",
    "gqa_from_mha",
    "kv_cache_bytes",
    "repeat_kv",
]
