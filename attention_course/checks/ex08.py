"""Checks of exercise ex08: sinusoidal encodings, rotary embeddings (both conventions) and ALiBi.

Visible parts compare with the formulas written out here (float64) and with values computed by hand; hidden
parts, with the reference on more sizes and dtypes. RoPE is checked on a ``d = 4`` case whose every number is
written out (``cos 1``, ``sin 0.1``, ...): properties such as "norms are preserved" or "scores depend on
``m - n``" hold for both pairings and for a rotation in the wrong direction, so only values tell them apart.

The functions that make a tensor from sizes take ``dtype`` and ``device``, checked as
:mod:`~attention_course.checks.position_family` checks them: the dtype by name, the device on ``meta`` (a
device of shapes without data, so that it needs no GPU). Their known mistakes, as RoPE's, are rows of one
parametrised computation of check code (:func:`sinusoid`, :func:`rope`, :func:`slopes`, :func:`bias`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from attention_course.checks import engine
from attention_course.checks.engine import Call, Check, Part, assert_values, behaviour, fail, randn
from attention_course.checks.position_family import DTYPED, HERE, META, made_check, named, row_mistakes

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
positions truncated: the positions are cast to integers: positions may be floats (0.5, 2.25, ...), and the
    angle is position * theta_i as it is: positions.to(float32) * theta, not positions.long()
rope validation: check the arguments first and raise ValueError(...) with a message: when x.size(-1) is odd,
    and when positions is not [len] or [batch, len] with len = x.size(-2) (look at positions.dim() and
    positions.size(-1))
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
slopes validation: check n_heads first: `if n_heads < 1: raise ValueError(...)` (with no heads there are no
    slopes; 2^(-8h/n) would divide by zero)
slopes wrong: alibi_bias takes its slopes from alibi_slopes(n_heads): fix alibi_slopes first (its test cells
    say what is wrong)
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
tensors used as indices: the positions are used as indices (a table of cos and sin per position): positions
    may be floats (0.5, 2.25, ...): compute the angles as positions * theta
meta tensor | expected device: a tensor is not on the device asked for: create every tensor on the inputs'
    device (device=x.device) or on the device argument (device=device). The check uses 'meta', a device of
    shapes without data, so that it needs no GPU: avoid .item(), .tolist() and Python loops over a tensor's
    values
""")


