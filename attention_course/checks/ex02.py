"""Checks of exercise ex02, scaled dot-product attention.

Each ``check_*`` function is the visible part of one test cell: it uses properties, known answers and
PyTorch's built-ins, never the reference solutions, so a learner can run it anywhere. Each
``*_against_reference`` function is a hidden test: it compares the learner's function with the reference
on random inputs where every axis has a different size, in float64, float32, float16 and bfloat16, on the
default device (CUDA when available).

Every failure names the call, what was expected, and, where a known mistake reproduces the learner's
result, the likely cause.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from attention_course.checks._harness import (
    Call,
    CheckFailure,
    Mistake,
    assert_from_scratch,
    assert_like,
    assert_output_and_weights,
    assert_tensor,
    call,
    fail,
    randn,
    random_attention_inputs,
    random_mask,
    reference_answer,
    unpack_output_and_weights,
)
from attention_course.device import default_device, seeded_generator

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
SOFTMAX_BUILTINS = ("softmax",)  # torch.softmax, F.softmax, Tensor.softmax, log_softmax, nn.Softmax, ...
ATTENTION_BUILTINS = ("scaled_dot_product", "multi_head_attention", "multiheadattention")

_KEEPDIM_HINT = (
    ("size of tensor", "must match the size"),
    "the max and the sum over dim must keep that axis (keepdim=True) so that they broadcast against x",
)


# ==================================================================================================
# 1. softmax


def _softmax_mistakes(x: torch.Tensor, dim: int) -> Iterator[Mistake]:
    x = x.double()
    dim = dim % x.dim()
    for other in range(x.dim()):
        if other != dim:
            yield Mistake(
                f"the softmax runs over axis {other} while dim={dim} was asked for: use `dim` in both "
                "the max and the sum",
                torch.softmax(x, other),
            )
    shifted = x - x.amax(dim=dim, keepdim=True)
    yield Mistake(
        "the sum runs over the whole tensor: sum along dim only, with keepdim=True",
        shifted.exp() / shifted.exp().sum(),
    )
    yield Mistake("it returns log-probabilities: exponentiate the shifted scores", torch.log_softmax(x, dim))
    yield Mistake("the exponentials are not divided by their sum along dim", shifted.exp())


def _assert_distribution(result: Any, x: torch.Tensor, dim: int, call_text: str) -> None:
    """Shape, dtype, device, non-negative, finite, and sums to 1 along ``dim`` (and only along it)."""
    __tracebackhide__ = True
    assert_like(result, shape=x.shape, dtype=x.dtype, device=x.device, what="the result", call_text=call_text)
    values = result.double()
    if not torch.isfinite(values).all():
        fail(f"the result of {call_text} contains NaN or inf for ordinary inputs (values about N(0, 1)).")
    if (values < 0).any():
        fail(
            f"the result of {call_text} has negative values, but probabilities are non-negative. "
            "Likely cause: the shifted scores (or their log) are returned instead of exp(...) / sum."
        )
    sums = values.sum(dim=dim)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
        axis = dim % x.dim()
        hint = "the values must be divided by their sum along dim"
        if math.isclose(values.sum().item(), 1.0, abs_tol=1e-4):
            hint = "the whole tensor sums to 1: the sum must run along dim only (keepdim=True)"
        for other in range(x.dim()):
            along_other = values.sum(dim=other)
            if other != axis and torch.allclose(along_other, torch.ones_like(along_other), atol=1e-4):
                hint = f"it sums to 1 along axis {other}, not along dim={dim}"
        fail(
            f"the result of {call_text} does not sum to 1 along dim={dim} (sums range from "
            f"{sums.min().item():.4g} to {sums.max().item():.4g}).\n  Likely cause: {hint}."
        )


def check_softmax_sums_to_one(softmax: Callable[..., torch.Tensor]) -> None:
    """softmax keeps the shape, dtype and device, and returns non-negative values summing to 1 along dim."""
    __tracebackhide__ = True
    device = default_device()
    x = randn((3, 4, 5), seed=0, dtype=torch.float32, device=device)
    result = call(softmax, "softmax", extra_hints=[_KEEPDIM_HINT], x=x)  # the default axis is the last
    _assert_distribution(result, x, -1, str(Call("softmax", {"x": x})))
    for dim in (1, 0):
        result = call(softmax, "softmax", extra_hints=[_KEEPDIM_HINT], x=x, dim=dim)
        _assert_distribution(result, x, dim, str(Call("softmax", {"x": x, "dim": dim})))


def check_softmax_matches_torch(softmax: Callable[..., torch.Tensor]) -> None:
    """softmax agrees with torch.softmax along every axis (float64)."""
    __tracebackhide__ = True
    device = default_device()
    x = 2 * randn((3, 4, 5), seed=1, device=device)
    for dim in (-1, 1, 0, -2):
        result = call(softmax, "softmax", extra_hints=[_KEEPDIM_HINT], x=x, dim=dim)
        assert_tensor(
            result,
            torch.softmax(x, dim),
            what="the result",
            call_text=str(Call("softmax", {"x": x, "dim": dim})),
            mistakes=lambda dim=dim: _softmax_mistakes(x, dim),
        )


def check_softmax_is_stable(softmax: Callable[..., torch.Tensor]) -> None:
    """softmax stays finite and exact for large scores (float32 and float16) and is shift invariant."""
    __tracebackhide__ = True
    device = default_device()
    base = randn((4, 6), seed=2, dtype=torch.float32, device=device)
    cases = [
        (
            1000 + 3 * base,
            "exp(1000) is inf in float32 (exp overflows above 88.7); subtract the max along dim "
            "before exponentiating (softmax is shift invariant)",
        ),
        (
            base + torch.tensor([[1000.0], [0.0], [-1000.0], [500.0]], device=device),
            "subtract the max of each slice along dim (x.amax(dim=dim, keepdim=True)), not the max of the "
            "whole tensor: a row far below the global max underflows to 0 / 0",
        ),
        (
            (20 + base).half(),
            "exp(20) is inf in float16 (exp overflows above 11.09); subtract the max along dim first",
        ),
    ]
    for x, hint in cases:
        call_text = str(Call("softmax", {"x": x, "dim": -1}))
        result = call(softmax, "softmax", x=x, dim=-1)
        expected = torch.softmax(x.double(), dim=-1)
        if isinstance(result, torch.Tensor) and result.shape == x.shape and not torch.isfinite(result).all():
            fail(f"the result of {call_text} contains NaN or inf.\n  Likely cause: {hint}.")
        assert_tensor(result, expected, what="the result", call_text=call_text, dtype=x.dtype)
    # C3: adding a constant to each row changes nothing
    shift = 50 * randn((4, 1), seed=3, dtype=torch.float32, device=device)
    plain = call(softmax, "softmax", x=base, dim=-1)
    shifted = call(softmax, "softmax", x=base + shift, dim=-1)
    if not isinstance(plain, torch.Tensor) or not isinstance(shifted, torch.Tensor):
        fail("softmax should return a tensor.")
    if not torch.allclose(plain, shifted, atol=1e-6):
        fail(
            "softmax(x + c) differs from softmax(x) for a constant c per row (largest difference "
            f"{(plain - shifted).abs().max().item():.3g}); softmax is shift invariant, and a stable "
            "implementation keeps it so to float32 precision."
        )


def check_softmax_from_scratch(softmax: Callable[..., torch.Tensor]) -> None:
    """softmax is correct and calls no built-in softmax (torch.softmax, F.softmax, log_softmax, ...)."""
    __tracebackhide__ = True
    try:
        check_softmax_matches_torch(softmax)
    except CheckFailure as failure:
        fail(f"softmax must be correct before it counts as written from scratch. {failure}")
    x = randn((3, 4, 5), seed=4, dtype=torch.float32, device=default_device())
    assert_from_scratch(
        softmax, "softmax", [{"x": x, "dim": -1}, {"x": x, "dim": 0}], SOFTMAX_BUILTINS, "softmax"
    )


def softmax_against_reference(
    softmax: Callable[..., torch.Tensor],
    reference: Callable[..., torch.Tensor],
    *,
    scale: float = 1.0,
    dims: tuple[int, ...] = (-1, 1, 0),
    seed: int = 100,
) -> None:
    """Hidden test: softmax matches the reference on ``[2, 3, 5, 7]`` inputs in every dtype, on the device.

    ``scale`` multiplies N(0, 1) inputs: 50 makes plain exponentials overflow in every low precision dtype.
    """
    __tracebackhide__ = True
    device = default_device()
    for dtype in DTYPES:
        for dim in dims:
            x = (scale * randn((2, 3, 5, 7), seed=seed, device=device)).to(dtype)
            truth = reference(x.double(), dim)  # float64 answer for the rounded inputs
            # the tolerance follows the less exact of the two standard stable forms in this dtype:
            # exp(x - max) / sum, and exp(x - logsumexp(x)) (in bfloat16 the latter loses more)
            plain_forms = (reference(x, dim), torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True)))
            naive_error = max((form.double() - truth).abs().max().item() for form in plain_forms)
            result = call(softmax, "softmax", extra_hints=[_KEEPDIM_HINT], x=x, dim=dim)
            assert_tensor(
                result,
                truth,
                dtype=dtype,
                naive_error=naive_error,
                what="the result",
                call_text=str(Call("softmax", {"x": x, "dim": dim})),
                mistakes=lambda x=x, dim=dim: _softmax_mistakes(x, dim),
            )


def softmax_from_scratch_everywhere(softmax: Callable[..., torch.Tensor]) -> None:
    """Hidden test: no built-in softmax on any path (every dtype, several axes, 4-D inputs)."""
    __tracebackhide__ = True
    device = default_device()
    cases = [
        {"x": randn((2, 3, 5, 7), seed=5, device=device).to(dtype), "dim": dim}
        for dtype in DTYPES
        for dim in (-1, 2)
    ]
    assert_from_scratch(softmax, "softmax", cases, SOFTMAX_BUILTINS, "softmax")


# ==================================================================================================
# 2. scaled dot-product attention

SDPA = "scaled_dot_product_attention"


def _attend(scores: torch.Tensor, mask: torch.Tensor | None, dim: int = -1) -> torch.Tensor:
    if mask is not None:
        scores = torch.where(mask, scores, float("-inf"))
    return torch.softmax(scores, dim=dim)


def _sdpa_weight_mistakes(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Known wrong attention weights, computed in float64, with the hint that names each mistake."""
    q, k = query.double(), key.double()
    d_k, d_v = q.size(-1), value.size(-1)
    raw = q @ k.transpose(-2, -1)  # [..., q_len, k_len]
    scaled = raw / math.sqrt(d_k)
    yield (
        "the scores are not scaled: divide Q K^T by sqrt(d_k) (Vaswani et al. 2017, eq. 1)",
        _attend(raw, mask),
    )
    yield (
        "the scores are divided by d_k; the scale is 1/sqrt(d_k), one over the standard deviation of q . k",
        _attend(raw / d_k, mask),
    )
    if d_v != d_k:
        yield (
            "the scores are divided by sqrt(d_v), the width of the values; the scale is 1/sqrt(d_k), "
            "where d_k is the width of the queries and keys (query.size(-1))",
            _attend(raw / math.sqrt(d_v), mask),
        )
    yield (
        "the scores are multiplied by sqrt(d_k) instead of divided by it",
        _attend(raw * math.sqrt(d_k), mask),
    )
    yield (
        "the softmax runs over the query axis (dim=-2); it must run over the keys (dim=-1), so that "
        "each query's weights sum to 1",
        _attend(scaled, mask, dim=-2),
    )
    yield (
        "the scale is applied after the softmax; divide the scores before it",
        _attend(raw, mask) / math.sqrt(d_k),
    )
    if mask is not None:
        yield (
            "the mask is inverted: True means 'may attend' (the convention of "
            "F.scaled_dot_product_attention), so fill the scores where the mask is False (~mask)",
            _attend(scaled, ~mask),
        )
        yield (
            "the mask is ignored: fill the scores where it is False with -inf before the softmax",
            _attend(scaled, None),
        )
        yield (
            "the mask is applied after the softmax: zeroing weights leaves rows that do not sum to 1; "
            "mask the scores before the softmax",
            torch.softmax(scaled, dim=-1) * mask,
        )
        yield (
            "masked scores are set to 0 instead of -inf, so masked keys keep weight; fill them with "
            "float('-inf') (or torch.finfo(scores.dtype).min)",
            torch.softmax(torch.where(mask, scaled, 0.0), dim=-1),
        )


