"""Checks of exercise ex01, attention as a soft lookup: kernel regression and single-head attention.

Each ``check_*`` function is the visible part of one test cell: it uses properties, known answers (the
three-row table of chapter 1) and PyTorch's built-ins, never the reference solutions, so a learner can run
it anywhere. Each ``*_against_reference`` function is a hidden test: it compares the learner's function
with the reference on random inputs where every axis has a different size, in several dtypes, on the
default device (CUDA when available).

Kernel regression is checked in float64 and float32 only: ``torch.cdist``, a natural way to compute the
distances, has no float16 kernel on the CPU, and a score must not depend on the grading machine. The
attention functions are checked in float64, float32, float16 and bfloat16.

As in every exercise, :func:`~attention_course.checks._harness.call` fails a learner's function that is,
or calls, the course's own answer (``solutions`` or ``attention_course.pooling``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
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
    reference_answer,
    unpack_output_and_weights,
)
from attention_course.device import default_device, seeded_generator

KERNEL_DTYPES = (torch.float64, torch.float32)
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
ATTENTION_BUILTINS = ("scaled_dot_product", "multi_head_attention", "multiheadattention")

# the table of chapter 1: three keys, their values, and queries between them
TABLE_KEYS = (51.0, 56.0, 58.0)
TABLE_VALUES = (40.0, 43.0, 48.0)
TABLE_QUERIES = (57.0, 56.0)

_KERNEL_HINTS: Sequence[tuple[Sequence[str], str]] = (
    (
        ('"cdist" not implemented',),
        "torch.cdist has no float16/bfloat16 kernel on the CPU: compute the squared distances with "
        "((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1) instead",
    ),
    (
        ("too many indices",),
        "1-D queries [m] and keys [n] are scalars: give them a feature axis first (queries[:, None], "
        "[m, 1]) so that scalars and vectors [m, d] go through the same code",
    ),
    (
        ("size of tensor", "must match the size", "cannot be multiplied", "mat1 and mat2", "shape"),
        "every query must be compared with every key: queries[:, None, :] - keys[None, :, :] has shape "
        "[m, n, d] (m queries, n keys, d features); sum the squares over the last axis to get [m, n]",
    ),
)

_NADARAYA_WATSON_HINTS: Sequence[tuple[Sequence[str], str]] = (
    (
        ("size of tensor", "must match the size", "cannot be multiplied", "mat1 and mat2", "size mismatch"),
        "the prediction is weights @ values, in this order: [m, n] @ [n] -> [m] and "
        "[m, n] @ [n, d_v] -> [m, d_v]; values @ weights, weights.T or weights * values do not fit when "
        "m != n",
    ),
    *_KERNEL_HINTS[:2],
)

_EINSUM_HINT = (
    ("number of subscripts", "einsum"),
    "an einsum equation with fixed axes works for one number of leading axes only: use an ellipsis, as in "
    "torch.einsum('...md,...nd->...mn', query, key)",
)
_MATMUL_ERRORS = (
    "size of tensor",
    "mat1 and mat2",
    "cannot be multiplied",
    "must match the size",
    "Expected size",
)


def _attention_hints(inputs: dict[str, Any]) -> Sequence[tuple[Sequence[str], str]]:
    """Likely causes of exceptions in cross- or self-attention, in the names of the function's arguments."""
    target, source = _side_names(inputs)
    return (
        _EINSUM_HINT,
        (
            _MATMUL_ERRORS,
            f"shapes do not fit. The projections are x @ w (w is [d_model, d_k], so not x @ w.T nor "
            f"F.linear(x, w)): query = {target} @ w_q is [..., m, d_k], key = {source} @ w_k is "
            f"[..., n, d_k] and value = {source} @ w_v is [..., n, d_v]; the scores are "
            "query @ key.transpose(-2, -1), [..., m, n] (key.T or key.transpose(0, 1) also move the "
            "leading axes)",
        ),
    )


# ==================================================================================================
# 1. Gaussian kernel weights

KERNEL = "gaussian_kernel_weights"


def _features(x: torch.Tensor) -> torch.Tensor:
    return x[:, None] if x.dim() == 1 else x  # [m] -> [m, 1]; [m, d] unchanged


