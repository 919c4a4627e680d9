"""The claims of chapter 10 (the KV cache), asserted with the course library against independent arithmetic
and PyTorch.

Expected values come from the model run on the whole sequence without a cache (chapter 7's
``TinyGPT.forward``, on the same blocks, which ``tests/test_claims_transformer.py`` checks against Hugging
Face's GPT-2), from closed forms written out here (the counts of positions and scores, ``ceil(len /
block_size)``), or from PyTorch's ``scaled_dot_product_attention``, never from the cached code path alone.
The common mistake the chapter shows failing, a decoding step under the top-left causal mask of
``is_causal=True``, is asserted to change the logits. Hugging Face's ``generate(use_cache=True)`` and its
``DynamicCache`` are compared in ``tests/test_reference.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attention_course.device import seeded_generator
from attention_course.grouped_query import kv_cache_bytes
from attention_course.kv_cache import CachedGPT, KVCache, PagedKVCache, generate
from attention_course.masks import causal_mask, masked_attention
from attention_course.transformer import TinyGPT


def randn(*shape: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=seeded_generator(seed), dtype=torch.float64).to(dtype)


def model_with_spread_logits(seed: int, n_kv_heads: int = 2, dtype=torch.float64) -> CachedGPT:
    """The chapter's model, 4 query heads and ``n_kv_heads`` key/value heads, weights N(0, 1 / last size):
    GPT-2's N(0, 0.02^2) would leave every logit near 0 and greedy decoding among near ties."""
    model = CachedGPT(24, d_model=64, n_heads=4, n_layers=2, d_ff=256, max_len=64, n_kv_heads=n_kv_heads)
    generator = seeded_generator(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            drawn = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            if parameter.dim() > 1:
                parameter.copy_(drawn / math.sqrt(parameter.shape[-1]))
            else:
                parameter.copy_(
                    1 + 0.1 * drawn if "norm" in name and name.endswith("weight") else 0.1 * drawn
                )
    return model.to(dtype).eval()


def step_logits(model: torch.nn.Module, prompt: torch.Tensor, n: int, use_cache: bool):
    """Greedy tokens, and the last position's logits of each step ``[batch, n, vocab]``."""
    recorded: list[torch.Tensor] = []
    handle = model.register_forward_hook(lambda module, inputs, output: recorded.append(output[:, -1]))
    try:
        tokens = generate(model, prompt, n, use_cache=use_cache)
    finally:
        handle.remove()
    return tokens, torch.stack(recorded, dim=1)


# --- the cache changes nothing (C25)


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=str)
def test_c25_greedy_tokens_and_step_logits_are_the_same_with_and_without_the_cache(dtype, atol):
    """GQA with 2 query heads per key/value head, a batch of 3, 20 steps: identical tokens; each step's logits
    equal those of the whole sequence without a cache (chapter 7's forward pass)."""
    model = model_with_spread_logits(200, n_kv_heads=2, dtype=dtype)
    prompt = torch.randint(0, 24, (3, 5), generator=seeded_generator(201))
    cached, cached_logits = step_logits(model, prompt, 20, use_cache=True)
    recomputed, recomputed_logits = step_logits(model, prompt, 20, use_cache=False)
    assert torch.equal(cached, recomputed) and cached.shape == (3, 25)
    with torch.no_grad():
        whole = TinyGPT.forward(model, cached[:, :-1])[:, 4:]  # position t predicts token t + 1
    gap = whole.topk(2, dim=-1).values
    assert (gap[..., 0] - gap[..., 1]).min() > 1e-3  # no near tie: the equal tokens are not luck
    assert torch.equal(whole.argmax(-1), cached[:, 5:])  # greedy, step after step
    torch.testing.assert_close(cached_logits, whole, atol=atol, rtol=0)
    torch.testing.assert_close(recomputed_logits, whole, atol=atol, rtol=0)


