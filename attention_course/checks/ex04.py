"""Checks of exercise ex04: heads split and merged, the multi-head module, its entropy and its size.

The module is judged against ``nn.MultiheadAttention`` given the same weights (the learner's
``load_torch_weights`` copies them), in float64, with every size different and ``q_len != k_len``. Its
known mistakes are rows (:class:`Heads`) of one parametrised computation, :func:`forward`, that also runs
the attention family's core mistakes inside each head.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from attention_course.checks import attention_family as family
from attention_course.checks import engine
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
    describe,
    fail,
    randn,
)
from attention_course.checks.module_family import Sizes

HINTS = family.exception_hints("""
shape '[ | is invalid for input of size: the sizes given to view()/reshape() do not multiply to the
    tensor's size: split d_model into (n_heads, d_head) with d_head = d_model // n_heads
load_torch_weights: write the method load_torch_weights(self, torch_mha) that copies the weights of
    nn.MultiheadAttention into your module and returns it
in_proj_weight | out_proj: nn.MultiheadAttention keeps W_q, W_k, W_v stacked in in_proj_weight [3 d_model,
    d_model] (with in_proj_bias) and W_O in out_proj (a Linear): see the task
""")
TEXT = (
    engine.table("""
split no transpose: the heads are split with view(batch, n_heads, len, d_head) and no transpose: head i then
    takes whole positions instead of features i*d_head..(i+1)*d_head-1 of each position; view as [batch, len,
    n_heads, d_head], then transpose(1, 2)
split strided: head i takes every n_heads-th feature (view [batch, len, d_head, n_heads]); it must take the
    block of features i*d_head..(i+1)*d_head-1: view as [batch, len, n_heads, d_head], then transpose(1, 2)
merge no transpose: the heads are merged with reshape(batch, len, d_model) and no transpose back: move the
    head axis next to d_head first, x.transpose(1, 2), then reshape
