"""Checks of exercise ex02: a stable softmax, scaled dot-product attention, and the variance of q . k.

Visible parts use properties, known answers and PyTorch's built-ins; hidden parts test the same behaviour
on more inputs (every axis a different size, the dtypes the cell is about) against the reference. Dtype,
device and in-place edits are judged only by the cells that name them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
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
    type_name,
)

SOFTMAX_HINTS = hint_table("""
size of tensor | must match the size
    the max and the sum over dim must keep that axis (keepdim=True) so that they broadcast against x
""")
# torch.softmax, F.softmax, Tensor.softmax, log_softmax, nn.Softmax, torch.special.softmax, aten's ops
SOFTMAX_RULE = FromScratch("softmax", ("softmax",))

# ==================================================================================================
# 1. softmax


def _softmax_mistakes(x: torch.Tensor, dim: int) -> Iterator[Mistake]:
    x, dim = x.double(), dim % x.dim()
    for other in (axis for axis in range(x.dim()) if axis != dim):
        hint = f"the softmax runs over axis {other} while dim={dim} was asked for: use `dim` in both the max "
        yield Mistake(hint + "and the sum", torch.softmax(x, other))
    shifted = x - x.amax(dim=dim, keepdim=True)
    yield Mistake(
        "the sum runs over the whole tensor: sum along dim only, with keepdim=True",
        shifted.exp() / shifted.exp().sum(),
    )
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


def _against(
    part: Part, x: torch.Tensor, dim: int, answer: Callable[[], tuple[torch.Tensor, float]]
) -> Check:
    """softmax(x, dim) has the values of ``answer() = (expected, naive_error)``, whatever its dtype."""
    call = part.call(x=x, dim=dim)

    def judge(result: Any) -> None:
        expected, naive_error = answer()
        wrong = lambda: _softmax_mistakes(x, dim)  # noqa: E731
        assert_values(
            result, expected, f"the result of {call}", dtype=x.dtype, naive_error=naive_error, mistakes=wrong
        )

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


def _stable(part: Part, x: torch.Tensor, hint: str) -> Check:
    call = part.call(x=x, dim=-1)

    def judge(result: Any) -> None:
        if isinstance(result, torch.Tensor) and result.shape == x.shape and not torch.isfinite(result).all():
            fail(f"the result of {call} contains NaN or inf.", hint)
        assert_values(result, torch.softmax(x.double(), dim=-1), f"the result of {call}", dtype=x.dtype)

    return Check(call, judge)


def _shift_invariant(part: Part, x: torch.Tensor, shift: torch.Tensor) -> Check:
    def judge(plain: Any, shifted: Any) -> None:
        if (
            not isinstance(plain, torch.Tensor)
            or not isinstance(shifted, torch.Tensor)
            or plain.shape != shifted.shape
        ):
            fail("softmax(x) and softmax(x + c) should be tensors of x's shape.")
        largest = (plain.cpu().double() - shifted.cpu().double()).abs().max().item()
        if not largest <= 1e-6:
            fail(
                "softmax(x + c) differs from softmax(x) for a constant c per row (largest difference "
                f"{largest:.3g}); "
                "softmax is shift invariant, and a stable implementation keeps it so to float32 precision."
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
    overflow = "exp(1000) is inf in float32 (exp overflows above 88.7); subtract the max along dim before "
    yield _stable(part, 1000 + 3 * base, overflow + "exponentiating (softmax is shift invariant)")
    yield _stable(
        part,
        base + rows,
        "subtract the max of each slice along dim (x.amax(dim=dim, keepdim=True)), not the max of the whole "
        "tensor: a row far below the global max underflows to 0 / 0",
    )
    half = "exp(20) is inf in float16 (exp overflows above 11.09); subtract the max along dim first"
    yield _stable(part, (20 + base).half(), half)
    yield _shift_invariant(part, base, 50 * randn((4, 1), seed=3, device=part.device, dtype=torch.float32))


@behaviour(function="softmax", points=1, hints=SOFTMAX_HINTS)
def softmax_from_scratch(part: Part) -> Iterator[Check]:
    """softmax is correct and calls no built-in softmax."""
    shape, dtypes = ((2, 3, 5, 7), DTYPES) if part.hidden else ((3, 4, 5), (torch.float32, torch.float16))
    if not part.hidden:
        yield from correct_first(softmax_matches_torch.plan(part), "softmax")
    x = randn(shape, seed=4, device=part.device)
    yield SOFTMAX_RULE.check(
        [part.call(x=x.to(dtype), dim=dim) for dtype in dtypes for dim in (-1, 2 if part.hidden else 0)]
    )


# ==================================================================================================
# 2. scaled dot-product attention

VISIBLE = Sizes((2, 3), 5, 7, 4, 6)  # every size different, so that a swapped axis cannot pass
SDPA_HINTS = family.exception_hints()


def _inputs(part: Part, masked: bool) -> Callable[[Sizes, int, torch.dtype], dict]:
    def make(sizes: Sizes, seed: int, dtype: torch.dtype) -> dict:
        arguments = family.qkv(sizes, seed=seed, device=part.device, dtype=dtype)
        if masked:
            arguments["mask"] = family.mask(family.mask_shape(sizes), seed=seed + 5, device=part.device)
        return arguments

    return make


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
    yield family.attention_check(
        part, family.qkv(VISIBLE, seed=21, device=part.device), VISIBLE, family.builtin()
    )


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


@behaviour(function="scaled_dot_product_attention", points=1, hints=SDPA_HINTS)
def sdpa_dtype_and_inputs(part: Part) -> Iterator[Check]:
    """Results keep the inputs' dtype and device (float64, float32, float16); inputs unchanged."""
    if part.hidden:
        dtypes = (torch.float16, torch.bfloat16, torch.float32)
        yield from family.hidden_checks(part, _inputs(part, True), dtypes, seed=250, formats=True)
        return
    for dtype in DTYPES:
        arguments = family.qkv(VISIBLE, seed=40, device=part.device, dtype=dtype)
        arguments["mask"] = family.mask((2, 1, 5, 7), seed=41, device=part.device)
        yield family.attention_check(part, arguments, VISIBLE, family.plain(), formats=True)


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
    """The likely cause of an estimate far from the theory, by the value it is close to."""
    target, spread = (1.0 if scaled else float(d_k)), 5 * relative_standard_error(d_k, n_samples)
    candidates = [  # (value of a known mistake, relative tolerance, hint)
        (
            1.0,
            spread,
            "it looks like Var(q . k / sqrt(d_k)), the variance of one component, or the variance of the "
            "individual "
            "products q_i k_i: with scaled=False return the variance of the dot products q . k (sum over "
            "the d_k "
            "components first), about d_k",
        ),
        (
            float(d_k),
            spread,
            "the scaled flag is ignored: with scaled=True divide each dot product by sqrt(d_k)",
        ),
        (
            1.0 / d_k,
            spread,
            "the estimate is about 1/d_k: either the dot products are divided by d_k instead of sqrt(d_k), "
            "or the "
            "variance is taken over the individual products q_i k_i rather than over their sums q . k",
        ),
        (
            math.sqrt(d_k),
            spread,
            "it looks like a standard deviation (about sqrt(d_k)): return the variance (dots.var()), not the "
            "standard deviation (dots.std())",
        ),
        (float(d_k) ** 2, spread, "Var(q . k) is d_k, not d_k^2: take the variance of the dot products"),
        (0.0, 0.0, "this is about 0, like a mean (E[q . k] = 0) rather than a variance"),
        # only d_k sums over the samples: a rough estimate, so a wide tolerance
        (float(n_samples), 0.75, "the sum runs over the samples instead of over the d_k components"),
        (
            target * 7 / 144,
            spread,
            "the samples look uniform on [0, 1] (torch.rand): draw q and k from N(0, 1) with torch.randn",
        ),
    ]
    for value, relative, hint in candidates:
        if value != target and (
            abs(estimate - value) <= relative * value or (value == 0 and abs(estimate) < 0.02 * target)
        ):
            return hint
    return "compare your estimate with the theory: Var(q . k) = d_k, Var(q . k / sqrt(d_k)) = 1"