# The learner's docstrings clause by clause, and the behaviours that check each (tests/test_contracts.py).
CONTRACT = engine.table("""
sinusoidal_encoding max_len: sinusoidal_values; positions 0 .. max_len - 1 (not from 1), max_len = 1 hidden
sinusoidal_encoding d_model: sinusoidal_values; even widths 2 .. 128, pairs (2i, 2i + 1) interleaved
sinusoidal_encoding base: sinusoidal_values; the default 10000, and 50 (visible), 10 and 500000 (hidden)
sinusoidal_encoding dtype: sinusoidal_values; float32 by default, float64 with float64's precision
    (computed in float64), float16 (visible), bfloat16 (hidden)
sinusoidal_encoding device: sinusoidal_values; 'meta' as a torch.device and as a string (no GPU needed),
    the CPU by default; the checks' device, hidden
sinusoidal_encoding returns: sinusoidal_values; [max_len, d_model], no batch axis, of dtype on device
sinusoidal_encoding raises ValueError: sinusoidal_values; d_model odd (7 visible, 1 and 129 hidden)
sinusoidal_encoding computed in float64: sinusoidal_values; a float64 result within float64's tolerance
apply_rope x: rope_half_split, rope_interleaved, rope_batched_positions, rope_dtype_device; [..., len, d]
    with 2, 3 and 4 axes, d from 4 to 64
apply_rope positions: rope_half_split, rope_interleaved, rope_batched_positions; [len] and [batch, len],
    integer and float (float32 visible, float64 hidden, fractional), not 0, 1, 2, ...
apply_rope base: rope_half_split, rope_interleaved; 100 and 500 visible, 10, 1000 and 10000 hidden
apply_rope interleaved: rope_half_split, rope_interleaved, rope_dtype_device; the default False (rotate_half)
    and True (pairs 2i, 2i + 1), in every dtype
apply_rope returns: rope_dtype_device; x's shape, dtype (float32, float16, bfloat16; float64 hidden) and
    device (the checks' device, and 'meta', which needs no GPU), x left unchanged
apply_rope angles in float32: rope_dtype_device; float16 and bfloat16 at positions up to 1999, both
    conventions, positions [len] and [batch, len]; float64 angles for float64 x in the value cells
apply_rope raises ValueError: rope_half_split; d odd, positions [len] or [batch, len] of another len,
    positions of 3 axes
alibi_slopes n_heads: alibi_slopes_power_of_two, alibi_slopes_other_counts; powers of two 1 .. 64, other
    counts 3 .. 24
alibi_slopes dtype: alibi_slopes_power_of_two; float32 by default, float64, float16 (visible), bfloat16
    (hidden)
alibi_slopes device: alibi_slopes_power_of_two; 'meta' as a torch.device and as a string, the CPU by default
alibi_slopes returns: alibi_slopes_power_of_two, alibi_slopes_other_counts; a tensor [n_heads] (not a list,
    no broadcasting axes) of dtype on device
alibi_slopes raises ValueError: alibi_slopes_power_of_two; n_heads = 0 (visible), -1 and -8 (hidden)
alibi_bias n_heads: alibi_bias_square, alibi_bias_bottom_right; slopes of alibi_slopes(n_heads), named
    first when they are wrong, 1 .. 16 heads
alibi_bias q_len: alibi_bias_square, alibi_bias_bottom_right; q_len = k_len and q_len < k_len (bottom-right)
alibi_bias k_len: alibi_bias_square, alibi_bias_bottom_right; the keys' positions 0 .. k_len - 1
alibi_bias dtype: alibi_bias_square; float32 by default, float64, bfloat16 and float16 hidden
alibi_bias device: alibi_bias_square; 'meta' as a torch.device and as a string, the CPU by default
alibi_bias returns: alibi_bias_square, alibi_bias_bottom_right; [n_heads, q_len, k_len], no batch axis
alibi_bias later keys: alibi_bias_square; positive slope * (j - i) for keys after the query, not 0
""")


engine.meta_ready_in_a_notebook()  # the set-up cell imports the checks: no test cell waits for it


# --- 1. sinusoidal encodings


def sinusoid(max_len: int, d_model: int, row: str = "", base: float = 10000.0) -> torch.Tensor:
    """The encodings as a row computes them, in float64 (check code; ``row`` names a mistake in TEXT)."""
    base = 10000.0 if row == "base ignored" else base
    positions = torch.arange(max_len, dtype=torch.float64).unsqueeze(1) + (row == "from one")
    pair = torch.arange(0, d_model, 2, dtype=torch.float64)  # 2i
    exponent = {"double exponent": 2 * pair}.get(row, pair) / d_model
    angles = positions / base**exponent  # [max_len, d_model / 2]
    if row == "base multiplied":
        angles = positions * base**exponent
    first, second = angles.sin(), angles.cos()
    if row == "feature exponent":  # feature k's exponent is k / d_model: the cosines' are (2i + 1) / d_model
        second = (positions / base ** ((pair + 1) / d_model)).cos()
    if row == "cos sin swapped":
        first, second = angles.cos(), angles.sin()
    if row == "halves":
        return torch.cat((first, second), dim=-1)
    return torch.stack((first, second), dim=-1).flatten(1)