merge strided: the merged features are interleaved across heads: transpose(1, 2) to [batch, len, n_heads,
    d_head], then reshape to [batch, len, n_heads * d_head] (head 0's features first)
no output projection: the output projection W_O is missing: the concatenated heads go through w_o
transposed: the weight matrices are used transposed: nn.MultiheadAttention (like nn.Linear) stores
    [out_features, in_features] and computes x @ W^T + b; copy its weights into nn.Linear as they are
rule: The course's rule (chapter 3): a query whose mask row allows no key gets zero weights, so its
    attention is zero and the output there is w_o's bias alone.
split errors: check x.dim() == 3 and d_model % n_heads == 0 first and raise ValueError: otherwise view()
    raises a RuntimeError about sizes, or a tensor of another number of axes is split along the wrong one
merge errors: check x.dim() == 4 first and raise ValueError: a [batch, len, d_model] tensor (heads already
    merged) would otherwise be transposed and flattened into nonsense without an error
dtype kept: the result must keep the dtype of its input: a tensor made with torch.zeros/torch.empty (float32
    by default) and filled changes it: pass dtype=x.dtype and device=x.device, or use view/transpose/reshape
module n_heads: check in __init__ that n_heads divides d_model and raise ValueError, before the projections:
    otherwise the module only fails later in forward, with a RuntimeError of view()
load errors: load_torch_weights raises ValueError when torch_mha does not fit the module: another n_heads
    (the copies succeed, but every head gets the wrong columns) or biases on one side only; compare
    torch_mha.num_heads and torch_mha.in_proj_bias is None with the module's first
load returns: load_torch_weights returns the module, `return self` (so that `module.load_torch_weights(m)`
    can be chained)
no bias: the module has biases although bias=False: pass bias=bias to each nn.Linear
entropy dtype: the entropy keeps the dtype of the weights: a .double() inside must be undone, or use
    torch.xlogy on the weights as they are
count errors: check d_model >= 1 and d_model % n_heads == 0 first and raise ValueError, as the module does
""")
    | mf.MODULE_TEXT
)
SHAPES = engine.table("""
output batch n_heads q_len d_head: the heads are not merged: merge them back to [batch, q_len, d_model] and
    apply w_o
output batch q_len d_head: only one head is returned: merge all the heads, then apply w_o
weights batch q_len k_len: the weights are averaged over heads: return every head's, [batch, n_heads, q_len,
    k_len] (nn.MultiheadAttention's average_attn_weights=False)
weights bh q_len k_len: the heads are folded into the batch axis: return [batch, n_heads, q_len, k_len]
weights batch n_heads k_len q_len: the weights are [..., k_len, q_len]: the scores are q @ k^T
split batch n_heads len d_head: expected [batch, n_heads, len, d_head]
split batch len n_heads d_head: the head axis must come before the positions: transpose(1, 2) after view()
split n_heads batch len d_head: the batch axis must stay first: [batch, n_heads, len, d_head]
merge batch n_heads len d_head: the heads are not merged
merge batch len n_heads d_head: the last two axes must be merged into one: reshape to [batch, len, n_heads *
    d_head]
entropy batch n_heads q_len k_len: the entropy is a sum over the keys (dim=-1), one number per query
entropy batch n_heads k_len: the sum runs over the queries (dim=-2); each query's distribution is a row, the
    last axis
entropy batch n_heads: the entropy is one number per query: sum over the keys only, not over the queries
""")


# The learner's docstrings clause by clause, and the behaviours that check each (tests/test_contracts.py).
CONTRACT = engine.table("""
split_heads x: split_heads_layout; [batch, len, d_model] float32, float64 (visible), float16 (hidden), left
    unchanged
split_heads n_heads: split_heads_layout; 2 to 5 heads, d_head 4
split_heads returns: split_heads_layout; [batch, n_heads, len, d_head], head i holding features i * d_head ..
    (i + 1) * d_head - 1, x's dtype (that it is a view is not observable in a recording: not checked)
split_heads raises ValueError: split_heads_layout; n_heads that does not divide d_model, x of 1, 2 and 4 axes
merge_heads x: merge_heads_inverse; [batch, n_heads, len, d_head] float32, float64, float16, left unchanged
merge_heads returns: merge_heads_inverse; [batch, len, n_heads * d_head], head 0's features first, x's dtype
    (contiguity is not observable in a recording: not checked)
merge_heads raises ValueError: merge_heads_inverse; x of 2, 3 and 5 axes
MultiHeadAttention d_model: mha_shapes, mha_matches_torch, mha_gradients; 8 to 20, every size different
MultiHeadAttention n_heads: mha_shapes, mha_matches_torch; 2 to 5 heads
MultiHeadAttention bias: mha_matches_torch, mha_gradients; True (its default) and False: the same function
    as nn.MultiheadAttention(bias=False), 4 d_model^2 parameters
MultiHeadAttention raises ValueError: mha_shapes; n_heads that does not divide d_model
MultiHeadAttention.forward query: mha_shapes, mha_matches_torch; [batch, q_len, d_model], q_len != k_len,
    float64 and float32
MultiHeadAttention.forward key: mha_matches_torch, mha_gradients; [batch, k_len, d_model], gradients too
MultiHeadAttention.forward value: mha_matches_torch, mha_gradients; [batch, k_len, d_model], gradients too
MultiHeadAttention.forward mask: mha_matches_torch, mha_empty_rows; None, [q_len, k_len], [batch, q_len,
    k_len], [batch, 1, 1, k_len], [batch, n_heads, q_len, k_len]; rows that allow no key in each shape,
    float64 and float32, a sequence of padding only
MultiHeadAttention.forward returns: mha_shapes, mha_matches_torch, mha_empty_rows; (output [batch, q_len,
    d_model], weights [batch, n_heads, q_len, k_len]) as nn.MultiheadAttention(average_attn_weights=False),
    both in the query's dtype (float32, with and without a mask)
MultiHeadAttention.forward raises TypeError: mha_shapes; a mask of 0/1 integers, of 0/1 floats
MultiHeadAttention.load_torch_weights torch_mha: mha_matches_torch, mha_gradients; nn.MultiheadAttention with
    and without biases
MultiHeadAttention.load_torch_weights returns: mha_gradients; the module itself
MultiHeadAttention.load_torch_weights raises ValueError: mha_shapes; another n_heads, biases on one side only
MultiHeadAttention from scratch: mha_from_scratch; no F.scaled_dot_product_attention or nn.MultiheadAttention
attention_entropy weights: entropy_in_nats; [batch, n_heads, q_len, k_len], [batch, q_len, k_len], [q_len,
    k_len], float64 and float32, one-hot, uniform and zero rows
attention_entropy returns: entropy_in_nats; -sum_j w_j ln w_j in nats, [..., q_len], the weights' dtype
mha_parameter_count d_model: parameter_count; 768, 64, 20 and 12
mha_parameter_count n_heads: parameter_count; 12, 8, 5 and 3: the count does not depend on it
mha_parameter_count bias: parameter_count; True and False
mha_parameter_count returns: parameter_count; an int, 4 d_model^2 + 4 d_model (4 d_model^2 without biases)
mha_parameter_count raises ValueError: parameter_count; n_heads that does not divide d_model, d_model 0 and -8
""")

VISIBLE = Sizes(2, 5, 7, 12, 3)  # d_head 4
HIDDEN = (Sizes(3, 4, 6, 20, 5), Sizes(1, 6, 3, 8, 2), Sizes(2, 3, 5, 16, 4))


# --- the inputs: nn.MultiheadAttention's weights as data, and the drivers that load them


def inputs(sizes: Sizes, *, seed: int, device, dtype=torch.float64, bias=True, mask=None) -> dict[str, Any]:
    """The arguments of one call: sizes, weights, query/key/value ``[batch, len, d_model]``, ``mask``."""
    weights = mf.mha_weights(sizes, bias=bias, seed=seed + 10, device=device, dtype=dtype)
    tensors = mf.sequences(sizes, ("query", "key", "value"), seed=seed, device=device, dtype=dtype)
    sized = {"d_model": sizes.d_model, "n_heads": sizes.n_heads, "bias": bias}
    return {**sized, **weights, **tensors, "mask": mask}


def _forward(cls: Any, *, d_model, n_heads, bias=True, torch_mha=None, query, key, value, mask=None) -> Any:
    """Construct the learner's module, load the weights, and call it (the kernel)."""
    module = mf.learner_module(cls, d_model, n_heads, like=query, torch_mha=torch_mha, bias=bias)
    return module(query, key, value, mask)


def _gradients(cls: Any, *, d_model, n_heads, bias, torch_mha, query, key, value, mask, probe) -> Any:
    """The gradients of ``(output * probe).sum()``: of the inputs, and of every parameter; and what
    ``load_torch_weights`` returned, ``"the module"`` or the type of what else (the kernel)."""
    module = mf.learner_module(cls, d_model, n_heads, like=query, bias=bias)
    loaded = module.load_torch_weights(torch_mha)
    returned = "the module" if loaded is module else type(loaded).__name__
    inputs = [x.requires_grad_() for x in (query, key, value)]
    output = module(*inputs, mask)
    output = output[0] if isinstance(output, tuple | list) else output
    (output * probe).sum().backward()
    parameters = [(name, p.numel(), p.grad) for name, p in module.named_parameters()]
    return tuple(x.grad for x in inputs), parameters, returned


FORWARD, GRADIENTS = Driver(_forward, mf.prepare_mha), Driver(_gradients, mf.prepare_mha)


# --- the computation, and its known mistakes as rows


@dataclass(frozen=True)
class Heads:
    """A way of computing multi-head attention: the right one, or a known mistake (its ``hint``)."""

    hint: str = ""
    split: str = "right"  # "no transpose", "strided"
    merge: str = "right"  # "no transpose", "strided"
    out_proj: bool = True
    mask3: str = "unsqueeze"  # "as heads": a [batch, q_len, k_len] mask broadcast against the head axis
    transposed: bool = False  # every weight matrix used transposed (x @ W instead of x @ W^T)
    core: Variant = Variant()  # noqa: RUF009 (frozen): the attention core of each head


def forward(arguments: dict[str, Any], row: Heads = Heads()) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output, weights)`` of multi-head attention as ``row`` computes it, in float64 (check code)."""
    a = family.cast(arguments, torch.float64)
    d_model, n_heads = a["d_model"], a["n_heads"]
    d_head = d_model // n_heads
    biases = a["in_proj_bias"].chunk(3) if a["in_proj_bias"] is not None else (None,) * 3
    turn = (lambda w: w.T) if row.transposed else (lambda w: w)
    projected = [
        F.linear(a[name], turn(weight), bias)
        for name, weight, bias in zip(
            ("query", "key", "value"), a["in_proj_weight"].chunk(3), biases, strict=True
        )
    ]

    def split(x: torch.Tensor) -> torch.Tensor:  # [batch, len, d_model] -> [batch, n_heads, len, d_head]
        batch, length, _ = x.shape
        if row.split == "no transpose":
            return x.reshape(batch, n_heads, length, d_head)
        if row.split == "strided":
            return x.reshape(batch, length, d_head, n_heads).permute(0, 3, 1, 2)
        return x.reshape(batch, length, n_heads, d_head).transpose(1, 2)

    q, k, v = map(split, projected)
    mask = a.get("mask")
    if mask is not None and mask.dim() == 3:
        if row.mask3 == "as heads" and mask.size(0) not in (1, n_heads):
            raise ValueError("this mistake raises for these sizes")
        mask = mask.unsqueeze(1) if row.mask3 == "unsqueeze" else mask
    weights = family.weights(QKV(q, k, v, mask, d_model), row.core)  # [batch, n_heads, q_len, k_len]
    heads = weights @ v  # [batch, n_heads, q_len, d_head]
    batch, _, q_len, _ = heads.shape
    if row.merge == "no transpose":
        merged = heads.reshape(batch, q_len, d_model)
    elif row.merge == "strided":
        merged = heads.permute(0, 2, 3, 1).reshape(batch, q_len, d_model)
    else:
        merged = heads.transpose(1, 2).reshape(batch, q_len, d_model)
    output = F.linear(merged, turn(a["out_proj_weight"]), a["out_proj_bias"]) if row.out_proj else merged
    return output, weights


ROWS = (
    Heads(TEXT["split no transpose"], split="no transpose"),
    Heads(TEXT["split strided"], split="strided"),
    Heads(TEXT["merge no transpose"], merge="no transpose"),
    Heads(TEXT["merge strided"], merge="strided"),
    Heads(TEXT["no output projection"], out_proj=False),
    Heads(TEXT["scale d_model"], core=Variant(divide="sqrt(d_model)")),
    Heads(TEXT["mask 3d"], mask3="as heads"),
    Heads(TEXT["transposed"], transposed=True),
    *(Heads(variant.hint, core=variant) for variant in family.CORE if variant.divide != "sqrt(d_model)"),
)


def mistakes(arguments: dict[str, Any], index: int) -> Iterator[Mistake]:
    """The output (``index`` 0) or the weights (1) of each known mistake on ``arguments``."""
    return mf.row_mistakes(ROWS, forward, arguments, index)


def module_check(
    part: Part, arguments: dict[str, Any], sizes: Sizes, answer=mf.torch_answer, note=""
) -> Check:
    """One call of the module, against ``nn.MultiheadAttention`` (or ``answer``), mistakes named by rows."""
    return mf.module_check(part, arguments, sizes, answer, mf.distinct(mistakes, answer), SHAPES, note)


# --- the behaviours, in the notebook's order


@behaviour(function="split_heads", points=1, hints=HINTS)
def split_heads_layout(part: Part) -> Iterator[Check]:
    """split_heads gives [batch, n_heads, len, d_head], head i holding features i*d_head..(i+1)*d_head-1."""
    yield from _heads_checks(part, "split", seed=40)
    # the docstring's ValueError: n_heads that does not divide d_model, x not [batch, len, d_model]
    refused = [((2, 5, 12), 5), ((5, 12), 3), ((2, 3, 5, 12), 3)]
    if part.hidden:
        refused = [((3, 4, 20), 3), ((1, 6, 8), 3), ((20,), 5), ((1, 2, 3, 8), 2)]
    for shape, n_heads in refused:
        x = randn(shape, seed=45, device=part.device)
        condition = f"for x {describe(x)} and n_heads={n_heads}"
        yield engine.raises(part.call(x=x, n_heads=n_heads), "ValueError", condition, TEXT["split errors"])


@behaviour(function="merge_heads", points=1, hints=HINTS)
def merge_heads_inverse(part: Part) -> Iterator[Check]:
    """merge_heads undoes split_heads: [batch, n_heads, len, d_head] -> [batch, len, n_heads * d_head]."""
    yield from _heads_checks(part, "merge", seed=50)
    # the docstring's ValueError: x not [batch, n_heads, len, d_head] (3 axes: heads merged already)
    for shape in ((2, 5, 12), (2, 1, 3, 5, 4)) if not part.hidden else ((3, 4, 20), (6, 8), (1, 2, 2, 3, 4)):
        x = randn(shape, seed=55, device=part.device)
        condition = f"for x {describe(x)} (not [batch, n_heads, len, d_head])"
        yield engine.raises(part.call(x=x), "ValueError", condition, TEXT["merge errors"])


def _heads_checks(part: Part, kind: str, seed: int) -> Iterator[Check]:
    """The calls of split_heads (``kind`` "split") or merge_heads ("merge") on features of each sizes and
    dtype of the part (:func:`_heads_check`)."""
    for index, sizes in enumerate(mf.cases(part, VISIBLE, HIDDEN)):
        for dtype in (torch.float32, torch.float64) if not part.hidden else (torch.float64, torch.float16):
            shape = (sizes.batch, sizes.q_len, sizes.d_model)
            yield _heads_check(
                part, kind, randn(shape, seed=seed + index, device=part.device, dtype=dtype), sizes
            )


def _heads_check(part: Part, kind: str, features: torch.Tensor, sizes: Sizes) -> Check:
    """A call of split_heads (``kind`` "split") on ``features [batch, len, d_model]``, or of merge_heads
    ("merge") on their heads ``[batch, n_heads, len, d_head]`` (contiguous, as weights @ value makes them):
    the values, the known mistakes, then x's dtype, as the docstring promises."""
    b, length, h, dh = sizes.batch, sizes.q_len, sizes.n_heads, sizes.d_head
    heads = features.view(b, length, h, dh).transpose(1, 2)
    if kind == "split":
        x, right, call = features, heads, part.call(x=features, n_heads=h)
    else:
        x = heads.contiguous()
        right, call = features, part.call(x=x)

    def wrong() -> Iterator[Mistake]:
        if kind == "split":
            yield Mistake(TEXT["split no transpose"], x.reshape(b, h, length, dh))
            yield Mistake(TEXT["split strided"], x.reshape(b, length, dh, h).permute(0, 3, 1, 2))
        else:
            yield Mistake(TEXT["merge no transpose"], x.reshape(b, length, -1))
            yield Mistake(TEXT["merge strided"], x.permute(0, 2, 3, 1).reshape(b, length, -1))

    hints = mf.head_hints(SHAPES, sizes, kind)
    return mf.layout_check(call, x, right, wrong, hints, TEXT["dtype kept"], says="has dtype")


