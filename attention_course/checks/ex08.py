"""Checks of exercise ex08: sinusoidal encodings, rotary embeddings (both conventions) and ALiBi.

Visible parts compare with the formulas written out here (float64) and with values computed by hand; hidden
parts, with the reference on more sizes and dtypes. RoPE is checked on a ``d = 4`` case whose every number is
written out (``cos 1``, ``sin 0.1``, ...): properties such as "norms are preserved" or "scores depend on
``m - n``" hold for both pairings and for a rotation in the wrong direction, so only values tell them apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from attention_course.checks import engine
from attention_course.checks.engine import Check, Mistake, Part, assert_values, behaviour, fail, randn

TEXT = engine.table("""
cos sin swapped: sines and cosines are swapped: PE[pos, 2i] = sin, PE[pos, 2i + 1] = cos
halves: the sines fill the first half and the cosines the second (tensor2tensor's layout): the paper's formula
    interleaves them, sin on the even features 2i and cos on the odd 2i + 1
feature exponent: the exponent uses the feature index k / d_model for each feature: pair i (features 2i and
    2i + 1) shares one frequency, 1 / base^(2i / d_model)
double exponent: the exponent is doubled: with i = torch.arange(0, d_model, 2) (already 2i), divide by
    base ** (i / d_model), not base ** (2 * i / d_model)
base multiplied: the position is multiplied by base^(2i / d_model): it is *divided* by it (the wavelengths
    grow with i)
from one: the positions start at 1: they are 0, 1, ..., max_len - 1
interleaved for half: the pairs are (x[2i], x[2i + 1]) (the paper's interleaved convention), but by default
    (interleaved=False) they are (x[i], x[i + d/2]), rotate_half as in GPT-NeoX and Hugging Face
half for interleaved: the pairs are (x[i], x[i + d/2]) (rotate_half) where interleaved=True asks for the
    paper's (x[2i], x[2i + 1])
reversed: the rotation goes the wrong way: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), i.e.
    rotate_half(x) = cat(-x2, x1)
repeat mixed: the angles are repeated pairwise (repeat_interleave, theta_0, theta_0, theta_1, ...) while the
    features are paired by halves: with rotate_half, cos and sin are cat(angles, angles)
cat mixed: the angles are cat(angles, angles) while the features are paired (2i, 2i + 1): with interleaved
    pairs repeat each angle twice (repeat_interleave(2))
rope exponent: each frequency is base^(-i / d) for pair i: it is theta_i = base^(-2i / d)
rope base multiplied: the frequency is base^(2i / d): it is theta_i = base^(-2i / d), less than 1
base ignored: the base argument is ignored (10000 is hard-coded)
positions ignored: the positions argument is ignored (torch.arange(len) instead): the checks pass positions
    that are not 0, 1, 2, ...
slopes seed: the slopes are 2^-(8+i), 2^-8, 2^-9, ...: far too small (for 8 heads each is 128 times too
    small, for 16 heads 181 to 32768 times). Press et al. use 2^(-8h/n), h = 1 .. n (2^-1 ... 2^-8 for 8
    heads)
slopes from zero: h runs from 0: the first slope is 2^0 = 1; the slopes are 2^(-8h/n) for h = 1 .. n
slopes reversed: the slopes are in reverse order: head 1 has the largest, 2^(-8/n)
slopes geometric: 2^(-8h/n) for every n is only the rule for powers of two: for other head counts, take the
    slopes of the largest power of two p below n_heads, then every other slope of 2p heads (2^(-4/p),
    2^(-12/p), ...) until there are n_heads (Press et al.'s code, get_slopes)
slopes first extra: the extra slopes are the first ones of the 2p sequence: take every other one,
    geometric(2p)[0::2], starting at 2^(-4/p)
bias sign: the bias has the wrong sign: earlier keys (j < i) get -slope * (i - j), a penalty
nearest penalised: the bias is -slope * j (m [0, -1, ..., -(i-1)] over keys 0..i): it penalises the nearest
    key most; ALiBi's is slope * (j - i), 0 for the query's own position
authors' m j: the bias is slope * j, the same for every query (the authors' code): equal after a causal
    softmax, but this function returns slope * (j - i - (k_len - q_len)), 0 at each query's own position
later keys zero: the bias of later keys (j > i) is 0: this function returns slope * (j - i) for every key
    (positive for later keys); the causal mask, not the bias, removes them
top-left: the query positions start at 0: query i sits at position i + k_len - q_len (bottom-right, the last
    query is the last key, as chapter 3's causal mask)
symmetric: the bias is -slope * |j - i| (a variant for encoders): for later keys this function returns
    slope * (j - i), positive, which the causal mask removes
encoding max_len d_model 1: an axis too many: return [max_len, d_model] (no batch axis)
encoding 1 max_len d_model: an axis too many: return [max_len, d_model] (no batch axis)
encoding d_model max_len: the axes are swapped: [max_len, d_model], one row per position
slopes n_heads 1 1: return the slopes as a vector [n_heads], without the axes for broadcasting
bias 1 n_heads q_len k_len: return [n_heads, q_len, k_len], without the batch axis
bias n_heads k_len q_len: the bias is transposed: bias[h, i, j] for query i and key j
""")
HINTS = engine.hint_table("""
outer: Expected 1-D: torch.outer takes vectors: for positions [batch, len] multiply with broadcasting,
    positions[..., None] * theta
must match the size of tensor | The size of tensor a: the angles do not line up with x: make them
    [len, d/2] (or [batch, 1, len, d/2] for [batch, len] positions and x [batch, heads, len, d]) and pair the
    features into halves of d/2
list | tuple: return a tensor, not a list: torch.tensor(slopes)
""")


def _shape_hints(kind: str, **sizes: int) -> dict[tuple[int, ...], str]:
    return engine.shapes(TEXT, kind, **sizes)


# --- 1. sinusoidal encodings


def sinusoid(max_len: int, d_model: int, row: str = "") -> torch.Tensor:
    """The encodings as a row computes them, in float64 (check code; ``row`` names a mistake in TEXT)."""
    positions = torch.arange(max_len, dtype=torch.float64).unsqueeze(1) + (row == "from one")
    pair = torch.arange(0, d_model, 2, dtype=torch.float64)  # 2i
    exponent = {"double exponent": 2 * pair}.get(row, pair) / d_model
    angles = positions / 10000.0**exponent  # [max_len, d_model / 2]
    if row == "base multiplied":
        angles = positions * 10000.0**exponent
    first, second = angles.sin(), angles.cos()
    if row == "feature exponent":  # feature k's exponent is k / d_model: the cosines' are (2i + 1) / d_model
        second = (positions / 10000.0 ** ((pair + 1) / d_model)).cos()
    if row == "cos sin swapped":
        first, second = angles.cos(), angles.sin()
    if row == "halves":
        return torch.cat((first, second), dim=-1)
    return torch.stack((first, second), dim=-1).flatten(1)


SINUSOID_ROWS = (
    "cos sin swapped",
    "halves",
    "feature exponent",
    "double exponent",
    "base multiplied",
    "from one",
)


@behaviour(function="sinusoidal_encoding", points=2, hints=HINTS)
def sinusoidal_values(part: Part) -> Iterator[Check]:
    """sinusoidal_encoding(max_len, d_model) is [max_len, d_model] with PE[pos, 2i] = sin(pos / 10000^(2i /
    d_model)) and PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model))."""
    sizes = ((12, 8), (40, 16)) if not part.hidden else ((1, 2), (64, 6), (30, 128), (7, 64))
    for max_len, d_model in sizes:
        call = part.call(max_len=max_len, d_model=d_model)
        expected = (
            part.reference(max_len, d_model, dtype=torch.float64)
            if part.hidden
            else sinusoid(max_len, d_model)
        )

        def judge(result: Any, call=call, expected=expected, sizes=(max_len, d_model)) -> None:
            mistakes = lambda: (Mistake(TEXT[row], sinusoid(*sizes, row)) for row in SINUSOID_ROWS)  # noqa: E731
            hints = _shape_hints("encoding", max_len=sizes[0], d_model=sizes[1])
            assert_values(result, expected, f"the result of {call}", mistakes=mistakes, hints=hints)

        yield Check(call, judge)


# --- 2. RoPE


def rope(
    x: torch.Tensor, positions: torch.Tensor, base: float, interleaved: bool, row: str = ""
) -> torch.Tensor:
    """RoPE as a row computes it, in float64 on the CPU (check code, written apart from the reference)."""
    x, positions = x.detach().double().cpu(), positions.cpu()
    d = x.size(-1)
    if row == "positions ignored":
        positions = torch.arange(x.size(-2)).expand_as(positions)
    if row == "base ignored":
        base = 10000.0
    exponent = torch.arange(d // 2, dtype=torch.float64) * (1 if row == "rope exponent" else 2) / d
    theta = base**exponent if row == "rope base multiplied" else base**-exponent  # [d / 2]
    angles = positions.double().unsqueeze(-1) * theta  # [(batch,) len, d / 2]
    if positions.dim() == 2:
        angles = angles.view(angles.size(0), *([1] * (x.dim() - 3)), *angles.shape[1:])
    pairs = {"interleaved for half": True, "half for interleaved": False}.get(row, interleaved)
    sign = -1.0 if row == "reversed" else 1.0
    if pairs:  # (x[2i], x[2i + 1])
        layout = "cat" if row == "cat mixed" else "repeat"
        x1, x2 = x[..., 0::2], x[..., 1::2]
        swapped = torch.stack((-x2, x1), dim=-1).flatten(-2)  # (-x[2i + 1], x[2i])
    else:  # (x[i], x[i + d/2])
        layout = "repeat" if row == "repeat mixed" else "cat"
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        swapped = torch.cat((-x2, x1), dim=-1)
    spread = {"cat": lambda t: torch.cat((t, t), -1), "repeat": lambda t: t.repeat_interleave(2, -1)}[layout]
    return x * spread(angles.cos()) + sign * swapped * spread(angles.sin())


ROPE_ROWS = (
    "reversed",
    "repeat mixed",
    "cat mixed",
    "rope exponent",
    "rope base multiplied",
    "base ignored",
    "positions ignored",
)


def by_hand(interleaved: bool) -> torch.Tensor:
    """RoPE of x = (1, 2, 3, 4) at position 1 with base 100 (theta = 1, 0.1), every number written out."""
    c1, s1, c2, s2 = math.cos(1.0), math.sin(1.0), math.cos(0.1), math.sin(0.1)
    if interleaved:  # pairs (1, 2) by angle 1 and (3, 4) by angle 0.1
        values = [1 * c1 - 2 * s1, 1 * s1 + 2 * c1, 3 * c2 - 4 * s2, 3 * s2 + 4 * c2]
    else:  # pairs (1, 3) by angle 1 and (2, 4) by angle 0.1
        values = [1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 3 * c1 + 1 * s1, 4 * c2 + 2 * s2]
    return torch.tensor(values, dtype=torch.float64).view(1, 1, 4)


def _rope_check(part: Part, x, positions, base: float, interleaved: bool, expected=None, label="") -> Check:
    arguments = {"x": x, "positions": positions, "base": base}
    if interleaved:
        arguments["interleaved"] = True
    call = part.call(label, **arguments)
    if expected is None:
        if part.hidden:
            expected = part.reference(x.double(), positions, base, interleaved)
        else:
            expected = rope(x, positions, base, interleaved)
    rows = [r for r in ROPE_ROWS if not (r == "base ignored" and base == 10000.0)]
    rows.append("half for interleaved" if interleaved else "interleaved for half")

    def judge(result: Any) -> None:
        mistakes = lambda: (Mistake(TEXT[row], rope(x, positions, base, interleaved, row)) for row in rows)  # noqa: E731
        assert_values(result, expected, f"the result of {call}", dtype=x.dtype, mistakes=mistakes)

    return Check(call, judge, untouched=True)


def _rope_inputs(part: Part, interleaved: bool) -> Iterator[Check]:
    hand = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]], dtype=torch.float64, device=part.device)  # [1, 1, d = 4]
    one = torch.tensor([1], device=part.device)
    yield _rope_check(part, hand, one, 100.0, interleaved, by_hand(interleaved), "worked out by hand")
    cases = [((2, 3, 5, 8), [0, 3, 1, 7, 2], 10000.0), ((2, 6, 4), [4, 5, 6, 7, 8, 9], 500.0)]
    if part.hidden:
        cases = [
            ((3, 2, 7, 16), [5, 0, 2, 9, 1, 3, 30], 10000.0),
            ((1, 4, 3, 64), [100, 101, 102], 10000.0),
            ((5, 6), [0, 1, 2, 3, 4], 10.0),
            ((2, 2, 9, 10), list(range(9)), 1000.0),
        ]
    for index, (shape, positions, base) in enumerate(cases):
        x = randn(shape, seed=40 + index, device=part.device)
        yield _rope_check(part, x, torch.tensor(positions, device=part.device), base, interleaved)


@behaviour(function="apply_rope", points=2, hints=HINTS)
def rope_half_split(part: Part) -> Iterator[Check]:
    """By default (interleaved=False) apply_rope rotates each pair (x[i], x[i + d/2]) by the angle position *
    theta_i, theta_i = base^(-2i/d): Hugging Face's rotate_half convention."""
    yield from _rope_inputs(part, interleaved=False)


