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
from attention_course.checks import module_family as mf
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
from attention_course.checks.module_family import Sizes

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
'NoneType' object has no attribute | 'NoneType' object is not: mha may have no biases (bias=False: its
    in_proj_bias and out_proj.bias are None): build the module with bias=mha.in_proj_bias is not None, and
    pool and copy the biases only when there are some
"""),
    *HINTS,
)
TEXT = (
    engine.table("""
tile: the key/value heads are tiled (a, b, a, b: x.repeat(1, n_rep, 1, 1)); query head i must meet key/value
    head i // n_rep, so each head is repeated next to itself (a, a, b, b): x.repeat_interleave(n_rep, dim=1)
no output projection: the output projection o_proj is missing: the merged heads go through o_proj
repeat errors: check x.dim() == 4 and n_rep >= 1 first and raise ValueError: repeat_interleave(0) returns an
    empty tensor, and a tensor of three axes is repeated along the wrong one, without an error
dtype kept: the result must keep the dtype of x: a tensor made with torch.zeros/torch.empty (float32 by
    default) and filled changes it: pass dtype=x.dtype and device=x.device, or use repeat_interleave/expand
module sizes: check in __init__ that n_heads divides d_model and n_kv_heads divides n_heads, and raise
    ValueError: otherwise n_heads // n_kv_heads silently drops query heads, or view() fails later
rule: The course's rule (chapter 3): a query whose mask row allows no key gets zero weights, so its
    attention is zero and the output there is o_proj's bias alone.
cache errors: check the sizes first and raise ValueError for a negative one (min(sizes) < 0)
cache zero: a size of 0 is allowed (an empty cache takes 0 bytes): raise ValueError for negative sizes only
convert errors: check first that mha has one in_proj_weight (not None: no separate kdim/vdim) and that
    n_kv_heads divides mha.num_heads, and raise ValueError
convert bias: mha has no biases (bias=False): the new module must have none either,
    GroupedQueryAttention(..., bias=False), else its projections keep their random initial biases
""")
    | mf.MODULE_TEXT
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


# The learner's docstrings clause by clause, and the behaviours that check each (tests/test_contracts.py).
CONTRACT = engine.table("""
repeat_kv x: repeat_kv_interleaves; [batch, n_kv_heads, len, d_head], float64, float32, float16, bfloat16,
    left unchanged
repeat_kv n_rep: repeat_kv_interleaves; 1 to 5
repeat_kv returns: repeat_kv_interleaves; head i of the result is head i // n_rep of x, [batch, n_kv_heads *
    n_rep, len, d_head], x's dtype (that it is x itself for n_rep = 1 is not observable in a recording: its
    values are checked)
repeat_kv raises ValueError: repeat_kv_interleaves; n_rep 0 and -1, x of 2, 3 and 5 axes
GroupedQueryAttention d_model: gqa_shapes, gqa_matches_sdpa; 20 to 40
GroupedQueryAttention n_heads: gqa_shapes, gqa_matches_sdpa; 4 to 8
GroupedQueryAttention n_kv_heads: gqa_shapes, gqa_matches_sdpa, gqa_ladder; 1, 2, 3 and n_heads
GroupedQueryAttention bias: gqa_matches_sdpa; True (its default) and False
GroupedQueryAttention raises ValueError: gqa_shapes; n_heads that does not divide d_model, n_kv_heads that
    does not divide n_heads
GroupedQueryAttention.forward query: gqa_shapes, gqa_matches_sdpa; [batch, q_len, d_model], q_len != k_len,
    float64 and float32
GroupedQueryAttention.forward key: gqa_matches_sdpa, gqa_ladder; [batch, k_len, d_model]
GroupedQueryAttention.forward value: gqa_matches_sdpa, gqa_ladder; [batch, k_len, d_model]
GroupedQueryAttention.forward mask: gqa_matches_sdpa; None, [q_len, k_len], [batch, q_len, k_len], [batch, 1,
    1, k_len], [batch, n_heads, q_len, k_len]; rows that allow no key in each shape, float64 and float32
GroupedQueryAttention.forward returns: gqa_shapes, gqa_matches_sdpa, gqa_ladder; (output [batch, q_len,
    d_model], weights [batch, n_heads, q_len, k_len]) as SDPA(enable_gqa=True), nn.MultiheadAttention and
    multi-query attention compute them, in the query's dtype (float32, with and without a mask)
