"""The checkable claims of ``shared/reference/seed-errata.md`` that chapter 4 (multi-head attention) teaches.

Each test is named after its claim (C8 to C11, or what it checks) and uses the tolerance the errata give.
Expected values come from PyTorch (``nn.MultiheadAttention``, ``F.scaled_dot_product_attention``,
``FlopCounterMode``), from Hugging Face's ``transformers`` or from closed-form numbers, never from the
course's code alone. The chapter asserts the same claims as it runs; these tests keep them true when it is
edited.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from attention_course.device import seeded_generator
from attention_course.multi_head import (
    MultiHeadAttention,
    attention_entropy,
    merge_heads,
    mha_parameter_count,
    split_heads,
)


def randn(*shape: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=seeded_generator(seed), dtype=torch.float64).to(dtype)


def randomized(module: nn.Module, seed: int) -> nn.Module:
    """``module`` in float64 and eval mode, every parameter drawn from a seeded generator."""
    module = module.double().eval()
    generator = seeded_generator(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            drawn = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            parameter.copy_(drawn / math.sqrt(parameter.shape[-1]))
    return module


def torch_and_course(d_model: int, n_heads: int, bias: bool, seed: int):
    """``nn.MultiheadAttention(batch_first=True)`` with random weights, and the course's module given them."""
    torch_mha = randomized(nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True), seed)
    course = MultiHeadAttention(d_model, n_heads, bias=bias).double().eval()
    course.load_torch_weights(torch_mha)
    return torch_mha, course


def by_hand_with_sdpa(torch_mha: nn.MultiheadAttention, query, key, value, **sdpa_arguments):
    """``torch_mha``'s function rebuilt from its weights with ``F.scaled_dot_product_attention``."""
    n_heads = torch_mha.num_heads
    w_q, w_k, w_v = torch_mha.in_proj_weight.chunk(3)
    b_q, b_k, b_v = torch_mha.in_proj_bias.chunk(3)
    q, k, v = (
        split_heads(x @ w.T + b, n_heads)
        for x, w, b in ((query, w_q, b_q), (key, w_k, b_k), (value, w_v, b_v))
    )
    heads = F.scaled_dot_product_attention(q, k, v, **sdpa_arguments)  # [batch, n_heads, q_len, d_head]
    return torch_mha.out_proj(merge_heads(heads))


# --- C8: parameters ---


def test_c8_mha_parameter_count_bert_base():
    assert 4 * 768**2 + 4 * 768 == 2_362_368 and 4 * 768**2 == 2_359_296
    assert sum(p.numel() for p in nn.MultiheadAttention(768, 12).parameters()) == 2_362_368
    assert sum(p.numel() for p in nn.MultiheadAttention(768, 12, bias=False).parameters()) == 2_359_296
    assert sum(p.numel() for p in MultiHeadAttention(768, 12).parameters()) == 2_362_368
    assert sum(p.numel() for p in MultiHeadAttention(768, 12, bias=False).parameters()) == 2_359_296
    assert mha_parameter_count(768, 12) == 2_362_368
    assert mha_parameter_count(768, 12, bias=False) == 2_359_296


@pytest.mark.parametrize("n_heads", [1, 2, 3, 4, 6, 8, 12, 16, 24, 768])
def test_c8_parameter_count_does_not_depend_on_n_heads(n_heads):
    expected = sum(p.numel() for p in nn.MultiheadAttention(768, n_heads).parameters())
    assert expected == 2_362_368
    assert mha_parameter_count(768, n_heads) == expected
    assert sum(p.numel() for p in MultiHeadAttention(768, n_heads).parameters()) == expected


# --- C9: the course's module is nn.MultiheadAttention ---