@behaviour(function="apply_rope", points=1, hints=HINTS)
def rope_interleaved(part: Part) -> Iterator[Check]:
    """With interleaved=True apply_rope rotates the pairs (x[2i], x[2i + 1]), as in the RoFormer paper."""
    yield from _rope_inputs(part, interleaved=True)


@behaviour(function="apply_rope", points=1, hints=HINTS)
def rope_batched_positions(part: Part) -> Iterator[Check]:
    """Positions [batch, len] give each sequence its own positions, for x [batch, n_heads, len, d] and [batch,
    len, d] (rotate_half convention)."""
    cases = [((2, 3, 5, 8), [[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]]), ((2, 4, 6), [[2, 3, 4, 5], [0, 0, 1, 2]])]
    if part.hidden:
        cases = [
            ((3, 2, 4, 16), [[0, 1, 2, 3], [7, 8, 9, 10], [0, 0, 0, 1]]),
            ((1, 5, 3, 8), [[40, 41, 42]]),
            ((4, 2, 6), [[0, 1], [1, 2], [5, 6], [9, 3]]),
        ]
    for index, (shape, positions) in enumerate(cases):
        x = randn(shape, seed=60 + index, device=part.device)
        yield _rope_check(part, x, torch.tensor(positions, device=part.device), 10000.0, False)