@behaviour(function="MultiHeadAttention", points=1, hints=HINTS, driver=FORWARD)
def mha_shapes(part: Part) -> Iterator[Check]:
    """The module returns (output [batch, q_len, d_model], weights [batch, n_heads, q_len, k_len]); each
    query's weights sum to 1."""
    sums = lambda result, call: mf.sums_to_one(result[1], call, "the keys")  # noqa: E731
    for index, sizes in enumerate(mf.cases(part, VISIBLE, HIDDEN)):
        arguments = inputs(sizes, seed=60 + 10 * index, device=part.device, dtype=torch.float32)
        arguments = {name: arguments[name] for name in ("d_model", "n_heads", "query", "key", "value")}
        yield mf.format_check(part, arguments, sizes, SHAPES, judge=sums)
        if not index:  # the dtype holds with a mask too, rows that allow no key among them (the first sizes)
            masked = {**arguments, "mask": mf.padding_only(sizes, part.device)}
            yield mf.format_check(part, masked, sizes, SHAPES)
    if not part.hidden:  # (calls that raise: other sizes would add nothing)
        yield from _module_errors(part, VISIBLE, seed=66)


def _module_errors(part: Part, sizes: Sizes, seed: int) -> Iterator[Check]:
    """The documented errors of the module: ValueError of __init__ (n_heads not dividing d_model) and of
    load_torch_weights (another n_heads, or biases on one side only), TypeError of forward (a mask of 0/1
    integers or floats)."""
    arguments = inputs(sizes, seed=seed, device=part.device)
    plain = {name: arguments[name] for name in ("d_model", "n_heads", "query", "key", "value")}
    mask = family.mask((sizes.q_len, sizes.k_len), seed=seed, device=part.device)
    yield from mf.mask_errors(part, plain, mask, (torch.long, torch.float64))
    yield mf.n_heads_error(part, plain, sizes, TEXT["module n_heads"])
    other = next(n for n in range(1, sizes.d_model + 1) if sizes.d_model % n == 0 and n != sizes.n_heads)
    condition = f"from load_torch_weights when torch_mha has n_heads={other} and the module {sizes.n_heads}"
    yield engine.raises(
        part.call(**arguments, torch_n_heads=other), "ValueError", condition, TEXT["load errors"]
    )
    unbiased = inputs(sizes, seed=seed, device=part.device, bias=False)
    condition = "from load_torch_weights when the module has biases (bias=True) and torch_mha none"
    call = part.call(**{**unbiased, "bias": True})
    yield engine.raises(call, "ValueError", condition, TEXT["load errors"])