SINUSOID_ROWS = ("cos sin swapped", "halves", "feature exponent", "double exponent", "base multiplied")
SINUSOID_ROWS += ("from one",)
# the cases of the documented arguments, besides the sizes: base, dtype (by name) and device; "meta" results
# have a shape, a dtype and a device but no values
SINUSOID_OPTIONS = {
    False: (
        {"max_len": 10, "d_model": 6, "base": 50.0},
        {"max_len": 40, "d_model": 16, "dtype": "torch.float64"},
        {"max_len": 9, "d_model": 4, "dtype": "torch.float16"},
        {"max_len": 5, "d_model": 8, "device": META},
        {"max_len": 3, "d_model": 4, "dtype": "torch.float64", "device": "meta"},
    ),
    True: (
        {"max_len": 20, "d_model": 10, "base": 10.0},
        {"max_len": 50, "d_model": 32, "base": 500000.0, "dtype": "torch.float64"},
        {"max_len": 64, "d_model": 6, "dtype": "torch.bfloat16"},
        {"max_len": 7, "d_model": 64, "dtype": "torch.float64"},
        {"max_len": 6, "d_model": 4, "dtype": "torch.float64", "device": "cpu"},
        {"max_len": 4, "d_model": 2, "device": "meta"},
        {"max_len": 2, "d_model": 12, "dtype": "torch.bfloat16", "device": META},
        {"max_len": 5, "d_model": 6, "device": HERE},
    ),
}


@behaviour(function="sinusoidal_encoding", points=2, hints=HINTS, driver=DTYPED)
def sinusoidal_values(part: Part) -> Iterator[Check]:
    """sinusoidal_encoding(max_len, d_model) is [max_len, d_model] with PE[pos, 2i] = sin(pos / 10000^(2i /
    d_model)) and PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model)).

    Also with another ``base``; the result in ``dtype`` (float32 by default), computed in float64 (a float64
    result has float64's precision), on ``device`` (checked on ``meta``); ``ValueError`` for an odd
    ``d_model``.
    """
    sizes = ((12, 8), (40, 16)) if not part.hidden else ((1, 2), (64, 6), (30, 128), (7, 64))
    for arguments in named(("max_len", "d_model"), (*sizes, *SINUSOID_OPTIONS[part.hidden])):
        max_len, d_model = arguments["max_len"], arguments["d_model"]
        rows = (
            (*SINUSOID_ROWS, "base ignored") if arguments.get("base", 10000.0) != 10000.0 else SINUSOID_ROWS
        )
        hints = engine.shapes(TEXT, "encoding", max_len=max_len, d_model=d_model)
        yield made_check(part, arguments, (max_len, d_model), hints, sinusoid, rows, TEXT)
    for d_model in (7,) if not part.hidden else (1, 129):
        yield engine.raises(part.call(max_len=4, d_model=d_model), "ValueError", "if d_model is odd")


# --- 2. RoPE


def rope(
    x: torch.Tensor, positions: torch.Tensor, base: float, interleaved: bool, row: str = ""
) -> torch.Tensor:
    """RoPE as a row computes it, in float64 on the CPU (check code, written apart from the reference)."""
    x, positions = x.detach().double().cpu(), positions.cpu()
    d = x.size(-1)
    if row == "positions ignored":
        positions = torch.arange(x.size(-2)).expand_as(positions)
    if row == "positions truncated":
        positions = positions.trunc()
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


ROPE_ROWS = ("reversed", "repeat mixed", "cat mixed", "rope exponent", "rope base multiplied", "base ignored")
ROPE_ROWS += ("positions ignored",)


def by_hand(interleaved: bool) -> torch.Tensor:
    """RoPE of x = (1, 2, 3, 4) at position 1 with base 100 (theta = 1, 0.1), every number written out."""
    c1, s1, c2, s2 = math.cos(1.0), math.sin(1.0), math.cos(0.1), math.sin(0.1)
    if interleaved:  # pairs (1, 2) by angle 1 and (3, 4) by angle 0.1
        values = [1 * c1 - 2 * s1, 1 * s1 + 2 * c1, 3 * c2 - 4 * s2, 3 * s2 + 4 * c2]
    else:  # pairs (1, 3) by angle 1 and (2, 4) by angle 0.1
        values = [1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 3 * c1 + 1 * s1, 4 * c2 + 2 * s2]
    return torch.tensor(values, dtype=torch.float64).view(1, 1, 4)


