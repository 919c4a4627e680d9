"""What every attention-shaped exercise checks alike: inputs, known mistakes, shapes, and the judge.

Sizes and inputs are data (:class:`Sizes`, every axis a different size; seeded inputs and masks). A known
mistake is a :class:`Variant` of one parametrised computation, :func:`weights`: :data:`CORE` holds the
attention core's, an exercise adds rows. :func:`attention_check` judges one call: the ``(output, weights)``
pair, its shapes, dtype and device where a cell is about them, then its values against an answer (PyTorch's,
the formula's or the reference's), naming the worst element and the mistake that reproduces it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from attention_course.checks.engine import (
    Check,
    FromScratch,
    Hints,
    Mistake,
    Part,
    assert_format,
    assert_shape,
    assert_values,
    fail,
    hint_table,
    once,
    randn,
    reference_answer,
    shapes,
    table,
    type_name,
)
from attention_course.device import seeded_generator

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# F.scaled_dot_product_attention, F.multi_head_attention_forward, nn.MultiheadAttention
ATTENTION_BUILTINS = ("scaled_dot_product", "multi_head_attention", "multiheadattention")
LEADS_NOTE = (
    "It works for inputs without leading axes but not with {n}: key.T reverses *all* axes and "
    "key.transpose(0, 1) swaps the batch axis; use key.transpose(-2, -1) (or key.mT) to swap only the last "
    "two, and index axes from the end."
)


def from_scratch(what: str) -> FromScratch:
    """The rule "written without PyTorch's attention (or the course's reference)" for ``what``."""
    return FromScratch(what, ATTENTION_BUILTINS)


@dataclass(frozen=True)
class Sizes:
    """The sizes of one attention call: leading axes (batch, heads), then the named axes (``d_model``: the
    width of the inputs of exercises that project them)."""

    lead: tuple[int, ...]
    q_len: int
    k_len: int
    d_k: int
    d_v: int
    d_model: int = 0


# the hidden parts' sizes: every axis a different size within a case; 2, 1 and no leading axes
HIDDEN_SIZES = (Sizes((2, 3), 5, 7, 4, 6, 8), Sizes((3,), 6, 9, 8, 5, 7), Sizes((), 4, 3, 2, 5, 6))
# the leading axes of visible checks, as many as the hidden sizes have: a function that works for one number
# of leading axes only fails the visible part as it fails the hidden part
LEADS = ((2, 3), (3,), ())


def qkv(sizes: Sizes, *, seed: int, device: torch.device, dtype: torch.dtype = torch.float64) -> dict:
    """N(0, 1) ``query [*lead, q_len, d_k]``, ``key [*lead, k_len, d_k]``, ``value [*lead, k_len, d_v]``."""
    axes = {
        "query": (sizes.q_len, sizes.d_k),
        "key": (sizes.k_len, sizes.d_k),
        "value": (sizes.k_len, sizes.d_v),
    }
    return {
        name: randn((*sizes.lead, *shape), seed=seed + index, device=device, dtype=dtype)
        for index, (name, shape) in enumerate(axes.items())
    }


def cast(arguments: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """``arguments`` with every floating tensor in ``dtype`` (masks and everything else unchanged)."""
    return {
        name: value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value
        for name, value in arguments.items()
    }


def mask(shape: Sequence[int], *, seed: int, device: torch.device, kind: str = "allowed") -> torch.Tensor:
    """A random boolean mask (True = may attend) of ``shape``.

    ``kind``: ``"allowed"``, about 30% blocked with an allowed key in every row; ``"mixed"``, every row with
    an allowed and a blocked key (so that its inverse has no empty row either); ``"empty rows"``, mixed rows
    and about a third of the rows with no allowed key (at least one such row, and one other).
    """
    generator = seeded_generator(seed)
    lead, k_len = tuple(shape[:-1]), shape[-1]
    if kind == "allowed":
        values = torch.rand(*shape, generator=generator, dtype=torch.float32) > 0.3
        return values.scatter(-1, torch.randint(0, k_len, lead, generator=generator)[..., None], True).to(
            device
        )
    values = torch.rand(*shape, generator=generator, dtype=torch.float32) > 0.4
    allowed = torch.randint(0, k_len, lead, generator=generator)
    blocked = (allowed + torch.randint(1, k_len, lead, generator=generator)) % k_len
    values = values.scatter(-1, allowed[..., None], True).scatter(-1, blocked[..., None], False)
    if kind == "empty rows":
        empty = torch.rand(*lead, generator=seeded_generator(seed + 1), dtype=torch.float32) < 0.35
        empty.view(-1)[0], empty.view(-1)[-1] = True, False
        values = values.masked_fill(empty[..., None], False)
    return values.to(device)


def mask_shape(sizes: Sizes) -> tuple[int, ...]:
    """A mask shape that broadcasts over ``sizes``: the batch axis, 1 for other leading axes, q_len, k_len."""
    return (*sizes.lead[:1], *([1] * len(sizes.lead[1:])), sizes.q_len, sizes.k_len)


# ==================================================================================================
# the computation, and its known mistakes as rows


class QKV(NamedTuple):
    """What attention is computed from: query, key, value, the mask (or None), and d_model (or 0)."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: torch.Tensor | None = None
    d_model: int = 0


