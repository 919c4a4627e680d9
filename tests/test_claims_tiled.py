"""The checkable claims of chapter 11 (attention in O(n) memory: the online softmax, tiled attention).

Expected values come from PyTorch (``torch.softmax``, ``torch.logsumexp``, ``F.scaled_dot_product_attention``,
``torch.cuda.max_memory_allocated``), from numbers worked out by hand, or from the recurrences written out
again here in plain PyTorch, never from the course's code alone. Tolerances are the seed errata's where a
claim is one of theirs (C3: softmax rows and shifts, 1e-6 in float32; C4: attention equal to PyTorch's, 1e-12
in float64 and 1e-6 in float32; C6: padding invariance with padding keys a hundred times larger, 1e-6). The
chapter asserts the same claims as it runs; these tests keep them true when it is edited.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from attention_course.device import seeded_generator
from attention_course.masks import masked_attention
from attention_course.memory import AllocationTracker, peak_memory
from attention_course.tiled import (
    flash_attention_traffic,
    online_softmax_merge,
    standard_attention_traffic,
    tiled_attention,
)

CUDA = torch.cuda.is_available()
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no GPU")]),
]
ATOL = {torch.float64: 1e-12, torch.float32: 1e-6}  # seed errata C4, on the CPU


@pytest.fixture
def no_tf32():
    """float32 matrix products in full precision on a GPU, as the reference needs (TF32 is off)."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = previous


def randn(*shape: int, seed: int, device: str = "cpu", dtype=torch.float64) -> torch.Tensor:
    """Seeded standard normal draws, made on the CPU (the same numbers on every device)."""
    return torch.randn(*shape, generator=seeded_generator(seed), dtype=torch.float64).to(device, dtype)


# --- the online softmax (Milakov and Gimelshein 2018), written out here


def one_pass(x: torch.Tensor) -> tuple[float, float]:
    """The running max and the running sum of a vector, element by element."""
    m, total = -math.inf, 0.0
    for value in x.tolist():
        new = max(m, value)
        total = total * math.exp(m - new) + math.exp(value - new)
        m = new
    return m, total


def test_one_pass_max_and_sum_give_the_softmax():
    """C3: the rows sum to 1 and equal torch.softmax, in float32, on scores where exp() alone overflows."""
    x = 60 * randn(2000, seed=1, dtype=torch.float32)
    assert not torch.isfinite(torch.exp(x)).all()
    m, total = one_pass(x)
    assert m == x.max().item()
    assert abs(m + math.log(total) - torch.logsumexp(x.double(), 0).item()) < 1e-6
    softmax = torch.exp(x - m) / total
    torch.testing.assert_close(softmax, torch.softmax(x, 0), atol=1e-6, rtol=0)
    assert abs(softmax.sum().item() - 1) < 1e-6


def test_the_shift_changes_nothing_and_the_unrescaled_sum_is_wrong():
    """C3: adding a constant to every score leaves the softmax unchanged; a sum not rescaled when the maximum
    rises is too large (the slip the chapter shows)."""
    x = 3 * randn(500, seed=2)
    m, total = one_pass(x)
    shifted_m, shifted_total = one_pass(x + 123.0)
    torch.testing.assert_close(torch.exp(x + 123.0 - shifted_m) / shifted_total, torch.exp(x - m) / total)
    m, wrong = -math.inf, 0.0
    for value in x.tolist():
        m = max(m, value)
        wrong += math.exp(value - m)
    assert wrong / total > 1.5


def test_merging_in_any_order_gives_the_summary_of_the_union():
    """The merge of (m, l) pairs is associative and commutative: every order and grouping gives (max, sum)."""
    x = 3 * randn(1000, seed=3)
    cuts = [0, 7, 150, 151, 480, 700, 999, 1000]
    states = []
    for start, stop in itertools.pairwise(cuts):
        top = x[start:stop].max()
        states.append((top, torch.exp(x[start:stop] - top).sum()))

    def merge(a, b):
        top = torch.maximum(a[0], b[0])
        return top, a[1] * torch.exp(a[0] - top) + b[1] * torch.exp(b[0] - top)

    orders = [states, states[::-1], states[3:] + states[:3]]
    expected = torch.logsumexp(x, 0)
    for order in orders:
        merged = order[0]
        for state in order[1:]:
            merged = merge(merged, state)
        assert merged[0] == x.max()
        torch.testing.assert_close(merged[0] + merged[1].log(), expected, atol=1e-12, rtol=0)


