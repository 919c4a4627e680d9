"""Checks of exercise ex10: a KV cache, greedy generation with and without it, and a paged cache.

The caches are classes, driven through scripts of operations (strings such as ``"a0:5 f0:1 g1"``, with the
keys and values as tensors): what was appended is the known answer, since a layer, or a gather, holds its
concatenation on the length axis. The paged cache's state is compared with its specification after every
operation: each sequence holds ``ceil(len / block_size)`` blocks, a reference count counts the block tables
that hold the block, a block is free exactly when none does, and sequences share a block exactly where a fork
shared it and no write has copied it since. ``generate`` runs a small decoder of the checks
(:class:`Decoder`: learned positions, grouped-query attention with 4 query and 2 key/value heads, built from
weights in the learner's process), which records each call's last logits and counts the positions that go
through its first key projection.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from attention_course.checks import engine
from attention_course.checks.engine import (
    Check,
    CheckFailure,
    Driver,
    Mistake,
    Part,
    assert_values,
    behaviour,
    fail,
    randn,
)

TEXT = engine.table("""
new only: append returned only the new keys and values: return everything the layer holds, the old
    positions followed by the new ones
old only: append returned what the layer held before the new keys: append first, then return
shared layers: the layers share one cache: keep one pair of tensors per layer (append(layer, ...) adds to
    that layer only)
swapped: keys and values are swapped
not reset: reset() did not empty the cache: after it, the cache holds only what is appended next
positions not advanced: the new tokens are put at positions 0, 1, ... at every step: with a cache, the new
    token's position is the number of positions cached, positions = arange(cache.length, cache.length +
    q_len)
top-left: the causal mask is aligned top-left (torch.ones(q_len, k_len).tril(), as is_causal=True does):
    one new query then attends key 0 only. Align it bottom-right, tril(diagonal=cache.length): new query i
    may attend keys 0 .. cache.length + i
no mask: no causal mask: the prompt's positions attend to later prompt tokens. Pass the causal mask
    torch.ones(q_len, k_len, dtype=torch.bool).tril(diagonal=past), past = cache.length (0 without a cache)
whole sequence: the whole sequence goes through the model at every step although the cache holds its keys
    and values already: with a cache, feed only the tokens the model has not seen (the prompt, then the last
    new token)
prompt skipped: only the prompt's last token went through the model: the first step must run the whole
    prompt, so that the cache holds its keys and values
last token only: only the last token goes through the model without a cache: without a cache feed the
    whole sequence so far, positions 0 .. len - 1
recomputed: with use_cache=True the model still recomputes the keys and values of earlier positions: run
    the prompt once, then only the one new token per step, with the cache
not none: keys(layer) and values(layer) are None for a layer before its first append (not an empty tensor):
    start every layer at None
kv dtype: the cache must hold exactly what was appended, in its dtype and on its device: a buffer made
    without dtype=key.dtype (torch.zeros defaults to float32) rounds float64 keys
kv misfit: check that new keys fit the stored ones (batch, n_kv_heads and d_head) and raise RuntimeError
    otherwise: writing into a preallocated buffer broadcasts a batch of 1 silently, where torch.cat([old,
    new], dim=2) raises
kv layer: a layer out of range (layer >= n_layers) must raise IndexError: keep a list of n_layers slots
    (a dict, or a list that grows, accepts any layer)
kv n_layers: check n_layers first: raise ValueError if it is below 1
last layer: length reads another layer than layer 0: after layer 0's append, before the other layers', it
    already counts the new positions; read layer 0
every append: length grows with every append, of every layer: it is the number of positions of layer 0, and
    each forward pass appends the same positions to every layer
negative: check max_new_tokens first and raise ValueError if it is below 0 (range() of a negative number is
    empty, so without the check generate returns the prompt as if nothing were wrong)
sizes: check the sizes first: raise ValueError if block_size, n_blocks, n_kv_heads or d_head is below 1
    (torch.zeros accepts 0, and a pool of 0 blocks or 0 slots fails only later)
pool: the pool key_blocks and value_blocks is [n_blocks, n_kv_heads, block_size, d_head], made with the
    dtype and on the device given (torch.zeros(..., dtype=dtype, device=device))
overflow: check, before changing anything, that the free blocks cover the new blocks and, when the last
    block is shared and partly filled, the block that copy on write takes too
fork exists: fork must refuse a child id that is already a sequence, with ValueError: it would overwrite
    that sequence's block table without freeing its blocks
no sequence: a sequence that does not exist (never started, or freed) has no blocks: index it,
    block_tables[seq_id], which raises KeyError, rather than .get(seq_id, []) or .pop(seq_id, None)
freed kept: free must forget the sequence entirely (its block table and its length): a freed id can be
    used again, by a fork or an append that starts a new sequence
lengths: lengths[seq_id] is the number of positions the sequence holds
fits: this append fits in the free blocks: count a copy only when the last block is shared (ref_counts > 1)
    and partly filled (length % block_size != 0), and new blocks only for the positions that the last block
    cannot take
stale: the keys and values of an earlier call were used again: the model completed another prompt first,
    and generate must start every call from an empty cache, a new KVCache(model.n_layers) (not one kept on
    the model or in a global)
one more: one token too many: generate adds exactly max_new_tokens tokens (with 0, it returns the prompt
    alone); run the model inside the loop only, once per new token
in place: a block that no other sequence holds is written in place: copy on write copies the last block only
    when another sequence holds it too (ref_counts > 1) and it is partly filled
length int: length must be an int: keep it a property (@property), as the task has it
block count: take a new block only when the last one is full (position % block_size == 0)
copy missing: copy on write is missing: a sequence wrote into a block that another sequence still holds (after
    a fork): copy a shared, partly filled block before writing into it
one block: one block was given to two sequences: take new blocks from free_blocks (and remove them from it)
fork shares: fork shares the parent's blocks (the child's block table is a copy of the parent's, no block is
    copied); later, only the partly filled last block is copied, before a write
leak: a block that no sequence holds is not in free_blocks (a leak): free must return it
ref counts: fork adds one to the count of each block it shares, free subtracts one, and copy on write moves
    one
unchanged: check that enough blocks are free before changing anything
""")
HINTS = engine.hint_table("""
Sizes of tensors must match except in dimension | stack expects each tensor: the keys are concatenated on
    the wrong axis: they are [batch, n_kv_heads, len, d_head], so new positions go on the length axis,
    torch.cat([old, new], dim=2)
has no attribute: keep the methods and attributes that the task names (the checks call and read them)
""")
MODEL_HINTS = engine.hint_table("""
the mask has: the mask must be [q_len, k_len] with k_len = cache.length + q_len (the cached positions and
    the new ones), or [len, len] without a cache
mask must be boolean: build the mask with dtype=torch.bool (True = may attend)
beyond the model's max_len: a position reached the model's max_len: with a cache, feed only the tokens
    the model has not seen (the prompt, then the last new token), at positions from cache.length on