def _rope_check(part: Part, x, positions, base: float, interleaved: bool, expected=None, label="") -> Check:
    """apply_rope(x [..., len, d], positions [len] or [batch, len], base, interleaved) against ``expected``
    (default: the reference, hidden, or :func:`rope`), in x's dtype."""
    arguments = {"x": x, "positions": positions, "base": base} | (
        {"interleaved": True} if interleaved else {}
    )
    call = part.call(label, **arguments)
    if expected is None:
        answer = part.reference if part.hidden else rope
        expected = answer(x.double() if part.hidden else x, positions, base, interleaved)
    rows = [r for r in ROPE_ROWS if not (r == "base ignored" and base == 10000.0)]
    rows.append("half for interleaved" if interleaved else "interleaved for half")
    rows += ["positions truncated"] if positions.is_floating_point() else []

    def judge(result: Any) -> None:
        mistakes = row_mistakes(TEXT, rows, lambda row: rope(x, positions, base, interleaved, row))
        assert_values(result, expected, f"the result of {call}", dtype=x.dtype, mistakes=mistakes)

    return Check(call, judge, untouched=True)


def _rope_checks(part: Part, cases, interleaved: bool, seed: int, hand: bool = False) -> Iterator[Check]:
    """A check of each ``(x's shape, positions, base)`` of ``cases``, x drawn from ``seed`` on; first, with
    ``hand``, the case :func:`by_hand`."""
    if hand:
        x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]], dtype=torch.float64, device=part.device)  # [1, 1, d = 4]
        one = torch.tensor([1], device=part.device)
        yield _rope_check(part, x, one, 100.0, interleaved, by_hand(interleaved), "worked out by hand")
    for index, (shape, positions, base) in enumerate(cases):
        x = randn(shape, seed=seed + index, device=part.device)
        yield _rope_check(part, x, torch.as_tensor(positions, device=part.device), base, interleaved)


# (x's shape, positions, base): x of 4, 3 and 2 axes ([..., len, d]); integer positions, and float ones
# (float32, float64)
ROPE_CASES = {
    False: (
        ((2, 3, 5, 8), [0, 3, 1, 7, 2], 10000.0),
        ((2, 6, 4), [4, 5, 6, 7, 8, 9], 500.0),
        ((4, 6), [2, 0, 5, 1], 100.0),
        ((2, 5, 6), [0.5, 1.25, 2.0, 7.75, 3.5], 10000.0),
    ),
    True: (
        ((3, 2, 7, 16), [5, 0, 2, 9, 1, 3, 30], 10000.0),
        ((1, 4, 3, 64), [100, 101, 102], 10000.0),
        ((5, 6), [0, 1, 2, 3, 4], 10.0),
        ((2, 2, 9, 10), list(range(9)), 1000.0),
        ((3, 4, 8), torch.tensor([0.25, 10.5, 100.75, 3.0], dtype=torch.float64), 1000.0),
    ),
}
# (x's shape, positions [batch, len], base) of rope_batched_positions
BATCHED_CASES = {
    False: (
        ((2, 3, 5, 8), [[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]], 10000.0),
        ((2, 4, 6), [[2, 3, 4, 5], [0, 0, 1, 2]], 10000.0),
    ),
    True: (
        ((3, 2, 4, 16), [[0, 1, 2, 3], [7, 8, 9, 10], [0, 0, 0, 1]], 10000.0),
        ((1, 5, 3, 8), [[40, 41, 42]], 10000.0),
        ((4, 2, 6), [[0, 1], [1, 2], [5, 6], [9, 3]], 10000.0),
    ),
}