def test_keys_and_values_of_earlier_positions_never_change():
    """The basis of the cache: under the causal mask, what a layer computes for positions 0 .. t - 1 does not
    depend on later tokens."""
    model = model_with_spread_logits(202)
    tokens = torch.randint(0, 24, (2, 15), generator=seeded_generator(203))
    caches = {length: KVCache(model.n_layers) for length in (6, 15)}
    with torch.no_grad():
        for length, cache in caches.items():
            model(tokens[:, :length], cache=cache)
    for layer in range(model.n_layers):
        for held in (KVCache.keys, KVCache.values):
            short, long = held(caches[6], layer), held(caches[15], layer)
            torch.testing.assert_close(long[:, :, :6], short, atol=1e-12, rtol=0)


# --- the mask of a decoding step (C26)


def test_c26_is_causal_with_one_query_attends_key_0_only_and_changes_the_logits_of_a_cached_step():
    query, key, value = randn(2, 4, 1, 8, seed=204), randn(2, 4, 9, 8, seed=205), randn(2, 4, 9, 8, seed=206)
    flagged = F.scaled_dot_product_attention(query, key, value, is_causal=True)  # L = 1 < S = 9
    torch.testing.assert_close(flagged, value[:, :, :1], atol=1e-12, rtol=0)
    right, _ = masked_attention(query, key, value, causal_mask(1, 9))
    expected = F.scaled_dot_product_attention(query, key, value)  # the last query may see every key
    torch.testing.assert_close(right, expected, atol=1e-12, rtol=0)
    assert (flagged - right).abs().max() > 0.1

    model = model_with_spread_logits(207)
    sequence = torch.randint(0, 24, (3, 12), generator=seeded_generator(208))
    with torch.no_grad():
        whole = TinyGPT.forward(model, sequence)[:, -1]
        step = {}
        for name, diagonal in (("bottom-right", 11), ("top-left", 0)):
            cache = KVCache(model.n_layers)
            model(sequence[:, :11], cache=cache)
            mask = torch.ones(1, 12, dtype=torch.bool).tril(diagonal=diagonal)  # [q_len 1, k_len 12]
            step[name] = model(sequence[:, 11:], torch.tensor([11]), mask, cache)[:, -1]
    torch.testing.assert_close(step["bottom-right"], whole, atol=1e-12, rtol=0)
    assert (step["top-left"] - whole).abs().max() > 1  # the chapter's "more than 1"
    assert (step["top-left"].argmax(-1) != whole.argmax(-1)).any()  # and a next token changes


# --- what generation costs (counted, not timed)


@pytest.mark.parametrize(("p", "n"), [(8, 32), (1, 20), (5, 1)])
def test_positions_projected_and_scores_computed_with_and_without_the_cache(p, n):
    """Without a cache: sum_s (p + s) positions and sum_s (p + s)^2 scores per head; with it: p + n - 1
    positions and p^2 + sum_{s>=1} (p + s) scores. From one token: n (n + 1) / 2 against n positions."""
    model = model_with_spread_logits(209)
    counted = {"positions": 0, "scores": 0}

    def count_positions(module, inputs, output):
        counted["positions"] += inputs[0].size(1)

    def count_scores(module, args):
        counted["scores"] += args[2].numel()  # the mask of the call, [q_len, k_len]

    handles = (
        model.blocks[0].self_attn.k_proj.register_forward_hook(count_positions),
        model.register_forward_pre_hook(count_scores),
    )
    prompt = torch.randint(0, 24, (2, p), generator=seeded_generator(210))
    counts = {}
    for use_cache in (False, True):
        counted.update(positions=0, scores=0)
        generate(model, prompt, n, use_cache=use_cache)
        counts[use_cache] = dict(counted)
    for handle in handles:
        handle.remove()
    assert counts[False]["positions"] == sum(p + s for s in range(n)) == n * p + n * (n - 1) // 2
    assert counts[False]["scores"] == sum((p + s) ** 2 for s in range(n))
    assert counts[True]["positions"] == p + n - 1
    assert counts[True]["scores"] == p * p + sum(p + s for s in range(1, n))
    if p == 1:
        assert counts[False]["positions"] == n * (n + 1) // 2 and counts[True]["positions"] == n


# --- the cache's layout and size


