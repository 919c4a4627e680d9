"""The checkable claims of ``shared/reference/seed-errata.md`` that chapter 5 (MQA and GQA) teaches.

Each test is named after its claim (C12 to C15) and uses the tolerance the errata give; the last two check
the chapter's conversion of a multi-head layer by mean pooling (Ainslie et al. 2023). Expected values come
from PyTorch (``nn.MultiheadAttention``, ``F.scaled_dot_product_attention``), from computations written
here, or from closed forms, never only from the code under test. The chapter asserts the same claims as it
runs; these tests keep them true when the chapter or the library is edited.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention_course.device import seeded_generator
from attention_course.grouped_query import GroupedQueryAttention, gqa_from_mha, kv_cache_bytes, repeat_kv
from attention_course.multi_head import MultiHeadAttention, load_torch_weights

F64 = torch.float64

# (d_model, n_heads, batch, q_len, k_len): every axis of its own size, and a few degenerate ones
SIZES = [(48, 6, 2, 5, 7), (64, 8, 3, 4, 4), (24, 4, 1, 1, 6), (36, 12, 2, 3, 5)]


def randn(*shape: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, dtype=F64)


def randomize(module: nn.Module, generator: torch.Generator) -> nn.Module:
    """Seeded parameters (the initialisers of torch use its global generator)."""
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(0.3 * randn(*parameter.shape, generator=generator))
    return module


def by_hand(q_heads: torch.Tensor, k_heads: torch.Tensor, v_heads: torch.Tensor, allowed: torch.Tensor):
    """softmax(q k^T / sqrt(d)) v written out, keys and values broadcast against the queries' head axis."""
    scores = q_heads @ k_heads.transpose(-2, -1) / math.sqrt(q_heads.shape[-1])
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v_heads


def heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """[batch, len, n * d_head] -> [batch, n, len, d_head], written here rather than imported."""
    batch, length, width = x.shape
    return x.reshape(batch, length, n, width // n).permute(0, 2, 1, 3)


def concat(x: torch.Tensor) -> torch.Tensor:
    """[batch, n, len, d_head] -> [batch, len, n * d_head]."""
    batch, n, length, d_head = x.shape
    return x.permute(0, 2, 1, 3).reshape(batch, length, n * d_head)


def inputs(d_model: int, batch: int, q_len: int, k_len: int, generator: torch.Generator):
    query = randn(batch, q_len, d_model, generator=generator)
    key, value = (
        randn(batch, k_len, d_model, generator=generator),
        randn(batch, k_len, d_model, generator=generator),
    )
    real_keys = torch.ones(batch, k_len, dtype=torch.bool)
    real_keys[-1, max(1, k_len - 2) :] = False  # the last sequence has padded keys (at least one key stays)
    return query, key, value, real_keys


# --- C12 ---


@pytest.mark.parametrize(("d_model", "n_heads", "batch", "q_len", "k_len"), SIZES)
def test_c12_gqa_ladder(d_model, n_heads, batch, q_len, k_len):
    generator = seeded_generator(d_model + n_heads)
    query, key, value, real_keys = inputs(d_model, batch, q_len, k_len, generator)
    mask = real_keys[:, None, None, :]  # the course's convention: True = may attend
    d_head = d_model // n_heads

    # G = h: nn.MultiheadAttention and the course's MultiHeadAttention, given the same weights
    torch_mha = randomize(nn.MultiheadAttention(d_model, n_heads, batch_first=True, dtype=F64), generator)
    torch_mha.eval()
    gqa = GroupedQueryAttention(d_model, n_heads, n_heads).to(F64)
    with torch.no_grad():
        for projection, weight, bias in zip(
            (gqa.q_proj, gqa.k_proj, gqa.v_proj),
            torch_mha.in_proj_weight.chunk(3),
            torch_mha.in_proj_bias.chunk(3),
            strict=True,
        ):
            projection.weight.copy_(weight)
            projection.bias.copy_(bias)
        gqa.o_proj.weight.copy_(torch_mha.out_proj.weight)
        gqa.o_proj.bias.copy_(torch_mha.out_proj.bias)
        expected, expected_weights = torch_mha(
            query, key, value, key_padding_mask=~real_keys, average_attn_weights=False
        )
        output, weights = gqa(query, key, value, mask)
        course = load_torch_weights(MultiHeadAttention(d_model, n_heads).to(F64), torch_mha)
        course_output, _ = course(query, key, value, mask)
    torch.testing.assert_close(output, expected, atol=1e-10, rtol=0)
    torch.testing.assert_close(weights, expected_weights, atol=1e-10, rtol=0)
    torch.testing.assert_close(course_output, expected, atol=1e-10, rtol=0)

    # G = 1: multi-query attention, one key/value head broadcast over the query heads
    mqa = randomize(GroupedQueryAttention(d_model, n_heads, 1).to(F64), generator)
    with torch.no_grad():
        k = (key @ mqa.k_proj.weight.T + mqa.k_proj.bias)[:, None]  # [batch, 1, k_len, d_head]
        v = (value @ mqa.v_proj.weight.T + mqa.v_proj.bias)[:, None]
        q = heads(query @ mqa.q_proj.weight.T + mqa.q_proj.bias, n_heads)  # [batch, h, q_len, d_head]
        expected = concat(by_hand(q, k, v, mask)) @ mqa.o_proj.weight.T + mqa.o_proj.bias
        output, _ = mqa(query, key, value, mask)
    assert k.shape == (batch, 1, k_len, d_head)
    torch.testing.assert_close(output, expected, atol=1e-10, rtol=0)

    for n_kv_heads in [g for g in range(1, n_heads + 1) if n_heads % g == 0]:
        gqa = randomize(GroupedQueryAttention(d_model, n_heads, n_kv_heads).to(F64), generator)
        n_rep = n_heads // n_kv_heads

        # GQA = MHA whose key/value projections repeat each group's rows for every head of the group
        def duplicated(rows: torch.Tensor, n_kv_heads=n_kv_heads, n_rep=n_rep) -> torch.Tensor:
            blocks = rows.split(d_head)  # n_kv_heads blocks of d_head rows
            assert len(blocks) == n_kv_heads
            return torch.cat([block for block in blocks for _ in range(n_rep)])

        mha = MultiHeadAttention(d_model, n_heads).to(F64)
        with torch.no_grad():
            for mine, theirs, change in (
                (mha.w_q, gqa.q_proj, lambda t: t),
                (mha.w_k, gqa.k_proj, duplicated),
                (mha.w_v, gqa.v_proj, duplicated),
                (mha.w_o, gqa.o_proj, lambda t: t),
            ):
                mine.weight.copy_(change(theirs.weight))
                mine.bias.copy_(change(theirs.bias))
            output, _ = gqa(query, key, value, mask)
            mha_output, _ = mha(query, key, value, mask)
            # GQA = F.scaled_dot_product_attention(..., enable_gqa=True) on the G key/value heads
            q = heads(gqa.q_proj(query), n_heads)
            k, v = heads(gqa.k_proj(key), n_kv_heads), heads(gqa.v_proj(value), n_kv_heads)
            sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            sdpa_output = gqa.o_proj(concat(sdpa))
        torch.testing.assert_close(output, mha_output, atol=1e-10, rtol=0)
        torch.testing.assert_close(output, sdpa_output, atol=1e-10, rtol=0)


# --- C13 ---


@pytest.mark.parametrize(("n_heads", "n_kv_heads"), [(8, 4), (8, 2), (6, 3), (12, 4), (6, 2)])
def test_c13_repeat_interleave_not_repeat(n_heads, n_kv_heads):
    n_rep = n_heads // n_kv_heads
    labelled = torch.arange(n_kv_heads, dtype=F64).view(1, n_kv_heads, 1, 1)  # head g holds g
    assert repeat_kv(labelled, n_rep).flatten().tolist() == [i // n_rep for i in range(n_heads)]
    assert labelled.repeat(1, n_rep, 1, 1).flatten().tolist() == [i % n_kv_heads for i in range(n_heads)]

    generator = seeded_generator(n_heads * 100 + n_kv_heads)
    key = randn(2, n_kv_heads, 7, 5, generator=generator)  # [batch, G, len, d_head]
    torch.testing.assert_close(repeat_kv(key, n_rep), key.repeat_interleave(n_rep, dim=1), atol=0, rtol=0)

    # the module: query head i meets key/value head i // (h / G), as enable_gqa does; tiling differs
    d_model = 4 * n_heads
    gqa = randomize(GroupedQueryAttention(d_model, n_heads, n_kv_heads).to(F64), generator)
    x = randn(2, 6, d_model, generator=generator)
    allowed = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    with torch.no_grad():
        output, _ = gqa(x, x, x)
        q, k, v = (
            heads(gqa.q_proj(x), n_heads),
            heads(gqa.k_proj(x), n_kv_heads),
            heads(gqa.v_proj(x), n_kv_heads),
        )
        group = torch.tensor([i // n_rep for i in range(n_heads)])
        interleaved = gqa.o_proj(concat(by_hand(q, k[:, group], v[:, group], allowed)))
        tiled = gqa.o_proj(concat(by_hand(q, k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1), allowed)))
        builtin = gqa.o_proj(concat(F.scaled_dot_product_attention(q, k, v, enable_gqa=True)))
    torch.testing.assert_close(output, interleaved, atol=1e-10, rtol=0)
    torch.testing.assert_close(output, builtin, atol=1e-10, rtol=0)
    assert not torch.allclose(output, tiled)


# --- C14 ---


def test_c14_gqa_parameter_counts():
    def closed_form(d: int, n_kv_heads: int, d_head: int) -> int:
        return 2 * d * d + 2 * d + 2 * (n_kv_heads * d_head * d + n_kv_heads * d_head)

    counts = {g: sum(p.numel() for p in GroupedQueryAttention(64, 8, g).parameters()) for g in (8, 2, 1)}
    assert counts == {8: 16_640, 2: 10_400, 1: 9_360}
    assert all(n == closed_form(64, g, 8) for g, n in counts.items())
    assert counts[8] == sum(p.numel() for p in nn.MultiheadAttention(64, 8).parameters())
    # without biases, at d_model 4096 and 32 heads of 128 (on the meta device: nothing allocated)
    with torch.device("meta"):
        weights = {
            g: sum(p.numel() for p in GroupedQueryAttention(4096, 32, g, bias=False).parameters())
            for g in (32, 8, 1)
        }
    assert weights == {32: 67_108_864, 8: 41_943_040, 1: 34_603_008}
    assert [round(n / 1e6, 1) for n in weights.values()] == [67.1, 41.9, 34.6]


# --- C15 ---


def test_c15_kv_cache_values_per_token():
    d_model, n_heads = 4096, 32
    d_head = d_model // n_heads
    values = {g: 2 * g * d_head for g in (32, 8, 1)}  # keys and values, one layer, one token
    assert values == {32: 8192, 8: 2048, 1: 256}
    assert values[32] == 2 * d_model and values[1] == 2 * d_head
    for g, n in values.items():
        for dtype, size in ((torch.float16, 2), (torch.bfloat16, 2), (torch.float32, 4), (torch.float64, 8)):
            assert kv_cache_bytes(1, g, d_head, seq_len=1, batch=1, dtype=dtype) == n * size
    # the chapter's table, float16, per token and per 4096 tokens
    assert kv_cache_bytes(32, 32, 128, 1, 1, torch.float16) == 512 * 2**10  # Llama 2 7B
    assert kv_cache_bytes(80, 8, 128, 4096, 1, torch.float16) == 1.25 * 2**30  # Llama 2 70B
    assert kv_cache_bytes(32, 8, 128, 4096, 1, torch.float16) == 512 * 2**20  # Mistral 7B
    assert kv_cache_bytes(32, 32, 128, 4096, 8, torch.float16) == 16 * 2**30  # Llama 2 7B, batch 8
    with pytest.raises(ValueError):
        kv_cache_bytes(1, 1, 1, -1, 1, torch.float16)


# --- conversion from a multi-head checkpoint ---


@pytest.mark.parametrize(("d_model", "n_heads"), [(48, 6), (36, 12)])
def test_gqa_from_mha_is_exact_for_g_equals_h_and_pools_means(d_model, n_heads):
    generator = seeded_generator(7 * d_model + n_heads)
    mha = randomize(nn.MultiheadAttention(d_model, n_heads, batch_first=True, dtype=F64), generator).eval()
    query, key, value, real_keys = inputs(d_model, 2, 5, 7, generator)
    with torch.no_grad():
        expected, _ = mha(query, key, value, key_padding_mask=~real_keys, need_weights=False)
        same, _ = gqa_from_mha(mha, n_heads)(query, key, value, real_keys[:, None, None, :])
    torch.testing.assert_close(same, expected, atol=1e-10, rtol=0)

    d_head = d_model // n_heads
    w_q, w_k, w_v = mha.in_proj_weight.detach().chunk(3)
    b_q, b_k, b_v = mha.in_proj_bias.detach().chunk(3)
    for n_kv_heads in [g for g in range(1, n_heads) if n_heads % g == 0]:
        n_rep = n_heads // n_kv_heads
        pooled = gqa_from_mha(mha, n_kv_heads)
        for rows, bias, projection in ((w_k, b_k, pooled.k_proj), (w_v, b_v, pooled.v_proj)):
            for g in range(n_kv_heads):  # group g: heads g * n_rep ... g * n_rep + n_rep - 1
                members = range(g * n_rep, (g + 1) * n_rep)
                mean_rows = sum(rows[i * d_head : (i + 1) * d_head] for i in members) / n_rep
                mean_bias = sum(bias[i * d_head : (i + 1) * d_head] for i in members) / n_rep
                group = slice(g * d_head, (g + 1) * d_head)
                torch.testing.assert_close(projection.weight[group], mean_rows, atol=1e-12, rtol=0)
                torch.testing.assert_close(projection.bias[group], mean_bias, atol=1e-12, rtol=0)
        torch.testing.assert_close(pooled.q_proj.weight, w_q, atol=0, rtol=0)
        torch.testing.assert_close(pooled.q_proj.bias, b_q, atol=0, rtol=0)
        torch.testing.assert_close(pooled.o_proj.weight, mha.out_proj.weight, atol=0, rtol=0)


def test_uptraining_error_grows_as_groups_shrink_on_minilm():
    from attention_course.pretrained import minilm

    tokenizer, model = minilm()
    sentences = [  # not the chapter's sentences: the relation should not depend on them
        "The river flooded the village after three days of rain.",
        "She reads a chapter of her book every evening before sleeping.",
        "Compilers translate source code into machine instructions.",
        "Tomorrow the market opens an hour later than usual.",
    ]
    encoded = tokenizer(sentences, padding=True, return_tensors="pt")
    real = encoded["attention_mask"].bool()
    with torch.no_grad():
        hidden = model(**encoded, output_hidden_states=True).hidden_states
    groups = (12, 4, 2, 1)
    errors = torch.zeros(6, len(groups), dtype=F64)
    cosines = torch.zeros(6, len(groups), dtype=F64)
    for i, layer in enumerate(model.encoder.layer):
        attention = layer.attention
        mha = nn.MultiheadAttention(384, 12, batch_first=True, dtype=F64).eval()
        with torch.no_grad():
            parts = (attention.self.query, attention.self.key, attention.self.value)
            mha.in_proj_weight.copy_(torch.cat([p.weight for p in parts]))
            mha.in_proj_bias.copy_(torch.cat([p.bias for p in parts]))
            mha.out_proj.weight.copy_(attention.output.dense.weight)
            mha.out_proj.bias.copy_(attention.output.dense.bias)
            x = hidden[i].double()
            reference, _ = mha(x, x, x, key_padding_mask=~real, need_weights=False)
            for j, g in enumerate(groups):
                output, _ = gqa_from_mha(mha, g)(x, x, x, real[:, None, None, :])
                errors[i, j] = (output - reference)[real].norm() / reference[real].norm()
                cosines[i, j] = F.cosine_similarity(output[real], reference[real], dim=-1).mean()
    assert (errors[:, 0] < 1e-6).all()  # G = h: unchanged
    assert (errors[:, 1:] > 0.5).all()  # pooling trained heads is no small perturbation
    mean_error, mean_cosine = errors.mean(dim=0), cosines.mean(dim=0)
    assert mean_error[3] > mean_error[1]  # G = 1 moves the outputs further than G = 4, on average
    assert mean_cosine[0] > mean_cosine[1] > mean_cosine[2] > mean_cosine[3]  # 12 > 4 > 2 > 1
