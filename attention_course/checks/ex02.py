"""Checks of exercise ex02: a stable softmax, scaled dot-product attention, and the variance of q . k.

Visible parts use properties, known answers and PyTorch's built-ins; hidden parts test the same behaviour
on more inputs (every axis a different size, the dtypes the cell is about) against the reference. Dtype,
device and in-place edits are judged only by the cells that name them.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch

from attention_course.checks import attention_family as family
from attention_course.checks.attention_family import DTYPES, HIDDEN_SIZES, Sizes
from attention_course.checks.engine import (
    Call,
    Check,
    FromScratch,
    Mistake,
    Part,
    Seeded,
    assert_format,
    assert_values,
    behaviour,
    correct_first,
    describe,
    fail,
    hint_table,
    raises,
    randn,
    table,
    type_name,
)

SOFTMAX_HINTS = hint_table("""
size of tensor | must match the size: the max and the sum over dim must keep that axis (keepdim=True) so that
    they broadcast against x
""")
# torch.softmax, F.softmax, Tensor.softmax, log_softmax, nn.Softmax, torch.special.softmax, aten's ops
SOFTMAX_RULE = FromScratch("softmax", ("softmax",))
# likely causes of NaN or inf from scores that overflow a plain exp
OVERFLOW = table("""
1000: exp(1000) is inf in float32 (exp overflows above 88.7); subtract the max along dim before exponentiating
    (softmax is shift invariant)
global: subtract the max of each slice along dim (x.amax(dim=dim, keepdim=True)), not the max of the whole
    tensor: a row far below the global max underflows to 0 / 0
float16: exp(20) is inf in float16 (exp overflows above 11.09); subtract the max along dim first
""")
# likely causes of the docstring's promises that ordinary inputs do not reach
TEXT = table("""
no nan: a slice whose elements are all -inf has no distribution, and the docstring promises NaN there (as
    torch.softmax gives): do not replace NaN (nan_to_num) or clamp the sum; chapter 3's masked_attention
    handles such rows
dim range: a dim out of range must raise IndexError, as x.amax(dim=dim) and x.sum(dim=dim) do: do not wrap
    dim around (dim % x.dim()) nor raise another type
""")

# The learner's docstrings clause by clause, and the behaviours that check each (tests/test_contracts.py).
CONTRACT = table("""
softmax x: softmax_sums_to_one, softmax_matches_torch, softmax_is_stable; 1, 2, 3 and 4 axes; float16,
    bfloat16, float32 and float64 (all four visible in softmax_sums_to_one); on the checks' device (the CPU
    where there is no accelerator); left unchanged
softmax dim: softmax_sums_to_one, softmax_matches_torch; left out (-1), every axis of 3-D and 4-D x, negative
    and positive
softmax returns: softmax_sums_to_one, softmax_matches_torch; the shape, dtype and device of x, >= 0, summing
    to 1 along dim only, torch.softmax's values
softmax all -inf slice: softmax_sums_to_one; NaN in a slice all -inf, 0 for the -inf elements of another slice
    (float32 visible; float64, float16 and bfloat16 hidden)
softmax raises IndexError: softmax_sums_to_one; dim=3 of a 3-D x (visible), 4 and -5 of a 4-D x (hidden)
softmax stable: softmax_is_stable; scores about 1000 (float32) and 20 (float16), rows 1000 apart, N(0, 50^2)
    in every dtype (hidden), shift invariance
softmax from scratch: softmax_from_scratch; no torch.softmax, F.softmax, log_softmax or aten softmax
scaled_dot_product_attention query: sdpa_shapes, sdpa_matches_builtin, sdpa_dtype_and_inputs; [..., q_len,
    d_k] with 0, 1 and 2 leading axes, sizes of 1 (a batch of one, one query, d_k = 1); float64, float32,
    float16 and bfloat16; on the checks' device; left unchanged
scaled_dot_product_attention key: sdpa_shapes, sdpa_matches_builtin; [..., k_len, d_k], k_len != q_len, one
    key, identical keys (uniform weights)
scaled_dot_product_attention value: sdpa_shapes, sdpa_matches_builtin; [..., k_len, d_v], d_v != d_k, d_v = 1
scaled_dot_product_attention mask: sdpa_mask, sdpa_dtype_and_inputs, sdpa_from_scratch; left out, None, and
    boolean [k_len], [q_len, k_len], [heads, q_len, k_len], [batch, 1, 1, k_len], [batch, 1, q_len, k_len],
    [batch, heads, q_len, k_len]; True = may attend
scaled_dot_product_attention returns: sdpa_shapes, sdpa_matches_builtin, sdpa_mask, sdpa_dtype_and_inputs;
    (output [..., q_len, d_v], weights [..., q_len, k_len]) in this order, PyTorch's values (rows summing to
    1, masked keys 0 within 1e-10 in float64), the dtype and device of query (the dtype cell)
scaled_dot_product_attention empty rows: sdpa_mask, sdpa_dtype_and_inputs; NaN in the weights and the output
    of a query whose mask row is all False, float64 (visible) and float32 (hidden) in sdpa_mask, float16 and
    bfloat16 in sdpa_dtype_and_inputs
scaled_dot_product_attention precision: sdpa_matches_builtin, sdpa_mask, sdpa_dtype_and_inputs; float64 inputs
    judged at float64's tolerance (a computation in float32 fails), half precision computed in float32 or in
    half, within four times the error of a plain computation in the inputs' dtype
