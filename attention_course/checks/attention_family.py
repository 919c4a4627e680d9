"""What every attention-shaped exercise checks alike: inputs, known mistakes, shapes, and the judge.

- **Sizes and inputs as data**: :class:`Sizes` with every axis a different size, the table of the hidden
  parts' sizes, and seeded inputs and masks made on the CPU in float64, then moved (alike on any device).
- **Mistakes as rows**: attention weights are one parametrised computation, :func:`weights`, and a known
  mistake is a :class:`Variant` of it (the scale, the softmax's axis, the mask, where queries and keys come
  from). :data:`CORE` holds the attention core's mistakes; an exercise adds rows of its own.
- **One check of an attention call**, :func:`attention_check`: the ``(output, weights)`` pair, its shapes
  (with the likely cause of a wrong one), its dtype and device in the cells about them, then the weights and
  the output against an answer (PyTorch's, the plain formula's, or the reference's), naming the worst
  element and the mistake that reproduces it.
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
    randn,
    reference_answer,
    type_name,
)
from attention_course.device import seeded_generator

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# F.scaled_dot_product_attention, F.multi_head_attention_forward, nn.MultiheadAttention
ATTENTION_BUILTINS = ("scaled_dot_product", "multi_head_attention", "multiheadattention")
LEADS_NOTE = (
    "It works for inputs without leading axes but not with {n}: key.T reverses *all* axes and "
    "key.transpose(0, 1) "
    "swaps the batch axis; use key.transpose(-2, -1) (or key.mT) to swap only the last two, and index axes "
    "from "
    "the end."
)


def from_scratch(what: str) -> FromScratch:
    """The rule "written without PyTorch's attention (or the course's reference)" for ``what``."""
    return FromScratch(what, ATTENTION_BUILTINS)


@dataclass(frozen=True)
class Sizes:
    """The sizes of one attention call: leading axes (batch, heads), then the named axes.

    ``d_model`` is the width of the inputs of the exercises that project them.
    """

    lead: tuple[int, ...]
    q_len: int
    k_len: int
    d_k: int
    d_v: int
    d_model: int = 0


# the hidden parts' sizes: every axis a different size within a case; 2, 1 and no leading axes
HIDDEN_SIZES = (Sizes((2, 3), 5, 7, 4, 6, 8), Sizes((3,), 6, 9, 8, 5, 7), Sizes((), 4, 3, 2, 5, 6))


def qkv(sizes: Sizes, *, seed: int, device: torch.device, dtype: torch.dtype = torch.float64) -> dict:
    """N(0, 1) ``query [*lead, q_len, d_k]``, ``key [*lead, k_len, d_k]``, ``value [*lead, k_len, d_v]``."""
    shapes = {
        "query": (sizes.q_len, sizes.d_k),
        "key": (sizes.k_len, sizes.d_k),
        "value": (sizes.k_len, sizes.d_v),
    }
    return {
        name: randn((*sizes.lead, *shape), seed=seed + index, device=device, dtype=dtype)
        for index, (name, shape) in enumerate(shapes.items())
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
    """A way of computing attention weights: the right one, or a known mistake with its ``hint``.

    Attributes:
        hint: the mistake and its fix, shown as the likely cause; ``{source}`` and ``{target}`` are the
            arguments that keys and queries come from.
        divide: what the scores are divided by: ``"sqrt(d_k)"`` (right), ``"1"``, ``"d_k"``, ``"sqrt(d_v)"``,
            ``"sqrt(d_model)"``, ``"sqrt(k_len)"`` or ``"1/sqrt(d_k)"``.
        after_softmax: the division is applied to the weights instead of the scores.
        dim: the softmax's axis (-1, the keys, is right).
        mask: ``"masked"`` (right), ``"inverted"``, ``"ignored"``, ``"after softmax"`` (the weights times the
            mask), ``"zero fill"`` (masked scores set to 0) or ``"causal"`` (a causal mask added).
        qkv: where query, key and value come from, if elsewhere than the exercise says (projection rows).
    """

    hint: str = ""
    divide: str = "sqrt(d_k)"
    after_softmax: bool = False
    dim: int = -1
    mask: str = "masked"
    qkv: Callable[[dict[str, Any]], QKV] | None = None


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
        "is the "
        "width of the queries and keys (query.size(-1))",
        "sqrt(d_v)",
    ),
    Variant(
        "the scores are divided by sqrt(d_model), the width of the inputs; the scale is 1/sqrt(d_k), the "
        "width of "
        "the queries and keys after the projection (w_q.size(-1), query.size(-1))",
        "sqrt(d_model)",
    ),
    Variant(
        "the scores are divided by sqrt(k_len), the number of keys; the scale is 1/sqrt(d_k), with d_k the "
        "width "
        "of the queries and keys (query.size(-1)), not a length",
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
        "so "
        "fill the scores where the mask is False (~mask)",
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
        "float('-inf') "
        "(or torch.finfo(scores.dtype).min)",
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
# answers, shapes, and the check of one attention call

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


def shape_hints(sizes: Sizes) -> dict[str, dict[tuple[int, ...], str]]:
    """Likely causes of wrong shapes of the output and of the weights."""
    lead, q_len, k_len, d_k, d_v = sizes.lead, sizes.q_len, sizes.k_len, sizes.d_k, sizes.d_v
    order = "return (output, weights) in this order"
    output = {
        (*lead, q_len, k_len): f"the first element returned must be the output (weights @ value); {order}",
        (*lead, q_len, d_k): "the output has the width of the keys: multiply the weights by the values",
    }
    weights_ = {
        (
            *lead,
            k_len,
            q_len,
        ): "the weights are [..., k_len, q_len]: the scores are query @ key^T, [..., q_len, k_len]",
        (*lead, q_len, d_v): f"the weights have the width of the values: {order}",
        (*lead, q_len, q_len): "the scores compare the queries with themselves: use query @ key^T",
    }
    return {"output": output, "weights": weights_}


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
    """A check of one call of an attention function: the pair, its shapes, then its values.

    Args:
        part, arguments: the part, and the call's keyword arguments.
        sizes: the call's sizes: the output is ``[*lead, q_len, d_v]``, the weights ``[*lead, q_len, k_len]``.
        answer: ``answer(arguments) = ((output, weights), naive_errors)``; ``None`` judges the shapes only.
        formats: judge the dtype and the device too, and that the inputs are left unchanged (the cells on
            dtypes); other cells do not.
        note: the right answer in words, added to a value mismatch.
        on_raise: added to a failure that an exception caused.
        to_qkv, rows, names: how the arguments give query, key and value, the mistakes to diagnose, and the
            names of the arguments that queries and keys come from (``{"target": ..., "source": ...}``).
        hints: likely causes of wrong shapes (default :func:`shape_hints`).
        extra: ``extra(output, weights, call)``, another check once the shapes hold (rows with no key).
    """
    call = part.call(**arguments)
    first = next(v for v in arguments.values() if isinstance(v, torch.Tensor) and v.is_floating_point())
    hints = hints or shape_hints(sizes)
    shapes = {
        "output": (*sizes.lead, sizes.q_len, sizes.d_v),
        "weights": (*sizes.lead, sizes.q_len, sizes.k_len),
    }

    def judge(result: Any) -> None:
        output, weights_ = pair(result, call)
        for which, actual in (("output", output), ("weights", weights_)):
            where = f"the {which} of {call}"
            if formats:
                assert_format(actual, where, shapes[which], first.dtype, first.device, hints[which])
            else:
                assert_shape(actual, where, shapes[which], hints[which])
        if extra is not None:
            extra(output, weights_, call)
        if answer is None:
            return
        expected, naive_errors = answer(arguments)
        for which, actual, right, error in (
            ("weights", weights_, expected[1], naive_errors[1]),
            ("output", output, expected[0], naive_errors[0]),
        ):
            wrong = lambda which=which: mistakes(arguments, which, to_qkv, rows, names)  # noqa: E731
            where = f"the {which} of {call}"
            assert_values(
                actual,
                right,
                where,
                dtype=first.dtype,
                naive_error=error,
                mistakes=wrong,
                hints=hints[which],
                note=note,
            )

    return Check(call, judge, untouched=formats, on_raise=on_raise)


def hidden_checks(
    part: Part,
    make: Callable[[Sizes, int, torch.dtype], dict],
    dtypes: Sequence[torch.dtype],
    seed: int,
    **options: Any,
) -> Iterator[Check]:
    """:func:`attention_check` s against the reference, for every size of :data:`HIDDEN_SIZES` and dtype."""
    for case, sizes in enumerate(HIDDEN_SIZES):
        for dtype in dtypes:
            yield attention_check(
                part, make(sizes, seed + 10 * case, dtype), sizes, reference(part), **options
            )


def exception_hints(extra: str = "") -> Hints:
    """Hints for exceptions in attention code: the table ``extra`` first, then einsum's."""
    return hint_table(
        extra
        + """
number of subscripts | einsum
    an einsum equation with fixed axes works for one number of leading axes only: use an ellipsis, as in
    torch.einsum('...qd,...kd->...qk', query, key)
"""
    )
