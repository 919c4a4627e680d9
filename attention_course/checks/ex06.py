"""Checks of exercise ex06: multi-head attention carried over, cross-attention and its cache, the decoder.

Cross-attention is judged against ``nn.MultiheadAttention`` with the target as query and the source as key and
value (the learner's ``load_torch_weights`` copies the weights), in float64, with ``tgt_len != src_len``; the
cache by decoding step by step and then switching to a new source; the decoder layer against
``nn.TransformerDecoderLayer`` given the same weights, for both ``norm_first``. The decoder's known mistakes
are rows (:class:`Layer`) of one parametrised computation, :func:`decoder`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attention_course.checks import attention_family as family
from attention_course.checks import engine, ex04
from attention_course.checks import module_family as mf
from attention_course.checks.engine import Check, Driver, Mistake, Part, assert_values, behaviour, fail, randn
from attention_course.checks.module_family import Sizes

HINTS = family.exception_hints("""
attribute 'self_attn' | attribute 'cross_attn' | attribute 'linear1' | attribute 'linear2' | attribute 'norm1'
    | attribute 'norm2' | attribute 'norm3': name the sub-modules as the task says (self_attn, cross_attn,
    linear1, linear2, norm1, norm2, norm3): the checks copy nn.TransformerDecoderLayer's weights into them
unexpected keyword argument 'use_cache' | takes from 3 to 4 positional arguments: forward takes (target,
    source, mask=None, use_cache=False)
must both have biases | both have biases: the module has biases although bias=False was given: pass it on,
    super().__init__(d_model, n_heads, bias=bias)
""") + tuple(ex04.HINTS)
TEXT = engine.table("""
swapped: queries come from the source and keys/values from the target: in cross-attention the queries come
    from the decoder (target) and the keys and values from the encoder's output (source)
values from target: the values come from the target: keys and values both come from the source
causal: a causal mask is applied in cross-attention: the whole source is known before decoding starts, so
    every target position may attend to every real source token; it takes the source padding mask only
stale: the cache was reused for a new source: it must be recomputed when another source tensor comes (keep the
    source it was computed for and compare, `source is not self.cached_source`)
recomputed: the source's keys and values are recomputed at every step although use_cache=True: compute them
    once per source and keep them
order: cross-attention comes before self-attention: the decoder layer runs masked self-attention first, then
    cross-attention over the encoder's output, then the feed-forward network
norm first ignored: the layer normalises after the residual sum although norm_first=True: pre-LN is x = x +
    sublayer(norm(x))
norm first inverted: norm_first is read the wrong way round: norm_first=True is pre-LN, x = x +
    sublayer(norm(x)); False is post-LN, x = norm(x + sublayer(x))
memory normalised: in pre-LN the encoder's output (memory) is normalised by norm2 too: only the target is
    normalised; memory goes to cross_attn as it is
no self residual: the residual connection around self-attention is missing
no cross residual: the residual connection around cross-attention is missing: without it the layer's output
    loses what the target carried (x + cross_attn(...))
no ffn residual: the residual connection around the feed-forward network is missing
no causal mask: the self-attention ignores self_mask: pass it to self_attn (the causal mask)
no memory mask: the cross-attention ignores memory_mask: pass it to cross_attn (the source padding mask)
gelu: the feed-forward network uses GELU: nn.TransformerDecoderLayer's default activation is ReLU
norms swapped: the layer norms are used in another order: norm1 for self-attention, norm2 for cross-attention,
    norm3 for the feed-forward network
no final norm: post-LN normalises after every residual sum, the feed-forward network's too (norm3)
stale in place: the cache was reused although the source tensor was changed in place since: an in-place
    change keeps the tensor (`is` holds, data_ptr() too) but bumps its version, source._version: keep it with
    the cache and compare, or keep a copy of the source and compare values
stale weights: the cache was reused although w_k or w_v changed since (an optimiser step, a new
    load_torch_weights): keep their versions (p._version for p in the parameters of w_k and w_v), or copies,
    with the cache and compare them too
cross dtype: the weights and the output keep the dtype of the target: a .double()/.float() inside (for a
    stable softmax, say) must be undone with .to(target.dtype) on every result, the weights too
cross n_heads: check that n_heads divides d_model and raise ValueError (the MultiHeadAttention it builds on
    raises it in __init__)
cross mask 3d: a [batch, tgt_len, src_len] mask is the same for every head: give it a head axis,
    mask.unsqueeze(1), so that it broadcasts over the scores [batch, n_heads, tgt_len, src_len]
rule: The course's rule (chapter 3): a target position whose mask allows no source position gets zero
    weights, so its attention is zero and the output there is w_o's bias alone.
source_kv: source_kv(source) returns the pair (keys, values), each [batch, n_heads, src_len, d_head]:
    w_k(source) and w_v(source) split into heads, as forward uses them
source_kv cache: source_kv returns the cached keys and values when the cache holds them for this source,
    unchanged, and the current weights: forward(..., use_cache=True) and source_kv share one cache
clear: clear_cache() forgets the cached keys and values (self.cache = None, say), so that the next call
    computes them again