scaled_dot_product_attention scores far from 0: sdpa_matches_builtin; float32 scores of about +-100, which
    overflow exp() without the row maximum subtracted
scaled_dot_product_attention raises ValueError: sdpa_shapes; a key with one d_k less, a value with one key
    less (visible: one leading axis; hidden: two)
scaled_dot_product_attention raises TypeError: sdpa_mask; masks of 0/1 in int64 (visible), uint8 and float32
    (hidden)
scaled_dot_product_attention from scratch: sdpa_from_scratch; no F.scaled_dot_product_attention nor multi-head
    attention built-in
dot_product_variance d_k: variance_unscaled, variance_scaled; 16, 64 and 256 (visible), 1, 8, 100 and 512
    (hidden)
dot_product_variance n_samples: variance_unscaled, variance_is_estimate; 200 to 25000; the estimates spread
    over seeds as n_samples independent pairs give
dot_product_variance scaled: variance_unscaled, variance_scaled, variance_is_estimate; False, True, and left
    out (False, near d_k)
dot_product_variance generator: variance_is_estimate; seeded CPU generators (one seed, one estimate; 100 seeds
    spread) and None (torch's global generator: two calls after different global seeds differ); a generator on
    an accelerator is not checked, since the checks' generators are CPU ones
dot_product_variance returns: variance_is_estimate, variance_unscaled, variance_scaled; a Python float (a
    numpy float64 is one), near d_k (scaled False) or 1 (scaled True)
dot_product_variance raises ValueError: variance_unscaled; d_k 0 and n_samples 1 (visible), d_k -2 and
    n_samples 0 (hidden)
""")

# ==================================================================================================
# 1. softmax


def _softmax_mistakes(x: torch.Tensor, dim: int) -> Iterator[Mistake]:
    x, dim = x.double(), dim % x.dim()
    for other in (axis for axis in range(x.dim()) if axis != dim):
        hint = f"the softmax runs over axis {other} while dim={dim} was asked for: use `dim` in both the max "
        yield Mistake(hint + "and the sum", torch.softmax(x, other))
    shifted = x - x.amax(dim=dim, keepdim=True)
    whole = "the sum runs over the whole tensor: sum along dim only, with keepdim=True"
    yield Mistake(whole, shifted.exp() / shifted.exp().sum())
    yield Mistake("it returns log-probabilities: exponentiate the shifted scores", torch.log_softmax(x, dim))
    yield Mistake("the exponentials are not divided by their sum along dim", shifted.exp())


def _distribution(part: Part, x: torch.Tensor, dim: int | None = None) -> Check:
    """softmax(x, dim) has x's shape, dtype and device, is finite, >= 0, and sums to 1 along dim only."""
    call = part.call(x=x) if dim is None else part.call(x=x, dim=dim)
    dim = -1 if dim is None else dim

    def judge(result: Any) -> None:
        assert_format(result, f"the result of {call}", x.shape, x.dtype, x.device)
        values = result.detach().cpu().double()
        if not torch.isfinite(values).all():
            fail(f"the result of {call} contains NaN or inf for ordinary inputs (values about N(0, 1)).")
        if (values < 0).any():
            fail(
                f"the result of {call} has negative values, but probabilities are non-negative.",
                "the shifted scores (or their log) are returned instead of exp(...) / sum",
            )
        atol = max(1e-4, 4 * torch.finfo(x.dtype).eps)  # the rounding of a few values in x's dtype
        sums = values.sum(dim=dim)
        if not torch.allclose(sums, torch.ones_like(sums), atol=atol):
            hint = "the values must be divided by their sum along dim"
            if math.isclose(values.sum().item(), 1.0, abs_tol=atol):
                hint = "the whole tensor sums to 1: the sum must run along dim only (keepdim=True)"
            for other in (axis for axis in range(x.dim()) if axis != dim % x.dim()):
                if torch.allclose(values.sum(dim=other), torch.ones(()).double(), atol=atol):
                    hint = f"it sums to 1 along axis {other}, not along dim={dim}"
            span = f"{sums.min().item():.4g} to {sums.max().item():.4g}"
            fail(f"the result of {call} does not sum to 1 along dim={dim} (sums range from {span}).", hint)

    return Check(call, judge, untouched=True)


def _no_distribution(part: Part, x: torch.Tensor, dim: int) -> Check:
    """softmax(x, dim) of an ``x`` with slices all -inf: NaN there (the docstring), else torch.softmax."""
    call, expected = part.call(x=x, dim=dim), torch.softmax(x.detach().cpu().double(), dim)
    empty = expected.isnan()

    def judge(result: Any) -> None:
        where = f"the result of {call}"
        assert_format(result, where, x.shape, x.dtype, x.device)
        values = result.detach().cpu().double()
        if not values[empty].isnan().all():
            got = values[empty & ~values.isnan()][0].item()
            fail(
                f"{where} is {got:g} in a slice whose elements are all -inf, where NaN is expected.",
                TEXT["no nan"],
            )
        assert_values(result, expected, where, dtype=x.dtype, note="Elements of -inf get weight 0.")

    return Check(call, judge)


def _all_minus_inf(shape: tuple[int, ...], dim: int, seed: int, device, dtype) -> torch.Tensor:
    """N(0, 4) scores with one slice along ``dim`` all -inf, and -inf at the start of another."""
    x = 2 * randn(shape, seed=seed, dtype=torch.float64).movedim(dim, -1).contiguous()  # dim last
    slices = x.view(-1, x.size(-1))
    slices[1], slices[-1, :2] = -math.inf, -math.inf
    return x.movedim(-1, dim).to(device, dtype)


@behaviour(function="softmax", points=1, hints=SOFTMAX_HINTS)
def softmax_sums_to_one(part: Part) -> Iterator[Check]:
    """softmax gives a distribution along dim: shape, dtype, device of x, >= 0, sums to 1."""
    # and the docstring's other promises: a slice all -inf gives NaN, a dim out of range raises IndexError
    if part.hidden:
        for dtype in DTYPES:
            for dim in (-1, 2, 0):
                yield _distribution(part, randn((2, 3, 5, 7), seed=100, device=part.device, dtype=dtype), dim)
        yield _distribution(part, randn((6,), seed=101, device=part.device, dtype=torch.float32))  # one axis
        for dtype in (torch.float64, torch.float16, torch.bfloat16):  # slices all -inf
            yield _no_distribution(part, _all_minus_inf((2, 3, 5, 7), 2, 102, part.device, dtype), 2)
        for dim in (4, -5):
            x = randn((2, 3, 5, 7), seed=103, device=part.device)
            yield raises(
                part.call(x=x, dim=dim), "IndexError", f"for dim={dim}, out of range", TEXT["dim range"]
            )
        return
    x = randn((3, 4, 5), seed=0, device=part.device, dtype=torch.float32)
    yield _distribution(part, x)  # the default axis is the last
    for dim in (1, 0):
        yield _distribution(part, x, dim)
    for dtype in (torch.float64, torch.float16, torch.bfloat16):  # the dtype follows x
        yield _distribution(part, x.to(dtype), -1)
    yield _no_distribution(part, _all_minus_inf((3, 4, 5), -1, 5, part.device, torch.float32), -1)
    yield raises(part.call(x=x, dim=3), "IndexError", "for dim=3, out of range", TEXT["dim range"])


def _against(part: Part, x: torch.Tensor, dim: int, answer, overflow: str = "") -> Check:
    """softmax(x, dim) has the values of ``answer() = (expected, naive_error)``, whatever its dtype.

    ``overflow`` is the likely cause of NaN or inf in the result (a check of stability).
    """
    call, wrong = part.call(x=x, dim=dim), functools.partial(_softmax_mistakes, x, dim)

    def judge(result: Any) -> None:
        tensor = isinstance(result, torch.Tensor) and result.shape == x.shape
        if overflow and tensor and not result.isfinite().all():
            fail(f"the result of {call} contains NaN or inf.", overflow)
        (expected, error), where = answer(), f"the result of {call}"
        assert_values(result, expected, where, dtype=x.dtype, naive_error=error, mistakes=wrong)

    return Check(call, judge)


def _reference(part: Part, scale: float, dims: tuple[int, ...], seed: int) -> Iterator[Check]:
    for dtype in DTYPES:
        for dim in dims:
            x = (scale * randn((2, 3, 5, 7), seed=seed, device=part.device)).to(dtype)

            def answer(x: torch.Tensor = x, dim: int = dim) -> tuple[torch.Tensor, float]:
                truth = part.reference(x.double(), dim)  # the float64 answer for the rounded inputs
                # the tolerance follows the less exact of the two standard stable forms in x's dtype,
                # exp(x - max) / sum and exp(x - logsumexp(x)) (in bfloat16 the latter loses more)
                forms = (part.reference(x, dim), torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True)))
                return truth, max((form.double() - truth).abs().max().item() for form in forms)

            yield _against(part, x, dim, answer)


