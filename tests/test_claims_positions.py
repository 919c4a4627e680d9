"""The claims of chapter 8 (positional information), asserted with the course library against independent
arithmetic, PyTorch and Hugging Face ``transformers``.

Expected values come from closed forms written out here (the sinusoidal formula, the angle-sum rotation,
the ALiBi slopes), from Hugging Face's LLaMA rotary embedding built from a config (no download), or from
properties that hold whatever the code (a permuted input gives permuted outputs), never from the course's
code alone. Where the chapter shows a common mistake failing (slopes 2^-(8+h), the reversed bias vector,
mixed RoPE conventions, ``torch.outer`` on ``[batch, len]`` positions), a test asserts the failure too.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from attention_course.device import seeded_generator
from attention_course.masks import causal_mask
from attention_course.multi_head import MultiHeadAttention
from attention_course.positions import (
    POSITIONS,
    PositionalAttention,
    PositionalGPT,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    rope_permutation,
    sinusoidal_encoding,
)


def randn(*shape: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=seeded_generator(seed), dtype=torch.float64).to(dtype)


def randomized(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``module`` in float64 and eval mode, every parameter drawn from a seeded generator."""
    module = module.double().eval()
    generator = seeded_generator(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            drawn = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            parameter.copy_(drawn / math.sqrt(parameter.shape[-1]))
    return module


# --- permutation equivariance ---


def test_attention_without_positions_is_permutation_equivariant():
    length, d_model, n_heads = 7, 12, 3
    mha = randomized(MultiHeadAttention(d_model, n_heads), seed=1)
    x = randn(2, length, d_model, seed=2)
    order = torch.randperm(length, generator=seeded_generator(3))
    assert not torch.equal(order, torch.arange(length))
    with torch.no_grad():
        output, weights = mha(x, x, x)
        permuted_output, permuted_weights = mha(x[:, order], x[:, order], x[:, order])
    torch.testing.assert_close(permuted_output, output[:, order], atol=1e-12, rtol=0)
    torch.testing.assert_close(permuted_weights, weights[:, :, order][:, :, :, order], atol=1e-12, rtol=0)


def test_each_positional_method_breaks_permutation_equivariance():
    length, d_model, n_heads = 7, 12, 3
    mha = randomized(MultiHeadAttention(d_model, n_heads), seed=4)
    rope = PositionalAttention(d_model, n_heads, "rope").double().eval()
    alibi = PositionalAttention(d_model, n_heads, "alibi").double().eval()
    for module in (rope, alibi):
        module.load_state_dict(mha.state_dict())
    table = randn(length, d_model, seed=5)  # a learned encoding (random here)
    sinusoids = sinusoidal_encoding(length, d_model, dtype=torch.float64)
    methods = {
        "learned": lambda x: mha(x + table, x + table, x + table)[0],
        "sinusoidal": lambda x: mha(x + sinusoids, x + sinusoids, x + sinusoids)[0],
        "rope": lambda x: rope(x, x, x)[0],
        "alibi": lambda x: alibi(x, x, x)[0],
        "causal mask": lambda x: mha(x, x, x, causal_mask(length))[0],
    }
    x = randn(2, length, d_model, seed=6)
    order = torch.randperm(length, generator=seeded_generator(7))
    with torch.no_grad():
        for name, attend in methods.items():
            gap = (attend(x[:, order]) - attend(x)[:, order]).abs().max()
            assert gap > 1e-2, name
        # "none" in PositionalAttention is plain multi-head attention
        plain = PositionalAttention(d_model, n_heads, "none").double().eval()
        plain.load_state_dict(mha.state_dict())
        torch.testing.assert_close(
            plain(x[:, order], x[:, order], x[:, order])[0], plain(x, x, x)[0][:, order], atol=1e-12, rtol=0
        )


# --- sinusoidal encodings ---


@pytest.mark.parametrize("max_len, d_model", [(50, 16), (9, 6), (128, 64)])
def test_sinusoidal_encoding_is_the_formula(max_len, d_model):
    expected = torch.tensor(
        [
            [
                math.sin(p / 10000 ** (f / d_model))
                if f % 2 == 0
                else math.cos(p / 10000 ** ((f - 1) / d_model))
                for f in range(d_model)
            ]
            for p in range(max_len)
        ],
        dtype=torch.float64,
    )
    encoding = sinusoidal_encoding(max_len, d_model, dtype=torch.float64)
    assert encoding.shape == (max_len, d_model) and encoding.dtype == torch.float64
    torch.testing.assert_close(encoding, expected, atol=1e-12, rtol=0)
    assert sinusoidal_encoding(max_len, d_model).dtype == torch.float32


def test_sinusoidal_wavelengths_are_geometric_from_2pi():
    d_model = 16
    encoding = sinusoidal_encoding(400, d_model, dtype=torch.float64)
    # pair 0 has angular frequency 1: its sine at position p is sin(p), period 2 pi
    torch.testing.assert_close(encoding[:, 0], torch.sin(torch.arange(400, dtype=torch.float64)))
    omega = [10000 ** (-2 * i / d_model) for i in range(d_model // 2)]
    wavelengths = [2 * math.pi / w for w in omega]
    assert wavelengths[0] == pytest.approx(2 * math.pi, abs=1e-12)
    for a, b in itertools.pairwise(wavelengths):
        assert b / a == pytest.approx(10000 ** (2 / d_model), rel=1e-12)
    assert wavelengths[-1] < 10000 * 2 * math.pi


@pytest.mark.parametrize("k", [1, 7, 50])
def test_sinusoidal_shift_is_a_fixed_block_rotation(k):
    max_len, d_model = 200, 64
    encoding = sinusoidal_encoding(max_len, d_model, dtype=torch.float64)
    blocks = []
    for i in range(d_model // 2):
        angle = k * 10000 ** (-2 * i / d_model)
        c, s = math.cos(angle), math.sin(angle)
        blocks.append(torch.tensor([[c, s], [-s, c]], dtype=torch.float64))
    shift = torch.block_diag(*blocks)  # M_k, the same for every position
    torch.testing.assert_close(encoding[:-k] @ shift.T, encoding[k:], atol=1e-10, rtol=0)
    dots = (encoding[:-k] * encoding[k:]).sum(dim=-1)
    assert dots.std() < 1e-9
    expected = sum(math.cos(k * 10000 ** (-2 * i / d_model)) for i in range(d_model // 2))
    assert abs(dots.mean().item() - expected) < 1e-9


# --- RoPE ---


def score(q, k, m, n, interleaved=False):
    rotated_q = apply_rope(q[None], torch.tensor([m]), interleaved=interleaved)[0]
    rotated_k = apply_rope(k[None], torch.tensor([n]), interleaved=interleaved)[0]
    return (rotated_q @ rotated_k).item()


def rotate_pairs_by_hand(x: torch.Tensor, position: float, pairs: list[tuple[int, int]]) -> torch.Tensor:
    """x [d] with pair i, (a, b), rotated by position * 10000^(-2i/d): the paper's equation, pair by pair."""
    d = x.numel()
    out = x.clone()
    for i, (a, b) in enumerate(pairs):
        angle = position * 10000 ** (-2 * i / d)
        out[a] = x[a] * math.cos(angle) - x[b] * math.sin(angle)
        out[b] = x[a] * math.sin(angle) + x[b] * math.cos(angle)
    return out


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "rotate_half"])
def test_rope_rotates_the_pairs_of_its_convention(interleaved):
    d = 12
    pairs = (
        [(2 * i, 2 * i + 1) for i in range(d // 2)]
        if interleaved
        else [(i, i + d // 2) for i in range(d // 2)]
    )
    x = randn(5, d, seed=10)  # [len, d]
    positions = torch.tensor([0, 1, 4, 17, 300])
    rotated = apply_rope(x, positions, interleaved=interleaved)
    for row, position in enumerate(positions.tolist()):
        torch.testing.assert_close(
            rotated[row], rotate_pairs_by_hand(x[row], position, pairs), atol=1e-12, rtol=0
        )


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "rotate_half"])
def test_rope_norms_relative_scores_and_identity_at_zero(interleaved):
    d_head = 16
    x = randn(3, 9, d_head, seed=11)
    positions = torch.arange(9) * 37
    rotated = apply_rope(x, positions, interleaved=interleaved)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-12, rtol=0)
    torch.testing.assert_close(apply_rope(x, torch.zeros(9, dtype=torch.long), interleaved=interleaved), x)
    q, k = randn(d_head, seed=12), randn(d_head, seed=13)
    scores = [score(q, k, m, n, interleaved) for m, n in ((3, 1), (10, 8), (103, 101))]
    assert max(scores) - min(scores) < 1e-9
    assert abs(score(q, k, 3, 1, interleaved) - score(q, k, 3, 2, interleaved)) > 1e-3


def test_rope_conventions_differ_by_the_permutation():
    d_head = 16
    perm = rope_permutation(d_head)
    assert perm.tolist() == [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15]
    x = randn(2, 4, 9, d_head, seed=14)
    positions = torch.arange(9)
    torch.testing.assert_close(
        apply_rope(x[..., perm], positions),
        apply_rope(x, positions, interleaved=True)[..., perm],
        atol=1e-12,
        rtol=0,
    )


def head_scores(w_q, w_k, x, n_heads, interleaved):
    length, d_model = x.shape
    d_head = d_model // n_heads
    q = (x @ w_q.T).view(length, n_heads, d_head).transpose(0, 1)
    k = (x @ w_k.T).view(length, n_heads, d_head).transpose(0, 1)
    positions = torch.arange(length)
    return (
        apply_rope(q, positions, interleaved=interleaved)
        @ apply_rope(k, positions, interleaved=interleaved).mT
    )


def test_mixed_rope_conventions_give_other_scores_and_hf_permute_fixes_them():
    d_model, n_heads, length = 64, 4, 10
    d_head = d_model // n_heads
    w_q, w_k = randn(d_model, d_model, seed=15) / 8, randn(d_model, d_model, seed=16) / 8
    x = randn(length, d_model, seed=17)
    meta = head_scores(w_q, w_k, x, n_heads, interleaved=True)
    mixed = head_scores(w_q, w_k, x, n_heads, interleaved=False)
    assert not torch.allclose(mixed, meta, atol=1e-3)

    def permute(w, n_heads, dim1=d_model, dim2=d_model):  # convert_llama_weights_to_hf.py
        return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)

    converted = head_scores(permute(w_q, n_heads), permute(w_k, n_heads), x, n_heads, interleaved=False)
    torch.testing.assert_close(converted, meta, atol=1e-10, rtol=0)
    per_head = torch.cat([h * d_head + rope_permutation(d_head) for h in range(n_heads)])
    assert torch.equal(permute(w_q, n_heads), w_q[per_head])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("ids", ["1-D", "2-D"])
def test_rope_equals_hugging_face_llama(dtype, ids):
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=256)
    rotary = LlamaRotaryEmbedding(config)
    batch, n_heads, length, d_head = 3, 4, 11, 16
    q, k = (
        randn(batch, n_heads, length, d_head, seed=18, dtype=dtype),
        randn(batch, n_heads, length, d_head, seed=19, dtype=dtype),
    )
    if ids == "1-D":
        positions = torch.arange(length) + 5
        position_ids = positions.expand(batch, -1)
    else:  # a different offset per sequence, as with left padding
        positions = torch.arange(length)[None] + torch.tensor([[0], [3], [100]])
        position_ids = positions
    cos, sin = rotary(q, position_ids)
    expected_q, expected_k = apply_rotary_pos_emb(q, k, cos, sin)
    # Hugging Face computes the angles in float32 whatever the dtype: float32 rounding in both cases
    torch.testing.assert_close(apply_rope(q, positions), expected_q, atol=1e-5, rtol=0)
    torch.testing.assert_close(apply_rope(k, positions), expected_k, atol=1e-5, rtol=0)
    assert apply_rope(q, positions).dtype == dtype


def test_torch_outer_fails_on_batched_position_ids():
    theta = 10000 ** -(torch.arange(0, 16, 2, dtype=torch.float32) / 16)
    positions = torch.arange(10.0)[None] + torch.tensor([[0.0], [3.0]])  # [batch, len]
    with pytest.raises(RuntimeError, match="1-D"):
        torch.outer(positions, theta)
    torch.testing.assert_close((positions[..., None] * theta)[1], torch.outer(positions[1], theta))


# --- ALiBi ---


@pytest.mark.parametrize(
    "n_heads, exponents",
    [
        (8, [1, 2, 3, 4, 5, 6, 7, 8]),
        (16, [h / 2 for h in range(1, 17)]),
        (12, [1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5]),
        (6, [2, 4, 6, 8, 1, 3]),
    ],
)
def test_alibi_slopes(n_heads, exponents):
    expected = torch.tensor([2.0**-e for e in exponents], dtype=torch.float64)
    torch.testing.assert_close(alibi_slopes(n_heads, torch.float64), expected, atol=1e-15, rtol=0)


def test_alibi_bias_row_is_slope_times_j_minus_i():
    n_heads, length = 8, 7
    bias = alibi_bias(n_heads, length, length, torch.float64)
    assert bias.shape == (n_heads, length, length)
    for h in range(n_heads):
        slope = 2.0 ** -(h + 1)
        for i in range(length):
            for j in range(i + 1):
                assert abs(bias[h, i, j].item() - slope * (j - i)) < 1e-15
    # the queries are the last q_len positions (bottom-right, as the causal mask): the square bias's last rows
    torch.testing.assert_close(alibi_bias(n_heads, 3, length, torch.float64), bias[:, -3:], atol=0, rtol=0)


def test_alibi_authors_m_times_j_gives_the_same_softmax_under_the_causal_mask():
    n_heads, length = 4, 9
    scores = randn(n_heads, length, length, seed=20)
    slopes = torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8], dtype=torch.float64)
    by_key = slopes[:, None, None] * torch.arange(length, dtype=torch.float64)  # the same row for each query
    allowed = torch.ones(length, length, dtype=torch.bool).tril()
    course = torch.softmax(
        (scores + alibi_bias(n_heads, length, length, torch.float64)).masked_fill(~allowed, -math.inf), -1
    )
    authors = torch.softmax((scores + by_key).masked_fill(~allowed, -math.inf), dim=-1)
    torch.testing.assert_close(authors, course, atol=1e-12, rtol=0)


def test_alibi_slopes_two_to_the_minus_eight_plus_h_are_far_too_small():
    right = alibi_slopes(8, torch.float64)
    wrong = torch.tensor([2.0 ** -(8 + h) for h in range(8)], dtype=torch.float64)
    torch.testing.assert_close(right / wrong, torch.full((8,), 128.0, dtype=torch.float64), atol=0, rtol=0)
    distance = torch.arange(511, -1, -1, dtype=torch.float64)  # the last query of a 512-token window
    weights = {
        name: torch.softmax(-s[:, None] * distance, dim=-1)
        for name, s in (("right", right), ("wrong", wrong))
    }
    entropy = {name: -(w * w.log()).sum(dim=-1) / math.log(512) for name, w in weights.items()}
    assert entropy["wrong"].min() > 0.97  # every head nearly uniform
    assert weights["wrong"][:, -16:].sum(dim=-1).max() < 0.075  # uniform: 16 / 512
    assert weights["right"][0, -16:].sum() > 0.999  # a local head
    assert entropy["right"][0] < 0.3


def test_alibi_reversed_bias_vector_gives_the_nearest_key_the_lowest_weight():
    i, slope = 8, 0.5
    paper = torch.softmax(alibi_bias(8, i, i, torch.float64)[0, -1], dim=-1)  # head 1, slope 1/2, last query
    reversed_bias = torch.softmax(
        slope * -torch.arange(i, dtype=torch.float64), dim=-1
    )  # m [0, -1, ..., -(i-1)]
    assert paper.argmax() == i - 1 and (paper[1:] > paper[:-1]).all()
    assert reversed_bias.argmin() == i - 1 and (reversed_bias[1:] < reversed_bias[:-1]).all()


def test_alibi_without_causal_mask_rewards_far_future_keys():
    bias = alibi_bias(1, 9, 9, torch.float64)[0]
    assert (bias.argmax(dim=-1) == 8).all()  # every query's largest bias on the last key
    symmetric = -(torch.arange(9)[None] - torch.arange(9)[:, None]).abs().double()
    assert (symmetric.argmax(dim=-1) == torch.arange(9)).all() and torch.equal(symmetric, symmetric.T)


# --- PositionalGPT ---


@pytest.mark.parametrize("position", POSITIONS)
def test_positional_gpt_accepts_every_kind_and_lengths_up_to_max_len(position):
    torch.manual_seed(0)
    model = PositionalGPT(11, position, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=40).eval()
    for length in (1, 13, 40):
        tokens = torch.randint(11, (2, length), generator=seeded_generator(length))
        with torch.no_grad():
            logits = model(tokens)
        assert logits.shape == (2, length, 11) and torch.isfinite(logits).all()
    with pytest.raises(ValueError):
        model(torch.zeros(1, 41, dtype=torch.long))
    # causal: the logits of a prefix do not depend on what follows
    tokens = torch.randint(11, (2, 30), generator=seeded_generator(1))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens[:, :12]), model(tokens)[:, :12], atol=1e-5, rtol=0)


def test_positional_gpt_rejects_an_unknown_kind():
    with pytest.raises(ValueError):
        PositionalGPT(11, "relative")
    with pytest.raises(ValueError):
        PositionalAttention(16, 2, "learned")


def test_positional_gpt_parameters_and_shared_initialisation():
    models = {}
    for position in POSITIONS:
        torch.manual_seed(0)
        models[position] = PositionalGPT(24, position, max_len=128)
    counts = {position: sum(p.numel() for p in model.parameters()) for position, model in models.items()}
    assert counts["learned"] - counts["none"] == 128 * 64
    assert len({counts[p] for p in ("none", "sinusoidal", "rope", "alibi")}) == 1
    reference = models["none"].state_dict()
    for model in models.values():
        state = model.state_dict()
        assert all(torch.equal(state[name], value) for name, value in reference.items())