def plain_qkv(arguments: dict[str, Any]) -> QKV:
    """The QKV of a function called with ``query``, ``key``, ``value`` and maybe ``mask``."""
    return QKV(arguments["query"], arguments["key"], arguments["value"], arguments.get("mask"))


@dataclass(frozen=True)
class Variant:
    """A way of computing attention weights: the right one, or a known mistake with its ``hint`` (the likely
    cause, where ``{source}`` and ``{target}`` name the arguments keys and queries come from)."""

    hint: str = ""
    divide: str = "sqrt(d_k)"  # what the scores are divided by: 1, d_k, sqrt(d_v), sqrt(d_model), ...
    after_softmax: bool = False  # the division applied to the weights instead of the scores
    dim: int = -1  # the softmax's axis
    mask: str = "masked"  # inverted, ignored, after softmax (weights * mask), zero fill, causal (one added)
    qkv: Callable[[dict[str, Any]], QKV] | None = (
        None  # where query, key and value come from, if not as asked
    )


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None, dim: int = -1) -> torch.Tensor:
    """Softmax over the allowed keys; a row with no allowed key is 0 (the course's rule)."""
    if mask is None:
        return torch.softmax(scores, dim=dim)
    weights = torch.softmax(scores.masked_fill(~mask, -math.inf), dim=dim)  # NaN in a row with no key
    return weights.masked_fill(~mask.any(dim=dim, keepdim=True), 0.0)


def weights(inputs: QKV, variant: Variant = Variant()) -> torch.Tensor:
    """The attention weights ``[..., q_len, k_len]`` that ``variant`` computes, in the inputs' dtype."""
    query, key, value, mask, d_model = inputs
    sizes = {"d_k": query.size(-1), "d_v": value.size(-1), "d_model": d_model, "k_len": key.size(-2)}
    root = {f"sqrt({name})": math.sqrt(size) for name, size in sizes.items()}
    divisor = {**root, "1": 1.0, "d_k": float(sizes["d_k"]), "1/sqrt(d_k)": 1 / root["sqrt(d_k)"]}[
        variant.divide
    ]
    scores = query @ key.transpose(-2, -1)  # [..., q_len, k_len]
    scores = scores if variant.after_softmax else scores / divisor
    if variant.mask == "causal":
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
    if mask is None or variant.mask in ("masked", "causal"):
        result = masked_softmax(scores, mask, variant.dim)
    elif variant.mask == "inverted":
        result = masked_softmax(scores, ~mask, variant.dim)
    elif variant.mask == "ignored":
        result = torch.softmax(scores, dim=variant.dim)
    elif variant.mask == "after softmax":
        result = torch.softmax(scores, dim=variant.dim) * mask
    else:  # "zero fill"
        result = torch.softmax(torch.where(mask, scores, 0.0), dim=variant.dim)
    return result / divisor if variant.after_softmax else result