def _theory(part: Part, d_k: int, n_samples: int, scaled: bool, seed: int) -> Check:
    call = part.call(d_k=d_k, n_samples=n_samples, scaled=scaled, generator=Seeded(seed))

    def judge(result: Any) -> None:
        estimate, theory = _estimate(result, call), 1.0 if scaled else float(d_k)
        # five standard errors: a correct estimator fails with probability below 1e-6
        tolerance = 5 * relative_standard_error(d_k, n_samples) * theory
        if not abs(estimate - theory) <= tolerance:
            fail(
                f"{call} returned {estimate:.5g}, but the theory gives {theory:g} and {n_samples} samples "
                "should land "
                f"within {tolerance:.3g} of it.",
                _variance_hint(estimate, d_k, n_samples, scaled),
                expected=f"{theory:g} +- {tolerance:.3g}",
                got=f"{estimate:.5g}",
            )

    return Check(call, judge)


def _variance_theory(part: Part, scaled: bool) -> Iterator[Check]:
    cases = (
        ((1, 50_000), (8, 30_000), (100, 10_000), (512, 4_000))
        if part.hidden
        else ((16, 20_000), (64, 20_000), (256, 20_000))
    )
    for d_k, n_samples in cases:
        yield _theory(part, d_k, n_samples, scaled, seed=(400 if part.hidden else 300) + d_k)


@behaviour(function="dot_product_variance", points=1)
def variance_unscaled(part: Part) -> Iterator[Check]:
    """The estimate of Var(q . k) is close to d_k for d_k = 16, 64 and 256."""
    yield from _variance_theory(part, scaled=False)