def _squared_distance(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``||q_i - k_j||^2`` in float64, ``[m, n]``, from the differences (no cancellation)."""
    q, k = _features(queries.double()), _features(keys.double())
    return ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1)  # [m, n, d] -> [m, n]


def _kernel_answer(queries: torch.Tensor, keys: torch.Tensor, bandwidth: float) -> torch.Tensor:
    """The right weights in float64: a softmax over the keys of ``-||q - k||^2 / (2 h^2)``."""
    return torch.softmax(-_squared_distance(queries, keys) / (2 * bandwidth**2), dim=-1)


def _kernel_mistakes(queries: torch.Tensor, keys: torch.Tensor, bandwidth: float) -> Iterator[Mistake]:
    """Known wrong kernel weights, in float64, each with the hint that names it."""
    squared = _squared_distance(queries, keys)  # [m, n]
    h = bandwidth
    right = -squared / (2 * h**2)
    yield Mistake(
        "the exponent has the wrong sign: the weights must decrease with the distance, so the scores are "
        "-||q - k||^2 / (2 h^2), with a minus sign",
        torch.softmax(-right, dim=-1),
    )
    yield Mistake(
        "the softmax runs over the queries (dim=0); it must run over the keys (dim=-1), so that each "
        "query's row is a distribution over the keys",
        torch.softmax(right, dim=0),
    )
    yield Mistake(
        "the kernel values exp(-||q - k||^2 / (2 h^2)) are not normalised: divide each row by its sum "
        "over the keys (or take a softmax of the scores)",
        torch.exp(right),
    )
    yield Mistake(
        "the 1/2 of the Gaussian kernel is missing: divide the squared distance by 2 * bandwidth**2",
        torch.softmax(-squared / h**2, dim=-1),
    )
    yield Mistake(
        "the squared distance is divided by (2 h)^2 = 4 h^2; the denominator is 2 * bandwidth**2",
        torch.softmax(-squared / (2 * h) ** 2, dim=-1),
    )
    yield Mistake(
        "the distance is not squared: the Gaussian kernel uses ||q - k||^2, the sum of the squared "
        "differences, not the distance ||q - k||",
        torch.softmax(-squared.sqrt() / (2 * h**2), dim=-1),
    )
    if h != 1:
        yield Mistake(
            "the bandwidth is not squared: divide the squared distance by 2 * bandwidth**2, not by "
            "2 * bandwidth",
            torch.softmax(-squared / (2 * h), dim=-1),
        )
        yield Mistake(
            "the bandwidth is ignored: these are the weights of h = 1; divide the squared distance by "
            "2 * bandwidth**2",
            torch.softmax(-squared / 2, dim=-1),
        )
        yield Mistake(
            "the squared distance is multiplied by h^2 instead of divided by it: in Python "
            "`x / 2 * h**2` means (x / 2) * h**2; write x / (2 * h**2)",
            torch.softmax(-squared * h**2 / 2, dim=-1),
        )
    q, k = _features(queries.double()), _features(keys.double())
    yield Mistake(
        "the scores are dot products q . k / h^2: they equal the kernel's scores only when all keys have "
        "the same norm (chapter 1); use -||q - k||^2 / (2 h^2)",
        torch.softmax(q @ k.T / h**2, dim=-1),
    )


def _kernel_shape_hints(m: int, n: int, d: int | None) -> dict[tuple[int, ...], str]:
    hints = {
        (n, m): "the weights are [n, m]: they must have one row per query and one column per key, "
        "[m, n]; compute queries[:, None, :] - keys[None, :, :]",
        (m,): "one number per query: the weights keep one column per key, [m, n] (no sum over the keys)",
        (n,): "one number per key: the weights keep one row per query, [m, n]",
    }
    if d is not None:
        hints[(m, n, d)] = (
            "the squared differences are not summed over the feature axis: ||q - k||^2 is the sum over "
            "the d features, so sum(-1) turns [m, n, d] into [m, n]"
        )
        hints[(n, m, d)] = "the squared differences are neither summed over the features nor [m, n]"
    return hints


def _assert_kernel_weights(
    gaussian_kernel_weights: Callable[..., Any],
    queries: torch.Tensor,
    keys: torch.Tensor,
    bandwidth: float,
    *,
    expected: torch.Tensor | None = None,
    naive_error: float = 0.0,
    note: str | None = None,
) -> None:
    """Call the learner's function and compare with ``expected`` (default: the formula in float64)."""
    __tracebackhide__ = True
    arguments = {"queries": queries, "keys": keys, "bandwidth": bandwidth}
    result = call(gaussian_kernel_weights, KERNEL, extra_hints=_KERNEL_HINTS, **arguments)
    d = None if queries.dim() == 1 else queries.size(-1)
    assert_tensor(
        result,
        _kernel_answer(queries, keys, bandwidth) if expected is None else expected,
        dtype=queries.dtype,
        naive_error=naive_error,
        what="the weights",
        call_text=str(Call(KERNEL, arguments)),
        mistakes=lambda: _kernel_mistakes(queries, keys, bandwidth),
        shape_hints=_kernel_shape_hints(queries.size(0), keys.size(0), d),
        note=note,
    )


def _kernel_inputs(
    m: int, n: int, d: int | None, *, seed: int, device: torch.device, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random queries ``[m]`` / ``[m, d]`` and keys ``[n]`` / ``[n, d]`` spread over a few bandwidths."""
    feature = () if d is None else (d,)
    queries = 1.5 * randn((m, *feature), seed=seed, device=device)
    keys = 1.5 * randn((n, *feature), seed=seed + 1, device=device)
    return queries.to(dtype), keys.to(dtype)


def check_kernel_weights_rows_sum_to_one(gaussian_kernel_weights: Callable[..., Any]) -> None:
    """Weights are [m, n] for scalars and vectors, in the inputs' dtype, non-negative, rows summing to 1."""
    __tracebackhide__ = True
    device = default_device()
    m, n, d = 7, 5, 3  # every size different, so that a swapped axis cannot pass
    cases = [
        _kernel_inputs(m, n, None, seed=10, device=device),  # scalars [m], [n]
        _kernel_inputs(m, n, d, seed=12, device=device, dtype=torch.float32),  # vectors [m, d], [n, d]
        _kernel_inputs(m, n, d, seed=14, device=device),
    ]
    for queries, keys in cases:
        arguments = {"queries": queries, "keys": keys}
        call_text = str(Call(KERNEL, arguments))
        weights = call(gaussian_kernel_weights, KERNEL, extra_hints=_KERNEL_HINTS, **arguments)
        d_or_none = None if queries.dim() == 1 else d
        assert_like(
            weights,
            shape=(m, n),
            dtype=queries.dtype,
            device=queries.device,
            what="the weights",
            call_text=call_text,
            shape_hints=_kernel_shape_hints(m, n, d_or_none),
        )
        values = weights.double()
        if not torch.isfinite(values).all():
            fail(f"the weights of {call_text} contain NaN or inf for ordinary inputs.")
        if (values < 0).any():
            fail(
                f"the weights of {call_text} have negative values; weights are non-negative.\n  Likely "
                "cause: the scores -||q - k||^2 / (2 h^2) are returned without the exponential (softmax)."
            )
        rows = values.sum(dim=-1)  # [m]
        if not torch.allclose(rows, torch.ones_like(rows), atol=1e-5):
            columns = values.sum(dim=0)  # [n]
            if torch.allclose(columns, torch.ones_like(columns), atol=1e-5):
                hint = (
                    "each column sums to 1: the softmax runs over the queries (dim=0); it must run over "
                    "the keys (dim=-1)"
                )
            else:
                hint = "the kernel values must be divided by their sum over the keys (a softmax over dim=-1)"
            fail(
                f"the rows of the weights of {call_text} do not sum to 1 (sums range from "
                f"{rows.min().item():.4g} to {rows.max().item():.4g}).\n  Likely cause: {hint}."
            )


def check_kernel_weights_table(gaussian_kernel_weights: Callable[..., Any]) -> None:
    """The table of chapter 1 (keys 51, 56, 58), queries 57 and 56, h = 1: known weights (float64)."""
    __tracebackhide__ = True
    device = default_device()
    queries = torch.tensor(TABLE_QUERIES, dtype=torch.float64, device=device)  # [m] with m = 2
    keys = torch.tensor(TABLE_KEYS, dtype=torch.float64, device=device)  # [n] with n = 3
    # scores -(q - k)^2 / 2: (-18, -0.5, -0.5) for q = 57 and (-12.5, 0, -2) for q = 56
    scores = torch.tensor([[-18.0, -0.5, -0.5], [-12.5, 0.0, -2.0]], dtype=torch.float64)
    exp = scores.exp()
    expected = (exp / exp.sum(dim=-1, keepdim=True)).to(device)  # row 0: (1.255e-8, 1/2, 1/2)
    _assert_kernel_weights(
        gaussian_kernel_weights,
        queries,
        keys,
        1.0,
        expected=expected,
        note="For q = 57 the scores -(q - k)^2 / 2 are (-18, -0.5, -0.5) and the weights "
        "(1.255e-8, 1/2, 1/2).",
    )


def check_kernel_weights_bandwidth(gaussian_kernel_weights: Callable[..., Any]) -> None:
    """Scalar and vector inputs, bandwidths 0.6 and 3: softmax_j(-||q_i - k_j||^2 / (2 h^2)) (float64)."""
    __tracebackhide__ = True
    device = default_device()
    for seed, d in ((20, None), (22, 3)):
        queries, keys = _kernel_inputs(6, 9, d, seed=seed, device=device)
        for bandwidth in (0.6, 3.0):
            _assert_kernel_weights(gaussian_kernel_weights, queries, keys, bandwidth)


def check_kernel_weights_far_query(gaussian_kernel_weights: Callable[..., Any]) -> None:
    """Queries far from every key get finite weights, all on the nearest key (float64 and float32)."""
    __tracebackhide__ = True
    device = default_device()
    keys = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.5], dtype=torch.float64, device=device)  # [n]
    queries = torch.tensor([-100.0, 60.0, 1000.0], dtype=torch.float64, device=device)  # [m]
    vector_keys = randn((4, 2), seed=30, device=device)  # [n, d]
    vector_queries = 80.0 + randn((3, 2), seed=31, device=device)  # [m, d], far from every key
    for dtype in KERNEL_DTYPES:
        for q, k in ((queries, keys), (vector_queries, vector_keys)):
            q, k = q.to(dtype), k.to(dtype)
            arguments = {"queries": q, "keys": k, "bandwidth": 1.0}
            call_text = str(Call(KERNEL, arguments))
            weights = call(gaussian_kernel_weights, KERNEL, extra_hints=_KERNEL_HINTS, **arguments)
            if isinstance(weights, torch.Tensor) and weights.shape == (q.size(0), k.size(0)):
                if not torch.isfinite(weights).all():
                    fail(
                        f"the weights of {call_text} contain NaN or inf for queries far from every key.\n"
                        "  Likely cause: exp(-||q - k||^2 / (2 h^2)) underflows to 0 for every key when the "
                        "query is far from all of them, and 0 / 0 is NaN. Subtract the largest score of "
                        "each row before exp (a softmax does not change when a constant is added to a "
                        "row), or use torch.softmax."
                    )
            _assert_kernel_weights(
                gaussian_kernel_weights,
                q,
                k,
                1.0,
                note="A query far from every key puts (almost) all its weight on the nearest key.",
            )


