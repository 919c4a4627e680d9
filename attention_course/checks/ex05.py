"""Checks of exercise ex05: key/value heads repeated, the grouped-query module, the cache and the conversion.

The module is judged against ``F.scaled_dot_product_attention(..., enable_gqa=True)`` on the projected heads
(its weights against a softmax), in float64, with every size different, ``q_len != k_len`` and
``n_kv_heads`` in ``{1, 2, 3, n_heads}``; then on the ladder's two ends, ``nn.MultiheadAttention``
(``n_kv_heads = n_heads``) and multi-query attention (one key/value head, broadcast). Its known mistakes are
rows (:class:`Groups`) of one parametrised computation, :func:`forward`, with the attention family's core
mistakes inside each head.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from attention_course.checks import attention_family as family
from attention_course.checks import engine, ex04
from attention_course.checks.attention_family import QKV, Variant
from attention_course.checks.engine import (
    Call,
    Check,
    Driver,
    Mistake,
    Part,
    assert_values,
    behaviour,
    fail,
    randn,
)

HINTS = family.exception_hints("""
attribute 'q_proj' | attribute 'k_proj' | attribute 'v_proj' | attribute 'o_proj': name the four
    projections q_proj, k_proj, v_proj and o_proj (nn.Linear modules), as in Llama: the checks copy their
    weights into them
the checks cannot copy | is invalid for input of size: k_proj and v_proj give n_kv_heads * d_head features
    (not d_model), split into n_kv_heads heads; repeat them to n_heads
""")
CONVERT_HINTS = (
    *engine.hint_table("""
same dtype | expected scalar type | expected both | same device: the new module must have the dtype and
    device of mha:
    GroupedQueryAttention(...).to(mha.in_proj_weight) (nn.Linear is made in float32)
"""),
    *HINTS,
)
TEXT = (
    engine.table("""
tile: the key/value heads are tiled (a, b, a, b: x.repeat(1, n_rep, 1, 1)); query head i must meet key/value
    head i // n_rep, so each head is repeated next to itself (a, a, b, b): x.repeat_interleave(n_rep, dim=1)
no output projection: the output projection o_proj is missing: the merged heads go through o_proj
""")
    | family.MODULE_TEXT
)
SHAPES = engine.table("""
output batch n_heads q_len d_head: the heads are not merged: merge them back to [batch, q_len, d_model] and
    apply o_proj
weights batch n_kv q_len k_len: the weights have one row per key/value head: repeat the keys to n_heads heads
    (repeat_kv) before the scores, so that every query head has its own weights
weights batch q_len k_len: the weights are averaged over heads: return every head's, [batch, n_heads, q_len,
    k_len]
weights batch n_heads k_len q_len: the weights are [..., k_len, q_len]: the scores are q @ k^T
repeat batch n_kv len_rep d_head: the positions are repeated (dim=2): repeat the heads, dim=1
repeat batch n_kv len d_rep: the features are repeated (dim=-1): repeat the heads, dim=1
repeat n_rep_batch n_kv len d_head: the batch is repeated (dim=0): repeat the heads, dim=1
repeat batch n_kv n_rep len d_head: the repeats are a new axis: reshape to [batch, n_kv_heads * n_rep, len,
    d_head]