SIZES = [  # batch, q_len, k_len, d_model, n_heads: q_len != k_len, every size different
    (2, 5, 7, 12, 3),
    (3, 4, 9, 16, 4),
    (1, 6, 3, 8, 1),
    (2, 1, 11, 24, 6),
]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no bias"])
@pytest.mark.parametrize("sizes", SIZES, ids=str)
def test_c9_module_equals_torch_multihead_attention(sizes, bias):
    batch, q_len, k_len, d_model, n_heads = sizes
    torch_mha, course = torch_and_course(d_model, n_heads, bias, seed=sum(sizes))
    query, memory = randn(batch, q_len, d_model, seed=1), randn(batch, k_len, d_model, seed=2)
    with torch.no_grad():
        expected, expected_weights = torch_mha(query, memory, memory, average_attn_weights=False)
        output, weights = course(query, memory, memory)
    assert output.shape == (batch, q_len, d_model) and weights.shape == (batch, n_heads, q_len, k_len)
    torch.testing.assert_close(output, expected, atol=1e-10, rtol=0)
    torch.testing.assert_close(weights, expected_weights, atol=1e-10, rtol=0)


def test_c9_default_layout_is_sequence_first():
    torch_mha, course = torch_and_course(12, 3, True, seed=3)
    sequence_first = nn.MultiheadAttention(12, 3).double().eval()
    assert sequence_first.batch_first is False
    sequence_first.load_state_dict(torch_mha.state_dict())
    query, memory = randn(2, 5, 12, seed=4), randn(2, 7, 12, seed=5)
    with torch.no_grad():
        output, _ = sequence_first(query.transpose(0, 1), memory.transpose(0, 1), memory.transpose(0, 1))
        expected, _ = course(query, memory, memory)
    assert output.shape == (5, 2, 12)  # [q_len, batch, d_model]
    torch.testing.assert_close(output.transpose(0, 1), expected, atol=1e-10, rtol=0)


def test_split_heads_takes_column_block_i_of_the_projection():
    d_model, n_heads = 12, 3
    d_head = d_model // n_heads
    _, course = torch_and_course(d_model, n_heads, True, seed=6)
    x = randn(2, 5, d_model, seed=7)
    with torch.no_grad():
        split = split_heads(course.w_q(x), n_heads)  # [batch, n_heads, len, d_head]
        for i in range(n_heads):
            rows = slice(i * d_head, (i + 1) * d_head)  # nn.Linear stores W^T: column block i = row block i
            own = x @ course.w_q.weight[rows].T + course.w_q.bias[rows]  # x W_i^Q + b_i
            torch.testing.assert_close(split[:, i], own, atol=1e-12, rtol=0)
    assert torch.equal(merge_heads(split_heads(x, n_heads)), x)


# --- C10: masks ---


def test_c10_mask_conventions():
    batch, q_len, k_len, d_model, n_heads = 3, 5, 7, 12, 3
    torch_mha, course = torch_and_course(d_model, n_heads, True, seed=8)
    query, memory = randn(batch, q_len, d_model, seed=9), randn(batch, k_len, d_model, seed=10)
    keep = torch.tensor([[True] * 7, [True] * 5 + [False] * 2, [True] * 2 + [False] * 5])  # [batch, k_len]

    with torch.no_grad():
        # key_padding_mask, True = ignore, is SDPA's attn_mask = ~mask with axes for heads and queries
        padded, _ = torch_mha(query, memory, memory, key_padding_mask=~keep)
        sdpa = by_hand_with_sdpa(torch_mha, query, memory, memory, attn_mask=keep[:, None, None, :])
        torch.testing.assert_close(padded, sdpa, atol=1e-10, rtol=0)
        torch.testing.assert_close(
            course(query, memory, memory, keep[:, None, None, :])[0], padded, atol=1e-10, rtol=0
        )

        # attn_mask = triu(ones, 1).bool(), True = blocked, is is_causal=True (self-attention, square)
        x = randn(batch, 6, d_model, seed=11)
        blocked = torch.triu(torch.ones(6, 6), diagonal=1).bool()
        causal, _ = torch_mha(x, x, x, attn_mask=blocked)
        torch.testing.assert_close(
            causal, by_hand_with_sdpa(torch_mha, x, x, x, is_causal=True), atol=1e-10, rtol=0
        )
        torch.testing.assert_close(course(x, x, x, ~blocked)[0], causal, atol=1e-10, rtol=0)

        # [batch * n_heads, q_len, k_len]: sequence b, head j at index b * n_heads + j
        per_head = torch.rand(batch, n_heads, q_len, k_len, generator=seeded_generator(12)) < 0.6
        per_head[..., 0] = True  # every query keeps a key: no NaN from PyTorch
        flat, flat_weights = torch_mha(
            query,
            memory,
            memory,
            attn_mask=~per_head.reshape(batch * n_heads, q_len, k_len),
            average_attn_weights=False,
        )
        output, weights = course(query, memory, memory, per_head)
        torch.testing.assert_close(output, flat, atol=1e-10, rtol=0)
        torch.testing.assert_close(weights, flat_weights, atol=1e-10, rtol=0)
        assert (weights.masked_select(~per_head) == 0).all()

        # forgetting the ~ raises nothing and changes the result
        unconverted, _ = torch_mha(query, memory, memory, key_padding_mask=keep)
        assert not torch.allclose(unconverted[:2], padded[:2], equal_nan=True)


