"""The reference solutions against PyTorch's built-ins, on the CPU and (marker ``gpu``) on CUDA.

Shapes have a different size on every axis, so that a transposed or swapped axis cannot pass.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course import (  # the library's
    conv_heads,
    cross_attention,
    kv_cache,
    positions,
    tiled,
    transformer,
)
from attention_course.device import seeded_generator
from solutions import attention, grouped_query, masks, multi_head, pooling

CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
# tolerances on the CPU (seed-errata C4) and, against a float64 reference, on the GPU
CPU_ATOL = {torch.float64: 1e-12, torch.float32: 1e-6}
GPU_ATOL = {torch.float16: 5e-3, torch.bfloat16: 3e-2, torch.float32: 1e-5}


def randn(*shape: int, seed: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    return torch.randn(*shape, generator=seeded_generator(seed), dtype=torch.float64).to(device, dtype)


def mask_with_a_key_per_row(*shape: int, seed: int, device="cpu") -> torch.Tensor:
    generator = seeded_generator(seed)
    mask = torch.rand(*shape, generator=generator) > 0.4
    mask[..., 0] = True
    return mask.to(device)


# ----------------------------------------------------------------------------------------------------
# softmax and scaled dot-product attention (ex02)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("dim", [-1, 0, 1, 2])
def test_softmax_matches_torch(dtype, dim):
    x = 3 * randn(2, 3, 5, 7, seed=1, dtype=dtype)
    torch.testing.assert_close(attention.softmax(x, dim), torch.softmax(x, dim), atol=CPU_ATOL[dtype], rtol=0)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    scale=st.floats(0.1, 1000),
    seed=st.integers(0, 2**16),
)
def test_softmax_is_a_stable_distribution(shape, scale, seed):
    x = scale * randn(*shape, seed=seed, dtype=torch.float32)
    weights = attention.softmax(x, -1)
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(shape[:-1]), atol=1e-5, rtol=0)
    torch.testing.assert_close(weights, torch.softmax(x, -1), atol=1e-6, rtol=0)


def test_softmax_of_an_all_masked_slice_is_nan():
    assert torch.isnan(attention.softmax(torch.full((3,), float("-inf")))).all()


SDPA_SHAPES = [  # (leading axes, q_len, k_len, d_k, d_v)
    ((), 5, 7, 4, 6),
    ((2,), 6, 3, 8, 5),
    ((2, 3), 5, 7, 4, 6),
]


def sdpa_inputs(lead, q_len, k_len, d_k, d_v, *, seed, dtype=torch.float64, device="cpu"):
    return (
        randn(*lead, q_len, d_k, seed=seed, dtype=dtype, device=device),
        randn(*lead, k_len, d_k, seed=seed + 1, dtype=dtype, device=device),
        randn(*lead, k_len, d_v, seed=seed + 2, dtype=dtype, device=device),
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("shape", SDPA_SHAPES, ids=str)
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "mask"])
def test_sdpa_matches_pytorch(dtype, shape, masked):
    query, key, value = sdpa_inputs(*shape, seed=10, dtype=dtype)
    lead = shape[0]
    mask_shape = (*lead[:1], *[1] * len(lead[1:]), shape[1], shape[2])  # broadcast over heads
    mask = mask_with_a_key_per_row(*mask_shape, seed=11) if masked else None
    output, weights = attention.scaled_dot_product_attention(query, key, value, mask)
    expected = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    torch.testing.assert_close(output, expected, atol=CPU_ATOL[dtype], rtol=0)
    assert output.dtype == weights.dtype == dtype
    torch.testing.assert_close(
        weights.sum(-1), torch.ones_like(weights.sum(-1)), atol=CPU_ATOL[dtype], rtol=0
    )
    if masked:
        assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


@settings(max_examples=30, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), max_size=2),
    q_len=st.integers(1, 6),
    k_len=st.integers(1, 6),
    d_k=st.integers(1, 5),
    d_v=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_sdpa_matches_pytorch_on_any_shape(lead, q_len, k_len, d_k, d_v, seed):
    query, key, value = sdpa_inputs(tuple(lead), q_len, k_len, d_k, d_v, seed=seed)
    output, weights = attention.scaled_dot_product_attention(query, key, value)
    assert weights.shape == (*lead, q_len, k_len)
    torch.testing.assert_close(output, F.scaled_dot_product_attention(query, key, value), atol=1e-12, rtol=0)


def test_sdpa_rejects_bad_inputs():
    query, key, value = sdpa_inputs((), 5, 7, 4, 6, seed=20)
    with pytest.raises(ValueError, match="d_k"):
        attention.scaled_dot_product_attention(query, key[..., :3], value)
    with pytest.raises(ValueError, match="k_len"):
        attention.scaled_dot_product_attention(query, key, value[:6])
    with pytest.raises(TypeError, match="boolean"):
        attention.scaled_dot_product_attention(query, key, value, torch.ones(5, 7))


def test_sdpa_leaves_its_inputs_alone():
    inputs = sdpa_inputs((2,), 5, 7, 4, 6, seed=21)
    copies = [t.clone() for t in inputs]
    attention.scaled_dot_product_attention(*inputs, mask_with_a_key_per_row(2, 5, 7, seed=22))
    for before, after in zip(copies, inputs, strict=True):
        assert torch.equal(before, after)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "mask"])
def test_sdpa_and_tiled_attention_compute_half_inputs_in_float32(dtype, masked):
    """float16 and bfloat16 inputs are computed in float32 and rounded once: the bits of the float32
    computation of the same inputs, cast back, so within half a unit in the last place of the float64 answer
    (plus float32's error); a computation in the inputs' own dtype gives other bits."""
    query, key, value = sdpa_inputs((2, 3), 6, 9, 8, 5, seed=23, dtype=dtype)
    mask = mask_with_a_key_per_row(2, 1, 6, 9, seed=24) if masked else None
    wide = [t.float() for t in (query, key, value)]  # the same numbers, in float32
    output, weights = attention.scaled_dot_product_attention(query, key, value, mask)
    wide_output, wide_weights = attention.scaled_dot_product_attention(*wide, mask)
    assert output.dtype == weights.dtype == dtype
    assert torch.equal(output, wide_output.to(dtype)) and torch.equal(weights, wide_weights.to(dtype))
    tiled_output = tiled.tiled_attention(query, key, value, 4, mask)
    assert tiled_output.dtype == dtype
    assert torch.equal(tiled_output, tiled.tiled_attention(*wide, 4, mask).to(dtype))
    truth = F.scaled_dot_product_attention(*(t.double() for t in wide), attn_mask=mask)
    half_ulp = torch.finfo(dtype).eps / 2 * truth.abs() + 1e-6  # rounding to nearest, once
    assert ((output.double() - truth).abs() <= half_ulp).all()
    assert ((tiled_output.double() - truth).abs() <= half_ulp).all()
    scores = query @ key.transpose(-2, -1) / math.sqrt(8)  # in the inputs' own dtype
    scores = scores if mask is None else scores.masked_fill(~mask, -math.inf)
    in_dtype = attention.softmax(scores, dim=-1) @ value
    assert not torch.equal(output, in_dtype)


def test_dot_product_variance_is_reproducible_and_varies_with_the_seed():
    first = attention.dot_product_variance(32, 1000, generator=seeded_generator(0))
    assert first == attention.dot_product_variance(32, 1000, generator=seeded_generator(0))
    assert first != attention.dot_product_variance(32, 1000, generator=seeded_generator(1))
    with pytest.raises(ValueError):
        attention.dot_product_variance(0, 10)


# ----------------------------------------------------------------------------------------------------
# masks (ex03)


def test_padding_mask():
    tokens = torch.tensor([[5, 6, 0, 0], [7, 0, 8, 9], [1, 2, 3, 4]])
    mask = masks.padding_mask(tokens)
    assert mask.shape == (3, 1, 1, 4) and mask.dtype == torch.bool
    assert mask[:, 0, 0].tolist() == [[True, True, False, False], [True, False, True, True], [True] * 4]
    assert masks.padding_mask(tokens, pad_id=7)[1, 0, 0].tolist() == [False, True, True, True]


@pytest.mark.parametrize(("q_len", "k_len"), [(4, 4), (1, 6), (3, 7), (5, 5), (2, 9)])
def test_causal_mask_is_pytorchs_lower_right(q_len, k_len):
    from torch.nn.attention.bias import causal_lower_right

    mask = masks.causal_mask(q_len, k_len)
    assert mask.shape == (1, 1, q_len, k_len) and mask.dtype == torch.bool
    expected = causal_lower_right(q_len, k_len)._materialize(torch.device("cpu"))
    assert torch.equal(mask[0, 0], expected)
    if q_len == k_len:  # only then does PyTorch's is_causal (top-left) agree
        assert torch.equal(mask[0, 0], torch.ones(q_len, k_len, dtype=torch.bool).tril())


def test_causal_mask_defaults_and_errors():
    assert torch.equal(masks.causal_mask(3), masks.causal_mask(3, 3))
    assert masks.causal_mask(3, device="meta").device.type == "meta"
    with pytest.raises(ValueError):
        masks.causal_mask(0)


def test_combine_masks():
    causal = masks.causal_mask(4)
    padding = masks.padding_mask(torch.tensor([[1, 2, 0, 0], [1, 2, 3, 4]]))
    combined = masks.combine_masks(causal, None, padding)
    assert combined.shape == (2, 1, 4, 4)
    assert torch.equal(combined, causal & padding)
    assert masks.combine_masks(None, None) is None
    with pytest.raises(TypeError):
        masks.combine_masks(causal, torch.ones(4, 4))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("shape", SDPA_SHAPES, ids=str)
def test_masked_attention_matches_pytorch_when_every_row_has_a_key(dtype, shape):
    query, key, value = sdpa_inputs(*shape, seed=30, dtype=dtype)
    mask = mask_with_a_key_per_row(shape[1], shape[2], seed=31)
    output, _ = masks.masked_attention(query, key, value, mask)
    expected = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    torch.testing.assert_close(output, expected, atol=CPU_ATOL[dtype], rtol=0)
    unmasked, _ = masks.masked_attention(query, key, value, None)
    torch.testing.assert_close(
        unmasked, F.scaled_dot_product_attention(query, key, value), atol=CPU_ATOL[dtype], rtol=0
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_masked_attention_gives_zeros_for_a_query_with_no_key(dtype):
    query, key, value = sdpa_inputs((2, 3), 5, 7, 4, 6, seed=40, dtype=dtype)
    mask = mask_with_a_key_per_row(2, 1, 5, 7, seed=41)
    mask[1, 0, 2] = False  # query 2 of sequence 1 may attend nothing
    output, weights = masks.masked_attention(query, key, value, mask)
    assert torch.isfinite(output).all() and torch.isfinite(weights).all()
    assert (output[1, :, 2] == 0).all() and (weights[1, :, 2] == 0).all()
    reference = masks.masked_attention(query.double(), key.double(), value.double(), mask)[0]
    rows = torch.ones(2, 3, 5, dtype=torch.bool)
    rows[1, :, 2] = False
    atol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 3e-2, torch.float16: 5e-3}[dtype]
    torch.testing.assert_close(output.double()[rows], reference[rows], atol=atol, rtol=0)


# ----------------------------------------------------------------------------------------------------
# kernel pooling and single-head attention (ex01)


def test_nadaraya_watson_on_the_seed_table():
    keys = torch.tensor([51.0, 56.0, 58.0], dtype=torch.float64)
    values = torch.tensor([40.0, 43.0, 48.0], dtype=torch.float64)
    query = torch.tensor([57.0], dtype=torch.float64)
    weights = pooling.gaussian_kernel_weights(query, keys)
    expected = torch.softmax(-((query[:, None] - keys) ** 2) / 2, dim=-1)
    torch.testing.assert_close(weights, expected, atol=1e-15, rtol=0)
    assert abs(pooling.nadaraya_watson(query, keys, values).item() - 45.5) < 1e-6


def test_gaussian_kernel_weights_are_finite_far_from_every_key():
    weights = pooling.gaussian_kernel_weights(
        torch.tensor([1e4]), torch.tensor([0.0, 1.0, 2.0]), bandwidth=0.1
    )
    assert torch.isfinite(weights).all() and weights[0, 2] == 1


def test_cross_attention_matches_pytorchs_multihead_attention():
    """One head, no bias: nn.MultiheadAttention with our projections (it computes x @ W^T)."""
    d_model, d_k = 6, 6  # nn.MultiheadAttention needs d_k = d_v = d_model for one head
    x_q, x_kv = randn(2, 5, d_model, seed=50), randn(2, 7, d_model, seed=51)
    w_q, w_k, w_v = (randn(d_model, d_k, seed=52 + i) for i in range(3))
    layer = torch.nn.MultiheadAttention(d_model, 1, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        layer.in_proj_weight.copy_(torch.cat([w_q.T, w_k.T, w_v.T]))
        layer.out_proj.weight.copy_(torch.eye(d_model, dtype=torch.float64))
    expected, expected_weights = layer(x_q, x_kv, x_kv)
    output, weights = pooling.cross_attention(x_q, x_kv, w_q, w_k, w_v)
    torch.testing.assert_close(output, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(weights, expected_weights, atol=1e-12, rtol=0)


def test_self_attention_is_cross_attention_of_a_sequence_with_itself():
    x = randn(3, 4, 8, seed=60)
    w_q, w_k, w_v = randn(8, 5, seed=61), randn(8, 5, seed=62), randn(8, 2, seed=63)
    output, weights = pooling.self_attention(x, w_q, w_k, w_v)
    assert output.shape == (3, 4, 2) and weights.shape == (3, 4, 4)
    expected = F.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v)
    torch.testing.assert_close(output, expected, atol=1e-12, rtol=0)


# ----------------------------------------------------------------------------------------------------
# on the GPU: float16, bfloat16 and float32 against a float64 reference, TF32 off


@pytest.fixture
def no_tf32():
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = previous


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "mask"])
def test_sdpa_on_cuda_against_float64(dtype, masked, no_tf32):
    query, key, value = sdpa_inputs((4, 8), 256, 200, 64, 48, seed=70, device="cuda")
    mask = mask_with_a_key_per_row(4, 1, 256, 200, seed=71, device="cuda") if masked else None
    expected = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)  # float64, math backend
    low = [t.to(dtype) for t in (query, key, value)]
    output, _ = attention.scaled_dot_product_attention(*low, mask)
    assert output.dtype == dtype and output.device.type == "cuda"
    torch.testing.assert_close(output.double(), expected, atol=GPU_ATOL[dtype], rtol=0)
    builtin = F.scaled_dot_product_attention(*low, attn_mask=mask)  # PyTorch's own error, for scale
    assert (output.double() - expected).abs().max() <= 4 * (builtin.double() - expected).abs().max() + 1e-3


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d_head", [64, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("n", [256, 1024, 4096], ids=lambda n: f"n{n}")
def test_half_precision_reference_is_as_exact_as_pytorchs_fused_attention(n, d_head, causal, dtype, no_tf32):
    """In float16 and bfloat16 the largest error of the reference scaled dot-product attention, and of tiled
    attention, against float64 is at most 1.5 times that of F.scaled_dot_product_attention (a fused kernel).

    Rounding every step to the input dtype made the reference 1.4 to 4.1 times less exact than the fused
    kernel; computed in float32 and rounded once, its largest error is the output's own rounding."""
    query, key, value = sdpa_inputs((2, 4), n, n, d_head, d_head, seed=75, device="cuda")
    low = [t.to(dtype) for t in (query, key, value)]  # [2, 4, n, d_head] each
    truth = F.scaled_dot_product_attention(*(t.double() for t in low), is_causal=causal)  # float64: math
    fused = F.scaled_dot_product_attention(*low, is_causal=causal)
    mask = torch.ones(n, n, dtype=torch.bool, device="cuda").tril() if causal else None  # is_causal's mask
    output, weights = attention.scaled_dot_product_attention(*low, mask)
    tiled_output = tiled.tiled_attention(*low, 256, mask)
    assert output.dtype == weights.dtype == tiled_output.dtype == fused.dtype == dtype
    fused_error = (fused.double() - truth).abs().max().item()
    for name, result in (("reference", output), ("tiled", tiled_output)):
        error = (result.double() - truth).abs().max().item()
        assert error <= 1.5 * fused_error, f"{name}: {error:.3g} against the fused kernel's {fused_error:.3g}"


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_masked_attention_on_cuda(dtype, no_tf32):
    query, key, value = sdpa_inputs((2, 4), 64, 80, 32, 16, seed=80, device="cuda")
    mask = mask_with_a_key_per_row(2, 1, 64, 80, seed=81, device="cuda")
    mask[0, 0, 5] = False
    expected, _ = masks.masked_attention(query, key, value, mask)
    output, _ = masks.masked_attention(*(t.to(dtype) for t in (query, key, value)), mask)
    assert torch.isfinite(output).all() and (output[0, :, 5] == 0).all()
    torch.testing.assert_close(output.double(), expected, atol=GPU_ATOL[dtype], rtol=0)


@gpu
@needs_cuda
def test_softmax_on_cuda():
    x = 50 * randn(2, 3, 5, 7, seed=90, device="cuda")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        result = attention.softmax(x.to(dtype), -1)
        assert result.dtype == dtype and torch.isfinite(result).all()
        torch.testing.assert_close(result.double(), torch.softmax(x, -1), atol=GPU_ATOL[dtype] * 4, rtol=0)


# ----------------------------------------------------------------------------------------------------
# multi-head and grouped-query attention (ex04, ex05): errors, and the GPU


def test_multi_head_modules_reject_bad_sizes_and_masks():
    with pytest.raises(ValueError, match="must divide"):
        multi_head.MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="must divide"):
        multi_head.split_heads(torch.zeros(1, 2, 10), 3)
    with pytest.raises(ValueError, match="divide"):
        grouped_query.GroupedQueryAttention(12, 4, 3)
    module, x = multi_head.MultiHeadAttention(8, 2), torch.zeros(1, 3, 8)
    with pytest.raises(TypeError, match="boolean"):
        module(x, x, x, torch.ones(3, 3))
    with pytest.raises(ValueError, match="n_heads"):
        module.load_torch_weights(torch.nn.MultiheadAttention(8, 4))
    assert multi_head.mha_parameter_count(768, 12) == 2_362_368
    assert grouped_query.kv_cache_bytes(1, 1, 1, 1, 1, torch.bfloat16) == 4


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_multi_head_and_grouped_query_on_cuda(dtype, no_tf32):
    generator = seeded_generator(95)
    torch_mha = torch.nn.MultiheadAttention(64, 8, batch_first=True).double()
    x = torch.randn(2, 33, 64, generator=generator, dtype=torch.float64)
    mask = torch.rand(2, 1, 1, 33, generator=generator) > 0.2
    mask[..., 0] = True
    expected, _ = torch_mha(x, x, x, key_padding_mask=~mask[:, 0, 0], average_attn_weights=False)
    for module in (
        multi_head.MultiHeadAttention(64, 8).load_torch_weights(torch_mha),
        grouped_query.gqa_from_mha(torch_mha, 8),
    ):
        module = module.to(device="cuda", dtype=dtype)
        output, weights = module(x.to("cuda", dtype), x.to("cuda", dtype), x.to("cuda", dtype), mask.cuda())
        assert output.dtype == dtype and weights.shape == (2, 8, 33, 33)
        torch.testing.assert_close(output.double().cpu(), expected.detach(), atol=8 * GPU_ATOL[dtype], rtol=0)