""")


@dataclass(frozen=True)
class Sizes:
    """The sizes of one grouped-query call."""

    batch: int
    q_len: int
    k_len: int
    d_model: int
    n_heads: int
    n_kv_heads: int

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def kv(self, n_kv_heads: int) -> Sizes:
        return Sizes(self.batch, self.q_len, self.k_len, self.d_model, self.n_heads, n_kv_heads)


VISIBLE = Sizes(2, 5, 7, 24, 6, 2)  # d_head 4, groups of 3
HIDDEN = (Sizes(3, 4, 6, 40, 8, 2), Sizes(1, 6, 3, 20, 4, 1), Sizes(2, 3, 5, 36, 6, 3))


def _hints(sizes: Sizes, kind: str, **extra: int) -> dict[tuple[int, ...], str]:
    axes = {f: getattr(sizes, f) for f in ("batch", "q_len", "k_len", "d_model", "n_heads", "d_head")}
    return engine.shapes(SHAPES, kind, **axes, n_kv=sizes.n_kv_heads, **extra)


# --- the inputs: weights as data, and the drivers that load them into the learner's module

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def projection_weights(sizes: Sizes, *, bias: bool, seed: int, device, dtype=torch.float64) -> dict:
    """``{q_proj_weight, q_proj_bias, ...}``: weights of the four projections, scale 1/sqrt(fan_in)."""
    h, g, dh, d = sizes.n_heads, sizes.n_kv_heads, sizes.d_head, sizes.d_model
    shapes = {"q_proj": (h * dh, d), "k_proj": (g * dh, d), "v_proj": (g * dh, d), "o_proj": (d, h * dh)}
    weights = {}
    for i, (name, shape) in enumerate(shapes.items()):
        scale = 1 / math.sqrt(shape[1])
        weights[f"{name}_weight"] = randn(shape, seed=seed + 2 * i, device=device, dtype=dtype) * scale
        draw = randn(shape[:1], seed=seed + 2 * i + 1, device=device, dtype=dtype) * scale
        weights[f"{name}_bias"] = draw if bias else None
    return weights


def inputs(sizes: Sizes, *, seed: int, device, dtype=torch.float64, bias=True, mask=None) -> dict[str, Any]:
    """The arguments of one call: sizes, the projections' weights, query/key/value, ``mask``."""
    lengths = {"query": sizes.q_len, "key": sizes.k_len, "value": sizes.k_len}
    tensors = {
        name: randn((sizes.batch, length, sizes.d_model), seed=seed + i, device=device, dtype=dtype)
        for i, (name, length) in enumerate(lengths.items())
    }
    weights = projection_weights(sizes, bias=bias, seed=seed + 10, device=device, dtype=dtype)
    sized = {"d_model": sizes.d_model, "n_heads": sizes.n_heads, "n_kv_heads": sizes.n_kv_heads}
    return {**sized, "bias": bias, **weights, **tensors, "mask": mask}


def _module(cls: Any, d_model, n_heads, n_kv_heads, bias, like: torch.Tensor, weights: dict) -> Any:
    module = cls(d_model, n_heads, n_kv_heads, bias=bias).to(dtype=like.dtype, device=like.device)
    with torch.no_grad():
        for name, tensor in weights.items():
            if tensor is not None:
                projection, kind = name.rsplit("_", 1)
                target = getattr(getattr(module, projection), kind)
                if target.shape != tensor.shape:
                    raise ValueError(
                        f"the checks cannot copy a {list(tensor.shape)} {kind} into {projection}.{kind}, "
                        f"of shape {list(target.shape)}"
                    )
                target.copy_(tensor)
    return module


def _forward(cls: Any, *, d_model, n_heads, n_kv_heads, bias=True, query, key, value, mask=None, **weights):
    """Construct the learner's module, copy the weights into its projections, and call it (the kernel)."""
    module = _module(cls, d_model, n_heads, n_kv_heads, bias, query, weights)
    return module(query, key, value, mask)


def _shapes(cls: Any, *, d_model, n_heads, n_kv_heads, query, key, value) -> Any:
    """The module's ``(output, weights)`` and its projections' weight shapes (the kernel)."""
    module = cls(d_model, n_heads, n_kv_heads).to(dtype=query.dtype, device=query.device)
    output = module(query, key, value)
    shapes = tuple(tuple(getattr(module, name).weight.shape) for name in PROJECTIONS)
    return (*output, shapes) if isinstance(output, tuple | list) else (output, None, shapes)


def _kv_bytes(fn: Any, *, dtype: str, **sizes: int) -> Any:
    return fn(**sizes, dtype=getattr(torch, dtype))  # a dtype is not data: its name travels


def _prepare_mha(**arguments: Any) -> dict[str, Any]:
    rest = {name: value for name, value in arguments.items() if name not in ex04.WEIGHT_NAMES}
    return {**rest, "mha": ex04.build_torch_mha(arguments)}


def _convert(fn: Any, *, mha, n_kv_heads, query, key, value, **_: Any) -> Any:
    """The learner's conversion of ``mha``, called on the inputs, and its pooled key projection."""
    gqa = fn(mha, n_kv_heads)
    output, weights = gqa(query, key, value)
    return output, weights, gqa.k_proj.weight.detach().clone()


FORWARD, SHAPES_DRIVER = Driver(_forward), Driver(_shapes)
KV_BYTES, CONVERT = Driver(_kv_bytes), Driver(_convert, _prepare_mha)


# --- the computation, and its known mistakes as rows