def formula(to_qkv: Callable[[dict[str, Any]], QKV] = plain_qkv) -> Callable[..., tuple]:
    """``(output, weights)`` computed from keyword arguments with PyTorch's matmul and softmax."""

    def attention(**arguments: Any) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = to_qkv(arguments)
        result = weights(inputs)
        return result @ inputs.value, result

    return attention


# the attention core's mistakes, in the order they are tried
CORE = (
    Variant("the scores are not scaled: divide Q K^T by sqrt(d_k) (Vaswani et al. 2017, eq. 1)", "1"),
    Variant(
        "the scores are divided by d_k; the scale is 1/sqrt(d_k), one over the standard deviation of q . k "
        "(dividing both the queries and the keys by sqrt(d_k) also divides the scores by d_k)",
        "d_k",
    ),
    Variant(
        "the scores are divided by sqrt(d_v), the width of the values; the scale is 1/sqrt(d_k), where d_k "
        "is the width of the queries and keys (query.size(-1))",
        "sqrt(d_v)",
    ),
    Variant(
        "the scores are divided by sqrt(d_model), the width of the inputs; the scale is 1/sqrt(d_k), the "
        "width of the queries and keys after the projection (w_q.size(-1), query.size(-1))",
        "sqrt(d_model)",
    ),
    Variant(
        "the scores are divided by sqrt(k_len), the number of keys; the scale is 1/sqrt(d_k), with d_k the "
        "width of the queries and keys (query.size(-1)), not a length",
        "sqrt(k_len)",
    ),
    Variant("the scores are multiplied by sqrt(d_k) instead of divided by it", "1/sqrt(d_k)"),
    Variant(
        "the softmax runs over the query axis (dim=-2); it must run over the keys (dim=-1), so that each "
        "query's weights sum to 1",
        dim=-2,
    ),
    Variant(
        "the scale is applied after the softmax; divide the scores by sqrt(d_k) before it", after_softmax=True
    ),
    Variant(
        "the mask is inverted: True means 'may attend' (the convention of F.scaled_dot_product_attention), "
        "so fill the scores where the mask is False (~mask)",
        mask="inverted",
    ),
    Variant(
        "the mask is ignored: fill the scores where it is False with -inf before the softmax", mask="ignored"
    ),
    Variant(
        "the mask is applied after the softmax: zeroing weights leaves rows that do not sum to 1; mask the "
        "scores before the softmax",
        mask="after softmax",
    ),
    Variant(
        "masked scores are set to 0 instead of -inf, so masked keys keep weight; fill them with "
        "float('-inf') (or torch.finfo(scores.dtype).min)",
        mask="zero fill",
    ),
)


def mistakes(arguments: dict, which: str, to_qkv=plain_qkv, rows=CORE, names=None) -> Iterator[Mistake]:
    """The ``"weights"`` or the ``"output"`` of the mistakes ``rows`` for ``arguments`` (float64)."""
    wide = cast(arguments, torch.float64)
    for row in rows:
        inputs = (row.qkv or to_qkv)(wide)
        if inputs.mask is None and row.mask not in ("masked", "causal"):
            continue  # a mask row, and no mask to get wrong
        if row.divide == "sqrt(d_model)" and not inputs.d_model:
            continue
        result = weights(inputs, row)
        hint = row.hint.format_map(names) if names else row.hint
        yield Mistake(hint, result if which == "weights" else result @ inputs.value)


# ==================================================================================================
# answers, shapes, and the checks of attention calls

Answer = Callable[[dict[str, Any]], tuple[tuple[torch.Tensor, torch.Tensor], tuple[float, float]]]


def builtin(to_qkv: Callable[[dict[str, Any]], QKV] = plain_qkv) -> Answer:
    """The answer of PyTorch: ``F.scaled_dot_product_attention``'s output, softmax's weights (float64)."""

    def answer(arguments: dict[str, Any]) -> tuple:
        inputs = to_qkv(cast(arguments, torch.float64))
        output = F.scaled_dot_product_attention(inputs.query, inputs.key, inputs.value, attn_mask=inputs.mask)
        return (output, weights(inputs)), (0.0, 0.0)

    return answer


