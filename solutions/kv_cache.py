"""Reference solutions of exercise ex10 (the KV cache): the library's, re-exported."""

from attention_course.kv_cache import KVCache, PagedKVCache, generate

__all__ = ["KVCache", "PagedKVCache", "generate"]