@behaviour(function="apply_rope", points=2, hints=HINTS)
def rope_half_split(part: Part) -> Iterator[Check]:
    """By default (interleaved=False) apply_rope rotates each pair (x[i], x[i + d/2]) by the angle position *
    theta_i, theta_i = base^(-2i/d): Hugging Face's rotate_half convention.

    Also the documented errors: ``ValueError`` for an odd ``d`` and for positions that are not ``[len]`` or
    ``[batch, len]`` for ``x``'s ``len``.
    """
    yield from _rope_checks(part, ROPE_CASES[part.hidden], interleaved=False, seed=40, hand=True)
    for shape, positions, condition in ROPE_ERRORS[part.hidden]:
        x = randn(shape, seed=90, device=part.device)
        call = part.call(x=x, positions=positions.to(part.device))
        yield engine.raises(call, "ValueError", condition, TEXT["rope validation"])


@behaviour(function="apply_rope", points=1, hints=HINTS)
def rope_interleaved(part: Part) -> Iterator[Check]:
    """With interleaved=True apply_rope rotates the pairs (x[2i], x[2i + 1]), as in the RoFormer paper."""
    yield from _rope_checks(part, ROPE_CASES[part.hidden], interleaved=True, seed=40, hand=True)


@behaviour(function="apply_rope", points=1, hints=HINTS)
def rope_batched_positions(part: Part) -> Iterator[Check]:
    """Positions [batch, len] give each sequence its own positions, for x [batch, n_heads, len, d] and [batch,
    len, d] (rotate_half convention)."""
    yield from _rope_checks(part, BATCHED_CASES[part.hidden], interleaved=False, seed=60)


# (x's shape, positions, the condition) of the documented ValueErrors
ROPE_ERRORS = {
    False: (
        ((2, 5, 7), torch.arange(5), "if d (x.size(-1) = 7) is odd"),
        ((2, 5, 6), torch.arange(6), "if positions [6] does not have x's len = 5"),
        ((2, 3, 5, 6), torch.arange(12).view(2, 6), "if positions [2, 6] does not have x's len = 5"),
        ((2, 5, 6), torch.arange(5).view(1, 1, 5), "if positions is neither [len] nor [batch, len]"),
    ),
    True: (
        ((3, 2, 4, 5), torch.arange(4), "if d (x.size(-1) = 5) is odd"),
        ((3, 4, 8), torch.arange(3), "if positions [3] does not have x's len = 4"),
        ((2, 3, 5, 8), torch.arange(8).view(2, 4), "if positions [2, 4] does not have x's len = 5"),
        ((2, 3, 5, 8), torch.arange(10).view(2, 1, 5), "if positions is neither [len] nor [batch, len]"),
    ),
}


# positions of the half-precision cases: angles computed in float16 or bfloat16 are far off there, while
# float32 angles, from either 1 / base^(2i/d) or base^(-2i/d), stay within the result's own rounding. The
# float32 case comes first, so that a mistake of another kind fails without the note on half precision
HALF_POSITIONS = (0, 3, 77, 333, 1234, 1999)
HALF = (torch.float16, torch.bfloat16)
HALF_NOTE = (
    "In float16 and bfloat16 too, compute the angles in float32 and cast the result back: an angle near 200 "
    "is a multiple of 0.125 in float16, and of 1 in bfloat16."
)


# (dtype, positions [len] or [batch, len], interleaved, device) of rope_dtype_device: each half dtype with
# each convention and each form of positions, so that angles computed in half precision on one path show; then
# cases on 'meta', where only the result's shape, dtype and device are known: x's device must be the result's
# without a GPU too
DTYPE_CASES = {
    False: (
        (torch.float32, torch.arange(6), False, HERE),
        (torch.float16, torch.tensor(HALF_POSITIONS), False, HERE),
        (torch.bfloat16, torch.tensor(HALF_POSITIONS), True, HERE),
        (torch.float16, torch.tensor((HALF_POSITIONS, HALF_POSITIONS[::-1])), True, HERE),
        (torch.bfloat16, torch.tensor((HALF_POSITIONS[::-1], HALF_POSITIONS)), False, HERE),
        (torch.float32, torch.arange(5), False, META),
        (torch.bfloat16, torch.arange(5).repeat(2, 1), True, META),
    ),
    True: (
        (torch.float32, torch.arange(6), True, HERE),
        (torch.bfloat16, torch.tensor(HALF_POSITIONS), False, HERE),
        (torch.float16, torch.tensor(HALF_POSITIONS), True, HERE),
        (torch.float64, torch.tensor((2, 4, 999, 1999, 3, 7)), False, HERE),
        (torch.bfloat16, torch.tensor((HALF_POSITIONS, (5, 1998, 1500, 7, 900, 64))), True, HERE),
        (torch.float16, torch.arange(5), True, META),
        (torch.float64, torch.arange(5).repeat(2, 1), False, META),
    ),
}


