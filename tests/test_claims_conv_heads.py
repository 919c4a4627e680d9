"""The checkable claims of chapter 9 (attention heads that are convolutions, Cordonnier et al. 2020).

Expected values come from PyTorch (``F.conv2d``, ``F.conv1d``, ``nn.MultiheadAttention``,
``FlopCounterMode``), from hand-written tables or from closed-form arithmetic, never from the course's code
alone. The layer of positional heads is rebuilt here head by head, in plain PyTorch, so that the two slips
the chapter shows failing (the shift in place of the centre, the sign of the shift) are tested without the
library. The chapter asserts the same claims as it runs; these tests keep them true when it is edited.
"""

from __future__ import annotations

import math
from itertools import product

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from attention_course.conv_heads import attention_conv1d, attention_conv2d, quadratic_relative_encoding
from attention_course.device import seeded_generator

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]


def randn(*shape: int, seed: int, device: str = "cpu", dtype=torch.float64) -> torch.Tensor:
    """Seeded standard normal draws, made on the CPU (the same numbers on every device)."""
    return torch.randn(*shape, generator=seeded_generator(seed), dtype=torch.float64).to(device, dtype)


def shifts(kernel: int) -> list[tuple[int, int]]:
    """The centres Delta of a kernel's heads, in the order of weight[:, :, a, b] (row by row)."""
    half = kernel // 2
    return [(a - half, b - half) for a, b in product(range(kernel), repeat=2)]


def heads_by_hand(x, weight, bias, alpha, sign=1):
    """The layer of K * K positional heads, one head at a time, without the library.

    Keys: the pixels of the zero-padded image; queries: the image's own pixels. Head (a, b) has the centre
    Delta = (a - K//2, b - K//2), the score -alpha (||d||^2 - 2 <Delta, d>) with d = sign * (k - q), and the
    value-output map weight[:, :, a, b].T. sign = -1 is the slip delta = q - k.
    """
    batch, _, height, width = x.shape
    kernel = weight.shape[-1]
    pad = kernel // 2
    padded = F.pad(x, (pad, pad, pad, pad))
    keys = padded.flatten(2).transpose(1, 2)  # [batch, n_keys, c_in]
    key_rows, key_cols = torch.meshgrid(
        torch.arange(height + 2 * pad), torch.arange(width + 2 * pad), indexing="ij"
    )
    key_pos = torch.stack((key_rows.flatten(), key_cols.flatten()), dim=-1).to(x)  # [n_keys, 2]
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    query_pos = torch.stack((rows.flatten(), cols.flatten()), dim=-1).to(x) + pad  # [n_queries, 2]
    d = sign * (key_pos[None, :, :] - query_pos[:, None, :])  # [n_queries, n_keys, 2]
    out = torch.zeros(batch, height * width, weight.shape[0], dtype=x.dtype, device=x.device)
    for (a, b), centre in zip(product(range(kernel), repeat=2), shifts(kernel), strict=True):
        centre = torch.tensor(centre).to(x)
        scores = -alpha * ((d**2).sum(-1) - 2 * (d * centre).sum(-1))  # [n_queries, n_keys]
        out = out + torch.softmax(scores, dim=-1) @ keys @ weight[:, :, a, b].T  # [batch, n_queries, c_out]
    out = out + bias
    return out.transpose(1, 2).reshape(batch, -1, height, width)


# --- the encoding ---


def test_quadratic_relative_encoding_against_a_hand_written_table():
    r = quadratic_relative_encoding(
        2, 3, dtype=torch.float64
    )  # pixels 0..5 = (0,0) (0,1) (0,2) (1,0) (1,1) (1,2)
    assert r.shape == (6, 6, 3) and r.dtype == torch.float64
    # query (0, 0): delta = k - q = k
    assert r[0].tolist() == [[0, 0, 0], [1, 0, 1], [4, 0, 2], [1, 1, 0], [2, 1, 1], [5, 1, 2]]
    # query (1, 2): delta = k - (1, 2)
    assert r[5].tolist() == [[5, -1, -2], [2, -1, -1], [1, -1, 0], [4, 0, -2], [1, 0, -1], [0, 0, 0]]
    # query (0, 1), key (1, 0): delta = (1, -1)
    assert r[1, 3].tolist() == [2, 1, -1]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("height", "width"), [(1, 1), (3, 5), (7, 4)], ids=str)