# ----------------------------------------------------------------------------------------------------
# cross-attention, the decoder layer, the block and generation (ex06, ex07): errors, and the GPU


def test_blocks_and_generation_reject_bad_arguments():
    with pytest.raises(ValueError, match="must divide"):
        cross_attention.CrossAttention(10, 3)
    with pytest.raises(ValueError, match="must divide"):
        transformer.TransformerBlock(10, 3, 16)
    with pytest.raises(ValueError, match="activation"):
        transformer.TransformerBlock(8, 2, 16, activation="swish")
    layer, x = cross_attention.CrossAttention(8, 2), torch.zeros(1, 3, 8)
    with pytest.raises(TypeError, match="boolean"):
        layer(x, torch.zeros(1, 4, 8), torch.ones(1, 1, 1, 4))

    def model(tokens):
        return torch.zeros(*tokens.shape, 5)

    prompt = torch.zeros(2, 1, dtype=torch.long)
    for options in ({"temperature": -1.0}, {"top_k": 0}, {"max_new_tokens": -1}):
        with pytest.raises(ValueError, match="temperature >= 0"):
            transformer.generate(model, prompt, **{"max_new_tokens": 1, **options})
    assert transformer.generate(model, prompt, 0).equal(prompt)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_decoder_layer_and_block_on_cuda(dtype, no_tf32):
    """The decoder layer (with its cache) and the block on the GPU, against PyTorch's layers in float64."""
    generator = seeded_generator(97)
    x = torch.randn(2, 9, 32, generator=generator, dtype=torch.float64)
    memory = torch.randn(2, 13, 32, generator=generator, dtype=torch.float64)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    for norm_first in (False, True):
        torch_decoder = torch.nn.TransformerDecoderLayer(
            32, 4, 64, 0.0, batch_first=True, norm_first=norm_first
        )
        torch_encoder = torch.nn.TransformerEncoderLayer(
            32, 4, 64, 0.0, batch_first=True, norm_first=norm_first
        )
        torch_decoder, torch_encoder = torch_decoder.double().eval(), torch_encoder.double().eval()
        expected_decoder = torch_decoder(x, memory, tgt_mask=~causal).detach()
        expected_block = torch_encoder(x, src_mask=~causal).detach()
        decoder = cross_attention.DecoderLayer(32, 4, 64, norm_first=norm_first)
        decoder = cross_attention.load_torch_decoder_layer(decoder, torch_decoder).to("cuda", dtype)
        block = transformer.TransformerBlock(32, 4, 64, norm_first=norm_first)
        block = transformer.load_torch_encoder_layer(block, torch_encoder).to("cuda", dtype)
        on_gpu = {"device": "cuda", "dtype": dtype}
        with torch.no_grad():
            output = decoder(x.to(**on_gpu), memory.to(**on_gpu), causal.cuda(), use_cache=True)
            again = decoder(x.to(**on_gpu), memory.to(**on_gpu), causal.cuda(), use_cache=True)
            blocked = block(x.to(**on_gpu), causal.cuda())
        assert output.dtype == dtype and output.device.type == "cuda"
        for actual, expected in (
            (output, expected_decoder),
            (again, expected_decoder),
            (blocked, expected_block),
        ):
            torch.testing.assert_close(actual.double().cpu(), expected, atol=30 * GPU_ATOL[dtype], rtol=0)