@behaviour(function="apply_rope", points=1, hints=HINTS, driver=DTYPED)
def rope_dtype_device(part: Part) -> Iterator[Check]:
    """apply_rope returns a tensor of x's shape, dtype and device (float32, float16, bfloat16), rotated with
    the tolerance of that dtype; in float16 and bfloat16 at positions up to 2000, which need angles computed
    in float32.

    Both conventions, positions ``[len]`` and ``[batch, len]``: a path that computes its angles in half
    precision shows at large positions only. The device is also checked on ``meta``, which needs no GPU.
    """
    engine.meta_ready()
    for index, (dtype, positions, interleaved, device) in enumerate(DTYPE_CASES[part.hidden]):
        device = part.device if device is HERE else device
        x = randn((2, 3, positions.size(-1), 8), seed=80 + index, device=device, dtype=dtype)
        arguments = {"x": x, "positions": positions.to(device)} | (
            {"interleaved": True} if interleaved else {}
        )
        call = part.call(**arguments)
        expected = None if device == META else rope(x, positions, 10000.0, interleaved)

        def judge(
            result: Any, call=call, x=x, expected=expected, note=HALF_NOTE if dtype in HALF else ""
        ) -> None:
            engine.assert_format(result, f"the result of {call}", x.shape, x.dtype, x.device)
            if expected is not None:
                assert_values(result, expected, f"the result of {call}", dtype=x.dtype, note=note)

        yield Check(call, judge, untouched=True)


# --- 3. ALiBi


def slopes(n_heads: int, row: str = "") -> torch.Tensor:
    """ALiBi's slopes as a row computes them, float64 (check code)."""
    start = 0 if row == "slopes from zero" else 1

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(start, n + start)]

    power = 1 << (n_heads.bit_length() - 1)  # the largest power of two up to n_heads
    extra = geometric(2 * power)[:: 1 if row == "slopes first extra" else 2][: n_heads - power]
    seed = [2.0 ** (-8 - i) for i in range(n_heads)]
    values = {"slopes seed": seed, "slopes geometric": geometric(n_heads)}.get(row, geometric(power) + extra)
    return torch.tensor(values[::-1] if row == "slopes reversed" else values, dtype=torch.float64)


SLOPE_ROWS = ("slopes seed", "slopes from zero", "slopes geometric", "slopes first extra", "slopes reversed")
# the slopes of a few head counts, written out: exponents of 2
WRITTEN = {
    8: [-1, -2, -3, -4, -5, -6, -7, -8],
    4: [-2, -4, -6, -8],
    6: [-2, -4, -6, -8, -1, -3],
    12: [-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5],
    16: [-h / 2 for h in range(1, 17)],
    2: [-4, -8],
}


def _a_tensor(result: Any, call: Call) -> None:
    """Fail if the slopes are a list or a tuple: they must be made a tensor."""
    if isinstance(result, list | tuple):
        n_heads = call.arguments["n_heads"]
        fail(
            f"{call} returned a {type(result).__name__}, expected a tensor [{n_heads}].",
            "torch.tensor(slopes)",
        )