def plain(to_qkv: Callable[[dict[str, Any]], QKV] = plain_qkv) -> Answer:
    """The answer of the formula in float64, with the error it makes in the arguments' own dtype."""
    return lambda arguments: reference_answer(formula(to_qkv), arguments)


def reference(part: Part) -> Answer:
    """The answer of the reference implementation (hidden parts), with its same-dtype error."""
    return lambda arguments: reference_answer(part.reference, arguments)


SHAPES = table("""
output q_len k_len: the first element returned must be the output (weights @ value); return (output, weights)
    in this order
output q_len d_k: the output has the width of the keys: multiply the weights by the values
weights k_len q_len: the weights are [..., k_len, q_len]: the scores are query @ key^T, [..., q_len,
    k_len]
weights q_len d_v: the weights have the width of the values: return (output, weights) in this order
weights q_len q_len: the scores compare the queries with themselves: use query @ key^T
""")


def shape_hints(sizes: Sizes, rows: dict[str, str] | None = None, names=None) -> dict[str, dict[tuple, str]]:
    """Causes of wrong shapes of the output and the weights: :data:`SHAPES`, then an exercise's ``rows``.

    ``names`` fill the rows' ``{source}`` and ``{target}``; where two rows give one shape, the later wins.
    """
    axes = {"q_len": sizes.q_len, "k_len": sizes.k_len, "d_k": sizes.d_k, "d_v": sizes.d_v}
    axes |= {"d_model": sizes.d_model} if sizes.d_model else {}
    rows = {**SHAPES, **{key: hint.format_map(names or {}) for key, hint in (rows or {}).items()}}
    return {which: shapes(rows, which, sizes.lead, **axes) for which in ("output", "weights")}


def expected_shapes(sizes: Sizes) -> dict[str, tuple[int, ...]]:
    """The shapes of the output, ``[*lead, q_len, d_v]``, and of the weights, ``[*lead, q_len, k_len]``."""
    return {
        "output": (*sizes.lead, sizes.q_len, sizes.d_v),
        "weights": (*sizes.lead, sizes.q_len, sizes.k_len),
    }


def pair(result: Any, call: Any) -> tuple[Any, Any]:
    """The ``(output, weights)`` that an attention function returns; fail on anything else."""
    if not isinstance(result, tuple | list) or len(result) != 2:
        length = f" of length {len(result)}" if isinstance(result, tuple | list) else ""
        fail(f"{call} should return a tuple (output, weights), got {type_name(result)}{length}.")
    return result[0], result[1]


def attention_check(
    part: Part,
    arguments: dict[str, Any],
    sizes: Sizes,
    answer: Answer | None = None,
    *,
    formats: bool = False,
    note: str = "",
    on_raise: str = "",
    to_qkv: Callable[[dict[str, Any]], QKV] = plain_qkv,
    rows: Sequence[Variant] = CORE,
    names: dict[str, str] | None = None,
    hints: dict[str, dict[tuple[int, ...], str]] | None = None,
    extra: Callable[[Any, Any, Any], None] | None = None,
) -> Check:
    """A check of one call of an attention function with keyword ``arguments`` of ``sizes``: the pair, its
    shapes (likely causes: ``hints``, default :func:`shape_hints`), ``extra(output, weights, call)``, then its
    values against ``answer(arguments) = ((output, weights), naive_errors)`` (``None``: shapes only).

    ``formats`` judges the dtype, the device and that the inputs are left unchanged too (the cells on dtypes);
    ``note`` says the right answer in words; ``on_raise`` is added to a failure an exception caused;
    ``to_qkv``, ``rows`` and ``names`` give query, key and value, the mistakes to try, and the names of the
    arguments that queries and keys come from (``{"target": ..., "source": ...}``).
    """
    call = part.call(**arguments)
    first = next(v for v in arguments.values() if isinstance(v, torch.Tensor) and v.is_floating_point())
    hints, right_shapes = hints or shape_hints(sizes), expected_shapes(sizes)
    expected_answer = once(lambda: answer(arguments)) if answer is not None else None

    def judge(result: Any) -> None:
        output, weights_ = pair(result, call)
        for which, actual in (("output", output), ("weights", weights_)):
            where, shape = f"the {which} of {call}", right_shapes[which]
            if formats:
                assert_format(actual, where, shape, first.dtype, first.device, hints[which])
            else:
                assert_shape(actual, where, shape, hints[which])
        if extra is not None:
            extra(output, weights_, call)
        if expected_answer is None:
            return
        expected, naive_errors = expected_answer()
        for which, actual, index in (("weights", weights_, 1), ("output", output, 0)):
            wrong = lambda which=which: mistakes(arguments, which, to_qkv, rows, names)  # noqa: E731
            options = dict(dtype=first.dtype, naive_error=naive_errors[index], mistakes=wrong, note=note)
            assert_values(actual, expected[index], f"the {which} of {call}", hints=hints[which], **options)

    return Check(call, judge, untouched=formats, on_raise=on_raise)