@gpu
@needs_cuda
def test_generate_on_cuda():
    """Greedy generation is the same on the GPU as on the CPU; sampling with a CUDA generator runs there."""
    torch.manual_seed(0)
    model = transformer.TinyGPT(17, 32, 4, 2, 64, max_len=24).eval()
    prompt = torch.randint(0, 17, (3, 4), generator=seeded_generator(98))
    expected = transformer.generate(model, prompt, 10, temperature=0)
    actual = transformer.generate(model.cuda(), prompt.cuda(), 10, temperature=0)
    assert actual.device.type == "cuda" and actual.cpu().equal(expected)
    generator = torch.Generator(device="cuda").manual_seed(1)
    sampled = transformer.generate(model, prompt.cuda(), 30, temperature=1.0, top_k=5, generator=generator)
    assert sampled.shape == (3, 34) and sampled.device.type == "cuda"


def test_rope_is_hugging_face_llamas_and_the_conventions_are_one_permutation_apart():
    """``apply_rope`` equals ``transformers``' ``apply_rotary_pos_emb`` (rotary embedding built from a config,
    no download), with positions per sequence; the interleaved convention is the same rotation, permuted."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    rotary = LlamaRotaryEmbedding(
        LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=64)
    )
    query, key = (
        randn(2, 4, 7, 16, seed=120, dtype=torch.float32),
        randn(2, 4, 7, 16, seed=121, dtype=torch.float32),
    )
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [9, 10, 11, 12, 13, 14, 15]])
    expected_q, expected_k = apply_rotary_pos_emb(query, key, *rotary(query, position_ids))
    torch.testing.assert_close(positions.apply_rope(query, position_ids), expected_q, atol=1e-5, rtol=0)
    torch.testing.assert_close(positions.apply_rope(key, position_ids), expected_k, atol=1e-5, rtol=0)
    x, perm = randn(3, 5, 8, seed=122), positions.rope_permutation(8)
    at = torch.tensor([4, 0, 2, 9, 1])
    interleaved = positions.apply_rope(x, at, interleaved=True)
    torch.testing.assert_close(
        positions.apply_rope(x[..., perm], at), interleaved[..., perm], atol=1e-12, rtol=0
    )
    with pytest.raises(ValueError, match="even"):
        positions.apply_rope(randn(2, 3, 5, seed=1), torch.arange(3))
    with pytest.raises(ValueError, match="positions must be"):
        positions.apply_rope(x, torch.arange(4))


@pytest.mark.parametrize("d_head", [64, 128])
def test_rope_cos_and_sin_are_hugging_face_llamas_to_the_bit(d_head):
    """In float32, at 40,960 positions, the cos and sin that apply_rope rotates by are those of
    ``transformers``' ``LlamaRotaryEmbedding`` (built from a config, no download), bit for bit; the
    frequencies are its ``inv_freq``. Both take 1 / base^(2i/d) and multiply positions by it element by
    element; frequencies base^(-2i/d), one float32 ulp off for some i, put cos up to 6e-5 off within 4,096
    positions and 1e-3 within 40,960 (for d_head 64; twice that for 128)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    n, half = 40_960, d_head // 2
    config = LlamaConfig(hidden_size=4 * d_head, num_attention_heads=4, max_position_embeddings=n)
    rotary = LlamaRotaryEmbedding(config)
    cos, sin = rotary(torch.zeros(1), torch.arange(n)[None])  # [1, n, d_head] each, cat(angles, angles)
    # x = (1, ..., 1, 0, ..., 0) pairs 1 with 0: rotate_half gives (1 cos - 0 sin, 0 cos + 1 sin) = (cos, sin)
    x = torch.cat((torch.ones(half), torch.zeros(half))).expand(1, n, d_head)
    rotated = positions.apply_rope(x, torch.arange(n))  # [1, n, d_head], float32
    assert rotated.dtype == torch.float32
    assert torch.equal(rotated[..., :half], cos[..., :half])
    assert torch.equal(rotated[..., half:], sin[..., :half])
    assert torch.equal(positions.rope_frequencies(d_head, dtype=torch.float32), rotary.inv_freq)
    # the other float32 form of the same frequencies
    other = 10000.0 ** -(torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)
    assert not torch.equal(other, rotary.inv_freq)
    drift = ((torch.arange(n, dtype=torch.float32)[:, None] * other).cos() - cos[0, :, :half]).abs()
    assert 3e-5 < drift[:4096].max() < 2e-4 and 5e-4 < drift.max() < 3e-3
    with pytest.raises(ValueError, match="even"):
        positions.rope_frequencies(7)