def _slopes_check(part: Part, arguments: dict[str, Any], formats: bool = True) -> Check:
    """The slopes of ``n_heads`` heads; with ``formats``, their dtype and device too."""
    n_heads = arguments["n_heads"]
    written = lambda n_heads: torch.tensor([2.0**e for e in WRITTEN[n_heads]], dtype=torch.float64)  # noqa: E731
    hints = engine.shapes(TEXT, "slopes", n_heads=n_heads)
    # dtype promises the result's dtype, not the computation's: float32's tolerance at least
    options = {"written": written, "formats": formats, "dtype": torch.float32, "before": _a_tensor}
    return made_check(part, arguments, (n_heads,), hints, slopes, SLOPE_ROWS, TEXT, **options)


# the calls of alibi_slopes_power_of_two that pass dtype (by name) and device: n_heads a power of two
SLOPE_OPTIONS = {
    False: (
        {"n_heads": 16, "dtype": "torch.float64"},
        {"n_heads": 8, "dtype": "torch.float16"},
        {"n_heads": 4, "device": META},
        {"n_heads": 2, "dtype": "torch.float64", "device": "meta"},
    ),
    True: (
        {"n_heads": 32, "dtype": "torch.float64", "device": "cpu"},
        {"n_heads": 2, "dtype": "torch.bfloat16"},
        {"n_heads": 16, "device": "meta"},
        {"n_heads": 1, "dtype": "torch.float64", "device": META},
        {"n_heads": 8, "dtype": "torch.float64", "device": HERE},
    ),
}


@behaviour(function="alibi_slopes", points=1, hints=HINTS, driver=DTYPED)
def alibi_slopes_power_of_two(part: Part) -> Iterator[Check]:
    """For n_heads a power of two the slopes are 2^(-8h/n_heads), h = 1 .. n_heads: 2^-1 ... 2^-8 for 8
    heads.

    Also the documented arguments and error: the result in ``dtype`` (float32 by default) on ``device``
    (checked on ``meta``), ``ValueError`` if ``n_heads < 1``.
    """
    counts = ((8,), (4,)) if not part.hidden else ((1,), (2,), (16,), (32,), (64,))
    for arguments in named(("n_heads",), (*counts, *SLOPE_OPTIONS[part.hidden])):
        yield _slopes_check(part, arguments)
    for n_heads in (0,) if not part.hidden else (-1, -8):
        yield engine.raises(
            part.call(n_heads=n_heads), "ValueError", "if n_heads < 1", TEXT["slopes validation"]
        )


@behaviour(function="alibi_slopes", points=1, hints=HINTS)
def alibi_slopes_other_counts(part: Part) -> Iterator[Check]:
    """For other head counts: the slopes of the largest power of two p below, then every other slope of 2p
    heads: 6 heads give 2^-2, 2^-4, 2^-6, 2^-8, 2^-1, 2^-3."""
    for n_heads in (6, 12) if not part.hidden else (3, 5, 7, 10, 20, 24):
        yield _slopes_check(part, {"n_heads": n_heads}, formats=False)


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


def _powers(values: torch.Tensor) -> str:
    """Slopes written as powers of two: ``2^-1, 2^-2, ...`` (the first eight)."""
    shown = [f"2^{math.log2(v):.3g}" if v > 0 else f"{v:.3g}" for v in values.tolist()[:8]]
    return ", ".join(shown) + (", ..." if values.numel() > 8 else "")


def _slopes_first(result: Any, call: Call) -> None:
    """Fail, naming the slopes, if the bias is ``slope'_h * (j - i - (k_len - q_len))`` with other positive
    slopes than ``alibi_slopes(n_heads)``'s: the cause is then in the slopes (the learner's own alibi_slopes,
    which alibi_bias uses), and the distances are right."""
    sizes = n_heads, q_len, k_len = tuple(call.arguments[name] for name in ("n_heads", "q_len", "k_len"))
    if not isinstance(result, torch.Tensor) or tuple(result.shape) != sizes or result.device.type == "meta":
        return
    distance = bias(1, q_len, k_len)[0] / slopes(1)[0]  # j - i - (k_len - q_len)
    if not distance.any() or not result.is_floating_point():
        return
    found = result.detach().cpu().double()
    fitted = (found * distance).sum((-2, -1)) / distance.pow(2).sum()  # least squares, per head
    right, dtype = slopes(n_heads), engine.coarser(torch.float32, result.dtype)
    if not (fitted > 0).all() or engine.close(fitted, right, dtype):
        return
    if not engine.close(found, fitted.view(-1, 1, 1) * distance, dtype):
        return
    fail(
        f"the bias returned by {call} has the right distances, but its slopes (bias[h] / (j - i - (k_len - "
        f"q_len))) are {_powers(fitted)} where {_powers(right)} are expected, the slopes of "
        f"alibi_slopes({n_heads}).",
        engine.diagnose(fitted, row_mistakes(TEXT, SLOPE_ROWS, lambda row: slopes(n_heads, row))(), dtype)
        or TEXT["slopes wrong"],
        expected=_powers(right),
        got=_powers(fitted),
    )


