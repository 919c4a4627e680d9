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
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from attention_course.checks import engine
from attention_course.checks.engine import Check, Driver, Mistake, Part, assert_values, behaviour, fail, randn

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

# --- 1. KVCache: appends, length and reset


def _kv_appends(cls: Any, *, n_layers: int, layers: list, lengths: list, keys, values) -> Any:
    """Append the pieces of ``keys`` and ``values`` to ``layers`` (the kernel); return what each append
    returned, then what each layer holds."""
    cache, returned = cls(n_layers), []
    for layer, key, value in zip(layers, keys.split(lengths, 2), values.split(lengths, 2), strict=True):
        result = cache.append(layer, key, value)
        tensors = isinstance(result, tuple | list)
        returned.append(
            tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in result) if tensors else result
        )
    return returned, [(cache.keys(layer), cache.values(layer)) for layer in range(n_layers)]


def _kv_length(cls: Any, *, n_layers: int, lengths: list, keys, values) -> Any:
    """Forward passes (a piece appended to every layer), ``reset()`` before the last one (the kernel); return
    ``length`` at the start and after each step, and what layer 0 holds at the end."""
    cache = cls(n_layers)
    seen = [cache.length]
    for index, (key, value) in enumerate(zip(keys.split(lengths, 2), values.split(lengths, 2), strict=True)):
        if index == len(lengths) - 1:
            cache.reset()
            seen.append(cache.length)
        for layer in range(n_layers):
            cache.append(layer, key, value)
        seen.append(cache.length)
    return seen, cache.keys(0), cache.values(0)


APPENDS, LENGTH = Driver(_kv_appends), Driver(_kv_length)


def _kv_arguments(lengths: tuple[int, ...], seed: int, part: Part, dtype=torch.float64) -> dict[str, Any]:
    """Keys and values ``[batch 2, n_kv_heads 3, len, d_head 5]`` to split into pieces of ``lengths``."""
    shape = (2, 3, sum(lengths), 5)
    return {
        "lengths": list(lengths),
        "keys": randn(shape, seed=seed, device=part.device, dtype=dtype),
        "values": randn(shape, seed=seed + 1, device=part.device, dtype=dtype),
    }


@behaviour(function="KVCache", points=2, hints=HINTS, driver=APPENDS)
def kv_cache_append(part: Part) -> Iterator[Check]:
    """KVCache(n_layers).append(layer, key, value) adds new positions on the length axis of [batch,
    n_kv_heads, len, d_head] and returns all the keys and values the layer holds; keys(layer) and
    values(layer) give them too, each layer its own."""
    cases = [((0, 1, 0, 1, 0, 1), (3, 3, 1, 1, 2, 2), torch.float64)]
    if part.hidden:
        cases = [
            ((0, 0, 0), (1, 1, 1), torch.float32),
            ((2, 0, 1, 2, 0, 1, 2), (4, 4, 4, 1, 1, 1, 3), torch.float64),
        ]
    for index, (layers, lengths, dtype) in enumerate(cases):
        arguments = {
            "n_layers": max(layers) + 1,
            "layers": list(layers),
            **_kv_arguments(lengths, 500 + 10 * index, part, dtype),
        }
        call = part.call(**arguments)
        yield Check(call, lambda result, call=call, a=arguments: _judge_appends(str(call), a, result))


def _judge_appends(call: str, arguments: dict[str, Any], result: Any) -> None:
    layers, pieces = (
        arguments["layers"],
        {n: arguments[n].split(arguments["lengths"], 2) for n in ("keys", "values")},
    )
    returned, held = result
    for i, got in enumerate([*returned, *held]):
        layer = layers[i] if i < len(layers) else i - len(layers)
        mine = [j for j in range(min(i + 1, len(layers))) if layers[j] == layer]  # the pieces the layer holds
        appended = f"append number {i + 1} (to layer {layer})"
        if not isinstance(got, tuple | list) or len(got) != 2:
            fail(f"{appended} in {call} returned {engine.describe(got)}, expected (keys, values).")
        for k, name in enumerate(("keys", "values")):
            where = f"the {name} returned by {appended}" if i < len(layers) else f"{name}({layer})"
            own, other = pieces[name], pieces["values" if name == "keys" else "keys"]
            wrong = [
                (TEXT["new only"], own[mine[-1]]),
                (TEXT["old only"], torch.cat([own[j] for j in mine[:-1]] or [own[0][:, :, :0]], dim=2)),
                (TEXT["shared layers"], torch.cat(own[: mine[-1] + 1], dim=2)),
                (TEXT["swapped"], torch.cat([other[j] for j in mine], dim=2)),
            ]
            expected = torch.cat([own[j] for j in mine], dim=2)
            _compare(got[k], expected, f"{where} in {call}", wrong)