def hidden_checks(
    part: Part, make: Callable, dtypes: Sequence[torch.dtype], seed: int, per_size=None, **options: Any
) -> Iterator[Check]:
    """:func:`attention_check` s of every :data:`HIDDEN_SIZES` in every dtype, against the reference unless
    ``options`` give another ``answer``. ``make(sizes, seed, dtype)`` gives the arguments, or ``(sizes,
    arguments)`` where the call's sizes differ; ``per_size(sizes)``, options that depend on the sizes."""
    options.setdefault("answer", reference(part))
    for case, sizes in enumerate(HIDDEN_SIZES):
        for dtype in dtypes:
            made = make(sizes, seed + 10 * case, dtype)
            called, arguments = made if isinstance(made, tuple) else (sizes, made)
            yield attention_check(
                part, arguments, called, **options, **(per_size(called) if per_size else {})
            )


def permuted(
    part: Part, arguments: dict, sizes: Sizes, argument: str, seed: int, texts, hints, queries: bool
) -> Check:
    """Two calls of the learner's function: on ``arguments``, then with ``argument``'s positions permuted.

    Keys and values come from ``argument``, so the weights' columns move and the output stays; where the
    queries come from it too (``queries``) their rows move the same way. The judge compares the learner's own
    two results. ``texts``: the second call's label, the likely cause, what output and weights fail to be.
    """
    order = torch.randperm(sizes.k_len, generator=seeded_generator(seed))
    order[order.clone()] = torch.roll(order, -1)  # one cycle through a random order: every position moves
    label, hint, *meanings = texts
    moved = {**arguments, argument: arguments[argument][..., order.to(arguments[argument].device), :]}
    calls, right_shapes = (part.call(**arguments), part.call(label, **moved)), expected_shapes(sizes)
    rows = order if queries else slice(None)

    def judge(*results: Any) -> None:
        pairs = [pair(result, call) for result, call in zip(results, calls, strict=True)]
        for call, results_ in zip(calls, pairs, strict=True):
            for which, actual in zip(right_shapes, results_, strict=True):
                assert_shape(actual, f"the {which} of {call}", right_shapes[which], hints[which])
        (output, weights_), changed = ([x.detach().cpu().double() for x in p] for p in pairs)
        expected = (output[..., rows, :], weights_[..., rows, :][..., order])
        for which, actual, right, meaning in zip(right_shapes, changed, expected, meanings, strict=True):
            largest = (actual - right).abs().nan_to_num(math.inf).max().item()
            if not largest <= 1e-6 + 1e-5 * right.abs().max().item():  # the learner's own results, in float64
                fail(f"the {which} of {calls[1]} {meaning} (largest difference {largest:.3g}).", hint)

    return Check(calls, judge)


def exception_hints(extra: str = "") -> Hints:
    """Hints for exceptions in attention code: the :func:`table` ``extra`` first, then einsum's."""
    return hint_table(extra) + hint_table("""
view size is not compatible | contiguous: after transpose() a tensor is not contiguous, and view() cannot
    regroup its axes: use reshape(), or .contiguous().view()
number of subscripts | einsum: an einsum equation with fixed axes works for one number of leading axes only:
    use an ellipsis, as in torch.einsum('...qd,...kd->...qk', query, key)
""")