@behaviour(function="MultiHeadAttention", points=3, hints=HINTS, driver=FORWARD)
def mha_matches_torch(part: Part) -> Iterator[Check]:
    """Given nn.MultiheadAttention's weights (load_torch_weights), the module computes what it computes, with
    and without biases and masks of each shape (True = may attend)."""
    cases = (
        ((VISIBLE, torch.float64),)
        if not part.hidden
        else [(s, d) for s in HIDDEN for d in (torch.float64, torch.float32)]
    )
    for index, (sizes, dtype) in enumerate(cases):
        for number, mask in enumerate(mf.masks(sizes, 70 + 10 * index, part.device)):
            bias = number != 1
            arguments = inputs(
                sizes, seed=70 + 10 * index, device=part.device, dtype=dtype, bias=bias, mask=mask
            )
            yield module_check(part, arguments, sizes)


@behaviour(function="MultiHeadAttention", points=1, hints=HINTS, driver=FORWARD)
def mha_empty_rows(part: Part) -> Iterator[Check]:
    """A query whose mask allows no key gets zero weights and a zero attention (chapter 3's rule); the other
    rows are unchanged."""
    for index, sizes in enumerate(mf.cases(part, VISIBLE, HIDDEN)):
        # visible: each shape once; hidden: one by turns, [batch, q_len, k_len] in float64 first
        for mask, dtype, seed in mf.empty_row_cases(part, sizes, index, 90):
            arguments = inputs(sizes, seed=seed, device=part.device, dtype=dtype, mask=mask)
            yield module_check(part, arguments, sizes, forward, note=TEXT["rule"])