@behaviour(function="softmax", points=2, hints=SOFTMAX_HINTS)
def softmax_matches_torch(part: Part) -> Iterator[Check]:
    """softmax agrees with torch.softmax along every axis."""
    if part.hidden:
        yield from _reference(part, 1.0, (-1, 1, 0), seed=110)
        return
    for dtype in (torch.float64, torch.float32):
        x = 2 * randn((3, 4, 5), seed=1, device=part.device, dtype=dtype)
        for dim in (-1, 1, 0, -2):
            yield _against(part, x, dim, lambda x=x, dim=dim: (torch.softmax(x.double(), dim), 0.0))


def _shift_invariant(part: Part, x: torch.Tensor, shift: torch.Tensor) -> Check:
    def judge(plain: Any, shifted: Any) -> None:
        results = (plain, shifted)
        if not all(isinstance(r, torch.Tensor) for r in results) or plain.shape != shifted.shape:
            fail("softmax(x) and softmax(x + c) should be tensors of x's shape.")
        largest = (plain.cpu().double() - shifted.cpu().double()).abs().max().item()
        if not largest <= 1e-6:
            fail(
                "softmax(x + c) differs from softmax(x) for a constant c per row (largest difference "
                f"{largest:.3g}); softmax is shift invariant, and a stable implementation keeps it so to "
                "float32 precision."
            )

    return Check((part.call(x=x, dim=-1), part.call(x=x + shift, dim=-1)), judge)


@behaviour(function="softmax", points=1, hints=SOFTMAX_HINTS)
def softmax_is_stable(part: Part) -> Iterator[Check]:
    """softmax stays finite and exact for large scores (float32, float16), shift invariant."""
    if part.hidden:  # scores of N(0, 50^2): plain exponentials overflow in every low precision dtype
        yield from _reference(part, 50.0, (-1,), seed=120)
        return
    base = randn((4, 6), seed=2, device=part.device, dtype=torch.float32)
    rows = torch.tensor([[1000.0], [0.0], [-1000.0], [500.0]], device=part.device)
    for x, cause in ((1000 + 3 * base, "1000"), (base + rows, "global"), ((20 + base).half(), "float16")):
        yield _against(part, x, -1, lambda x=x: (torch.softmax(x.double(), dim=-1), 0.0), OVERFLOW[cause])
    yield _shift_invariant(part, base, 50 * randn((4, 1), seed=3, device=part.device, dtype=torch.float32))