def kernel_weights_against_reference(
    gaussian_kernel_weights: Callable[..., Any],
    reference: Callable[..., Any],
    *,
    far: bool = False,
    dtypes: tuple[torch.dtype, ...] = KERNEL_DTYPES,
    seed: int = 100,
) -> None:
    """Hidden test: the weights match the reference for scalar and vector inputs and several bandwidths.

    With ``far``, the queries are moved 40 bandwidths away from the keys, where plain exponentials
    underflow for every key.
    """
    __tracebackhide__ = True
    device = default_device()
    for case, (m, n, d, bandwidth) in enumerate(((7, 4, None, 0.7), (5, 8, 3, 1.3), (3, 6, 2, 0.4))):
        for dtype in dtypes:
            queries, keys = _kernel_inputs(m, n, d, seed=seed + 10 * case, device=device)
            if far:
                queries = queries + 40 * bandwidth
            queries, keys = queries.to(dtype), keys.to(dtype)
            truth = reference(queries.double(), keys.double(), bandwidth)
            naive_error = (reference(queries, keys, bandwidth).double() - truth).abs().max().item()
            _assert_kernel_weights(
                gaussian_kernel_weights, queries, keys, bandwidth, expected=truth, naive_error=naive_error
            )


# ==================================================================================================
# 2. Nadaraya-Watson kernel regression

NADARAYA_WATSON = "nadaraya_watson"


def _nadaraya_watson_mistakes(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bandwidth: float
) -> Iterator[Mistake]:
    """Known wrong predictions, in float64, each with the hint that names it."""
    v = values.double()
    distance = _squared_distance(queries, keys).sqrt()  # [m, n]
    yield Mistake(
        "the weights grow with the distance (|q - k| / sum |q - k|, the tempting mistake of chapter 1): "
        "the farthest key weighs most; use the Gaussian kernel weights, which decrease with the distance",
        distance / distance.sum(dim=-1, keepdim=True) @ v,
    )
    yield Mistake(
        "these are inverse-distance weights (1/|q - k|, normalised): use the Gaussian kernel weights, a "
        "softmax of -||q - k||^2 / (2 h^2)",
        (1 / distance) / (1 / distance).sum(dim=-1, keepdim=True) @ v,
    )
    if bandwidth != 1:
        yield Mistake(
            "the bandwidth is not passed on: these are the predictions of h = 1, the default of "
            "gaussian_kernel_weights; call gaussian_kernel_weights(queries, keys, bandwidth)",
            _kernel_answer(queries, keys, 1.0) @ v,
        )
    yield Mistake(
        "every value gets the same weight (the prediction is the mean of the values): the weights must "
        "come from the kernel",
        v.mean(dim=0).expand_as(_kernel_answer(queries, keys, bandwidth) @ v),
    )
    for mistake in _kernel_mistakes(queries, keys, bandwidth):
        yield Mistake(f"the kernel weights are wrong: {mistake.hint}", mistake.result @ v)