@dataclass(frozen=True)
class Groups:
    """A way of computing grouped-query attention: the right one, or a known mistake (its ``hint``)."""

    hint: str = ""
    repeat: str = "interleave"  # "tile": x.repeat(1, n_rep, 1, 1)
    out_proj: bool = True
    mask3: str = "unsqueeze"  # "as heads": a [batch, q_len, k_len] mask broadcast against the head axis
    core: Variant = Variant()  # noqa: RUF009 (frozen): the attention core of each head


def project(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The heads ``q [batch, n_heads, q_len, d_head]``, ``k``, ``v [batch, n_kv_heads, k_len, d_head]``."""
    d_head = a["d_model"] // a["n_heads"]

    def heads(name: str, n: int) -> torch.Tensor:
        x = F.linear(a[name], a[f"{name[0]}_proj_weight"], a[f"{name[0]}_proj_bias"])
        return x.reshape(x.size(0), x.size(1), n, d_head).transpose(1, 2)

    return heads("query", a["n_heads"]), heads("key", a["n_kv_heads"]), heads("value", a["n_kv_heads"])


def _mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    return mask.unsqueeze(1) if mask is not None and mask.dim() == 3 else mask


def _output(a: dict[str, Any], heads: torch.Tensor, out_proj: bool = True) -> torch.Tensor:
    merged = heads.transpose(1, 2).reshape(heads.size(0), heads.size(2), -1)
    return F.linear(merged, a["o_proj_weight"], a["o_proj_bias"]) if out_proj else merged


def forward(arguments: dict[str, Any], row: Groups = Groups()) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output, weights)`` of grouped-query attention as ``row`` computes it, in float64 (check code)."""
    a = family.cast(arguments, torch.float64)
    q, k, v = project(a)
    n_rep = a["n_heads"] // a["n_kv_heads"]
    if row.repeat == "tile":
        k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)
    else:
        k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    mask = a.get("mask")
    if mask is not None and mask.dim() == 3 and row.mask3 == "as heads":
        if mask.size(0) not in (1, a["n_heads"]):
            raise ValueError("this mistake raises for these sizes")
    else:
        mask = _mask(mask)
    weights = family.weights(QKV(q, k, v, mask, a["d_model"]), row.core)
    return _output(a, weights @ v, row.out_proj), weights


ROWS = (
    Groups(TEXT["tile"], repeat="tile"),
    Groups(TEXT["no output projection"], out_proj=False),
    Groups(TEXT["scale d_model"], core=Variant(divide="sqrt(d_model)")),
    Groups(TEXT["mask 3d"], mask3="as heads"),
    *(Groups(variant.hint, core=variant) for variant in family.CORE if variant.divide != "sqrt(d_model)"),
)


def mistakes(arguments: dict[str, Any], index: int, rows=ROWS) -> Iterator[Mistake]:
    """The output (``index`` 0) or the weights (1) of each known mistake on ``arguments``."""
    return family.row_mistakes(rows, forward, arguments, index)


