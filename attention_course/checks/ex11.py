"""Checks of exercise ex11: the online softmax's merge, and tiled attention in O(n) memory.

Visible parts use known answers: a merge worked out by hand; the state of all the keys computed directly from
their scores; ``F.scaled_dot_product_attention`` and the formula in float64. Hidden parts compare with the
reference on more sizes, block sizes and dtypes. Known mistakes are rows of two parametrised computations
written here, :func:`merge` and :func:`tiled` (the running sum not rescaled, the factor the wrong way round,
the max not updated, the last partial block dropped, ...), tried with the attention family's core rows; a
result that is NaN is matched by where it is NaN.

The memory cell calls the learner's ``tiled_attention`` through a ``Driver`` whose ``run`` wraps the call in
an :class:`~attention_course.memory.AllocationTracker`: in the learner's process (the kernel, under
``attention-grade``), it returns the output and the size of the largest floating-point tensor that the call
created, as data, and the judge, wherever it runs, bounds that size.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from attention_course.checks import attention_family as family
from attention_course.checks import engine
from attention_course.checks.attention_family import Sizes
from attention_course.checks.engine import (
    Call,
    Check,
    CheckFailure,
    Driver,
    Mistake,
    Part,
    assert_format,
    assert_shape,
    assert_values,
    behaviour,
    describe,
    fail,
    type_name,
)
from attention_course.device import seeded_generator
from attention_course.memory import AllocationTracker

TEXT = engine.table("""
max not updated: the merged max is max_a: it is the larger of the two, torch.maximum(max_a, max_b)
max of b: the merged max is max_b: it is the larger of the two, torch.maximum(max_a, max_b)
max smaller: the merged max is the smaller of the two: it is torch.maximum(max_a, max_b)
max shift: where neither state has seen a key the merged max must stay -inf (the max of no score); the 0
    put in its place to avoid exp(-inf - (-inf)) is only for exponentiating
sum not rescaled: the running sum is not rescaled: when the max rises from m to m_new, the sum so far must be
    multiplied by exp(m - m_new), as the output is
output not rescaled: the output is not rescaled: when the max rises from m to m_new, the output so far must be
    multiplied by exp(m - m_new), as the sum is
flipped: the rescaling factor is exp(m_new - m), the wrong way round: it must be exp(m - m_new), at most 1
    (with m = -inf at the start, exp(m_new - m) is inf, and inf * 0 is NaN)
normalised: the merged output is divided by the merged sum: the state keeps the output unnormalised, and only
    the caller divides by the sum, once, at the end
weighted by sums: this is the merge of normalised outputs (Dao et al. 2022, algorithm 1, line 12): here the
    states keep o unnormalised, so o = exp(m_a - m) o_a + exp(m_b - m) o_b
no guard: exp(-inf - (-inf)) is NaN: where a query has seen no allowed key yet (its max is -inf, in a state or
    after a whole block of masked keys), subtract 0 instead of the max, max.masked_fill(max == -inf, 0.0), so
    that exp(-inf - 0) = 0
max not kept: the running max is never updated (m = m_new is missing): each block then rescales the state by
    exp(-inf) = 0 and only the last block of keys counts
first max kept: the running max stays the first block's: a later block with larger scores overflows exp();
    the max must be updated to max(m, block max) at every block
block max only: each block is shifted by its own max instead of max(m, block max): when the scores drop, the
    factor exp(m - block max) overflows; use m_new = max(m, block max) for both
per block: each block's output is divided by its own sum: keep the output unnormalised (weights @ value with
    weights = exp(scores - m_new)) and divide by the running sum once, at the end
not divided: the output is not divided by the running sum at the end: return output / sum
last block dropped: the last, shorter block of keys is dropped: when k_len is not a multiple of block_size the
    last block has k_len % block_size keys (range(0, k_len, block_size), and slicing clips at the end)
mask after exp: the mask is applied after exp(): the max then includes the masked scores, which may be huge (a
    padding key can hold anything) and make every allowed weight underflow to 0; fill masked scores with -inf
    before taking the max
rule: The course's rule (chapter 3): a query whose mask allows no key gets a zero output.
NaN rows: such a query's state stays (-inf, 0, 0): exp(-inf - (-inf)) is NaN in the loop unless the max is
    replaced by 0 there, and output / sum is 0/0 at the end unless the division is skipped where the sum is 0
    (torch.where(sum > 0, sum, 1.0))
uniform: its output is the average of the values: masked scores were filled with a finite number
    (torch.finfo(dtype).min, -1e9), which becomes the max and gives every masked key weight exp(0) = 1; fill
    them with -inf, and let the guard on -inf keep the state empty
not zero: find the rows whose mask allows no key (the running sum is 0 there) and return 0 for them
full scores: the whole score matrix [..., q_len, k_len] (or one as large) is formed: compute the scores one
    block of keys at a time, query @ key[..., start:stop, :].transpose(-2, -1), and merge each block into
    the running state before the next
too large: keep one block of scores, [..., q_len, block_size], at a time; do not stack or concatenate the
    blocks' scores or weights
tuple: tiled_attention returns the output alone, [..., q_len, d_v], not a tuple
state tuple: online_softmax_merge returns the merged state as a tuple (max, sum, out)
output q_len k_len: the result has one column per key: return the output, the weights times the values,
    [..., q_len, d_v]
output q_len d_k: the output has the width of the values (d_v), not of the keys
max q_len 1: the max is [..., q_len], without a trailing axis of 1 (keepdim=False)
sum q_len 1: the sum is [..., q_len], without a trailing axis of 1 (keepdim=False)
shift clamped: the shift is clamped at 0 (max(m, 0)): where every score of a query is far below 0, exp(score -
    0) underflows to 0 and the query's weights are lost; shift by the max itself, and use 0 only where the max
    is -inf
max from 0: the running max starts at 0 instead of -inf (or the shift is clamped at 0): where every score of a
    query is far below 0, exp(score - 0) underflows to 0 and the query's weights are lost; start the max at
    -inf and shift by the true max, using 0 only where it is -inf
half sentinel: the value put in place of a max of -inf must be finite in the inputs' dtype: -1e30 (or
    torch.finfo(torch.float32).min) is -inf in float16, whose largest magnitude is 65504, and exp(-inf -
    (-inf)) is NaN; shift by 0 there
half eps: in float16 a small number added to the sum (1e-30, 1e-12) rounds to 0 (the smallest positive
    float16 is 6e-8), so 0/0 is NaN still