def _bias_checks(part: Part, cases, formats: bool = False) -> Iterator[Check]:
    """Each ``(n_heads, q_len, k_len)`` or ``{...}`` of arguments; with ``formats``, dtype and device too."""
    for arguments in named(("n_heads", "q_len", "k_len"), cases):
        sizes = tuple(arguments[name] for name in ("n_heads", "q_len", "k_len"))
        hints = engine.shapes(TEXT, "bias", n_heads=sizes[0], q_len=sizes[1], k_len=sizes[2])
        options = {"where": "the bias returned by {call}", "formats": formats, "dtype": torch.float32}
        # wrong slopes are named first, where the values are judged
        first = None if arguments.get("device") in (META, "meta") else _slopes_first
        yield made_check(part, arguments, sizes, hints, bias, BIAS_ROWS, TEXT, before=first, **options)


# the calls of alibi_bias_square that pass dtype (by name) and device
BIAS_OPTIONS = {
    False: (
        {"n_heads": 4, "q_len": 3, "k_len": 3, "dtype": "torch.float64"},
        {"n_heads": 2, "q_len": 2, "k_len": 2, "device": META},
        {"n_heads": 8, "q_len": 2, "k_len": 2, "dtype": "torch.float64", "device": "meta"},
    ),
    True: (
        {"n_heads": 6, "q_len": 5, "k_len": 5, "dtype": "torch.float64", "device": "cpu"},
        {"n_heads": 16, "q_len": 4, "k_len": 4, "dtype": "torch.bfloat16"},
        {"n_heads": 12, "q_len": 3, "k_len": 3, "device": "meta"},
        {"n_heads": 3, "q_len": 6, "k_len": 6, "dtype": "torch.float16", "device": META},
        {"n_heads": 4, "q_len": 2, "k_len": 2, "device": HERE},
    ),
}


@behaviour(function="alibi_bias", points=1, hints=HINTS, driver=DTYPED)
def alibi_bias_square(part: Part) -> Iterator[Check]:
    """With q_len = k_len, alibi_bias is [n_heads, q_len, k_len] with bias[h, i, j] = slope_h * (j - i): 0 on
    the diagonal, -slope_h * distance for earlier keys.

    Also the result in ``dtype`` (float32 by default) on ``device`` (checked on ``meta``). Wrong slopes (the
    learner's alibi_slopes) are named before anything else.
    """
    cases = ((4, 5, 5), (8, 3, 3)) if not part.hidden else ((2, 6, 6), (16, 4, 4), (6, 5, 5), (1, 1, 1))
    yield from _bias_checks(part, (*cases, *BIAS_OPTIONS[part.hidden]), formats=True)


@behaviour(function="alibi_bias", points=1, hints=HINTS)
def alibi_bias_bottom_right(part: Part) -> Iterator[Check]:
    """With q_len < k_len query i sits at position i + k_len - q_len: bias[h, i, j] = slope_h * (j - i -
    (k_len - q_len)), as when decoding with a cache."""
    cases = ((4, 2, 6), (8, 1, 5)) if not part.hidden else ((2, 3, 9), (16, 1, 12), (12, 4, 7))
    yield from _bias_checks(part, cases)