GroupedQueryAttention.forward raises TypeError: gqa_shapes; a mask of 0/1 integers, of 0/1 floats
kv_cache_bytes n_layers: kv_cache_values; 0 to 80
kv_cache_bytes n_kv_heads: kv_cache_values; 1 to 32
kv_cache_bytes d_head: kv_cache_values; 10 to 128
kv_cache_bytes seq_len: kv_cache_values; 0 to 8192
kv_cache_bytes batch: kv_cache_values; 1 to 8
kv_cache_bytes dtype: kv_cache_values; float16, bfloat16, float32, float64
kv_cache_bytes returns: kv_cache_values; an int, 2 n_layers n_kv_heads d_head seq_len batch dtype.itemsize;
    0 for a size 0
kv_cache_bytes raises ValueError: kv_cache_values; a negative seq_len, n_layers, batch
gqa_from_mha mha: gqa_from_mha_pools; nn.MultiheadAttention float64, with and without biases
gqa_from_mha n_kv_heads: gqa_from_mha_pools; 1, 2, 3 and n_heads
gqa_from_mha returns: gqa_from_mha_pools; key/value head g the mean of mha's heads g r .. g r + r - 1, weights
    and biases, q and o copied, mha's dtype; mha's function for n_kv_heads = n_heads
gqa_from_mha raises ValueError: gqa_from_mha_pools; n_kv_heads that does not divide n_heads, an mha with kdim
    and vdim (no in_proj_weight)
""")


VISIBLE = Sizes(2, 5, 7, 24, 6, 2)  # d_head 4, groups of 3
HIDDEN = (Sizes(3, 4, 6, 40, 8, 2), Sizes(1, 6, 3, 20, 4, 1), Sizes(2, 3, 5, 36, 6, 3))


# --- the inputs: weights as data, and the drivers that load them into the learner's module

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def projection_shapes(sizes: Sizes) -> dict[str, tuple[int, int]]:
    """``[out_features, in_features]`` of the four projections: q_proj's ``[n_heads d_head, d_model]``,
    k_proj's and v_proj's ``[n_kv_heads d_head, d_model]``, o_proj's ``[d_model, n_heads d_head]``."""
    h, g, dh, d = sizes.n_heads, sizes.n_kv_heads, sizes.d_head, sizes.d_model
    return {"q_proj": (h * dh, d), "k_proj": (g * dh, d), "v_proj": (g * dh, d), "o_proj": (d, h * dh)}


def inputs(sizes: Sizes, *, seed: int, device, dtype=torch.float64, bias=True, mask=None) -> dict[str, Any]:
    """The arguments of one call: sizes, the projections' weights, query/key/value, ``mask``."""
    shapes = projection_shapes(sizes)
    weights = mf.linear_weights(shapes, bias=bias, seed=seed + 10, device=device, dtype=dtype)
    tensors = mf.sequences(sizes, ("query", "key", "value"), seed=seed, device=device, dtype=dtype)
    sized = {"d_model": sizes.d_model, "n_heads": sizes.n_heads, "n_kv_heads": sizes.n_kv_heads}
    return {**sized, "bias": bias, **weights, **tensors, "mask": mask}


def _forward(cls: Any, *, d_model, n_heads, n_kv_heads, bias=True, query, key, value, mask=None, **weights):
    """Construct the learner's module, copy the weights into its projections, and call it (the kernel)."""
    module = mf.learner_module(cls, d_model, n_heads, n_kv_heads, like=query, bias=bias)
    return mf.load_projections(module, weights)(query, key, value, mask)


def _shapes(cls: Any, *, d_model, n_heads, n_kv_heads, query, key, value, mask=None) -> Any:
    """The module's ``(output, weights)`` and its projections' weight shapes (the kernel)."""
    module = mf.learner_module(cls, d_model, n_heads, n_kv_heads, like=query)
    output = module(query, key, value, mask)
    shapes = tuple(tuple(getattr(module, name).weight.shape) for name in PROJECTIONS)
    return (*output, shapes) if isinstance(output, tuple | list) else (output, None, shapes)


def _kv_bytes(fn: Any, *, dtype: str, **sizes: int) -> Any:
    return fn(**sizes, dtype=getattr(torch, dtype))  # a dtype is not data: its name travels