@behaviour(function="MultiHeadAttention", points=1, hints=HINTS, driver=GRADIENTS)
def mha_gradients(part: Part) -> Iterator[Check]:
    """Gradients flow to the query, key and value as through nn.MultiheadAttention, and to every parameter;
    the module has 4 d_model^2 + 4 d_model parameters."""
    for index, sizes in enumerate(mf.cases(part, VISIBLE, HIDDEN)):
        mask = torch.ones(sizes.batch, 1, 1, sizes.k_len, dtype=torch.bool, device=part.device)
        mask[0, ..., -1] = False  # padding: the first sequence is one key shorter (every row keeps 2 or more)
        for bias in (True, False) if index == 0 else (index == 1,):  # without biases: 4 d_model^2
            arguments = inputs(sizes, seed=100 + 10 * index, device=part.device, mask=mask, bias=bias)
            probe = randn((sizes.batch, sizes.q_len, sizes.d_model), seed=109 + index, device=part.device)
            yield _gradient_check(part, {**arguments, "probe": probe}, sizes)


def _gradient_check(part: Part, arguments: dict[str, Any], sizes: Sizes) -> Check:
    call = part.call(**arguments)

    def judge(result: Any) -> None:
        if not isinstance(result, tuple) or len(result) != 3:
            fail(f"{call} returned no gradients.", "the module's forward does not return (output, weights)")
        grads, parameters, returned = result
        names = ("query", "key", "value")
        leaves = {name: arguments[name].detach().double().requires_grad_() for name in names}
        blocked = mf.blocked(arguments["mask"], (sizes.batch, sizes.n_heads, sizes.q_len, sizes.k_len))
        torch_mha = mf.torch_mha(family.cast(arguments, torch.float64))
        output, _ = torch_mha(*leaves.values(), need_weights=False, attn_mask=blocked)
        (output * arguments["probe"].double()).sum().backward()
        for name, grad in zip(names, grads, strict=True):
            if not isinstance(grad, torch.Tensor):
                fail(
                    f"no gradient reaches the {name} through {call}.",
                    "the computation leaves autograd: .detach(), .data, torch.no_grad(), .numpy() or .item()",
                )
            assert_values(grad, leaves[name].grad, f"the gradient of the {name} through {call}")
        bias, d = arguments["bias"], sizes.d_model
        expected, formula = (
            (4 * d * d + 4 * d, "4 d_model^2 + 4 d_model") if bias else (4 * d * d, "4 d_model^2")
        )
        total = sum(int(n) for _, n, _ in parameters)
        if total != expected:
            cause = (
                "the projections are not nn.Linear(d_model, d_model) modules (or nn.Parameter) of the module"
            )
            cause = TEXT["no bias"] if not bias and total == 4 * d * d + 4 * d else cause
            fail(f"the module has {total} parameters, expected {formula} = {expected} (bias={bias}).", cause)
        if returned != "the module":
            fail(f"load_torch_weights returned {returned}, not the module, in {call}.", TEXT["load returns"])
        # (the key bias's gradient is 0: it shifts a row's scores alike)
        cause = "it is not used in forward, or is frozen (requires_grad=False), or used through .data"
        mf.gradients_reach(parameters, call, cause)

    return Check(call, judge)