def _not_a_deviation(part: Part, d_k: int, n_samples: int, seed: int) -> Check:
    """Across seeds, estimates for scaled=True spread d_k times less than for scaled=False.

    Scaling q . k by 1/sqrt(d_k) divides a variance by d_k; a standard deviation only by sqrt(d_k), and is
    1, like the variance, for scaled=True.
    """
    calls = tuple(
        part.call(d_k=d_k, n_samples=n_samples, scaled=scaled, generator=Seeded(seed + offset))
        for offset in range(20)
        for scaled in (False, True)
    )

    def judge(*results: Any) -> None:
        estimates = torch.tensor(
            [_estimate(r, c) for r, c in zip(results, calls, strict=True)], dtype=torch.float64
        )
        unscaled, scaled = estimates[0::2].std().item(), estimates[1::2].std().item()
        ratio = unscaled / scaled if unscaled > 0 and scaled > 0 else float(d_k)
        if ratio < d_k**0.75:  # d_k for a variance, sqrt(d_k) for a standard deviation
            cause = (
                "it looks like a standard deviation (std()), which sqrt(d_k) divides by sqrt(d_k) only, "
                "rather than "
                "a variance (var()); both are about 1 when scaled=True"
            )
            if ratio < d_k**0.25:
                cause = (
                    "the estimate does not depend on how q . k is scaled: it looks like the variance of one "
                    "component, "
                    "or of something else than the dot products q . k"
                )
            fail(
                f"with the same 20 seeds, the estimates for d_k={d_k} vary {ratio:.3g} times less with "
                "scaled=True than "
                f"with scaled=False; dividing q . k by sqrt(d_k) divides its variance by d_k = {d_k}.",
                cause,
            )

    return Check(calls, judge)


@behaviour(function="dot_product_variance", points=1)
def variance_scaled(part: Part) -> Iterator[Check]:
    """The estimate of Var(q . k / sqrt(d_k)) is close to 1 for d_k = 16, 64 and 256."""
    yield from _variance_theory(part, scaled=True)
    yield _not_a_deviation(part, *((16, 3000, 500) if part.hidden else (64, 2000, 0)))


def _spread(part: Part, d_k: int, n_samples: int) -> Check:
    """The estimates over SPREAD_SEEDS seeds vary as a variance estimated from n_samples pairs does."""
    calls = tuple(
        part.call(d_k=d_k, n_samples=n_samples, scaled=False, generator=Seeded(s))
        for s in range(SPREAD_SEEDS)
    )

    def judge(*results: Any) -> None:
        estimates = torch.tensor(
            [_estimate(r, c) for r, c in zip(results, calls, strict=True)], dtype=torch.float64
        )
        if torch.unique(estimates).numel() == 1:
            fail(
                f"{part.function} returns {estimates[0].item():g} whatever the generator's seed: it should "
                "estimate "
                "the variance from random samples, not return the theoretical value."
            )
        expected, spread = relative_standard_error(d_k, n_samples) * d_k, estimates.std().item()
        if not SPREAD_BOUNDS[0] <= spread / expected <= SPREAD_BOUNDS[1]:
            fail(
                f"over {SPREAD_SEEDS} seeds the estimates of Var(q . k) for d_k={d_k}, "
                f"n_samples={n_samples} vary with "
                f"standard deviation {spread:.3g}, {spread / expected:.2g} times the {expected:.3g} that "
                f"{n_samples} "
                "independent samples give.",
                "the estimate does not use exactly n_samples independent (q, k) pairs",
            )

    return Check(calls, judge)


def _reproducible(part: Part, d_k: int, n_samples: int) -> Check:
    calls = tuple(
        part.call(d_k=d_k, n_samples=n_samples, scaled=False, generator=Seeded(7)) for _ in range(2)
    )

    def judge(first: Any, again: Any) -> None:
        first, again = _estimate(first, calls[0]), _estimate(again, calls[1])
        if first != again:
            fail(
                f"two calls with generators seeded alike returned different estimates ({first:.6g} and "
                f"{again:.6g}).",
                "some draws ignore the generator; pass generator=generator to every torch.randn call, so "
                "that results "
                "are reproducible",
            )

    return Check(calls, judge)


@behaviour(function="dot_product_variance", points=1)
def variance_is_estimate(part: Part) -> Iterator[Check]:
    """The result is an estimate from n_samples draws of the generator, not the theory typed in."""
    d_k, n_samples = (8, 3000) if part.hidden else (32, 2000)
    yield _reproducible(part, d_k, n_samples)
    yield _spread(part, d_k, n_samples)
    call = part.call(d_k=d_k, n_samples=n_samples, scaled=False, generator=None)
    yield Check(call, lambda result: _estimate(result, call))  # the global generator must work too


BEHAVIOURS = (
    softmax_sums_to_one,
    softmax_matches_torch,
    softmax_is_stable,
    softmax_from_scratch,
    sdpa_shapes,
    sdpa_matches_builtin,
    sdpa_mask,
    sdpa_dtype_and_inputs,
    sdpa_from_scratch,
    variance_unscaled,
    variance_scaled,
    variance_is_estimate,
)