def _nadaraya_watson_shape_hints(m: int, n: int, d_v: int | None) -> dict[tuple[int, ...], str]:
    hints = {
        (m, n): "the weights are multiplied by the values element by element but not summed over the "
        "keys: weights @ values does both",
        (n, m): "the result has one entry per key: the prediction is weights @ values, [m, n] @ [n]",
    }
    if d_v is None:
        hints[(m, 1)] = (
            "for values [n] the prediction is [m]: a value axis added to the values ([n, 1]) must be "
            "removed again (or use weights @ values directly)"
        )
    else:
        hints[(m,)] = "the value axis d_v was summed away: [m, n] @ [n, d_v] gives [m, d_v]"
        hints[(m, n, d_v)] = "the weighted values are not summed over the keys: use weights @ values"
    return hints


def _assert_nadaraya_watson(
    nadaraya_watson: Callable[..., Any],
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bandwidth: float,
    *,
    expected: torch.Tensor | None = None,
    naive_error: float = 0.0,
    note: str | None = None,
) -> None:
    __tracebackhide__ = True
    arguments = {"queries": queries, "keys": keys, "values": values, "bandwidth": bandwidth}
    result = call(nadaraya_watson, NADARAYA_WATSON, extra_hints=_NADARAYA_WATSON_HINTS, **arguments)
    if expected is None:
        expected = _kernel_answer(queries, keys, bandwidth) @ values.double()  # [m] or [m, d_v]
    d_v = None if values.dim() == 1 else values.size(-1)
    assert_tensor(
        result,
        expected,
        dtype=queries.dtype,
        naive_error=naive_error,
        what="the prediction",
        call_text=str(Call(NADARAYA_WATSON, arguments)),
        mistakes=lambda: _nadaraya_watson_mistakes(queries, keys, values, bandwidth),
        shape_hints=_nadaraya_watson_shape_hints(queries.size(0), keys.size(0), d_v),
        note=note,
    )


def _regression_inputs(
    m: int,
    n: int,
    d: int | None,
    d_v: int | None,
    *,
    seed: int,
    device: torch.device,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    queries, keys = _kernel_inputs(m, n, d, seed=seed, device=device)
    values = randn((n,) if d_v is None else (n, d_v), seed=seed + 2, device=device)
    return queries.to(dtype), keys.to(dtype), values.to(dtype)


def check_nadaraya_watson_table(nadaraya_watson: Callable[..., Any]) -> None:
    """The table of chapter 1 with h = 1: the query 57 gives 45.5, the query 56 about 43.6 (float64)."""
    __tracebackhide__ = True
    device = default_device()
    queries = torch.tensor(TABLE_QUERIES, dtype=torch.float64, device=device)  # [m]: 57, 56
    keys = torch.tensor(TABLE_KEYS, dtype=torch.float64, device=device)  # [n]
    values = torch.tensor(TABLE_VALUES, dtype=torch.float64, device=device)  # [n]
    # scores -(q - k)^2 / 2: (-18, -0.5, -0.5) for q = 57, weights (1.255e-8, 1/2, 1/2); (-12.5, 0, -2) for 56
    scores = torch.tensor([[-18.0, -0.5, -0.5], [-12.5, 0.0, -2.0]], dtype=torch.float64)
    weights = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)  # [m, n]
    expected = (weights @ torch.tensor(TABLE_VALUES, dtype=torch.float64)).to(device)  # [m]
    note = (
        "The query 57 is halfway between the keys 56 and 58: it gets (43 + 48) / 2 = 45.5, less 5.5 times "
        "the weight 1.255e-8 of the key 51."
    )
    # the query 57 alone first (the seeds' example), then with the query 56, which equals a key
    _assert_nadaraya_watson(nadaraya_watson, queries[:1], keys, values, 1.0, expected=expected[:1], note=note)
    arguments = {"queries": queries, "keys": keys, "values": values, "bandwidth": 1.0}
    prediction = call(nadaraya_watson, NADARAYA_WATSON, extra_hints=_NADARAYA_WATSON_HINTS, **arguments)
    if isinstance(prediction, torch.Tensor) and not torch.isfinite(prediction).all():
        fail(
            f"the prediction of {Call(NADARAYA_WATSON, arguments)} contains NaN or inf for the query 56, "
            "which equals a key.\n  Likely cause: weights built from 1 / |q - k| divide by 0 there; the "
            "Gaussian kernel exp(-(q - k)^2 / (2 h^2)) is finite everywhere."
        )
    _assert_nadaraya_watson(nadaraya_watson, queries, keys, values, 1.0, expected=expected, note=note)


def check_nadaraya_watson_shapes(nadaraya_watson: Callable[..., Any]) -> None:
    """Values [n] give predictions [m] and values [n, d_v] give [m, d_v], for scalar and vector keys."""
    __tracebackhide__ = True
    device = default_device()
    m, n, d, d_v = 6, 9, 3, 4  # every size different
    cases = (
        _regression_inputs(m, n, None, None, seed=40, device=device),
        _regression_inputs(m, n, None, d_v, seed=43, device=device),
        _regression_inputs(m, n, d, None, seed=46, device=device, dtype=torch.float32),
        _regression_inputs(m, n, d, d_v, seed=49, device=device, dtype=torch.float32),
    )
    queries, keys, values = cases[0]
    for queries, keys, values in cases:
        arguments = {"queries": queries, "keys": keys, "values": values}
        prediction = call(nadaraya_watson, NADARAYA_WATSON, extra_hints=_NADARAYA_WATSON_HINTS, **arguments)
        d_v_or_none = None if values.dim() == 1 else d_v
        assert_like(
            prediction,
            shape=(m,) if d_v_or_none is None else (m, d_v),
            dtype=queries.dtype,
            device=queries.device,
            what="the prediction",
            call_text=str(Call(NADARAYA_WATSON, arguments)),
            shape_hints=_nadaraya_watson_shape_hints(m, n, d_v_or_none),
        )