decoder mask dtype: the masks must stay as they are given: a mask that is not boolean reaches the attentions,
    which raise TypeError; converting it (mask.bool(), mask == 1) accepts what the docstring refuses
""")
SHAPES = engine.table("""
output batch src_len d_model: the output has one row per source position: the queries come from the target,
    so the output has tgt_len rows
weights batch n_heads src_len tgt_len: the weights are [.., src_len, tgt_len]: the queries come from the
    target (rows) and the keys from the source (columns)
weights batch n_heads tgt_len tgt_len: the keys come from the target: keys and values come from the source
weights batch tgt_len src_len: the weights are averaged over heads: return every head's, [batch, n_heads,
    tgt_len, src_len]
""")
CROSS_MASK = (
    "if a mask is the cause: the cross-attention takes the source padding mask (memory_mask) only; the "
    "causal mask [tgt_len, tgt_len] belongs to the self-attention, and does not fit the [tgt_len, src_len] "
    "scores"
)


# The learner's docstrings clause by clause, and the behaviours that check each (tests/test_contracts.py).
CONTRACT = engine.table("""
MultiHeadAttention d_model: mha_carried_over; exercise 4's module against nn.MultiheadAttention
MultiHeadAttention n_heads: mha_carried_over; as in exercise 4
MultiHeadAttention bias: mha_carried_over; biases on here; exercise 4 checks bias=False too
MultiHeadAttention raises ValueError: mha_carried_over; checked in exercise 4 (mha_shapes), not again here
MultiHeadAttention.forward query: mha_carried_over; [batch, q_len, d_model], q_len != k_len
MultiHeadAttention.forward key: mha_carried_over; [batch, k_len, d_model]
MultiHeadAttention.forward value: mha_carried_over; [batch, k_len, d_model]
MultiHeadAttention.forward mask: mha_carried_over; None and [batch, q_len, k_len] (the hidden part: every
    shape)
MultiHeadAttention.forward returns: mha_carried_over; (output, weights) as nn.MultiheadAttention computes them
MultiHeadAttention.forward raises TypeError: mha_carried_over; checked in exercise 4 (mha_shapes)
MultiHeadAttention.load_torch_weights torch_mha: mha_carried_over; every check loads with it
MultiHeadAttention.load_torch_weights returns: mha_carried_over; checked in exercise 4 (mha_gradients)
MultiHeadAttention.load_torch_weights raises ValueError: mha_carried_over; checked in exercise 4 (mha_shapes)
CrossAttention d_model: cross_shapes, cross_matches_torch; 8 to 20
CrossAttention n_heads: cross_shapes, cross_matches_torch; 2 to 5
CrossAttention bias: cross_matches_torch; True (its default) and False, as nn.MultiheadAttention(bias=False)
CrossAttention raises ValueError: cross_shapes; n_heads that does not divide d_model
CrossAttention.forward target: cross_shapes, cross_matches_torch; [batch, tgt_len, d_model], tgt_len !=
    src_len and equal (hidden), float64 and float32
CrossAttention.forward source: cross_matches_torch, cross_source_permutation; [batch, src_len, d_model], its
    positions permuted
CrossAttention.forward mask: cross_matches_torch, cross_source_permutation; None, the source padding mask
    [batch, 1, 1, src_len], [batch, tgt_len, src_len], [tgt_len, src_len], [batch, n_heads, tgt_len, src_len];
    rows that allow no source position (a source of padding only among them), float64 and float32
CrossAttention.forward use_cache: cross_cache; step by step, a new source, the same source changed in place,
    then w_k's and w_v's weights changed in place
CrossAttention.forward returns: cross_shapes, cross_matches_torch, cross_cache; (output [batch, tgt_len,
    d_model], weights [batch, n_heads, tgt_len, src_len]) as nn.MultiheadAttention(target, source, source), in
    the target's dtype (float32, with and without a mask), the same with the cache
CrossAttention.forward raises TypeError: cross_shapes; a mask of 0/1 integers, of 0/1 floats
CrossAttention.source_kv source: cross_cache; the source the cache holds
CrossAttention.source_kv returns: cross_cache; (keys, values) [batch, n_heads, src_len, d_head], from the
    cache (w_k does not run), computed again after clear_cache
CrossAttention.clear_cache forgets: cross_cache; source_kv runs w_k again after it
CrossAttention from scratch: cross_from_scratch; no built-in attention
DecoderLayer d_model: decoder_matches_torch, decoder_step_by_step; 8 to 20
DecoderLayer n_heads: decoder_matches_torch, decoder_step_by_step; 2 to 5
DecoderLayer d_ff: decoder_matches_torch, decoder_step_by_step; 12 to 36
DecoderLayer norm_first: decoder_matches_torch, decoder_step_by_step; False (post-LN) and True (pre-LN)
DecoderLayer dropout: decoder_matches_torch; not graded here, as the task says (exercise 7 checks dropout):
    the layers are built with its default, 0.0, and run in eval()
