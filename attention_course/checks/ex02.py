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
    fail,
    hint_table,
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


@behaviour(function="softmax", points=1, hints=SOFTMAX_HINTS)
def softmax_sums_to_one(part: Part) -> Iterator[Check]:
    """softmax gives a distribution along dim: shape, dtype, device of x, >= 0, sums to 1."""
    if part.hidden:
        for dtype in DTYPES:
            for dim in (-1, 2, 0):
                yield _distribution(part, randn((2, 3, 5, 7), seed=100, device=part.device, dtype=dtype), dim)
        return
    x = randn((3, 4, 5), seed=0, device=part.device, dtype=torch.float32)
    yield _distribution(part, x)  # the default axis is the last
    for dim in (1, 0):
        yield _distribution(part, x, dim)
    yield _distribution(part, x.double(), -1)  # the dtype follows x


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
SDPA_HINTS = family.exception_hints()


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


@behaviour(function="scaled_dot_product_attention", points=1, hints=SDPA_HINTS)
def sdpa_shapes(part: Part) -> Iterator[Check]:
    """(output, weights) are [..., q_len, d_v] and [..., q_len, k_len] with 0, 1 and 2 leading axes."""
    cases = HIDDEN_SIZES if part.hidden else [Sizes(lead, 5, 7, 4, 6) for lead in ((), (2,), (2, 3))]
    for sizes in cases:
        arguments = family.qkv(sizes, seed=10, device=part.device, dtype=torch.float32)
        note = family.LEADS_NOTE.format(n=len(sizes.lead)) if sizes.lead and not part.hidden else ""
        yield family.attention_check(part, arguments, sizes, on_raise=note)


@behaviour(function="scaled_dot_product_attention", points=2, hints=SDPA_HINTS)
def sdpa_matches_builtin(part: Part) -> Iterator[Check]:
    """Identical keys give uniform weights; random inputs agree with PyTorch's SDPA."""
    if part.hidden:
        yield from family.hidden_checks(part, _inputs(part, False), (torch.float64, torch.float32), seed=200)
        return
    # a known answer: when every key is the same, every weight is 1 / k_len and the output is the mean value
    arguments = family.qkv(VISIBLE, seed=20, device=part.device)
    arguments["key"] = arguments["key"][..., :1, :].repeat(1, 1, 7, 1)
    uniform = torch.full((2, 3, 5, 7), 1 / 7, dtype=torch.float64, device=part.device)
    mean = arguments["value"].mean(dim=-2, keepdim=True).expand(2, 3, 5, 6)
    note = "With identical keys every weight is 1/k_len and the output is the mean of the values."
    yield family.attention_check(part, arguments, VISIBLE, lambda _: ((mean, uniform), (0.0, 0.0)), note=note)
    yield from _visible(part, 21, family.builtin(), masked=False)


@behaviour(function="scaled_dot_product_attention", points=2, hints=SDPA_HINTS)
def sdpa_mask(part: Part) -> Iterator[Check]:
    """A boolean mask (True = may attend) of several broadcastable shapes agrees with PyTorch."""
    if part.hidden:
        yield from family.hidden_checks(part, _inputs(part, True), (torch.float64, torch.float32), seed=200)
        return
    arguments = family.qkv(VISIBLE, seed=30, device=part.device)
    for seed, shape in enumerate(((5, 7), (2, 1, 1, 7), (2, 3, 5, 7))):
        mask = family.mask(shape, seed=31 + seed, device=part.device)
        yield family.attention_check(part, {**arguments, "mask": mask}, VISIBLE, family.builtin())
    yield from _visible(part, 35, family.builtin(), masked=True)


@behaviour(function="scaled_dot_product_attention", points=1, hints=SDPA_HINTS)
def sdpa_dtype_and_inputs(part: Part) -> Iterator[Check]:
    """Results keep the inputs' dtype and device (float64, float32, float16); inputs unchanged."""
    if part.hidden:
        dtypes = (torch.float16, torch.bfloat16, torch.float32)
        yield from family.hidden_checks(part, _inputs(part, True), dtypes, seed=250, formats=True)
        return
    yield from _visible(part, 40, family.plain(), masked=True, dtypes=DTYPES, formats=True)


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
    call = part.call(d_k=d_k, n_samples=n_samples, scaled=False, generator=None)
    yield Check(call, lambda result: _estimate(result, call))  # the global generator must work too
