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
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attention_course.checks import attention_family as family
from attention_course.checks import engine, ex04
from attention_course.checks.engine import Check, Driver, Mistake, Part, assert_values, behaviour, fail, randn

HINTS = family.exception_hints("""
attribute 'self_attn' | attribute 'cross_attn' | attribute 'linear1' | attribute 'linear2' | attribute 'norm1'
    | attribute 'norm2' | attribute 'norm3': name the sub-modules as the task says (self_attn, cross_attn,
    linear1, linear2, norm1, norm2, norm3): the checks copy nn.TransformerDecoderLayer's weights into them
unexpected keyword argument 'use_cache' | takes from 3 to 4 positional arguments: forward takes (target,
    source, mask=None, use_cache=False)
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


@dataclass(frozen=True)
class Sizes:
    """The sizes of one call (every one different within a case); ``q_len`` is ``tgt_len``, ``k_len``
    ``src_len``, so that chapter 4's checks apply unchanged."""

    batch: int
    q_len: int
    k_len: int
    d_model: int
    n_heads: int
    d_ff: int = 24

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


VISIBLE = Sizes(2, 5, 7, 12, 3, 20)
HIDDEN = (Sizes(3, 4, 6, 20, 5, 28), Sizes(1, 6, 3, 8, 2, 12), Sizes(2, 3, 5, 16, 4, 36))


def _hints(sizes: Sizes, kind: str) -> dict[tuple[int, ...], str]:
    axes = {"batch": sizes.batch, "n_heads": sizes.n_heads, "d_model": sizes.d_model}
    axes |= {"tgt_len": sizes.q_len, "src_len": sizes.k_len}
    return engine.shapes(SHAPES, kind, **axes) | ex04._hints(ex04.Sizes(*_mha_sizes(sizes)), kind)


def _mha_sizes(sizes: Sizes) -> tuple[int, ...]:
    return sizes.batch, sizes.q_len, sizes.k_len, sizes.d_model, sizes.n_heads


# ==================================================================================================
# 1. multi-head attention, carried over from exercise 4


@behaviour(function="MultiHeadAttention", points=1, hints=ex04.HINTS, driver=ex04.FORWARD)
def mha_carried_over(part: Part) -> Iterator[Check]:
    """Your MultiHeadAttention from exercise 4 (with load_torch_weights) computes what nn.MultiheadAttention
    computes given the same weights, with and without masks."""
    return ex04.carried_over(part, seed=130)


# ==================================================================================================
# 2. cross-attention: inputs, the driver, PyTorch's answer, the mistakes


def inputs(sizes: Sizes, *, seed: int, device, dtype=torch.float64, mask=None) -> dict[str, Any]:
    """The arguments of one cross-attention call: sizes, ``nn.MultiheadAttention``'s weights, target
    ``[batch, tgt_len, d_model]``, source ``[batch, src_len, d_model]``, ``mask``."""
    target = randn((sizes.batch, sizes.q_len, sizes.d_model), seed=seed, device=device, dtype=dtype)
    source = randn((sizes.batch, sizes.k_len, sizes.d_model), seed=seed + 1, device=device, dtype=dtype)
    weights = ex04.torch_weights(
        ex04.Sizes(*_mha_sizes(sizes)), bias=True, seed=seed + 10, device=device, dtype=dtype
    )
    return {
        "d_model": sizes.d_model,
        "n_heads": sizes.n_heads,
        **weights,
        "target": target,
        "source": source,
        "mask": mask,
    }


def _cross_module(cls: Any, d_model: int, n_heads: int, torch_mha: Any, like: torch.Tensor) -> Any:
    module = cls(d_model, n_heads).to(dtype=like.dtype, device=like.device)
    module.load_torch_weights(torch_mha)
    return module


def _cross(cls: Any, *, d_model, n_heads, torch_mha, target, source, mask=None) -> Any:
    """Construct the learner's module, load the weights, and call it (the kernel)."""
    return _cross_module(cls, d_model, n_heads, torch_mha, target)(target, source, mask)


def _cached(cls: Any, *, d_model, n_heads, torch_mha, target, source, mask, source2, mask2) -> Any:
    """Decode step by step with ``use_cache=True`` (the first ``t`` target positions at step ``t``), then
    attend to a new source; count the calls of ``w_k`` (the kernel)."""
    module = _cross_module(cls, d_model, n_heads, torch_mha, target)
    calls = [0]
    hook = module.w_k.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        with torch.no_grad():
            steps = [module(target[:, : t + 1], source, mask, use_cache=True) for t in range(target.size(1))]
            key_projections = calls[0]
            new_source = module(target, source2, mask2, use_cache=True)
    finally:
        hook.remove()
    return (
        [step[0][:, -1] if isinstance(step, tuple | list) else step for step in steps],
        new_source,
        key_projections,
    )


def _prepare(**arguments: Any) -> dict[str, Any]:
    rest = {name: value for name, value in arguments.items() if name not in ex04.WEIGHT_NAMES}
    return {**rest, "torch_mha": ex04.build_torch_mha(arguments)}


CROSS, CACHED = Driver(_cross, _prepare), Driver(_cached, _prepare)


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
    return ex04.torch_answer(_as_mha(arguments))


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


def cross_check(part: Part, arguments: dict[str, Any], sizes: Sizes, answer=cross_answer, label="") -> Check:
    """One call of the learner's cross-attention against ``answer``, its mistakes named."""
    call = part.call(label, **arguments) if label else part.call(**arguments)

    def judge(result: Any) -> None:
        output, weights = family.module_pair(result, call, sizes, _hints)
        expected = answer(arguments)
        for which, actual, index in (("weights", weights, 1), ("output", output, 0)):
            wrong = lambda index=index: cross_mistakes(arguments, index)  # noqa: E731
            assert_values(
                actual, expected[index], f"the {which} of {call}", dtype=torch.float64, mistakes=wrong
            )

    return Check(call, judge)


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
    cases = (VISIBLE,) if not part.hidden else HIDDEN
    for index, sizes in enumerate(cases):
        arguments = inputs(sizes, seed=140 + 10 * index, device=part.device, dtype=torch.float32)
        call = part.call(**arguments)

        def judge(result: Any, call=call, sizes=sizes) -> None:
            _, weights = family.module_pair(result, call, sizes, _hints)
            sums = weights.detach().double().sum(-1)
            if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
                fail(
                    f"the weights of {call} do not sum to 1 over the source positions.",
                    "the softmax runs over another axis than the source positions (dim=-1)",
                )

        yield Check(call, judge)


@behaviour(function="CrossAttention", points=2, hints=HINTS, driver=CROSS)
def cross_matches_torch(part: Part) -> Iterator[Check]:
    """Given nn.MultiheadAttention's weights, CrossAttention(target, source, mask) computes
    nn.MultiheadAttention(target, source, source) with the source padding mask (True = may attend)."""
    cases = (VISIBLE,) if not part.hidden else HIDDEN
    for index, sizes in enumerate(cases):
        for mask in source_masks(sizes, 150 + index, part.device):
            arguments = inputs(sizes, seed=150 + 10 * index, device=part.device, mask=mask)
            yield cross_check(part, arguments, sizes)
    if part.hidden:  # a target as long as the source: a swap of the two no longer shows in the shapes
        sizes = Sizes(2, 6, 6, 12, 3)
        yield cross_check(part, inputs(sizes, seed=159, device=part.device), sizes)


@behaviour(function="CrossAttention", points=1, hints=HINTS, driver=CROSS)
def cross_source_permutation(part: Part) -> Iterator[Check]:
    """Permuting the source positions (keys and values together, and the mask) leaves the output unchanged and
    permutes the weights' columns the same way: attention has no notion of position."""
    cases = (VISIBLE,) if not part.hidden else HIDDEN
    for index, sizes in enumerate(cases):
        mask = source_masks(sizes, 160 + index, part.device)[1]
        arguments = inputs(sizes, seed=160 + 10 * index, device=part.device, mask=mask)
        order = torch.randperm(sizes.k_len, generator=engine.seeded_generator(165 + index))
        order[order.clone()] = torch.roll(order, -1)  # one cycle: every position moves
        device_order = order.to(part.device)
        moved = {**arguments, "source": arguments["source"][:, device_order], "mask": mask[..., device_order]}
        calls = (part.call(**arguments), part.call("with the source positions permuted", **moved))

        def judge(*results: Any, calls=calls, sizes=sizes, order=order) -> None:
            pairs = [family.module_pair(r, c, sizes, _hints) for r, c in zip(results, calls, strict=True)]
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
    cases = (VISIBLE,) if not part.hidden else HIDDEN
    for index, sizes in enumerate(cases):
        masks = source_masks(sizes, 170 + index, part.device)
        arguments = inputs(sizes, seed=170 + 10 * index, device=part.device, mask=masks[1])
        other = (
            sizes
            if not part.hidden or index != 1
            else Sizes(sizes.batch, sizes.q_len, sizes.k_len + 2, sizes.d_model, sizes.n_heads)
        )
        source2 = randn((other.batch, other.k_len, other.d_model), seed=175 + index, device=part.device)
        mask2 = source_masks(other, 176 + index, part.device)[1]
        yield _cache_check(part, {**arguments, "source2": source2, "mask2": mask2}, sizes, other)


def _cache_check(part: Part, arguments: dict[str, Any], sizes: Sizes, other: Sizes) -> Check:
    call = part.call(**arguments)
    new = {**arguments, "source": arguments["source2"], "mask": arguments["mask2"]}

    def judge(result: Any) -> None:
        if not isinstance(result, tuple) or len(result) != 3:
            fail(f"{call} did not run.")
        steps, new_source, key_projections = result
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

        pair = family.module_pair(new_source, call, other, _hints)
        where = "the output for a new source after decoding with the first one (use_cache=True)"
        assert_values(
            pair[0],
            cross_answer(new)[0],
            where,
            dtype=torch.float64,
            mistakes=stale,
            hints={(other.batch, other.q_len, other.d_model): ""},
        )

    return Check(call, judge, on_raise=TEXT["stale"] if other != sizes else "")


@behaviour(function="CrossAttention", points=1, hints=HINTS, driver=CROSS)
def cross_from_scratch(part: Part) -> Iterator[Check]:
    """CrossAttention is correct and calls no built-in attention (F.scaled_dot_product_attention,
    nn.MultiheadAttention's forward)."""
    rule = family.from_scratch("cross-attention")
    if not part.hidden:
        yield from engine.correct_first(cross_matches_torch.plan(part), part.function)
    cases = (VISIBLE,) if not part.hidden else HIDDEN
    calls = []
    for index, sizes in enumerate(cases):
        for mask in source_masks(sizes, 180 + index, part.device):
            calls.append(part.call(**inputs(sizes, seed=180 + 10 * index, device=part.device, mask=mask)))
    yield rule.check(calls)


# ==================================================================================================
# 3. the decoder layer


ATTENTIONS = {"self": "self_attn", "cross": "multihead_attn"}  # prefix -> nn.TransformerDecoderLayer's
LAYER_WEIGHTS = family.layer_weight_names(ATTENTIONS, 3)


def layer_weights(sizes: Sizes, *, seed: int, device, dtype=torch.float64) -> dict[str, torch.Tensor]:
    """Weights of ``nn.TransformerDecoderLayer(d_model, n_heads, d_ff)``, drawn (layer norms near 1 and 0)."""
    return family.layer_weights(
        sizes.d_model, sizes.d_ff, ATTENTIONS, 3, seed=seed, device=device, dtype=dtype
    )


def build_torch_layer(arguments: dict[str, Any]) -> nn.TransformerDecoderLayer:
    """``nn.TransformerDecoderLayer(batch_first=True, dropout=0)`` with the weights of ``arguments``."""
    w = arguments
    layer = nn.TransformerDecoderLayer(
        w["d_model"],
        w["n_heads"],
        w["d_ff"],
        dropout=0.0,
        batch_first=True,
        norm_first=w["norm_first"],
        device=w["x"].device,
        dtype=w["self_in_w"].dtype,
    )
    return family.load_layer_weights(layer, w, ATTENTIONS).eval()


def _prepare_layer(**arguments: Any) -> dict[str, Any]:
    rest = {name: value for name, value in arguments.items() if name not in LAYER_WEIGHTS}
    return {**rest, "torch_layer": build_torch_layer(arguments)}


def _layer(cls: Any, d_model, n_heads, d_ff, norm_first, torch_layer, like: torch.Tensor) -> Any:
    layer = cls(d_model, n_heads, d_ff, norm_first=norm_first).to(dtype=like.dtype, device=like.device)
    layer.self_attn.load_torch_weights(torch_layer.self_attn)
    layer.cross_attn.load_torch_weights(torch_layer.multihead_attn)
    for name in ("linear1", "linear2", "norm1", "norm2", "norm3"):
        getattr(layer, name).load_state_dict(getattr(torch_layer, name).state_dict())
    return layer.eval()


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


DECODE, STEPS = Driver(_decode, _prepare_layer), Driver(_steps, _prepare_layer)


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
    a = {
        k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in arguments.items()
    }
    h = a["n_heads"]

    def attention(prefix: str, x: torch.Tensor, memory: torch.Tensor, mask) -> torch.Tensor:
        weights = {
            "in_proj_weight": a[f"{prefix}_in_w"],
            "in_proj_bias": a[f"{prefix}_in_b"],
            "out_proj_weight": a[f"{prefix}_out_w"],
            "out_proj_bias": a[f"{prefix}_out_b"],
        }
        call = {"d_model": a["d_model"], "n_heads": h, **weights, "query": x, "key": memory, "value": memory}
        return ex04.forward({**call, "mask": mask})[0]

    def norm(n: int, x: torch.Tensor) -> torch.Tensor:
        n = row.norms[n - 1]
        return F.layer_norm(x, x.shape[-1:], a[f"norm{n}_w"], a[f"norm{n}_b"])

    act = F.relu if row.activation == "relu" else F.gelu

    def feed_forward(x: torch.Tensor) -> torch.Tensor:
        return F.linear(act(F.linear(x, a["linear1_w"], a["linear1_b"])), a["linear2_w"], a["linear2_b"])

    memory = a["memory"]
    self_mask = a.get("self_mask") if row.self_mask else None
    memory_mask = a.get("memory_mask") if row.memory_mask else None
    sublayers = {
        "self": lambda y: attention("self", y, y, self_mask),
        "cross": lambda y: attention(
            "cross", y, norm(2, memory) if row.memory_normalised else memory, memory_mask
        ),
        "ffn": feed_forward,
    }
    if row.norm_first == "as given":
        pre = a["norm_first"]
    else:
        pre = row.norm_first == "inverted" and not a["norm_first"]
    x = a["x"]
    order = [name.strip() for name in row.order.split(",")] + ["ffn"]
    for n, name in enumerate(order, start=1):  # the norms go by position: norm1 for the first sub-layer
        keep = x if row.residual[("self", "cross", "ffn").index(name)] else 0
        if pre:
            x = keep + sublayers[name](norm(n, x))
        else:
            x = keep + sublayers[name](x)
            x = norm(n, x) if (n != 3 or row.final_norm) else x
    return x


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
    wide = {
        k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in arguments.items()
    }
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
    x = randn((sizes.batch, sizes.q_len, sizes.d_model), seed=seed, device=device, dtype=dtype)
    memory = randn((sizes.batch, sizes.k_len, sizes.d_model), seed=seed + 1, device=device, dtype=dtype)
    return {
        "d_model": sizes.d_model,
        "n_heads": sizes.n_heads,
        "d_ff": sizes.d_ff,
        "norm_first": norm_first,
        **layer_weights(sizes, seed=seed + 10, device=device, dtype=dtype),
        "x": x,
        "memory": memory,
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
    cases = (VISIBLE,) if not part.hidden else HIDDEN
    for index, sizes in enumerate(cases):
        for norm_first in (False, True):
            arguments = layer_inputs(sizes, seed=200 + 10 * index, device=part.device, norm_first=norm_first)
            yield decoder_check(part, arguments, sizes)


@behaviour(function="DecoderLayer", points=1, hints=HINTS, driver=STEPS)
def decoder_step_by_step(part: Part) -> Iterator[Check]:
    """Decoding step by step (the target so far, its causal mask, use_cache=True) gives at each step the last
    position's output of the whole target at once: the causal mask hides the future, the cache changes
    nothing."""
    cases = (VISIBLE,) if not part.hidden else HIDDEN
    for index, sizes in enumerate(cases):
        for norm_first in (False, True):
            arguments = layer_inputs(sizes, seed=220 + 10 * index, device=part.device, norm_first=norm_first)
            del arguments["self_mask"]
            call = part.call(**arguments)

            def judge(result: Any, arguments=arguments, call=call) -> None:
                full = {
                    **arguments,
                    "self_mask": torch.ones(
                        arguments["x"].size(1),
                        arguments["x"].size(1),
                        dtype=torch.bool,
                        device=arguments["x"].device,
                    ).tril(),
                }
                expected = torch_decoder(full)
                assert_values(
                    result,
                    expected,
                    f"the step-by-step outputs of {call}",
                    dtype=torch.float64,
                    mistakes=lambda: decoder_mistakes(full),
                )

            yield Check(call, judge, on_raise=CROSS_MASK)