def check_nadaraya_watson_bandwidth(nadaraya_watson: Callable[..., Any]) -> None:
    """Bandwidths 0.6 and 3, scalar and vector keys and values: sum_j w_ij v_j with the kernel weights."""
    __tracebackhide__ = True
    device = default_device()
    cases = (
        _regression_inputs(6, 9, None, None, seed=50, device=device),
        _regression_inputs(6, 9, 3, 4, seed=53, device=device),
    )
    queries, keys, values = cases[0]
    # a known answer first: constant values are predicted exactly, whatever the weights
    constant = torch.full_like(values, 2.5)
    _assert_nadaraya_watson(
        nadaraya_watson,
        queries,
        keys,
        constant,
        0.6,
        expected=torch.full((6,), 2.5, dtype=torch.float64, device=device),
        note="With every value equal to 2.5, a weighted average (weights summing to 1) is 2.5.",
    )
    for queries, keys, values in cases:
        for bandwidth in (0.6, 3.0):
            _assert_nadaraya_watson(nadaraya_watson, queries, keys, values, bandwidth)


def nadaraya_watson_against_reference(
    nadaraya_watson: Callable[..., Any],
    reference: Callable[..., Any],
    *,
    dtypes: tuple[torch.dtype, ...] = KERNEL_DTYPES,
    seed: int = 300,
) -> None:
    """Hidden test: predictions match the reference for scalar and vector keys and values, several h."""
    __tracebackhide__ = True
    device = default_device()
    shapes = ((7, 4, None, None, 0.7), (5, 8, 3, 2, 1.3), (3, 6, 2, None, 0.4), (4, 5, None, 3, 2.2))
    for case, (m, n, d, d_v, bandwidth) in enumerate(shapes):
        for dtype in dtypes:
            queries, keys, values = _regression_inputs(m, n, d, d_v, seed=seed + 10 * case, device=device)
            queries, keys, values = queries.to(dtype), keys.to(dtype), values.to(dtype)
            truth = reference(queries.double(), keys.double(), values.double(), bandwidth)
            naive_error = (reference(queries, keys, values, bandwidth).double() - truth).abs().max().item()
            _assert_nadaraya_watson(
                nadaraya_watson,
                queries,
                keys,
                values,
                bandwidth,
                expected=truth,
                naive_error=naive_error,
            )


# ==================================================================================================
# 3. single-head cross-attention and self-attention

CROSS = "cross_attention"
SELF = "self_attention"


def _attention_inputs(
    lead: tuple[int, ...],
    m: int,
    n: int,
    d_model: int,
    d_k: int,
    d_v: int,
    *,
    seed: int,
    device: torch.device,
    dtype: torch.dtype = torch.float64,
) -> dict[str, torch.Tensor]:
    """Inputs of cross_attention; projections of variance 1/d_model keep the scores of order 1."""
    scale = 1 / math.sqrt(d_model)
    inputs = {
        "x_q": randn((*lead, m, d_model), seed=seed, device=device),
        "x_kv": randn((*lead, n, d_model), seed=seed + 1, device=device),
        "w_q": scale * randn((d_model, d_k), seed=seed + 2, device=device),
        "w_k": scale * randn((d_model, d_k), seed=seed + 3, device=device),
        "w_v": scale * randn((d_model, d_v), seed=seed + 4, device=device),
    }
    return {name: tensor.to(dtype) for name, tensor in inputs.items()}


def _self_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inputs of self_attention from those of cross_attention: the source sequence as ``x``."""
    return {"x": inputs["x_kv"], **{name: inputs[name] for name in ("w_q", "w_k", "w_v")}}


def _side_names(inputs: dict[str, Any]) -> tuple[str, str]:
    """The names of the arguments that queries, and keys and values, come from."""
    return ("x", "x") if "x" in inputs else ("x_q", "x_kv")


def _sides(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_q, x_kv)`` of cross- or self-attention inputs."""
    if "x" in inputs:
        return inputs["x"], inputs["x"]
    return inputs["x_q"], inputs["x_kv"]


def _attention_answer(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The right (output, weights) in float64, from PyTorch's SDPA and softmax."""
    x_q, x_kv = (x.double() for x in _sides(inputs))
    w_q, w_k, w_v = (inputs[name].double() for name in ("w_q", "w_k", "w_v"))
    query, key, value = x_q @ w_q, x_kv @ w_k, x_kv @ w_v  # [..., m, d_k], [..., n, d_k], [..., n, d_v]
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.size(-1)), dim=-1)
    return F.scaled_dot_product_attention(query, key, value), weights