def sdpa_answer(arguments: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's answer: SDPA with ``enable_gqa=True`` on the projected heads, then ``o_proj`` (float64)."""
    a = family.cast(arguments, torch.float64)
    q, k, v = project(a)
    mask = _mask(a.get("mask"))
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    weights = family.masked_softmax(
        q @ k.repeat_interleave(q.size(1) // k.size(1), 1).mT / q.size(-1) ** 0.5, mask
    )
    return _output(a, heads), weights


def mqa_answer(arguments: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-query attention: one key/value head ``[batch, 1, k_len, d_head]`` broadcast over the heads."""
    a = family.cast(arguments, torch.float64)
    q, k, v = project(a)
    weights = torch.softmax(q @ k.mT / math.sqrt(q.size(-1)), dim=-1)  # k: [batch, 1, k_len, d_head]
    return _output(a, weights @ v), weights


def mha_answer(arguments: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``nn.MultiheadAttention`` given the same weights (``n_kv_heads = n_heads``)."""
    a = dict(arguments)
    stacked = [a.pop(f"{name}_proj_weight") for name in "qkv"]
    biases = [a.pop(f"{name}_proj_bias") for name in "qkv"]
    a["in_proj_weight"] = torch.cat(stacked)
    a["in_proj_bias"] = torch.cat(biases) if biases[0] is not None else None
    a["out_proj_weight"], a["out_proj_bias"] = a.pop("o_proj_weight"), a.pop("o_proj_bias")
    return ex04.torch_answer(a)


def module_check(part: Part, arguments: dict[str, Any], sizes: Sizes, answer=sdpa_answer) -> Check:
    """One call of the module, judged on its shapes, then on its values against ``answer``."""
    return family.module_check(part, arguments, sizes, answer, mistakes, _hints)


# --- the behaviours, in the notebook's order


@behaviour(function="repeat_kv", points=1, hints=HINTS)
def repeat_kv_interleaves(part: Part) -> Iterator[Check]:
    """repeat_kv repeats each key/value head next to itself: heads [a, b] -> [a, a, b, b], [batch,
    n_kv_heads * n_rep, len, d_head]; n_rep = 1 leaves x as it is."""
    cases = ((2, 3, 5, 4, 3, torch.float32), (2, 3, 5, 4, 1, torch.float32))
    if part.hidden:
        cases = (
            (3, 2, 4, 6, 4, torch.float64),
            (1, 4, 3, 2, 2, torch.float16),
            (2, 1, 6, 5, 5, torch.bfloat16),
        )
    for index, (batch, n_kv, length, d_head, n_rep, dtype) in enumerate(cases):
        x = randn((batch, n_kv, length, d_head), seed=10 + index, device=part.device, dtype=dtype)
        call = part.call(x=x, n_rep=n_rep)

        def wrong(x=x, n_rep=n_rep) -> Iterator[Mistake]:
            yield Mistake(TEXT["tile"], x.repeat(1, n_rep, 1, 1))

        def judge(
            result: Any, x=x, n_rep=n_rep, call=call, wrong=wrong, sizes=(batch, n_kv, length, d_head)
        ) -> None:
            b, g, length, dh = sizes
            hints = engine.shapes(
                SHAPES,
                "repeat",
                batch=b,
                n_kv=g,
                len=length,
                d_head=dh,
                n_rep=n_rep,
                len_rep=length * n_rep,
                d_rep=dh * n_rep,
                n_rep_batch=b * n_rep,
            )
            right = x.repeat_interleave(n_rep, dim=1)
            assert_values(result, right, f"the result of {call}", mistakes=wrong, hints=hints)

        yield Check(call, judge, untouched=True)


@behaviour(function="GroupedQueryAttention", points=1, hints=HINTS, driver=SHAPES_DRIVER)
def gqa_shapes(part: Part) -> Iterator[Check]:
    """The module returns (output [batch, q_len, d_model], weights [batch, n_heads, q_len, k_len]); q_proj and
    o_proj are d_model x n_heads d_head, k_proj and v_proj n_kv_heads d_head x d_model."""
    cases = (VISIBLE, VISIBLE.kv(1)) if not part.hidden else HIDDEN
    for index, sizes in enumerate(cases):
        arguments = inputs(sizes, seed=20 + 10 * index, device=part.device, dtype=torch.float32)
        names = ("d_model", "n_heads", "n_kv_heads", "query", "key", "value")
        call = part.call(**{name: arguments[name] for name in names})

        def judge(result: Any, call=call, sizes=sizes) -> None:
            if not isinstance(result, tuple) or len(result) != 3:
                fail(f"{call} should return a tuple (output, weights).")
            family.module_pair(result[:2], call, sizes, _hints)
            h, g, dh, d = sizes.n_heads, sizes.n_kv_heads, sizes.d_head, sizes.d_model
            right = {
                "q_proj": (h * dh, d),
                "k_proj": (g * dh, d),
                "v_proj": (g * dh, d),
                "o_proj": (d, h * dh),
            }
            for name, shape in zip(PROJECTIONS, result[2], strict=True):
                if tuple(shape) != right[name]:
                    fail(
                        f"{name}.weight has shape {list(shape)}, expected {list(right[name])} (d_model "
                        f"{d}, n_heads {h}, n_kv_heads {g}, d_head {dh}).",
                        "k_proj and v_proj give n_kv_heads * d_head features, one d_head block per "
                        "key/value head; q_proj gives n_heads * d_head; o_proj maps them back to d_model",
                    )

        yield Check(call, judge)


@behaviour(function="GroupedQueryAttention", points=3, hints=HINTS, driver=FORWARD)
def gqa_matches_sdpa(part: Part) -> Iterator[Check]:
    """Given the same projections, the module computes what F.scaled_dot_product_attention(...,
    enable_gqa=True) computes on the projected heads, for 1, some and n_heads key/value heads, with and
    without biases and masks of each shape (True = may attend)."""
    if part.hidden:
        cases = [(s, d) for s in HIDDEN for d in (torch.float64, torch.float32)]
    else:
        cases = [(VISIBLE, torch.float64), (VISIBLE.kv(3), torch.float64), (VISIBLE.kv(1), torch.float64)]
    for index, (sizes, dtype) in enumerate(cases):
        for number, mask in enumerate(ex04.masks(sizes, 30 + 10 * index, part.device)):
            bias = number != 1
            arguments = inputs(
                sizes, seed=30 + 10 * index, device=part.device, dtype=dtype, bias=bias, mask=mask
            )
            yield module_check(part, arguments, sizes)
    if not part.hidden:  # every query head its own key/value head: multi-head attention
        yield module_check(part, inputs(VISIBLE.kv(6), seed=60, device=part.device), VISIBLE.kv(6))


@behaviour(function="GroupedQueryAttention", points=1, hints=HINTS, driver=FORWARD)
def gqa_ladder(part: Part) -> Iterator[Check]:
    """The ends of the ladder: with n_kv_heads = n_heads the module is nn.MultiheadAttention given the same
    weights, with n_kv_heads = 1 multi-query attention, one key/value head broadcast over every query head."""
    cases = (VISIBLE,) if not part.hidden else HIDDEN
    for index, sizes in enumerate(cases):
        for dtype in (torch.float64,) if not part.hidden else (torch.float64, torch.float32):
            for n_kv, answer in ((sizes.n_heads, mha_answer), (1, mqa_answer)):
                at = sizes.kv(n_kv)
                arguments = inputs(at, seed=70 + 10 * index, device=part.device, dtype=dtype)
                yield module_check(part, arguments, at, answer)


@behaviour(function="kv_cache_bytes", points=1, hints=HINTS, driver=KV_BYTES)
def kv_cache_values(part: Part) -> Iterator[Check]:
    """kv_cache_bytes is 2 n_layers n_kv_heads d_head seq_len batch bytes(dtype), an int: 2 GiB for 4096
    tokens of a Llama-2-7B-like model in float16, 536,870,912 bytes with 8 key/value heads."""
    cases = [
        (32, 32, 128, 4096, 1, "float16"),
        (32, 8, 128, 4096, 1, "float16"),
        (1, 32, 128, 1, 1, "float16"),  # MHA: per token and layer
        (1, 8, 128, 1, 1, "float16"),  # GQA-8
        (1, 1, 128, 1, 1, "float16"),  # MQA
        (2, 4, 64, 100, 3, "float32"),
        (2, 4, 64, 100, 3, "bfloat16"),
    ]
    if part.hidden:
        cases = [
            (80, 8, 128, 8192, 4, "bfloat16"),
            (6, 3, 10, 7, 5, "float64"),
            (12, 12, 64, 512, 8, "float32"),
        ]
    for n_layers, n_kv, d_head, seq_len, batch, dtype in cases:
        sizes = {
            "n_layers": n_layers,
            "n_kv_heads": n_kv,
            "d_head": d_head,
            "seq_len": seq_len,
            "batch": batch,
        }
        call = part.call(**sizes, dtype=dtype)
        yield Check(
            call, lambda result, call=call, sizes=sizes, dtype=dtype: _bytes(result, call, sizes, dtype)
        )


def _bytes(result: Any, call: Call, sizes: dict[str, int], dtype: str) -> None:
    size = getattr(torch, dtype).itemsize
    numbers = math.prod(sizes.values())
    right = 2 * numbers * size
    if isinstance(result, int) and not isinstance(result, bool) and result == right:
        return
    wrong = (
        (numbers * size, "the factor 2 is missing: the cache holds a key and a value vector per head"),
        (right * 8, "the size is in bits: dtype.itemsize is already in bytes"),
        (2 * numbers * 4, "the dtype is ignored (4 bytes a number): use dtype.itemsize"),
        (right // max(sizes["n_layers"], 1), "n_layers is ignored: every layer keeps its own cache"),
        (right // max(sizes["batch"], 1), "batch is ignored: every sequence keeps its own cache"),
    )
    number = isinstance(result, int | float) and not isinstance(result, bool)
    cause = next((hint for value, hint in wrong if number and result == value and value != right), "")
    if not isinstance(result, int) or isinstance(result, bool):
        cause = f"return an int, not a {engine.type_name(result)}" + (f"; also, {cause}" if cause else "")
    fail(f"{call} returned {result!r}, expected {right:,}.", cause, expected=str(right), got=repr(result))


def pooled(rows: torch.Tensor, n_kv_heads: int, d_head: int, how: str = "mean") -> torch.Tensor:
    """Key (value) rows ``[n_heads * d_head, ...]`` pooled per group, ``how``: right ("mean") or a mistake."""
    n_heads = rows.size(0) // d_head
    r = n_heads // n_kv_heads
    if how == "strided":  # heads g, g + G, g + 2G, ...
        return rows.reshape(r, n_kv_heads, d_head, *rows.shape[1:]).mean(0).flatten(0, 1)
    grouped = rows.reshape(n_kv_heads, r, d_head, *rows.shape[1:])
    value = {"mean": grouped.mean(1), "sum": grouped.sum(1), "first": grouped[:, 0]}[how]
    return value.flatten(0, 1)


POOLS = {
    "first": "key/value head g is the first head of its group; Ainslie et al. take the mean of the group's "
    "heads",
    "strided": "group g takes the heads g, g + G, g + 2G, ...; it must take the consecutive heads "
    "g r .. g r + r - 1 that repeat_kv pairs with it (r = n_heads // n_kv_heads)",
    "sum": "the heads of a group are summed: take their mean (divide by r = n_heads // n_kv_heads)",
}


def _converted(arguments: dict[str, Any], how: str) -> dict[str, Any]:
    """The grouped-query arguments of ``mha``'s weights pooled ``how`` (float64)."""
    a = family.cast(arguments, torch.float64)
    g, dh = a["n_kv_heads"], a["d_model"] // a["n_heads"]
    weights, biases = a["in_proj_weight"].chunk(3), a["in_proj_bias"].chunk(3)
    rows = {"q_proj": (weights[0], biases[0])}
    rows |= {
        f"{n}_proj": (pooled(w, g, dh, how), pooled(b, g, dh, how))
        for n, w, b in zip("kv", weights[1:], biases[1:], strict=True)
    }
    converted = {
        f"{name}_{kind}": t
        for name, pair in rows.items()
        for kind, t in zip(("weight", "bias"), pair, strict=True)
    }
    converted |= {"o_proj_weight": a["out_proj_weight"], "o_proj_bias": a["out_proj_bias"]}
    return {**a, **converted, "mask": None}


@behaviour(function="gqa_from_mha", points=2, hints=CONVERT_HINTS, driver=CONVERT)
def gqa_from_mha_pools(part: Part) -> Iterator[Check]:
    """gqa_from_mha gives key/value head g the mean of mha's consecutive heads g r .. g r + r - 1 (weights and
    biases); with n_kv_heads = n_heads the result computes what mha computes."""
    cases = (
        ((VISIBLE, 2), (VISIBLE, 3), (VISIBLE, 6)) if not part.hidden else [(s, s.n_kv_heads) for s in HIDDEN]
    )
    for index, (sizes, n_kv) in enumerate(cases):
        at = sizes.kv(n_kv)
        ex04_sizes = ex04.Sizes(at.batch, at.q_len, at.k_len, at.d_model, at.n_heads)
        arguments = ex04.inputs(ex04_sizes, seed=80 + 10 * index, device=part.device)
        arguments = {name: value for name, value in arguments.items() if name not in ("bias", "mask")}
        yield _convert_check(part, {**arguments, "n_kv_heads": n_kv}, at)


def _convert_check(part: Part, arguments: dict[str, Any], sizes: Sizes) -> Check:
    call = part.call(**arguments)
    right = _converted(arguments, "mean")

    def wrong(what: str, index: int = 0) -> Iterator[Mistake]:
        for how, hint in POOLS.items():
            converted = _converted(arguments, how)
            yield Mistake(hint, converted["k_proj_weight"] if what == "k" else forward(converted)[index])

    def judge(result: Any) -> None:
        if not isinstance(result, tuple) or len(result) != 3:
            fail(f"{call} gave no result.", "gqa_from_mha must return a GroupedQueryAttention module")
        output, weights, k_weight = result
        where = f"k_proj.weight of the module of {call}"
        assert_values(k_weight, right["k_proj_weight"], where, mistakes=lambda: wrong("k"))
        output, weights = family.module_pair((output, weights), call, sizes, _hints)
        expected = (
            forward(right)
            if sizes.n_kv_heads != sizes.n_heads
            else ex04.torch_answer({**arguments, "mask": None})
        )
        for which, actual, index in (("weights", weights, 1), ("output", output, 0)):
            where = f"the {which} of the module of {call}"
            assert_values(actual, expected[index], where, mistakes=lambda index=index: wrong("out", index))

    return Check(call, judge)