@behaviour(function="MultiHeadAttention", points=1, hints=HINTS, driver=FORWARD)
def mha_from_scratch(part: Part) -> Iterator[Check]:
    """The module is correct and calls no built-in attention (F.scaled_dot_product_attention,
    nn.MultiheadAttention's forward)."""
    cases = mf.cases(part, VISIBLE, HIDDEN)
    masks = lambda sizes, seed, device: mf.masks(sizes, seed, device)[:2]  # noqa: E731 (None, [q_len, k_len])
    return mf.from_scratch(part, "multi-head attention", mha_matches_torch, cases, inputs, masks, seed=120)


@behaviour(function="attention_entropy", points=1, hints=HINTS)
def entropy_in_nats(part: Part) -> Iterator[Check]:
    """attention_entropy is -sum_j w_j ln w_j per head and query, in nats: 0 for one-hot rows and for rows
    of zeros, ln(k_len) for uniform rows."""
    for index, sizes in enumerate(mf.cases(part, VISIBLE, HIDDEN)):
        shape = (sizes.batch, sizes.n_heads, sizes.q_len, sizes.k_len)
        scores = randn(shape, seed=110 + index, device=part.device) * 2
        weights = torch.softmax(scores, dim=-1)
        weights[..., 0, :] = 0.0  # one-hot
        weights[..., 0, 1] = 1.0
        weights[..., 1, :] = 1 / sizes.k_len  # uniform
        weights[:, :, -1] = 0.0  # a query with no allowed key
        for dtype in (torch.float64, torch.float32):
            yield _entropy_check(part, weights.to(dtype), sizes)
        # [..., q_len, k_len]: fewer leading axes too, [batch, q_len, k_len] and [q_len, k_len]
        yield _entropy_check(part, weights[:, index % sizes.n_heads], sizes)
        yield _entropy_check(part, weights[-1, 0], sizes)