def _attention_weight_mistakes(inputs: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """Known wrong attention weights, in float64, each with the hint that names it."""
    x_q, x_kv = (x.double() for x in _sides(inputs))
    target, source = _side_names(inputs)
    w_q, w_k, w_v = (inputs[name].double() for name in ("w_q", "w_k", "w_v"))
    d_model, d_k, d_v = w_q.size(0), w_q.size(1), w_v.size(1)
    query, key = x_q @ w_q, x_kv @ w_k
    raw = query @ key.transpose(-2, -1)  # [..., m, n]
    scaled = raw / math.sqrt(d_k)
    yield (
        "the scores are not scaled: divide query @ key^T by sqrt(d_k) (Vaswani et al. 2017, eq. 1)",
        torch.softmax(raw, dim=-1),
    )
    yield (
        "the scores are divided by d_k; the scale is 1/sqrt(d_k) (dividing both the queries and the keys "
        "by sqrt(d_k) also divides the scores by d_k)",
        torch.softmax(raw / d_k, dim=-1),
    )
    if d_v != d_k:
        yield (
            "the scores are divided by sqrt(d_v), the width of the values; the scale is 1/sqrt(d_k), "
            "where d_k = w_q.size(-1) is the width of the queries and keys",
            torch.softmax(raw / math.sqrt(d_v), dim=-1),
        )
    if d_model != d_k:
        yield (
            "the scores are divided by sqrt(d_model), the width of the inputs; the scale is 1/sqrt(d_k), "
            "the width of the queries and keys after the projection (w_q.size(-1), query.size(-1))",
            torch.softmax(raw / math.sqrt(d_model), dim=-1),
        )
    yield (
        "the scores are multiplied by sqrt(d_k) instead of divided by it",
        torch.softmax(raw * d_k**0.5, -1),
    )
    yield (
        "the softmax runs over the query axis (dim=-2); it must run over the keys (dim=-1), so that each "
        "query's weights sum to 1",
        torch.softmax(scaled, dim=-2),
    )
    yield (
        "the scale is applied after the softmax; divide the scores by sqrt(d_k) before it",
        torch.softmax(raw, dim=-1) / math.sqrt(d_k),
    )
    yield (
        f"w_q and w_k are swapped: the queries are {target} @ w_q and the keys {source} @ w_k",
        torch.softmax((x_q @ w_k) @ (x_kv @ w_q).transpose(-2, -1) / math.sqrt(d_k), dim=-1),
    )
    yield (
        f"w_q projects both the queries and the keys: the keys are {source} @ w_k",
        torch.softmax((x_q @ w_q) @ (x_kv @ w_q).transpose(-2, -1) / math.sqrt(d_k), dim=-1),
    )
    yield (
        f"w_k projects both the queries and the keys: the queries are {target} @ w_q",
        torch.softmax((x_q @ w_k) @ (x_kv @ w_k).transpose(-2, -1) / math.sqrt(d_k), dim=-1),
    )
    m, n = raw.shape[-2:]
    causal = torch.ones(m, n, dtype=torch.bool, device=raw.device).tril()  # [m, n]
    yield (
        "a causal mask is applied: this attention has no mask, every query sees every key (a causal mask "
        "belongs to a decoder's self-attention, chapter 3)",
        torch.softmax(scaled.masked_fill(~causal, float("-inf")), dim=-1),
    )


def _attention_mistakes(inputs: dict[str, torch.Tensor], part: str) -> Iterator[Mistake]:
    value = _sides(inputs)[1].double() @ inputs["w_v"].double()  # [..., n, d_v]
    for hint, weights in _attention_weight_mistakes(inputs):
        yield Mistake(hint, weights if part == "weights" else weights @ value)


def _attention_shape_hints(
    lead: tuple[int, ...], m: int, n: int, d_model: int, d_k: int, d_v: int, source: str = "x_kv"
) -> dict[str, dict[tuple[int, ...], str]]:
    """Likely causes of wrong shapes; ``source`` names the argument that keys and values come from."""
    output = {
        (*lead, m, n): "the first element returned must be the output (weights @ value); return "
        "(output, weights) in this order",
        (*lead, m, d_k): f"the output has the width d_k of the keys: the values are {source} @ w_v, and the "
        "output is weights @ value",
        (*lead, m, d_model): f"the values are not projected: the output is weights @ ({source} @ w_v), not "
        f"weights @ {source}",
        (*lead, n, d_v): "the output has one row per source position: the queries come from x_q (the "
        "target, m positions), the keys and values from x_kv (the source, n positions)",
    }
    weights = {
        (*lead, n, m): "the weights are [..., n, m]: the queries come from x_q (m positions) and the keys "
        "from x_kv (n positions), and the scores are query @ key^T, [..., m, n]",
        (*lead, m, d_v): "the weights have the width of the values: return (output, weights) in this order",
        (*lead, m, m): f"the scores compare the queries with themselves: the keys are {source} @ w_k",
    }
    return {"output": output, "weights": weights}


def _assert_attention(
    fn: Callable[..., Any],
    name: str,
    inputs: dict[str, torch.Tensor],
    expected_output: torch.Tensor,
    expected_weights: torch.Tensor,
    *,
    dtype: torch.dtype,
    naive_errors: tuple[float, float] = (0.0, 0.0),
    note: str | None = None,
) -> None:
    """Call ``fn(**inputs)`` and compare the weights, then the output, diagnosing known mistakes."""
    __tracebackhide__ = True
    call_text = str(Call(name, inputs))
    output, weights = unpack_output_and_weights(
        call(fn, name, extra_hints=_attention_hints(inputs), **inputs), call_text
    )
    x_q, x_kv = _sides(inputs)
    lead, m, n = tuple(expected_output.shape[:-2]), x_q.size(-2), x_kv.size(-2)
    d_model, d_k, d_v = inputs["w_q"].size(0), inputs["w_q"].size(1), inputs["w_v"].size(1)
    assert_output_and_weights(
        output,
        weights,
        expected_output,
        expected_weights,
        call_text=call_text,
        dtype=dtype,
        naive_errors=naive_errors,
        shape_hints=_attention_shape_hints(lead, m, n, d_model, d_k, d_v, _side_names(inputs)[1]),
        mistakes=lambda part: _attention_mistakes(inputs, part),
        note=note,
    )


def _call_attention(
    fn: Callable[..., Any], name: str, inputs: dict[str, torch.Tensor], call_text: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Call ``fn(**inputs)``; fail unless (output, weights) have the right shapes, dtype and device."""
    __tracebackhide__ = True
    output, weights = unpack_output_and_weights(
        call(fn, name, extra_hints=_attention_hints(inputs), **inputs), call_text
    )
    x_q, x_kv = _sides(inputs)
    lead, m, n = tuple(x_q.shape[:-2]), x_q.size(-2), x_kv.size(-2)
    d_model, d_k, d_v = inputs["w_q"].size(0), inputs["w_q"].size(1), inputs["w_v"].size(1)
    hints = _attention_shape_hints(lead, m, n, d_model, d_k, d_v, _side_names(inputs)[1])
    for part, actual, shape in (("output", output, (*lead, m, d_v)), ("weights", weights, (*lead, m, n))):
        assert_like(
            actual,
            shape=shape,
            dtype=x_q.dtype,
            device=x_q.device,
            what=f"the {part}",
            call_text=call_text,
            shape_hints=hints[part],
        )
    return output, weights


def _assert_attention_shapes(
    fn: Callable[..., Any], name: str, make_inputs: Callable[[tuple[int, ...], torch.dtype], dict]
) -> None:
    """Shapes, dtype and device of (output, weights) for 0, 1 and 2 leading axes, in three dtypes."""
    __tracebackhide__ = True
    for lead, dtype in (((), torch.float32), ((2,), torch.float64), ((2, 9), torch.float16)):
        inputs = make_inputs(lead, dtype)
        try:
            _call_attention(fn, name, inputs, str(Call(name, inputs)))
        except CheckFailure as failure:
            if lead and "raised" in str(failure):
                fail(
                    f"{failure}\n  It works without leading axes but not with {len(lead)}: key.T reverses "
                    "*all* axes and key.transpose(0, 1) swaps the batch axis; use key.transpose(-2, -1) "
                    "(or key.mT) to swap only the last two, and index axes from the end."
                )
            raise


# sizes of the visible checks: m, n, d_model, d_k, d_v; with leading axes (2,) or (2, 9), all different
_SIZES = (5, 7, 6, 4, 3)


def check_cross_attention_shapes(cross_attention: Callable[..., Any]) -> None:
    """(output, weights) are [..., m, d_v] and [..., m, n] with 0, 1, 2 leading axes, in the inputs' dtype."""
    __tracebackhide__ = True
    device = default_device()
    _assert_attention_shapes(
        cross_attention,
        CROSS,
        lambda lead, dtype: _attention_inputs(lead, *_SIZES, seed=60, device=device, dtype=dtype),
    )


def check_cross_attention_matches_formula(cross_attention: Callable[..., Any]) -> None:
    """softmax(Q K^T / sqrt(d_k)) V with Q = x_q W_Q, K = x_kv W_K, V = x_kv W_V, against PyTorch."""
    __tracebackhide__ = True
    device = default_device()
    # a known answer: identical source positions get equal weights, and the output is their value
    inputs = _attention_inputs((2,), *_SIZES, seed=70, device=device)
    same = {**inputs, "x_kv": inputs["x_kv"][..., :1, :].expand(2, 7, 6).clone()}
    weights = torch.full((2, 5, 7), 1 / 7, dtype=torch.float64, device=device)
    output = (same["x_kv"][..., :1, :] @ same["w_v"]).expand(2, 5, 3)
    _assert_attention(
        cross_attention,
        CROSS,
        same,
        output,
        weights,
        dtype=torch.float64,
        note="When every source position is the same, every weight is 1/n and the output is that "
        "position's value.",
    )
    for lead, seed in (((2,), 71), ((2, 9), 72)):
        inputs = _attention_inputs(lead, *_SIZES, seed=seed, device=device)
        _assert_attention(cross_attention, CROSS, inputs, *_attention_answer(inputs), dtype=torch.float64)


def _permutation(size: int, seed: int, device: torch.device) -> torch.Tensor:
    """A random permutation of ``range(size)`` that moves every position, so nothing passes by luck."""
    order = torch.randperm(size, generator=seeded_generator(seed))
    permutation = torch.empty_like(order)
    permutation[order] = torch.roll(order, -1)  # one cycle through a random order: no fixed point
    return permutation.to(device)


def _assert_close_to_own(
    actual: Any, expected: torch.Tensor, *, what: str, call_text: str, meaning: str, hint: str
) -> None:
    """Compare two results of the learner's own function (a property, not a known answer)."""
    __tracebackhide__ = True
    assert_like(
        actual,
        shape=expected.shape,
        dtype=expected.dtype,
        device=expected.device,
        what=what,
        call_text=call_text,
    )
    if not torch.isfinite(actual).all() or not torch.allclose(
        actual.double(), expected.double(), rtol=1e-5, atol=1e-6
    ):
        largest = (actual.double() - expected.double()).abs().nan_to_num(float("inf")).max().item()
        fail(f"{what} of {call_text} {meaning} (largest difference {largest:.3g}).\n  Likely cause: {hint}.")


def check_cross_attention_source_permutation(
    cross_attention: Callable[..., Any], lead: tuple[int, ...] = (2,), seed: int = 80
) -> None:
    """Permuting the source positions (keys and values together) leaves the output unchanged (float64)."""
    __tracebackhide__ = True
    device = default_device()
    m, n, d_model, d_k, d_v = _SIZES
    inputs = _attention_inputs(lead, m, n, d_model, d_k, d_v, seed=seed, device=device)
    output, weights = _call_attention(cross_attention, CROSS, inputs, str(Call(CROSS, inputs)))
    permutation = _permutation(n, seed, device)
    shuffled = {**inputs, "x_kv": inputs["x_kv"][..., permutation, :]}
    shuffled_text = str(Call(CROSS, shuffled)) + " with the source positions permuted"
    shuffled_output, shuffled_weights = _call_attention(cross_attention, CROSS, shuffled, shuffled_text)
    hint = (
        "the result depends on the order of the source positions. Cross-attention has no mask: every "
        "target position sees every source position, and its output is a weighted sum over them, which "
        "no order changes (a causal mask, or a mask built from positions, breaks this)"
    )
    _assert_close_to_own(
        shuffled_output,
        output,
        what="the output",
        call_text=shuffled_text,
        meaning="differs from the output for the source in its original order",
        hint=hint,
    )
    _assert_close_to_own(
        shuffled_weights,
        weights[..., permutation],
        what="the weights",
        call_text=shuffled_text,
        meaning="are not the original weights with their columns permuted the same way",
        hint=hint,
    )


def check_cross_attention_from_scratch(cross_attention: Callable[..., Any]) -> None:
    """cross_attention is correct and calls no built-in attention (F.scaled_dot_product_attention, MHA)."""
    __tracebackhide__ = True
    try:
        check_cross_attention_matches_formula(cross_attention)
    except CheckFailure as failure:
        fail(f"{CROSS} must be correct before it counts as written from scratch. {failure}")
    inputs = _attention_inputs((2,), *_SIZES, seed=90, device=default_device())
    assert_from_scratch(cross_attention, CROSS, [inputs], ATTENTION_BUILTINS, "attention")


# shapes of the hidden tests: (leading axes, m, n, d_model, d_k, d_v), every size different within a case
_REFERENCE_SHAPES = (((2, 3), 5, 7, 8, 4, 6), ((3,), 6, 9, 5, 8, 4), ((), 4, 3, 7, 2, 5))


def _attention_against_reference(
    fn: Callable[..., Any],
    reference: Callable[..., Any],
    name: str,
    *,
    dtypes: tuple[torch.dtype, ...],
    seed: int,
) -> None:
    __tracebackhide__ = True
    device = default_device()
    for case, (lead, *sizes) in enumerate(_REFERENCE_SHAPES):
        for dtype in dtypes:
            inputs = _attention_inputs(lead, *sizes, seed=seed + 10 * case, device=device, dtype=dtype)
            if name == SELF:
                inputs = _self_inputs(inputs)
            truth, naive_errors = reference_answer(reference, inputs)
            _assert_attention(fn, name, inputs, *truth, dtype=dtype, naive_errors=naive_errors)


def cross_attention_against_reference(
    cross_attention: Callable[..., Any],
    reference: Callable[..., Any],
    *,
    dtypes: tuple[torch.dtype, ...] = DTYPES,
    seed: int = 500,
) -> None:
    """Hidden test: cross_attention matches the reference for several shapes, in each of ``dtypes``."""
    __tracebackhide__ = True
    _attention_against_reference(cross_attention, reference, CROSS, dtypes=dtypes, seed=seed)


def cross_attention_from_scratch_everywhere(cross_attention: Callable[..., Any]) -> None:
    """Hidden test: no built-in attention on any path (every dtype, 0 to 2 leading axes)."""
    __tracebackhide__ = True
    device = default_device()
    cases = [
        _attention_inputs(lead, *sizes, seed=95, device=device, dtype=dtype)
        for lead, *sizes in _REFERENCE_SHAPES
        for dtype in DTYPES
    ]
    assert_from_scratch(cross_attention, CROSS, cases, ATTENTION_BUILTINS, "attention")


# --------------------------------------------------------------------------------------------------
# self-attention


def check_self_attention_matches_formula(self_attention: Callable[..., Any]) -> None:
    """(output, weights) are [..., n, d_v] and [..., n, n] and equal softmax(Q K^T / sqrt(d_k)) V of x."""
    __tracebackhide__ = True
    device = default_device()
    _assert_attention_shapes(
        self_attention,
        SELF,
        lambda lead, dtype: _self_inputs(
            _attention_inputs(lead, *_SIZES, seed=110, device=device, dtype=dtype)
        ),
    )
    for lead, seed in (((), 111), ((2,), 112), ((2, 9), 113)):
        inputs = _self_inputs(_attention_inputs(lead, *_SIZES, seed=seed, device=device))
        _assert_attention(self_attention, SELF, inputs, *_attention_answer(inputs), dtype=torch.float64)


def check_self_attention_permutation_equivariance(
    self_attention: Callable[..., Any], lead: tuple[int, ...] = (2,), seed: int = 120
) -> None:
    """Permuting the positions of x permutes the rows of the output, and the weights' rows and columns."""
    __tracebackhide__ = True
    device = default_device()
    m, n, d_model, d_k, d_v = _SIZES
    inputs = _self_inputs(_attention_inputs(lead, m, n, d_model, d_k, d_v, seed=seed, device=device))
    output, weights = _call_attention(self_attention, SELF, inputs, str(Call(SELF, inputs)))
    permutation = _permutation(n, seed, device)
    permuted = {**inputs, "x": inputs["x"][..., permutation, :]}
    permuted_text = str(Call(SELF, permuted)) + " with the positions of x permuted"
    permuted_output, permuted_weights = _call_attention(self_attention, SELF, permuted, permuted_text)
    hint = (
        "the result depends on the order of the positions. Self-attention without a mask is permutation "
        "equivariant: permuting the positions of x permutes the outputs the same way, because every "
        "position attends to every position (a causal mask, or anything built from the positions' "
        "indices, breaks this)"
    )
    _assert_close_to_own(
        permuted_output,
        output[..., permutation, :],
        what="the output",
        call_text=permuted_text,
        meaning="is not the original output with its rows permuted the same way",
        hint=hint,
    )
    _assert_close_to_own(
        permuted_weights,
        weights[..., permutation, :][..., permutation],
        what="the weights",
        call_text=permuted_text,
        meaning="are not the original weights with their rows and columns permuted the same way",
        hint=hint,
    )


def check_self_attention_from_scratch(self_attention: Callable[..., Any]) -> None:
    """self_attention is correct and calls no built-in attention (F.scaled_dot_product_attention, MHA)."""
    __tracebackhide__ = True
    device = default_device()
    inputs = _self_inputs(_attention_inputs((2,), *_SIZES, seed=130, device=device))
    try:
        _assert_attention(self_attention, SELF, inputs, *_attention_answer(inputs), dtype=torch.float64)
    except CheckFailure as failure:
        fail(f"{SELF} must be correct before it counts as written from scratch. {failure}")
    assert_from_scratch(self_attention, SELF, [inputs], ATTENTION_BUILTINS, "attention")


def self_attention_against_reference(
    self_attention: Callable[..., Any],
    reference: Callable[..., Any],
    *,
    dtypes: tuple[torch.dtype, ...] = DTYPES,
    seed: int = 600,
) -> None:
    """Hidden test: self_attention matches the reference for several shapes, in each of ``dtypes``."""
    __tracebackhide__ = True
    _attention_against_reference(self_attention, reference, SELF, dtypes=dtypes, seed=seed)


def self_attention_from_scratch_everywhere(self_attention: Callable[..., Any]) -> None:
    """Hidden test: no built-in attention on any path (every dtype, 0 to 2 leading axes)."""
    __tracebackhide__ = True
    device = default_device()
    cases = [
        _self_inputs(_attention_inputs(lead, *sizes, seed=135, device=device, dtype=dtype))
        for lead, *sizes in _REFERENCE_SHAPES
        for dtype in DTYPES
    ]
    assert_from_scratch(self_attention, SELF, cases, ATTENTION_BUILTINS, "attention")
