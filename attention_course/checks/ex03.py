"""Checks of exercise ex03, masks.

Each ``check_*`` function is the visible part of one test cell: it uses known answers, properties and
PyTorch's built-ins, never the reference solutions, so a learner can run it anywhere. The other public
functions are hidden tests: they compare the learner's function with the reference on more inputs (every
axis a different size; for attention float64, float32, float16 and bfloat16) on the default device.

One test cell checks one behaviour. The checks of a mask's *values* look through its layout (extra axes
of size 1, a 0/1 integer dtype), which a cell of its own checks, so that one mistake costs the points of
one behaviour only. Every failure names the call, what was expected, and, where a known mistake reproduces
the learner's result, the likely cause.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
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
    call,
    describe,
    fail,
    random_attention_inputs,
    reference_answer,
    unpack_output_and_weights,
)
from attention_course.device import default_device, seeded_generator

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
ATTENTION_BUILTINS = ("scaled_dot_product", "multi_head_attention", "multiheadattention")
# torch.nn.attention.bias.causal_lower_right / causal_upper_left and the CausalBias they return
CAUSAL_BUILTINS = ("lower_right", "upper_left", "causalbias", "_materialize")


# ==================================================================================================
# masks as values: layout-blind comparison, pictures, diagnosis


def _squeezed(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(size for size in shape if size != 1)


def _mask_values(
    result: Any, shape: Sequence[int], call_text: str, shape_hints: dict[tuple[int, ...], str] | None = None
) -> torch.Tensor:
    """The values of a returned mask as a boolean ``[*shape]`` tensor, whatever axes of size 1 it has.

    A 0/1 mask of another dtype is read as boolean here (its dtype is checked by a cell of its own).
    """
    __tracebackhide__ = True
    if not isinstance(result, torch.Tensor):
        fail(f"{call_text} should return a boolean tensor, got {describe(result)}.")
    if _squeezed(result.shape) != _squeezed(shape):
        hint = (shape_hints or {}).get(_squeezed(result.shape))
        fail(
            f"the mask returned by {call_text} has shape {list(result.shape)}, which does not hold a "
            f"{list(shape)} pattern of values (a {list(shape)} mask, with any axes of size 1, is expected)."
            + (f"\n  Likely cause: {hint}." if hint else "")
        )
    if result.dtype != torch.bool:
        values = result.detach()
        if not ((values == 0) | (values == 1)).all():
            fail(
                f"the mask returned by {call_text} has values other than 0 and 1 ({describe(result)}).\n  "
                "Likely cause: an additive mask (0 where allowed, -inf where blocked) is another "
                "convention; the course's masks are boolean, True = may attend."
            )
        result = values != 0
    return result.reshape(tuple(shape))


def _picture(mask: torch.Tensor) -> list[str]:
    """Rows of a small 2-D boolean mask as text: 1 = may attend, . = blocked."""
    return [" ".join("1" if allowed else "." for allowed in row) for row in mask.cpu().tolist()]


def _assert_mask_values(
    actual: torch.Tensor,
    expected: torch.Tensor,
    call_text: str,
    mistakes: Iterable[tuple[str, torch.Tensor]] = (),
    note: str | None = None,
) -> None:
    """Fail unless the boolean ``actual`` equals ``expected``; draw both and name a known mistake."""
    __tracebackhide__ = True
    expected = expected.to(actual.device)
    if torch.equal(actual, expected):
        return
    wrong = actual != expected
    message = f"the mask returned by {call_text} is wrong at {int(wrong.sum())} of {wrong.numel()} positions"
    if expected.dim() == 2 and expected.shape[0] <= 10 and expected.shape[1] <= 16:
        width = 2 * expected.shape[1] + 2
        rows = zip(_picture(expected), _picture(actual), strict=True)
        message += (
            " (1 = may attend, . = blocked; a row per "
            + ("sequence" if "padding" in call_text else "query")
            + "):\n    "
            + "expected".ljust(width)
            + "returned\n"
            + "\n".join(f"    {left.ljust(width)}{right}" for left, right in rows)
        )
    else:
        index = tuple(torch.nonzero(wrong)[0].tolist())
        message += (
            f"; the first is at index {list(index)}: {bool(actual[index])}, expected {bool(expected[index])}."
        )
    if note:
        message += f"\n  {note}"
    for hint, mistake in mistakes:
        mistake = mistake.to(actual.device)
        if (
            mistake.shape == actual.shape
            and not torch.equal(mistake, expected)
            and torch.equal(actual, mistake)
        ):
            message += f"\n  Likely cause: {hint}."
            break
    fail(message)


def _assert_mask_format(
    result: Any,
    *,
    shape: Sequence[int],
    device: torch.device,
    call_text: str,
    shape_hints: dict[tuple[int, ...], str] | None = None,
    dtype_hint: str,
) -> None:
    """Fail unless ``result`` is a boolean tensor of ``shape`` on ``device``."""
    __tracebackhide__ = True
    if (
        isinstance(result, torch.Tensor)
        and tuple(result.shape) == tuple(shape)
        and result.dtype != torch.bool
    ):
        fail(
            f"the mask returned by {call_text} has dtype {result.dtype}, expected torch.bool: masks are "
            f"boolean, True = may attend.\n  Likely cause: {dtype_hint}."
        )
    assert_like(
        result,
        shape=shape,
        dtype=torch.bool,
        device=device,
        what="the mask",
        call_text=call_text,
        shape_hints=shape_hints,
    )


def _device(device: torch.device | str) -> torch.device:
    """``device`` as tensors report it (``cuda`` becomes ``cuda:0``)."""
    return torch.empty(0, device=device).device


# ==================================================================================================
# 1. padding_mask

_TOKENS = [[5, 3, 9, 2, 0, 0, 0], [7, 1, 0, 0, 0, 0, 0], [4, 8, 6, 3, 2, 9, 1]]  # [batch=3, len=7], pad 0
_TOKENS_PAD_1 = [[5, 0, 9, 2, 1, 1, 1], [7, 4, 1, 1, 1, 1, 1], [0, 8, 6, 3, 2, 9, 0]]  # id 0 is a word here

_PADDING_DTYPE_HINT = (
    "tokens != pad_id is already boolean: drop the .long()/.int()/.float() after it (a Hugging Face "
    "attention_mask is 0/1 integers, the course's mask is boolean; F.scaled_dot_product_attention would "
    "*add* a float mask to the scores instead of masking them)"
)


def _padding_mistakes(tokens: torch.Tensor, pad_id: int) -> Iterator[tuple[str, torch.Tensor]]:
    yield (
        "True marks the padding: in the course's convention True means 'may attend', so the mask is True "
        "where the token is *not* pad_id (tokens != pad_id); True = blocked is the convention of "
        "nn.MultiheadAttention's key_padding_mask",
        tokens == pad_id,
    )
    yield (
        f"the mask is tokens != 0 although pad_id={pad_id} was passed: compare with the pad_id argument, "
        "not a hard-coded 0 (tokens.bool() hard-codes 0 too)",
        tokens != 0,
    )
    yield (
        f"the mask is tokens == 0: the pad_id={pad_id} argument is ignored and True marks the padding",
        tokens == 0,
    )


def _padding_shape_hints(batch: int, length: int) -> dict[tuple[int, ...], str]:
    return {
        (batch, length): "the mask is [batch, len]: add an axis for the heads and one for the queries, "
        "mask[:, None, None, :], so that it broadcasts against scores [batch, heads, q_len, k_len]; "
        "a [batch, len] mask would line its batch axis up with the query axis (chapter 3)",
        (batch, 1, length): "one axis is missing: [batch, 1, len] broadcasts its batch axis against the "
        "heads; the mask is [batch, 1, 1, len] (mask[:, None, None, :])",
        (batch, length, 1, 1): "the len axis must be the last one: padding closes keys, the columns of "
        "the scores [batch, heads, q_len, k_len]",
        (batch, 1, length, 1): "the mask is laid along the query axis: padding closes keys, the last axis "
        "of the scores, so the mask is [batch, 1, 1, len] (mask[:, None, None, :])",
        (1, 1, batch, length): "the batch axis must stay first: add the two new axes after it, "
        "mask[:, None, None, :]",
    }


def _check_padding_values(padding_mask: Callable[..., Any], tokens: torch.Tensor, pad_id: int | None) -> None:
    __tracebackhide__ = True
    arguments: dict[str, Any] = {"tokens": tokens} if pad_id is None else {"tokens": tokens, "pad_id": pad_id}
    call_text = str(Call("padding_mask", arguments))
    result = call(padding_mask, "padding_mask", **arguments)
    pad = 0 if pad_id is None else pad_id
    values = _mask_values(
        result, tokens.shape, call_text, {_squeezed(tokens.shape[::-1]): "the axes are swapped"}
    )
    _assert_mask_values(values, tokens != pad, call_text, _padding_mistakes(tokens, pad))


def check_padding_mask_values(padding_mask: Callable[..., Any]) -> None:
    """padding_mask is True exactly where the token is not pad_id (default 0, and another pad_id)."""
    __tracebackhide__ = True
    device = default_device()
    _check_padding_values(padding_mask, torch.tensor(_TOKENS, device=device), None)
    _check_padding_values(padding_mask, torch.tensor(_TOKENS_PAD_1, device=device), 1)
    _check_padding_values(padding_mask, torch.tensor([[3, 3, 3, 3], [0, 0, 0, 0]], device=device), 0)


def _check_padding_format(padding_mask: Callable[..., Any], tokens: torch.Tensor, pad_id: int) -> None:
    __tracebackhide__ = True
    arguments = {"tokens": tokens, "pad_id": pad_id}
    batch, length = tokens.shape
    _assert_mask_format(
        call(padding_mask, "padding_mask", **arguments),
        shape=(batch, 1, 1, length),
        device=tokens.device,
        call_text=str(Call("padding_mask", arguments)),
        shape_hints=_padding_shape_hints(batch, length),
        dtype_hint=_PADDING_DTYPE_HINT,
    )


def check_padding_mask_shape(padding_mask: Callable[..., Any]) -> None:
    """padding_mask returns a boolean [batch, 1, 1, len] mask on the device of the tokens."""
    __tracebackhide__ = True
    device = default_device()
    _check_padding_format(padding_mask, torch.tensor(_TOKENS, device=device), 0)
    _check_padding_format(padding_mask, torch.tensor(_TOKENS_PAD_1, dtype=torch.int32, device=device)[:2], 1)


def _random_tokens(batch: int, length: int, pad_id: int, *, seed: int, device: torch.device) -> torch.Tensor:
    """``[batch, len]`` ids in [0, 20) padded on the right with ``pad_id`` (rows of several lengths)."""
    generator = seeded_generator(seed)
    tokens = torch.randint(0, 20, (batch, length), generator=generator)
    lengths = torch.randint(0, length + 1, (batch,), generator=generator)
    tokens = tokens.masked_fill(torch.arange(length)[None, :] >= lengths[:, None], pad_id)
    return tokens.to(device)


_PADDING_CASES = (
    (4, 9, 0, torch.int64),
    (2, 3, 1, torch.int64),
    (5, 6, 17, torch.int32),
    (1, 8, 0, torch.int32),
)


def padding_mask_values_everywhere(
    padding_mask: Callable[..., Any], reference: Callable[..., Any], seed: int = 500
) -> None:
    """Hidden test: the values agree with the reference on random batches, pad ids and integer dtypes."""
    __tracebackhide__ = True
    device = default_device()
    for case, (batch, length, pad_id, dtype) in enumerate(_PADDING_CASES):
        tokens = _random_tokens(batch, length, pad_id, seed=seed + case, device=device).to(dtype)
        arguments = {"tokens": tokens, "pad_id": pad_id}
        call_text = str(Call("padding_mask", arguments))
        values = _mask_values(call(padding_mask, "padding_mask", **arguments), tokens.shape, call_text)
        expected = reference(tokens, pad_id).reshape(tokens.shape)
        _assert_mask_values(values, expected, call_text, _padding_mistakes(tokens, pad_id))


def padding_mask_format_everywhere(
    padding_mask: Callable[..., Any], reference: Callable[..., Any], seed: int = 520
) -> None:
    """Hidden test: shape, dtype and device agree with the reference's on random batches."""
    __tracebackhide__ = True
    device = default_device()
    for case, (batch, length, pad_id, dtype) in enumerate(_PADDING_CASES):
        tokens = _random_tokens(batch, length, pad_id, seed=seed + case, device=device).to(dtype)
        expected = reference(tokens, pad_id)
        arguments = {"tokens": tokens, "pad_id": pad_id}
        _assert_mask_format(
            call(padding_mask, "padding_mask", **arguments),
            shape=expected.shape,
            device=expected.device,
            call_text=str(Call("padding_mask", arguments)),
            shape_hints=_padding_shape_hints(batch, length),
            dtype_hint=_PADDING_DTYPE_HINT,
        )