def _entropy_check(part: Part, weights: torch.Tensor, sizes: Sizes) -> Check:
    call = part.call(weights=weights)
    wide = weights.double()
    right = -torch.where(wide > 0, wide * wide.clamp_min(1e-300).log(), 0.0).sum(-1)

    def wrong() -> Iterator[Mistake]:
        yield Mistake(
            "the entropy is in bits (log2): use the natural logarithm (torch.log), nats", right / math.log(2)
        )
        yield Mistake("the sign is missing: H = -sum_j w_j ln w_j is non-negative", -right)
        yield Mistake("the mean over the keys is taken instead of the sum", right / sizes.k_len)
        yield Mistake(
            "0 ln 0 gives NaN (0 * -inf): count it as 0, its limit: torch.xlogy(w, w), or torch.where(w > 0,"
            " ...)",
            torch.where(wide == 0, math.nan, 1.0).amax(-1) * right,
        )

    def judge(result: Any) -> None:
        hints = mf.head_hints(SHAPES, sizes, "entropy") if weights.dim() == 4 else {}
        assert_values(
            result, right, f"the result of {call}", dtype=weights.dtype, mistakes=wrong, hints=hints
        )
        if result.dtype != weights.dtype:
            fail(
                f"the result of {call} is {result.dtype} where the weights are {weights.dtype}.",
                TEXT["entropy dtype"],
            )

    return Check(call, judge, untouched=True)