tensors used as indices: positions are integer (torch.long) indices, 0 .. len - 1 in all
cache.append returned: the model's cache is your KVCache: check that append concatenates on the length
    axis and returns every position the layer holds
unexpected keyword | positional argument: call the model as model(tokens, positions, mask, cache)
""")

# The learner's docstrings clause by clause, and the behaviours that check each (tests/test_contracts.py).
CONTRACT = engine.table("""
KVCache n_layers: kv_cache_append, kv_cache_length_reset; 1 to 4 layers, one never appended to
KVCache raises ValueError: kv_cache_append; n_layers 0 (visible), -1 and 0 (hidden)
KVCache.append layer: kv_cache_append; appends interleaved over the layers, each layer its own keys
KVCache.append key: kv_cache_append, kv_cache_length_reset; [batch, n_kv_heads, new_len, d_head], new_len 1 to
    6, float64 and float32
KVCache.append value: kv_cache_append, kv_cache_length_reset; as key, its own values (not the keys)
KVCache.append returns: kv_cache_append; (keys, values) after every append: the old positions then the new
    ones, on the length axis, with the dtype and device of what was appended
KVCache.append raises IndexError: kv_cache_append; layer n_layers (visible), and n_layers + 3 (hidden)
KVCache.append raises RuntimeError: kv_cache_append; keys of another d_head, a batch of 1 after a batch of 2
    (which a preallocated buffer broadcasts), another n_kv_heads (hidden)
KVCache.keys layer: kv_cache_append, kv_cache_length_reset; what the layer holds, None before its first
    append, every layer after reset() and a forward pass
KVCache.values layer: kv_cache_append, kv_cache_length_reset; as keys
KVCache.length int: kv_cache_length_reset; an int: 0 when empty, then layer 0's count after every append to
    every layer (also between the layers of a forward pass), 0 after reset()
KVCache.reset every layer: kv_cache_length_reset; every layer holds only what is appended after it
generate model: generate_without_cache, generate_with_cache, generate_uses_cache; the checks' decoder, called
    as model(tokens, positions, mask, cache): positions torch.long, a boolean mask [q_len, k_len], None or the
    learner's KVCache of model.n_layers layers (fewer fail at cache.append)
generate prompt: generate_without_cache, generate_with_cache, generate_uses_cache; [batch, prompt_len], batch
    1 to 4, prompt_len 1 (hidden) to 7
generate max_new_tokens: generate_without_cache, generate_with_cache, generate_uses_cache; 0 (the prompt
    alone), 1 (hidden), 5 to 20
generate use_cache: generate_without_cache, generate_with_cache, generate_uses_cache; False (without_cache),
    True (the others)
generate returns: generate_without_cache, generate_with_cache, generate_uses_cache; [batch, prompt_len +
    max_new_tokens]: the prompt, then the new tokens
generate raises ValueError: generate_without_cache; max_new_tokens -1 and -2 (visible), -1 and -3 (hidden),
    with and without a cache
generate greedy: generate_without_cache, generate_with_cache; each step's last logits against one forward pass
    over the whole sequence (float64, float32), the tokens their argmax
generate positions and mask: generate_with_cache; positions from cache.length on, the mask aligned
    bottom-right; the whole sequence so far without a cache (generate_without_cache)
generate a cache per call: generate_with_cache, generate_uses_cache; the same model completes another prompt
    first (its keys must not stay)
generate keeps the keys: generate_uses_cache; the positions through the first layer's key projection counted:
    the prompt once, then one per new token
PagedKVCache block_size: paged_gather, paged_fork, paged_free; 1 to 4, appends that span several blocks
PagedKVCache n_blocks: paged_gather, paged_fork, paged_free; 4 to 12, pools filled exactly (paged_free)
PagedKVCache n_kv_heads: paged_gather; 2: the pool [n_blocks, n_kv_heads, block_size, d_head]
PagedKVCache d_head: paged_gather; 3: the pool's shape, as n_kv_heads
PagedKVCache dtype: paged_gather; the pool's and the gathered keys' and values': float64 (visible), float32
    and bfloat16 (hidden); the defaults (float32, device None) are not called: every check passes both
PagedKVCache device: paged_gather; the pool's and the gathered tensors', the keys' device (the checks' device:
    the CPU where there is no GPU, so that a device ignored shows on a GPU only)
PagedKVCache raises ValueError: paged_gather; block_size, n_blocks, n_kv_heads, d_head 0 each (visible),
    negative (hidden)
PagedKVCache attributes: paged_gather, paged_fork, paged_free; block_tables, lengths, ref_counts and
    free_blocks after every operation; key_blocks and value_blocks (paged_gather)
PagedKVCache.append seq_id: paged_gather, paged_fork, paged_free; several sequences interleaved, new ids, ids
    used again after free
PagedKVCache.append key: paged_gather, paged_fork, paged_free; [n_kv_heads, new_len, d_head], new_len 1 to 9
PagedKVCache.append value: paged_gather, paged_fork, paged_free; as key (gathered apart)
PagedKVCache.append raises RuntimeError: paged_free; too few blocks for the new blocks, for the copy alone,
    for new blocks and the copy; the cache unchanged (tables, free blocks, counts, lengths); appends that fit
    exactly (with a copy, into a full shared block) must not raise
PagedKVCache.append copy on write: paged_fork, paged_free; a shared, partly filled last block only, copied
    before the write; a block that no other sequence holds any more is written in place
PagedKVCache.fork shares: paged_fork, paged_free; the parent's blocks, counts + 1, nothing copied, into a
    freed id too
PagedKVCache.fork raises KeyError: paged_fork; a parent that does not exist
PagedKVCache.fork raises ValueError: paged_fork; a child that exists
PagedKVCache.free forgets: paged_free; blocks back to free_blocks at count 0 only, the length forgotten
PagedKVCache.free raises KeyError: paged_free; a sequence freed already
PagedKVCache.gather in order: paged_gather, paged_fork, paged_free; [n_kv_heads, len, d_head] each, exactly
    what was appended
PagedKVCache.gather raises KeyError: paged_gather, paged_free; a sequence never started (paged_gather), one
    freed (paged_free)