@pytest.mark.parametrize(
    ("n_heads", "exponents"), [(8, [-1, -2, -3, -4, -5, -6, -7, -8]), (6, [-2, -4, -6, -8, -1, -3])]
)
def test_alibi_slopes_and_bias(n_heads, exponents):
    slopes = positions.alibi_slopes(n_heads, torch.float64)
    assert slopes.tolist() == [2.0**e for e in exponents]
    bias = positions.alibi_bias(n_heads, 3, 5, torch.float64)  # queries at positions 2, 3, 4
    distance = torch.tensor([[j - i for j in range(5)] for i in (2, 3, 4)], dtype=torch.float64)
    torch.testing.assert_close(bias, slopes.view(-1, 1, 1) * distance, atol=0, rtol=0)
    with pytest.raises(ValueError, match="at least 1"):
        positions.alibi_slopes(0)


@pytest.mark.parametrize("kernel_size", [1, 3, 5])
def test_attention_conv2d_is_conv2d(kernel_size):
    x = randn(2, 3, 6, 7, seed=130)
    weight, bias = randn(4, 3, kernel_size, kernel_size, seed=131), randn(4, seed=132)
    expected = F.conv2d(x, weight, bias, padding=kernel_size // 2)
    torch.testing.assert_close(
        conv_heads.attention_conv2d(x, weight, bias, 50.0), expected, atol=1e-10, rtol=0
    )
    spread = conv_heads.attention_conv2d(x, weight, None, 1.0)  # alpha = 1: each head averages, no conv
    assert (spread - F.conv2d(x, weight, padding=kernel_size // 2)).abs().max() > 0.1
    x1, w1 = randn(2, 3, 9, seed=133), randn(4, 3, kernel_size, seed=134)
    expected1 = F.conv1d(x1, w1, padding=kernel_size // 2)
    torch.testing.assert_close(conv_heads.attention_conv1d(x1, w1, None, 50.0), expected1, atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="odd"):
        conv_heads.attention_conv2d(x, randn(4, 3, 2, 2, seed=1))


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_positions_and_conv_heads_on_cuda(dtype, no_tf32):
    """RoPE, ALiBi, the positional model and the convolution heads on the GPU, against float64 on the CPU."""
    x = randn(2, 4, 9, 16, seed=140)
    at = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [3, 4, 5, 6, 7, 8, 9, 10, 11]])
    for interleaved in (False, True):
        expected = positions.apply_rope(x, at, interleaved=interleaved)
        actual = positions.apply_rope(x.to("cuda", dtype), at.cuda(), interleaved=interleaved)
        assert actual.dtype == dtype and actual.device.type == "cuda"
        torch.testing.assert_close(actual.double().cpu(), expected, atol=10 * GPU_ATOL[dtype], rtol=0)
    bias = positions.alibi_bias(8, 3, 6, dtype, "cuda")
    assert bias.device.type == "cuda"
    torch.testing.assert_close(
        bias.double().cpu(), positions.alibi_bias(8, 3, 6, torch.float64), atol=GPU_ATOL[dtype], rtol=0
    )
    image, weight, b = randn(2, 3, 6, 5, seed=141), randn(4, 3, 3, 3, seed=142) / 3, randn(4, seed=143)
    conv = F.conv2d(image, weight, b, padding=1)
    on_gpu = [t.to("cuda", dtype) for t in (image, weight, b)]
    heads = conv_heads.attention_conv2d(*on_gpu, 50.0)
    torch.testing.assert_close(heads.double().cpu(), conv, atol=30 * GPU_ATOL[dtype], rtol=0)
    torch.manual_seed(0)
    for position in positions.POSITIONS:
        model = positions.PositionalGPT(11, position, 32, 4, 2, 64, max_len=24).eval()
        tokens = torch.randint(0, 11, (2, 20), generator=seeded_generator(144))
        with torch.no_grad():
            expected = model.double()(tokens)
            actual = model.to("cuda", torch.float32)(tokens.cuda())
        torch.testing.assert_close(actual.double().cpu(), expected, atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------------------------------
# the KV cache (ex10): Hugging Face's GPT-2 and its DynamicCache, the paged cache, errors, and the GPU


def gpt2_and_cached_gpt(seed: int, dtype=torch.float32):
    """``GPT2LMHeadModel`` built from a config (no download) and chapter 10's ``CachedGPT`` with its weights.

    The weights are drawn again, N(0, 1 / fan-in) (layer-norm gains around 1), instead of GPT-2's N(0,
    0.02^2): with GPT-2's small weights every logit is near 0, and greedy decoding would choose between near
    ties that float32 rounding can flip."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=23,
        n_positions=48,
        n_embd=32,
        n_layer=2,
        n_head=4,
        activation_function="gelu",  # exact GELU, as TinyGPT
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,  # no token ends generation: both models write max_new_tokens tokens
        eos_token_id=None,
        attn_implementation="eager",
    )
    gpt2 = GPT2LMHeadModel(config).to(dtype).eval()
    generator = seeded_generator(seed)
    with torch.no_grad():
        for name, parameter in gpt2.named_parameters():
            drawn = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            if parameter.dim() > 1:
                parameter.copy_(drawn / parameter.shape[0] ** 0.5)  # Conv1D weights are [in, out]
            else:
                parameter.copy_(
                    1 + 0.1 * drawn
                    if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
                    else 0.1 * drawn
                )
    course = kv_cache.CachedGPT(23, 32, 4, 2, 128, max_len=48).to(dtype)
    return gpt2, transformer.load_gpt2_weights(course, gpt2).eval()


def last_logits(model: torch.nn.Module) -> list[torch.Tensor]:
    """Record the last position's logits of every call of ``model`` (a forward hook)."""
    recorded: list[torch.Tensor] = []
    model.register_forward_hook(lambda module, inputs, output: recorded.append(output[:, -1].detach()))
    return recorded


def test_cached_gpt_generates_what_hugging_faces_gpt2_generates_with_its_cache():
    """Greedy tokens equal those of ``GPT2LMHeadModel.generate(use_cache=True)``, and each step's logits
    equal to float32 rounding, given the same weights."""
    gpt2, course = gpt2_and_cached_gpt(150)
    prompt = torch.randint(0, 23, (3, 5), generator=seeded_generator(151))
    recorded = last_logits(course)
    ours = kv_cache.generate(course, prompt, 15, use_cache=True)
    theirs = gpt2.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=15,
        do_sample=False,
        use_cache=True,
        return_dict_in_generate=True,
        output_logits=True,
    )
    expected = torch.stack(theirs.logits, dim=1)  # [batch, 15, vocab]
    top2 = expected.topk(2, dim=-1).values
    assert (top2[..., 0] - top2[..., 1]).min() > 1e-3  # no near tie: equal tokens are not luck
    assert torch.equal(ours, theirs.sequences)
    torch.testing.assert_close(torch.stack(recorded, dim=1), expected, atol=1e-5, rtol=0)


def test_kv_cache_holds_what_dynamic_cache_holds():
    """After the prompt and after one more token, each layer's cached keys and values are Hugging Face's
    (``DynamicCache``: ``[batch, n_heads, len, d_head]``), in float64."""
    gpt2, course = gpt2_and_cached_gpt(152, torch.float64)
    tokens = torch.randint(0, 23, (2, 7), generator=seeded_generator(153))
    cache = kv_cache.KVCache(course.n_layers)
    with torch.no_grad():
        output = gpt2(tokens[:, :6], use_cache=True)
        course(tokens[:, :6], cache=cache)
        name = "cache" if hasattr(output, "cache") else "past_key_values"  # `cache` in 5.24, not in 5.17
        theirs = gpt2(tokens[:, 6:], **{name: getattr(output, name)}, use_cache=True)
        ours = course(tokens[:, 6:], cache=cache)
    torch.testing.assert_close(ours, theirs.logits, atol=1e-12, rtol=0)
    hugging_face = getattr(theirs, name)
    assert cache.length == hugging_face.get_seq_length() == 7
    for layer in range(course.n_layers):
        if hasattr(hugging_face, "layers"):  # DynamicCache's layers, or its key_cache lists before them
            keys, values = hugging_face.layers[layer].keys, hugging_face.layers[layer].values
        else:
            keys, values = hugging_face.key_cache[layer], hugging_face.value_cache[layer]
        assert cache.keys(layer).shape == (2, 4, 7, 8)  # [batch, n_kv_heads, len, d_head]
        torch.testing.assert_close(cache.keys(layer), keys, atol=1e-12, rtol=0)
        torch.testing.assert_close(cache.values(layer), values, atol=1e-12, rtol=0)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["MHA", "GQA-2", "MQA"])
def test_cached_gpt_is_tiny_gpt_with_or_without_the_cache(n_kv_heads):
    """Without a cache ``CachedGPT`` computes chapter 7's ``TinyGPT.forward`` (on its own blocks, GQA ones
    included); fed one token at a time with a cache, it gives the logits of the whole sequence (float64)."""
    torch.manual_seed(154)
    model = kv_cache.CachedGPT(19, 24, 4, 2, 40, max_len=32, n_kv_heads=n_kv_heads).double().eval()
    tokens = torch.randint(0, 19, (3, 11), generator=seeded_generator(155))
    cache = kv_cache.KVCache(model.n_layers)
    with torch.no_grad():
        whole = transformer.TinyGPT.forward(model, tokens)  # the parent's forward: the blocks as modules
        torch.testing.assert_close(model(tokens), whole, atol=1e-12, rtol=0)
        steps = [model(tokens[:, :4], cache=cache)] + [
            model(tokens[:, t : t + 1], cache=cache) for t in range(4, 11)
        ]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-12, rtol=0)
    assert cache.keys(1).shape == (3, n_kv_heads, 11, 6)
    cache.reset()
    assert cache.length == 0 and cache.keys(0) is None


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("aafr"), st.integers(0, 3), st.integers(1, 6)), max_size=25),
    st.integers(1, 5),
)
def test_paged_cache_is_a_contiguous_cache_in_blocks(operations, block_size):
    """Random appends, forks and frees: every sequence gathers what was appended to it (and to its parent
    before the fork), holds ceil(len / block_size) blocks, reference counts count the block tables, and the
    free blocks are exactly those no table holds."""
    cache = kv_cache.PagedKVCache(block_size, 64, 2, 3, torch.float64)
    contiguous: dict[int, torch.Tensor] = {}
    for step, (kind, seq, n) in enumerate(operations):
        if kind == "a":
            key = randn(2, n, 3, seed=step)
            cache.append(seq, key, -key)
            contiguous[seq] = torch.cat([contiguous[seq], key], dim=1) if seq in contiguous else key
        elif kind == "f" and seq in contiguous and (seq + 1) % 4 not in contiguous:
            cache.fork(seq, (seq + 1) % 4)
            contiguous[(seq + 1) % 4] = contiguous[seq]
        elif kind == "r" and seq in contiguous:
            cache.free(seq)
            del contiguous[seq]
        tables = cache.block_tables
        assert sorted(tables) == sorted(contiguous)
        for s, expected in contiguous.items():
            keys, values = cache.gather(s)
            assert torch.equal(keys, expected) and torch.equal(values, -expected)
            assert len(tables[s]) == -(-expected.size(1) // block_size)
        counts = [sum(table.count(block) for table in tables.values()) for block in range(64)]
        assert cache.ref_counts == counts
        assert sorted(cache.free_blocks) == [block for block in range(64) if counts[block] == 0]


def test_kv_cache_modules_reject_bad_arguments():
    with pytest.raises(ValueError, match="at least 1"):
        kv_cache.KVCache(0)
    with pytest.raises(ValueError, match="must divide"):
        kv_cache.CachedGPT(10, 24, 4, n_kv_heads=3)
    model = kv_cache.CachedGPT(10, 8, 2, 1, 16, max_len=4).eval()
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="max_new_tokens"):
        kv_cache.generate(model, torch.zeros(1, 1, dtype=torch.long), -1)
    with pytest.raises(ValueError, match="at least 1"):
        kv_cache.PagedKVCache(0, 4, 1, 1)
    cache = kv_cache.PagedKVCache(2, 3, 1, 2, torch.float64)
    cache.append(0, randn(1, 5, 2, seed=1), randn(1, 5, 2, seed=2))  # 3 blocks: the pool is full
    before = (dict(cache.block_tables), list(cache.free_blocks), list(cache.ref_counts), cache.gather(0))
    with pytest.raises(RuntimeError, match="out of blocks"):
        cache.append(0, randn(1, 2, 2, seed=3), randn(1, 2, 2, seed=4))
    after = (dict(cache.block_tables), list(cache.free_blocks), list(cache.ref_counts), cache.gather(0))
    assert before[:3] == after[:3] and torch.equal(before[3][0], after[3][0])  # nothing changed
    cache.fork(0, 1)
    with pytest.raises(ValueError, match="exists"):
        cache.fork(0, 1)
    for method in (cache.gather, cache.free):
        with pytest.raises(KeyError):
            method(7)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_kv_cache_on_cuda(dtype, no_tf32):
    """The cached forward pass on the GPU gives the logits of the whole sequence (against float64 on the
    CPU); in float32 greedy generation gives the CPU's tokens; the paged cache follows the dtype and
    device."""
    torch.manual_seed(156)
    model = kv_cache.CachedGPT(17, 32, 4, 2, 64, max_len=40, n_kv_heads=2).double().eval()
    tokens = torch.randint(0, 17, (3, 12), generator=seeded_generator(157))
    with torch.no_grad():
        expected = model(tokens)
        on_gpu = model.to("cuda", dtype)
        cache = kv_cache.KVCache(on_gpu.n_layers)
        steps = [on_gpu(tokens[:, :5].cuda(), cache=cache)]
        steps += [on_gpu(tokens[:, t : t + 1].cuda(), cache=cache) for t in range(5, 12)]
    assert cache.keys(0).dtype == dtype and cache.keys(0).device.type == "cuda"
    torch.testing.assert_close(
        torch.cat(steps, 1).double().cpu(), expected, atol=40 * GPU_ATOL[dtype], rtol=0
    )
    if dtype == torch.float32:
        reference = kv_cache.generate(model.double().cpu(), tokens[:, :3], 10)
        assert kv_cache.generate(model.to("cuda", dtype), tokens[:, :3].cuda(), 10).cpu().equal(reference)
    paged = kv_cache.PagedKVCache(4, 8, 2, 3, dtype, "cuda")
    key = randn(2, 9, 3, seed=158, device="cuda", dtype=dtype)
    paged.append(0, key, -key)
    paged.fork(0, 1)
    paged.append(1, key[:, :2], key[:, :2])
    assert torch.equal(paged.gather(0)[0], key) and torch.equal(
        paged.gather(1)[0], torch.cat([key, key[:, :2]], 1)
    )