@behaviour(function="mha_parameter_count", points=1, hints=HINTS)
def parameter_count(part: Part) -> Iterator[Check]:
    """mha_parameter_count gives 4 d_model^2 + 4 d_model (4 d_model^2 without biases): BERT-base's layer has
    2,362,368, as nn.MultiheadAttention(768, 12)."""
    cases = (
        ((768, 12, True), (768, 12, False))
        if not part.hidden
        else ((64, 8, True), (12, 3, False), (20, 5, True))
    )
    for d_model, n_heads, bias in cases:
        call = part.call(d_model=d_model, n_heads=n_heads, bias=bias)
        yield Check(
            call, lambda result, call=call, d=d_model, h=n_heads, bias=bias: _count(result, call, d, h, bias)
        )
    # the docstring's ValueError: n_heads that does not divide d_model, d_model below 1
    for d_model, n_heads in ((10, 4), (0, 1)) if not part.hidden else ((12, 5), (0, 3), (-8, 2)):
        condition = f"for d_model={d_model}, n_heads={n_heads}"
        yield engine.raises(
            part.call(d_model=d_model, n_heads=n_heads), "ValueError", condition, TEXT["count errors"]
        )


def _count(result: Any, call: Call, d: int, h: int, bias: bool) -> None:
    right = 4 * d * d + (4 * d if bias else 0)
    if isinstance(result, int) and not isinstance(result, bool) and result == right:
        return
    wrong = {
        3 * d * d + (3 * d if bias else 0): "only three projections are counted: W_O (d_model x d_model) too",
        4 * d * d + 4 * d: "biases are counted although bias=False",
        4 * d * d: "the biases are missing: four of d_model each",
        4 * d * d + d: "only one bias is counted: each of the four projections has d_model",
        4 * d * (d // h)
        + (4 * d // h if bias else 0): "one head's projections are counted: the heads share out the "
        "d_model columns, so the count does not depend on n_heads",
        4 * h * d * d
        + (4 * h * d if bias else 0): "each head is counted with full-width projections: head i "
        "uses d_head = d_model // n_heads columns of each",
    }
    cause = wrong.get(result, "") if isinstance(result, int) else "return an int"
    fail(f"{call} returned {result!r}, expected {right:,}.", cause, expected=str(right), got=repr(result))


def carried_over(part: Part, seed: int) -> Iterator[Check]:
    """The checks of a later exercise's ``MultiHeadAttention``, carried over from this one: the module against
    ``nn.MultiheadAttention``, no mask and a ``[batch, q_len, k_len]`` one (every mask in the hidden part)."""
    for index, sizes in enumerate(mf.cases(part, VISIBLE, HIDDEN)):
        for number, mask in enumerate(mf.masks(sizes, seed + 10 * index, part.device)):
            if part.hidden or number in (0, 2):
                arguments = inputs(sizes, seed=seed + 10 * index, device=part.device, mask=mask)
                yield module_check(part, arguments, sizes)