def _compare(got: Any, expected: torch.Tensor, where: str, wrong: list[tuple[str, torch.Tensor]]) -> None:
    """``assert_values`` with known mistakes ``(hint, result)``, told by their values or by their shapes."""
    shapes: dict[tuple[int, ...], str] = {}
    for hint, result in wrong:
        if result.shape != expected.shape:
            shapes.setdefault(tuple(result.shape), hint)
    mistakes = lambda: (Mistake(hint, result) for hint, result in wrong)  # noqa: E731
    assert_values(got, expected, where, hints=shapes, mistakes=mistakes)


@behaviour(function="KVCache", points=1, hints=HINTS, driver=LENGTH)
def kv_cache_length_reset(part: Part) -> Iterator[Check]:
    """length is the number of positions cached (0 when empty), and reset() empties every layer: what is
    appended after it is all the cache holds."""
    cases = ((2, (3, 1, 2, 4)),) if not part.hidden else ((1, (1, 1, 5)), (3, (6, 2, 1)))
    for index, (n_layers, lengths) in enumerate(cases):
        arguments = {"n_layers": n_layers, **_kv_arguments(lengths, 540 + 10 * index, part)}
        call = part.call(**arguments)
        yield Check(call, lambda result, call=call, a=arguments: _judge_length(str(call), a, result))


def _judge_length(call: str, arguments: dict[str, Any], result: Any) -> None:
    lengths = arguments["lengths"]
    expected = [0, *itertools.accumulate(lengths[:-1]), 0, lengths[-1]]
    seen, keys, values = result
    if seen != expected:
        cause = TEXT["not reset"] if seen[:-2] == expected[:-2] else ""
        if not all(isinstance(length, int) for length in seen):
            cause = "length must be an int: keep it a property (@property), as the task has it"
        shown = [length if isinstance(length, int) else engine.describe(length) for length in seen]
        fail(
            f"cache.length in {call} was {shown} (at the start, after each forward pass, after reset(), "
            f"after one more pass), expected {expected}.",
            cause,
        )
    where = f"layer 0 after reset() and one more forward pass in {call}"
    for name, other, got in (("keys", "values", keys), ("values", "keys", values)):
        everything, last = arguments[name], slice(-lengths[-1], None)
        wrong = [(TEXT["not reset"], everything), (TEXT["swapped"], arguments[other][:, :, last])]
        _compare(got, everything[:, :, last], f"the {name} of {where}", wrong)


# --- 2. generate, on a decoder of the checks

VOCAB, D_MODEL, N_HEADS, N_KV_HEADS, N_LAYERS, MAX_LEN = 13, 12, 4, 2, 2, 48
D_HEAD = D_MODEL // N_HEADS


def _shapes() -> dict[str, tuple[int, int]]:
    """The decoder's weights, in the order of the flat vector that holds them."""
    shapes = {"embedding": (VOCAB, D_MODEL), "position": (MAX_LEN, D_MODEL), "output": (D_MODEL, VOCAB)}
    for layer in range(N_LAYERS):
        heads = {"q": N_HEADS, "k": N_KV_HEADS, "v": N_KV_HEADS, "o": N_HEADS, "f": N_HEADS}
        shapes |= {f"{kind}{layer}": (n * D_HEAD, D_MODEL) for kind, n in heads.items()}
    return shapes


SHAPES = _shapes()


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
    good = (
        isinstance(result, tuple | list)
        and len(result) == 2
        and all(isinstance(t, torch.Tensor) for t in result)
    )
    shapes = [list(t.shape) for t in result] if good else result
    if not good or any(s[:2] + s[3:] != [new[0], new[1], new[3]] or s[2] < new[2] for s in shapes):
        raise ValueError(
            f"cache.append returned {shapes}, expected keys and values [batch, n_kv_heads, len, d_head] = "
            f"[{new[0]}, {new[1]}, len, {new[3]}] with len >= {new[2]}"
        )
    return result[0], result[1]