def test_quadratic_relative_encoding_shape_and_values(height, width, device):
    r = quadratic_relative_encoding(height, width, dtype=torch.float64, device=device)
    assert r.shape == (height * width, height * width, 3) and r.device.type == device
    for q, k in [(0, height * width - 1), (height * width - 1, 0), (width // 2, (height - 1) * width)]:
        (q1, q2), (k1, k2) = divmod(q, width), divmod(k, width)
        assert r[q, k].tolist() == [(k1 - q1) ** 2 + (k2 - q2) ** 2, k1 - q1, k2 - q2]
    assert quadratic_relative_encoding(2, 2).dtype == torch.float32  # the default dtype


# --- one head: the score and where it peaks ---


@pytest.mark.parametrize("alpha", [0.5, 3.0, 50.0])
def test_score_identity_on_a_line(alpha):
    delta = torch.arange(-6, 7, dtype=torch.float64)  # k - q
    r = torch.stack((delta**2, delta), dim=-1)  # r_delta = (delta^2, delta)
    for centre in (-2, -1, 0, 1, 2):
        v = -alpha * torch.tensor([1.0, -2.0 * centre], dtype=torch.float64)
        expected = -alpha * (delta - centre) ** 2 + alpha * centre**2
        torch.testing.assert_close(r @ v, expected, atol=1e-12, rtol=0)
        assert delta[(r @ v).argmax()] == centre  # the key q + Delta


@pytest.mark.parametrize("alpha", [0.5, 3.0, 50.0])
def test_score_identity_on_the_grid_and_argmax_at_q_plus_delta(alpha):
    size = 7
    r = quadratic_relative_encoding(size, size, dtype=torch.float64)  # [49, 49, 3]
    pixels = [(i, j) for i in range(size) for j in range(size)]
    for centre in shifts(5):
        v = -alpha * torch.tensor([1.0, -2.0 * centre[0], -2.0 * centre[1]], dtype=torch.float64)
        scores = r @ v  # [query, key]
        for q, (q1, q2) in enumerate(pixels[::3]):
            q = 3 * q
            expected = torch.tensor(
                [
                    -alpha * ((k1 - q1 - centre[0]) ** 2 + (k2 - q2 - centre[1]) ** 2)
                    + alpha * (centre[0] ** 2 + centre[1] ** 2)
                    for k1, k2 in pixels
                ],
                dtype=torch.float64,
            )
            torch.testing.assert_close(scores[q], expected, atol=1e-12, rtol=0)
            target = (min(max(q1 + centre[0], 0), size - 1), min(max(q2 + centre[1], 0), size - 1))
            assert pixels[scores[q].argmax()] == target  # q + Delta, or the nearest pixel inside


# --- nine heads, 25 heads, three heads: convolutions ---


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alpha", [50.0, 20.0])
@pytest.mark.parametrize(
    "sizes", [(2, 3, 4, 6, 7), (1, 1, 1, 3, 3), (3, 2, 5, 1, 9)], ids=lambda s: "b{}i{}o{}h{}w{}".format(*s)
)
def test_nine_heads_equal_conv2d_padding_1(sizes, alpha, device):
    batch, c_in, c_out, height, width = sizes
    x = randn(batch, c_in, height, width, seed=1, device=device)
    weight, bias = randn(c_out, c_in, 3, 3, seed=2, device=device), randn(c_out, seed=3, device=device)
    expected = F.conv2d(x, weight, bias, padding=1)
    torch.testing.assert_close(attention_conv2d(x, weight, bias, alpha), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(heads_by_hand(x, weight, bias, alpha), expected, atol=1e-6, rtol=0)


def test_chapter_numbers_of_the_error_against_alpha():
    x, weight, bias = randn(2, 3, 6, 7, seed=0), randn(4, 3, 3, 3, seed=5), randn(4, seed=6)
    expected = F.conv2d(x, weight, bias, padding=1)
    error = {a: (attention_conv2d(x, weight, bias, a) - expected).abs().max().item() for a in (1, 20, 50)}
    assert error[50] < 1e-12  # float64 rounding
    assert error[20] < 1e-6
    assert error[1] > 0.1  # not a convolution: each head averages a neighbourhood


def test_alpha_one_is_a_neighbourhood_average_not_a_convolution():
    x, weight, bias = randn(1, 2, 9, 9, seed=7), randn(3, 2, 3, 3, seed=8), randn(3, seed=9)
    soft = attention_conv2d(x, weight, bias, alpha=1.0)
    assert (soft - F.conv2d(x, weight, bias, padding=1)).abs().max() > 0.1
    torch.testing.assert_close(soft, heads_by_hand(x, weight, bias, 1.0), atol=1e-12, rtol=0)
    # the weight a head keeps on its centre, interior query: 1 / (sum_m exp(-m^2))^2
    s = sum(math.exp(-(m**2)) for m in range(-10, 11))
    assert abs(1 / s**2 - 0.318) < 5e-4


@pytest.mark.parametrize("device", DEVICES)
def test_twenty_five_heads_equal_a_5x5_conv2d(device):
    x = randn(2, 3, 8, 9, seed=10, device=device)
    weight, bias = randn(5, 3, 5, 5, seed=11, device=device), randn(5, seed=12, device=device)
    expected = F.conv2d(x, weight, bias, padding=2)
    torch.testing.assert_close(attention_conv2d(x, weight, bias, 50.0), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(heads_by_hand(x, weight, bias, 50.0), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", [3, 5])
def test_k_heads_on_a_line_equal_conv1d(kernel, device):
    x = randn(2, 3, 11, seed=13, device=device)
    weight, bias = randn(4, 3, kernel, seed=14, device=device), randn(4, seed=15, device=device)
    expected = F.conv1d(x, weight, bias, padding=kernel // 2)
    torch.testing.assert_close(attention_conv1d(x, weight, bias, 50.0), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        attention_conv1d(x, weight, None, 50.0), expected - bias[:, None], atol=1e-6, rtol=0
    )


def test_float32_layer_matches_a_float64_convolution():
    x, weight, bias = randn(2, 3, 6, 7, seed=16), randn(4, 3, 3, 3, seed=17), randn(4, seed=18)
    expected = F.conv2d(x, weight, bias, padding=1)
    got = attention_conv2d(x.float(), weight.float(), bias.float(), 50.0)
    assert got.dtype == torch.float32
    # a float32 conv2d against the float64 one sets the scale of float32 rounding
    rounding = (F.conv2d(x.float(), weight.float(), bias.float(), padding=1).double() - expected).abs().max()
    assert (got.double() - expected).abs().max() <= 10 * rounding + 1e-6


# --- the two slips ---


def test_the_shift_in_place_of_the_centre_gives_plus_alpha_norm_and_a_corner():
    size, alpha = 7, 1.0
    r = quadratic_relative_encoding(size, size, dtype=torch.float64)
    q = 3 * size + 3  # the centre (3, 3)
    delta = r[q, :, 1:]  # [49, 2]
    v_wrong = -alpha * torch.cat((torch.ones(49, 1, dtype=torch.float64), -2 * delta), dim=-1)
    scores = (v_wrong * r[q]).sum(-1)
    torch.testing.assert_close(scores, alpha * (delta**2).sum(-1), atol=1e-12, rtol=0)  # +alpha ||delta||^2
    assert divmod(scores.argmax().item(), size) == (0, 0)
    corners = [0, size - 1, size * (size - 1), size * size - 1]
    assert sorted((scores == scores.max()).nonzero().flatten().tolist()) == corners
    assert torch.softmax(scores, dim=0)[corners].sum() > 0.98  # 0.986: the farthest pixels
    # on a line: -alpha (d^2 - 2 d d) = +alpha d^2, not -alpha d^2
    d = torch.arange(-4, 5, dtype=torch.float64)
    assert torch.equal(-alpha * (d**2 - 2 * d * d), alpha * d**2)
    assert not torch.equal(-alpha * (d**2 - 2 * d * d), -alpha * d**2)


@pytest.mark.parametrize("kernel", [3, 5])
def test_delta_q_minus_k_gives_the_flipped_kernel(kernel):
    x, weight, bias = randn(2, 3, 6, 7, seed=19), randn(4, 3, kernel, kernel, seed=20), randn(4, seed=21)
    pad = kernel // 2
    other_sign = heads_by_hand(x, weight, bias, 50.0, sign=-1)
    torch.testing.assert_close(
        other_sign, F.conv2d(x, weight.flip(-1, -2), bias, padding=pad), atol=1e-6, rtol=0
    )
    assert (other_sign - F.conv2d(x, weight, bias, padding=pad)).abs().max() > 1.0
    # and each head's largest score is then at q - Delta
    r = quadratic_relative_encoding(7, 7, dtype=torch.float64)
    r_other = r * torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64)
    for centre in shifts(3):
        v = -50.0 * torch.tensor([1.0, -2.0 * centre[0], -2.0 * centre[1]], dtype=torch.float64)
        assert divmod((r_other[24] @ v).argmax().item(), 7) == (3 - centre[0], 3 - centre[1])


# --- what the construction does not do ---


def test_a_content_head_reaches_pixels_a_kernel_cannot():
    image = randn(1, 4, 8, 8, seed=22)
    changed = image.clone()
    changed[0, :, 0, 0] += 1.0
    weight, bias = randn(4, 4, 3, 3, seed=23), randn(4, seed=24)
    far = torch.ones(8, 8, dtype=torch.bool)
    far[:2, :2] = False  # the pixels whose 3 x 3 window misses (0, 0)
    for layer in (
        lambda p: F.conv2d(p, weight, bias, padding=1),
        lambda p: attention_conv2d(p, weight, bias),
    ):
        assert (layer(changed) - layer(image))[0, :, far].abs().max() == 0
    mha = nn.MultiheadAttention(4, 1, batch_first=True).double().eval()
    generator = seeded_generator(31)
    with torch.no_grad():
        for parameter in mha.parameters():  # seeded weights, scaled as a default initialisation would be
            drawn = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            parameter.copy_(drawn / math.sqrt(parameter.shape[-1]))
        tokens, tokens_changed = (p.flatten(2).transpose(1, 2) for p in (image, changed))  # [1, 64, 4]
        move = mha(tokens_changed, tokens_changed, tokens_changed)[0] - mha(tokens, tokens, tokens)[0]
    assert (move[0].abs().amax(dim=-1).reshape(8, 8)[far] > 1e-9).all()  # every far pixel moves


@pytest.mark.parametrize(("side", "low", "high"), [(16, 6, 7), (32, 19, 21)])
def test_the_heads_cost_grows_like_hw_squared(side, low, high):
    channels, kernel = 64, 3
    x = torch.empty(1, channels, side, side, device="meta")
    weight = torch.empty(channels, channels, kernel, kernel, device="meta")
    counts = {}
    for name, layer in (
        ("conv", lambda: F.conv2d(x, weight, padding=1)),
        ("heads", lambda: attention_conv2d(x, weight)),
    ):
        with FlopCounterMode(display=False) as counter:
            layer()
        counts[name] = counter.get_total_flops()
    assert counts["conv"] == 2 * side**2 * kernel**2 * channels**2
    assert counts["heads"] >= 2 * kernel**2 * side**2 * (side + 2) ** 2 * channels
    assert low < counts["heads"] / counts["conv"] < high


# --- what the library refuses ---


@pytest.mark.parametrize("shape", [(4, 3, 4, 4), (4, 3, 2, 2), (4, 3, 3, 5), (4, 3, 5, 3)], ids=str)
def test_attention_conv2d_refuses_even_or_non_square_kernels(shape):
    with pytest.raises(ValueError):
        attention_conv2d(randn(1, 3, 5, 5, seed=25), randn(*shape, seed=26))


def test_attention_conv2d_refuses_a_kernel_with_other_input_channels():
    with pytest.raises(ValueError):
        attention_conv2d(randn(1, 3, 5, 5, seed=27), randn(4, 2, 3, 3, seed=28))


def test_attention_conv1d_refuses_an_even_kernel():
    with pytest.raises(ValueError):
        attention_conv1d(randn(1, 3, 9, seed=29), randn(4, 3, 4, seed=30))