# --- C11: average_attn_weights ---


def test_c11_average_attn_weights():
    batch, q_len, k_len, d_model, n_heads = 2, 4, 6, 16, 4
    torch_mha, _ = torch_and_course(d_model, n_heads, True, seed=13)
    query, memory = randn(batch, q_len, d_model, seed=14), randn(batch, k_len, d_model, seed=15)
    with torch.no_grad():
        _, per_head = torch_mha(query, memory, memory, average_attn_weights=False)
        _, mean = torch_mha(query, memory, memory)  # the default: average_attn_weights=True
        _, none = torch_mha(query, memory, memory, need_weights=False)
    assert per_head.shape == (batch, n_heads, q_len, k_len) and mean.shape == (batch, q_len, k_len)
    torch.testing.assert_close(mean, per_head.mean(dim=1), atol=1e-12, rtol=0)
    assert none is None


# --- cost ---


def multiply_adds(n_heads: int, d_model: int, q_len: int, k_len: int) -> tuple[int, int]:
    """(projections, scores and weighted values) multiply-adds of the course's module, counted by PyTorch."""
    module = MultiHeadAttention(d_model, n_heads).to("meta")
    query, key = torch.empty(1, q_len, d_model, device="meta"), torch.empty(1, k_len, d_model, device="meta")
    with FlopCounterMode(display=False) as counter:
        module(query, key, key)
    counts = counter.get_flop_counts()
    projections = sum(sum(counts[f"MultiHeadAttention.{w}"].values()) for w in ("w_q", "w_k", "w_v", "w_o"))
    return projections // 2, (counter.get_total_flops() - projections) // 2  # 2 FLOPs per multiply-add


def separate_heads_multiply_adds(n_heads: int, d_model: int, q_len: int, k_len: int) -> tuple[int, int]:
    """The same count for h heads written as the formula: h small projections, h attentions, then W^O."""
    d_head = d_model // n_heads
    query, key = torch.empty(q_len, d_model, device="meta"), torch.empty(k_len, d_model, device="meta")
    w_head, w_o = torch.empty(d_model, d_head, device="meta"), torch.empty(d_model, d_model, device="meta")
    with FlopCounterMode(display=False) as projections:
        for _ in range(n_heads):
            _ = (query @ w_head, key @ w_head, key @ w_head)  # W_i^Q, W_i^K, W_i^V: counted, not used
        torch.empty(q_len, d_model, device="meta") @ w_o
    q, k, v = (torch.empty(n, d_head, device="meta") for n in (q_len, k_len, k_len))
    with FlopCounterMode(display=False) as products:
        for _ in range(n_heads):
            torch.softmax(q @ k.T, dim=-1) @ v
    return projections.get_total_flops() // 2, products.get_total_flops() // 2