broadcast: the two states' leading axes broadcast ([2, 3, q_len] with [3, q_len]): use element-wise
    operations (torch.maximum, *, +), or torch.broadcast_tensors before torch.stack
block size: check block_size first and raise ValueError if it is below 1 (with a negative step, range() is
    empty and no key is ever seen)
shapes: check the shapes first: raise ValueError when query and key differ in d_k (query.size(-1) !=
    key.size(-1)) or key and value in k_len (key.size(-2) != value.size(-2)); slicing value by blocks of keys
    silently ignores its extra positions
mask type: check the mask's dtype first and raise TypeError unless it is torch.bool: a mask of 0/1 integers or
    floats is not boolean (~ of an integer is not logical not, and masked_fill refuses it)
squeezed: an axis of size 1 (one query, one key, a leading axis of 1) was lost: squeeze() without an axis
    removes every axis of size 1; use squeeze(-1), or amax(dim=-1) without keepdim
one column: a mask of one key column, [..., q_len, 1], broadcasts over every key: expand it to the keys first,
    mask.expand(*mask.shape[:-1], k_len), since mask[..., start:stop] of a single column is empty past start 0
""")
HINTS = family.exception_hints("""
size of tensor a (0) | size of tensor b (0): a block of the mask is empty: a mask of one key column ([...,
    q_len, 1], which broadcasts over every key) has nothing at mask[..., start:stop] past start 0: expand it
    to k_len keys first, mask.expand(*mask.shape[:-1], k_len)
stack expects each tensor to be equal size: the two states' leading axes broadcast ([2, 3, q_len] with [3,
    q_len]): use element-wise operations (torch.maximum), or torch.broadcast_tensors before torch.stack
too many indices | IndexError: a mask may have fewer axes than the scores ([q_len, k_len], [batch, 1, 1,
    k_len]): slice it along its last axis, mask[..., start:stop]
NoneType: mask may be None (no mask at all): handle it with `if mask is not None:`
must match the size of tensor | The size of tensor a: shapes do not line up: the states' max and sum are
    [..., q_len] and the output [..., q_len, d_v], so a per-query factor needs .unsqueeze(-1) before it
    multiplies the output; a mask is sliced along its last (key) axis, mask[..., start:stop]
""")
MUST_BE_CORRECT = "tiled_attention must be correct before its memory counts. "

# The learner's docstrings clause by clause, and the behaviours that check each (tests/test_contracts.py).
CONTRACT = engine.table("""
online_softmax_merge max_a: merge_two_blocks, merge_empty_states, merge_dtype_and_inputs; [..., q_len] with 2,
    1 and no leading axes, -inf where no key was seen, all far below 0 (-2000), the larger max in either state
online_softmax_merge sum_a: merge_two_blocks, merge_empty_states, merge_dtype_and_inputs; [..., q_len], 0
    where no key was seen
online_softmax_merge out_a: merge_two_blocks, merge_empty_states, merge_dtype_and_inputs; [..., q_len, d_v],
    d_v != d_k, 0 where no key was seen, left unchanged
online_softmax_merge max_b: merge_two_blocks, merge_empty_states, merge_dtype_and_inputs; as max_a, the states
    swapped too
online_softmax_merge sum_b: merge_two_blocks, merge_empty_states, merge_dtype_and_inputs; as sum_a
online_softmax_merge out_b: merge_two_blocks, merge_empty_states, merge_dtype_and_inputs; as out_a
online_softmax_merge leading axes broadcast: merge_two_blocks; [2, 3, q_len] with [3, q_len] (visible), [2, 3,
    q_len] with [2, 1, q_len] (hidden)
online_softmax_merge dtype and device: merge_dtype_and_inputs; float32, float16, bfloat16, float64; the
    inputs' device (the checks' device: the CPU where there is no GPU)
online_softmax_merge returns: merge_two_blocks, merge_empty_states, merge_dtype_and_inputs; (max, sum, out) of
    the inputs' shapes, dtype and device, against a merge worked out by hand and the state of all the keys;
    the inputs unchanged
online_softmax_merge state over no key: merge_empty_states; (-inf, 0, 0) changes nothing, two of them give
    (-inf, 0, 0), never NaN: float64, float32, float16 (visible), float32, bfloat16, float16 (hidden)
tiled_attention query: tiled_matches_sdpa, tiled_masks, tiled_empty_rows, tiled_dtype_and_inputs,
    tiled_memory; [..., q_len, d_k] with 2, 1 and no leading axes, q_len 1; float64, float32, float16,
    bfloat16; on the checks' device (the CPU where there is no GPU)
tiled_attention key: tiled_matches_sdpa, tiled_masks, tiled_empty_rows, tiled_dtype_and_inputs, tiled_memory;
    [..., k_len, d_k], k_len 1, k_len != q_len
tiled_attention value: tiled_matches_sdpa, tiled_masks, tiled_empty_rows, tiled_dtype_and_inputs,
    tiled_memory; [..., k_len, d_v], d_v != d_k
tiled_attention block_size: tiled_matches_sdpa, tiled_masks, tiled_empty_rows, tiled_memory; 1, a divisor of
    k_len or not (a shorter last block), larger than k_len
tiled_attention mask: tiled_masks, tiled_empty_rows, tiled_dtype_and_inputs, tiled_memory; None, [batch,
    heads, q_len, k_len], [batch, 1, q_len, k_len], [batch, 1, 1, k_len] (padding keys 1000 times larger),
    [q_len, k_len], causal bottom-right, [k_len], [batch, 1, q_len, 1] (one key column)
tiled_attention query allowed no key: tiled_empty_rows; a zero output, never NaN: float64, float32, float16,
    bfloat16; whole blocks closed to a query
tiled_attention scores far below 0: tiled_matches_sdpa; every score about -2000 (visible, float64), -5000 and
    -300 (hidden, float64 and float32): a max started at 0 loses every weight
tiled_attention returns: tiled_matches_sdpa, tiled_masks, tiled_empty_rows, tiled_dtype_and_inputs; [...,
    q_len, d_v] equal to F.scaled_dot_product_attention or the formula, in the dtype and on the device of
    query (tiled_dtype_and_inputs: float32, float16, bfloat16, float64), the inputs unchanged