@behaviour(function="softmax", points=1, hints=SOFTMAX_HINTS)
def softmax_from_scratch(part: Part) -> Iterator[Check]:
    """softmax is correct and calls no built-in softmax."""
    shape, dtypes = ((2, 3, 5, 7), DTYPES) if part.hidden else ((3, 4, 5), (torch.float32, torch.float16))
    if not part.hidden:
        yield from correct_first(softmax_matches_torch.plan(part), "softmax")
    x, dims = randn(shape, seed=4, device=part.device), (-1, 2 if part.hidden else 0)
    yield SOFTMAX_RULE.check([part.call(x=x.to(dtype), dim=dim) for dtype in dtypes for dim in dims])


# ==================================================================================================
# 2. scaled dot-product attention

VISIBLE = Sizes((2, 3), 5, 7, 4, 6)  # every size different, so that a swapped axis cannot pass
SDPA_HINTS = family.exception_hints("""
too many indices for tensor of dimension 1: a mask may have fewer axes than the scores (a [k_len] mask is
    broadcastable too): let masked_fill or torch.where broadcast it, rather than index its last two axes
""")
# sizes of 1: a batch of one, one query, one key, d_k = 1, d_v = 1 (visible, then hidden)
ONES = ((Sizes((1,), 1, 3, 1, 2),), (Sizes((1, 1), 1, 1, 1, 1), Sizes((1,), 4, 1, 3, 1)))
# scores far from 0, in float32 (std about 100): exp overflows above 88.7
FAR = 100.0
SDPA_TEXT = table("""
empty zeros: a query whose mask allows no key gets NaN here, as the docstring says (the softmax of a row of
    -inf): zeros for such rows (nan_to_num, a mask applied after the softmax) are chapter 3's
    masked_attention, not this function
empty uniform: a query whose mask allows no key gets NaN here, as the docstring says: filling blocked scores
    with a finite number (-1e9, -1e4, torch.finfo(dtype).min) gives such a row weights spread over keys it may
    not attend; fill with float('-inf')
empty other: a query whose mask allows no key gets NaN here, as the docstring says: fill blocked scores with
    float('-inf') before the softmax, whose row of -inf then gives NaN
far: scores far from 0 overflow exp() (above 88.7 in float32) or underflow to 0 / 0: the softmax must
    subtract the maximum of each row (along the keys) before exp, as torch.softmax does
shapes: check that query and key share d_k and key and value share k_len, and raise ValueError otherwise
    (the product alone raises RuntimeError, or nothing at all when an axis broadcasts)
squeezed: an axis of size 1 is gone: squeeze() or squeeze(0) also removes a batch, a query or a key of size
    1; remove only an axis you added (or add none: @ broadcasts over any number of leading axes)
mask dtype: a mask that is not boolean must raise TypeError (check mask.dtype == torch.bool): converting it
    (mask.bool(), mask == 0) or adding it to the scores accepts masks that the docstring refuses
""")


def _inputs(part: Part, masked: bool) -> Callable[[Sizes, int, torch.dtype], dict]:
    """Arguments for ``sizes``, with a mask that broadcasts over them (``masked``)."""

    def make(sizes: Sizes, seed: int, dtype: torch.dtype = torch.float64) -> dict:
        arguments = family.qkv(sizes, seed=seed, device=part.device, dtype=dtype)
        if masked:
            arguments["mask"] = family.mask(family.mask_shape(sizes), seed=seed + 5, device=part.device)
        return arguments

    return make


def _visible(
    part: Part, seed: int, answer, masked: bool, dtypes=(torch.float64,), **options
) -> Iterator[Check]:
    """Checks of VISIBLE with 2, 1 and no leading axes, in ``dtypes``, against ``answer``."""
    for index, (lead, dtype) in enumerate(itertools.product(family.LEADS, dtypes)):
        sizes = replace(VISIBLE, lead=lead)
        arguments = _inputs(part, masked)(sizes, seed + index, dtype)
        yield family.attention_check(part, arguments, sizes, answer, **options)


