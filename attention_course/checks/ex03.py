"""Checks of exercise ex03: padding and causal masks, their combination, and masked attention.

Visible parts use known answers, properties and built-ins; hidden parts, the same behaviour on more inputs.
Mask values are read through their layout (axes of size 1, 0/1 of any dtype): cells of their own judge the
layout, dtypes, devices and in-place edits, so that one mistake costs one behaviour."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from attention_course.checks import attention_family as family
from attention_course.checks import engine
from attention_course.checks.attention_family import DTYPES, Sizes
from attention_course.checks.engine import Call, Check, FromScratch, Part, behaviour, describe, fail, shapes
from attention_course.device import seeded_generator

engine.meta_ready_in_a_notebook()  # the set-up cell imports the checks: no test cell waits for it

# likely causes and notes by name; "<mask> <axes>": of a wrong shape; "<function> raised <patterns>": errors
TEXT = engine.table("""
additive: an additive mask (0 allowed, -inf blocked) is another convention: the course's masks are boolean
marks padding: True marks the padding (as key_padding_mask does); here True = may attend: tokens != pad_id
hard-coded 0: the mask is tokens != 0 although pad_id={pad_id} was passed: use pad_id, not a hard-coded 0
padding is 0: the mask is tokens == 0: the pad_id={pad_id} argument is ignored and True marks the padding
padding dtype: tokens != pad_id is already boolean: drop the .long()/.int()/.float() (SDPA *adds* floats)
moved: the mask was moved: tokens != pad_id is made on the device of the tokens, with no .to()
causal dtype: torch.ones and tril make float32: use dtype=torch.bool (SDPA would *add* a float mask)
bottom-right: Query i stands at position i + k_len - q_len: the queries are the *last* q_len positions.
top-left: the triangle is aligned top-left (tril(), SDPA's is_causal=True): use tril(diagonal=k_len - q_len)
top-left without diagonal: aligned top-left, and the diagonal is excluded: use tril(diagonal=k_len - q_len)
without diagonal: the diagonal is excluded: a query may attend its own position (j <= i, not j < i)
one key too many: one key too many: query i also sees the next position; its last key is j = i + k_len - q_len
marks future: True marks the blocked (future) positions, nn.MultiheadAttention's convention: invert it (~)
transposed: the triangle is transposed (triu instead of tril): query i may attend the keys *before* it
transposed top-left: the triangle is transposed and aligned top-left: use tril(diagonal=k_len - q_len)
nothing masked: nothing is masked: the keys after each query's position must be False
causal device: the device argument is ignored: create the tensors with device=device (torch.ones, arange),
    where the scores are (this check uses 'meta', a device of shapes without data, so that it needs no GPU)
or: the masks are combined with | (or): a key may be attended only where *every* mask allows it: use &
one mask: only the {which} mask is used: combine every mask with &
and dtype: the and of boolean masks is boolean: combine them with & (or torch.logical_and), not * or +
broadcast: the result takes the masks' broadcast shape, as with & or torch.logical_and (not an in-place &=)
none: None stands for 'no mask' and must be skipped (`if mask is None: continue`)
no mask: with no mask at all the result is None (every key may be attended). Start from `combined = None`
in place: {call} modified its argument `{name}` in place, but callers reuse their masks. Likely cause:
    `combined = mask` then `combined &= other` changes the caller's mask: write `combined = combined & other`.
rule: The course's rule: a query whose mask row allows no key gets zero weights and a zero output.
NaN weights: with a -inf fill such a row is all -inf, and the softmax computes exp(-inf - (-inf)) = NaN,
    which no product fixes (NaN * 0 = NaN): *select* zeros where mask.any(dim=-1, keepdim=True) is False
uniform: the weights there are uniform (1/{k_len}): a finite fill (torch.finfo(dtype).min, -1e9) spreads the
    weight evenly over masked keys: torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0) zeroes them
normalised: these rows sum to 1 as if keys were allowed: make sure the mask is neither inverted nor ignored
not zero: find the rows with mask.any(dim=-1, keepdim=True) and set their weights to 0
NaN output: the output was computed from the weights before they were corrected (NaN weights @ value)
output: the output is not weights @ value for the weights returned: compute it from the corrected weights
padding batch len: add an axis for the heads and one for the queries, mask[:, None, None, :] (chapter 3)
padding batch 1 len: one axis is missing: [batch, 1, len] lines batch up with heads: mask[:, None, None, :]
padding batch len 1 1: the len axis must be the last one: padding closes keys, the last axis of the scores
padding batch 1 len 1: the mask is laid along the query axis: padding closes keys, the scores' last axis
padding 1 1 batch len: the batch axis must stay first: add the two new axes after it, mask[:, None, None, :]
padding len batch: the axes are swapped
causal q_len k_len: the mask is [q_len, k_len]: add the batch and heads axes in front, mask[None, None]
causal 1 q_len k_len: one axis is missing: the mask is [1, 1, q_len, k_len] (mask[None, None])
causal 1 1 k_len q_len: the axes are swapped: rows are queries (q_len), columns keys (k_len)
causal 1 1 q_len q_len: the k_len argument is ignored: the mask has k_len columns, one per key
causal more queries: the mask has q_len rows, one per query, also when q_len > k_len (then the first
    q_len - k_len queries attend no key): tril(diagonal=k_len - q_len) of a [q_len, k_len] tensor gives them