def _generate(fn: Any, *, weights, prompt, max_new_tokens, use_cache) -> Any:
    """The learner's ``generate`` on the checks' decoder (the kernel): the tokens, the last logits of each
    call ``[batch, calls, vocab]``, and the positions that went through layer 0's key projection."""
    model = Decoder(weights)
    tokens = fn(model, prompt, max_new_tokens, use_cache=use_cache)
    steps = model.step_logits
    if len({step.shape for step in steps}) <= 1:  # the same batch at every call: [batch, calls, vocab]
        steps = torch.stack(steps, dim=1) if steps else weights.new_empty(prompt.size(0), 0, VOCAB)
    return tokens, steps, model.key_positions


GENERATE = Driver(_generate)


class _Cache:
    """A cache of the checks (what a right KVCache does)."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def length(self) -> int:
        return self.held[0][0].size(2) if self.held else 0

    def append(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        old = self.held.get(layer)
        self.held[layer] = (
            (key, value) if old is None else (torch.cat([old[0], key], 2), torch.cat([old[1], value], 2))
        )
        return self.held[layer]


def decode(
    arguments: dict[str, Any], use_cache: bool, mistake: str = "", dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding as a right ``generate`` does it, or with ``mistake`` (a key of TEXT), in ``dtype``:
    the tokens and the last logits of each step ``[batch, steps, vocab]`` (check code)."""
    model, prompt, cache = (
        Decoder(arguments["weights"].to(dtype)),
        arguments["prompt"],
        _Cache() if use_cache else None,
    )
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
    steps = (
        torch.stack(model.step_logits, dim=1) if model.step_logits else torch.empty(prompt.size(0), 0, VOCAB)
    )
    return tokens, steps.to(dtype)


MISTAKES = {
    False: ("no mask", "last token only"),
    True: ("positions not advanced", "top-left", "no mask", "whole sequence", "prompt skipped"),
}


