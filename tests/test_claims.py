"""The checkable claims of ``shared/reference/seed-errata.md`` that chapters 1 to 3 teach.

Each test is named after its claim (C1, C2, ...) and uses the tolerance the errata give. The chapters
assert the same claims as they run; these tests keep them true when a chapter is edited.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from attention_course.attention import scaled_dot_product_attention, softmax
from attention_course.device import seeded_generator
from attention_course.masks import causal_mask, combine_masks, masked_attention, padding_mask
from attention_course.pooling import cross_attention, gaussian_kernel_weights, nadaraya_watson, self_attention
from solutions.attention import dot_product_variance


def randn(*shape: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=seeded_generator(seed), dtype=torch.float64).to(dtype)


# --- chapter 2 ---


@pytest.mark.parametrize("d_k", [16, 64, 256])
def test_c1_dot_product_has_mean_zero_and_variance_d_k(d_k):
    generator = seeded_generator(d_k)
    query, key = torch.randn(2, 100_000, d_k, generator=generator, dtype=torch.float64)
    dots = (query * key).sum(-1)
    assert abs(dots.mean().item()) < 0.1 * math.sqrt(d_k)
    assert abs(dots.var().item() / d_k - 1) < 0.05
    assert abs((dots / math.sqrt(d_k)).var().item() - 1) < 0.05
    # the reference of exercise ex02 agrees
    assert abs(dot_product_variance(d_k, 100_000, generator=seeded_generator(1)) / d_k - 1) < 0.05
    assert abs(dot_product_variance(d_k, 100_000, scaled=True, generator=seeded_generator(2)) - 1) < 0.05


def test_c2_unscaled_scores_saturate_the_softmax():
    def mean_largest_weight(d_k: int, scaled: bool) -> float:
        generator = seeded_generator(d_k)
        query = torch.randn(2000, 1, d_k, generator=generator, dtype=torch.float64)
        keys = torch.randn(2000, 10, d_k, generator=generator, dtype=torch.float64)
        scores = (query * keys).sum(-1) / (math.sqrt(d_k) if scaled else 1.0)  # [2000, 10]
        return softmax(scores, -1).amax(-1).mean().item()

    dims = [4, 16, 64, 256, 512]
    unscaled = [mean_largest_weight(d, scaled=False) for d in dims]
    scaled = [mean_largest_weight(d, scaled=True) for d in dims]
    assert all(a < b for a, b in itertools.pairwise(unscaled))  # grows with d_k
    assert unscaled[-1] > 0.9
    assert max(scaled) - min(scaled) < 0.05 and max(scaled) < 0.4  # stays put


def test_c3_softmax_rows_sum_to_one_and_ignore_row_shifts():
    # inputs on a grid of 2^-10 and integer shifts: x + shift is exact in float32, so only softmax rounds
    x = torch.round(5 * randn(6, 9, seed=3) * 1024) / 1024
    shift = torch.randint(-1000, 1000, (6, 1), generator=seeded_generator(4))
    x, shifted = x.float(), (x + shift).float()
    torch.testing.assert_close(softmax(x).sum(-1), torch.ones(6), atol=1e-6, rtol=0)
    torch.testing.assert_close(softmax(shifted), softmax(x), atol=1e-6, rtol=0)


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float64, 1e-12), (torch.float32, 1e-6)], ids=str)
def test_c4_reference_attention_equals_pytorch(dtype, atol):
    query, key, value = randn(2, 3, 5, 4, seed=5), randn(2, 3, 7, 4, seed=6), randn(2, 3, 7, 6, seed=7)
    query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    output, _ = scaled_dot_product_attention(query, key, value)
    torch.testing.assert_close(output, F.scaled_dot_product_attention(query, key, value), atol=atol, rtol=0)


# --- chapter 3 ---


def test_c5_boolean_mask_equals_an_additive_minus_infinity_bias():
    query, key, value = randn(2, 3, 5, 4, seed=8), randn(2, 3, 7, 4, seed=9), randn(2, 3, 7, 6, seed=10)
    mask = torch.rand(2, 1, 5, 7, generator=seeded_generator(11)) > 0.4
    mask[..., 0] = True
    bias = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    boolean = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    additive = F.scaled_dot_product_attention(query, key, value, attn_mask=bias)
    torch.testing.assert_close(boolean, additive, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        scaled_dot_product_attention(query, key, value, mask)[0], boolean, atol=1e-12, rtol=0
    )


def test_c6_masked_padding_keys_change_nothing():
    batch, length, extra, d = 2, 5, 3, 8
    query, key, value = (randn(batch, length, d, seed=s, dtype=torch.float32) for s in (12, 13, 14))
    tokens = torch.ones(batch, length, dtype=torch.long)
    output, _ = masked_attention(query, key, value, padding_mask(tokens)[:, 0])
    # append padding: random keys and values, even 100 times larger
    pad_key, pad_value = (100 * randn(batch, extra, d, seed=s, dtype=torch.float32) for s in (15, 16))
    padded_tokens = torch.cat([tokens, torch.zeros(batch, extra, dtype=torch.long)], dim=1)
    padded, _ = masked_attention(
        query,
        torch.cat([key, pad_key], 1),
        torch.cat([value, pad_value], 1),
        padding_mask(padded_tokens)[:, 0],
    )
    torch.testing.assert_close(padded, output, atol=1e-6, rtol=0)


def test_c7_causal_outputs_ignore_the_future():
    length, d, t = 7, 6, 3
    x = randn(2, length, d, seed=17, dtype=torch.float32)
    w_q, w_k, w_v = (randn(d, d, seed=s, dtype=torch.float32) / math.sqrt(d) for s in (18, 19, 20))
    mask = causal_mask(length)[0]  # [1, length, length] broadcasts over the batch

    def attend(inputs: torch.Tensor) -> torch.Tensor:
        return masked_attention(inputs @ w_q, inputs @ w_k, inputs @ w_v, mask)[0]

    changed = x.clone()
    changed[:, t + 1 :] = randn(2, length - t - 1, d, seed=21, dtype=torch.float32)
    before, after = attend(x), attend(changed)
    torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], atol=1e-6, rtol=0)
    assert ((after[:, t + 1 :] - before[:, t + 1 :]).abs().amax(-1) > 1e-3).all()


def test_c26_is_causal_is_top_left_and_breaks_cached_decoding():
    query, key, value = randn(1, 6, 4, seed=22), randn(1, 6, 4, seed=23), randn(1, 6, 5, seed=24)
    full = F.scaled_dot_product_attention(query, key, value, is_causal=True)
    last = query[:, -1:]  # decoding the last position with a cache of all 6 keys
    top_left = F.scaled_dot_product_attention(last, key, value, is_causal=True)
    torch.testing.assert_close(top_left, value[:, :1], atol=1e-12, rtol=0)  # only key 0
    assert (top_left - full[:, -1:]).abs().max() > 0.1
    bottom_right, _ = masked_attention(last, key, value, causal_mask(1, 6)[0])
    torch.testing.assert_close(bottom_right, full[:, -1:], atol=1e-12, rtol=0)


def test_c28_decoder_mask_is_boolean_causal_and_padding():
    tokens = torch.tensor([[4, 5, 6, 0], [7, 8, 0, 0]])
    length = tokens.size(1)
    combined = torch.tril(torch.ones(length, length, dtype=torch.bool)) & (tokens != 0)[:, None, None, :]
    expected_second = torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]], dtype=torch.bool
    )  # sequence 2: causal, and its last two keys are padding
    assert combined.shape == (2, 1, length, length) and torch.equal(combined[1, 0], expected_second)
    assert torch.equal(combine_masks(causal_mask(length), padding_mask(tokens)), combined)
    with pytest.raises(RuntimeError, match="not implemented for 'Float'"):  # NotImplementedError
        torch.tril(torch.ones(length, length)) & (tokens != 0)[:, None, None, :]


# --- chapter 1 ---

KEYS = torch.tensor([51.0, 56.0, 58.0], dtype=torch.float64)
VALUES = torch.tensor([40.0, 43.0, 48.0], dtype=torch.float64)
QUERY = torch.tensor([57.0], dtype=torch.float64)


def test_c21_kernel_regression_on_the_seed_table():
    weights = gaussian_kernel_weights(QUERY, KEYS)[0]
    torch.testing.assert_close(
        weights, torch.tensor([1.255e-8, 0.5, 0.5], dtype=torch.float64), atol=1e-6, rtol=0
    )
    assert abs(weights[0].item() - 1.2555e-8) < 1e-11
    assert abs(nadaraya_watson(QUERY, KEYS, VALUES).item() - 45.5) < 1e-6
    distance = (QUERY - KEYS).abs()
    inverse = (1 / distance) / (1 / distance).sum()  # a decreasing kernel: right
    assert abs((inverse @ VALUES).item() - 586 / 13) < 1e-6
    proportional = distance / distance.sum()  # the seeds' weight grows with distance: wrong
    torch.testing.assert_close(proportional, torch.tensor([0.75, 0.125, 0.125], dtype=torch.float64))
    assert abs((proportional @ VALUES).item() - 41.375) < 1e-6


def test_c27_cross_attention_shapes_and_source_permutation():
    batch, tgt_len, src_len, d_model = 2, 10, 15, 512
    x_tgt, x_src = (
        randn(batch, tgt_len, d_model, seed=25, dtype=torch.float32),
        randn(batch, src_len, d_model, seed=26, dtype=torch.float32),
    )
    w_q, w_k, w_v = (
        randn(d_model, 64, seed=s, dtype=torch.float32) / math.sqrt(d_model) for s in (27, 28, 29)
    )
    output, weights = cross_attention(x_tgt, x_src, w_q, w_k, w_v)
    assert output.shape == (batch, tgt_len, 64) and weights.shape == (batch, tgt_len, src_len)
    permutation = torch.randperm(src_len, generator=seeded_generator(30))
    permuted, _ = cross_attention(x_tgt, x_src[:, permutation], w_q, w_k, w_v)
    torch.testing.assert_close(permuted, output, atol=1e-6, rtol=0)
    # the same with PyTorch's multi-head layer: weights per head are [batch, heads, tgt_len, src_len]
    layer = torch.nn.MultiheadAttention(d_model, 8, batch_first=True).eval()
    with torch.no_grad():
        out, per_head = layer(x_tgt, x_src, x_src, average_attn_weights=False)
        out_permuted, _ = layer(x_tgt, x_src[:, permutation], x_src[:, permutation])
    assert out.shape == (batch, tgt_len, d_model) and per_head.shape == (batch, 8, tgt_len, src_len)
    torch.testing.assert_close(out_permuted, out, atol=1e-6, rtol=0)


def test_self_attention_is_permutation_equivariant():
    x = randn(3, 6, 8, seed=31)
    w_q, w_k, w_v = randn(8, 4, seed=32), randn(8, 4, seed=33), randn(8, 5, seed=34)
    permutation = torch.randperm(6, generator=seeded_generator(35))
    output, _ = self_attention(x, w_q, w_k, w_v)
    permuted, _ = self_attention(x[:, permutation], w_q, w_k, w_v)
    torch.testing.assert_close(permuted, output[:, permutation], atol=1e-12, rtol=0)