# positions of the half-precision cases: angles computed in float16 or bfloat16 are far off there, while
# float32 angles, from either 1 / base^(2i/d) or base^(-2i/d), stay within the result's own rounding. The
# float32 case comes first, so that a mistake of another kind fails without the note on half precision
HALF_POSITIONS = (0, 3, 77, 333, 1234, 1999)
HALF = (torch.float16, torch.bfloat16)
HALF_NOTE = (
    "In float16 and bfloat16 too, compute the angles in float32 and cast the result back: an angle near 200 "
    "is a multiple of 0.125 in float16, and of 1 in bfloat16."
)


@behaviour(function="apply_rope", points=1, hints=HINTS)
def rope_dtype_device(part: Part) -> Iterator[Check]:
    """apply_rope returns a tensor of x's shape, dtype and device (float32, float16, bfloat16), rotated with
    the tolerance of that dtype; in float16 and bfloat16 at positions up to 2000, which need angles computed
    in float32."""
    dtypes = (
        (torch.float32, torch.float16) if not part.hidden else (torch.float32, torch.bfloat16, torch.float64)
    )
    for index, dtype in enumerate(dtypes):
        x = randn((2, 3, 6, 8), seed=80 + index, device=part.device, dtype=dtype)
        positions = torch.tensor(HALF_POSITIONS) if dtype in HALF else torch.arange(6)
        positions = positions.to(part.device)
        call = part.call(x=x, positions=positions)
        expected = rope(x, positions.cpu(), 10000.0, False)
        note = HALF_NOTE if dtype in HALF else ""

        def judge(result: Any, call=call, x=x, expected=expected, note=note) -> None:
            where = f"the result of {call}"
            engine.assert_format(result, where, x.shape, x.dtype, x.device)
            assert_values(result, expected, where, dtype=x.dtype, note=note)

        yield Check(call, judge, untouched=True)