""")


def _check(
    part: Part, judge: Callable[..., None], arguments: dict[str, Any], label: str = "", /, **options
) -> Check:
    """A check of one call with keyword ``arguments``, judged by ``judge(call, arguments, result,
    **options)`` (``call``: the call as text)."""
    call = part.call(label, **arguments)
    return Check(call, lambda result: judge(str(call), arguments, result, **options))


# --- 1. KVCache: appends, length and reset


def _kv_appends(
    cls: Any, *, n_layers: int, layers: list, lengths: list, keys, values, then_key=None, then_value=None
) -> Any:
    """Append the pieces of ``keys`` and ``values`` to ``layers`` (the kernel); return what each append
    returned, then what each layer holds. ``then_key`` and ``then_value``: one more append to the last layer,
    which must raise (they do not fit)."""
    cache, returned = cls(n_layers), []
    for layer, key, value in zip(layers, keys.split(lengths, 2), values.split(lengths, 2), strict=True):
        if isinstance(result := cache.append(layer, key, value), tuple | list):
            result = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in result)
        returned.append(result)
    if then_key is not None:
        cache.append(layers[-1], then_key, then_value)
    return returned, [(cache.keys(layer), cache.values(layer)) for layer in range(n_layers)]


def _kv_length(cls: Any, *, n_layers: int, lengths: list, keys, values) -> Any:
    """Forward passes (a piece appended to every layer), ``reset()`` before the last one (the kernel); return
    ``length`` at the start, after each append and after reset(), and what each layer holds at the end."""
    cache = cls(n_layers)
    seen = [cache.length]
    for index, (key, value) in enumerate(zip(keys.split(lengths, 2), values.split(lengths, 2), strict=True)):
        if index == len(lengths) - 1:
            cache.reset()
            seen.append(cache.length)
        for layer in range(n_layers):
            cache.append(layer, key, value)
            seen.append(cache.length)
    return seen, [(cache.keys(layer), cache.values(layer)) for layer in range(n_layers)]


APPENDS, LENGTH = Driver(_kv_appends), Driver(_kv_length)


def _kv_arguments(lengths: tuple[int, ...], seed: int, part: Part, dtype=torch.float64) -> dict[str, Any]:
    """Keys and values ``[batch 2, n_kv_heads 3, len, d_head 5]`` to split into pieces of ``lengths``."""
    shape = (2, 3, sum(lengths), 5)
    keys, values = (randn(shape, seed=seed + i, device=part.device, dtype=dtype) for i in (0, 1))
    return {"lengths": list(lengths), "keys": keys, "values": values}


@behaviour(function="KVCache", points=2, hints=HINTS, driver=APPENDS)
def kv_cache_append(part: Part) -> Iterator[Check]:
    """KVCache(n_layers).append(layer, key, value) adds new positions on the length axis of [batch,
    n_kv_heads, len, d_head] and returns all the keys and values the layer holds; keys(layer) and
    values(layer) give them too, each layer its own."""
    # (layers appended to, lengths, dtype, n_layers): the last layer is never appended to (None) but in one
    cases = [((0, 1, 0, 1, 0, 1), (3, 3, 1, 1, 2, 2), torch.float64, 3)]
    if part.hidden:
        cases = [
            ((0, 0, 0), (1, 1, 1), torch.float32, 1),
            ((2, 0, 1, 2, 0, 1, 2), (4, 4, 4, 1, 1, 1, 3), torch.float64, 4),
        ]
    for index, (layers, lengths, dtype, n_layers) in enumerate(cases):
        pieces = _kv_arguments(lengths, 500 + 10 * index, part, dtype)
        yield _check(part, _judge_appends, {"n_layers": n_layers, "layers": list(layers), **pieces})
    # the documented errors: n_layers below 1, a layer out of range, new keys that do not fit the stored ones
    for n_layers in (-1, 0) if part.hidden else (0,):
        call = part.call(n_layers=n_layers, layers=[0], **_kv_arguments((1,), 580, part))
        yield engine.raises(call, "ValueError", "if n_layers < 1", TEXT["kv n_layers"])
    for n_layers, layer in ((2, 2), (1, 4)) if part.hidden else ((2, 2),):
        call = part.call(n_layers=n_layers, layers=[0, layer], **_kv_arguments((2, 1), 582, part))
        yield engine.raises(call, "IndexError", f"for layer {layer} of {n_layers} layers", TEXT["kv layer"])
    # the keys that do not fit [2, 3, len, 5]: another d_head, a batch of 1 (which a preallocated buffer would
    # broadcast), another n_kv_heads
    misfits = ((2, 3, 1, 4), (1, 3, 1, 5)) if not part.hidden else ((2, 2, 1, 5), (1, 3, 2, 5), (2, 3, 1, 6))
    for index, shape in enumerate(misfits):
        then = {
            f"then_{name}": randn(shape, seed=590 + 2 * index + i, device=part.device)
            for i, name in enumerate(("key", "value"))
        }
        call = part.call(n_layers=2, layers=[0, 1, 1], **_kv_arguments((2, 2, 1), 584, part), **then)
        condition = "if the new keys do not fit the stored ones (another batch, n_kv_heads or d_head)"
        yield engine.raises(call, "RuntimeError", condition, TEXT["kv misfit"])


def _judge_appends(call: str, arguments: dict[str, Any], result: Any) -> None:
    """What each append returned, then what each layer holds: the pieces appended to that layer."""
    layers, (returned, held) = arguments["layers"], result
    pieces = {n: arguments[n].split(arguments["lengths"], 2) for n in ("keys", "values")}
    for i, got in enumerate([*returned, *held]):
        layer = layers[i] if i < len(layers) else i - len(layers)
        mine = [j for j in range(min(i + 1, len(layers))) if layers[j] == layer]  # the pieces the layer holds
        appended = f"append number {i + 1} (to layer {layer})"
        if not mine:  # a layer never appended to
            if got[0] is not None or got[1] is not None:
                shown = ", ".join(engine.describe(t) for t in got)
                fail(
                    f"keys({layer}) and values({layer}) in {call} are ({shown}), expected None: nothing was "
                    f"appended to layer {layer}.",
                    TEXT["not none"],
                )
            continue
        if not isinstance(got, tuple | list) or len(got) != 2:
            fail(f"{appended} in {call} returned {engine.describe(got)}, expected (keys, values).")
        for actual, name, other in zip(got, ("keys", "values"), ("values", "keys"), strict=True):
            where = f"the {name} returned by {appended}" if i < len(layers) else f"{name}({layer})"
            own = pieces[name]
            wrong = [
                (TEXT["new only"], own[mine[-1]]),
                (TEXT["old only"], torch.cat([own[j] for j in mine[:-1]] or [own[0][:, :, :0]], dim=2)),
                (TEXT["shared layers"], torch.cat(own[: mine[-1] + 1], dim=2)),
                (TEXT["swapped"], torch.cat([pieces[other][j] for j in mine], dim=2)),
            ]
            _compare(actual, torch.cat([own[j] for j in mine], dim=2), f"{where} in {call}", wrong)


def _compare(got: Any, expected: torch.Tensor, where: str, wrong: list[tuple[str, torch.Tensor]]) -> None:
    """``assert_values`` with known mistakes ``(hint, result)``, told by their values or by their shapes (the
    first of a shape), then the dtype and device of what was appended."""
    shapes = {tuple(r.shape): hint for hint, r in reversed(wrong) if r.shape != expected.shape}
    assert_values(got, expected, where, hints=shapes, mistakes=lambda: (Mistake(*row) for row in wrong))
    if got.dtype != expected.dtype or got.device != expected.device:
        fail(
            f"{where} is {engine.describe(got)}, where the keys and values appended are "
            f"{engine.describe(expected)}.",
            TEXT["kv dtype"],
        )


@behaviour(function="KVCache", points=1, hints=HINTS, driver=LENGTH)
def kv_cache_length_reset(part: Part) -> Iterator[Check]:
    """length is the number of positions cached (0 when empty), and reset() empties every layer: what is
    appended after it is all the cache holds."""
    cases = ((2, (3, 1, 2, 4)),) if not part.hidden else ((1, (1, 1, 5)), (3, (6, 2, 1)))
    for index, (n_layers, lengths) in enumerate(cases):
        yield _check(
            part, _judge_length, {"n_layers": n_layers, **_kv_arguments(lengths, 540 + 10 * index, part)}
        )


def _lengths(lengths: list[int], n_layers: int, row: str = "") -> list[int]:
    """``length`` at the start, after each append (``n_layers`` per forward pass) and after the reset before
    the last pass, as a right cache or a mistake (``row``) counts it (check code)."""
    seen, layer_0, counter = [0], 0, 0
    for index, n in enumerate(lengths):
        if index == len(lengths) - 1:  # reset() before the last forward pass
            layer_0, counter = (layer_0, counter) if row == "not reset" else (0, 0)
            seen.append(counter if row == "every append" else layer_0)
        before, layer_0 = layer_0, layer_0 + n
        for layer in range(n_layers):
            counter += n
            last = layer == n_layers - 1
            seen.append(
                {"every append": counter, "last layer": layer_0 if last else before}.get(row, layer_0)
            )
    return seen


def _judge_length(call: str, arguments: dict[str, Any], result: Any) -> None:
    """``length`` at every point against :func:`_lengths`, then what each layer holds after the reset."""
    lengths, n_layers, (seen, held) = arguments["lengths"], arguments["n_layers"], result
    expected = _lengths(lengths, n_layers)
    if seen != expected:
        rows = ("not reset", "last layer", "every append")
        cause = next((TEXT[row] for row in rows if seen == _lengths(lengths, n_layers, row)), "")
        if not all(isinstance(length, int) for length in seen):
            cause = TEXT["length int"]
        shown = [length if isinstance(length, int) else engine.describe(length) for length in seen]
        fail(
            f"cache.length in {call} was {shown} (at the start, after each append to each of the {n_layers} "
            f"layers, after reset() before the last forward pass), expected {expected}.",
            cause,
        )
    last = slice(-lengths[-1], None)
    for layer, pair in enumerate(held):
        where = f"layer {layer} after reset() and one more forward pass in {call}"
        for got, name, other in zip(pair, ("keys", "values"), ("values", "keys"), strict=True):
            wrong = [(TEXT["not reset"], arguments[name]), (TEXT["swapped"], arguments[other][:, :, last])]
            _compare(got, arguments[name][:, :, last], f"the {name} of {where}", wrong)


# --- 2. generate, on a decoder of the checks

VOCAB, D_MODEL, N_HEADS, N_KV_HEADS, N_LAYERS, MAX_LEN = 13, 12, 4, 2, 2, 48
D_HEAD = D_MODEL // N_HEADS
# the decoder's weights, in the order of the flat vector that holds them
HEADS = {"q": N_HEADS, "k": N_KV_HEADS, "v": N_KV_HEADS, "o": N_HEADS, "f": N_HEADS}
SHAPES = {"embedding": (VOCAB, D_MODEL), "position": (MAX_LEN, D_MODEL), "output": (D_MODEL, VOCAB)} | {
    f"{kind}{layer}": (n * D_HEAD, D_MODEL) for layer in range(N_LAYERS) for kind, n in HEADS.items()
}


class Decoder(nn.Module):
    """A small decoder of the checks, called as ``model(tokens, positions, mask, cache)``.

    Learned positions; ``N_LAYERS`` layers of grouped-query attention (query head ``i`` uses key/value head
    ``i // 2``) and a tanh feed-forward layer, each added to the residual stream. With a cache, each layer
    appends its new keys and values with ``cache.append(layer, k, v)`` and attends to what it returns. It
    records the last position's logits of every call and counts the positions whose keys layer 0 computes.
    Plain matrix products (no ``nn.Linear`` modules) keep it fast under the checks' profiler.
    """

    def __init__(self, weights: torch.Tensor) -> None:  # all the weights, flattened into one vector
        super().__init__()
        pieces = weights.split([rows * columns for rows, columns in SHAPES.values()])
        self.w = {name: w.view(shape) for (name, shape), w in zip(SHAPES.items(), pieces, strict=True)}
        self.n_layers, self.max_len, self.step_logits, self.key_positions = N_LAYERS, MAX_LEN, [], 0

    def forward(self, tokens, positions, mask, cache=None) -> torch.Tensor:
        if mask is not None and mask.dtype != torch.bool:
            raise TypeError(f"mask must be boolean (True = may attend), got {mask.dtype}")
        if positions.numel() and int(positions.max()) >= self.max_len:
            raise ValueError(f"position {int(positions.max())} is beyond the model's max_len={self.max_len}")
        w = self.w
        x = w["embedding"][tokens] + w["position"][positions]  # [batch, q_len, d_model]
        (batch, q_len, _), rep = x.shape, N_HEADS // N_KV_HEADS
        self.key_positions += q_len  # layer 0's key projection is about to run on q_len positions
        for layer in range(N_LAYERS):
            q, k, v = (
                (x @ w[f"{kind}{layer}"].T).view(batch, q_len, -1, D_HEAD).transpose(1, 2) for kind in "qkv"
            )  # [batch, heads, q_len, d_head]: 4 query heads, 2 key/value heads
            if cache is not None:
                k, v = _cached(cache.append(layer, k, v), (batch, N_KV_HEADS, q_len, D_HEAD))
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            scores = q @ k.transpose(-2, -1) / math.sqrt(D_HEAD)  # [batch, n_heads, q_len, k_len]
            if mask is not None:
                if mask.dim() < 2 or mask.size(-1) not in (1, k.size(2)) or mask.size(-2) not in (1, q_len):
                    raise ValueError(
                        f"the mask has shape {list(mask.shape)}, but the {q_len} new queries attend to "
                        f"{k.size(2)} keys (the cached positions and the new ones)"
                    )
                scores = scores.masked_fill(~mask, float("-inf"))
            heads = torch.softmax(scores, dim=-1) @ v  # [batch, n_heads, q_len, d_head]
            x = x + heads.transpose(1, 2).reshape(batch, q_len, D_MODEL) @ w[f"o{layer}"].T
            x = x + torch.tanh(x @ w[f"f{layer}"].T)
        logits = x @ w["output"]  # [batch, q_len, vocab]
        self.step_logits.append(logits[:, -1].detach().clone())
        return logits


def _cached(result: Any, new: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """What a learner's ``cache.append`` returned, if it is keys and values ``[batch, heads, len, d]``."""
    good = isinstance(result, tuple | list) and len(result) == 2
    good = good and all(isinstance(t, torch.Tensor) for t in result)
    shapes = [list(t.shape) for t in result] if good else result
    if not good or any(s[:2] + s[3:] != [new[0], new[1], new[3]] or s[2] < new[2] for s in shapes):
        raise ValueError(
            f"cache.append returned {shapes}, expected keys and values [batch, n_kv_heads, len, d_head] = "
            f"[{new[0]}, {new[1]}, len, {new[3]}] with len >= {new[2]}"
        )
    return result[0], result[1]


def _generate(fn: Any, *, weights, prompt, max_new_tokens, use_cache, before=None) -> Any:
    """The learner's ``generate`` on the checks' decoder (the kernel): the tokens, the last logits of each
    call ``[batch, calls, vocab]``, and the positions that went through layer 0's key projection. ``before``:
    a prompt that the same model completes first (3 tokens), whose keys and values must not stay."""
    model = Decoder(weights)
    if before is not None:
        fn(model, before, 3, use_cache=use_cache)
        model.step_logits, model.key_positions = [], 0
    tokens = fn(model, prompt, max_new_tokens, use_cache=use_cache)
    steps = model.step_logits
    if len({step.shape for step in steps}) <= 1:  # the same batch at every call: [batch, calls, vocab]
        steps = torch.stack(steps, dim=1) if steps else weights.new_empty(prompt.size(0), 0, VOCAB)
    return tokens, steps, model.key_positions


GENERATE = Driver(_generate)


class _Cache(dict):
    """A cache of the checks (what a right KVCache does): ``{layer: (keys, values)}``."""

    @property
    def length(self) -> int:
        return self[0][0].size(2) if self else 0

    def append(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        old = self.get(layer, (key[:, :, :0], value[:, :, :0]))
        self[layer] = (torch.cat([old[0], key], 2), torch.cat([old[1], value], 2))
        return self[layer]


# the mistakes of generate, without a cache and with one (keys of TEXT)
MISTAKES = {
    False: ("no mask", "last token only"),
    True: ("positions not advanced", "top-left", "no mask", "whole sequence", "prompt skipped"),
}


def decode(
    arguments: dict[str, Any], use_cache: bool, mistake: str = ""
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding as a right ``generate`` does it, or with ``mistake`` (of :data:`MISTAKES`), in float64:
    the tokens and the last logits of each step ``[batch, steps, vocab]`` (check code)."""
    model, prompt = Decoder(arguments["weights"].double()), arguments["prompt"]
    cache = _Cache() if use_cache else None
    tokens = new = prompt
    with torch.no_grad():
        for step in range(arguments["max_new_tokens"]):
            if cache is None:
                new = tokens[:, -1:] if mistake == "last token only" else tokens
            elif mistake == "whole sequence" or (mistake == "prompt skipped" and step == 0):
                new = tokens[:, -1:] if mistake == "prompt skipped" else tokens
            past = cache.length if cache is not None else 0
            q_len, k_len = new.size(1), past + new.size(1)
            start = 0 if mistake in ("positions not advanced", "whole sequence") else past
            positions = torch.arange(start, start + q_len, device=prompt.device)
            mask = torch.ones(q_len, k_len, dtype=torch.bool, device=prompt.device)
            mask = None if mistake == "no mask" else mask.tril(0 if mistake == "top-left" else past)
            new = model(new, positions, mask, cache)[:, -1].argmax(dim=-1, keepdim=True)
            tokens = torch.cat([tokens, new], dim=1)
    steps = model.step_logits
    return tokens, torch.stack(steps, dim=1) if steps else torch.empty(prompt.size(0), 0, VOCAB).double()


def _logits(arguments: dict[str, Any], tokens: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """The logits of the positions that predict the new tokens, ``[batch, n, vocab]``, one forward pass."""
    length, start = tokens.size(1) - 1, arguments["prompt"].size(1) - 1
    if length == start:  # no new token
        return torch.empty(tokens.size(0), 0, VOCAB, dtype=torch.float64, device=tokens.device)
    causal = torch.ones(length, length, dtype=torch.bool, device=tokens.device).tril()
    positions = torch.arange(length, device=tokens.device)
    with torch.no_grad():
        logits = Decoder(arguments["weights"].to(dtype))(tokens[:, :-1], positions, causal)
    return logits[:, start:].double()  # position t predicts token t + 1


# the answers of the generate cells' cases, computed once per process: the three cells share their cases, and
# every submission's judge needs them (a plan's arguments are a function of the key)
ANSWERS: dict[tuple, tuple[torch.Tensor, torch.Tensor, float]] = {}


def _answer(part: Part, arguments: dict[str, Any], key: tuple) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The right tokens (the checks' greedy decoding; the reference's in a hidden part), each step's last
    logits from one forward pass of the decoder over the whole sequence, without a cache (float64), and the
    error of that pass in the weights' dtype (the tolerance); cached in :data:`ANSWERS` under ``key``."""
    if key not in ANSWERS:
        prompt, n = arguments["prompt"], arguments["max_new_tokens"]
        model = Decoder(arguments["weights"].double())
        tokens = part.reference(model, prompt, n) if part.hidden else decode(arguments, True)[0]
        steps = _logits(arguments, tokens)
        if not torch.equal(steps.argmax(-1), tokens[:, prompt.size(1) :]):  # greedy, step after step
            raise RuntimeError("the checks' greedy decoding disagrees with the decoder's logits")
        naive = (_logits(arguments, tokens, arguments["weights"].dtype) - steps).abs()
        ANSWERS[key] = tokens, steps, naive.max().item() if naive.numel() else 0.0
    return ANSWERS[key]


def _judge_generate(
    call: str, arguments: dict[str, Any], result: Any, *, part: Part, cost: bool, key: tuple
) -> None:
    """The tokens and, unless ``cost``, each step's logits against :func:`_answer`; with ``cost``, the
    positions that went through the first key projection too."""
    (tokens, steps, key_positions), prompt, n = result, arguments["prompt"], arguments["max_new_tokens"]
    right_tokens, right_steps, naive = _answer(part, arguments, key)
    batch, length = right_tokens.shape
    engine.assert_shape(
        tokens, f"the result of {call}", right_tokens.shape, {(batch, length + 1): TEXT["one more"]}
    )
    if not isinstance(steps, torch.Tensor):
        fail(f"{call} called the model with batches of different sizes: run the whole batch at every step.")
    if steps.size(1) < n:
        fail(
            f"{call} called the model {steps.size(1)} times for {n} new tokens: once per new token expected."
        )

    def mistakes() -> Iterator[Mistake]:
        for mistake in MISTAKES[arguments["use_cache"]]:
            try:
                yield Mistake(TEXT[mistake], decode(arguments, arguments["use_cache"], mistake)[1])
            except (ValueError, IndexError, RuntimeError):  # the mistake cannot run on these inputs
                continue

    dtype, where = arguments["weights"].dtype, f"the last position's logits at each step of {call}"
    stale = TEXT["stale"] if "before" in arguments else ""  # the same model completed another prompt first
    if not cost:  # the tolerance of dtype, or four times the error of the checks' own decoding in it
        try:
            assert_values(steps[:, :n], right_steps, where, dtype=dtype, naive_error=naive, mistakes=mistakes)
        except CheckFailure as failure:
            failure.cause = failure.cause or stale
            raise
    if not torch.equal(tokens.cpu(), right_tokens.cpu()):
        first = int((tokens.cpu() != right_tokens.cpu()).any(0).nonzero()[0]) - prompt.size(1)
        prefix = "generate must give the right tokens before its use of the cache counts: " if cost else ""
        fail(f"{prefix}the tokens of {call} differ from greedy decoding from new token {first} on.", stale)
    if cost and key_positions > prompt.size(1) + n:
        fail(
            f"with use_cache=True, {key_positions} positions went through the first layer's key projection "
            f"to generate {n} tokens from a prompt of {prompt.size(1)}: {prompt.size(1) + n} at most.",
            TEXT["recomputed"],
        )


def _generate_arguments(
    part: Part, seed: int, batch: int, prompt_len: int, new: int, dtype: torch.dtype, use_cache: bool
) -> dict[str, Any]:
    """The decoder's weights (flat, of ``dtype``), a prompt ``[batch, prompt_len]``, and the options."""
    scales = {name: 1.0 if name in ("embedding", "position") else 1.5 / math.sqrt(D_MODEL) for name in SHAPES}
    weights = [
        randn(shape, seed=seed + i, device=part.device, dtype=dtype).flatten() * scales[name]
        for i, (name, shape) in enumerate(SHAPES.items())
    ]
    prompt = torch.randint(0, VOCAB, (batch, prompt_len), generator=engine.seeded_generator(seed + 99))
    return {
        "weights": torch.cat(weights),
        "prompt": prompt.to(part.device),
        "max_new_tokens": new,
        "use_cache": use_cache,
    }


def _generate_checks(part: Part, use_cache: bool, cost: bool = False) -> Iterator[Check]:
    """The cases of the three generate cells; the second, after the same model completed another prompt."""
    # (batch, prompt_len, new tokens, dtype); no new token at all (the prompt alone) too
    cases = ((3, 4, 20, torch.float64), (2, 3, 8, torch.float32), (2, 3, 0, torch.float64))
    if part.hidden:
        cases = (
            (1, 1, 12, torch.float64),
            (2, 7, 5, torch.float32),
            (4, 2, 1, torch.float64),
            (2, 5, 0, torch.float64),
        )
    for index, (batch, prompt_len, new, dtype) in enumerate(cases):
        seed = (600 if not part.hidden else 640) + 10 * index
        arguments = _generate_arguments(part, seed, batch, prompt_len, new, dtype, use_cache)
        label = ""
        if index == 1:  # the model completes another prompt first: nothing of it may stay in a cache
            generator = engine.seeded_generator(seed + 98)
            arguments["before"] = torch.randint(0, VOCAB, (batch, 5), generator=generator).to(part.device)
            label = " (after the same model completed another prompt)"
        # the reference itself, not its id(): an id is used again once its object is gone
        key = (part.hidden, part.reference, seed, batch, prompt_len, new, str(dtype), str(part.device))
        yield _check(part, _judge_generate, arguments, label, part=part, cost=cost, key=key)


@behaviour(function="generate", points=2, hints=MODEL_HINTS, driver=GENERATE)
def generate_without_cache(part: Part) -> Iterator[Check]:
    """With use_cache=False, generate is greedy decoding that runs the model on the whole sequence so far at
    each step (positions 0 .. len - 1, a causal mask): its tokens and each step's logits are those of the
    whole sequence."""
    yield from _generate_checks(part, use_cache=False)
    # the documented error, with and without a cache
    for new, use_cache in ((-1, False), (-3, True)) if part.hidden else ((-1, False), (-2, True)):
        call = part.call(**_generate_arguments(part, 690, 2, 3, new, torch.float64, use_cache))
        yield engine.raises(call, "ValueError", "if max_new_tokens < 0", TEXT["negative"])


@behaviour(function="generate", points=3, hints=MODEL_HINTS, driver=GENERATE)
def generate_with_cache(part: Part) -> Iterator[Check]:
    """With use_cache=True, generate gives the same tokens and, at every step, the same logits (float64 to
    1e-10, float32 to 1e-5 or the error of float32 itself): the new token's position is the number of
    positions cached, and its causal mask is aligned bottom-right."""
    yield from _generate_checks(part, use_cache=True)


@behaviour(function="generate", points=1, hints=MODEL_HINTS, driver=GENERATE)
def generate_uses_cache(part: Part) -> Iterator[Check]:
    """With use_cache=True each position goes through the key projections once: the prompt in the first call,
    then one new token per call (not the whole sequence at every step)."""
    yield from _generate_checks(part, use_cache=True, cost=True)


# --- 3. PagedKVCache: scripts of operations, and the state after each

SLOTS = "Position p of a sequence is in slot p % block_size of block block_tables[seq_id][p // block_size]."
# the operations of a script; a capital letter is one that must raise (as must "x", an append that cannot fit)
KINDS = {"a": "append", "x": "overflow", "f": "fork", "g": "gather", "r": "free"}
KINDS |= {kind.upper(): f"{KINDS[kind]} error" for kind in "fgr"}


def operations(steps: str) -> Iterator[tuple[str, int, int, int]]:
    """``(kind, seq_id, n, start)`` of each step of ``"a0:5 f0:2 g2 x0:4 r0 G0"``: append 5 positions (from
    ``start`` in the keys and values) to sequence 0, fork it into 2, gather 2, an append of 4 that cannot fit,
    free 0, a gather of 0 that must raise (``n`` is the child of a fork)."""
    start = 0
    for step in steps.split():
        seq, _, n = step[1:].partition(":")
        yield KINDS[step[0]], int(seq), int(n or 0), start
        start += int(n or 0) if step[0] in "ax" else 0


def _paged(
    cls: Any, *, block_size: int, n_blocks: int, steps: str, keys, values, n_kv_heads=None, d_head=None
) -> Any:
    """Run ``steps`` (the kernel): the pool's ``(dtype, shape, device)`` as text (None: no tensor), then after
    each operation what it returned and the cache's state (``n_kv_heads`` and ``d_head``: those of the keys,
    unless given)."""
    heads = keys.size(0) if n_kv_heads is None else n_kv_heads
    width = keys.size(2) if d_head is None else d_head
    cache = cls(block_size, n_blocks, heads, width, dtype=keys.dtype, device=keys.device)
    pool = [getattr(cache, name, None) for name in ("key_blocks", "value_blocks")]
    pool = [
        (str(t.dtype), list(t.shape), str(t.device)) if isinstance(t, torch.Tensor) else None for t in pool
    ]
    results = []
    for kind, seq, n, start in operations(steps):
        out, new = None, (keys[:, start : start + n], values[:, start : start + n])
        must_raise = kind == "overflow" or kind.endswith("error")
        try:
            if kind in ("append", "overflow"):
                cache.append(seq, *new)
            elif kind.startswith("gather"):
                out = tuple(t.clone() for t in cache.gather(seq))
            elif kind.startswith("fork"):
                cache.fork(seq, n)
            else:
                cache.free(seq)
            out = "no exception" if must_raise else out
        except NotImplementedError:
            raise
        except Exception as error:  # the learner's code may raise anything: the judge says which operation
            out = f"{type(error).__name__}: {error}"
            if not must_raise:
                results.append((out, None, None, None, None))
                break
        held = sorted((int(s), [int(b) for b in t]) for s, t in cache.block_tables.items() if len(t))
        lengths = sorted((int(s), int(n)) for s, n in cache.lengths.items() if int(n))
        free, refs = sorted(int(b) for b in cache.free_blocks), [int(c) for c in cache.ref_counts]
        results.append((out, held, free, refs, lengths))
    return pool, results


PAGED = Driver(_paged)


def _specification(steps: str, block_size: int) -> Iterator[tuple[dict, dict]]:
    """After each operation, what each sequence holds by its specification: its blocks as labels ``(number,
    how it came)``, one label for one block, and the positions of the keys and values appended (check
    code)."""
    tables: dict[int, list[tuple[int, str]]] = {}
    positions: dict[int, list[int]] = {}
    labels = itertools.count()
    for kind, seq, n, start in operations(steps):
        if kind == "append":
            table, length = tables.setdefault(seq, []), len(positions.get(seq, []))
            others = [label for s, t in tables.items() if s != seq for label in t]
            if n and length % block_size and table[-1] in others:  # copy on write
                table[-1] = (next(labels), "copy")
            while len(table) * block_size < length + n:
                table.append((next(labels), "new"))
            positions[seq] = [*positions.get(seq, []), *range(start, start + n)]
        elif kind == "fork":
            tables[n], positions[n] = list(tables[seq]), list(positions[seq])
        elif kind == "free":
            del tables[seq], positions[seq]
        yield {s: list(t) for s, t in tables.items()}, positions


def _judge_state(
    where: str, tables: list, free: list, refs: list, expected: dict, n_blocks: int, owners: dict
) -> None:
    """The block tables, free blocks and reference counts after an operation, against the expected labels;
    ``owners`` maps each label to its block across the script (a block keeps its id until it is freed)."""
    held = dict(tables)
    if sorted(held) != sorted(expected):
        fail(f"after {where} the cache holds sequences {sorted(held)}, expected {sorted(expected)}.")
    for seq, table in held.items():
        if len(table) != len(expected[seq]):
            fail(
                f"after {where} sequence {seq} holds {len(table)} blocks, expected {len(expected[seq])}: "
                "ceil(len / block_size) for its len positions.",
                TEXT["block count"],
            )
    if len(refs) != n_blocks or any(not 0 <= b < n_blocks for t in held.values() for b in t):
        fail(f"after {where} the block ids or ref_counts do not fit a pool of {n_blocks} blocks.")
    labels, blocks = {}, {}  # one label for each block, one block for each label
    # (seq_id, index in its table, (block, label)) of every block the tables hold
    pairs = [(s, *row) for s, t in held.items() for row in enumerate(zip(t, expected[s], strict=True))]
    for seq, index, (block, label) in pairs:
        if (other := labels.setdefault(block, label)) != label:
            fail(
                f"after {where} block {block} (block {index} of sequence {seq}) is shared where it must "
                "not be.",
                TEXT["copy missing" if "copy" in (label[1], other[1]) else "one block"],
            )
        if blocks.setdefault(label, block) != block:
            fail(
                f"after {where} block {index} of sequence {seq} is block {block}, not the block "
                f"{blocks[label]} that it shares with another sequence.",
                TEXT["fork shares"],
            )
    counts = [sum(t.count(b) for t in held.values()) for b in range(n_blocks)]
    unheld = [b for b in range(n_blocks) if counts[b] == 0]
    if free != unheld:
        still = sorted(set(free) - set(unheld))
        cause = (
            f"block {still[0]} was freed while a sequence still holds it: a block returns to free_blocks "
            "only when its reference count drops to 0"
            if still
            else TEXT["leak"]
        )
        fail(f"after {where} free_blocks is {free}, expected the blocks no sequence holds, {unheld}.", cause)
    if refs != counts:
        b = next(b for b in range(n_blocks) if refs[b] != counts[b])
        fail(
            f"after {where} ref_counts[{b}] is {refs[b]}, but {counts[b]} block tables hold block {b}.",
            TEXT["ref counts"],
        )
    for seq, index, (block, label) in pairs:
        if owners.setdefault(label, block) != block:
            fail(
                f"after {where} block {index} of sequence {seq} is block {block}; it was block "
                f"{owners[label]}, which no other sequence held when it was written.",
                TEXT["in place"],
            )


def _judge_pool(call: str, arguments: dict[str, Any], pool: list) -> None:
    """The pool: ``[n_blocks, n_kv_heads, block_size, d_head]`` each, of the keys' dtype, on their device."""
    keys = arguments["keys"]
    shape = [arguments["n_blocks"], keys.size(0), arguments["block_size"], keys.size(2)]
    for name, found in zip(("key_blocks", "value_blocks"), pool, strict=True):
        if found is None:
            fail(f"{call}: the cache has no tensor {name}, the pool.", TEXT["pool"])
        dtype, got, device = found
        if got != shape:
            fail(f"{name} in {call} has shape {got}, expected {shape}.", TEXT["pool"])
        if dtype != str(keys.dtype) or device != str(keys.device):
            fail(
                f"{name} in {call} is {dtype} on {device}, but the cache was made with dtype={keys.dtype}, "
                f"device={keys.device}.",
                TEXT["pool"],
            )


def _judge_paged(call: str, arguments: dict[str, Any], result: Any, formats: bool = False) -> None:
    """The pool (with ``formats``), then what each operation returned or raised and the state it left,
    against :func:`_specification`."""
    steps, (pool, result), previous, owners = arguments["steps"], result, None, {}
    if formats:
        _judge_pool(call, arguments, pool)
    # the kernel stops at an operation that raises where it must not: zip stops there too
    script = zip(operations(steps), result, _specification(steps, arguments["block_size"]), strict=False)
    for number, ((kind, seq, n, _), (out, *now), (expected, positions)) in enumerate(script):
        where = f"operation {number + 1} ({steps.split()[number]}: {kind} {seq}) of {call}"
        if now[0] is None:
            fits = kind == "append" and out.startswith("RuntimeError")  # the specification says it fits
            cause = TEXT["fits"] if fits else engine.hint_for(out, HINTS)
            fail(f"{where} raised {out}", cause, got=out, raised=True)
        if kind == "overflow":
            if not out.startswith("RuntimeError"):
                fail(
                    f"{where} needs more blocks than are free: it should raise RuntimeError, but gave {out}.",
                    TEXT["overflow"],
                )
            if now != previous:
                fail(f"after {where} the cache changed although the append failed.", TEXT["unchanged"])
            continue
        if kind.endswith("error"):  # KeyError, or ValueError for a fork into a sequence that exists
            error, cause = "KeyError", TEXT["no sequence"]
            condition = f"since there is no {'parent ' if kind == 'fork error' else ''}sequence {seq}"
            if kind == "fork error" and n in positions:
                error, condition, cause = "ValueError", f"since sequence {n} exists", TEXT["fork exists"]
            if not out.startswith(f"{error}:"):
                fail(
                    f"{where} should raise {error} {condition}, as its docstring says, but gave {out}.", cause
                )
            previous = now
            continue
        _judge_state(where, *now[:3], expected, arguments["n_blocks"], owners)
        lengths = sorted((s, len(p)) for s, p in positions.items() if p)
        if now[3] != lengths:
            freed = sorted({s for s, _ in now[3]} - set(positions))
            fail(
                f"after {where} lengths is {dict(now[3])}, expected {dict(lengths)}.",
                TEXT["freed kept" if freed else "lengths"],
            )
        for k, name in enumerate(("keys", "values") if kind == "gather" else ()):
            right, where_k = arguments[name][:, positions[seq]], f"the {name} gathered by {where}"
            if formats:
                engine.assert_format(out[k], where_k, right.shape, right.dtype, right.device)
            assert_values(out[k], right, f"{where_k}, [n_kv_heads, len, d_head]", note=SLOTS)
        previous = now


def _paged_checks(part: Part, cases: list[tuple], seed: int, formats: bool = False) -> Iterator[Check]:
    """A check per case ``(block_size, n_blocks, steps)`` or ``(..., dtype)``: the keys and values float64
    unless said."""
    for index, (block_size, n_blocks, steps, *dtype) in enumerate(cases):
        total = sum(n for kind, _, n, _ in operations(steps) if kind in ("append", "overflow"))
        arguments: dict[str, Any] = {"block_size": block_size, "n_blocks": n_blocks, "steps": steps}
        for i, name in enumerate(("keys", "values")):
            at = seed + 10 * index + i
            arguments[name] = randn(
                (2, total, 3), seed=at, device=part.device, dtype=(*dtype, torch.float64)[0]
            )
        yield _check(part, _judge_paged, arguments, formats=formats)


@behaviour(function="PagedKVCache", points=2, hints=HINTS, driver=PAGED)
def paged_gather(part: Part) -> Iterator[Check]:
    """After interleaved appends to several sequences, gather(seq_id) returns each one's keys and values in
    order, as a contiguous cache would; each sequence holds ceil(len / block_size) blocks, and a block belongs
    to one sequence."""
    # the pool's format and the gathered tensors' are checked here: float64 (visible), float32 and bfloat16
    cases = [(4, 12, "a0:5 a1:3 a0:1 a2:4 a1:2 a0:2 g0 a2:1 a1:3 g1 g2 g0 G7")]
    if part.hidden:
        cases = [
            (1, 9, "a0:2 a1:1 a0:1 a1:3 g0 g1 a2:2 g2 G5", torch.float32),
            (3, 10, "a3:7 a1:1 a3:2 a1:5 g3 g1 a0:3 g0 g1 G2", torch.bfloat16),
        ]
    yield from _paged_checks(part, cases, seed=700, formats=True)
    # a size below 1 raises ValueError: each of block_size, n_blocks, n_kv_heads, d_head
    sizes = ((0, 4, 2, 3), (2, 0, 2, 3), (2, 4, 0, 3), (2, 4, 2, 0))
    if part.hidden:
        sizes = ((-1, 4, 2, 3), (3, -2, 1, 1), (1, 1, -1, 2), (4, 2, 3, -3))
    empty = randn((2, 0, 3), seed=0, device=part.device)
    for block_size, n_blocks, n_kv_heads, d_head in sizes:
        script = {"block_size": block_size, "n_blocks": n_blocks, "steps": "", "keys": empty, "values": empty}
        call = part.call(**script, n_kv_heads=n_kv_heads, d_head=d_head)
        yield engine.raises(call, "ValueError", "if a size is below 1", TEXT["sizes"])


@behaviour(function="PagedKVCache", points=2, hints=HINTS, driver=PAGED)
def paged_fork(part: Part) -> Iterator[Check]:
    """fork(parent, child) shares the parent's blocks (reference counts, no copy); a later write into a
    shared, partly filled block copies it first (copy on write), so the other sequence does not change."""
    # then a fork into an existing sequence (ValueError) and from a sequence that does not exist (KeyError)
    cases = [(4, 10, "a0:6 f0:1 g1 a1:1 g0 g1 a0:1 g0 a2:8 f2:3 a3:2 g2 g3 F0:2 F9:4")]
    if part.hidden:
        cases = [
            (3, 12, "a0:4 f0:1 f0:2 a0:1 a2:3 g0 g1 g2 F1:0 F3:4"),
            (2, 8, "a5:3 f5:6 a6:1 a5:2 f6:7 a7:1 g5 g6 g7 F4:8 F7:6"),
        ]
    yield from _paged_checks(part, cases, seed=760)


@behaviour(function="PagedKVCache", points=1, hints=HINTS, driver=PAGED)
def paged_free(part: Part) -> Iterator[Check]:
    """free(seq_id) returns every block that no other sequence holds (no leak, no freed block still
    referenced), and an append that needs more blocks than are free raises RuntimeError and changes
    nothing."""
    # the second script fills the pool: appends that do not fit because of the copy that copy on write needs
    # (alone, or besides new blocks), appends that fit exactly (with a copy; into a full shared block), an
    # append in place into a block that was shared, a gather and a free of a freed sequence (KeyError), and
    # freed ids used again
    cases = [
        (2, 8, "a0:5 f0:1 a1:2 r0 g1 r1 a2:9 a3:4 x3:3 g3 g2 r2 r3"),
        (2, 4, "a0:3 f0:1 a2:3 x1:1 r2 x1:5 a1:3 g1 g0 r1 a0:1 g0 f0:1 a1:4 g1 r0 G0 R0 r1 a0:2 g0"),
    ]
    if part.hidden:
        cases = [
            (3, 6, "a0:7 f0:1 f1:2 r1 g2 r0 a1:8 x1:3 x4:1 g1 r2 r1"),
            (1, 4, "a0:2 a1:2 x0:1 r1 a0:1 g0 r0"),
            (3, 5, "a0:4 f0:1 f0:2 a3:7 x2:1 r3 x1:9 a1:8 g1 g0 g2 r1 a2:2 a0:2 g0 g2 R1 G1 r2 r0 a1:3 g1"),
        ]
    yield from _paged_checks(part, cases, seed=820)