DecoderLayer raises ValueError: decoder_matches_torch; not called here: it comes from its MultiHeadAttention,
    whose ValueError exercise 4 checks (nn.TransformerDecoderLayer cannot be built with such sizes)
DecoderLayer.forward x: decoder_matches_torch, decoder_step_by_step; [batch, tgt_len, d_model], float64
DecoderLayer.forward memory: decoder_matches_torch, decoder_step_by_step; [batch, src_len, d_model]
DecoderLayer.forward self_mask: decoder_matches_torch, decoder_step_by_step; the causal mask [tgt_len,
    tgt_len], and those of each step
DecoderLayer.forward memory_mask: decoder_matches_torch, decoder_step_by_step; the source padding mask
DecoderLayer.forward use_cache: decoder_step_by_step; step by step with use_cache=True
DecoderLayer.forward returns: decoder_matches_torch, decoder_step_by_step; [batch, tgt_len, d_model] as
    nn.TransformerDecoderLayer computes it (its dtype: float64 only, not judged)
DecoderLayer.forward raises TypeError: decoder_matches_torch; a causal mask of 0/1 floats, a padding mask of
    0/1 integers
""")


# the sizes of one call (every one different within a case): q_len is tgt_len, k_len src_len, so that
# chapter 4's checks apply unchanged
VISIBLE = Sizes(2, 5, 7, 12, 3, d_ff=20)
HIDDEN = (Sizes(3, 4, 6, 20, 5, d_ff=28), Sizes(1, 6, 3, 8, 2, d_ff=12), Sizes(2, 3, 5, 16, 4, d_ff=36))
HEAD_SHAPES = SHAPES | ex04.SHAPES  # the likely causes of wrong shapes: cross-attention's, then chapter 4's


# ==================================================================================================
# 1. multi-head attention, carried over from exercise 4


@behaviour(function="MultiHeadAttention", points=1, hints=ex04.HINTS, driver=ex04.FORWARD)
def mha_carried_over(part: Part) -> Iterator[Check]:
    """Your MultiHeadAttention from exercise 4 (with load_torch_weights) computes what nn.MultiheadAttention
    computes given the same weights, with and without masks."""
    return ex04.carried_over(part, seed=130)


# ==================================================================================================
# 2. cross-attention: inputs, the driver, PyTorch's answer, the mistakes


def inputs(sizes: Sizes, *, seed: int, device, dtype=torch.float64, mask=None, bias=True) -> dict[str, Any]:
    """The arguments of one cross-attention call: sizes, ``nn.MultiheadAttention``'s weights, target
    ``[batch, tgt_len, d_model]``, source ``[batch, src_len, d_model]``, ``mask`` (and ``bias`` when False:
    a module and weights without biases)."""
    weights = mf.mha_weights(sizes, bias=bias, seed=seed + 10, device=device, dtype=dtype)
    tensors = mf.sequences(sizes, ("target", "source"), seed=seed, device=device, dtype=dtype)
    sized = {"d_model": sizes.d_model, "n_heads": sizes.n_heads, **({} if bias else {"bias": False})}
    return {**sized, **weights, **tensors, "mask": mask}


def _cross_module(cls: Any, d_model: int, n_heads: int, torch_mha: Any, like: torch.Tensor, bias=True) -> Any:
    options = {} if bias else {"bias": False}
    return mf.learner_module(cls, d_model, n_heads, like=like, torch_mha=torch_mha, **options)


def _cross(cls: Any, *, d_model, n_heads, torch_mha, target, source, mask=None, bias=True) -> Any:
    """Construct the learner's module, load the weights (if any), and call it (the kernel)."""
    return _cross_module(cls, d_model, n_heads, torch_mha, target, bias)(target, source, mask)


def _cached(cls: Any, *, d_model, n_heads, torch_mha, target, source, mask, source2, mask2) -> Any:
    """Decode step by step with ``use_cache=True`` (the first ``t`` target positions at step ``t``), then
    attend to a new source; count the calls of ``w_k``. Then the new source is changed in place
    (:data:`SOURCE_CHANGE`), and after it the weights of ``w_k`` and ``w_v`` (:data:`WEIGHT_CHANGE`); the
    outputs after each (the kernel)."""
    module = _cross_module(cls, d_model, n_heads, torch_mha, target)
    calls = [0]
    hook = module.w_k.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        with torch.no_grad():
            steps = [module(target[:, : t + 1], source, mask, use_cache=True) for t in range(target.size(1))]
            key_projections = calls[0]
            new_source = module(target, source2, mask2, use_cache=True)
            source2.mul_(SOURCE_CHANGE)  # the same tensor, changed in place
            changed_source = module(target, source2, mask2, use_cache=True)
            module.w_k.weight.mul_(WEIGHT_CHANGE[0])  # as an optimiser step changes them
            module.w_v.weight.mul_(WEIGHT_CHANGE[1])
            changed_weights = module(target, source2, mask2, use_cache=True)
            # source_kv: from the cache, which holds this source; after clear_cache, computed again
            before = calls[0]
            keys_values = module.source_kv(source2)
            from_cache = calls[0] - before
            module.clear_cache()
            module.source_kv(source2)
            after_clear = calls[0] - before - from_cache
    finally:
        hook.remove()
    first = [x[0] if isinstance(x, tuple | list) else x for x in (changed_source, changed_weights)]
    return (
        [step[0][:, -1] if isinstance(step, tuple | list) else step for step in steps],
        new_source,
        key_projections,
        *first,
        keys_values,
        (from_cache, after_clear),
    )