# --- 3. ALiBi


def slopes(n_heads: int, row: str = "") -> torch.Tensor:
    """ALiBi's slopes as a row computes them, float64 (check code)."""

    start = 0 if row == "slopes from zero" else 1

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(start, n + start)]

    if row == "slopes seed":
        values = [2.0 ** (-8 - i) for i in range(n_heads)]
    elif row == "slopes geometric":
        values = geometric(n_heads)
    else:
        power = 1 << (n_heads.bit_length() - 1)
        extra = geometric(2 * power)
        extra = extra[: n_heads - power] if row == "slopes first extra" else extra[0::2][: n_heads - power]
        values = geometric(power) + extra
        if row == "slopes reversed":
            values = values[::-1]
    return torch.tensor(values, dtype=torch.float64)


SLOPE_ROWS = ("slopes seed", "slopes from zero", "slopes geometric", "slopes first extra", "slopes reversed")
# the slopes of a few head counts, written out: exponents of 2
WRITTEN = {
    8: [-1, -2, -3, -4, -5, -6, -7, -8],
    4: [-2, -4, -6, -8],
    6: [-2, -4, -6, -8, -1, -3],
    12: [-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5],
}


def _slopes_check(part: Part, n_heads: int) -> Check:
    call = part.call(n_heads=n_heads)
    if part.hidden:
        expected = part.reference(n_heads, dtype=torch.float64)
    else:
        expected = torch.tensor([2.0**e for e in WRITTEN[n_heads]], dtype=torch.float64)

    def judge(result: Any) -> None:
        if isinstance(result, list | tuple):
            fail(
                f"{call} returned a {type(result).__name__}, expected a tensor [{n_heads}].",
                "torch.tensor(slopes)",
            )
        rows = [row for row in SLOPE_ROWS if not torch.equal(slopes(n_heads, row), expected)]
        mistakes = lambda: (Mistake(TEXT[row], slopes(n_heads, row)) for row in rows)  # noqa: E731
        hints = _shape_hints("slopes", n_heads=n_heads)
        assert_values(result, expected, f"the result of {call}", mistakes=mistakes, hints=hints)

    return Check(call, judge)