# ==================================================================================================
# 2. causal_mask

_CAUSAL_DTYPE_HINT = (
    "torch.ones and torch.tril make float32 unless told otherwise: build the mask with dtype=torch.bool "
    "(or end with .bool()); a float 0/1 mask cannot be combined with & (chapter 3), and "
    "F.scaled_dot_product_attention *adds* a float mask to the scores instead of masking them"
)

_CAUSAL_NOTE = (
    "Query i stands at position i + (k_len - q_len), the queries being the *last* q_len positions (a "
    "KV cache keeps the earlier keys), so it may attend keys j <= i + (k_len - q_len): a cached step "
    "with q_len new queries sees what the last q_len rows of the full [k_len, k_len] mask see."
)


def _lower(q_len: int, k_len: int, diagonal: int) -> torch.Tensor:
    return torch.ones(q_len, k_len, dtype=torch.bool).tril(diagonal)


def _upper(q_len: int, k_len: int, diagonal: int) -> torch.Tensor:
    return torch.ones(q_len, k_len, dtype=torch.bool).triu(diagonal)


def _causal_mistakes(q_len: int, k_len: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Known wrong causal masks ``[q_len, k_len]``, with the hint that names each mistake."""
    offset = k_len - q_len
    if offset:
        yield (
            "the triangle is aligned top-left (torch.ones(q_len, k_len).tril(), like is_causal=True of "
            "F.scaled_dot_product_attention), which treats the queries as the *first* q_len positions; "
            "they are the last ones, so shift the diagonal by k_len - q_len (tril(diagonal=k_len - q_len))",
            _lower(q_len, k_len, 0),
        )
        yield (
            "the triangle is aligned top-left and the diagonal is excluded: query i may attend keys "
            "j <= i + (k_len - q_len), its own position included",
            _lower(q_len, k_len, -1),
        )
    yield (
        "the diagonal is excluded: a query may attend its own position (j <= i, not j < i), so keep the "
        "diagonal (tril with diagonal=k_len - q_len, not one less)",
        _lower(q_len, k_len, offset - 1),
    )
    yield (
        "one key too many: each query also sees the next position; the last allowed key of query i is "
        "j = i + (k_len - q_len)",
        _lower(q_len, k_len, offset + 1),
    )
    yield (
        "True marks the blocked (future) positions: that is nn.MultiheadAttention's convention; here "
        "True means 'may attend', so the mask is the lower triangle, diagonal included (invert it with ~)",
        _upper(q_len, k_len, offset + 1),
    )
    yield (
        "the triangle is transposed (upper instead of lower): rows are queries and columns keys, and "
        "query i may attend the keys *before* it (j <= i), so use tril, not triu",
        _upper(q_len, k_len, offset),
    )
    if offset:
        yield (
            "the triangle is transposed (upper instead of lower) and aligned top-left: rows are queries, "
            "columns keys, and query i may attend keys j <= i + (k_len - q_len)",
            _upper(q_len, k_len, 0),
        )
    yield (
        "nothing is masked: the keys after each query's position must be False",
        _lower(q_len, k_len, k_len),
    )


_CAUSAL_HINTS = (
    (
        ("meta tensor",),
        "this check builds the mask on PyTorch's 'meta' device (tensors with a shape but no data), to test "
        "the device argument without a GPU: build the mask with tensor operations (torch.ones, "
        "torch.arange, tril) and device=device, without .item() or .tolist()",
    ),
)


def _causal_values(
    causal_mask: Callable[..., Any],
    arguments: dict[str, Any],
    q_len: int,
    k_len: int,
    note: str | None = None,
) -> None:
    __tracebackhide__ = True
    call_text = str(Call("causal_mask", arguments))
    result = call(causal_mask, "causal_mask", extra_hints=_CAUSAL_HINTS, **arguments)
    hints = {
        _squeezed((k_len, q_len)): "the axes are swapped: rows are queries (q_len), columns keys (k_len)",
        _squeezed((q_len, q_len)): "the k_len argument is ignored: the mask has k_len columns, one per key",
    }
    values = _mask_values(result, (q_len, k_len), call_text, hints if q_len != k_len else None)
    _assert_mask_values(
        values, _lower(q_len, k_len, k_len - q_len), call_text, _causal_mistakes(q_len, k_len), note
    )


def check_causal_mask_square(causal_mask: Callable[..., Any]) -> None:
    """With k_len left out (q_len == k_len) the mask is the lower triangle, diagonal included."""
    __tracebackhide__ = True
    device = default_device()
    for q_len in (5, 1, 7):
        _causal_values(causal_mask, {"q_len": q_len, "device": device}, q_len, q_len)
    _causal_values(causal_mask, {"q_len": 4, "k_len": 4, "device": device}, 4, 4)


def check_causal_mask_bottom_right(causal_mask: Callable[..., Any]) -> None:
    """With q_len < k_len the triangle is aligned bottom-right: query i may attend j <= i + k_len - q_len."""
    __tracebackhide__ = True
    device = default_device()
    for q_len, k_len in ((3, 6), (1, 5), (4, 7), (2, 9)):
        arguments = {"q_len": q_len, "k_len": k_len, "device": device}
        _causal_values(causal_mask, arguments, q_len, k_len, _CAUSAL_NOTE)


def _causal_shape_hints(q_len: int, k_len: int) -> dict[tuple[int, ...], str]:
    two_axes = (
        "the mask is [q_len, k_len]: add the batch and heads axes in front, mask[None, None], so that it "
        "broadcasts against scores [batch, heads, q_len, k_len] like every mask of the course"
    )
    return {
        (q_len, k_len): two_axes,
        (1, q_len, k_len): "one axis is missing: the mask is [1, 1, q_len, k_len] (mask[None, None])",
        (1, 1, k_len, q_len): "the axes are swapped: rows are queries (q_len), columns keys (k_len)",
        (1, 1, q_len, q_len): "the k_len argument is ignored: the mask has k_len columns, one per key",
    }


def check_causal_mask_boolean(causal_mask: Callable[..., Any]) -> None:
    """causal_mask returns a boolean mask of shape [1, 1, q_len, k_len]."""
    __tracebackhide__ = True
    device = default_device()
    for q_len, k_len in ((5, 7), (4, None)):
        arguments = {"q_len": q_len, "k_len": k_len, "device": device}
        if k_len is None:
            arguments.pop("k_len")
            k_len = q_len
        _assert_mask_format(
            call(causal_mask, "causal_mask", **arguments),
            shape=(1, 1, q_len, k_len),
            device=_device(device),
            call_text=str(Call("causal_mask", arguments)),
            shape_hints=_causal_shape_hints(q_len, k_len),
            dtype_hint=_CAUSAL_DTYPE_HINT,
        )


def _check_causal_device(
    causal_mask: Callable[..., Any], q_len: int, k_len: int | None, device: torch.device | str
) -> None:
    __tracebackhide__ = True
    arguments: dict[str, Any] = {"q_len": q_len, "k_len": k_len, "device": device}
    if k_len is None:
        arguments.pop("k_len")
    call_text = str(Call("causal_mask", arguments))
    result = call(causal_mask, "causal_mask", extra_hints=_CAUSAL_HINTS, **arguments)
    if not isinstance(result, torch.Tensor):
        fail(f"{call_text} should return a boolean tensor, got {describe(result)}.")
    wanted = _device(device)
    if result.device != wanted:
        fail(
            f"the mask returned by {call_text} is on {result.device}, but device={device!r} was asked for."
            "\n  Likely cause: the device argument is ignored: create the tensors with device=device "
            "(torch.ones(..., device=device), torch.arange(..., device=device)), so that the mask is made "
            "where the scores it meets are."
            + (
                " (The check uses PyTorch's 'meta' device, which holds shapes without data, so that it "
                "runs without a GPU.)"
                if wanted.type == "meta"
                else ""
            )
        )


def check_causal_mask_device(causal_mask: Callable[..., Any]) -> None:
    """causal_mask builds the mask on the device it is given (a torch.device or a string)."""
    __tracebackhide__ = True
    for device in (torch.device("meta"), "meta", default_device()):
        _check_causal_device(causal_mask, 3, 5, device)


def check_causal_mask_from_scratch(causal_mask: Callable[..., Any]) -> None:
    """causal_mask is correct and calls neither PyTorch's causal_lower_right nor the reference."""
    __tracebackhide__ = True
    try:
        check_causal_mask_square(causal_mask)
        check_causal_mask_bottom_right(causal_mask)
    except CheckFailure as failure:
        fail(f"causal_mask must be correct before it counts as written from scratch. {failure}")
    device = default_device()
    cases = [{"q_len": 3, "k_len": 6, "device": device}, {"q_len": 4, "device": device}]
    assert_from_scratch(causal_mask, "causal_mask", cases, CAUSAL_BUILTINS, "the causal mask")


_CAUSAL_SIZES = ((6, 6), (2, 11), (1, 1), (1, 8), (5, 12), (9, 10), (8, 8))


def causal_mask_values_everywhere(
    causal_mask: Callable[..., Any],
    reference: Callable[..., Any],
    sizes: Sequence[tuple[int, int]] = _CAUSAL_SIZES,
) -> None:
    """Hidden test: the values agree with the reference for other sizes (q_len <= k_len)."""
    __tracebackhide__ = True
    device = default_device()
    for q_len, k_len in sizes:
        arguments: dict[str, Any] = {"q_len": q_len, "k_len": k_len, "device": device}
        if q_len == k_len:
            arguments.pop("k_len")
        call_text = str(Call("causal_mask", arguments))
        values = _mask_values(call(causal_mask, "causal_mask", **arguments), (q_len, k_len), call_text)
        expected = reference(q_len, k_len, device=device).reshape(q_len, k_len)
        note = _CAUSAL_NOTE if q_len != k_len else None
        _assert_mask_values(values, expected, call_text, _causal_mistakes(q_len, k_len), note)


def causal_mask_format_everywhere(causal_mask: Callable[..., Any], reference: Callable[..., Any]) -> None:
    """Hidden test: shape and dtype agree with the reference's for other sizes, on the device."""
    __tracebackhide__ = True
    device = default_device()
    for q_len, k_len in _CAUSAL_SIZES:
        arguments = {"q_len": q_len, "k_len": k_len, "device": device}
        expected = reference(q_len, k_len, device=device)
        _assert_mask_format(
            call(causal_mask, "causal_mask", **arguments),
            shape=expected.shape,
            device=expected.device,
            call_text=str(Call("causal_mask", arguments)),
            shape_hints=_causal_shape_hints(q_len, k_len),
            dtype_hint=_CAUSAL_DTYPE_HINT,
        )


def causal_mask_device_everywhere(causal_mask: Callable[..., Any]) -> None:
    """Hidden test: the device argument is followed for other sizes, k_len left out, and on the device."""
    __tracebackhide__ = True
    for q_len, k_len in ((1, None), (2, 7), (6, None), (4, 9)):
        for device in ("meta", default_device(), "cpu"):
            _check_causal_device(causal_mask, q_len, k_len, device)


def causal_mask_from_scratch_everywhere(causal_mask: Callable[..., Any]) -> None:
    """Hidden test: no built-in causal bias on any path (several sizes, devices)."""
    __tracebackhide__ = True
    cases = [
        {"q_len": q_len, "k_len": k_len, "device": device}
        for q_len, k_len in ((1, 6), (5, 5), (3, 8))
        for device in (default_device(), "cpu")
    ]
    assert_from_scratch(causal_mask, "causal_mask", cases, CAUSAL_BUILTINS, "the causal mask")


# ==================================================================================================
# 3. combine_masks

_COMBINE_HINTS = (
    (
        ("NoneType",),
        "None stands for 'no mask' and must be skipped: `if mask is None: continue`",
    ),
    (
        ("doesn't match the broadcast shape",),
        "an in-place `&=` cannot grow its left side to the broadcast shape (and it would change the "
        "caller's mask): write `combined = combined & mask`, which makes a new tensor",
    ),
    (
        ("stack expects each tensor",),
        "torch.stack needs masks of one shape, but a causal [1, 1, q_len, k_len] and a padding "
        "[batch, 1, 1, k_len] mask differ: combine them with &, which broadcasts",
    ),
)


def _combine(combine_masks: Callable[..., Any], masks: Sequence[torch.Tensor | None]) -> tuple[Any, str]:
    """Call ``combine_masks(*masks)`` as a learner's function; return the result and the call's text."""
    __tracebackhide__ = True
    if not callable(combine_masks):
        fail(
            f"combine_masks is not a function (got {describe(combine_masks)}): run the cell that defines it."
        )
    arguments = {f"masks[{index}]": mask for index, mask in enumerate(masks)}
    call_text = str(Call("combine_masks", arguments))
    try:
        result = call(
            lambda **named: combine_masks(*named.values()),
            "combine_masks",
            extra_hints=_COMBINE_HINTS,
            **arguments,
        )
    except CheckFailure as failure:
        changed = re.search(r"modified its argument `([^`]+)` in place", str(failure))
        if changed:
            fail(
                f"{call_text} modified its argument `{changed.group(1)}` in place, but callers reuse their "
                "masks (the same padding mask serves every layer).\n  Likely cause: `combined = mask` "
                "followed by `combined &= other` changes the caller's mask, since `combined` *is* that "
                "mask: write `combined = combined & other`, which makes a new tensor."
            )
        raise
    return result, call_text


def _combine_mistakes(masks: Sequence[torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    shape = torch.broadcast_shapes(*(mask.shape for mask in masks))
    union = torch.zeros(shape, dtype=torch.bool, device=masks[0].device)
    for mask in masks:
        union = union | mask
    yield (
        "the masks are combined with | (or): a key may be attended only where *every* mask allows it, "
        "so combine them with & (logical and)",
        union,
    )
    yield ("only the first mask is used: combine every mask with &", masks[0].expand(shape))
    yield ("only the last mask is used: combine every mask with &", masks[-1].expand(shape))


def _check_combined(
    combine_masks: Callable[..., Any], masks: Sequence[torch.Tensor | None], expected: torch.Tensor
) -> None:
    """``combine_masks(*masks)`` is the boolean ``expected``."""
    __tracebackhide__ = True
    result, call_text = _combine(combine_masks, masks)
    _assert_mask_format(
        result,
        shape=expected.shape,
        device=expected.device,
        call_text=call_text,
        dtype_hint="the combination of boolean masks is boolean: combine them with & (or torch.logical_and), "
        "not with * or + of float tensors",
    )
    given = [mask for mask in masks if mask is not None]
    _assert_mask_values(result, expected, call_text, _combine_mistakes(given))


def _check_consistent(
    combine_masks: Callable[..., Any],
    masks: Sequence[torch.Tensor | None],
    plain: Sequence[torch.Tensor],
    shape_hint: str,
) -> None:
    """``combine_masks(*masks)`` gives what the learner's own ``combine_masks(*plain)`` gives.

    ``plain`` holds the same masks without None and expanded to one shape: comparing with the learner's
    own result isolates the behaviour checked (broadcasting, skipping None) from the logic of the and.
    """
    __tracebackhide__ = True
    result, call_text = _combine(combine_masks, masks)
    expected, expected_text = _combine(combine_masks, plain)
    if not isinstance(result, torch.Tensor):
        fail(f"{call_text} should return a boolean tensor, got {describe(result)}.")
    if not isinstance(expected, torch.Tensor):
        fail(f"{expected_text} should return a boolean tensor, got {describe(expected)}.")
    if result.shape != expected.shape:
        fail(
            f"the mask returned by {call_text} has shape {list(result.shape)}, expected "
            f"{list(expected.shape)}.\n  Likely cause: {shape_hint}."
        )
    if not torch.equal(result, expected.to(result.dtype)):
        fail(
            f"the mask returned by {call_text} differs from that of {expected_text} at "
            f"{int((result != expected.to(result.dtype)).sum())} positions, although both calls combine "
            f"the same masks.\n  Likely cause: {shape_hint}."
        )


def check_combine_masks_and(combine_masks: Callable[..., Any]) -> None:
    """combine_masks of masks of one shape is their logical and: boolean, True only where all are True."""
    __tracebackhide__ = True
    device = default_device()
    generator = seeded_generator(70)
    first, second, third = (torch.rand(3, 2, 5, 7, generator=generator).to(device) > 0.4 for _ in range(3))
    _check_combined(combine_masks, [first, second], first & second)
    _check_combined(combine_masks, [first, second, third], first & second & third)
    _check_combined(combine_masks, [second], second)


def _example_masks(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A causal ``[1, 1, 5, 7]``, a padding ``[3, 1, 1, 7]`` and a random ``[3, 2, 5, 7]`` mask."""
    causal = torch.ones(5, 7, dtype=torch.bool, device=device).tril(2)[None, None]  # [1, 1, q_len, k_len]
    padding = torch.tensor(_TOKENS, device=device).ne(0)[:, None, None, :]  # [batch, 1, 1, k_len]
    generator = seeded_generator(71)
    full = (torch.rand(3, 2, 5, 7, generator=generator) > 0.3).to(device)  # [batch, heads, q_len, k_len]
    return causal, padding, full


_BROADCAST_HINT = (
    "the masks must broadcast against each other, the result taking their broadcast shape "
    "(torch.broadcast_shapes of their shapes): & and torch.logical_and do that, while an in-place &= or "
    "a result shaped like the first mask do not"
)


def _check_broadcasts(combine_masks: Callable[..., Any], masks: Sequence[torch.Tensor]) -> None:
    __tracebackhide__ = True
    shape = torch.broadcast_shapes(*(mask.shape for mask in masks))
    plain = [mask.expand(shape).clone() for mask in masks]  # the same masks, all of the broadcast shape
    _check_consistent(combine_masks, masks, plain, _BROADCAST_HINT)


def check_combine_masks_broadcasts(combine_masks: Callable[..., Any]) -> None:
    """Masks of broadcastable shapes (causal, padding, per head) combine to the broadcast shape, untouched."""
    __tracebackhide__ = True
    causal, padding, full = _example_masks(default_device())
    _check_broadcasts(combine_masks, [causal, padding])  # -> [batch, 1, q_len, k_len]
    _check_broadcasts(combine_masks, [padding, causal])
    _check_broadcasts(combine_masks, [full, causal, padding])  # the first mask has the broadcast shape


_NONE_HINT = "None stands for 'no mask' and must be skipped (`if mask is None: continue`)"


def _check_skips_none(combine_masks: Callable[..., Any], masks: Sequence[torch.Tensor | None]) -> None:
    __tracebackhide__ = True
    plain = [mask for mask in masks if mask is not None]
    if plain:
        _check_consistent(combine_masks, masks, plain, _NONE_HINT)
        return
    result, call_text = _combine(combine_masks, masks)
    if result is not None:
        fail(
            f"{call_text} returned {describe(result)}, expected None.\n  Likely cause: with no mask at "
            "all the result is None (no mask: every key may be attended), as the docstring says; a "
            "tensor would have to guess a shape. Start from `combined = None`."
        )


def check_combine_masks_skips_none(combine_masks: Callable[..., Any]) -> None:
    """None entries are skipped; with no mask at all (only None, or no argument) the result is None."""
    __tracebackhide__ = True
    _, _, full = _example_masks(default_device())
    other = ~full.roll(1, dims=-1)  # [3, 2, 5, 7], the same shape: this cell is not about broadcasting
    for masks in ([None, full], [full, None, other], [full, other, None], [None], [None, None], []):
        _check_skips_none(combine_masks, masks)


# same-shape cases (for the logical and) and broadcast cases, every axis a different size
_SAME_SHAPES = ((4, 1, 6, 9), (2, 3, 4, 5), (6, 9), (3, 2, 1, 8))
_BROADCAST_SHAPES = (
    ((1, 1, 6, 9), (4, 1, 1, 9)),
    ((4, 1, 1, 9), (1, 3, 6, 9), (6, 9)),
    ((2, 3, 4, 5), (2, 1, 1, 5), (1, 1, 4, 5)),
    ((9,), (6, 1), (4, 1, 1, 1)),
)


def _random_masks(shapes: Sequence[Sequence[int] | None], generator: torch.Generator) -> list:
    device = default_device()
    return [
        None if shape is None else (torch.rand(*shape, generator=generator) > 0.35).to(device)
        for shape in shapes
    ]


def combine_masks_against_reference(
    combine_masks: Callable[..., Any], reference: Callable[..., Any], seed: int = 600
) -> None:
    """Hidden test: two and three random masks of one shape agree with the reference."""
    __tracebackhide__ = True
    generator = seeded_generator(seed)
    for shape in _SAME_SHAPES:
        for count in (2, 3):
            masks = _random_masks([shape] * count, generator)
            _check_combined(combine_masks, masks, reference(*masks))


def combine_masks_broadcasts_everywhere(combine_masks: Callable[..., Any], seed: int = 610) -> None:
    """Hidden test: more broadcastable shapes, in every order."""
    __tracebackhide__ = True
    generator = seeded_generator(seed)
    for shapes in _BROADCAST_SHAPES:
        masks = _random_masks(shapes, generator)
        _check_broadcasts(combine_masks, masks)
        _check_broadcasts(combine_masks, masks[::-1])


def combine_masks_skips_none_everywhere(combine_masks: Callable[..., Any], seed: int = 620) -> None:
    """Hidden test: None in every position, several of them, for masks of other shapes."""
    __tracebackhide__ = True
    generator = seeded_generator(seed)
    for shape in _SAME_SHAPES:
        first, second = _random_masks([shape, shape], generator)
        for masks in (
            [first, None],
            [None, None, first, None, second],
            [first, None, second, None],
            [None] * 3,
        ):
            _check_skips_none(combine_masks, masks)


# ==================================================================================================
# 4. masked_attention

NAME = "masked_attention"

_ATTENTION_HINTS = (
    (
        ("cannot be converted to type", "without overflow"),
        "a fill value such as -1e9 does not fit in float16 (its largest magnitude is 65504): fill masked "
        "scores with float('-inf') or torch.finfo(scores.dtype).min, and give rows with no allowed key "
        "zero weights explicitly",
    ),
    (
        ("NoneType",),
        "mask may be None (no mask: every key may be attended); handle it with `if mask is not None:`",
    ),
)

_EMPTY_RULE = "The course's rule: a query whose mask row allows no key gets zero weights and a zero output."


def _mixed_mask(shape: Sequence[int], *, seed: int, device: torch.device) -> torch.Tensor:
    """A random boolean mask whose every row has a True and a False (so its inverse has no empty row)."""
    generator = seeded_generator(seed)
    mask = torch.rand(*shape, generator=generator) > 0.4
    lead, k_len = tuple(shape[:-1]), shape[-1]
    allowed = torch.randint(0, k_len, lead, generator=generator)
    blocked = (allowed + torch.randint(1, k_len, lead, generator=generator)) % k_len
    mask = mask.scatter(-1, allowed[..., None], True).scatter(-1, blocked[..., None], False)
    return mask.to(device)


def _mask_with_empty_rows(shape: Sequence[int], *, seed: int, device: torch.device) -> torch.Tensor:
    """A random mask where about a third of the rows allow no key (at least one such row, and one other)."""
    mask = _mixed_mask(shape, seed=seed, device=torch.device("cpu"))
    empty = torch.rand(*shape[:-1], generator=seeded_generator(seed + 1)) < 0.35
    empty.view(-1)[0], empty.view(-1)[-1] = True, False
    return mask.masked_fill(empty[..., None], False).to(device)


def _left_padded_causal(device: torch.device) -> torch.Tensor:
    """Causal (bottom-right, q_len 5, k_len 7) and left padding: ``[2, 1, 5, 7]``, two empty rows."""
    tokens = torch.tensor([[0, 0, 0, 0, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7]], device=device)  # [batch, k_len]
    padding = (tokens != 0)[:, None, None, :]  # [batch, 1, 1, k_len]
    causal = torch.ones(5, 7, dtype=torch.bool, device=device).tril(2)  # [q_len, k_len]
    return padding & causal  # queries 0 and 1 of sentence 0 have only padding in their past


def _masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the allowed keys, in the dtype of ``scores``; a row with no allowed key is 0."""
    if mask is None:
        return torch.softmax(scores, dim=-1)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)  # NaN in rows with no key
    return weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)


def _known_answer(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, weights) as the task states them, computed in the dtype of the inputs."""
    weights = _masked_softmax(query @ key.transpose(-2, -1) / math.sqrt(query.size(-1)), mask)
    return weights @ value, weights


def _attention_weight_mistakes(
    query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Known wrong attention weights, computed in float64, with the hint that names each mistake."""
    raw = query.double() @ key.double().transpose(-2, -1)  # [..., q_len, k_len]
    scaled = raw / math.sqrt(query.size(-1))
    yield "the scores are not scaled: divide Q K^T by sqrt(d_k)", _masked_softmax(raw, mask)
    if mask is None:
        return
    yield (
        "the mask is inverted: True means 'may attend' (the convention of F.scaled_dot_product_attention), "
        "so fill the scores where the mask is False (~mask)",
        _masked_softmax(scaled, ~mask),
    )
    yield (
        "the mask is ignored: fill the scores where it is False before the softmax",
        torch.softmax(scaled, -1),
    )
    yield (
        "the mask is applied after the softmax: zeroing weights leaves rows that do not sum to 1; mask the "
        "scores before the softmax",
        torch.softmax(scaled, -1) * mask,
    )
    yield (
        "masked scores are set to 0 instead of -inf, so masked keys keep weight",
        torch.softmax(torch.where(mask, scaled, 0.0), -1),
    )


def _attention_mistakes(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, part: str
) -> Iterator[Mistake]:
    for hint, weights in _attention_weight_mistakes(query, key, mask):
        yield Mistake(hint, weights if part == "weights" else weights @ value.double())


def _shape_hints(lead: tuple[int, ...], q_len: int, k_len: int, d_k: int, d_v: int) -> dict[str, dict]:
    return {
        "output": {
            (*lead, q_len, k_len): "the first element returned must be the output (weights @ value); "
            "return (output, weights) in this order",
            (*lead, q_len, d_k): "the output has the width of the keys: multiply the weights by the values",
        },
        "weights": {
            (*lead, k_len, q_len): "the weights are [..., k_len, q_len]: the scores are query @ key^T",
            (*lead, q_len, d_v): "the weights have the width of the values: return (output, weights)",
        },
    }


def _assert_empty_rows(
    output: torch.Tensor, weights: torch.Tensor, empty: torch.Tensor, call_text: str
) -> None:
    """The exact rule on the rows whose mask allows no key: weights 0, output 0, nothing NaN or inf."""
    __tracebackhide__ = True
    row_weights, row_output = weights.detach()[empty].double(), output.detach()[empty].double()  # [rows, ...]
    first = list(torch.nonzero(empty)[0].tolist())
    where = (
        f"in the {int(empty.sum())} rows whose mask allows no key (the first at index {first} of the "
        f"weights' leading axes)"
    )
    if not torch.isfinite(row_weights).all():
        fail(
            f"the weights of {call_text} are NaN or inf {where}. {_EMPTY_RULE}\n  Likely cause: with a -inf "
            "fill every score of such a row is -inf, and the softmax computes exp(-inf - (-inf)) = NaN; "
            "multiplying the weights by 0 afterwards does not help (NaN * 0 = NaN). Find these rows with "
            "mask.any(dim=-1, keepdim=True) and *select* zeros for them (torch.where or masked_fill), or "
            "give them finite scores before the softmax and zero them after."
        )
    if (row_weights != 0).any():
        k_len = row_weights.size(-1)
        uniform = torch.allclose(row_weights, torch.full_like(row_weights, 1 / k_len), atol=1e-2)
        sums = row_weights.sum(dim=-1)
        if uniform:
            hint = (
                f"the weights there are uniform (1/{k_len}): a finite fill such as torch.finfo(dtype).min "
                "or -1e9 makes every score of such a row equal, so the softmax spreads the weight evenly "
                "over keys that are all masked (padding, the future). Set the weights of these rows to 0 "
                "(torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0))"
            )
        elif torch.allclose(sums, torch.ones_like(sums), atol=1e-2):
            hint = (
                "these rows are normalised as if some of their keys were allowed: check that the mask is "
                "neither inverted nor ignored (True = may attend), then set the rows with no allowed key "
                "to 0 (mask.any(dim=-1, keepdim=True) finds them)"
            )
        else:
            hint = "find the rows with mask.any(dim=-1, keepdim=True) and set their weights to 0"
        fail(
            f"the weights of {call_text} are not 0 {where} (largest {row_weights.abs().max().item():.4g}). "
            f"{_EMPTY_RULE}\n  Likely cause: {hint}."
        )
    if not torch.isfinite(row_output).all():
        fail(
            f"the output of {call_text} is NaN or inf {where}, although the weights there are 0. "
            f"{_EMPTY_RULE}\n  Likely cause: the output was computed from the weights before they were "
            "corrected (NaN weights @ value = NaN): compute output = weights @ value from the corrected "
            "weights, and return those."
        )
    if (row_output != 0).any():
        fail(
            f"the output of {call_text} is not 0 {where} (largest {row_output.abs().max().item():.4g}), "
            f"although the weights there are 0. {_EMPTY_RULE}\n  Likely cause: the output is not "
            "weights @ value for the weights returned: compute it from the corrected weights."
        )


def _assert_attention(
    masked_attention: Callable[..., Any],
    inputs: dict[str, Any],
    expected_output: torch.Tensor,
    expected_weights: torch.Tensor,
    *,
    dtype: torch.dtype,
    naive_errors: tuple[float, float] = (0.0, 0.0),
    note: str | None = None,
) -> None:
    """Call ``masked_attention(**inputs)``; check shapes, the rule on empty rows, then weights and output."""
    __tracebackhide__ = True
    query, key, value, mask = inputs["query"], inputs["key"], inputs["value"], inputs["mask"]
    call_text = str(Call(NAME, inputs))
    output, weights = unpack_output_and_weights(
        call(masked_attention, NAME, extra_hints=_ATTENTION_HINTS, **inputs), call_text
    )
    lead, (q_len, d_k), (k_len, d_v) = tuple(expected_output.shape[:-2]), query.shape[-2:], value.shape[-2:]
    hints = _shape_hints(lead, q_len, k_len, d_k, d_v)
    for part, actual, expected in (
        ("output", output, expected_output),
        ("weights", weights, expected_weights),
    ):
        assert_like(
            actual,
            shape=expected.shape,
            dtype=dtype,
            device=expected.device,
            what=f"the {part}",
            call_text=call_text,
            shape_hints=hints[part],
        )
    if mask is not None:
        empty = (~mask.any(dim=-1)).expand(expected_weights.shape[:-1])  # [..., q_len]
        if empty.any():
            _assert_empty_rows(output, weights, empty, call_text)
    assert_output_and_weights(
        output,
        weights,
        expected_output,
        expected_weights,
        call_text=call_text,
        dtype=dtype,
        naive_errors=naive_errors,
        mistakes=lambda part: _attention_mistakes(query, key, value, mask, part),
        note=note,
    )


def _assert_known_answer(
    masked_attention: Callable[..., Any], inputs: dict[str, Any], dtype: torch.dtype, note: str | None = None
) -> None:
    """Compare with the statement's answer in float64, within the error of a plain ``dtype`` computation."""
    __tracebackhide__ = True
    inputs = {
        name: t.to(dtype) if t is not None and t.is_floating_point() else t for name, t in inputs.items()
    }
    truth, naive_errors = reference_answer(_known_answer, inputs)
    _assert_attention(masked_attention, inputs, *truth, dtype=dtype, naive_errors=naive_errors, note=note)


def check_masked_attention_matches_sdpa(masked_attention: Callable[..., Any]) -> None:
    """With masks of several shapes (each row allowing a key), or none, it agrees with PyTorch's SDPA."""
    __tracebackhide__ = True
    device = default_device()
    inputs = random_attention_inputs((2, 3), 5, 7, 4, 6, seed=80, device=device)  # [batch, heads, len, d]
    masks = [
        _mixed_mask((2, 3, 5, 7), seed=81, device=device),  # [batch, heads, q_len, k_len]
        _mixed_mask((5, 7), seed=82, device=device),  # [q_len, k_len]
        torch.tensor(_TOKENS[:2], device=device).ne(0)[:, None, None, :],  # padding [batch, 1, 1, k_len]
        torch.ones(5, 7, dtype=torch.bool, device=device).tril(2)[None, None],  # causal [1, 1, q_len, k_len]
        None,
    ]
    for mask in masks:
        case = {**inputs, "mask": mask}
        scores = case["query"] @ case["key"].transpose(-2, -1) / 2.0  # d_k = 4
        weights = torch.softmax(scores if mask is None else scores.masked_fill(~mask, float("-inf")), dim=-1)
        output = F.scaled_dot_product_attention(case["query"], case["key"], case["value"], attn_mask=mask)
        _assert_attention(masked_attention, case, output, weights, dtype=torch.float64)


def _empty_row_cases(device: torch.device) -> list[dict[str, Any]]:
    """Left padding under a causal mask, and a random per-head mask where a third of the rows are empty."""
    inputs = random_attention_inputs((2, 3), 5, 7, 4, 6, seed=90, device=device)  # [batch, heads, len, d]
    return [
        {**inputs, "mask": _left_padded_causal(device)},  # [batch, 1, q_len, k_len]
        {**inputs, "mask": _mask_with_empty_rows((2, 3, 5, 7), seed=91, device=device)},
    ]


_EMPTY_NOTE = "Rows whose mask allows no key must be 0; the other rows are the usual masked attention."


def check_masked_attention_empty_rows(masked_attention: Callable[..., Any]) -> None:
    """Rows whose mask allows no key get zero weights and a zero output, never NaN (float64 and float32)."""
    __tracebackhide__ = True
    for dtype in (torch.float64, torch.float32):
        for inputs in _empty_row_cases(default_device()):
            _assert_known_answer(masked_attention, inputs, dtype, _EMPTY_NOTE)


def check_masked_attention_half_precision(masked_attention: Callable[..., Any]) -> None:
    """The same rule holds in float16 and bfloat16: finite everywhere, exact zeros in rows with no key."""
    __tracebackhide__ = True
    for dtype in (torch.float16, torch.bfloat16):
        for inputs in _empty_row_cases(default_device()):
            _assert_known_answer(masked_attention, inputs, dtype, _EMPTY_NOTE)


def check_masked_attention_dtype_and_inputs(masked_attention: Callable[..., Any]) -> None:
    """The results keep the inputs' dtype and device, for 0, 1 and 2 leading axes; the inputs are untouched.

    Every mask row here allows a key, and float16 is left to the cell on half precision: this cell is about
    dtypes, shapes and side effects only.
    """
    __tracebackhide__ = True
    device = default_device()
    padding = torch.tensor(_TOKENS[:2], device=device).ne(0)[:, None, None, :]  # [batch, 1, 1, k_len]
    causal = torch.ones(5, 7, dtype=torch.bool, device=device).tril(2)  # [q_len, k_len]
    cases = [
        {**random_attention_inputs((2, 3), 5, 7, 4, 6, seed=100, device=device), "mask": padding},
        {**random_attention_inputs((3,), 5, 7, 4, 6, seed=101, device=device), "mask": causal},
        {
            **random_attention_inputs((), 5, 7, 4, 6, seed=102, device=device),
            "mask": _mixed_mask((5, 7), seed=103, device=device),
        },
    ]
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        for inputs in cases:
            _assert_known_answer(masked_attention, inputs, dtype)


def check_masked_attention_from_scratch(masked_attention: Callable[..., Any]) -> None:
    """masked_attention is correct and calls no built-in attention (F.scaled_dot_product_attention, ...)."""
    __tracebackhide__ = True
    try:
        check_masked_attention_matches_sdpa(masked_attention)
    except CheckFailure as failure:
        fail(f"{NAME} must be correct before it counts as written from scratch. {failure}")
    cases = _empty_row_cases(default_device())
    assert_from_scratch(masked_attention, NAME, cases, ATTENTION_BUILTINS, "masked attention")


# shapes of the hidden tests: (leading axes, q_len, k_len, d_k, d_v), every size different within a case
_REFERENCE_SHAPES = (((2, 3), 5, 7, 4, 6), ((3,), 6, 9, 8, 5), ((), 4, 3, 2, 5))


def masked_attention_against_reference(
    masked_attention: Callable[..., Any],
    reference: Callable[..., Any],
    *,
    empty_rows: bool,
    dtypes: tuple[torch.dtype, ...] = DTYPES,
    seed: int = 700,
) -> None:
    """Hidden test: agreement with the reference for several shapes and masks, in each of ``dtypes``.

    With ``empty_rows`` about a third of the mask's rows allow no key; without, every row allows one.
    """
    __tracebackhide__ = True
    device = default_device()
    for case, (lead, q_len, k_len, d_k, d_v) in enumerate(_REFERENCE_SHAPES):
        base = seed + 10 * case
        inputs: dict[str, Any] = random_attention_inputs(
            lead, q_len, k_len, d_k, d_v, seed=base, device=device
        )
        mask_shape = (*lead[:1], *([1] * len(lead[1:])), q_len, k_len)
        make_mask = _mask_with_empty_rows if empty_rows else _mixed_mask
        inputs["mask"] = make_mask(mask_shape, seed=base + 5, device=device)
        for dtype in dtypes:
            cast = {name: t.to(dtype) if t.is_floating_point() else t for name, t in inputs.items()}
            truth, naive_errors = reference_answer(reference, cast)
            _assert_attention(masked_attention, cast, *truth, dtype=dtype, naive_errors=naive_errors)


def masked_attention_from_scratch_everywhere(masked_attention: Callable[..., Any]) -> None:
    """Hidden test: no built-in attention on any path (every dtype, with and without empty rows)."""
    __tracebackhide__ = True
    device = default_device()
    cases = []
    for dtype in DTYPES:
        inputs = {
            name: t.to(dtype)
            for name, t in random_attention_inputs((3,), 6, 9, 8, 5, seed=60, device=device).items()
        }
        cases += [
            {**inputs, "mask": None},
            {**inputs, "mask": _mixed_mask((3, 6, 9), seed=61, device=device)},
            {**inputs, "mask": _mask_with_empty_rows((3, 1, 9), seed=62, device=device)},
        ]
    assert_from_scratch(masked_attention, NAME, cases, ATTENTION_BUILTINS, "masked attention")