# ----------------------------------------------------------------------------------------------------
# the online softmax's merge and tiled attention (ex11)


def test_online_softmax_merge_gives_the_state_of_all_keys():
    """Merging the states of two blocks of keys equals the state computed from all the scores at once."""
    scores, value = 3 * randn(2, 3, 5, 11, seed=150), randn(2, 3, 11, 4, seed=151)  # [..., q_len, k_len]

    def state(s, v):
        top = s.amax(-1)
        weights = torch.exp(s - top.unsqueeze(-1))
        return top, weights.sum(-1), weights @ v

    merged = tiled.online_softmax_merge(
        *state(scores[..., :4], value[..., :4, :]), *state(scores[..., 4:], value[..., 4:, :])
    )
    for actual, expected in zip(merged, state(scores, value), strict=True):
        torch.testing.assert_close(actual, expected, atol=1e-12, rtol=0)


@settings(max_examples=25, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), max_size=2),
    q_len=st.integers(1, 6),
    k_len=st.integers(1, 20),
    block_size=st.integers(1, 24),
    seed=st.integers(0, 2**16),
)
def test_tiled_attention_is_sdpa_for_any_block_size(lead, q_len, k_len, block_size, seed):
    """seed-errata C4 (1e-12 in float64), with masks that leave each query a key, for any sizes and blocks."""
    query, key, value = (
        randn(*lead, n, d, seed=seed + i) for i, (n, d) in enumerate(((q_len, 5), (k_len, 5), (k_len, 3)))
    )
    mask = torch.rand(q_len, k_len, generator=seeded_generator(seed)) > 0.5
    mask[:, 0] = True
    for given_mask in (None, mask):
        expected = F.scaled_dot_product_attention(query, key, value, attn_mask=given_mask)
        actual = tiled.tiled_attention(query, key, value, block_size, given_mask)
        torch.testing.assert_close(actual, expected, atol=1e-12, rtol=0)