def test_the_merge_of_empty_states_needs_its_guard():
    """exp(-inf - (-inf)) is NaN; online_softmax_merge gives (-inf, 0, 0) for two empty states, and an empty
    state merged with another leaves it unchanged."""
    inf = torch.tensor(math.inf, dtype=torch.float64)
    assert torch.isnan(torch.exp(-inf - (-inf)))
    empty = (torch.full((3,), -math.inf, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    empty += (torch.zeros(3, 2, dtype=torch.float64),)
    top, total, out = online_softmax_merge(*empty, *empty)
    assert (top == -math.inf).all() and (total == 0).all() and (out == 0).all()
    some = (randn(3, seed=4), randn(3, seed=5).abs() + 1, randn(3, 2, seed=6))
    for merged in (online_softmax_merge(*empty, *some), online_softmax_merge(*some, *empty)):
        for actual, expected in zip(merged, some, strict=True):
            assert torch.equal(actual, expected)


def test_merge_worked_out_by_hand():
    """States (1, 2, [3, -1]) and (3, 1, [1, 2]) merge to (3, 2e^-2 + 1, [3e^-2 + 1, 2 - e^-2])."""
    t = lambda *values: torch.tensor(values, dtype=torch.float64)  # noqa: E731
    top, total, out = online_softmax_merge(t(1.0), t(2.0), t([3.0, -1.0]), t(3.0), t(1.0), t([1.0, 2.0]))
    e = math.exp(-2)
    assert top.item() == 3.0
    assert abs(total.item() - (2 * e + 1)) < 1e-15
    torch.testing.assert_close(out, t([3 * e + 1, 2 - e]), atol=1e-15, rtol=0)


# --- tiled attention (Dao et al. 2022), against PyTorch


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("block_size", [1, 7, 64, 300, 512])
def test_tiled_attention_equals_sdpa(device, dtype, block_size, no_tf32):
    """C4: equal to F.scaled_dot_product_attention, 1e-12 in float64 and 1e-6 in float32 (1e-5 on a GPU),
    for block sizes that divide k_len and that do not."""
    query, key = randn(2, 4, 37, 16, seed=10, device=device, dtype=dtype), randn(2, 4, 300, 16, seed=11)
    key, value = key.to(device, dtype), randn(2, 4, 300, 8, seed=12, device=device, dtype=dtype)
    expected = F.scaled_dot_product_attention(query, key, value)
    actual = tiled_attention(query, key, value, block_size)
    atol = ATOL[dtype] if device == "cpu" or dtype == torch.float64 else 1e-5
    assert actual.dtype == dtype and actual.device.type == device
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_tiled_attention_with_masks_equals_sdpa(dtype):
    """C4 with boolean masks of several broadcastable shapes, every query allowed a key."""
    query, key, value = (randn(2, 3, n, d, seed=20 + n, dtype=dtype) for n, d in ((9, 8), (50, 8), (50, 5)))
    generator = seeded_generator(23)
    for shape in ((2, 3, 9, 50), (9, 50), (2, 1, 1, 50)):
        mask = torch.rand(*shape, generator=generator) > 0.5
        mask[..., 0] = True
        expected = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
        torch.testing.assert_close(
            tiled_attention(query, key, value, 16, mask), expected, atol=ATOL[dtype], rtol=0
        )


def test_padding_keys_a_hundred_times_larger_change_nothing():
    """C6: appending padding keys and values (x100, masked) leaves the outputs unchanged, 1e-6 in float32."""
    query, key, value = (
        randn(2, n, d, seed=30 + n, dtype=torch.float32) for n, d in ((6, 16), (20, 16), (20, 8))
    )
    noise_key, noise_value = (100 * randn(2, 6, d, seed=40 + d, dtype=torch.float32) for d in (16, 8))
    mask = torch.arange(26) < 20
    padded = tiled_attention(
        query, torch.cat((key, noise_key), 1), torch.cat((value, noise_value), 1), 8, mask
    )
    torch.testing.assert_close(padded, tiled_attention(query, key, value, 8), atol=1e-6, rtol=0)
    torch.testing.assert_close(padded, F.scaled_dot_product_attention(query, key, value), atol=1e-6, rtol=0)


def test_a_query_with_no_key_gets_zeros():
    """Chapter 3's rule, on rows that a causal mask and a closed row leave empty; the other rows equal
    masked_attention's. SDPA's own empty rows depend on its backend, so they are not the reference here."""
    query, key, value = randn(2, 6, 16, seed=50), randn(2, 26, 16, seed=51), randn(2, 26, 8, seed=52)
    mask = torch.ones(6, 26, dtype=torch.bool).tril(20)
    mask[2] = False
    mask[4, :17] = False  # the first two blocks of 8 keys closed to query 4, later ones open
    actual = tiled_attention(query, key, value, 8, mask)
    assert torch.isfinite(actual).all() and (actual[:, 2] == 0).all()
    torch.testing.assert_close(actual, masked_attention(query, key, value, mask)[0], atol=1e-12, rtol=0)


# --- memory


def test_the_tracker_counts_allocations_not_views():
    """AllocationTracker: a new tensor counts its bytes, a view or an in-place result nothing; freed memory
    leaves the live count and stays in the peak."""
    x = torch.zeros(1000)
    with AllocationTracker() as tracker:
        y = x * 2  # 4000 bytes
        y.add_(1)  # in place
        view = y.view(10, 100).transpose(0, 1)  # views
        z = torch.ones(500, dtype=torch.float64)  # 4000 bytes
        assert tracker.live == 8000
        del y, view
        assert tracker.live == 4000
    assert tracker.peak == 8000 and z.numel() == 500
    assert tracker.largest.elements == 1000 and tracker.largest_floating.shape == (1000,)


@pytest.mark.parametrize("form", ["plain", "tiled"])
def test_memory_grows_as_n_squared_and_as_n(form):
    """The chapter's figure: doubling n from 1024 to 4096 quadruples the plain form's peak and doubles the
    tiled form's; the largest tensor is the n x n scores, or one block of scores [n, 128]."""
    peaks = {}
    for n in (1024, 2048, 4096):
        query, key, value = (randn(1, 1, n, 64, seed=60 + i, dtype=torch.float32) for i in range(3))
        with AllocationTracker() as tracker:
            if form == "plain":
                masked_attention(query, key, value, None)
            else:
                tiled_attention(query, key, value, 128)
        peaks[n] = tracker.peak
        assert tracker.largest.elements == (n * n if form == "plain" else n * 128)
    low, high = (3.5, 4.5) if form == "plain" else (1.8, 2.2)
    for n in (2048, 4096):
        assert low < peaks[n] / peaks[n // 2] < high, peaks


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_peak_memory_on_cuda_is_max_memory_allocated():
    """On CUDA, peak_memory reads torch.cuda.max_memory_allocated: the plain form's peak holds the n x n
    scores and weights, the tiled form's stays below a tenth of it at n = 4096."""
    query, key, value = (
        randn(1, 1, 4096, 64, seed=70 + i, device="cuda", dtype=torch.float32) for i in range(3)
    )
    _, plain, how = peak_memory(lambda q, k, v: masked_attention(q, k, v, None), query, key, value)
    _, tiled, _ = peak_memory(tiled_attention, query, key, value, 128)
    assert how == "torch.cuda.max_memory_allocated"
    assert plain >= 2 * 4096 * 4096 * 4 and tiled < plain / 10


# --- memory traffic (Dao et al. 2022, Theorem 2)


def test_traffic_of_algorithm_0_and_1_worked_out_by_hand():
    """n = 1024, d = 64, M = 51200: algorithm 0 moves 4nd + 4n^2 = 4,456,448 numbers; algorithm 1 takes
    B_c = ceil(51200 / 256) = 200 keys a block, T_c = 6 blocks, 3nd + 2n + 6 n (3d + 4) = 1,402,880."""
    assert standard_attention_traffic(1024, 64).total == 4_456_448
    assert flash_attention_traffic(1024, 64, 51200).total == 1_402_880
    with pytest.raises(ValueError, match="Theorem 2"):
        flash_attention_traffic(1024, 64, 32)


def test_theorem_2_orders():
    """Standard attention's accesses are Theta(n d + n^2), FlashAttention's Theta(n^2 d^2 / M): over n, d and
    M (d <= M <= n d) their ratios to these orders are 4, and between 12 and 16 (12 n^2 d^2 / M plus lower
    terms); the ratio of the two tends to M / (3 d^2)."""
    for n in (1024, 4096, 16384):
        for d in (32, 64, 128):
            for sram in (16384, 65536, 131072):
                if sram > n * d:
                    continue
                standard = standard_attention_traffic(n, d).total / (n * d + n * n)
                flash = flash_attention_traffic(n, d, sram).total / (n * n * d * d / sram)
                assert standard == 4 and 12 <= flash <= 16
    ratio = standard_attention_traffic(65536, 64).total / flash_attention_traffic(65536, 64, 65536).total
    assert abs(ratio - 65536 / (3 * 64**2)) / ratio < 0.03