@pytest.mark.parametrize("n_heads", [1, 2, 4, 8, 12, 16])
def test_heads_cost_equals_one_full_width_head(n_heads):
    d_model, q_len, k_len = 768, 128, 96
    full_width = (2 * (q_len + k_len) * d_model**2, 2 * q_len * k_len * d_model)  # closed form, one head
    assert multiply_adds(n_heads, d_model, q_len, k_len) == full_width
    assert separate_heads_multiply_adds(n_heads, d_model, q_len, k_len) == full_width
    assert multiply_adds(1, d_model, q_len, k_len) == full_width


# --- W^O: a sum over heads, a 1x1 convolution ---


def test_output_projection_is_a_sum_over_heads_and_a_1x1_convolution():
    batch, length, d_model, n_heads = 2, 6, 12, 3
    d_head = d_model // n_heads
    module = randomized(MultiHeadAttention(d_model, n_heads, bias=False), seed=16)
    x = randn(batch, length, d_model, seed=17)
    with torch.no_grad():
        output, weights = module(x, x, x)
        heads = weights @ split_heads(module.w_v(x), n_heads)  # [batch, n_heads, len, d_head]
        w_o = module.w_o.weight.T  # [n_heads * d_head, d_model]: the formula's W^O
        terms = [heads[:, i] @ w_o[i * d_head : (i + 1) * d_head] for i in range(n_heads)]  # head_i W_i^O
        torch.testing.assert_close(sum(terms), output, atol=1e-12, rtol=0)
        convolution = F.conv1d(merge_heads(heads).transpose(1, 2), module.w_o.weight[:, :, None])
        torch.testing.assert_close(convolution.transpose(1, 2), output, atol=1e-12, rtol=0)


def test_attention_entropy_is_zero_for_one_key_and_ln_n_for_uniform():
    n = 7
    uniform = torch.full((3, n), 1 / n, dtype=torch.float64)
    one_hot = torch.eye(n, dtype=torch.float64)
    torch.testing.assert_close(attention_entropy(uniform), torch.full((3,), math.log(n), dtype=torch.float64))
    assert (attention_entropy(one_hot) == 0).all()
    assert (attention_entropy(torch.zeros(2, n)) == 0).all()  # a query with no allowed key


# --- a real model: all-MiniLM-L6-v2 ---


def test_minilm_layer_reproduced_by_the_course_module():
    from attention_course.pretrained import minilm, multi_head_from_bert

    tokenizer, model = minilm()
    sentences = [
        "Attention weights in each row add up to one.",
        "The cat that the dog chased ran up the tree.",
    ]
    encoded = tokenizer(sentences, padding=True, return_tensors="pt")
    lengths = encoded["attention_mask"].sum(dim=-1).tolist()
    assert lengths[0] < lengths[1]  # the first sentence is padded
    padding = encoded["attention_mask"].bool()[:, None, None, :]  # [batch, 1, 1, len], True = real token

    returned = {}  # layer -> what its attention block returned: LayerNorm(MultiHead(x) + x)
    hooks = [
        layer.attention.register_forward_hook(
            lambda module, inputs, output, index=index: returned.__setitem__(
                index, output[0] if isinstance(output, tuple) else output
            )
        )
        for index, layer in enumerate(model.encoder.layer)
    ]
    try:
        with torch.no_grad():
            result = model(**encoded, output_attentions=True, output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()

    assert len(model.encoder.layer) == 6 and sorted(returned) == list(range(6))
    with torch.no_grad():
        for index, layer in enumerate(model.encoder.layer):
            course = multi_head_from_bert(layer)
            x = result.hidden_states[index]  # [batch, len, 384]
            output, weights = course(x, x, x, padding)
            assert weights.dtype == torch.float32 and weights.shape == result.attentions[index].shape
            torch.testing.assert_close(weights, result.attentions[index], atol=1e-5, rtol=0)
            block = layer.attention.output.LayerNorm(output + x)
            torch.testing.assert_close(block, returned[index], atol=1e-5, rtol=0)
            # the mask matters: without it the padded sentence's real tokens get other outputs
            unmasked, _ = course(x, x, x)
            assert (unmasked[0, : lengths[0]] - output[0, : lengths[0]]).abs().max() > 1e-3