# how _cached changes the new source in place, then the weights of w_k and w_v (exact in binary)
SOURCE_CHANGE, WEIGHT_CHANGE = 0.5, (-1.0, 0.5)
CROSS, CACHED = Driver(_cross, mf.prepare_mha), Driver(_cached, mf.prepare_mha)


def _as_mha(
    arguments: dict[str, Any], query: str = "target", key: str = "source", value: str = "source"
) -> dict:
    """The arguments of chapter 4's checks: query, key and value named from the cross-attention's."""
    return {
        **arguments,
        "bias": True,
        "query": arguments[query],
        "key": arguments[key],
        "value": arguments[value],
    }


def cross_answer(arguments: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``nn.MultiheadAttention(query=target, key=source, value=source)``, float64, every head's weights."""
    return mf.torch_answer(_as_mha(arguments))


def cross_mistakes(arguments: dict[str, Any], index: int) -> Iterator[Mistake]:
    """The output (``index`` 0) or weights (1) of cross-attention's own mistakes, then chapter 4's."""
    if arguments["target"].shape == arguments["source"].shape:  # otherwise shapes tell
        yield Mistake(TEXT["swapped"], ex04.forward(_as_mha(arguments, "source", "target", "target"))[index])
    if index == 0:
        yield Mistake(TEXT["values from target"], _values_from_target(arguments))
    target, source, mask = arguments["target"], arguments["source"], arguments.get("mask")
    causal = torch.ones(target.size(1), source.size(1), dtype=torch.bool, device=target.device).tril()
    yield Mistake(
        TEXT["causal"],
        ex04.forward(_as_mha({**arguments, "mask": causal if mask is None else mask & causal}))[index],
    )
    yield from ex04.mistakes(_as_mha(arguments), index)


def _values_from_target(arguments: dict[str, Any]) -> torch.Tensor:
    a = family.cast(_as_mha(arguments), torch.float64)
    if a["target"].shape != a["source"].shape:
        return torch.full((1,), math.nan, dtype=torch.float64)
    return ex04.forward({**a, "value": a["target"]})[0]


def cross_check(part: Part, arguments: dict[str, Any], sizes: Sizes, answer=cross_answer, note="") -> Check:
    """One call of the learner's cross-attention against ``answer``, its mistakes named (``note``: the rule
    the answer follows, said on a mismatch), within the tolerance of the target's dtype."""
    wrong, mask_3d = mf.distinct(cross_mistakes, answer), TEXT["cross mask 3d"]
    return mf.module_check(
        part, arguments, sizes, answer, wrong, HEAD_SHAPES, note, given="target", mask_3d=mask_3d
    )


def formula_answer(arguments: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 4's computation with the target as query and the source as key and value (float64): the
    course's rule on rows that allow no source position, where nn.MultiheadAttention gives NaN."""
    return ex04.forward(_as_mha(arguments))


def source_masks(sizes: Sizes, seed: int, device) -> list[torch.Tensor | None]:
    """No mask, and a source padding mask ``[batch, 1, 1, src_len]`` (each sequence keeps 2 or more keys)."""
    lengths = torch.randint(2, sizes.k_len + 1, (sizes.batch,), generator=engine.seeded_generator(seed))
    lengths[0] = sizes.k_len - 1 if sizes.k_len > 2 else sizes.k_len
    padding = torch.arange(sizes.k_len)[None, :] < lengths[:, None]  # [batch, src_len]
    return [None, padding[:, None, None, :].to(device)]


# ==================================================================================================
# the behaviours of cross-attention


@behaviour(function="CrossAttention", points=1, hints=HINTS, driver=CROSS)
def cross_shapes(part: Part) -> Iterator[Check]:
    """CrossAttention returns (output [batch, tgt_len, d_model], weights [batch, n_heads, tgt_len, src_len]):
    one row per target position, one column per source position; each row sums to 1."""
    given, hint = "the target is float32", TEXT["cross dtype"]
    sums = lambda result, call: mf.sums_to_one(result[1], call, "the source positions", False)  # noqa: E731
    for index, sizes in enumerate(mf.cases(part, VISIBLE, HIDDEN)):
        arguments = inputs(sizes, seed=140 + 10 * index, device=part.device, dtype=torch.float32)
        yield mf.format_check(part, arguments, sizes, HEAD_SHAPES, hint=hint, judge=sums, given=given)
        if not index:  # the dtype holds with a mask too, rows that allow no key among them (the first sizes)
            masked = {**arguments, "mask": mf.padding_only(sizes, part.device)}
            yield mf.format_check(part, masked, sizes, HEAD_SHAPES, hint=hint, given=given)
    if not part.hidden:  # (calls that raise: other sizes would add nothing)
        yield from _errors(part, VISIBLE)


def _errors(part: Part, sizes: Sizes) -> Iterator[Check]:
    """The documented errors: TypeError of forward (a mask of 0/1 integers or floats), ValueError of
    __init__ (n_heads not dividing d_model)."""
    arguments = inputs(sizes, seed=145, device=part.device, dtype=torch.float32)
    plain = {name: value for name, value in arguments.items() if name not in mf.MHA_WEIGHTS}
    padding = source_masks(sizes, 146, part.device)[1]
    yield from mf.mask_errors(part, plain, padding, (torch.long, torch.float32))
    yield mf.n_heads_error(part, plain, sizes, TEXT["cross n_heads"])


@behaviour(function="CrossAttention", points=2, hints=HINTS, driver=CROSS)
def cross_matches_torch(part: Part) -> Iterator[Check]:
    """Given nn.MultiheadAttention's weights, CrossAttention(target, source, mask) computes
    nn.MultiheadAttention(target, source, source) with the source padding mask (True = may attend)."""
    for index, sizes in enumerate(mf.cases(part, VISIBLE, HIDDEN)):
        for mask in source_masks(sizes, 150 + index, part.device):
            arguments = inputs(sizes, seed=150 + 10 * index, device=part.device, mask=mask)
            yield cross_check(part, arguments, sizes)
        # the other accepted masks: [batch, tgt_len, src_len] (the same for every head), [tgt_len, src_len]
        # (hidden: one of them by turns)
        b, t, k = sizes.batch, sizes.q_len, sizes.k_len
        for number, shape in enumerate(
            ((b, t, k), (t, k)) if not part.hidden else (((b, t, k), (t, k))[index % 2],)
        ):
            mask = family.mask(shape, seed=155 + 10 * index + number, device=part.device)
            arguments = inputs(sizes, seed=155 + 10 * index + number, device=part.device, mask=mask)
            yield cross_check(part, arguments, sizes)
        if index == 0:  # without biases: CrossAttention(d_model, n_heads, bias=False)
            padding = source_masks(sizes, 157 + index, part.device)[1]
            arguments = inputs(sizes, seed=157 + 10 * index, device=part.device, mask=padding, bias=False)
            yield cross_check(part, arguments, sizes)
        # rows that allow no source position (a source of padding only, among others): zero weights;
        # visible: float32 [batch, tgt_len, src_len] and a padding mask; hidden: one by turns (per head too)
        for mask, dtype, seed in mf.empty_row_cases(part, sizes, index, 158, (1, 2), (1, 2, 4)):
            arguments = inputs(sizes, seed=seed, device=part.device, dtype=dtype, mask=mask)
            yield cross_check(part, arguments, sizes, formula_answer, note=TEXT["rule"])
    if part.hidden:  # a target as long as the source: a swap of the two no longer shows in the shapes
        sizes = Sizes(2, 6, 6, 12, 3)
        yield cross_check(part, inputs(sizes, seed=159, device=part.device), sizes)


@behaviour(function="CrossAttention", points=1, hints=HINTS, driver=CROSS)
def cross_source_permutation(part: Part) -> Iterator[Check]:
    """Permuting the source positions (keys and values together, and the mask) leaves the output unchanged and
    permutes the weights' columns the same way: attention has no notion of position."""
    for index, sizes in enumerate(mf.cases(part, VISIBLE, HIDDEN)):
        mask = source_masks(sizes, 160 + index, part.device)[1]
        arguments = inputs(sizes, seed=160 + 10 * index, device=part.device, mask=mask)
        order = torch.randperm(sizes.k_len, generator=engine.seeded_generator(165 + index))
        order[order.clone()] = torch.roll(order, -1)  # one cycle: every position moves
        device_order = order.to(part.device)
        moved = {**arguments, "source": arguments["source"][:, device_order], "mask": mask[..., device_order]}
        calls = (part.call(**arguments), part.call("with the source positions permuted", **moved))

        def judge(*results: Any, calls=calls, sizes=sizes, order=order) -> None:
            pairs = [mf.module_pair(r, c, sizes, HEAD_SHAPES) for r, c in zip(results, calls, strict=True)]
            (output, weights), (output2, weights2) = ([x.detach().cpu().double() for x in p] for p in pairs)
            for which, actual, right in (
                ("output", output2, output),
                ("weights", weights2, weights[..., order]),
            ):
                largest = (actual - right).abs().nan_to_num(math.inf).max().item()
                if not largest <= 1e-9 + 1e-7 * right.abs().max().item():
                    fail(
                        f"the {which} of {calls[1]} {'changes' if which == 'output' else 'are not permuted'} "
                        f"(largest difference {largest:.3g}).",
                        "something depends on the source positions' order: the keys and the values must come "
                        "from the same (permuted) source, and the mask be applied to the keys' axis",
                    )

        yield Check(calls, judge)


@behaviour(function="CrossAttention", points=2, hints=HINTS, driver=CACHED)
def cross_cache(part: Part) -> Iterator[Check]:
    """With use_cache=True the source's keys and values are computed once while the same source is given, and
    recomputed for a new source: decoding step by step gives the outputs of the uncached module."""
    for index, sizes in enumerate(mf.cases(part, VISIBLE, HIDDEN)):
        masks = source_masks(sizes, 170 + index, part.device)
        arguments = inputs(sizes, seed=170 + 10 * index, device=part.device, mask=masks[1])
        other = sizes if not part.hidden or index != 1 else replace(sizes, k_len=sizes.k_len + 2)
        source2 = randn((other.batch, other.k_len, other.d_model), seed=175 + index, device=part.device)
        mask2 = source_masks(other, 176 + index, part.device)[1]
        yield _cache_check(part, {**arguments, "source2": source2, "mask2": mask2}, sizes, other)


def _cache_check(part: Part, arguments: dict[str, Any], sizes: Sizes, other: Sizes) -> Check:
    call = part.call(**arguments)
    new = {**arguments, "source": arguments["source2"], "mask": arguments["mask2"]}

    def judge(result: Any) -> None:
        if not isinstance(result, tuple) or len(result) != 7:
            fail(f"{call} did not run.")
        steps, new_source, key_projections, changed_source, changed_weights, keys_values, counts = result
        expected_output = cross_answer(arguments)[0]
        for t, step in enumerate(steps):
            where = f"the output at target position {t} when decoding step by step with use_cache=True"
            assert_values(step, expected_output[:, t], where, dtype=torch.float64)
        if key_projections > 1:
            fail(
                f"with use_cache=True, w_k ran {key_projections} times over the same source in {len(steps)} "
                "steps.",
                TEXT["recomputed"],
            )

        def stale() -> Iterator[Mistake]:
            if other == sizes:
                old = {**new, "source": arguments["source"]}
                yield Mistake(TEXT["stale"], ex04.forward(_as_mha(old))[0])

        pair = mf.module_pair(new_source, call, other, HEAD_SHAPES)
        where = "the output for a new source after decoding with the first one (use_cache=True)"
        assert_values(
            pair[0],
            cross_answer(new)[0],
            where,
            dtype=torch.float64,
            mistakes=stale,
            hints={(other.batch, other.q_len, other.d_model): ""},
        )
        # the same source tensor changed in place, then the weights of w_k and w_v: computed again
        changed = {**new, "source": new["source"] * SOURCE_CHANGE}
        rows = torch.tensor([1.0, WEIGHT_CHANGE[0], WEIGHT_CHANGE[1]], dtype=torch.float64)
        in_proj = changed["in_proj_weight"].double() * rows.repeat_interleave(other.d_model)[:, None].to(
            changed["in_proj_weight"].device
        )
        cases = (
            (changed_source, changed, new, "stale in place", "after the new source was changed in place"),
            (
                changed_weights,
                {**changed, "in_proj_weight": in_proj},
                changed,
                "stale weights",
                "after w_k and w_v were changed in place",
            ),
        )
        for actual, right, before, hint, when in cases:
            old = lambda before=before, hint=hint: iter([Mistake(TEXT[hint], cross_answer(before)[0])])  # noqa: E731
            where = f"the output {when} (use_cache=True, the same source tensor)"
            shapes = {(other.batch, other.q_len, other.d_model): ""}
            assert_values(
                actual, cross_answer(right)[0], where, dtype=torch.float64, mistakes=old, hints=shapes
            )
        _judge_source_kv(keys_values, counts, {**changed, "in_proj_weight": in_proj}, other)

    return Check(call, judge, on_raise=TEXT["stale"] if other != sizes else "")


def _judge_source_kv(keys_values: Any, counts: Any, arguments: dict[str, Any], sizes: Sizes) -> None:
    """source_kv's ``(keys, values)`` of the source of ``arguments`` (its weights), taken from the cache, then
    computed again after clear_cache (``counts``: the projections of w_k each time)."""
    where = "source_kv(source) after the module attended to that source with use_cache=True"
    if not isinstance(keys_values, tuple | list) or len(keys_values) != 2:
        fail(
            f"{where} returned {engine.describe(keys_values)}, not a pair (keys, values).", TEXT["source_kv"]
        )
    a = family.cast(arguments, torch.float64)
    biases = a["in_proj_bias"].chunk(3) if a["in_proj_bias"] is not None else (None,) * 3
    shape = (sizes.batch, sizes.k_len, sizes.n_heads, sizes.d_head)
    for which, actual, weight, bias in zip(
        ("keys", "values"), keys_values, a["in_proj_weight"].chunk(3)[1:], biases[1:], strict=True
    ):
        right = F.linear(a["source"], weight, bias).reshape(shape).transpose(1, 2)
        shapes = {(sizes.batch, sizes.k_len, sizes.d_model): TEXT["source_kv"]}
        assert_values(actual, right, f"the {which} of {where}", dtype=torch.float64, hints=shapes)
    from_cache, after_clear = counts
    if from_cache:
        fail(f"{where} ran w_k again although the cache holds that source's keys.", TEXT["source_kv cache"])
    if not after_clear:
        fail(
            "source_kv(source) after clear_cache() did not run w_k: the cache was not forgotten.",
            TEXT["clear"],
        )


@behaviour(function="CrossAttention", points=1, hints=HINTS, driver=CROSS)
def cross_from_scratch(part: Part) -> Iterator[Check]:
    """CrossAttention is correct and calls no built-in attention (F.scaled_dot_product_attention,
    nn.MultiheadAttention's forward)."""
    cases = mf.cases(part, VISIBLE, HIDDEN)
    return mf.from_scratch(
        part, "cross-attention", cross_matches_torch, cases, inputs, source_masks, seed=180
    )


# ==================================================================================================
# 3. the decoder layer


ATTENTIONS = {"self": "self_attn", "cross": "multihead_attn"}  # prefix -> nn.TransformerDecoderLayer's
LAYER_WEIGHTS = mf.layer_weight_names(ATTENTIONS, 3)


def build_torch_layer(arguments: dict[str, Any]) -> nn.TransformerDecoderLayer:
    """``nn.TransformerDecoderLayer(batch_first=True, dropout=0)`` with the weights of ``arguments``."""
    return mf.torch_layer(nn.TransformerDecoderLayer, arguments, ATTENTIONS, dropout=0.0)


def _layer(cls: Any, d_model, n_heads, d_ff, norm_first, torch_layer, like: torch.Tensor) -> Any:
    layer = mf.learner_module(cls, d_model, n_heads, d_ff, like=like, norm_first=norm_first)
    return mf.load_torch_layer(layer, torch_layer).eval()


def _decode(
    cls: Any, *, d_model, n_heads, d_ff, norm_first, torch_layer, x, memory, self_mask=None, memory_mask=None
) -> Any:
    """Construct the learner's layer, load the weights, and call it (the kernel)."""
    layer = _layer(cls, d_model, n_heads, d_ff, norm_first, torch_layer, x)
    return layer(x, memory, self_mask, memory_mask)


def _steps(cls: Any, *, d_model, n_heads, d_ff, norm_first, torch_layer, x, memory, memory_mask=None) -> Any:
    """Decode step by step with ``use_cache=True``: at step ``t`` the first ``t`` positions, the causal mask
    of their length; the last position's output of each step (the kernel)."""
    layer = _layer(cls, d_model, n_heads, d_ff, norm_first, torch_layer, x)
    outputs = []
    with torch.no_grad():
        for t in range(1, x.size(1) + 1):
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            outputs.append(layer(x[:, :t], memory, causal, memory_mask, use_cache=True)[:, -1])
    return torch.stack(outputs, dim=1)


PREPARE = mf.prepare_layer(build_torch_layer, LAYER_WEIGHTS)
DECODE, STEPS = Driver(_decode, PREPARE), Driver(_steps, PREPARE)


@dataclass(frozen=True)
class Layer:
    """A way of computing the decoder layer: the right one, or a known mistake (its ``hint``)."""

    hint: str = ""
    order: str = "self, cross"  # "cross, self"
    norm_first: str = "as given"  # "ignored" (always post-LN), "inverted"
    memory_normalised: bool = False
    residual: tuple[bool, bool, bool] = (True, True, True)
    self_mask: bool = True
    memory_mask: bool = True
    activation: str = "relu"
    norms: tuple[int, int, int] = (1, 2, 3)
    final_norm: bool = True


def decoder(arguments: dict[str, Any], row: Layer = Layer()) -> torch.Tensor:
    """The decoder layer's output as ``row`` computes it, in float64 (check code)."""
    a = family.cast(arguments, torch.float64)
    memory = mf.layer_norm(a, row.norms[1], a["memory"]) if row.memory_normalised else a["memory"]
    self_mask = a.get("self_mask") if row.self_mask else None
    memory_mask = a.get("memory_mask") if row.memory_mask else None
    activation = F.relu if row.activation == "relu" else F.gelu
    sublayers = {
        "self": lambda y: ex04.forward(mf.layer_attention(a, "self", y, y, self_mask))[0],
        "cross": lambda y: ex04.forward(mf.layer_attention(a, "cross", y, memory, memory_mask))[0],
        "ffn": lambda y: mf.feed_forward(a, y, activation),
    }
    order = [name.strip() for name in row.order.split(",")] + ["ffn"]
    kept = [row.residual[("self", "cross", "ffn").index(name)] for name in order]
    # the norms go by position: norm1 for the first sub-layer
    return mf.residuals(a, [sublayers[name] for name in order], row, kept)


DECODER_ROWS = (
    Layer(TEXT["order"], order="cross, self"),
    Layer(TEXT["norm first ignored"], norm_first="ignored"),
    Layer(TEXT["norm first inverted"], norm_first="inverted"),
    Layer(TEXT["memory normalised"], memory_normalised=True),
    Layer(TEXT["no self residual"], residual=(False, True, True)),
    Layer(TEXT["no cross residual"], residual=(True, False, True)),
    Layer(TEXT["no ffn residual"], residual=(True, True, False)),
    Layer(TEXT["no causal mask"], self_mask=False),
    Layer(TEXT["no memory mask"], memory_mask=False),
    Layer(TEXT["gelu"], activation="gelu"),
    Layer(TEXT["norms swapped"], norms=(2, 1, 3)),
    Layer(TEXT["norms swapped"], norms=(3, 2, 1)),
    Layer(TEXT["no final norm"], final_norm=False),
)


def decoder_mistakes(arguments: dict[str, Any]) -> Iterator[Mistake]:
    for row in DECODER_ROWS:
        if row.memory_normalised and not arguments["norm_first"]:
            continue
        yield Mistake(row.hint, decoder(arguments, row))


def torch_decoder(arguments: dict[str, Any]) -> torch.Tensor:
    """``nn.TransformerDecoderLayer``'s output, float64, masks negated (``True`` = blocked there)."""
    wide = family.cast(arguments, torch.float64)
    layer = build_torch_layer(wide)
    self_mask, memory_mask = wide.get("self_mask"), wide.get("memory_mask")
    with torch.no_grad():
        return layer(
            wide["x"],
            wide["memory"],
            tgt_mask=None if self_mask is None else ~self_mask,
            memory_key_padding_mask=None if memory_mask is None else ~memory_mask[:, 0, 0],
        )


def layer_inputs(sizes: Sizes, *, seed: int, device, norm_first: bool, dtype=torch.float64) -> dict[str, Any]:
    """The arguments of one decoder-layer call: sizes, weights, ``x``, ``memory``, the causal mask
    ``[tgt_len, tgt_len]`` and a source padding mask ``[batch, 1, 1, src_len]``."""
    weights = mf.layer_weights(sizes, ATTENTIONS, 3, seed=seed + 10, device=device, dtype=dtype)
    sized = {"d_model": sizes.d_model, "n_heads": sizes.n_heads, "d_ff": sizes.d_ff, "norm_first": norm_first}
    return {
        **sized,
        **weights,
        **mf.sequences(sizes, ("x", "memory"), seed=seed, device=device, dtype=dtype),
        "self_mask": torch.ones(sizes.q_len, sizes.q_len, dtype=torch.bool, device=device).tril(),
        "memory_mask": source_masks(sizes, seed + 5, device)[1],
    }


def decoder_check(part: Part, arguments: dict[str, Any], sizes: Sizes) -> Check:
    call = part.call(**arguments)

    def judge(result: Any) -> None:
        hints = {
            (sizes.batch, sizes.k_len, sizes.d_model): "the output follows the source: return the target's"
        }
        if isinstance(result, tuple | list):
            fail(
                f"{call} returned a {type(result).__name__}: the decoder layer returns one tensor, "
                "[batch, tgt_len, d_model] (drop the attention weights)"
            )
        expected = torch_decoder(arguments)
        assert_values(
            result,
            expected,
            f"the output of {call}",
            dtype=torch.float64,
            mistakes=lambda: decoder_mistakes(arguments),
            hints=hints,
        )

    return Check(call, judge, on_raise=CROSS_MASK)


@behaviour(function="DecoderLayer", points=3, hints=HINTS, driver=DECODE)
def decoder_matches_torch(part: Part) -> Iterator[Check]:
    """DecoderLayer (masked self-attention, cross-attention, feed-forward; each with its residual and layer
    norm) computes what nn.TransformerDecoderLayer computes given the same weights, post-LN and pre-LN."""
    cases = mf.cases(part, VISIBLE, HIDDEN)
    for index, sizes in enumerate(cases):
        for norm_first in (False, True):
            arguments = layer_inputs(sizes, seed=200 + 10 * index, device=part.device, norm_first=norm_first)
            yield decoder_check(part, arguments, sizes)
    # the docstring's TypeError: the causal mask as 0/1 floats, the padding mask as 0/1 integers
    arguments = layer_inputs(cases[0], seed=205, device=part.device, norm_first=False)
    for name, kind in (("self_mask", torch.float64), ("memory_mask", torch.long)):
        hint = TEXT["decoder mask dtype"]
        yield from mf.mask_errors(part, arguments, arguments[name], (kind,), hint, name, what=name)


@behaviour(function="DecoderLayer", points=1, hints=HINTS, driver=STEPS)
def decoder_step_by_step(part: Part) -> Iterator[Check]:
    """Decoding step by step (the target so far, its causal mask, use_cache=True) gives at each step the last
    position's output of the whole target at once: the causal mask hides the future, the cache changes
    nothing."""
    for index, sizes in enumerate(mf.cases(part, VISIBLE, HIDDEN)):
        for norm_first in (False, True):
            arguments = layer_inputs(sizes, seed=220 + 10 * index, device=part.device, norm_first=norm_first)
            causal = arguments.pop("self_mask")
            call = part.call(**arguments)

            def judge(result: Any, arguments=arguments, call=call, causal=causal) -> None:
                full = {**arguments, "self_mask": causal}
                assert_values(
                    result,
                    torch_decoder(full),
                    f"the step-by-step outputs of {call}",
                    dtype=torch.float64,
                    mistakes=lambda: decoder_mistakes(full),
                )

            yield Check(call, judge, on_raise=CROSS_MASK)