def _sdpa_mistakes(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, part: str
) -> Iterator[Mistake]:
    for hint, weights in _sdpa_weight_mistakes(query, key, value, mask):
        yield Mistake(hint, weights if part == "weights" else weights @ value.double())


def _sdpa_shape_hints(lead: tuple[int, ...], q_len: int, k_len: int, d_k: int, d_v: int) -> dict:
    return {
        "output": {
            (*lead, q_len, k_len): "the first element returned must be the output (weights @ value); "
            "return (output, weights) in this order",
            (*lead, q_len, d_k): "the output has the width of the keys: multiply the weights by the values",
        },
        "weights": {
            (*lead, k_len, q_len): "the weights are [..., k_len, q_len]: the scores are query @ key^T, "
            "[..., q_len, k_len]",
            (
                *lead,
                q_len,
                d_v,
            ): "the weights have the width of the values: return (output, weights) in this order",
            (*lead, q_len, q_len): "the scores compare the queries with themselves: use query @ key^T",
        },
    }


def _assert_sdpa(
    sdpa: Callable[..., Any],
    inputs: dict[str, torch.Tensor | None],
    expected_output: torch.Tensor,
    expected_weights: torch.Tensor,
    *,
    dtype: torch.dtype,
    naive_errors: tuple[float, float] = (0.0, 0.0),
    note: str | None = None,
) -> None:
    """Call ``sdpa(**inputs)`` and compare the weights, then the output, diagnosing known mistakes."""
    __tracebackhide__ = True
    query, key, value = inputs["query"], inputs["key"], inputs["value"]
    mask = inputs.get("mask")
    call_text = str(Call(SDPA, inputs))
    output, weights = unpack_output_and_weights(call(sdpa, SDPA, **inputs), call_text)
    lead, (q_len, d_k), (k_len, d_v) = tuple(expected_output.shape[:-2]), query.shape[-2:], value.shape[-2:]
    assert_output_and_weights(
        output,
        weights,
        expected_output,
        expected_weights,
        call_text=call_text,
        dtype=dtype,
        naive_errors=naive_errors,
        shape_hints=_sdpa_shape_hints(lead, q_len, k_len, d_k, d_v),
        mistakes=lambda part: _sdpa_mistakes(query, key, value, mask, part),
        note=note,
    )