def test_tiled_attention_is_masked_attention_and_checks_its_arguments():
    """Rows with no allowed key give zeros, as chapter 3's masked_attention; bad arguments raise."""
    query, key, value = randn(2, 6, 8, seed=160), randn(2, 13, 8, seed=161), randn(2, 13, 4, seed=162)
    mask = mask_with_a_key_per_row(2, 6, 13, seed=163)
    mask[0, 3] = False
    mask[1, :, :5] = False  # the first block of 5 keys closed to every query of sequence 1
    expected, _ = masks.masked_attention(query, key, value, mask)
    torch.testing.assert_close(
        tiled.tiled_attention(query, key, value, 5, mask), expected, atol=1e-12, rtol=0
    )
    assert (tiled.tiled_attention(query, key, value, 5, mask)[0, 3] == 0).all()
    with pytest.raises(ValueError, match="block_size"):
        tiled.tiled_attention(query, key, value, 0)
    with pytest.raises(TypeError, match="boolean"):
        tiled.tiled_attention(query, key, value, 4, mask.float())
    with pytest.raises(ValueError, match="k_len"):
        tiled.tiled_attention(query, key, value[:, :5], 4)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_tiled_attention_on_cuda(dtype, no_tf32):
    """tiled_attention on the GPU, with a mask, against the float64 reference on the CPU; dtype and device
    follow the inputs."""
    query, key, value = (
        randn(2, 4, 64, 32, seed=170),
        randn(2, 4, 200, 32, seed=171),
        randn(2, 4, 200, 16, seed=172),
    )
    mask = mask_with_a_key_per_row(2, 1, 64, 200, seed=173)
    expected = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    actual = tiled.tiled_attention(*(x.to("cuda", dtype) for x in (query, key, value)), 48, mask.cuda())
    assert actual.dtype == dtype and actual.device.type == "cuda"
    torch.testing.assert_close(actual.double().cpu(), expected, atol=GPU_ATOL[dtype], rtol=0)