def _nan_attention(query, key, value, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The formula with the docstring's rule for a query that may attend no key: NaN (softmax of -inf)."""
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def _nan_answer(compute: Callable[..., tuple]) -> Callable[[dict], tuple]:
    """The answer of ``compute`` in float64, and its error in the arguments' dtype, NaN rows left out."""

    def answer(arguments: dict) -> tuple:
        truth, naive = compute(**family.cast(arguments, torch.float64)), compute(**arguments)
        errors = [
            (n.double() - t).abs().nan_to_num(0.0).max().item() for n, t in zip(naive, truth, strict=True)
        ]
        return truth, tuple(errors)

    return answer


def _empty_rows(mask: torch.Tensor) -> Callable[[Any, Any, Any], None]:
    """The judge of the rows of ``mask`` that allow no key: the output and the weights are NaN there."""
    empty = ~mask.detach().cpu().any(dim=-1)

    def judge(output: Any, weights: Any, call: Any) -> None:
        rows = empty.broadcast_to(weights.shape[:-1])
        for which, tensor in (("weights", weights), ("output", output)):
            got = tensor.detach().cpu().double()[rows]  # [empty rows, k_len or d_v]
            if got.isnan().all():
                continue
            cause = "empty other"
            if (got == 0).all():
                cause = "empty zeros"
            elif which == "weights" and torch.allclose(got.sum(dim=-1), torch.ones(()).double(), atol=1e-2):
                cause = "empty uniform"
            shown, verb = [round(x, 4) for x in got[0].tolist()], "are" if which == "weights" else "is"
            fail(
                f"the {which} of {call} {verb} {shown} in the row of a query whose mask row is all False; "
                "the docstring promises NaN there.",
                SDPA_TEXT[cause],
            )

    return judge


def _empty_rows_check(part: Part, sizes: Sizes, seed: int, dtype: torch.dtype, **options) -> Check:
    """A call with a mask that leaves some queries no key, against ``_nan_attention`` or the reference."""
    arguments = family.qkv(sizes, seed=seed, device=part.device, dtype=dtype)
    mask = family.mask(family.mask_shape(sizes), seed=seed + 5, device=part.device, kind="empty rows")
    answer = _nan_answer(part.reference if part.hidden else _nan_attention)
    arguments = {**arguments, "mask": mask}
    return family.attention_check(part, arguments, sizes, answer, extra=_empty_rows(mask), **options)


def _squeezed(sizes: Sizes) -> dict[str, dict[tuple[int, ...], str]]:
    """The likely causes of wrong shapes: the family's, and an axis of size 1 squeezed away."""
    hints = family.shape_hints(sizes)
    for which, shape in family.expected_shapes(sizes).items():
        ones = [axis for axis, size in enumerate(shape) if size == 1]
        for gone in [[axis] for axis in ones] + ([ones] if len(ones) > 1 else []):
            squeezed = tuple(size for axis, size in enumerate(shape) if axis not in gone)
            hints[which].setdefault(squeezed, SDPA_TEXT["squeezed"])
    return hints


def _far(part: Part, sizes: Sizes, seed: int, dtype: torch.dtype = torch.float32) -> dict:
    """Arguments whose scores are far from 0, up and down (queries scaled by ``FAR``)."""
    arguments = family.qkv(sizes, seed=seed, device=part.device, dtype=dtype)
    return {**arguments, "query": arguments["query"] * FAR}


@behaviour(function="scaled_dot_product_attention", points=1, hints=SDPA_HINTS)
def sdpa_shapes(part: Part) -> Iterator[Check]:
    """(output, weights) are [..., q_len, d_v] and [..., q_len, k_len] with 0, 1 and 2 leading axes."""
    cases = HIDDEN_SIZES if part.hidden else [Sizes(lead, 5, 7, 4, 6) for lead in ((), (2,), (2, 3))]
    for sizes in (*cases, *ONES[part.hidden]):  # and sizes of 1
        arguments = family.qkv(sizes, seed=10, device=part.device, dtype=torch.float32)
        note = family.LEADS_NOTE.format(n=len(sizes.lead)) if sizes.lead and not part.hidden else ""
        yield family.attention_check(part, arguments, sizes, on_raise=note, hints=_squeezed(sizes))
    # the docstring's ValueError: query and key differ in d_k, key and value in k_len
    for sizes in HIDDEN_SIZES[:1] if part.hidden else (Sizes((2,), 5, 7, 4, 6),):
        arguments = family.qkv(sizes, seed=11, device=part.device, dtype=torch.float32)
        wrong = {
            "key": (arguments["key"][..., :-1], "if query and key differ in d_k"),
            "value": (arguments["value"][..., 1:, :], "if key and value differ in k_len"),
        }
        for name, (tensor, condition) in wrong.items():
            call = part.call(**{**arguments, name: tensor})
            yield raises(call, "ValueError", condition, SDPA_TEXT["shapes"])


@behaviour(function="scaled_dot_product_attention", points=2, hints=SDPA_HINTS)
def sdpa_matches_builtin(part: Part) -> Iterator[Check]:
    """Identical keys give uniform weights; random inputs agree with PyTorch's SDPA."""
    if part.hidden:
        yield from family.hidden_checks(part, _inputs(part, False), (torch.float64, torch.float32), seed=200)
        far, finite = functools.partial(_far, part), _finite(SDPA_TEXT["far"])
        yield from family.hidden_checks(part, far, (torch.float32,), seed=220, extra=finite)
        return
    # a known answer: when every key is the same, every weight is 1 / k_len and the output is the mean value
    arguments = family.qkv(VISIBLE, seed=20, device=part.device)
    arguments["key"] = arguments["key"][..., :1, :].repeat(1, 1, 7, 1)
    uniform = torch.full((2, 3, 5, 7), 1 / 7, dtype=torch.float64, device=part.device)
    mean = arguments["value"].mean(dim=-2, keepdim=True).expand(2, 3, 5, 6)
    note = "With identical keys every weight is 1/k_len and the output is the mean of the values."
    yield family.attention_check(part, arguments, VISIBLE, lambda _: ((mean, uniform), (0.0, 0.0)), note=note)
    yield from _visible(part, 21, family.builtin(), masked=False)
    # scores far from 0 (about +-100, float32): a softmax without its row maximum subtracted overflows
    far = _far(part, VISIBLE, 25)
    yield family.attention_check(part, far, VISIBLE, family.plain(), extra=_finite(SDPA_TEXT["far"]))


def _finite(cause: str) -> Callable[[Any, Any, Any], None]:
    """A judge that the output and the weights are finite (ordinary inputs, scores far from 0)."""

    def judge(output: Any, weights: Any, call: Any) -> None:
        for which, tensor in (("weights", weights), ("output", output)):
            if not tensor.isfinite().all():
                bad = int((~tensor.isfinite()).sum())
                fail(f"the {which} of {call} contain NaN or inf ({bad} of {tensor.numel()} elements).", cause)

    return judge


@behaviour(function="scaled_dot_product_attention", points=2, hints=SDPA_HINTS)
def sdpa_mask(part: Part) -> Iterator[Check]:
    """A boolean mask (True = may attend) of several broadcastable shapes agrees with PyTorch."""
    if part.hidden:  # more sizes and mask shapes, float64 and float32, against the reference
        yield from family.hidden_checks(part, _inputs(part, True), (torch.float64, torch.float32), seed=200)
        for case, sizes in enumerate(HIDDEN_SIZES):
            arguments = family.qkv(sizes, seed=260 + case, device=part.device)
            shape = ((sizes.k_len,), (*sizes.lead[1:], sizes.q_len, sizes.k_len))[case % 2]
            mask = family.mask(shape, seed=270 + case, device=part.device)
            yield family.attention_check(part, {**arguments, "mask": mask}, sizes, family.reference(part))
            yield _empty_rows_check(part, sizes, 280 + 10 * case, (torch.float64, torch.float32)[case % 2])
        yield from _mask_dtypes(part, HIDDEN_SIZES[1], (torch.uint8, torch.float32))
        return
    arguments = family.qkv(VISIBLE, seed=30, device=part.device)
    for seed, shape in enumerate(((5, 7), (2, 1, 1, 7), (2, 3, 5, 7), (7,), (3, 5, 7))):
        mask = family.mask(shape, seed=31 + seed, device=part.device)
        answer = family.builtin() if len(shape) > 1 else _nan_answer(_nan_attention)  # F.sdpa wants 2 axes
        yield family.attention_check(part, {**arguments, "mask": mask}, VISIBLE, answer)
    yield from _visible(part, 36, family.builtin(), masked=True)
    yield _empty_rows_check(part, VISIBLE, 39, torch.float64)  # the docstring's NaN rows
    yield from _mask_dtypes(part, VISIBLE, (torch.int64,))


def _mask_dtypes(part: Part, sizes: Sizes, dtypes: tuple[torch.dtype, ...]) -> Iterator[Check]:
    """Calls with a mask of 0/1 in each of ``dtypes``: the docstring's TypeError."""
    arguments = family.qkv(sizes, seed=290, device=part.device)
    mask = family.mask(family.mask_shape(sizes), seed=291, device=part.device)
    for dtype in dtypes:
        call = part.call(**{**arguments, "mask": mask.to(dtype)})
        yield raises(call, "TypeError", f"if mask is not boolean (here {dtype})", SDPA_TEXT["mask dtype"])


@behaviour(function="scaled_dot_product_attention", points=1, hints=SDPA_HINTS)
def sdpa_dtype_and_inputs(part: Part) -> Iterator[Check]:
    """Results keep the inputs' dtype and device (float64, float32, float16); inputs unchanged."""
    if part.hidden:
        dtypes = (torch.float16, torch.bfloat16, torch.float32)
        yield from family.hidden_checks(part, _inputs(part, True), dtypes, seed=250, formats=True)
        for case, sizes in enumerate(HIDDEN_SIZES):  # rows that allow no key, in half precision
            dtype = (torch.float16, torch.bfloat16)[case % 2]
            yield _empty_rows_check(part, sizes, 300 + 10 * case, dtype, formats=True)
        return
    yield from _visible(part, 40, family.plain(), masked=True, dtypes=DTYPES, formats=True)
    for dtype in (torch.float16, torch.bfloat16):  # rows that allow no key are NaN in half precision too
        yield _empty_rows_check(part, VISIBLE, 48, dtype, formats=True)


@behaviour(function="scaled_dot_product_attention", points=1, hints=SDPA_HINTS)
def sdpa_from_scratch(part: Part) -> Iterator[Check]:
    """scaled_dot_product_attention is correct and calls no built-in attention."""
    rule, make = family.from_scratch("scaled dot-product attention"), _inputs(part, True)
    if not part.hidden:
        yield from correct_first(sdpa_matches_builtin.plan(part), part.function)
        masked = make(VISIBLE, 50, torch.float64)
        yield rule.check([part.call(**{**masked, "mask": None}), part.call(**masked)])
        return
    cases = [make(Sizes((3,), 6, 9, 8, 5), 60, dtype) for dtype in DTYPES]
    yield rule.check([part.call(**{**case, "mask": mask}) for case in cases for mask in (None, case["mask"])])


# ==================================================================================================
# 3. the variance of q . k, by Monte Carlo

SPREAD_SEEDS = 100  # estimates whose spread across seeds variance_is_estimate measures
# their standard deviation lies within [0.6, 1.45] of its expectation with probability above 1 - 1e-6 for a
# correct estimator (chi-square with 99 degrees of freedom: 1e-7 quantiles 0.65 and 1.39, with a margin)
SPREAD_BOUNDS = (0.6, 1.45)
# likely causes of an estimate, by the value of a known mistake that it is close to, and of a wrong spread
VARIANCE = table("""
1: it looks like Var(q . k / sqrt(d_k)), the variance of one component, or the variance of the individual
    products q_i k_i: with scaled=False return the variance of the dot products q . k (sum over the d_k
    components first), about d_k
d_k: the scaled flag is ignored: with scaled=True divide each dot product by sqrt(d_k)
1/d_k: the estimate is about 1/d_k: either the dot products are divided by d_k instead of sqrt(d_k), or the
    variance is taken over the individual products q_i k_i rather than over their sums q . k
sqrt(d_k): it looks like a standard deviation (about sqrt(d_k)): return the variance (dots.var()), not the
    standard deviation (dots.std())
d_k^2: Var(q . k) is d_k, not d_k^2: take the variance of the dot products
0: this is about 0, like a mean (E[q . k] = 0) rather than a variance
n_samples: the sum runs over the samples instead of over the d_k components
uniform: the samples look uniform on [0, 1] (torch.rand): draw q and k from N(0, 1) with torch.randn
other: compare your estimate with the theory: Var(q . k) = d_k, Var(q . k / sqrt(d_k)) = 1
deviation: it looks like a standard deviation (std()), which sqrt(d_k) divides by sqrt(d_k) only, rather than
    a variance (var()); both are about 1 when scaled=True
unscaled: the estimate does not depend on how q . k is scaled: it looks like the variance of one component,
    or of something else than the dot products q . k
samples: the estimate does not use exactly n_samples independent (q, k) pairs
generator: some draws ignore the generator; pass generator=generator to every torch.randn call, so that
    results are reproducible
global: with generator=None the samples must come from torch's global generator (torch.randn(...,
    generator=None)), which torch.manual_seed seeds: a new torch.Generator() starts from the same fixed seed
    at every call
float: return a Python float, as the docstring says: dots.var().item() (or float(...)), not the tensor
arguments: check the arguments first: raise ValueError if d_k < 1 or n_samples < 2 (a variance needs two
    samples; torch returns NaN or 0 instead of an error)
""")


def relative_standard_error(d_k: int, n_samples: int) -> float:
    """Relative standard error of the sample variance of ``q . k`` for q, k ~ N(0, I_{d_k}).

    ``q . k`` is a sum of d_k independent products with variance 1 and fourth moment 9, so its fourth
    moment is ``3 d_k^2 + 6 d_k`` and the sample variance has variance about ``(2 d_k^2 + 6 d_k) / n``.
    """
    return math.sqrt((2 + 6 / d_k) / n_samples)


def _estimate(result: Any, call: Call) -> float:
    if isinstance(result, torch.Tensor) and result.numel() == 1:
        result = result.item()
    if isinstance(result, bool) or not isinstance(result, int | float):
        fail(f"{call} should return a float, got {type_name(result)}.")
    return float(result)


def _variance_hint(estimate: float, d_k: int, n_samples: int, scaled: bool) -> str:
    """The likely cause of an estimate far from the theory: the known mistake whose value it is close to."""
    target, spread = (1.0 if scaled else float(d_k)), 5 * relative_standard_error(d_k, n_samples)
    values = {"1": 1.0, "d_k": d_k, "1/d_k": 1 / d_k, "sqrt(d_k)": math.sqrt(d_k), "d_k^2": d_k**2.0}
    values |= {"0": 0.0, "n_samples": float(n_samples), "uniform": target * 7 / 144}
    for name, value in values.items():
        relative = 0.75 if name == "n_samples" else spread  # only d_k products summed: a rough estimate
        close = abs(estimate) < 0.02 * target if value == 0 else abs(estimate - value) <= relative * value
        if value != target and close:
            return VARIANCE[name]
    return VARIANCE["other"]


def _theory(part: Part, d_k: int, n_samples: int, scaled: bool, seed: int) -> Check:
    call = part.call(d_k=d_k, n_samples=n_samples, scaled=scaled, generator=Seeded(seed))

    def judge(result: Any) -> None:
        estimate, theory = _estimate(result, call), 1.0 if scaled else float(d_k)
        # five standard errors: a correct estimator fails with probability below 1e-6
        tolerance = 5 * relative_standard_error(d_k, n_samples) * theory
        if not abs(estimate - theory) <= tolerance:
            fail(
                f"{call} returned {estimate:.5g}, but the theory gives {theory:g} and {n_samples} samples "
                f"should land within {tolerance:.3g} of it.",
                _variance_hint(estimate, d_k, n_samples, scaled),
                expected=f"{theory:g} +- {tolerance:.3g}",
                got=f"{estimate:.5g}",
            )

    return Check(call, judge)


def _variance_theory(part: Part, scaled: bool) -> Iterator[Check]:
    hidden = ((1, 25_000), (8, 15_000), (100, 5_000), (512, 1_000))
    for d_k, n_samples in hidden if part.hidden else ((16, 2_000), (64, 2_000), (256, 2_000)):
        yield _theory(part, d_k, n_samples, scaled, seed=(400 if part.hidden else 300) + d_k)


@behaviour(function="dot_product_variance", points=1)
def variance_unscaled(part: Part) -> Iterator[Check]:
    """The estimate of Var(q . k) is close to d_k for d_k = 16, 64 and 256."""
    yield from _variance_theory(part, scaled=False)
    # the docstring's ValueError: d_k < 1 or n_samples < 2
    for d_k, n_samples in ((-2, 50), (4, 0)) if part.hidden else ((0, 50), (4, 1)):
        call = part.call(d_k=d_k, n_samples=n_samples, scaled=False, generator=Seeded(9))
        yield raises(call, "ValueError", "if d_k < 1 or n_samples < 2", VARIANCE["arguments"])


def _estimates(calls: tuple[Call, ...], results: tuple[Any, ...]) -> torch.Tensor:
    return torch.tensor([_estimate(r, c) for r, c in zip(results, calls, strict=True)], dtype=torch.float64)


def _not_a_deviation(part: Part, d_k: int, n_samples: int, seed: int) -> Check:
    """Across 20 seeds, estimates for scaled=True spread d_k times less than for scaled=False.

    Scaling q . k by 1/sqrt(d_k) divides a variance by d_k, a standard deviation only by sqrt(d_k); and both
    are about 1 for scaled=True.
    """
    seeds = [(Seeded(seed + offset), scaled) for offset in range(20) for scaled in (False, True)]
    calls = tuple(part.call(d_k=d_k, n_samples=n_samples, scaled=s, generator=g) for g, s in seeds)

    def judge(*results: Any) -> None:
        estimates = _estimates(calls, results)
        unscaled, scaled = estimates[0::2].std().item(), estimates[1::2].std().item()
        ratio = unscaled / scaled if unscaled > 0 and scaled > 0 else float(d_k)
        if ratio < d_k**0.75:  # d_k for a variance, sqrt(d_k) for a standard deviation
            fail(
                f"with the same 20 seeds, the estimates for d_k={d_k} vary {ratio:.3g} times less with "
                f"scaled=True than with scaled=False; dividing q . k by sqrt(d_k) divides its variance by "
                f"d_k = {d_k}.",
                VARIANCE["unscaled" if ratio < d_k**0.25 else "deviation"],
            )

    return Check(calls, judge)


@behaviour(function="dot_product_variance", points=1)
def variance_scaled(part: Part) -> Iterator[Check]:
    """The estimate of Var(q . k / sqrt(d_k)) is close to 1 for d_k = 16, 64 and 256."""
    yield from _variance_theory(part, scaled=True)
    # the ratio does not depend on n_samples (the same seeds draw the same pairs for both flags): few will do
    yield _not_a_deviation(part, *((16, 300, 500) if part.hidden else (64, 200, 0)))


def _spread(part: Part, d_k: int, n_samples: int) -> Check:
    """The estimates over SPREAD_SEEDS seeds vary as a variance estimated from n_samples pairs does."""
    seeds = (Seeded(seed) for seed in range(SPREAD_SEEDS))
    calls = tuple(part.call(d_k=d_k, n_samples=n_samples, scaled=False, generator=g) for g in seeds)

    def judge(*results: Any) -> None:
        estimates = _estimates(calls, results)
        if torch.unique(estimates).numel() == 1:
            fail(
                f"{part.function} returns {estimates[0].item():g} whatever the generator's seed: it should "
                "estimate the variance from random samples, not return the theoretical value."
            )
        expected, spread = relative_standard_error(d_k, n_samples) * d_k, estimates.std().item()
        if not SPREAD_BOUNDS[0] <= spread / expected <= SPREAD_BOUNDS[1]:
            fail(
                f"over {SPREAD_SEEDS} seeds the estimates of Var(q . k) for d_k={d_k}, n_samples={n_samples} "
                f"vary with standard deviation {spread:.3g}, {spread / expected:.2g} times the "
                f"{expected:.3g} that {n_samples} independent samples give.",
                VARIANCE["samples"],
            )

    return Check(calls, judge)


def _reproducible(part: Part, d_k: int, n_samples: int) -> Check:
    calls = (part.call(d_k=d_k, n_samples=n_samples, scaled=False, generator=Seeded(7)),) * 2

    def judge(*results: Any) -> None:
        first, again = _estimates(calls, results).tolist()
        if first != again:
            fail(
                f"two calls with generators seeded alike returned different estimates ({first:.6g} and "
                f"{again:.6g}).",
                VARIANCE["generator"],
            )

    return Check(calls, judge)


@behaviour(function="dot_product_variance", points=1)
def variance_is_estimate(part: Part) -> Iterator[Check]:
    """The result is an estimate from n_samples draws of the generator, not the theory typed in."""
    d_k, n_samples = (8, 600) if part.hidden else (32, 400)
    yield _reproducible(part, d_k, n_samples)
    yield _spread(part, d_k, n_samples)
    yield _global_generator(part, d_k, n_samples)


def _global_generator(part: Part, d_k: int, n_samples: int) -> Check:
    """Two calls with generator=None and scaled left out: Python floats near d_k, drawn from torch's global
    generator (seeded differently before each call, so the two estimates differ)."""
    calls = (part.call(d_k=d_k, n_samples=n_samples, generator=None),) * 2

    def judge(*results: Any) -> None:
        for result, call in zip(results, calls, strict=True):
            if not isinstance(result, float):
                fail(f"{call} returned {describe(result)}, not a Python float.", VARIANCE["float"])
        first, second = results
        tolerance = 5 * relative_standard_error(d_k, n_samples) * d_k
        if not abs(first - d_k) <= tolerance:
            fail(
                f"{calls[0]} returned {first:.5g}; with scaled left out (False) the theory gives {d_k} "
                f"within {tolerance:.3g}.",
                _variance_hint(first, d_k, n_samples, False),
            )
        if first == second:
            fail(
                f"two calls with generator=None, after different seeds of torch's global generator, returned "
                f"the same estimate {first:.6g}.",
                VARIANCE["global"],
            )

    return Check(calls, judge)