def test_cache_layout_bytes_and_what_gqa_and_mqa_save():
    model = model_with_spread_logits(211, n_kv_heads=2)
    cache = KVCache(model.n_layers)
    with torch.no_grad():
        model(torch.randint(0, 24, (3, 12), generator=seeded_generator(212)), cache=cache)
    tensors = [t for layer in range(2) for t in (cache.keys(layer), cache.values(layer))]
    assert all(t.shape == (3, 2, 12, 16) for t in tensors)  # [batch, n_kv_heads, len, d_head]
    held = sum(t.numel() * t.element_size() for t in tensors)
    assert held == 2 * 2 * 3 * 2 * 12 * 16 * 8 == 36_864  # K and V, layers, batch, heads, len, d_head, bytes
    assert held == kv_cache_bytes(2, 2, 16, seq_len=12, batch=3, dtype=torch.float64)
    sizes = {g: kv_cache_bytes(2, g, 16, seq_len=12, batch=3, dtype=torch.float64) for g in (4, 2, 1)}
    assert sizes == {4: 73_728, 2: 36_864, 1: 18_432}
    # Llama 2 7B (32 layers, 32 heads of 128), 4096 tokens in float16: 2 GiB per sequence
    assert kv_cache_bytes(32, 32, 128, seq_len=4096, batch=1, dtype=torch.float16) == 2 * 2**30


# --- PagedAttention


def test_the_chapters_batch_wastes_most_of_a_contiguous_cache_and_little_of_a_paged_one():
    """64 requests of log-uniform prompts and outputs (16 to 1024 tokens each): 21.1% of 2048 reserved
    positions per request hold a token, 68.8% of a power-of-two reservation, 98.5% of blocks of 16; each
    request holds ceil(len / 16) blocks of a pool of exactly that many."""
    draws = seeded_generator(3)

    def log_uniform(low, high):
        u = torch.rand(64, generator=draws, dtype=torch.float64)
        return torch.exp(math.log(low) + u * (math.log(high) - math.log(low))).round().long()

    lengths = (log_uniform(16, 1024) + log_uniform(16, 1024)).tolist()
    needed = [(length + 15) // 16 for length in lengths]
    pool = PagedKVCache(16, sum(needed), 1, 1, torch.float64)
    for request, length in enumerate(lengths):
        pool.append(request, torch.ones(1, length, 1), torch.ones(1, length, 1))
        assert len(pool.block_tables[request]) == needed[request]
    assert pool.free_blocks == [] and sorted(b for t in pool.block_tables.values() for b in t) == list(
        range(sum(needed))
    )
    stored = sum(lengths)
    assert round(stored / (64 * 2048), 3) == 0.211
    assert round(stored / sum(2 ** math.ceil(math.log2(length)) for length in lengths), 3) == 0.688
    assert round(stored / (16 * sum(needed)), 3) == 0.985


def test_parallel_sampling_shares_the_prompts_blocks_and_copies_only_the_last():
    """Four samples of 100 tokens from a prompt of 300, blocks of 16: 18 shared prompt blocks and 7 of each
    sample's own (the copied last block of the prompt among them), 46 against 100 without sharing."""
    cache = PagedKVCache(16, 100, 1, 2, torch.float64)
    prompt = randn(1, 300, 2, seed=213)
    cache.append(0, prompt, prompt)
    for sample in (1, 2, 3):
        cache.fork(0, sample)
    assert len(cache.free_blocks) == 100 - 19 and cache.ref_counts[cache.block_tables[0][-1]] == 4
    continuations = [randn(1, 100, 2, seed=214 + s) for s in range(4)]
    for sample, states in enumerate(continuations):
        cache.append(sample, states, -states)
    for sample, states in enumerate(continuations):
        keys, values = cache.gather(sample)
        assert torch.equal(keys, torch.cat([prompt, states], 1)) and torch.equal(
            values, torch.cat([prompt, -states], 1)
        )
    tables = cache.block_tables
    assert all(tables[s][:18] == tables[0][:18] for s in (1, 2, 3))  # the full prompt blocks stay shared
    assert len({tables[s][18] for s in range(4)}) == 4  # the partly filled one was copied for all but one
    assert 100 - len(cache.free_blocks) == 300 // 16 + 4 * ((300 % 16 + 100 + 15) // 16) == 46
    assert 4 * ((400 + 15) // 16) == 100
