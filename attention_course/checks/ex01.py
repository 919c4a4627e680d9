"""Checks of exercise ex01, attention as a soft lookup: kernel regression and single-head attention.

Visible parts use properties, known answers (the table of chapter 1) and PyTorch's built-ins; hidden parts
test the same behaviour on more inputs (every axis a different size) against the reference. Dtype, device and
in-place edits are judged only by the cells that name the inputs' dtype. Kernel regression is checked in
float64 and float32 only (``torch.cdist``, a natural way to compute distances, has no float16 kernel on the
CPU, and a score must not depend on the grading machine); attention in the four float dtypes."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from attention_course.checks import attention_family as family
from attention_course.checks import engine
from attention_course.checks.attention_family import CORE, DTYPES, HIDDEN_SIZES, QKV, Sizes, Variant
from attention_course.checks.engine import Check, Mistake, Part, behaviour, fail, randn, reference_answer

KERNEL_DTYPES = (torch.float64, torch.float32)
# the table of chapter 1: three keys, their values, and the queries 57 and 56; the scores -(q - k)^2 / 2
TABLE = {"queries": (57.0, 56.0), "keys": (51.0, 56.0, 58.0), "values": (40.0, 43.0, 48.0)}
TABLE_SCORES = ((-18.0, -0.5, -0.5), (-12.5, 0.0, -2.0))

KERNEL_HINTS = engine.hint_table("""
too many indices: 1-D queries [m] and keys [n] are scalars: give them a feature axis first (queries[:, None],
    [m, 1]) so that scalars and vectors [m, d] go through the same code
size of tensor | must match the size | cannot be multiplied | mat1 and mat2 | shape: every query must be
    compared with every key: queries[:, None, :] - keys[None, :, :] has shape [m, n, d] (m queries, n keys, d
    features); sum the squares over the last axis to get [m, n]
""")
REGRESSION_HINTS = KERNEL_HINTS[:1] + engine.hint_table("""
size of tensor | must match the size | cannot be multiplied | mat1 and mat2 | size mismatch: the prediction is
    weights @ values, in this order: [m, n] @ [n] -> [m] and [m, n] @ [n, d_v] -> [m, d_v]; values @ weights,
    weights.T or weights * values do not fit when m != n
""")
ATTENTION_HINTS = """
size of tensor | mat1 and mat2 | cannot be multiplied | must match the size | Expected size: shapes do not
    fit. The projections are x @ w (w is [d_model, d_k], so not x @ w.T nor F.linear(x, w)):
    query = {target} @ w_q is [..., m, d_k], key = {source} @ w_k is [..., n, d_k] and value = {source} @ w_v
    is [..., n, d_v]; the scores are query @ key.transpose(-2, -1), [..., m, n] (key.T or
    key.transpose(0, 1) also move the leading axes)
"""

# likely causes by name, and of wrong shapes ("<result> <axes>"); {target} and {source} as in Variant
TEXT = engine.table("""
sign: the exponent has the wrong sign: the weights must decrease with the distance, so the scores are
    -||q - k||^2 / (2 h^2), with a minus sign
dim 0: the softmax runs over the queries (dim=0); it must run over the keys (dim=-1), so that each query's row
    is a distribution over the keys
not normalised: the kernel values exp(-||q - k||^2 / (2 h^2)) are not normalised: divide each row by its sum
    over the keys (or take a softmax of the scores)
no half: the 1/2 of the Gaussian kernel is missing: divide the squared distance by 2 * bandwidth**2
4 h^2: the squared distance is divided by (2 h)^2 = 4 h^2; the denominator is 2 * bandwidth**2
distance: the distance is not squared: the Gaussian kernel uses ||q - k||^2, the sum of the squared
    differences, not the distance ||q - k||
h 2h: the bandwidth is not squared: divide the squared distance by 2 * bandwidth**2, not by 2 * bandwidth
h 1: the bandwidth is ignored: these are the weights of h = 1; divide the squared distance by 2 * bandwidth**2
h precedence: the squared distance is multiplied by h^2 instead of divided by it: in Python `x / 2 * h**2`
    means (x / 2) * h**2; write x / (2 * h**2)
dot products: the scores are dot products q . k / h^2: they equal the kernel's scores only when all keys have
    the same norm (chapter 1); use -||q - k||^2 / (2 h^2)
distance weights: the weights grow with the distance (|q - k| / sum |q - k|, the tempting mistake of chapter
    1): the farthest key weighs most; use the Gaussian kernel weights, which decrease with the distance
inverse distance: these are inverse-distance weights (1/|q - k|, normalised): use the Gaussian kernel weights,
    a softmax of -||q - k||^2 / (2 h^2)
h not passed on: the bandwidth is not passed on: these are the predictions of h = 1, the default of
    gaussian_kernel_weights; call gaussian_kernel_weights(queries, keys, bandwidth)
mean: every value gets the same weight (the prediction is the mean of the values): the weights must come from
    the kernel
far: exp(-||q - k||^2 / (2 h^2)) underflows to 0 for every key when the query is far from all of them, and
    0 / 0 is NaN. Subtract the largest score of each row before exp (a softmax does not change when a
    constant is added to a row), or use torch.softmax
on a key: weights built from 1 / |q - k| divide by 0 there; the Gaussian kernel exp(-(q - k)^2 / (2 h^2)) is
    finite everywhere