@behaviour(function="alibi_slopes", points=1, hints=HINTS)
def alibi_slopes_power_of_two(part: Part) -> Iterator[Check]:
    """For n_heads a power of two the slopes are 2^(-8h/n_heads), h = 1 .. n_heads: 2^-1 ... 2^-8 for 8
    heads."""
    for n_heads in (8, 4) if not part.hidden else (1, 2, 16, 32, 64):
        yield _slopes_check(part, n_heads)


@behaviour(function="alibi_slopes", points=1, hints=HINTS)
def alibi_slopes_other_counts(part: Part) -> Iterator[Check]:
    """For other head counts: the slopes of the largest power of two p below, then every other slope of 2p
    heads: 6 heads give 2^-2, 2^-4, 2^-6, 2^-8, 2^-1, 2^-3."""
    for n_heads in (6, 12) if not part.hidden else (3, 5, 7, 10, 20, 24):
        yield _slopes_check(part, n_heads)


def bias(n_heads: int, q_len: int, k_len: int, row: str = "") -> torch.Tensor:
    """ALiBi's bias as a row computes it, ``[n_heads, q_len, k_len]``, float64 (check code)."""
    keys = torch.arange(k_len, dtype=torch.float64)
    queries = torch.arange(q_len, dtype=torch.float64) + (0 if row == "top-left" else k_len - q_len)
    distance = keys - queries.unsqueeze(1)  # j - i
    distance = {
        "bias sign": -distance,
        "nearest penalised": -keys.expand(q_len, k_len),
        "authors' m j": keys.expand(q_len, k_len),
        "symmetric": -distance.abs(),
        "later keys zero": distance.clamp(max=0),
    }.get(row, distance)
    return slopes(n_heads).view(-1, 1, 1) * distance


BIAS_ROWS = ("bias sign", "nearest penalised", "authors' m j", "symmetric", "later keys zero", "top-left")


def _bias_checks(part: Part, cases) -> Iterator[Check]:
    for n_heads, q_len, k_len in cases:
        call = part.call(n_heads=n_heads, q_len=q_len, k_len=k_len)
        if part.hidden:
            expected = part.reference(n_heads, q_len, k_len, dtype=torch.float64)
        else:
            expected = bias(n_heads, q_len, k_len)

        def judge(result: Any, call=call, expected=expected, sizes=(n_heads, q_len, k_len)) -> None:
            rows = [row for row in BIAS_ROWS if not torch.equal(bias(*sizes, row), expected)]
            mistakes = lambda: (Mistake(TEXT[row], bias(*sizes, row)) for row in rows)  # noqa: E731
            hints = _shape_hints("bias", n_heads=sizes[0], q_len=sizes[1], k_len=sizes[2])
            assert_values(result, expected, f"the bias returned by {call}", mistakes=mistakes, hints=hints)

        yield Check(call, judge)


@behaviour(function="alibi_bias", points=1, hints=HINTS)
def alibi_bias_square(part: Part) -> Iterator[Check]:
    """With q_len = k_len, alibi_bias is [n_heads, q_len, k_len] with bias[h, i, j] = slope_h * (j - i): 0 on
    the diagonal, -slope_h * distance for earlier keys."""
    cases = ((4, 5, 5), (8, 3, 3)) if not part.hidden else ((2, 6, 6), (16, 4, 4), (6, 5, 5), (1, 1, 1))
    yield from _bias_checks(part, cases)


@behaviour(function="alibi_bias", points=1, hints=HINTS)
def alibi_bias_bottom_right(part: Part) -> Iterator[Check]:
    """With q_len < k_len query i sits at position i + k_len - q_len: bias[h, i, j] = slope_h * (j - i -
    (k_len - q_len)), as when decoding with a cache."""
    cases = ((4, 2, 6), (8, 1, 5)) if not part.hidden else ((2, 3, 9), (16, 1, 12), (12, 4, 7))
    yield from _bias_checks(part, cases)