def _prepare_mha(**arguments: Any) -> dict[str, Any]:
    rest = {name: value for name, value in arguments.items() if name not in (*mf.MHA_WEIGHTS, "kdim")}
    if "kdim" not in arguments:
        return {**rest, "mha": mf.torch_mha(arguments)}
    # keys and values of another width: separate projections, no in_proj_weight
    like, kdim = arguments["query"], arguments["kdim"]
    mha = torch.nn.MultiheadAttention(
        arguments["d_model"],
        arguments["n_heads"],
        kdim=kdim,
        vdim=kdim,
        batch_first=True,
        device=like.device,
        dtype=like.dtype,
    )
    return {**rest, "mha": mha}


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
        mask = mf.head_axis(mask)
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
    return mf.row_mistakes(rows, forward, arguments, index)


def sdpa_answer(arguments: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's answer: SDPA with ``enable_gqa=True`` on the projected heads, then ``o_proj`` (float64)."""
    a = family.cast(arguments, torch.float64)
    q, k, v = project(a)
    mask = mf.head_axis(a.get("mask"))
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
    return mf.torch_answer(a)


def module_check(part: Part, arguments: dict[str, Any], sizes: Sizes, answer=sdpa_answer) -> Check:
    """One call of the module, judged on its shapes, then on its values against ``answer``."""
    return mf.module_check(part, arguments, sizes, answer, mistakes, SHAPES)


# --- the behaviours, in the notebook's order


@behaviour(function="repeat_kv", points=1, hints=HINTS)
def repeat_kv_interleaves(part: Part) -> Iterator[Check]:
    """repeat_kv repeats each key/value head next to itself: heads [a, b] -> [a, a, b, b], [batch,
    n_kv_heads * n_rep, len, d_head]; n_rep = 1 leaves x as it is."""
    cases = ((2, 3, 5, 4, 3, torch.float64), (2, 3, 5, 4, 1, torch.float32))
    if part.hidden:
        cases = (
            (3, 2, 4, 6, 4, torch.float64),
            (1, 4, 3, 2, 2, torch.float16),
            (2, 1, 6, 5, 5, torch.bfloat16),
        )
    for index, (batch, n_kv, length, d_head, n_rep, dtype) in enumerate(cases):
        x = randn((batch, n_kv, length, d_head), seed=10 + index, device=part.device, dtype=dtype)
        yield _repeat_check(part, x, n_rep)
    # the docstring's ValueError: n_rep below 1, x not [batch, n_kv_heads, len, d_head]
    refused = [((2, 3, 5, 4), 0), ((3, 5, 4), 2)]
    if part.hidden:
        refused = [((1, 2, 3, 4), -1), ((2, 3, 5, 4), 0), ((6, 4), 3), ((1, 2, 2, 3, 4), 2)]
    for shape, n_rep in refused:
        x = randn(shape, seed=19, device=part.device)
        condition = f"for x {engine.describe(x)} and n_rep={n_rep}"
        yield engine.raises(part.call(x=x, n_rep=n_rep), "ValueError", condition, TEXT["repeat errors"])


def _repeat_check(part: Part, x: torch.Tensor, n_rep: int) -> Check:
    call = part.call(x=x, n_rep=n_rep)
    b, g, length, dh = x.shape
    axes = {"batch": b, "n_kv": g, "len": length, "d_head": dh, "n_rep": n_rep}
    axes |= {"len_rep": length * n_rep, "d_rep": dh * n_rep, "n_rep_batch": b * n_rep}

    def wrong() -> Iterator[Mistake]:
        yield Mistake(TEXT["tile"], x.repeat(1, n_rep, 1, 1))

    right, hints = x.repeat_interleave(n_rep, dim=1), engine.shapes(SHAPES, "repeat", **axes)
    return mf.layout_check(call, x, right, wrong, hints, TEXT["dtype kept"])


@behaviour(function="GroupedQueryAttention", points=1, hints=HINTS, driver=SHAPES_DRIVER)
def gqa_shapes(part: Part) -> Iterator[Check]:
    """The module returns (output [batch, q_len, d_model], weights [batch, n_heads, q_len, k_len]); q_proj and
    o_proj are d_model x n_heads d_head, k_proj and v_proj n_kv_heads d_head x d_model."""
    names = ("d_model", "n_heads", "n_kv_heads", "query", "key", "value")
    for index, sizes in enumerate((VISIBLE, VISIBLE.kv(1)) if not part.hidden else HIDDEN):
        arguments = inputs(sizes, seed=20 + 10 * index, device=part.device, dtype=torch.float32)
        arguments = {name: arguments[name] for name in names}
        projections = lambda result, call, sizes=sizes: _projections(result[2], sizes)  # noqa: E731
        yield mf.format_check(part, arguments, sizes, SHAPES, judge=projections, returned=3)
        if not index:  # the dtype holds with a mask too, rows that allow no key among them (the first sizes)
            masked = {**arguments, "mask": mf.padding_only(sizes, part.device)}
            yield mf.format_check(part, masked, sizes, SHAPES, returned=3)
    if not part.hidden:  # (calls that raise: other sizes would add nothing)
        yield from _module_errors(part, VISIBLE)


def _projections(shapes: Any, sizes: Sizes) -> None:
    """Fail unless the weights of q_proj, k_proj, v_proj and o_proj have the ``shapes`` of ``sizes``."""
    right = projection_shapes(sizes)
    for name, shape in zip(PROJECTIONS, shapes, strict=True):
        if tuple(shape) != right[name]:
            h, g, dh, d = sizes.n_heads, sizes.n_kv_heads, sizes.d_head, sizes.d_model
            fail(
                f"{name}.weight has shape {list(shape)}, expected {list(right[name])} (d_model "
                f"{d}, n_heads {h}, n_kv_heads {g}, d_head {dh}).",
                "k_proj and v_proj give n_kv_heads * d_head features, one d_head block per "
                "key/value head; q_proj gives n_heads * d_head; o_proj maps them back to d_model",
            )


def _module_errors(part: Part, sizes: Sizes) -> Iterator[Check]:
    """The documented errors: ValueError of __init__ (n_heads not dividing d_model, n_kv_heads not dividing
    n_heads), TypeError of forward (a mask of 0/1 integers or floats)."""
    arguments = inputs(sizes, seed=28, device=part.device, dtype=torch.float32)
    plain = {name: arguments[name] for name in ("d_model", "n_heads", "n_kv_heads", "query", "key", "value")}
    mask = family.mask((sizes.q_len, sizes.k_len), seed=29, device=part.device)
    yield from mf.mask_errors(part, plain, mask, (torch.long, torch.float32))
    yield mf.n_heads_error(part, plain, sizes, TEXT["module sizes"], n_kv_heads=1)
    n_kv = next(n for n in range(2, sizes.n_heads) if sizes.n_heads % n)
    condition = f"from __init__ when n_kv_heads={n_kv} does not divide n_heads={sizes.n_heads}"
    call = part.call(**{**plain, "n_kv_heads": n_kv})
    yield engine.raises(call, "ValueError", condition, TEXT["module sizes"])


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
        for number, mask in enumerate(mf.masks(sizes, 30 + 10 * index, part.device)):
            bias = number != 1
            arguments = inputs(
                sizes, seed=30 + 10 * index, device=part.device, dtype=dtype, bias=bias, mask=mask
            )
            yield module_check(part, arguments, sizes)
    if not part.hidden:  # every query head its own key/value head: multi-head attention
        yield module_check(part, inputs(VISIBLE.kv(6), seed=60, device=part.device), VISIBLE.kv(6))
    # rows that allow no key, masks of each shape: zero weights (the course's rule, which SDPA lacks)
    wrong = mf.distinct(mistakes, forward)
    for index, sizes in enumerate(mf.cases(part, VISIBLE, HIDDEN)):
        # visible: each shape once; hidden: one shape per size, by turns
        for mask, dtype, seed in mf.empty_row_cases(part, sizes, index, 50):
            arguments = inputs(sizes, seed=seed, device=part.device, dtype=dtype, mask=mask)
            yield mf.module_check(part, arguments, sizes, forward, wrong, SHAPES, TEXT["rule"])


@behaviour(function="GroupedQueryAttention", points=1, hints=HINTS, driver=FORWARD)
def gqa_ladder(part: Part) -> Iterator[Check]:
    """The ends of the ladder: with n_kv_heads = n_heads the module is nn.MultiheadAttention given the same
    weights, with n_kv_heads = 1 multi-query attention, one key/value head broadcast over every query head."""
    for index, sizes in enumerate(mf.cases(part, VISIBLE, HIDDEN)):
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
        (2, 4, 64, 0, 3, "float16"),  # nothing cached yet
    ]
    if part.hidden:
        cases = [
            (80, 8, 128, 8192, 4, "bfloat16"),
            (6, 3, 10, 7, 5, "float64"),
            (12, 12, 64, 512, 8, "float32"),
            (0, 8, 128, 10, 1, "bfloat16"),
        ]
    names = ("n_layers", "n_kv_heads", "d_head", "seq_len", "batch")
    for *values, dtype in cases:
        sizes = dict(zip(names, values, strict=True))
        call = part.call(**sizes, dtype=dtype)
        yield Check(
            call,
            lambda result, call=call, sizes=sizes, dtype=dtype: _bytes(result, call, sizes, dtype),
            on_raise=TEXT["cache zero"] if 0 in sizes.values() else "",
        )
    # the docstring's ValueError: a negative size
    refused = [(2, 4, 64, -1, 3)] if not part.hidden else [(-2, 8, 128, 10, 1), (1, 2, 16, 5, -1)]
    for values in refused:
        sizes = dict(zip(names, values, strict=True))
        negative = next(f"{name}={value}" for name, value in sizes.items() if value < 0)
        call = part.call(**sizes, dtype="float16")
        yield engine.raises(call, "ValueError", f"for {negative}", TEXT["cache errors"])


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
    weights = a["in_proj_weight"].chunk(3)
    biases = a["in_proj_bias"].chunk(3) if a["in_proj_bias"] is not None else (None,) * 3
    rows = {"q_proj": (weights[0], biases[0])}
    rows |= {
        f"{n}_proj": (pooled(w, g, dh, how), None if b is None else pooled(b, g, dh, how))
        for n, w, b in zip("kv", weights[1:], biases[1:], strict=True)
    }
    converted = {
        f"{name}_{kind}": t
        for name, pair in rows.items()
        for kind, t in zip(("weight", "bias"), pair, strict=True)
    }
    converted |= {"o_proj_weight": a["out_proj_weight"], "o_proj_bias": a["out_proj_bias"]}
    return {**a, **converted, "mask": None}