negative: the scores -||q - k||^2 / (2 h^2) are returned without the exponential (softmax)
rows: the kernel values must be divided by their sum over the keys (a softmax over dim=-1)
columns: each column sums to 1: the softmax runs over the queries (dim=0); it must run over the keys (dim=-1)
w_k w_q: w_q and w_k are swapped: the queries are {target} @ w_q and the keys {source} @ w_k
w_q w_q: w_q projects both the queries and the keys: the keys are {source} @ w_k
w_k w_k: w_k projects both the queries and the keys: the queries are {target} @ w_q
causal: a causal mask is applied: this attention has no mask, every query sees every key (a causal mask
    belongs to a decoder's self-attention, chapter 3)
weights n m: the weights are [n, m]: they must have one row per query and one column per key, [m, n]; compute
    queries[:, None, :] - keys[None, :, :]
weights m: one number per query: the weights keep one column per key, [m, n] (no sum over the keys)
weights n: one number per key: the weights keep one row per query, [m, n]
weights m n d: the squared differences are not summed over the feature axis: ||q - k||^2 is the sum over the
    d features, so sum(-1) turns [m, n, d] into [m, n]
weights n m d: the squared differences are neither summed over the features nor [m, n]
prediction m n: the weights are multiplied by the values element by element but not summed over the keys:
    weights @ values does both
prediction n m: the result has one entry per key: the prediction is weights @ values, [m, n] @ [n]
prediction m: the value axis d_v was summed away: [m, n] @ [n, d_v] gives [m, d_v]
prediction m n d_v: the weighted values are not summed over the keys: use weights @ values
prediction m one: for values [n] the prediction is [m]: a value axis added to the values ([n, 1]) must be
    removed again (or use weights @ values directly)
squeezed: an axis of size 1 is gone: squeeze() removes every axis of size 1, also m = 1 (one query), n = 1 or
    d_v = 1 (values [n, 1]); remove only the axis you added (squeeze(-1)), or compute weights @ values
    directly
features: queries and keys with different numbers of features d must raise ValueError: once scalars have
    their feature axis, compare queries.size(-1) with keys.size(-1) (broadcasting alone raises RuntimeError,
    or nothing at all when one side has d = 1)
bandwidth: a bandwidth h <= 0 must raise ValueError: check it first (h = 0 divides by 0, and a negative h
    gives the weights of -h, since only h^2 enters the kernel)
n: keys and values with different numbers of rows n must raise ValueError: compare keys.size(0) with
    values.size(0) first (the product alone raises RuntimeError)
far prediction: exp(-||q - k||^2 / (2 h^2)) underflows to 0 for every key when the query is far from all of
    them, and 0 / 0 is NaN: subtract the largest score of each row before exp (or use torch.softmax), as
    gaussian_kernel_weights does
matmul: the docstring says that feature sizes that do not match raise RuntimeError, which the matrix products
    raise by themselves: a check of your own must not raise another type
far attention: scores far from 0 overflow exp() (above 88.7 in float32) or underflow to 0 / 0: the softmax
    must subtract the maximum of each row (over the source positions) before exp, as torch.softmax does
""")
ATTENTION_SHAPES = engine.table("""
output q_len d_k: the output has the width d_k of the keys: the values are {source} @ w_v, and the output is
    weights @ value
output q_len d_model: the values are not projected: the output is weights @ ({source} @ w_v), not
    weights @ {source}
output k_len d_v: the output has one row per source position: the queries come from x_q (the target, m
    positions), the keys and values from x_kv (the source, n positions)
weights k_len q_len: the weights are [..., n, m]: the queries come from x_q (m positions) and the keys from
    x_kv (n positions), and the scores are query @ key^T, [..., m, n]
weights q_len q_len: the scores compare the queries with themselves: the keys are {source} @ w_k
""")
# The learner's docstrings clause by clause, and the behaviours that check each (tests/test_contracts.py).
CONTRACT = engine.table("""
gaussian_kernel_weights queries: kernel_weights_rows_sum_to_one, kernel_weights_table,
    kernel_weights_bandwidth, kernel_weights_far_query; scalars [m] and vectors [m, d] (d = 1 too), one query,
    float64 and float32 (not float16: torch.cdist, a natural way, has no float16 kernel on the CPU), on the
    checks' device, left unchanged
gaussian_kernel_weights keys: kernel_weights_rows_sum_to_one, kernel_weights_table, kernel_weights_bandwidth;
    [n] and [n, d], one key, the dtype and device of the queries
gaussian_kernel_weights bandwidth: kernel_weights_bandwidth, kernel_weights_table,
    kernel_weights_rows_sum_to_one; left out (1.0, judged as a distribution), 0.4 to 3.0, squared in the
    denominator 2 h^2
gaussian_kernel_weights returns: kernel_weights_rows_sum_to_one, kernel_weights_table,
    kernel_weights_bandwidth, kernel_weights_far_query; [m, n] in the queries' dtype and device, >= 0, rows
    summing to 1, the softmax's values, finite (one-hot on the nearest key) for queries 60 to 1000 away from
    every key
gaussian_kernel_weights raises ValueError: kernel_weights_bandwidth, kernel_weights_rows_sum_to_one; bandwidth
    0 (visible), -0.5 and -2 (hidden) in kernel_weights_bandwidth; queries [4, 2] and keys [5, 3] (visible),
    [4] and [5, 3], [4, 3] and [5] (hidden) in kernel_weights_rows_sum_to_one
nadaraya_watson queries: nadaraya_watson_table, nadaraya_watson_shapes, nadaraya_watson_bandwidth; scalars and
    vectors, one query, float64 and float32, queries far from every key (float64)
nadaraya_watson keys: nadaraya_watson_table, nadaraya_watson_shapes, nadaraya_watson_bandwidth; [n] and [n,
    d], one key, a query equal to a key
nadaraya_watson values: nadaraya_watson_shapes, nadaraya_watson_bandwidth, nadaraya_watson_table; [n], [n,
    d_v], [n, 1], constant values (the prediction is that constant)
nadaraya_watson bandwidth: nadaraya_watson_bandwidth, nadaraya_watson_table; 0.4 to 3.0 and 1.0, passed on to
    the kernel (not its default)
nadaraya_watson returns: nadaraya_watson_shapes, nadaraya_watson_table, nadaraya_watson_bandwidth; [m] for
    values [n], [m, d_v] for [n, d_v] (also m = 1, d_v = 1), the inputs' dtype and device, the kernel-weighted
    average, finite for queries far from every key
nadaraya_watson raises ValueError: nadaraya_watson_shapes, nadaraya_watson_bandwidth; keys [5] and values [6]
    (visible), keys [5, 2] and values [3, 2] (hidden), queries and keys of different d (as
    gaussian_kernel_weights) in nadaraya_watson_shapes; bandwidth 0 (visible), -0.5 and -2 (hidden) in
    nadaraya_watson_bandwidth
cross_attention x_q: cross_attention_shapes, cross_attention_matches_formula; [..., m, d_model] with 0, 1 and
    2 leading axes, float64, float32, float16 and bfloat16 (all visible in cross_attention_shapes), left
    unchanged
cross_attention x_kv: cross_attention_shapes, cross_attention_matches_formula,
    cross_attention_source_permutation; [..., n, d_model], n != m, identical source positions, permuted
    positions
cross_attention w_q: cross_attention_matches_formula, cross_attention_shapes; [d_model, d_k], x @ w (not x @
    w.T), scaled so that the scores reach +-100 (float32)
cross_attention w_k: cross_attention_matches_formula; [d_model, d_k], not swapped with w_q
cross_attention w_v: cross_attention_matches_formula, cross_attention_shapes; [d_model, d_v], d_v != d_k
cross_attention returns: cross_attention_shapes, cross_attention_matches_formula,
    cross_attention_source_permutation; (output [..., m, d_v], weights [..., m, n]) in the inputs' dtype and
    device, softmax(Q K^T / sqrt(d_k)) V with no mask, finite for scores far from 0
cross_attention raises RuntimeError: cross_attention_shapes; w_q with a row too few (visible), w_k with a
    column too few and x_kv with a feature too few (hidden)
cross_attention from scratch: cross_attention_from_scratch; no built-in attention
self_attention x: self_attention_matches_formula, self_attention_permutation_equivariance; [..., n, d_model]
    with 0, 1 and 2 leading axes, the four float dtypes, permuted positions
self_attention w_q: self_attention_matches_formula; [d_model, d_k], scaled so that the scores reach +-100
self_attention w_k: self_attention_matches_formula; [d_model, d_k]
self_attention w_v: self_attention_matches_formula; [d_model, d_v]
self_attention returns: self_attention_matches_formula, self_attention_permutation_equivariance; (output [...,
    n, d_v], weights [..., n, n]) in the inputs' dtype and device; permuting x permutes the output's rows (and
    the weights' rows and columns)
self_attention raises RuntimeError: self_attention_matches_formula; w_q with a row too few (visible), w_k with
    a column too few and w_v with a row too few (hidden)
self_attention from scratch: self_attention_from_scratch; no built-in attention
""")
# permuting the source x_kv or x: the second call's label, the likely cause, what output and weights are not
LABELS = {"x_kv": " with the source positions permuted", "x": " with the positions of x permuted"}
PERMUTED = engine.table("""
x_kv cause: the result depends on the order of the source positions. Cross-attention has no mask:
    every target position sees every source position, and its output is a weighted sum over them, which no
    order changes (a causal mask, or a mask built from positions, breaks this)
x_kv output: differs from the output for the source in its original order
x_kv weights: are not the original weights with their columns permuted the same way
x cause: the result depends on the order of the positions. Self-attention without a mask is permutation
    equivariant: permuting the positions of x permutes the outputs the same way, because every position
    attends to every position (a causal mask, or anything built from the positions' indices, breaks this)
x output: is not the original output with its rows permuted the same way
x weights: are not the original weights with their rows and columns permuted the same way
""")

# ==================================================================================================
# 1, 2. kernel regression: the Gaussian kernel's weights, and Nadaraya-Watson's predictions


@dataclass(frozen=True)
class Lookup:
    """A kernel regression call: m queries, n keys, d features (None: scalars), values [n] or [n, d_v]."""

    m: int
    n: int
    d: int | None = None
    d_v: int | None = None
    bandwidth: float = 1.0

    def arguments(self, seed: int, device, dtype=torch.float64, values=False, shift=0.0) -> dict:
        """Queries ``[m]`` or ``[m, d]`` (moved by ``shift``), keys ``[n]`` or ``[n, d]`` over a few h."""
        feature, value = () if self.d is None else (self.d,), () if self.d_v is None else (self.d_v,)
        arguments = {"queries": shift + 1.5 * randn((self.m, *feature), seed=seed, device=device)}
        arguments["keys"] = 1.5 * randn((self.n, *feature), seed=seed + 1, device=device)
        if values:
            arguments["values"] = randn((self.n, *value), seed=seed + 2, device=device)
        return {name: x.to(dtype) for name, x in arguments.items()}


# the hidden parts' cases, every size different within one: scalars and vectors, values [n] and [n, d_v]
HIDDEN_LOOKUPS = (Lookup(7, 4, None, None, 0.7), Lookup(5, 8, 3, 2, 1.3), Lookup(3, 6, 2, None, 0.4))
HIDDEN_LOOKUPS += (Lookup(4, 5, None, 3, 2.2),)
# sizes of 1 (one query, one key, d = 1, d_v = 1), for the cells of shapes: visible, then hidden
ONES = (
    (Lookup(1, 9), Lookup(6, 1, 3), Lookup(6, 9, 3, 1)),
    (Lookup(1, 4, 1, 1, 0.8), Lookup(5, 1, None, 2, 1.7)),
)
# the documented ValueErrors: shapes of (queries, keys, values) whose d differ, then whose n differ (the first
# of each visible)
FEATURES = (((4, 2), (5, 3), (5,)), ((4,), (5, 3), (5, 2)), ((4, 3), (5,), (5,)))
N_DIFFER = (((4,), (5,), (6,)), ((4, 2), (5, 2), (3, 2)))


def _raises(part: Part, shapes: tuple, cause: str, bandwidth: float = 1.0) -> Check:
    """A call on arguments of ``shapes`` (queries, keys and, for nadaraya_watson, values) that must raise
    ValueError, for ``cause``: "features", "n" or "bandwidth"."""
    names = ("queries", "keys", "values")[: 2 + (part.function == "nadaraya_watson")]
    arguments = {
        name: randn(shape, seed=70 + i, device=part.device)
        for i, (name, shape) in enumerate(zip(names, shapes, strict=False))
    }
    condition = {
        "features": "if queries and keys differ in their number of features d",
        "n": "if keys and values differ in their number of rows n",
        "bandwidth": f"if the bandwidth is not positive (here {bandwidth})",
    }[cause]
    call = part.call(**arguments, bandwidth=bandwidth)
    return engine.raises(call, "ValueError", condition, TEXT[cause])


def _squared(arguments: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``||q_i - k_j||^2 [m, n]`` in float64 from the differences (no cancellation), and q, k ``[., d]``."""
    q, k = (x.double().reshape(x.size(0), -1) for x in (arguments["queries"], arguments["keys"]))
    return ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1), q, k  # [m, n, d] -> [m, n]


def _formula(**arguments: Any) -> torch.Tensor:
    """The right weights, or predictions given values, in float64: an answer, as the reference is."""
    weights = torch.softmax(-_squared(arguments)[0] / (2 * arguments.get("bandwidth", 1.0) ** 2), dim=-1)
    return weights @ arguments["values"].double() if "values" in arguments else weights


def _mistakes(arguments: dict) -> Iterator[Mistake]:
    """Known wrong weights, or predictions given values (other weights, and the kernel's mistakes)."""
    (squared, q, k), h, v = _squared(arguments), arguments.get("bandwidth", 1.0), arguments.get("values")
    if v is not None:
        v, distance = v.double(), squared.sqrt()
        yield Mistake(TEXT["distance weights"], distance / distance.sum(dim=-1, keepdim=True) @ v)
        yield Mistake(TEXT["inverse distance"], (1 / distance) / (1 / distance).sum(-1, keepdim=True) @ v)
        if h != 1:
            yield Mistake(TEXT["h not passed on"], _formula(**{**arguments, "bandwidth": 1.0}))
        yield Mistake(TEXT["mean"], v.mean(dim=0).expand(q.size(0), *v.shape[1:]))
    right = -squared / (2 * h**2)
    rows = {"sign": (-right).softmax(-1), "dim 0": right.softmax(0), "not normalised": right.exp()}
    scores = {  # cause: wrong scores, of a softmax over the keys
        "no half": -squared / h**2,
        "4 h^2": -squared / (2 * h) ** 2,
        "distance": -squared.sqrt() / (2 * h**2),
        "h 2h": -squared / (2 * h),
        "h 1": -squared / 2,
        "h precedence": -squared * h**2 / 2,
        "dot products": q @ k.T / h**2,
    }
    rows |= {cause: wrong.softmax(-1) for cause, wrong in scores.items()}
    prefix = "" if v is None else "the kernel weights are wrong: "
    for cause, weights in rows.items():
        if h != 1 or not cause.startswith("h "):  # the bandwidth's mistakes are right when h = 1
            yield Mistake(prefix + TEXT[cause], weights if v is None else weights @ v)


def _distribution(weights: torch.Tensor, where: str) -> None:
    """Fail unless the weights ``[m, n]`` are finite, non-negative, and each row sums to 1."""
    if not torch.isfinite(weights).all():
        fail(f"{where} contain NaN or inf for ordinary inputs.")
    if (weights < 0).any():
        fail(f"{where} have negative values; weights are non-negative.", TEXT["negative"])
    rows, columns = weights.sum(dim=-1), weights.sum(dim=0)  # [m], [n]
    if not torch.allclose(rows, torch.ones_like(rows), atol=1e-5):
        cause = TEXT["columns" if torch.allclose(columns, torch.ones_like(columns), atol=1e-5) else "rows"]
        span = f"{rows.min().item():.4g} to {rows.max().item():.4g}"
        fail(f"the rows of {where} do not sum to 1 (sums range from {span}).", cause)


def _lookup_check(part: Part, arguments: dict, answer=None, note="", finite="") -> Check:
    """A call of gaussian_kernel_weights (nadaraya_watson, given values) against ``answer``, or its format."""
    call, queries, values = part.call(**arguments), arguments["queries"], arguments.get("values")
    m, n = queries.size(0), arguments["keys"].size(0)
    what, shape, axes = "weights", (m, n), {"d": queries.size(-1)} if queries.dim() == 2 else {}
    if values is not None:  # [m, 1] is a mistake of values [n] only
        what, shape = "prediction", (m, *values.shape[1:])
        axes = {"d_v": values.size(-1)} if values.dim() == 2 else {"one": 1}
    where, hints = f"the {what} of {call}", engine.shapes(TEXT, what, m=m, n=n, **axes)
    if 1 in shape:  # one query, one key or values [n, 1]: an axis squeezed away is the likely cause
        ones = [axis for axis, size in enumerate(shape) if size == 1]
        for gone in [[axis] for axis in ones] + [ones]:
            hints[tuple(size for axis, size in enumerate(shape) if axis not in gone)] = TEXT["squeezed"]
    expected = engine.once(
        lambda: reference_answer(answer, arguments) if callable(answer) else ((answer,), (0.0,))
    )

    def judge(result: Any) -> None:
        if answer is None:
            engine.assert_format(result, where, shape, queries.dtype, queries.device, hints)
            return _distribution(result.detach().cpu().double(), where) if values is None else None
        if finite and torch.is_tensor(result) and result.shape == shape and not result.isfinite().all():
            case = f"contain{'s' if values is not None else ''} NaN or inf for queries far from every key"
            case = case if finite == "far" else "contains NaN or inf for the query 56, which equals a key"
            far = finite == "far" and values is not None  # the predictions of a far query
            fail(f"{where} {case}.", TEXT["far prediction" if far else finite])
        (right,), (error,) = expected()
        options = {"dtype": queries.dtype, "naive_error": error, "hints": hints, "note": note}
        engine.assert_values(result, right, where, mistakes=lambda: _mistakes(arguments), **options)

    return Check(call, judge, untouched=answer is None)


def _hidden(
    part: Part,
    seed: int,
    values=False,
    bandwidth: Any = "case",
    table=False,
    shift=0.0,
    dtypes=KERNEL_DTYPES,
    **options,
):
    """Checks of :data:`HIDDEN_LOOKUPS` in ``dtypes`` (default float64 and float32), against the reference
    unless ``options`` give an ``answer``."""
    answer = options.pop("answer", part.reference)
    for i, case in enumerate(HIDDEN_LOOKUPS):
        case = replace(case, d=None, d_v=None) if table else case
        for dtype in dtypes:
            arguments = case.arguments(seed + 10 * i, part.device, dtype, values, (-1) ** i * shift)
            if table:
                arguments["queries"] = torch.cat((arguments["keys"][:1], arguments["queries"][1:]))  # [m]
            if bandwidth is not None:
                arguments["bandwidth"] = case.bandwidth if bandwidth == "case" else bandwidth
            yield _lookup_check(part, arguments, answer, **options)


def _table(device: torch.device, values=False) -> tuple[dict, torch.Tensor]:
    """The table of chapter 1 at h = 1 (queries [2], keys [3], values [3]), and its weights [2, 3]."""
    names = ("queries", "keys", "values")[: 2 + values]
    table_ = {name: torch.tensor(TABLE[name], dtype=torch.float64, device=device) for name in names}
    return table_ | {"bandwidth": 1.0}, torch.softmax(torch.tensor(TABLE_SCORES, dtype=torch.float64), -1)


@behaviour(function="gaussian_kernel_weights", points=1, hints=KERNEL_HINTS)
def kernel_weights_rows_sum_to_one(part: Part) -> Iterator[Check]:
    """The weights are [m, n] in the inputs' dtype, non-negative, each row summing to 1."""
    if part.hidden:
        yield from _hidden(part, 100, bandwidth=None, answer=None)
    else:
        for d, seed, dtype in ((None, 10, torch.float64), (3, 12, torch.float32), (3, 14, torch.float64)):
            yield _lookup_check(
                part, Lookup(7, 5, d).arguments(seed, part.device, dtype)
            )  # default bandwidth
    for case in ONES[part.hidden]:  # sizes of 1
        yield _lookup_check(
            part, replace(case, d_v=None).arguments(16, part.device) | {"bandwidth": case.bandwidth}
        )
    for shapes in FEATURES[1:] if part.hidden else FEATURES[:1]:  # the docstring's ValueError
        yield _raises(part, shapes, "features")


@behaviour(function="gaussian_kernel_weights", points=1, hints=KERNEL_HINTS)
def kernel_weights_table(part: Part) -> Iterator[Check]:
    """The table of chapter 1: keys 51, 56, 58 and the query 57 give weights (1.255e-8, 1/2, 1/2)."""
    if part.hidden:
        yield from _hidden(part, 150, bandwidth=1.0, table=True)
        return
    table_, weights = _table(part.device)
    note = "For q = 57 the scores -(q - k)^2 / 2 are (-18, -0.5, -0.5) and the weights (1.255e-8, 1/2, 1/2)."
    yield _lookup_check(part, table_, weights, note)


@behaviour(function="gaussian_kernel_weights", points=2, hints=KERNEL_HINTS)
def kernel_weights_bandwidth(part: Part) -> Iterator[Check]:
    """The weights are softmax_j(-||q_i - k_j||^2 / (2 h^2)) for scalars, vectors, several h."""
    if part.hidden:
        yield from _hidden(part, 100)
    else:
        for d, seed, h in ((None, 20, 0.6), (None, 20, 3.0), (3, 22, 0.6), (3, 22, 3.0)):
            yield _lookup_check(
                part, Lookup(6, 9, d).arguments(seed, part.device) | {"bandwidth": h}, _formula
            )
    for bandwidth in (-0.5, -2.0) if part.hidden else (0.0,):  # the docstring's ValueError
        yield _raises(part, FEATURES[0][:1] * 2, "bandwidth", bandwidth)


@behaviour(function="gaussian_kernel_weights", points=1, hints=KERNEL_HINTS)
def kernel_weights_far_query(part: Part) -> Iterator[Check]:
    """A query far from every key gets finite weights, all on its nearest key."""
    # every query's nearest key is closer than the next by over 100 in squared distance: the right weights
    # are one-hot to exp(-50), and a mistake that still puts all the weight there passes
    note = "A query far from every key puts (almost) all its weight on the nearest key."
    if part.hidden:  # queries 60 away from the keys: plain exponentials underflow in float64 too
        yield from _hidden(part, 180, bandwidth=1.0, shift=60.0, note=note, finite="far")
        return
    scalars = {"queries": torch.tensor([-100.0, 60.0, 1000.0]), "keys": torch.tensor([0, 1, 2, 3, 4.5])}
    vectors = {"queries": 80.0 + randn((3, 2), seed=31), "keys": randn((4, 2), seed=30)}  # [m, d], [n, d]
    for dtype, arguments in itertools.product(KERNEL_DTYPES, (scalars, vectors)):
        arguments = {name: x.to(part.device, dtype) for name, x in arguments.items()}
        yield _lookup_check(part, arguments | {"bandwidth": 1.0}, _formula, note, "far")


@behaviour(function="nadaraya_watson", points=1, hints=REGRESSION_HINTS)
def nadaraya_watson_table(part: Part) -> Iterator[Check]:
    """The table of chapter 1, h = 1: the query 57 gives 45.5, the query 56 (a key) about 43.6."""
    if part.hidden:
        yield from _hidden(part, 350, values=True, bandwidth=1.0, table=True)
        return
    table_, weights = _table(part.device, values=True)
    expected = weights @ torch.tensor(TABLE["values"], dtype=torch.float64)  # [2]
    note = "The query 57 is halfway between the keys 56 and 58: it gets (43 + 48) / 2 = 45.5, less 5.5 times "
    note += "the weight 1.255e-8 of the key 51."
    # the query 57 alone first (the chapter's example), then with the query 56, which equals a key
    yield _lookup_check(part, {**table_, "queries": table_["queries"][:1]}, expected[:1], note)
    yield _lookup_check(part, table_, expected, note, "on a key")


@behaviour(function="nadaraya_watson", points=1, hints=REGRESSION_HINTS)
def nadaraya_watson_shapes(part: Part) -> Iterator[Check]:
    """Values [n] give predictions [m] and values [n, d_v] give [m, d_v], in the inputs' dtype."""
    if part.hidden:
        yield from _hidden(part, 300, values=True, bandwidth=None, answer=None)
    else:
        for d, d_v, seed in (
            (None, None, 40),
            (None, 4, 43),
            (3, None, 46),
            (3, 4, 49),
        ):  # vectors in float32
            dtype = torch.float64 if d is None else torch.float32
            yield _lookup_check(part, Lookup(6, 9, d, d_v).arguments(seed, part.device, dtype, values=True))
    for case in ONES[part.hidden]:  # sizes of 1
        yield _lookup_check(
            part, case.arguments(56, part.device, values=True) | {"bandwidth": case.bandwidth}
        )
    # the docstring's ValueError
    yield from (
        _raises(part, shapes, "features") for shapes in (FEATURES[1:] if part.hidden else FEATURES[:1])
    )
    yield from (_raises(part, shapes, "n") for shapes in (N_DIFFER[1:] if part.hidden else N_DIFFER[:1]))


@behaviour(function="nadaraya_watson", points=1, hints=REGRESSION_HINTS)
def nadaraya_watson_bandwidth(part: Part) -> Iterator[Check]:
    """The predictions are the kernel-weighted averages of the values for several bandwidths."""
    note = "A query far from every key gets (almost) the value of its nearest key."
    if part.hidden:
        yield from _hidden(part, 300, values=True)
        # in float64 only: float32 cannot hold the distances of far queries to the precision of its tolerance
        far = {"bandwidth": 1.0, "shift": 60.0, "dtypes": KERNEL_DTYPES[:1], "note": note, "finite": "far"}
        yield from _hidden(part, 380, values=True, **far)
    else:
        scalars = Lookup(6, 9).arguments(50, part.device, values=True)
        constant = {**scalars, "values": torch.full_like(scalars["values"], 2.5), "bandwidth": 0.6}
        average = "With every value equal to 2.5, a weighted average (weights summing to 1) is 2.5."
        yield _lookup_check(part, constant, torch.full((6,), 2.5, dtype=torch.float64), average)
        for arguments in (scalars, Lookup(6, 9, 3, 4).arguments(53, part.device, values=True)):
            for bandwidth in (0.6, 3.0):
                yield _lookup_check(part, arguments | {"bandwidth": bandwidth}, _formula)
        # queries far from every key (as in kernel_weights_far_query), in float64: the predictions stay finite
        scalars = {"queries": torch.tensor([-100.0, 60.0, 1000.0]), "keys": torch.tensor([0, 1, 2, 3, 4.5])}
        vectors = {"queries": 80.0 + randn((3, 2), seed=31), "keys": randn((4, 2), seed=30)}
        for arguments, seed in ((scalars, 57), (vectors, 58)):
            arguments |= {"values": randn((len(arguments["keys"]), 2), seed=seed)}
            arguments = {k: v.to(part.device, torch.float64) for k, v in arguments.items()}
            yield _lookup_check(part, arguments | {"bandwidth": 1.0}, _formula, note, "far")
    for bandwidth in (-0.5, -2.0) if part.hidden else (0.0,):  # the docstring's ValueError
        yield _raises(part, N_DIFFER[0][:1] * 3, "bandwidth", bandwidth)


# ==================================================================================================
# 3. single-head cross-attention and self-attention

VISIBLE = Sizes((2,), 5, 7, 4, 3, 6)  # m = 5 target and n = 7 source positions, d_k, d_v, d_model
SOURCE = {"cross_attention": "x_kv", "self_attention": "x"}  # the argument that keys and values come from
LEADS = [((), torch.float64), ((2,), torch.float64), ((2, 9), torch.float64)]  # visible leading axes
FORMATS = (((), torch.float32), ((2,), torch.float64), ((2, 9), torch.float16), ((3,), torch.bfloat16))
FAR = 100.0  # w_q scaled: float32 scores of about +-100, where exp overflows above 88.7


def _projected(arguments: dict, query: str = "w_q", key: str = "w_k") -> QKV:
    """Query ``x_q @ w_q``, key ``x_kv @ w_k``, value ``x_kv @ w_v``; ``query``, ``key``: other weights."""
    x_q, x_kv = (arguments["x"],) * 2 if "x" in arguments else (arguments["x_q"], arguments["x_kv"])
    return QKV(x_q @ arguments[query], x_kv @ arguments[key], x_kv @ arguments["w_v"], None, x_q.size(-1))


# the attention core's mistakes, then the projections' (the weights of the queries and of the keys)
PROJECTIONS = (("w_k", "w_q"), ("w_q", "w_q"), ("w_k", "w_k"))
ROWS = (
    *CORE,
    *(Variant(TEXT[f"{q} {k}"], qkv=functools.partial(_projected, query=q, key=k)) for q, k in PROJECTIONS),
    Variant(TEXT["causal"], mask="causal"),
)
BUILTIN = family.builtin(_projected)  # PyTorch's answer for the projections
CROSS_HINTS = family.exception_hints(ATTENTION_HINTS.format(target="x_q", source="x_kv"))
SELF_HINTS = family.exception_hints(ATTENTION_HINTS.format(target="x", source="x"))


def _inputs(part: Part, sizes: Sizes, seed: int, dtype=torch.float64) -> tuple[Sizes, dict]:
    """The sizes (self-attention: m = n) and arguments, ``w_*`` of variance 1/d_model (scores of order 1)."""
    sizes = replace(sizes, q_len=sizes.k_len) if part.function == "self_attention" else sizes
    lead, d_model = sizes.lead, sizes.d_model
    shapes_ = {"x_q": (*lead, sizes.q_len, d_model), "x_kv": (*lead, sizes.k_len, d_model)}
    shapes_ |= {"w_q": (d_model, sizes.d_k), "w_k": (d_model, sizes.d_k), "w_v": (d_model, sizes.d_v)}
    arguments = {
        name: randn(shape, seed=seed + i, device=part.device) / math.sqrt(d_model if name[0] == "w" else 1)
        for i, (name, shape) in enumerate(shapes_.items())
    }
    if part.function == "self_attention":  # the source sequence is x
        arguments = {"x": arguments.pop("x_kv"), **{k: v for k, v in arguments.items() if k[0] == "w"}}
    return sizes, family.cast(arguments, dtype)


def _options(part: Part, sizes: Sizes) -> dict[str, Any]:
    """The options of :func:`attention_family.attention_check`: ex01's projections, mistakes and shapes."""
    source = SOURCE[part.function]
    names = {"target": "x" if source == "x" else "x_q", "source": source}
    hints = family.shape_hints(sizes, ATTENTION_SHAPES, names)
    return {"to_qkv": _projected, "rows": ROWS, "names": names, "hints": hints}


def _attention(part: Part, seed: int, visible=(), **extra: Any) -> Iterator[Check]:
    """Attention checks of ``visible`` (leads, dtypes), or (hidden) of every hidden size and dtype."""
    if part.hidden:
        make, per_size = functools.partial(_inputs, part), functools.partial(_options, part)
        yield from family.hidden_checks(part, make, DTYPES, seed, per_size, **extra)
        return
    for i, (lead, dtype) in enumerate(visible):
        sizes, arguments = _inputs(part, replace(VISIBLE, lead=lead), seed + i, dtype)
        note = family.LEADS_NOTE.format(n=len(sizes.lead)) if sizes.lead else ""
        yield family.attention_check(part, arguments, sizes, on_raise=note, **extra, **_options(part, sizes))


def _far(part: Part, sizes: Sizes, seed: int, dtype=torch.float32) -> tuple[Sizes, dict]:
    """:func:`_inputs` whose scores are far from 0 (``w_q`` scaled by ``FAR``)."""
    sizes, arguments = _inputs(part, sizes, seed, dtype)
    return sizes, {**arguments, "w_q": arguments["w_q"] * FAR}


def _far_checks(part: Part, seed: int) -> Iterator[Check]:
    """Attention with scores far from 0, against the formula (hidden: the reference, every hidden size)."""
    finite = functools.partial(_finite, TEXT["far attention"])
    if part.hidden:
        make, per_size = functools.partial(_far, part), functools.partial(_options, part)
        yield from family.hidden_checks(part, make, (torch.float32,), seed, per_size, extra=finite())
        return
    sizes, arguments = _far(part, VISIBLE, seed)
    yield family.attention_check(
        part, arguments, sizes, family.plain(_projected), extra=finite(), **_options(part, sizes)
    )


def _finite(cause: str) -> Any:
    """A judge (``extra``) that the output and the weights are finite."""

    def judge(output: Any, weights: Any, call: Any) -> None:
        for which, tensor in (("weights", weights), ("output", output)):
            if not tensor.isfinite().all():
                bad = int((~tensor.isfinite()).sum())
                fail(f"the {which} of {call} contain NaN or inf ({bad} of {tensor.numel()} elements).", cause)

    return judge


def _mismatched(part: Part, seed: int) -> Iterator[Check]:
    """Calls whose feature sizes do not match, which the docstring says raise RuntimeError: w_q with a row
    too few (visible); w_k with a column too few, and w_v (self) or x_kv (cross) with a feature too few."""
    _, arguments = _inputs(part, VISIBLE, seed)
    cut = {"w_q": arguments["w_q"][:-1]}
    if part.hidden:
        cut = {"w_k": arguments["w_k"][:, :-1]}
        if part.function == "self_attention":
            cut["w_v"] = arguments["w_v"][:-1]
        else:
            cut["x_kv"] = arguments["x_kv"][..., :-1]
    for name, tensor in cut.items():
        call = part.call(**{**arguments, name: tensor})
        condition = f"from the matrix products, if the feature sizes do not match ({name})"
        yield engine.raises(call, "RuntimeError", condition, TEXT["matmul"])


@behaviour(function="cross_attention", points=1, hints=CROSS_HINTS)
def cross_attention_shapes(part: Part) -> Iterator[Check]:
    """(output, weights) are [..., m, d_v] and [..., m, n] for 0 to 2 leading axes, inputs' dtype."""
    yield from _attention(part, 60, FORMATS, formats=True, answer=None)
    yield from _mismatched(part, 65)  # the docstring's RuntimeError


@behaviour(function="cross_attention", points=2, hints=CROSS_HINTS)
def cross_attention_matches_formula(part: Part) -> Iterator[Check]:
    """The result is softmax(Q K^T / sqrt(d_k)) V, Q = x_q W_Q, K = x_kv W_K, V = x_kv W_V."""
    if part.hidden:
        yield from _attention(part, 500)
        yield from _far_checks(part, 540)
        return
    sizes, same = _inputs(part, VISIBLE, 70)
    same["x_kv"] = same["x_kv"][..., :1, :].repeat(1, 7, 1)  # [2, 7, d_model]
    output = (same["x_kv"][..., :1, :] @ same["w_v"]).expand(2, 5, 3)
    known = lambda _: ((output, torch.full((2, 5, 7), 1 / 7, dtype=torch.float64)), (0.0, 0.0))  # noqa: E731
    note = "When every source position is the same, every weight is 1/n and the output is that position's "
    note += "value."
    yield family.attention_check(part, same, sizes, known, note=note, **_options(part, sizes))
    yield from _attention(part, 71, LEADS, answer=BUILTIN)
    yield from _far_checks(part, 75)  # scores far from 0


def _permutations(part: Part, seed: int) -> Iterator[Check]:
    """Permutation checks with 1, 0 and 2 leading axes (hidden: of every hidden size)."""
    cases = HIDDEN_SIZES if part.hidden else [replace(VISIBLE, lead=lead) for lead in ((2,), (), (2, 9))]
    source = SOURCE[part.function]
    texts = [LABELS[source]] + [PERMUTED[f"{source} {key}"] for key in ("cause", "output", "weights")]
    seed += 5 * part.hidden
    for sizes in cases:
        sizes, arguments = _inputs(part, sizes, seed)
        hints = _options(part, sizes)["hints"]
        yield family.permuted(part, arguments, sizes, source, seed, texts, hints, queries=source == "x")


@behaviour(function="cross_attention", points=1, hints=CROSS_HINTS)
def cross_attention_source_permutation(part: Part) -> Iterator[Check]:
    """Permuting the source positions (keys and values together) leaves the output unchanged."""
    yield from _permutations(part, 80)


def _from_scratch(part: Part, seed: int, correct: Iterator[Check]) -> Iterator[Check]:
    """``correct`` (visible), then no built-in attention: a float64 call, or every hidden size and dtype."""
    if not part.hidden:
        yield from engine.correct_first(correct, part.function)
    cases = itertools.product(HIDDEN_SIZES, DTYPES) if part.hidden else [(VISIBLE, torch.float64)]
    calls = [part.call(**_inputs(part, sizes, seed + 5 * part.hidden, dtype)[1]) for sizes, dtype in cases]
    yield family.from_scratch("attention").check(calls)


@behaviour(function="cross_attention", points=1, hints=CROSS_HINTS)
def cross_attention_from_scratch(part: Part) -> Iterator[Check]:
    """cross_attention is correct and calls no built-in attention."""
    yield from _from_scratch(part, 90, cross_attention_matches_formula.plan(part))


@behaviour(function="self_attention", points=1, hints=SELF_HINTS)
def self_attention_matches_formula(part: Part) -> Iterator[Check]:
    """(output, weights) are [..., n, d_v], [..., n, n]: softmax(Q K^T / sqrt(d_k)) V, all from x."""
    if part.hidden:
        yield from _attention(part, 600, formats=True)
    else:
        yield from _attention(part, 110, FORMATS, formats=True)
        yield from _attention(part, 111, LEADS, answer=BUILTIN)
    yield from _far_checks(part, 640 if part.hidden else 115)  # scores far from 0
    yield from _mismatched(part, 116)  # the docstring's RuntimeError


@behaviour(function="self_attention", points=1, hints=SELF_HINTS)
def self_attention_permutation_equivariance(part: Part) -> Iterator[Check]:
    """Permuting the positions of x permutes the output's rows and the weights' rows and columns."""
    yield from _permutations(part, 120)


@behaviour(function="self_attention", points=1, hints=SELF_HINTS)
def self_attention_from_scratch(part: Part) -> Iterator[Check]:
    """self_attention is correct and calls no built-in attention."""
    yield from _from_scratch(part, 130, _attention(part, 130, [((2,), torch.float64)], answer=BUILTIN))