padding not 2-D: check tokens.dim() == 2 first and raise ValueError: tokens of another number of axes ([len],
    [batch, 1, len]) give a mask of the wrong shape, or an IndexError that does not say what is wrong
causal sizes: check q_len >= 1 and k_len >= 1 first (after k_len defaults to q_len, when it is None) and raise
    ValueError: torch.ones(0, k_len) makes an empty mask without complaint. Note `k_len or q_len` also
    replaces k_len=0, which must raise
combine type: check each mask's dtype (mask.dtype != torch.bool) and raise TypeError: & of a float and a bool
    tensor fails with another error, and a single 0/1 float or integer mask would pass through unchecked
combine shapes: masks whose shapes do not broadcast raise the RuntimeError of & (or torch.logical_and)
    itself: let it propagate rather than catch it and raise another type
masked type: check mask.dtype != torch.bool first and raise TypeError: a 0/1 integer or float mask (Hugging
    Face's attention_mask) is the caller's to convert with mask.bool(); mask == 0 or logical_not() would
    silently accept it
causal_mask raised meta tensor: the check uses the 'meta' device (shapes, no data): avoid .item(), .tolist()
causal_mask raised device() received an invalid: device defaults to None (PyTorch's default device):
    pass it on as it is, torch.ones(..., device=device); torch.device(None) raises
causal_mask raised NoneType: k_len defaults to None: set k_len = q_len when it is None
combine_masks raised NoneType: None stands for 'no mask' and must be skipped: `if mask is None: continue`
combine_masks raised doesn't match the broadcast shape: an in-place `&=` cannot grow its left side to the
    broadcast shape (and would change the caller's mask): write `combined = combined & mask`
combine_masks raised stack expects each tensor: torch.stack needs masks of one shape; & broadcasts them
masked_attention raised NoneType: mask may be None (no mask at all): handle it with `if mask is not None:`
masked_attention raised size of tensor | must match the size: mask.any(dim=-1) must keep the key axis
    (keepdim=True) to broadcast against the scores; with leading axes, use key.transpose(-2, -1), not key.T
""")


# The learner's docstrings clause by clause, and the behaviours that check each (tests/test_contracts.py).
CONTRACT = engine.table("""
padding_mask tokens: padding_mask_values, padding_mask_shape; [batch, len] int64 and int32, padded on the
    right to random lengths, a row without padding and one of padding only
padding_mask pad_id: padding_mask_values; left to its default 0, given 0, 1 (where 0 is a word) and 17
padding_mask returns: padding_mask_values, padding_mask_shape; True exactly where tokens != pad_id, boolean
    [batch, 1, 1, len], on the tokens' device (the checks' device)
padding_mask raises ValueError: padding_mask_shape; tokens of 1, 3 and 4 axes
causal_mask q_len: causal_mask_square, causal_mask_bottom_right, causal_mask_boolean; 1 to 9, below, equal to
    and above k_len (above: the first q_len - k_len rows attend no key, shape judged)
causal_mask k_len: causal_mask_square, causal_mask_bottom_right, causal_mask_boolean; left out (q_len), equal
    to q_len, larger by 1 to 9
causal_mask device: causal_mask_device; 'meta' as a string and a torch.device, the CPU, the checks' device,
    and left out (PyTorch's default device)
causal_mask returns: causal_mask_boolean, causal_mask_square, causal_mask_bottom_right; boolean [1, 1, q_len,
    k_len], query i may attend key j when j <= i + k_len - q_len
causal_mask raises ValueError: causal_mask_boolean; q_len 0, k_len 0, both 0, q_len 0 with k_len left out
causal_mask from scratch: causal_mask_from_scratch; no causal_lower_right, causal_upper_left, CausalBias
combine_masks masks: combine_masks_and, combine_masks_broadcasts, combine_masks_skips_none; 1 to 3 boolean
    masks of one shape or of broadcastable shapes, in both orders, None among them, none at all
combine_masks returns: combine_masks_and, combine_masks_broadcasts, combine_masks_skips_none; their and,
    boolean, of the broadcast shape, the masks untouched; None when every argument is None
combine_masks raises TypeError: combine_masks_and; a mask of 0/1 integers (first, or after None) or of 0/1
    floats (alone, or after a boolean mask)
combine_masks raises RuntimeError: combine_masks_broadcasts; masks whose shapes do not broadcast
masked_attention query: masked_attention_matches_sdpa, masked_attention_dtype_and_inputs; query, key and value
    with 2, 1 and no leading axes, q_len != k_len, d_k != d_v, left unchanged
masked_attention mask: masked_attention_matches_sdpa, masked_attention_empty_rows,
    masked_attention_half_precision; [batch, heads, q_len, k_len], [batch, q_len, k_len], [q_len, k_len],
    padding [batch, 1, 1, k_len], causal [1, 1, q_len, k_len], None; rows that allow no key
masked_attention returns: masked_attention_matches_sdpa, masked_attention_empty_rows,
    masked_attention_half_precision, masked_attention_dtype_and_inputs; SDPA's output and softmax's weights,
    zero weights and output in rows with no key (float64, float32, float16, bfloat16), the query's dtype and
    device
masked_attention raises TypeError: masked_attention_dtype_and_inputs; a mask of 0/1 integers, and of 0/1
    floats of the query's dtype
masked_attention from scratch: masked_attention_from_scratch; no built-in attention
""")


def _hints(function: str) -> engine.Hints:
    """Likely causes of the exceptions of ``function``: its rows ``<function> raised <patterns>`` of TEXT."""
    prefix = f"{function} raised "
    rows = tuple((key.removeprefix(prefix), hint) for key, hint in TEXT.items() if key.startswith(prefix))
    return rows + family.exception_hints()  # and einsum's


def _mask(call, shape, expected=None, mistakes=(), hints=None, dtype="", device=None, note="", row="query"):
    """A check of the mask ``call`` returns: boolean and exactly ``shape`` given ``dtype`` (a hint); on
    ``device = (device, hint)``; of the values ``expected()`` in any layout, else named by ``mistakes``."""
    hints, where = hints or {}, f"the mask returned by {call}"

    def judge(result: Any) -> None:
        if not isinstance(result, torch.Tensor):
            fail(f"{call} should return a boolean tensor, got {describe(result)}.")
        if dtype:
            engine.assert_shape(result, where, shape, hints, torch.bool)
            if result.dtype != torch.bool:
                fail(f"{where} has dtype {result.dtype}, expected torch.bool: masks are boolean.", dtype)
        if device and result.device != torch.empty(0, device=device[0]).device:  # as tensors say it: cuda:0
            fail(f"{where} is on {result.device}, but {device[0]!r} was expected.", device[1])
        if expected is None:
            return
        sizes = [n for n in result.shape if n != 1]  # the layout aside
        if sizes != [n for n in shape if n != 1]:
            cause = next((hint for axes, hint in hints.items() if [n for n in axes if n != 1] == sizes), "")
            got = f"shape {list(result.shape)}, expected {list(shape)} (with any axes of size 1)"
            fail(f"{where} has {got}.", cause)
        values, right = result.detach().cpu(), expected().cpu().reshape(shape)
        if values.dtype != torch.bool and not ((values == 0) | (values == 1)).all():
            fail(f"{where} has values other than 0 and 1 ({describe(result)}).", TEXT["additive"])
        values = (values != 0).reshape(shape)
        if torch.equal(values, right):
            return
        wrong, k_len = values != right, right.shape[-1]
        first = torch.nonzero(wrong)[0].tolist()
        message = f"{where} is wrong at {int(wrong.sum())} of {wrong.numel()} positions, first at {first}"
        message += f" ({bool(values[tuple(first)])}, expected {bool(right[tuple(first)])})"
        if right.dim() == 2 and right.shape[0] <= 10 and k_len <= 16:  # side by side, a line per row
            drawn = [[" ".join(".1"[x] for x in line) for line in mask.tolist()] for mask in (right, values)]
            message += f"; 1 = may attend, . = blocked, a row per {row}:"
            for left, returned in zip(["expected", *drawn[0]], ["returned", *drawn[1]], strict=True):
                message += f"\n    {left.ljust(2 * k_len + 2)}{returned}"
        cause = next((hint for hint, mistake in mistakes if torch.equal(mistake.cpu(), values)), "")
        fail(message, cause, notes=(note,) if note else ())

    return Check(call, judge)


def _call(part: Part, *masks: torch.Tensor | None, **arguments: Any) -> Call:
    """A call with keyword ``arguments`` (those that are None left to their defaults), else of ``*masks``."""
    if arguments:
        return part.call(**{name: value for name, value in arguments.items() if value is not None})
    return Call(part.function, {f"masks[{i}]": mask for i, mask in enumerate(masks)}, positional=True)


# 1. padding_mask
TOKENS = [[5, 3, 9, 2, 0, 0, 0], [7, 1, 0, 0, 0, 0, 0], [4, 8, 6, 3, 2, 9, 1]]  # [batch=3, len=7], pad 0
TOKENS_PAD_1 = [[5, 0, 9, 2, 1, 1, 1], [7, 4, 1, 1, 1, 1, 1]]  # [batch=2, len=7], pad 1: id 0 is a word
# the hidden parts' tokens: (batch, len, pad_id, dtype), ids in [0, 20) padded on the right to random lengths
PADDING_CASES = ((4, 9, 0, torch.long), (2, 3, 1, torch.long), (5, 6, 17, torch.int), (1, 8, 0, torch.int))


def _tokens(part: Part) -> Iterator[tuple[torch.Tensor, int | None]]:
    """``(tokens [batch, len], pad_id)`` of the part; pad_id None is left to its default, 0."""
    if not part.hidden:  # the last: a sequence without padding, and one of padding only
        cases = ((TOKENS, None, torch.long), (TOKENS_PAD_1, 1, torch.int), ([[3] * 4, [0] * 4], 0, torch.int))
        yield from ((torch.tensor(t, dtype=dtype, device=part.device), pad) for t, pad, dtype in cases)
    for seed, (batch, length, pad_id, dtype) in enumerate(PADDING_CASES if part.hidden else ()):
        generator = seeded_generator(500 + seed)
        tokens = torch.randint(0, 20, (batch, length), generator=generator)
        padded = torch.arange(length) >= torch.randint(0, length + 1, (batch, 1), generator=generator)
        yield tokens.masked_fill(padded, pad_id).to(part.device, dtype), pad_id


@behaviour(function="padding_mask", points=1)
def padding_mask_values(part: Part) -> Iterator[Check]:
    """padding_mask is True exactly where the token is not pad_id (default 0, or another)."""
    answer = part.reference if part.hidden else torch.ne
    for tokens, pad_id in _tokens(part):
        hints, pad = shapes(TEXT, "padding", batch=tokens.size(0), len=tokens.size(1)), pad_id or 0
        wrong = {"marks padding": tokens == pad, "hard-coded 0": tokens != 0, "padding is 0": tokens == 0}
        mistakes = [(TEXT[name].format(pad_id=pad), mask) for name, mask in wrong.items()]
        expected, call = functools.partial(answer, tokens, pad), _call(part, tokens=tokens, pad_id=pad_id)
        yield _mask(call, tokens.shape, expected, mistakes, hints, row="sequence")


@behaviour(function="padding_mask", points=1)
def padding_mask_shape(part: Part) -> Iterator[Check]:
    """padding_mask returns a boolean [batch, 1, 1, len] mask on the device of the tokens."""
    for tokens, pad_id in _tokens(part):
        (batch, length), call = tokens.shape, _call(part, tokens=tokens, pad_id=pad_id)
        hints, device = shapes(TEXT, "padding", batch=batch, len=length), (tokens.device, TEXT["moved"])
        yield _mask(call, (batch, 1, 1, length), hints=hints, dtype=TEXT["padding dtype"], device=device)
    # the docstring's ValueError: tokens of one axis, and of three (a [batch, 1, len] mask given as tokens)
    for shape in ((4,), (2, 1, 5)) if not part.hidden else ((7,), (3, 2, 4), (1, 1, 1, 6)):
        tokens = torch.arange(1, 1 + math.prod(shape), device=part.device).reshape(shape)
        condition = f"for tokens of shape {list(shape)} (not [batch, len])"
        yield engine.raises(_call(part, tokens=tokens), "ValueError", condition, TEXT["padding not 2-D"])


# 2. causal_mask; its rule forbids torch.nn.attention.bias's causal_lower_right, causal_upper_left, CausalBias
CAUSAL_RULE = FromScratch("the causal mask", ("lower_right", "upper_left", "causalbias", "_materialize"))
# (q_len, k_len) of the visible and the hidden part; k_len None is left out (it defaults to q_len)
SQUARE = (((5, None), (1, None), (7, None), (4, 4)), ((6, None), (1, None), (8, 8)))
BOTTOM_RIGHT = (((3, 6), (1, 5), (4, 7), (2, 9)), ((2, 11), (1, 8), (5, 12), (9, 10)))
CAUSAL_SIZES = (((5, 7), (1, 6), (6, 4)), ((6, 6), (2, 11), (1, 1), (1, 8), (5, 12), (9, 10), (8, 8), (7, 3)))
# (q_len, k_len) that the docstring refuses with a ValueError; k_len None is left to its default
CAUSAL_INVALID = (((0, 3), (2, 0), (0, None)), ((0, 1), (4, 0), (0, 0), (0, None)))


@behaviour(function="causal_mask", points=1, hints=_hints("causal_mask"))
def causal_mask_square(part: Part) -> Iterator[Check]:
    """With k_len left out the mask is the lower triangle, diagonal included."""
    yield from causal_mask_bottom_right.plan(part, SQUARE)  # the same rule, with k_len = q_len


@behaviour(function="causal_mask", points=2, hints=_hints("causal_mask"))
def causal_mask_bottom_right(part: Part, sizes=BOTTOM_RIGHT) -> Iterator[Check]:
    """With q_len < k_len the triangle is aligned bottom-right, as a KV cache needs."""
    # query i may attend keys j <= i + k_len - q_len; sizes: SQUARE or BOTTOM_RIGHT
    for q_len, given in sizes[part.hidden]:
        k_len = given or q_len
        ones, offset = torch.ones(q_len, k_len, dtype=torch.bool), k_len - q_len
        # known mistakes, in the order they are tried: (the name in TEXT, the triangle, its diagonal)
        rows = [("top-left", torch.tril, 0), ("top-left without diagonal", torch.tril, -1)] if offset else []
        rows += [("without diagonal", torch.tril, offset - 1), ("one key too many", torch.tril, offset + 1)]
        rows += [("marks future", torch.triu, offset + 1), ("transposed", torch.triu, offset)]
        rows += [("transposed top-left", torch.triu, 0)] if offset else []
        rows.append(("nothing masked", torch.tril, k_len))
        mistakes = [(TEXT[name], triangle(ones, diagonal)) for name, triangle, diagonal in rows]
        expected = functools.partial(part.reference, q_len, k_len) if part.hidden else ones.tril(offset).clone
        hints, note = shapes(TEXT, "causal", q_len=q_len, k_len=k_len), TEXT["bottom-right"] if offset else ""
        call = _call(part, q_len=q_len, k_len=given, device=part.device)
        yield _mask(call, (q_len, k_len), expected, mistakes, hints, note=note)


@behaviour(function="causal_mask", points=1, hints=_hints("causal_mask"))
def causal_mask_boolean(part: Part) -> Iterator[Check]:
    """causal_mask returns a boolean mask of shape [1, 1, q_len, k_len]."""
    for q_len, k_len in CAUSAL_SIZES[part.hidden]:
        hints = shapes(TEXT, "causal", q_len=q_len, k_len=k_len)
        if q_len > k_len:  # any other number of rows: the queries that attend no key were dropped
            hints = {(1, 1, rows, k_len): TEXT["causal more queries"] for rows in range(q_len)} | hints
        call = _call(part, q_len=q_len, k_len=k_len, device=part.device)
        yield _mask(call, (1, 1, q_len, k_len), hints=hints, dtype=TEXT["causal dtype"])
    for q_len, k_len in CAUSAL_INVALID[part.hidden]:  # the docstring's ValueError
        call = _call(part, q_len=q_len, k_len=k_len, device=part.device)
        condition = f"for q_len={q_len}, k_len={k_len} (both must be at least 1)"
        yield engine.raises(call, "ValueError", condition, TEXT["causal sizes"])


@behaviour(function="causal_mask", points=1, hints=_hints("causal_mask"))
def causal_mask_device(part: Part) -> Iterator[Check]:
    """causal_mask builds the mask on the device it is given."""
    sizes = ((1, 4), (2, 7), (6, 6), (4, 9)) if part.hidden else ((3, 5),)
    devices = ("meta", part.device, "cpu") if part.hidden else (torch.device("meta"), "meta", part.device)
    for (q_len, k_len), device in itertools.product(sizes, devices):
        call = _call(part, q_len=q_len, k_len=k_len, device=device)
        yield _mask(call, (1, 1, q_len, k_len), device=(device, TEXT["causal device"]))
    for q_len, k_len in sizes[:2]:  # device left out (None): PyTorch's default device
        call = _call(part, q_len=q_len, k_len=k_len)
        yield _mask(call, (1, 1, q_len, k_len), device=(torch.get_default_device(), TEXT["causal device"]))


@behaviour(function="causal_mask", points=1, hints=_hints("causal_mask"))
def causal_mask_from_scratch(part: Part) -> Iterator[Check]:
    """causal_mask is correct and does not call PyTorch's causal_lower_right."""
    cases = itertools.product(((1, 6), (5, 5), (3, 8)), (part.device, "cpu"))
    if not part.hidden:
        for plan in (causal_mask_square.plan, causal_mask_bottom_right.plan):
            yield from engine.correct_first(plan(part), part.function)
        cases = [((3, 6), part.device), ((4, None), part.device)]
    yield CAUSAL_RULE.check([_call(part, q_len=q, k_len=k, device=device) for (q, k), device in cases])


# 3. combine_masks
# the hidden parts' shapes: the same shape (for the and, and None), or broadcastable; axes of different sizes
SAME_SHAPES = ((4, 1, 6, 9), (2, 3, 4, 5), (6, 9), (3, 2, 1, 8))
BROADCAST_SHAPES = (((1, 1, 6, 9), (4, 1, 1, 9)), ((4, 1, 1, 9), (1, 3, 6, 9), (6, 9)))
BROADCAST_SHAPES += (((2, 3, 4, 5), (2, 1, 1, 5), (1, 1, 4, 5)), ((9,), (6, 1), (4, 1, 1, 1)))


def _random_masks(part: Part, shapes: Sequence[Sequence[int]], seed: int) -> list:
    """Random boolean masks of ``shapes`` (the family's: about 30% False, a True in every row)."""
    return [family.mask(shape, seed=seed + i, device=part.device) for i, shape in enumerate(shapes)]


def _example_masks(part: Part) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A causal ``[1, 1, 5, 7]``, a padding ``[3, 1, 1, 7]`` and a random ``[3, 2, 5, 7]`` mask."""
    causal = torch.ones(1, 1, 5, 7, dtype=torch.bool, device=part.device).tril(2)  # [1, 1, q_len, k_len]
    padding = torch.tensor(TOKENS, device=part.device).ne(0)[:, None, None, :]  # [batch, 1, 1, k_len]
    return causal, padding, *_random_masks(part, [(3, 2, 5, 7)], seed=71)


@behaviour(function="combine_masks", points=1, hints=_hints("combine_masks"))
def combine_masks_and(part: Part) -> Iterator[Check]:
    """combine_masks of masks of one shape is their logical and, a boolean mask."""
    first, second, third = _random_masks(part, [(3, 2, 5, 7)] * 3, seed=70)
    cases = [[first, second], [first, second, third], [second]]
    if part.hidden:
        shapes = itertools.product(enumerate(SAME_SHAPES), (2, 3))
        cases = [_random_masks(part, [shape] * n, seed=600 + 10 * case + n) for (case, shape), n in shapes]
    answer = part.reference if part.hidden else lambda *masks: torch.stack(masks).all(dim=0)
    only_first, only_last = (TEXT["one mask"].format(which=which) for which in ("first", "last"))
    for masks in cases:
        mistakes = [(TEXT["or"], torch.stack(masks).any(0)), (only_first, masks[0]), (only_last, masks[-1])]
        expected = functools.partial(answer, *masks)
        yield _mask(_call(part, *masks), masks[0].shape, expected, mistakes, dtype=TEXT["and dtype"])
    # the docstring's TypeError: a mask that is not boolean, alone, after a boolean one, or beside None
    for masks in _not_boolean(part, (3, 2, 5, 7) if not part.hidden else (4, 1, 6, 9)):
        given = ", ".join(describe(mask) for mask in masks if mask is not None)
        condition = f"when a mask is not boolean ({given})"
        yield engine.raises(_call(part, *masks), "TypeError", condition, TEXT["combine type"])


def _not_boolean(part: Part, shape: Sequence[int]) -> list[list[torch.Tensor | None]]:
    """Lists of masks with one not boolean: 0/1 integers (as a Hugging Face attention_mask), 0/1 floats.

    Integers come first: & of a bool and a float tensor raises NotImplementedError, which reads as the blank
    stub's, while & of integers returns, so that a missing check is named."""
    allowed = family.mask(shape, seed=690, device=part.device)
    floats, integers = allowed.roll(1, dims=-1).double(), allowed.flip(-1).long()
    cases = [[integers, allowed], [floats], [allowed, floats]]
    return cases + ([[None, integers]] if part.hidden else [])


def _consistent(part: Part, masks: Sequence[torch.Tensor | None], hint: str, untouched: str = "") -> Check:
    """``combine_masks(*masks)`` is the learner's own combine_masks of the same masks without None and of one
    shape (so that only broadcasting, or skipping None, is judged); None if no mask at all."""
    call, given = _call(part, *masks), [mask for mask in masks if mask is not None]
    if not given:

        def judge_none(result: Any) -> None:
            if result is not None:
                fail(f"{call} returned {describe(result)}, expected None.", TEXT["no mask"])

        return Check(call, judge_none)
    shape, where = torch.broadcast_shapes(*(mask.shape for mask in given)), f"the mask returned by {call}"
    calls = (call, _call(part, *(mask.expand(shape).clone() for mask in given)))

    def judge(result: Any, plain: Any) -> None:
        for value, call in zip((result, plain), calls, strict=True):
            if not isinstance(value, torch.Tensor):
                fail(f"{call} should return a boolean tensor, got {describe(value)}.")
        if result.shape != plain.shape:
            fail(f"{where} has shape {list(result.shape)}, expected {list(plain.shape)}.", hint)
        differ = int((result.cpu() != plain.cpu().to(result.dtype)).sum())
        if differ:
            fail(f"{where} differs at {differ} positions from that of {calls[1]}, of the same masks.", hint)

    return Check(calls, judge, untouched=untouched or False)


@behaviour(function="combine_masks", points=1, hints=_hints("combine_masks"))
def combine_masks_broadcasts(part: Part) -> Iterator[Check]:
    """Masks of broadcastable shapes combine to the broadcast shape, inputs untouched."""
    causal, padding, full = _example_masks(part)
    cases = [[causal, padding], [padding, causal], [full, causal, padding]]  # the last: the first is widest
    if part.hidden:
        drawn = (_random_masks(part, shapes, 610 + 10 * case) for case, shapes in enumerate(BROADCAST_SHAPES))
        cases = [order for masks in drawn for order in (masks, masks[::-1])]
    yield from (_consistent(part, masks, TEXT["broadcast"], TEXT["in place"]) for masks in cases)
    # the docstring's RuntimeError: shapes that do not broadcast
    pairs = [((3, 1, 5, 7), (2, 1, 5, 7))] if not part.hidden else [((4, 9), (6, 9)), ((2, 1, 6, 9), (6, 8))]
    for shapes_ in pairs:
        masks = _random_masks(part, shapes_, seed=695)
        condition = f"for masks of shapes {[list(s) for s in shapes_]}, which do not broadcast"
        yield engine.raises(_call(part, *masks), "RuntimeError", condition, TEXT["combine shapes"])


@behaviour(function="combine_masks", points=1, hints=_hints("combine_masks"))
def combine_masks_skips_none(part: Part) -> Iterator[Check]:
    """None entries are skipped, and with no mask at all the result is None."""
    full = _example_masks(part)[2]
    other = ~full.roll(1, dims=-1)  # [3, 2, 5, 7], the same shape: this cell is not about broadcasting
    cases = [[None, full], [full, None, other], [full, other, None], [None], [None, None], []]
    if part.hidden:
        drawn = (_random_masks(part, [shape] * 2, 620 + 10 * case) for case, shape in enumerate(SAME_SHAPES))
        cases = [c for a, b in drawn for c in ([a, None], [None, None, a, None, b], [a, None, b, None])]
        cases.append([None] * 3)
    yield from (_consistent(part, masks, TEXT["none"]) for masks in cases)


# 4. masked_attention
VISIBLE = Sizes((3, 2), 5, 7, 4, 6)  # every size different, so that a swapped axis cannot pass
LEAD_SIZES = tuple(Sizes(lead, 5, 7, 4, 6) for lead in family.LEADS)  # with 2, 1 and no leading axes


def _hidden(part: Part, kind: str | None, dtypes: Sequence, seed: int, **options) -> Iterator[Check]:
    """The family's checks of the hidden parts, with a mask of the family's ``kind`` (None: no mask)."""

    def make(sizes: Sizes, seed: int, dtype: torch.dtype) -> dict:
        shape = family.mask_shape(sizes)
        mask = family.mask(shape, seed=seed + 5, device=part.device, kind=kind) if kind else None
        return {**family.qkv(sizes, seed=seed, device=part.device, dtype=dtype), "mask": mask}

    return family.hidden_checks(part, make, dtypes, seed, **options)


def _rule(output: torch.Tensor, weights: torch.Tensor, call: Call) -> None:
    """The exact rule on the rows whose mask allows no key: weights 0, output 0, nothing NaN or inf."""
    empty = (~call.arguments["mask"].any(dim=-1)).cpu().expand(weights.shape[:-1])  # [..., q_len]
    if not empty.any():
        return
    weights, output = (x.detach().cpu().double()[empty] for x in (weights, output))  # [rows, ...]
    first, rule, k_len = torch.nonzero(empty)[0].tolist(), TEXT["rule"], weights.size(-1)
    where = f"in the {int(empty.sum())} rows whose mask allows no key (the first at index {first})"
    if not torch.isfinite(weights).all():
        fail(f"the weights of {call} are NaN or inf {where}. {rule}", TEXT["NaN weights"])
    if (weights != 0).any():
        cause, sums = TEXT["uniform"].format(k_len=k_len), weights.sum(dim=-1)
        if not torch.allclose(weights, torch.full_like(weights, 1 / k_len), atol=1e-2):
            normalised = torch.allclose(sums, torch.ones_like(sums), atol=1e-2)
            cause = TEXT["normalised" if normalised else "not zero"]
        fail(f"the weights of {call} are not 0 {where} (largest {weights.abs().max():.4g}). {rule}", cause)
    if not (output == 0).all():  # NaN or inf included
        nan = not torch.isfinite(output).all()
        wrong = "NaN or inf" if nan else f"not 0 (largest {output.abs().max():.4g})"
        cause = TEXT["NaN output" if nan else "output"]
        fail(f"the output of {call} is {wrong} {where}, although the weights there are 0. {rule}", cause)


@behaviour(function="masked_attention", points=2, hints=_hints("masked_attention"))
def masked_attention_matches_sdpa(part: Part) -> Iterator[Check]:
    """With masks of several shapes (each row allowing a key), or none, it agrees with SDPA."""
    if part.hidden:
        yield from (check for kind in ("mixed", None) for check in _hidden(part, kind, DTYPES[:2], seed=700))
        return
    (causal, padding, _), device = _example_masks(part), part.device
    shapes = ((3, 2, 5, 7), (5, 7))  # [batch, heads, q_len, k_len], [q_len, k_len], each row mixed
    mixed = (family.mask(shape, seed=81 + i, device=device, kind="mixed") for i, shape in enumerate(shapes))
    arguments = family.qkv(VISIBLE, seed=80, device=device)  # [batch, heads, len, d]
    for mask in (*mixed, padding, causal, None):
        yield family.attention_check(part, {**arguments, "mask": mask}, VISIBLE, family.builtin())
    for seed, sizes in enumerate(LEAD_SIZES[1:]):  # 1 and no leading axes too, as the hidden part has
        mask = family.mask(family.mask_shape(sizes), seed=84 + seed, device=device, kind="mixed")
        inputs = {**family.qkv(sizes, seed=85 + seed, device=device), "mask": mask}
        yield family.attention_check(part, inputs, sizes, family.builtin())


@behaviour(function="masked_attention", points=2, hints=_hints("masked_attention"))
def masked_attention_empty_rows(part: Part, dtypes=DTYPES[:2], seed=700) -> Iterator[Check]:
    """Rows whose mask allows no key get zero weights and a zero output (float64, float32)."""
    # the rule on masks with rows that allow no key, then every value; other cells use it in other dtypes
    if part.hidden:
        yield from _hidden(part, "empty rows", dtypes, seed=seed, extra=_rule)
        return
    tokens = torch.tensor([[0, 0, 0, 0, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7], [0, 0, 3, 4, 5, 6, 7]])
    # causal and left padding (queries 0 and 1 of sentence 0 see only padding); a third of the rows empty
    left_padded = (tokens.to(part.device) != 0)[:, None, None, :] & _example_masks(part)[0]
    cases = [(VISIBLE, left_padded)]  # and masks with empty rows, for 2, 1 and no leading axes
    for i, sizes in enumerate(LEAD_SIZES):
        mask = family.mask(family.mask_shape(sizes), seed=91 + i, device=part.device, kind="empty rows")
        cases.append((sizes, mask))
    for dtype, (sizes, mask) in itertools.product(dtypes, cases):
        inputs = {**family.qkv(sizes, seed=90, device=part.device, dtype=dtype), "mask": mask}
        yield family.attention_check(part, inputs, sizes, family.plain(), note=TEXT["rule"], extra=_rule)


@behaviour(function="masked_attention", points=1, hints=_hints("masked_attention"))
def masked_attention_half_precision(part: Part) -> Iterator[Check]:
    """The same rule holds in float16 and bfloat16: finite, with exact zeros in rows with no key."""
    yield from masked_attention_empty_rows.plan(part, (torch.float16, torch.bfloat16), seed=750)


@behaviour(function="masked_attention", points=1, hints=_hints("masked_attention"))
def masked_attention_dtype_and_inputs(part: Part) -> Iterator[Check]:
    """The results keep the inputs' dtype and device (0 to 2 leading axes); inputs untouched."""
    dtypes = (torch.float32, torch.bfloat16, torch.float64)
    if part.hidden:
        yield from _hidden(part, "mixed", dtypes, seed=780, formats=True)
        sizes = family.HIDDEN_SIZES[1]
        yield from _mask_not_boolean(
            part, sizes, family.mask(family.mask_shape(sizes), seed=785, device=part.device)
        )
        return
    causal, padding, _ = _example_masks(part)  # 2, 1, 0 leading axes; no empty rows (the rule's cells)
    mixed = family.mask((5, 7), seed=103, device=part.device, kind="mixed")  # [q_len, k_len]
    cases = [(VISIBLE, padding), (Sizes((2,), 5, 7, 4, 6), causal[0, 0]), (Sizes((), 5, 7, 4, 6), mixed)]
    for dtype, (seed, (sizes, mask)) in itertools.product(dtypes, enumerate(cases)):
        arguments = {**family.qkv(sizes, seed=100 + seed, device=part.device, dtype=dtype), "mask": mask}
        yield family.attention_check(part, arguments, sizes, family.plain(), formats=True)
    yield from _mask_not_boolean(part, VISIBLE, padding)


def _mask_not_boolean(part: Part, sizes: Sizes, mask: torch.Tensor) -> Iterator[Check]:
    """The docstring's TypeError for a mask of 0/1 floats (of the query's dtype) or of 0/1 integers."""
    arguments = family.qkv(sizes, seed=109, device=part.device)
    for wrong in (mask.to(arguments["query"].dtype), mask.long()):
        condition = f"when the mask is not boolean ({describe(wrong)})"
        yield engine.raises(part.call(**arguments, mask=wrong), "TypeError", condition, TEXT["masked type"])


@behaviour(function="masked_attention", points=1, hints=_hints("masked_attention"))
def masked_attention_from_scratch(part: Part) -> Iterator[Check]:
    """masked_attention is correct and calls no built-in attention."""
    checks = (c for kind in (None, "mixed", "empty rows") for c in _hidden(part, kind, DTYPES, seed=60))
    if not part.hidden:
        yield from engine.correct_first(masked_attention_matches_sdpa.plan(part), part.function)
        checks = masked_attention_empty_rows.plan(part, (torch.float64,), seed=0)
    yield family.from_scratch("masked attention").check([check.calls[0] for check in checks])