def _expected(part: Part, arguments: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The right tokens (the checks' greedy decoding; the reference's in a hidden part), and each step's last
    logits from one forward pass of the decoder over the whole sequence, without a cache (float64)."""
    model, prompt, n = (
        Decoder(arguments["weights"].double()),
        arguments["prompt"],
        arguments["max_new_tokens"],
    )
    tokens = part.reference(model, prompt, n) if part.hidden else decode(arguments, True)[0]
    steps = _logits(arguments, tokens)
    if not torch.equal(steps.argmax(-1), tokens[:, prompt.size(1) :]):  # greedy, step after step
        raise RuntimeError("the checks' greedy decoding disagrees with the decoder's logits")
    return tokens, steps


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


def _judge_generate(part: Part, call: Any, arguments: dict[str, Any], result: Any, cost: bool) -> None:
    tokens, steps, key_positions = result
    prompt, n, use_cache = arguments["prompt"], arguments["max_new_tokens"], arguments["use_cache"]
    right_tokens, right_steps = _expected(part, arguments)
    engine.assert_shape(tokens, f"the result of {call}", right_tokens.shape)
    if not isinstance(steps, torch.Tensor):
        fail(f"{call} called the model with batches of different sizes: run the whole batch at every step.")
    if steps.size(1) < n:
        fail(
            f"{call} called the model {steps.size(1)} times for {n} new tokens: once per new token expected."
        )

    def mistakes() -> Iterator[Mistake]:
        for mistake in MISTAKES[use_cache]:
            try:
                yield Mistake(TEXT[mistake], decode(arguments, use_cache, mistake)[1])
            except (ValueError, IndexError, RuntimeError):  # the mistake cannot run on these inputs
                continue

    dtype, where = arguments["weights"].dtype, f"the last position's logits at each step of {call}"
    if not cost:  # the tolerance of dtype, or four times the error of the checks' own decoding in it
        naive = (_logits(arguments, right_tokens, dtype) - right_steps).abs()
        naive = naive.max().item() if naive.numel() else 0.0
        assert_values(steps[:, :n], right_steps, where, dtype=dtype, naive_error=naive, mistakes=mistakes)
    if not torch.equal(tokens.cpu(), right_tokens.cpu()):
        first = int((tokens.cpu() != right_tokens.cpu()).any(0).nonzero()[0]) - prompt.size(1)
        prefix = "generate must give the right tokens before its use of the cache counts: " if cost else ""
        fail(f"{prefix}the tokens of {call} differ from greedy decoding from new token {first} on.")
    if cost and key_positions > prompt.size(1) + n:
        fail(
            f"with use_cache=True, {key_positions} positions went through the first layer's key projection "
            f"to generate {n} tokens from a prompt of {prompt.size(1)}: {prompt.size(1) + n} at most.",
            TEXT["recomputed"],
        )


def _generate_checks(part: Part, use_cache: bool, cost: bool = False) -> Iterator[Check]:
    cases = ((3, 4, 20, torch.float64), (2, 3, 8, torch.float32))  # (batch, prompt_len, new tokens, dtype)
    if part.hidden:
        cases = (
            (1, 1, 12, torch.float64),
            (2, 7, 5, torch.float32),
            (4, 2, 1, torch.float64),
            (2, 5, 0, torch.float64),
        )
    for index, (batch, prompt_len, new, dtype) in enumerate(cases):
        seed = (600 if not part.hidden else 640) + 10 * index
        weights = [
            randn(shape, seed=seed + i, device=part.device, dtype=dtype).flatten()
            for i, shape in enumerate(SHAPES.values())
        ]
        scales = [1.0 if name in ("embedding", "position") else 1.5 / math.sqrt(D_MODEL) for name in SHAPES]
        prompt = torch.randint(0, VOCAB, (batch, prompt_len), generator=engine.seeded_generator(seed + 99))
        arguments = {
            "weights": torch.cat([w * s for w, s in zip(weights, scales, strict=True)]),
            "prompt": prompt.to(part.device),
            "max_new_tokens": new,
            "use_cache": use_cache,
        }
        call = part.call(**arguments)
        yield Check(
            call, lambda result, call=call, a=arguments: _judge_generate(part, str(call), a, result, cost)
        )


@behaviour(function="generate", points=2, hints=MODEL_HINTS, driver=GENERATE)
def generate_without_cache(part: Part) -> Iterator[Check]:
    """With use_cache=False, generate is greedy decoding that runs the model on the whole sequence so far at
    each step (positions 0 .. len - 1, a causal mask): its tokens and each step's logits are those of the
    whole sequence."""
    yield from _generate_checks(part, use_cache=False)


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
KINDS = {"a": "append", "x": "overflow", "f": "fork", "g": "gather", "r": "free"}


def operations(steps: str) -> Iterator[tuple[str, int, int, int]]:
    """``(kind, seq_id, n, start)`` of each step of ``"a0:5 f0:2 g2 x0:4 r0"``: append 5 positions (from
    ``start`` in the keys and values) to sequence 0, fork it into 2, gather 2, an append of 4 that cannot fit,
    free 0 (``n`` is the child of a fork)."""
    start = 0
    for step in steps.split():
        seq, _, n = step[1:].partition(":")
        yield KINDS[step[0]], int(seq), int(n or 0), start
        start += int(n or 0) if step[0] in "ax" else 0


def _paged(cls: Any, *, block_size: int, n_blocks: int, steps: str, keys, values) -> Any:
    """Run ``steps`` (the kernel): after each operation, what it returned and the cache's state."""
    cache = cls(block_size, n_blocks, keys.size(0), keys.size(2), dtype=keys.dtype, device=keys.device)
    results = []
    for kind, seq, n, start in operations(steps):
        out, new = None, (keys[:, start : start + n], values[:, start : start + n])
        try:
            if kind in ("append", "overflow"):
                cache.append(seq, *new)
                out = "no exception" if kind == "overflow" else None
            elif kind == "gather":
                out = tuple(t.clone() for t in cache.gather(seq))
            elif kind == "fork":
                cache.fork(seq, n)
            else:
                cache.free(seq)
        except NotImplementedError:
            raise
        except Exception as error:  # the learner's code may raise anything: the judge says which operation
            out = f"{type(error).__name__}: {error}"
            if kind != "overflow":
                results.append((out, None, None, None))
                break
        held = sorted(
            (int(s), [int(b) for b in table]) for s, table in cache.block_tables.items() if len(table)
        )
        results.append(
            (out, held, sorted(int(b) for b in cache.free_blocks), [int(c) for c in cache.ref_counts])
        )
    return results


PAGED = Driver(_paged)


def _expected_tables(steps: str, block_size: int) -> Iterator[dict[int, list[tuple[int, str]]]]:
    """After each operation, each sequence's blocks as labels ``(number, how it came)``: one label, one
    block (check code)."""
    tables: dict[int, list[tuple[int, str]]] = {}
    lengths: dict[int, int] = {}
    labels = itertools.count()
    for kind, seq, n, _ in operations(steps):
        if kind == "append":
            table, length = tables.setdefault(seq, []), lengths.get(seq, 0)
            others = [label for s, t in tables.items() if s != seq for label in t]
            if n and length % block_size and table[-1] in others:  # copy on write
                table[-1] = (next(labels), "copy")
            while len(table) * block_size < length + n:
                table.append((next(labels), "new"))
            lengths[seq] = length + n
        elif kind == "fork":
            tables[n], lengths[n] = list(tables[seq]), lengths[seq]
        elif kind == "free":
            del tables[seq], lengths[seq]
        yield {s: list(t) for s, t in tables.items()}


def _judge_state(where: str, tables: list, free: list, refs: list, expected: dict, n_blocks: int) -> None:
    held = dict(tables)
    if sorted(held) != sorted(expected):
        fail(f"after {where} the cache holds sequences {sorted(held)}, expected {sorted(expected)}.")
    for seq, table in held.items():
        if len(table) != len(expected[seq]):
            fail(
                f"after {where} sequence {seq} holds {len(table)} blocks, expected {len(expected[seq])}: "
                "ceil(len / block_size) for its len positions.",
                "take a new block only when the last one is full (position % block_size == 0)",
            )
    if len(refs) != n_blocks or any(not 0 <= b < n_blocks for t in held.values() for b in t):
        fail(f"after {where} the block ids or ref_counts do not fit a pool of {n_blocks} blocks.")
    labels, blocks = {}, {}  # one label for each block, one block for each label
    for seq, table in held.items():
        for index, (block, label) in enumerate(zip(table, expected[seq], strict=True)):
            other = labels.setdefault(block, label)
            if other != label:
                cause = (
                    "copy on write is missing: a sequence wrote into a block that another sequence still "
                    "holds (after a fork): copy a shared, partly filled block before writing into it"
                    if "copy" in (label[1], other[1])
                    else "one block was given to two sequences: take new blocks from free_blocks (and remove "
                    "them from it)"
                )
                fail(
                    f"after {where} block {block} (block {index} of sequence {seq}) is shared where it must "
                    "not be.",
                    cause,
                )
            if blocks.setdefault(label, block) != block:
                fail(
                    f"after {where} block {index} of sequence {seq} is block {block}, not the block "
                    f"{blocks[label]} that it shares with another sequence.",
                    "fork shares the parent's blocks (the child's block table is a copy of the parent's, no "
                    "block is copied); later, only the partly filled last block is copied, before a write",
                )
    counts = [sum(t.count(b) for t in held.values()) for b in range(n_blocks)]
    unheld = [b for b in range(n_blocks) if counts[b] == 0]
    if free != unheld:
        still = sorted(set(free) - set(unheld))
        cause = (
            f"block {still[0]} was freed while a sequence still holds it: a block returns to free_blocks "
            "only when its reference count drops to 0"
            if still
            else "a block that no sequence holds is not in free_blocks (a leak): free must return it"
        )
        fail(f"after {where} free_blocks is {free}, expected the blocks no sequence holds, {unheld}.", cause)
    if refs != counts:
        b = next(b for b in range(n_blocks) if refs[b] != counts[b])
        fail(
            f"after {where} ref_counts[{b}] is {refs[b]}, but {counts[b]} block tables hold block {b}.",
            "fork adds one to the count of each block it shares, free subtracts one, and copy on write "
            "moves one",
        )


def _judge_paged(call: str, arguments: dict[str, Any], result: Any) -> None:
    steps, keys, values = arguments["steps"], arguments["keys"], arguments["values"]
    appended: dict[int, list[int]] = {}  # the positions of the keys and values each sequence holds
    previous = None
    states = _expected_tables(steps, arguments["block_size"])
    for number, ((kind, seq, n, start), state, expected) in enumerate(
        zip(operations(steps), result, states, strict=False)  # the kernel stops at an operation that raises
    ):
        out, *now = state
        where = f"operation {number + 1} ({steps.split()[number]}: {kind} {seq}) of {call}"
        if now[0] is None:
            text = f"{where} raised {out}"
            fail(text, engine.hint_for(out, HINTS), got=out, raised=True)
        if kind == "overflow":
            if not out.startswith("RuntimeError"):
                fail(
                    f"{where} needs more blocks than are free: it should raise RuntimeError, but gave {out}."
                )
            if now != previous:
                fail(
                    f"after {where} the cache changed although the append failed.",
                    "check that enough blocks are free before changing anything",
                )
            continue
        if kind == "append":
            appended.setdefault(seq, []).extend(range(start, start + n))
        elif kind == "fork":
            appended[n] = list(appended[seq])
        elif kind == "free":
            del appended[seq]
        _judge_state(where, *now, expected, arguments["n_blocks"])
        for k, name in enumerate(("keys", "values") if kind == "gather" else ()):
            right = (keys, values)[k][:, appended[seq]]
            assert_values(
                out[k], right, f"the {name} gathered by {where}, [n_kv_heads, len, d_head]", note=SLOTS
            )
        previous = now


def _paged_checks(part: Part, cases: list[tuple[int, int, str]], seed: int) -> Iterator[Check]:
    for index, (block_size, n_blocks, steps) in enumerate(cases):
        total = sum(n for kind, _, n, _ in operations(steps) if kind in ("append", "overflow"))
        keys, values = (randn((2, total, 3), seed=seed + 10 * index + i, device=part.device) for i in (0, 1))
        arguments = {
            "block_size": block_size,
            "n_blocks": n_blocks,
            "steps": steps,
            "keys": keys,
            "values": values,
        }
        call = part.call(**arguments)
        yield Check(call, lambda result, call=call, a=arguments: _judge_paged(str(call), a, result))


@behaviour(function="PagedKVCache", points=2, hints=HINTS, driver=PAGED)
def paged_gather(part: Part) -> Iterator[Check]:
    """After interleaved appends to several sequences, gather(seq_id) returns each one's keys and values in
    order, as a contiguous cache would; each sequence holds ceil(len / block_size) blocks, and a block belongs
    to one sequence."""
    cases = [(4, 12, "a0:5 a1:3 a0:1 a2:4 a1:2 a0:2 g0 a2:1 a1:3 g1 g2 g0")]
    if part.hidden:
        cases = [(1, 9, "a0:2 a1:1 a0:1 a1:3 g0 g1 a2:2 g2"), (3, 10, "a3:7 a1:1 a3:2 a1:5 g3 g1 a0:3 g0 g1")]
    yield from _paged_checks(part, cases, seed=700)


@behaviour(function="PagedKVCache", points=2, hints=HINTS, driver=PAGED)
def paged_fork(part: Part) -> Iterator[Check]:
    """fork(parent, child) shares the parent's blocks (reference counts, no copy); a later write into a
    shared, partly filled block copies it first (copy on write), so the other sequence does not change."""
    cases = [(4, 10, "a0:6 f0:1 g1 a1:1 g0 g1 a0:1 g0 a2:8 f2:3 a3:2 g2 g3")]
    if part.hidden:
        cases = [
            (3, 12, "a0:4 f0:1 f0:2 a0:1 a2:3 g0 g1 g2"),
            (2, 8, "a5:3 f5:6 a6:1 a5:2 f6:7 a7:1 g5 g6 g7"),
        ]
    yield from _paged_checks(part, cases, seed=760)


@behaviour(function="PagedKVCache", points=1, hints=HINTS, driver=PAGED)
def paged_free(part: Part) -> Iterator[Check]:
    """free(seq_id) returns every block that no other sequence holds (no leak, no freed block still
    referenced), and an append that needs more blocks than are free raises RuntimeError and changes
    nothing."""
    cases = [(2, 8, "a0:5 f0:1 a1:2 r0 g1 r1 a2:9 a3:4 x3:3 g3 g2 r2 r3")]
    if part.hidden:
        cases = [
            (3, 6, "a0:7 f0:1 f1:2 r1 g2 r0 a1:8 x1:3 x4:1 g1 r2 r1"),
            (1, 4, "a0:2 a1:2 x0:1 r1 a0:1 g0 r0"),
        ]
    yield from _paged_checks(part, cases, seed=820)