def _plain_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention from PyTorch's matmul and softmax, in the dtype of the inputs (for tolerances)."""
    weights = _attend(query @ key.transpose(-2, -1) / math.sqrt(query.size(-1)), mask)
    return weights @ value, weights


def _builtin_answer(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The right (output, weights) in float64, from PyTorch's SDPA and softmax."""
    q, k, v = (inputs[name].double() for name in ("query", "key", "value"))
    mask = inputs.get("mask")
    weights = _attend(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), weights


def check_sdpa_shapes(sdpa: Callable[..., Any]) -> None:
    """(output, weights) have shapes [..., q_len, d_v] and [..., q_len, k_len] for 0, 1 and 2 leading axes."""
    __tracebackhide__ = True
    device = default_device()
    q_len, k_len, d_k, d_v = 5, 7, 4, 6  # every size different, so a swapped axis cannot pass
    for lead in ((), (2,), (2, 3)):
        inputs = random_attention_inputs(lead, q_len, k_len, d_k, d_v, seed=10, device=device)
        inputs = {name: tensor.float() for name, tensor in inputs.items()}
        call_text = str(Call(SDPA, inputs))
        try:
            output, weights = unpack_output_and_weights(call(sdpa, SDPA, **inputs), call_text)
        except CheckFailure as failure:
            if lead:
                fail(
                    f"{failure}\n  It works for inputs without leading axes but not with {len(lead)}: "
                    "key.T reverses *all* axes and key.transpose(0, 1) swaps the batch axis; use "
                    "key.transpose(-2, -1) (or key.mT) to swap only the last two."
                )
            raise
        hints = _sdpa_shape_hints(lead, q_len, k_len, d_k, d_v)
        for part, actual, shape in (
            ("output", output, (*lead, q_len, d_v)),
            ("weights", weights, (*lead, q_len, k_len)),
        ):
            assert_like(
                actual,
                shape=shape,
                dtype=torch.float32,
                device=device,
                what=f"the {part}",
                call_text=call_text,
                shape_hints=hints[part],
            )


def check_sdpa_matches_builtin(sdpa: Callable[..., Any]) -> None:
    """Identical keys give uniform weights; random inputs agree with F.scaled_dot_product_attention."""
    __tracebackhide__ = True
    device = default_device()
    # a known answer: when every key is the same, every weight is 1 / k_len and the output is the mean value
    inputs = random_attention_inputs((2, 3), 5, 7, 4, 6, seed=20, device=device)
    inputs["key"] = inputs["key"][..., :1, :].repeat(1, 1, 7, 1)
    weights = torch.full((2, 3, 5, 7), 1 / 7, dtype=torch.float64, device=device)
    output = inputs["value"].mean(dim=-2, keepdim=True).expand(2, 3, 5, 6)
    _assert_sdpa(
        sdpa,
        inputs,
        output,
        weights,
        dtype=torch.float64,
        note="With identical keys every weight is 1/k_len and the output is the mean of the values.",
    )
    # random inputs against PyTorch
    inputs = random_attention_inputs((2, 3), 5, 7, 4, 6, seed=21, device=device)
    _assert_sdpa(sdpa, inputs, *_builtin_answer(inputs), dtype=torch.float64)


def check_sdpa_mask(sdpa: Callable[..., Any]) -> None:
    """A boolean mask (True = may attend) of several broadcastable shapes agrees with PyTorch's SDPA."""
    __tracebackhide__ = True
    device = default_device()
    inputs = random_attention_inputs((2, 3), 5, 7, 4, 6, seed=30, device=device)
    for seed, shape in enumerate(((5, 7), (2, 1, 1, 7), (2, 3, 5, 7))):
        masked = {**inputs, "mask": random_mask(shape, seed=31 + seed, device=device)}
        _assert_sdpa(sdpa, masked, *_builtin_answer(masked), dtype=torch.float64)


def check_sdpa_dtype_and_inputs(sdpa: Callable[..., Any]) -> None:
    """The outputs keep the dtype and device of the inputs (float64, float32, float16), inputs untouched."""
    __tracebackhide__ = True
    device = default_device()
    for dtype in (torch.float64, torch.float32, torch.float16):
        inputs = {
            name: tensor.to(dtype)
            for name, tensor in random_attention_inputs((2, 3), 5, 7, 4, 6, seed=40, device=device).items()
        }
        inputs["mask"] = random_mask((2, 1, 5, 7), seed=41, device=device)
        (output, weights), naive_errors = reference_answer(_plain_attention, inputs)
        _assert_sdpa(sdpa, inputs, output, weights, dtype=dtype, naive_errors=naive_errors)


def check_sdpa_from_scratch(sdpa: Callable[..., Any]) -> None:
    """scaled_dot_product_attention is correct and calls no built-in attention."""
    __tracebackhide__ = True
    try:
        check_sdpa_matches_builtin(sdpa)
    except CheckFailure as failure:
        fail(f"{SDPA} must be correct before it counts as written from scratch. {failure}")
    inputs = random_attention_inputs((2, 3), 5, 7, 4, 6, seed=50, device=default_device())
    mask = random_mask((2, 1, 5, 7), seed=51, device=default_device())
    assert_from_scratch(
        sdpa, SDPA, [inputs, {**inputs, "mask": mask}], ATTENTION_BUILTINS, "scaled dot-product attention"
    )


# shapes of the hidden tests: (leading axes, q_len, k_len, d_k, d_v), every size different within a case
_REFERENCE_SHAPES = (((2, 3), 5, 7, 4, 6), ((3,), 6, 9, 8, 5), ((), 4, 3, 2, 5))


def sdpa_against_reference(
    sdpa: Callable[..., Any],
    reference: Callable[..., Any],
    *,
    masked: bool = False,
    dtypes: tuple[torch.dtype, ...] = DTYPES,
    seed: int = 200,
) -> None:
    """Hidden test: sdpa matches the reference for several shapes, in each of ``dtypes``, on the device."""
    __tracebackhide__ = True
    device = default_device()
    for case, (lead, q_len, k_len, d_k, d_v) in enumerate(_REFERENCE_SHAPES):
        for dtype in dtypes:
            inputs: dict[str, Any] = {
                name: tensor.to(dtype)
                for name, tensor in random_attention_inputs(
                    lead, q_len, k_len, d_k, d_v, seed=seed + 10 * case, device=device
                ).items()
            }
            if masked:
                mask_shape = (*lead[:1], *([1] * len(lead[1:])), q_len, k_len)
                inputs["mask"] = random_mask(mask_shape, seed=seed + 10 * case + 5, device=device)
            truth, naive_errors = reference_answer(reference, inputs)
            _assert_sdpa(sdpa, inputs, *truth, dtype=dtype, naive_errors=naive_errors)


def sdpa_from_scratch_everywhere(sdpa: Callable[..., Any]) -> None:
    """Hidden test: no built-in attention on any path (every dtype, with and without a mask)."""
    __tracebackhide__ = True
    device = default_device()
    cases = []
    for dtype in DTYPES:
        inputs = {
            name: t.to(dtype)
            for name, t in random_attention_inputs((3,), 6, 9, 8, 5, seed=60, device=device).items()
        }
        cases += [inputs, {**inputs, "mask": random_mask((3, 6, 9), seed=61, device=device)}]
    assert_from_scratch(sdpa, SDPA, cases, ATTENTION_BUILTINS, "scaled dot-product attention")


# ==================================================================================================
# 3. the variance of q . k, by Monte Carlo


def relative_standard_error(d_k: int, n_samples: int) -> float:
    """Relative standard error of the sample variance of ``q . k`` for q, k ~ N(0, I_{d_k}).

    ``q . k`` is a sum of d_k independent products with variance 1 and fourth moment 9, so its fourth
    moment is ``3 d_k^2 + 6 d_k`` and the sample variance has variance about ``(2 d_k^2 + 6 d_k) / n``.
    """
    return math.sqrt((2 + 6 / d_k) / n_samples)


def _estimate(dot_product_variance: Callable[..., Any], **arguments: Any) -> float:
    __tracebackhide__ = True
    result = call(dot_product_variance, "dot_product_variance", **arguments)
    if isinstance(result, torch.Tensor) and result.numel() == 1:
        result = result.item()
    if isinstance(result, bool) or not isinstance(result, int | float):
        fail(f"{Call('dot_product_variance', arguments)} should return a float, got {type(result).__name__}.")
    return float(result)


def _variance_hint(estimate: float, d_k: int, n_samples: int, scaled: bool) -> str:
    """The likely cause of an estimate far from the theory, by the value it is close to."""
    target = 1.0 if scaled else float(d_k)
    spread = 5 * relative_standard_error(d_k, n_samples)  # relative tolerance of a full-size estimate
    candidates = [  # (value of a known mistake, relative tolerance, hint)
        (
            1.0,
            spread,
            "it looks like Var(q . k / sqrt(d_k)) (or the variance of one component): with "
            "scaled=False return the variance of q . k itself, about d_k",
        ),
        (
            float(d_k),
            spread,
            "the scaled flag is ignored: with scaled=True divide each dot product by sqrt(d_k)",
        ),
        (1.0 / d_k, spread, "the dot products are divided by d_k; the scaled version divides by sqrt(d_k)"),
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
        if value == target:
            continue
        if (value == 0.0 and abs(estimate) < 0.02 * target) or abs(estimate - value) <= relative * value:
            return hint
    return "compare your estimate with the theory: Var(q . k) = d_k, Var(q . k / sqrt(d_k)) = 1"


def _check_variance(dot_product_variance: Callable[..., Any], scaled: bool) -> None:
    __tracebackhide__ = True
    n_samples = 20_000
    for d_k in (16, 64, 256):
        theory = 1.0 if scaled else float(d_k)
        # five standard errors: a correct estimator fails with probability below 1e-6
        tolerance = 5 * relative_standard_error(d_k, n_samples) * theory
        arguments = {
            "d_k": d_k,
            "n_samples": n_samples,
            "scaled": scaled,
            "generator": seeded_generator(300 + d_k),
        }
        estimate = _estimate(dot_product_variance, **arguments)
        if not abs(estimate - theory) <= tolerance:
            fail(
                f"{Call('dot_product_variance', arguments)} returned {estimate:.5g}, but the theory gives "
                f"{theory:g} and {n_samples} samples should land within {tolerance:.3g} of it."
                f"\n  Likely cause: {_variance_hint(estimate, d_k, n_samples, scaled)}."
            )


def check_variance_unscaled(dot_product_variance: Callable[..., Any]) -> None:
    """The estimate of Var(q . k) is d_k, within five standard errors, for d_k = 16, 64, 256."""
    __tracebackhide__ = True
    _check_variance(dot_product_variance, scaled=False)


def check_variance_scaled(dot_product_variance: Callable[..., Any]) -> None:
    """The estimate of Var(q . k / sqrt(d_k)) is 1, within five standard errors, for d_k = 16, 64, 256."""
    __tracebackhide__ = True
    _check_variance(dot_product_variance, scaled=True)


def check_variance_is_estimate(
    dot_product_variance: Callable[..., Any], d_k: int = 32, n_samples: int = 2000
) -> None:
    """The result is an estimate: reproducible for one seed, varying across seeds as n_samples implies."""
    __tracebackhide__ = True
    arguments = {"d_k": d_k, "n_samples": n_samples, "scaled": False}
    first = _estimate(dot_product_variance, **arguments, generator=seeded_generator(7))
    again = _estimate(dot_product_variance, **arguments, generator=seeded_generator(7))
    if first != again:
        fail(
            "two calls with generators seeded alike returned different estimates "
            f"({first:.6g} and {again:.6g}).\n  Likely cause: some draws ignore the generator; pass "
            "generator=generator to every torch.randn call, so that results are reproducible."
        )
    estimates = torch.tensor(
        [
            _estimate(dot_product_variance, **arguments, generator=seeded_generator(seed))
            for seed in range(20)
        ],
        dtype=torch.float64,
    )
    if torch.unique(estimates).numel() == 1:
        fail(
            f"dot_product_variance returns {first:g} whatever the generator's seed: it should estimate the "
            "variance from random samples, not return the theoretical value."
        )
    expected_spread = relative_standard_error(d_k, n_samples) * d_k
    ratio = estimates.std().item() / expected_spread
    # the standard deviation of 20 estimates lies within [0.35, 3] times its expectation with
    # probability above 1 - 1e-6 for a correct estimator
    if not 0.35 <= ratio <= 3.0:
        fail(
            f"over 20 seeds the estimates of Var(q . k) for d_k={d_k}, n_samples={n_samples} vary with "
            f"standard deviation {estimates.std().item():.3g}, {ratio:.2g} times the {expected_spread:.3g} "
            f"that {n_samples} independent samples give.\n  Likely cause: the estimate does not use exactly "
            "n_samples independent (q, k) pairs."
        )
    _estimate(dot_product_variance, **arguments, generator=None)  # the global generator must work too


def variance_against_theory_everywhere(
    dot_product_variance: Callable[..., Any], scaled: bool, seed: int = 400
) -> None:
    """Hidden test: other d_k and sample sizes against the theory."""
    __tracebackhide__ = True
    for d_k, n_samples in ((1, 50_000), (8, 30_000), (100, 10_000), (512, 4_000)):
        theory = 1.0 if scaled else float(d_k)
        tolerance = 5 * relative_standard_error(d_k, n_samples) * theory
        arguments = {
            "d_k": d_k,
            "n_samples": n_samples,
            "scaled": scaled,
            "generator": seeded_generator(seed + d_k),
        }
        estimate = _estimate(dot_product_variance, **arguments)
        if not abs(estimate - theory) <= tolerance:
            fail(
                f"{Call('dot_product_variance', arguments)} returned {estimate:.5g}, not within "
                f"{tolerance:.3g} of {theory:g}.\n  Likely cause: "
                f"{_variance_hint(estimate, d_k, n_samples, scaled)}."
            )