def _mha_inputs(sizes: Sizes, *, seed: int, device, bias: bool = True) -> dict[str, Any]:
    """The arguments of a conversion: sizes, ``nn.MultiheadAttention``'s weights, query/key/value."""
    arguments = ex04.inputs(sizes, seed=seed, device=device, bias=bias)
    return {name: value for name, value in arguments.items() if name not in ("bias", "mask")}


@behaviour(function="gqa_from_mha", points=2, hints=CONVERT_HINTS, driver=CONVERT)
def gqa_from_mha_pools(part: Part) -> Iterator[Check]:
    """gqa_from_mha gives key/value head g the mean of mha's consecutive heads g r .. g r + r - 1 (weights and
    biases); with n_kv_heads = n_heads the result computes what mha computes."""
    cases = (
        ((VISIBLE, 2), (VISIBLE, 3), (VISIBLE, 6)) if not part.hidden else [(s, s.n_kv_heads) for s in HIDDEN]
    )
    for index, (sizes, n_kv) in enumerate(cases):
        at = sizes.kv(n_kv)
        bias = index != 1  # the second without biases: nn.MultiheadAttention(..., bias=False)
        arguments = _mha_inputs(at, seed=80 + 10 * index, device=part.device, bias=bias)
        yield _convert_check(part, {**arguments, "n_kv_heads": n_kv}, at)
    # the docstring's ValueError: n_kv_heads that does not divide n_heads; separate kdim/vdim projections
    sizes = VISIBLE if not part.hidden else HIDDEN[2]
    arguments = _mha_inputs(sizes, seed=89, device=part.device)
    n_kv = next(n for n in range(2, sizes.n_heads) if sizes.n_heads % n)
    condition = f"when n_kv_heads={n_kv} does not divide mha's {sizes.n_heads} heads"
    yield engine.raises(
        part.call(**arguments, n_kv_heads=n_kv), "ValueError", condition, TEXT["convert errors"]
    )
    call = part.call(**arguments, n_kv_heads=sizes.n_kv_heads, kdim=sizes.d_model // 2)
    condition = "when mha has keys and values of another width (kdim, vdim: no in_proj_weight)"
    yield engine.raises(call, "ValueError", condition, TEXT["convert errors"])


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
        output, weights = mf.module_pair((output, weights), call, sizes, SHAPES)
        expected = (
            forward(right)
            if sizes.n_kv_heads != sizes.n_heads
            else mf.torch_answer({**arguments, "mask": None})
        )
        note = TEXT["convert bias"] if arguments["in_proj_bias"] is None else ""
        for which, actual, index in (("weights", weights, 1), ("output", output, 0)):
            where = f"the {which} of the module of {call}"
            wrong_ = lambda index=index: wrong("out", index)  # noqa: E731
            assert_values(actual, expected[index], where, mistakes=wrong_, note=note)

    return Check(call, judge)