tiled_attention precision: tiled_dtype_and_inputs; float16 and bfloat16 within four times the error of the
    formula in that dtype (computed in float32 or in the inputs' dtype)
tiled_attention memory: tiled_memory; no floating-point tensor above twice the largest of a block of scores,
    the inputs and the output; no built-in attention
tiled_attention raises ValueError: tiled_matches_sdpa; block_size 0 and -2, keys of another d_k, a longer
    value (visible); block_size -1, 0, -7, another d_k, a shorter and a longer value (hidden)
tiled_attention raises TypeError: tiled_masks; masks of 0/1 int64 and float32 (visible), uint8, float64 and
    int32 (hidden)
""")


def _nan_mistake(actual: torch.Tensor, result: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether ``actual`` is NaN or inf exactly where the mistake's ``result`` is, and equal elsewhere."""
    if not isinstance(actual, torch.Tensor) or actual.shape != result.shape:
        return False
    a, r = actual.detach().cpu().double(), result.detach().cpu().double()
    finite = torch.isfinite(a)
    if not torch.equal(finite, torch.isfinite(r)):
        return False
    rtol, atol = engine.tolerance(dtype)
    return torch.allclose(a[finite], r[finite], rtol=rtol, atol=atol)


def _values(
    actual: Any, expected: torch.Tensor, where: str, rows: Callable[[], Iterable[Mistake]], **options
) -> None:
    """:func:`~attention_course.checks.engine.assert_values` (``options``: ``dtype``, ``naive_error``,
    ``hints``, ``note``), with a result that is NaN or inf where the answer is finite matched to a mistake by
    where it is NaN (``rows()``: the mistakes, in order)."""
    dtype = options["dtype"]
    assert_shape(actual, where, expected.shape, options.get("hints"), dtype)
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    bad = ~torch.isfinite(a) & torch.isfinite(e)
    if bad.any():
        index = tuple(torch.nonzero(bad)[0].tolist())
        cause = next((m.hint for m in rows() if _nan_mistake(actual, m.result, dtype)), "")
        if dtype == torch.float16 and cause in ("", TEXT["no guard"]):  # -1e30 is -inf in float16
            cause = f"{TEXT['no guard']}; {TEXT['half sentinel']}"
        fail(
            f"{where} contains NaN or inf ({int(bad.sum())} of {bad.numel()} elements, first at index "
            f"{list(index)}: {a[index].item()}) where the right answer is finite.",
            cause or TEXT["no guard"],
        )
    assert_values(actual, expected, where, mistakes=lambda: iter(rows()), **options)


def _former(formats: bool, like: torch.Tensor) -> Callable[..., None]:
    """``assert_shape``, or with ``formats`` ``assert_format`` with the dtype and device of ``like``."""
    return functools.partial(assert_format, dtype=like.dtype, device=like.device) if formats else assert_shape


# ==================================================================================================
# 1. online_softmax_merge

STATE = ("max", "sum", "out")
NAMES = tuple(f"{name}_{side}" for side in "ab" for name in STATE)  # max_a, sum_a, out_a, max_b, ...
MAX_ROWS = ("max not updated", "max of b", "max smaller")
MERGE_ROWS = (
    "sum not rescaled",
    "output not rescaled",
    "flipped",
    "normalised",
    "normalised, guarded",
    "weighted by sums",
    "weighted by sums, guarded",
    "no guard",
    "shift clamped",
)


def block_state(scores: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The state ``(max, sum, out)`` of a block of (masked) ``scores [..., q_len, block]`` (check code)."""
    top = scores.amax(dim=-1)  # [..., q_len]
    weights = torch.exp(scores - top.masked_fill(top == -math.inf, 0.0).unsqueeze(-1))
    return top, weights.sum(dim=-1), weights @ value


def merge(arguments: dict[str, Any], row: str = "") -> tuple[torch.Tensor, ...]:
    """The merged state as ``row`` computes it, float64 (check code; ``row`` names a mistake in TEXT)."""
    max_a, sum_a, out_a, max_b, sum_b, out_b = (arguments[name].double() for name in NAMES)
    maxima = {"max not updated": max_a, "max of b": max_b, "max smaller": torch.minimum(max_a, max_b)}
    top = maxima.get(row, torch.maximum(max_a, max_b))
    shift = top if row == "no guard" else top.masked_fill(top == -math.inf, 0.0)
    if row == "shift clamped":
        shift = top.clamp(min=0.0)
    scale_a, scale_b = torch.exp(max_a - shift), torch.exp(max_b - shift)
    if row == "flipped":
        scale_a, scale_b = torch.exp(shift - max_a), torch.exp(shift - max_b)
    total = sum_a + sum_b if row == "sum not rescaled" else scale_a * sum_a + scale_b * sum_b
    out = scale_a[..., None] * out_a + scale_b[..., None] * out_b
    if row == "output not rescaled":
        out = out_a + out_b
    divisor = torch.where(total > 0, total, 1.0) if row.endswith(", guarded") else total
    if row.startswith("normalised"):
        out = out / divisor[..., None]
    if row.startswith("weighted by sums"):
        weighted = (scale_a * sum_a)[..., None] * out_a + (scale_b * sum_b)[..., None] * out_b
        out = weighted / divisor[..., None]
    return top, total, out


def _merge_check(part: Part, arguments: dict, expected=None, label: str = "", formats=False) -> Check:
    """One call of online_softmax_merge: a tuple of three, their shapes, the max, then the sum and the output
    against the reference in hidden parts, ``expected`` (float64; default :func:`merge`) in visible ones."""
    call = part.call(label, **arguments)
    first, form = arguments["out_a"], _former(formats, arguments["out_a"])
    # the broadcast shape of the maxima (torch.broadcast_shapes would import torch._refs: 1 s, once)
    lead_q = tuple(torch.broadcast_tensors(arguments["max_a"], arguments["max_b"])[0].shape)
    shapes = {"max": lead_q, "sum": lead_q, "out": (*lead_q, first.size(-1))}

    def judge(result: Any) -> None:
        if not isinstance(result, tuple | list) or len(result) != 3:
            length = f" of length {len(result)}" if isinstance(result, tuple | list) else ""
            fail(
                f"{call} should return (max, sum, out), got {type_name(result)}{length}.", TEXT["state tuple"]
            )
        for name, actual in zip(STATE, result, strict=True):
            hints = {(*lead_q, 1): TEXT.get(f"{name} q_len 1", "")}
            form(actual, f"the {name} returned by {call}", shapes[name], hints=hints)
        if part.hidden:
            answer = part.reference(**{name: value.double() for name, value in arguments.items()})
        else:
            answer = expected if expected is not None else merge(arguments)
        top, where = result[0].detach().cpu().double(), f"the max returned by {call}"
        maxima = [Mistake(TEXT[row], merge(arguments, row)[0].cpu()) for row in MAX_ROWS]
        if not torch.equal(top == -math.inf, answer[0].cpu() == -math.inf):
            cause = next((m.hint for m in maxima if _same_max(top, m.result)), TEXT["max shift"])
            fail(f"{where} is not -inf exactly where neither state has seen a key.", cause)
        _values(top, answer[0], where, dtype=first.dtype, rows=lambda: maxima)
        for index, name in ((1, "sum"), (2, "out")):
            rows = lambda index=index: [  # noqa: E731
                Mistake(TEXT[r.removesuffix(", guarded")], merge(arguments, r)[index]) for r in MERGE_ROWS
            ]
            where = f"the {name} returned by {call}"
            _values(result[index], answer[index], where, dtype=first.dtype, rows=rows)

    return Check(call, judge, untouched=formats)


def _same_max(actual: torch.Tensor, other: torch.Tensor) -> bool:
    """Whether two maxima are -inf at the same places and close elsewhere (float64 on the CPU)."""
    infinite = actual == -math.inf
    if not torch.equal(infinite, other == -math.inf):
        return False
    return torch.allclose(actual[~infinite], other[~infinite], rtol=1e-3, atol=1e-3)


def _states(
    part: Part, sizes: Sizes, split: int, seed: int, dtype=torch.float64, kind="", shift=0.0
) -> tuple:
    """``(arguments, whole)``: the states of keys ``[:split]`` and ``[split:]`` of random attention inputs
    (masked with the family's mask ``kind``, shifted by ``shift``), cast to ``dtype``, and the state of all
    the keys, float64."""
    inputs = family.qkv(sizes, seed=seed, device=part.device)
    scores = inputs["query"] @ inputs["key"].transpose(-2, -1) / math.sqrt(sizes.d_k)  # [..., q_len, k_len]
    scores = scores + shift  # far below 0: an exp() shifted by 0 instead of the max underflows
    if kind:
        shape = (*sizes.lead, sizes.q_len, sizes.k_len)
        allowed = family.mask(shape, seed=seed + 5, device=part.device, kind=kind)
        scores = scores.masked_fill(~allowed, -math.inf)
    value = inputs["value"]
    a = block_state(scores[..., :split], value[..., :split, :])
    b = block_state(scores[..., split:], value[..., split:, :])
    arguments = {name: tensor.to(dtype) for name, tensor in zip(NAMES, (*a, *b), strict=True)}
    return arguments, block_state(scores, value)


def _by_hand(part: Part) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]]:
    """States (m, l, o) = (1, 2, [3, -1]) and (3, 1, [1, 2]), and their merge, every number written out."""
    e = math.exp(-2.0)  # exp(m_a - m) with m = 3; exp(m_b - m) = 1
    given = ([1.0], [2.0], [[3.0, -1.0]], [3.0], [1.0], [[1.0, 2.0]])
    given = [torch.tensor(v, dtype=torch.float64, device=part.device) for v in given]
    merged = ([3.0], [2 * e + 1], [[3 * e + 1, -e + 2]])
    return dict(zip(NAMES, given, strict=True)), tuple(torch.tensor(v, dtype=torch.float64) for v in merged)


def _broadcast_states(part: Part, lead_a: tuple[int, ...], lead_b: tuple[int, ...], seed: int) -> tuple:
    """``(arguments, whole)``: the states of 4 queries (leading axes ``lead_b``) over 3 keys (``lead_a``) and
    over 2 keys (``lead_b``), whose leading axes broadcast, and the state of all 5 keys."""
    query = engine.randn((*lead_b, 4, 2), seed=seed, device=part.device)  # [..., q_len 4, d_k 2]
    shapes = ((*lead_a, 3, 2), (*lead_a, 3, 5), (*lead_b, 2, 2), (*lead_b, 2, 5))  # [..., k_len, d_k or d_v]
    key_a, value_a, key_b, value_b = (
        engine.randn(s, seed=seed + i, device=part.device) for i, s in enumerate(shapes, 1)
    )
    scores_a, scores_b = (query @ key.transpose(-2, -1) / math.sqrt(2) for key in (key_a, key_b))
    lead = torch.broadcast_tensors(scores_a[..., 0], scores_b[..., 0])[0].shape  # [..., q_len]
    a, b = block_state(scores_a, value_a), block_state(scores_b, value_b)
    both = torch.cat((scores_a.expand(*lead, 3), scores_b.expand(*lead, 2)), dim=-1)
    values = torch.cat((value_a.expand(*lead[:-1], 3, 5), value_b.expand(*lead[:-1], 2, 5)), dim=-2)
    return dict(zip(NAMES, (*a, *b), strict=True)), block_state(both, values)


# the states' sizes: every axis different; 2, 1 and no leading axes; where the keys are split
STATE_CASES = ((Sizes((2, 3), 5, 7, 4, 6), 3), (Sizes((3,), 6, 9, 8, 5), 1), (Sizes((), 4, 3, 2, 5), 2))
HIDDEN_STATE_CASES = (
    (Sizes((2, 2), 3, 11, 5, 7), 8),
    (Sizes((4,), 7, 6, 3, 4), 5),
    (Sizes((), 9, 2, 6, 3), 1),
)


@behaviour(function="online_softmax_merge", points=2, hints=HINTS)
def merge_two_blocks(part: Part) -> Iterator[Check]:
    """Merging the states (m, l, o) of two blocks of keys gives the state of all of them: m = max(m_a, m_b),
    l = exp(m_a - m) l_a + exp(m_b - m) l_b, o = exp(m_a - m) o_a + exp(m_b - m) o_b."""
    if part.hidden:
        for case, (sizes, split) in enumerate(HIDDEN_STATE_CASES):  # float64 and float32 by turns
            dtype = (torch.float64, torch.float32)[case % 2]
            yield _merge_check(part, *_states(part, sizes, split, 300 + 10 * case, dtype))
        far, broadcast = (*HIDDEN_STATE_CASES[1], 340, -3000.0), ((3,), (2, 1), 350)
    else:
        yield _merge_check(part, *_by_hand(part), label=" worked out by hand")
        for case, (sizes, split) in enumerate(STATE_CASES):
            arguments, whole = _states(part, sizes, split, 200 + 10 * case)
            yield _merge_check(part, arguments, whole)
            if case == 0:  # the larger max in either state
                swapped = {
                    f"{n}_{side}": arguments[f"{n}_{other}"] for n in STATE for side, other in ("ab", "ba")
                }
                yield _merge_check(part, swapped, whole, label=" with the states swapped")
        far, broadcast = (*STATE_CASES[0], 240, -2000.0), ((2, 3), (3,), 245)
    # every score far below 0: exp() relative to 0 instead of the max underflows to 0 in float64
    sizes, split, seed, shift = far
    arguments, whole = _states(part, sizes, split, seed, shift=shift)
    yield _merge_check(part, arguments, whole, label=" whose scores are all far below 0")
    # leading axes that broadcast: [2, 3, q_len] with [3, q_len]
    yield _merge_check(part, *_broadcast_states(part, *broadcast), label=" whose leading axes broadcast")


@behaviour(function="online_softmax_merge", points=1, hints=HINTS)
def merge_empty_states(part: Part) -> Iterator[Check]:
    """A state over no key, (-inf, 0, 0), changes nothing when merged, and two of them merge to (-inf, 0, 0),
    never NaN: as when a mask leaves a query no key in a block, or in every block."""
    cases = STATE_CASES if not part.hidden else HIDDEN_STATE_CASES
    dtypes = (torch.float64, torch.float32, torch.float16)  # half precision: -inf, 0 and NaN as in float32
    dtypes = dtypes if not part.hidden else (torch.float32, torch.bfloat16, torch.float16)
    for case, (sizes, split) in enumerate(cases):
        seed, dtype = (400 if part.hidden else 250) + 10 * case, dtypes[case]
        arguments, whole = _states(part, sizes, split, seed, dtype, kind="empty rows")
        yield _merge_check(part, arguments, whole, label=" with masked keys")
        empty = {f"{n}_b": torch.zeros_like(arguments[f"{n}_a"]) for n in STATE}  # (-inf, 0, 0)
        empty["max_b"].fill_(-math.inf)
        if case == 0:
            expected = tuple(arguments[f"{n}_a"].double() for n in STATE)
            yield _merge_check(part, {**arguments, **empty}, expected, label=" with an empty second state")
        else:
            both = {**{n.replace("_b", "_a"): v for n, v in empty.items()}, **empty}
            nothing = tuple(v.double() for v in empty.values())
            yield _merge_check(part, both, nothing, label=" of two empty states")


@behaviour(function="online_softmax_merge", points=1, hints=HINTS)
def merge_dtype_and_inputs(part: Part) -> Iterator[Check]:
    """The merged state keeps the inputs' dtype and device (float32, float16, bfloat16); the inputs are left
    unchanged."""
    dtypes = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    dtypes = dtypes if not part.hidden else (torch.bfloat16, torch.float64, torch.float16, torch.float32)
    cases = STATE_CASES if not part.hidden else HIDDEN_STATE_CASES
    for index, dtype in enumerate(dtypes):
        sizes, split = cases[index % len(cases)]
        seed, shift = (500 if part.hidden else 270) + 10 * index, -3.0 if dtype == torch.float64 else 0.0
        arguments, _ = _states(part, sizes, split, seed, dtype, shift=shift)  # float64: maxima below 0 too
        yield _merge_check(part, arguments, formats=True)


# ==================================================================================================
# 2. tiled_attention

TILED_ROWS = (  # in the order tried: rows whose result is NaN everywhere in one case before "flipped"
    "sum not rescaled",
    "output not rescaled",
    "max not kept",
    "first max kept",
    "block max only",
    "flipped",
    "per block",
    "not divided",
    "last block dropped",
    "mask after exp",
    "mask after exp, guarded",
    "no guard",
    "max from 0",
)


def tiled(arguments: dict[str, Any], row: str = "") -> torch.Tensor:
    """Tiled attention as ``row`` computes it, float64 (check code, written apart from the reference)."""
    query, key, value = (arguments[name].double() for name in ("query", "key", "value"))
    mask, size = arguments.get("mask"), arguments["block_size"]
    k_len, after_exp = key.size(-2), row.startswith("mask after exp")
    top = torch.full(query.shape[:-1], -math.inf, dtype=torch.float64, device=query.device)  # [..., q_len]
    top = torch.zeros_like(top) if row == "max from 0" else top
    total = torch.zeros_like(top)
    out = torch.zeros(*query.shape[:-1], value.size(-1), dtype=torch.float64, device=query.device)
    end = k_len - k_len % size if row == "last block dropped" else k_len
    for start in range(0, end, size):
        scores = query @ key[..., start : start + size, :].transpose(-2, -1) / math.sqrt(query.size(-1))
        allowed = None if mask is None else mask[..., start : start + size].to(query.device)
        if allowed is not None and not after_exp:
            scores = scores.masked_fill(~allowed, -math.inf)
        if row == "first max kept" and start > 0:
            new = top
        elif row == "block max only":
            new = scores.amax(dim=-1)
        else:
            new = torch.maximum(top, scores.amax(dim=-1))
        shift = new if row == "no guard" else new.masked_fill(new == -math.inf, 0.0)
        factor = torch.exp(shift - top) if row == "flipped" else torch.exp(top - shift)
        weights = torch.exp(scores - shift[..., None])
        if allowed is not None and after_exp:
            weights = weights * allowed
        block = weights @ value[..., start : start + size, :]
        if row == "per block":
            sums = weights.sum(dim=-1, keepdim=True)
            block = block / torch.where(sums > 0, sums, 1.0)
        total = (1.0 if row == "sum not rescaled" else factor) * total + weights.sum(dim=-1)
        out = (1.0 if row == "output not rescaled" else factor[..., None]) * out + block
        if row != "max not kept":
            top = new
    if row in ("per block", "not divided"):
        return out
    if row == "mask after exp":
        return out / total[..., None]  # 0/0 where every allowed weight underflowed
    return out / torch.where(total > 0, total, 1.0)[..., None]


def _tiled_rows(arguments: dict[str, Any]) -> Iterator[Mistake]:
    """The tiled rows, then the attention core's (scale, mask), as outputs for ``arguments``, computed one by
    one as they are tried (the first that reproduces a result ends the search)."""
    for row in TILED_ROWS:
        yield Mistake(TEXT[row.removesuffix(", guarded")], tiled(arguments, row))
    yield from family.mistakes(arguments, "output")


def _tiled_check(
    part: Part, sizes: Sizes, arguments: dict, answer: family.Answer, *, formats=False, extra=None, note=""
) -> Check:
    """One call of tiled_attention: the output's shape (and dtype and device, inputs unchanged, with
    ``formats``), ``extra(output, call)``, then its values against ``answer(arguments)``'s output (``note``:
    the right answer in words)."""
    call, query = part.call(**arguments), arguments["query"]
    shape, form = (*sizes.lead, sizes.q_len, sizes.d_v), _former(formats, query)
    hints = engine.shapes(TEXT, "output", sizes.lead, q_len=sizes.q_len, k_len=sizes.k_len, d_k=sizes.d_k)
    ones = 1 in (*sizes.lead, sizes.q_len, sizes.k_len)

    def judge(output: Any) -> None:
        if isinstance(output, tuple | list):
            fail(f"{call} returned a {type_name(output)}, expected the output tensor.", TEXT["tuple"])
        where, squeezed = f"the output of {call}", dict(hints)
        if ones and isinstance(output, torch.Tensor) and tuple(output.shape) not in (shape, *hints):
            squeezed[tuple(output.shape)] = TEXT["squeezed"]
        form(output, where, shape, hints=squeezed)
        if extra is not None:
            extra(output, call)
        expected, errors = answer(arguments)
        options = dict(naive_error=errors[0], hints=squeezed, note=note)
        _values(output, expected[0], where, dtype=query.dtype, rows=lambda: _tiled_rows(arguments), **options)

    return Check(call, judge, untouched=formats)


def _rule(output: torch.Tensor, call: Call) -> None:
    """The course's rule on the rows whose mask allows no key: an output of exactly 0, nothing NaN."""
    mask = call.arguments["mask"]
    empty = (~mask.any(dim=-1)).cpu().expand(output.shape[:-1])  # [..., q_len]
    finite = torch.isfinite(output.detach().cpu()).all(dim=-1)  # [..., q_len]
    if not empty.any() or not finite[~empty].all():  # NaN in other rows too: the values' check names it
        return
    rows, first = output.detach().cpu().double()[empty], torch.nonzero(empty)[0].tolist()
    where = f"in the {int(empty.sum())} rows whose mask allows no key (the first at index {first})"
    if not torch.isfinite(rows).all():
        half = f"; {TEXT['half eps']}" if output.dtype == torch.float16 else ""
        fail(f"the output of {call} is NaN or inf {where}. {TEXT['rule']}", TEXT["NaN rows"] + half)
    if (rows != 0).any():
        value = call.arguments["value"].detach().cpu().double()
        average = value.mean(dim=-2, keepdim=True).expand(*output.shape[:-1], value.size(-1))[empty]
        uniform = torch.allclose(rows, average, atol=1e-2, rtol=1e-2)
        cause = TEXT["uniform" if uniform else "not zero"]
        fail(f"the output of {call} is not 0 {where} (largest {rows.abs().max():.4g}). {TEXT['rule']}", cause)


def _inputs(part: Part, sizes: Sizes, block_size: int, seed: int, dtype=torch.float64, **mask: Any) -> dict:
    """Query, key and value of ``sizes`` (the family's :func:`~attention_family.qkv`), ``block_size``, and
    the ``mask`` where one is given (None included)."""
    return {**family.qkv(sizes, seed=seed, device=part.device, dtype=dtype), "block_size": block_size, **mask}


def _steep(part: Part) -> tuple[Sizes, dict[str, Any]]:
    """Keys whose middle block has scores a thousand times larger: exp() overflows float64 unless the max is
    updated at every block, and the state shifted by the new max, never by a block's own."""
    sizes = Sizes((2,), 4, 20, 8, 3)
    arguments = _inputs(part, sizes, 8, 40)
    scale = torch.cat((torch.ones(8), torch.full((8,), 1000.0), torch.ones(4)))  # keys 8..15 scaled
    arguments["key"] = arguments["key"] * scale.to(part.device, torch.float64).view(-1, 1)  # [k_len, 1]
    return sizes, arguments


def _far_below(part: Part, sizes: Sizes, offset: float, seed: int, dtype: torch.dtype) -> tuple[Sizes, dict]:
    """Inputs whose scores are all about ``offset``, far below 0: ``key[..., 0] = 1`` and ``query[..., 0] =
    offset * sqrt(d_k)``, the other axes random (so the softmax is not uniform); blocks of 4, no mask."""
    arguments = _inputs(part, sizes, 4, seed)
    arguments["key"][..., 0] = 1.0
    arguments["query"][..., 0] = offset * math.sqrt(sizes.d_k)
    return sizes, family.cast(arguments, dtype)


def _padded(part: Part) -> tuple[Sizes, dict[str, Any]]:
    """Two sequences padded to 11 keys (lengths 11 and 6), whose padding keys are a thousand times larger."""
    sizes = Sizes((2, 3), 5, 11, 4, 6)
    mask = (torch.arange(11) < torch.tensor([11, 6])[:, None])[:, None, None, :]  # [batch, 1, 1, k_len]
    arguments = _inputs(part, sizes, 3, 50, mask=mask.to(part.device))
    garbage = torch.where(mask[:, :, 0, :, None], 1.0, 1000.0).to(part.device, torch.float64)  # [2, 1, 11, 1]
    arguments["key"] = arguments["key"] * garbage
    return sizes, arguments


# the visible parts' (sizes, block_size): the last block shorter, one block, blocks of 1, a block wider
# than k_len; 2, 1 and no leading axes; then one query, and one key
BLOCKS = ((Sizes((2, 3), 5, 7, 4, 6), 3), (Sizes((3,), 6, 9, 8, 5), 1), (Sizes((), 4, 3, 2, 5), 8))
LENGTH_1 = ((Sizes((2,), 1, 5, 3, 4), 2), (Sizes((3,), 4, 1, 2, 3), 2))
HIDDEN_LENGTH_1 = ((Sizes((), 1, 1, 2, 3), 1), (Sizes((2, 1), 1, 6, 3, 2), 4), (Sizes((2,), 3, 1, 4, 2), 5))
HIDDEN_BLOCKS = (2, 4, 16)  # by HIDDEN_SIZES index: k_len 7, 9 and 3


def _errors(part: Part) -> Iterator[Check]:
    """The documented ValueErrors: block_size below 1; query and key of different d_k; key and value of
    different k_len (a longer value too, which slicing by blocks of keys would ignore)."""
    sizes = Sizes((2,), 3, 5, 4, 6)
    for block_size in (-1, 0, -7) if part.hidden else (0, -2):
        call = part.call(**_inputs(part, sizes, block_size, 130))
        yield engine.raises(call, "ValueError", "if block_size < 1", TEXT["block size"])
    # (the key's shape, the value's shape): [2, k_len, d_k] and [2, k_len, d_v], the query [2, 3, 4]
    shapes = [((2, 5, 3), (2, 5, 6)), ((2, 5, 4), (2, 7, 6))]
    if part.hidden:
        shapes = [((2, 5, 5), (2, 5, 6)), ((2, 5, 4), (2, 4, 6)), ((2, 6, 4), (2, 9, 6))]
    for index, (key, value) in enumerate(shapes):
        arguments = _inputs(part, sizes, 2, 133)
        arguments["key"] = engine.randn(key, seed=135 + index, device=part.device)
        arguments["value"] = engine.randn(value, seed=137 + index, device=part.device)
        condition = "when query and key differ in d_k, or key and value in k_len"
        yield engine.raises(part.call(**arguments), "ValueError", condition, TEXT["shapes"])


def _hidden(
    part: Part, dtypes: Sequence[torch.dtype], seed: int, kind: str = "", **options
) -> Iterator[Check]:
    """The reference's answers on every family.HIDDEN_SIZES and its block sizes, in ``dtypes`` by turns, with
    masks of the family's ``kind`` (none if empty)."""
    for case, (sizes, block_size) in enumerate(zip(family.HIDDEN_SIZES, HIDDEN_BLOCKS, strict=True)):
        at = seed + 10 * case + block_size
        arguments = _inputs(part, sizes, block_size, at, dtypes[case % len(dtypes)])
        if kind:
            shape = family.mask_shape(sizes)
            arguments["mask"] = family.mask(shape, seed=at + 5, device=part.device, kind=kind)
        yield _tiled_check(part, sizes, arguments, family.reference(part), **options)


@behaviour(function="tiled_attention", points=2, hints=HINTS)
def tiled_matches_sdpa(part: Part) -> Iterator[Check]:
    """Without a mask, tiled_attention equals softmax(Q K^T / sqrt(d_k)) V for any block_size: one that
    divides k_len or not (the last block is shorter), 1, or larger than k_len; also when the scores of one
    block are a thousand times larger than the others'."""
    # then: scores all far below 0 (a max that starts at 0 makes every exp() underflow), and the errors
    if part.hidden:
        answer, lengths, seed = family.reference(part), HIDDEN_LENGTH_1, 640
        yield from _hidden(part, (torch.float64, torch.float32), seed=600)
    else:
        answer, lengths, seed = family.builtin(), BLOCKS + LENGTH_1, 20
    for index, (sizes, block_size) in enumerate(lengths):
        yield _tiled_check(part, sizes, _inputs(part, sizes, block_size, seed + 3 * index), answer)
    if not part.hidden:
        yield _tiled_check(part, *_steep(part), answer)
    # (sizes, offset, seed, dtype)
    far = [(Sizes((2,), 3, 10, 4, 5), -2000.0, 45, torch.float64)]
    if part.hidden:
        far = [
            (Sizes((2, 2), 3, 9, 3, 2), -5000.0, 660, torch.float64),
            (Sizes((2, 2), 3, 9, 3, 2), -300.0, 663, torch.float32),
        ]
    for case in far:
        yield _tiled_check(part, *_far_below(part, *case), answer)
    yield from _errors(part)


@behaviour(function="tiled_attention", points=2, hints=HINTS)
def tiled_masks(part: Part) -> Iterator[Check]:
    """With a boolean mask (True = may attend) of several broadcastable shapes, every query allowed some key,
    it equals F.scaled_dot_product_attention, even where the masked keys hold huge values."""
    # then masks that are not boolean: TypeError
    if part.hidden:
        yield from _hidden(part, (torch.float64, torch.float32), seed=700, kind="mixed")
    else:
        cases = [  # (sizes, block_size, mask shape): [batch, heads, q, k], [q, k], [k]; 1 leading axis below
            (Sizes((2, 3), 5, 7, 4, 6), 3, (2, 3, 5, 7)),
            (Sizes((), 4, 3, 2, 5), 2, (4, 3)),
            (Sizes((2, 3), 5, 7, 4, 6), 2, (7,)),
        ]
        for index, (sizes, block_size, shape) in enumerate(cases):
            mask = family.mask(shape, seed=61 + index, device=part.device, kind="mixed")
            arguments = _inputs(part, sizes, block_size, 60 + 3 * index, mask=mask)
            # SDPA takes masks of 2 axes or more
            yield _tiled_check(part, sizes, arguments, family.builtin() if len(shape) > 1 else family.plain())
        causal = torch.ones(6, 9, dtype=torch.bool).tril(3).to(part.device)  # bottom-right, [q_len, k_len]
        sizes = Sizes((3,), 6, 9, 8, 5)
        yield _tiled_check(part, sizes, _inputs(part, sizes, 4, 70, mask=causal), family.builtin())
        yield _tiled_check(part, *_padded(part), family.builtin())
    # a mask of 0/1 integers or floats raises TypeError: it is not boolean
    sizes, allowed = Sizes((2,), 3, 5, 4, 6), family.mask((3, 5), seed=140, device=part.device, kind="mixed")
    for dtype in (torch.uint8, torch.float64, torch.int32) if part.hidden else (torch.int64, torch.float32):
        call = part.call(**_inputs(part, sizes, 2, 141, mask=allowed.to(dtype)))
        yield engine.raises(call, "TypeError", "if mask is not boolean", TEXT["mask type"])


@behaviour(function="tiled_attention", points=1, hints=HINTS)
def tiled_empty_rows(part: Part) -> Iterator[Check]:
    """A block of keys that the mask closes to a query changes nothing, and a query whose mask allows no key
    at all gets a zero output, never NaN (float64, float32)."""
    # also in float16 and bfloat16, and with a mask of one key column [batch, 1, q_len, 1] (padding queries)
    if part.hidden:
        dtypes = (torch.float64, torch.float16, torch.bfloat16)
        yield from _hidden(part, dtypes, seed=800, kind="empty rows", extra=_rule)
        sizes = Sizes((3, 2), 4, 10, 3, 2)
        column = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 1, 1]], dtype=torch.bool)[:, None, :, None]
        arguments = _inputs(part, sizes, 4, 840, torch.float32, mask=column.to(part.device))
        yield _tiled_check(part, sizes, arguments, family.reference(part), extra=_rule)
        return
    # left padding: sequence 0 has 5 padding keys, so its first blocks are closed to every query
    sizes = Sizes((2, 3), 5, 7, 4, 6)
    tokens = torch.tensor([[0, 0, 0, 0, 0, 6, 7], [1, 2, 3, 4, 5, 6, 7]])
    causal = torch.ones(5, 7, dtype=torch.bool).tril(2)
    left = ((tokens != 0)[:, None, None, :] & causal).to(part.device)  # [batch, 1, q_len, k_len]
    cases = [(sizes, 2, left, dtype) for dtype in family.DTYPES]
    for index, sizes in enumerate((Sizes((3,), 6, 9, 8, 5), Sizes((), 4, 3, 2, 5))):  # and random empty rows
        mask = family.mask(family.mask_shape(sizes), seed=91 + index, device=part.device, kind="empty rows")
        cases.append((sizes, 3 + index, mask, torch.float64))
    column = torch.tensor([[1, 0, 1, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)  # a key column per query
    cases.append((Sizes((2, 3), 5, 7, 4, 6), 3, column[:, None, :, None].to(part.device), torch.float64))
    for index, (sizes, block_size, mask, dtype) in enumerate(cases):
        arguments = _inputs(part, sizes, block_size, 90 + index, dtype, mask=mask)
        yield _tiled_check(part, sizes, arguments, family.plain(), extra=_rule, note=TEXT["rule"])


@behaviour(function="tiled_attention", points=1, hints=HINTS)
def tiled_dtype_and_inputs(part: Part) -> Iterator[Check]:
    """The output keeps the inputs' dtype and device (float32, float16, bfloat16, with and without a mask);
    the inputs are left unchanged."""
    if part.hidden:
        yield from _hidden(part, (torch.bfloat16, torch.float16), seed=900, kind="mixed", formats=True)
        return
    cases = (  # (dtype, sizes, block_size, mask shape): 2, 1 and no leading axes, with a mask and without
        (torch.float32, Sizes((2, 3), 5, 7, 4, 6), 3, (2, 1, 5, 7)),
        (torch.float16, Sizes((3,), 6, 9, 8, 5), 4, None),
        (torch.bfloat16, Sizes((), 4, 3, 2, 5), 2, (4, 3)),
        (torch.float64, Sizes((2,), 3, 5, 4, 6), 2, (2, 3, 5)),
    )
    for index, (dtype, sizes, block_size, shape) in enumerate(cases):
        mask = shape and family.mask(shape, seed=101 + index, device=part.device, kind="mixed")
        arguments = _inputs(part, sizes, block_size, 100 + index, dtype, mask=mask)
        yield _tiled_check(part, sizes, arguments, family.plain(), formats=True)


# --- memory: the learner's call inside an AllocationTracker, in the learner's process


def _measured(fn: Callable[..., Any], **arguments: Any) -> tuple[Any, tuple[int, list[int]]]:
    """Call the learner's ``tiled_attention`` inside an :class:`AllocationTracker` (the kernel): its output,
    and the number of elements and the shape of the largest floating-point tensor the call created."""
    with AllocationTracker() as tracker:
        output = fn(**arguments)
    largest = tracker.largest_floating
    return output, ((largest.elements, list(largest.shape)) if largest is not None else (0, []))


MEASURED = Driver(_measured)


def memory_bound(sizes: Sizes, block_size: int) -> int:
    """Twice the largest of a block of scores ``[*lead, q_len, block_size]``, the inputs and the output."""
    lead = math.prod(sizes.lead)
    block = lead * sizes.q_len * min(block_size, sizes.k_len)
    inputs = lead * max(sizes.q_len * sizes.d_k, sizes.k_len * sizes.d_k, sizes.k_len * sizes.d_v)
    return 2 * max(block, inputs, lead * sizes.q_len * sizes.d_v)


def _memory_check(part: Part, sizes: Sizes, arguments: dict[str, Any], answer: family.Answer) -> Check:
    """The values (:func:`_tiled_check`, which must pass first), then the largest floating-point tensor."""
    call, block_size = part.call(**arguments), arguments["block_size"]
    bound, full = memory_bound(sizes, block_size), math.prod((*sizes.lead, sizes.q_len, sizes.k_len))
    values, block = _tiled_check(part, sizes, arguments, answer).judge, [*sizes.lead, sizes.q_len, block_size]

    def judge(result: Any) -> None:
        if not isinstance(result, tuple) or len(result) != 2:  # the driver's pair: never the learner's
            fail(f"the recording of {call} is not the course's (got {describe(result)}).")
        output, (elements, shape) = result
        try:
            values(output)
        except CheckFailure as failure:
            raise failure.amended(before=MUST_BE_CORRECT) from None
        if elements > bound:
            fail(
                f"{call} created a floating-point tensor of {elements} elements (shape {shape}): more than "
                f"{bound}, twice the largest of one block of scores {block}, the inputs and the output. The "
                f"full score matrix would have {full}.",
                TEXT["full scores" if elements >= full else "too large"],
                expected=f"at most {bound} elements",
                got=str(elements),
            )

    return Check(call, judge)


# (sizes, block_size, seed): q_len * k_len is 2.8 and 2.7 times the bound; k_len not a multiple of block_size.
# Each call is observed and tracked operator by operator, which costs: one call per part
MEMORY_CASE = (Sizes((2, 3), 48, 180, 4, 6), 32, 110)  # a causal mask
HIDDEN_MEMORY_CASE = (Sizes((2, 3), 40, 170, 2, 5), 32, 1000)  # a padding mask


@behaviour(function="tiled_attention", points=2, hints=HINTS, driver=MEASURED)
def tiled_memory(part: Part) -> Iterator[Check]:
    """tiled_attention is correct, calls no built-in attention, and never creates a floating-point tensor of
    more than twice the largest of one block of scores [..., q_len, block_size], the inputs and the output:
    the full score matrix [..., q_len, k_len] is at least 2.6 times larger here."""
    sizes, block_size, seed = HIDDEN_MEMORY_CASE if part.hidden else MEMORY_CASE
    if part.hidden:  # padding, [batch, 1, 1, k_len]: every sequence keeps at least half of its keys
        generator, answer = seeded_generator(seed), family.reference(part)
        lengths = torch.randint(sizes.k_len // 2, sizes.k_len + 1, sizes.lead[:1], generator=generator)
        mask = (torch.arange(sizes.k_len) < lengths[:, None])[:, None, None, :]
    else:  # causal, aligned bottom-right, [q_len, k_len]
        mask = torch.ones(sizes.q_len, sizes.k_len, dtype=torch.bool).tril(sizes.k_len - sizes.q_len)
        answer = family.builtin()
        # the rule, on a small call with a mask (the value cells' hidden parts need it not)
        small = family.mask((2, 1, 5, 7), seed=130, device=part.device, kind="mixed")
        call = part.call(**_inputs(part, Sizes((2, 3), 5, 7, 4, 6), 3, 131, mask=small))
        yield family.from_scratch("tiled attention").check([call])
    arguments = _inputs(part, sizes, block_size, seed, torch.float32, mask=mask.to(part.device))
    yield _memory_check(part, sizes, arguments, answer)
