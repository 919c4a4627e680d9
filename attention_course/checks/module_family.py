"""What the exercises on modules of several heads (ex04 to ex07) check alike: sizes, weights, the judge.

A call's :class:`Sizes` have every axis a different size, and its arguments are data: the weights of linear
layers (:func:`linear_weights`; ``nn.MultiheadAttention``'s, :func:`mha_weights`; a PyTorch transformer
layer's, :func:`layer_weights`) and inputs ``[batch, len, d_model]`` (:func:`sequences`). In the learner's
process a driver builds the learner's module from them (:func:`learner_module`, :func:`load_projections`,
:func:`load_torch_layer`) and PyTorch's (:func:`prepare_mha`, :func:`prepare_layer`); a judge builds
PyTorch's again for the answer (:func:`torch_answer`, :func:`torch_layer`) and computes a transformer layer's
mistakes as rows (:func:`residuals`). :func:`module_check` judges one call: the ``(output, weights)`` pair,
its shapes (likely causes: an exercise's table, :func:`head_hints`), then its values, a mismatch named by the
exercise's mistake rows (:func:`row_mistakes`, :func:`distinct`). The masks (:func:`masks`,
:func:`empty_row_masks`, :func:`padding_only`), the cells' checks of layouts, shapes and dtypes
(:func:`layout_check`, :func:`format_check`), the documented errors (:func:`mask_errors`,
:func:`n_heads_error`) and the cell on built-in attention (:func:`from_scratch`) are the same in each.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attention_course.checks import attention_family as family
from attention_course.checks import engine
from attention_course.checks.engine import (
    Behaviour,
    Call,
    Check,
    Mistake,
    Part,
    assert_shape,
    dtype_name,
    fail,
    randn,
)

MODULE_TEXT = engine.table("""
scale d_model: the scores are divided by sqrt(d_model); each head's scale is 1/sqrt(d_head), the width of its
    own queries and keys (d_head = d_model // n_heads)
mask 3d: a [batch, q_len, k_len] mask must get an axis for the heads, mask.unsqueeze(1), so that it
    broadcasts over the scores [batch, n_heads, q_len, k_len]; without it the batch axis meets the heads
module dtype: the weights and the output keep the dtype of the query: a .double()/.float() inside (for a
    stable softmax, say) must be undone with .to(query.dtype) on every result, the weights too
module mask dtype: check mask.dtype != torch.bool first and raise TypeError: a 0/1 integer or float mask
    would be accepted by `mask == 0` or logical_not(), and ~ of an integer mask is no mask at all
""")
# nn.MultiheadAttention's weights as the arguments of a call name them (out_proj_weight: out_proj.weight)
MHA_WEIGHTS = ("in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias")
LAYER_CHILDREN = ("linear1", "linear2", "norm1", "norm2", "norm3")  # what a layer's state dicts load
LAYER_ATTENTIONS = {"self_attn": "self_attn", "cross_attn": "multihead_attn"}  # the learner's -> PyTorch's


@dataclass(frozen=True)
class Sizes:
    """The sizes of one call of a module (every one different from the others within a case): ``q_len`` the
    queries' (the target's; a block's length), ``k_len`` the keys' (the source's); ``n_kv_heads`` the
    key/value heads of grouped-query attention, ``d_ff`` the width of a layer's feed-forward network (0
    where there are none)."""

    batch: int
    q_len: int
    k_len: int
    d_model: int
    n_heads: int
    n_kv_heads: int = 0
    d_ff: int = 0

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def kv(self, n_kv_heads: int) -> Sizes:
        """These sizes with ``n_kv_heads`` key/value heads."""
        return replace(self, n_kv_heads=n_kv_heads)


def cases(part: Part, visible: Sizes, hidden: Sequence[Sizes]) -> Sequence[Sizes]:
    """The sizes of a cell's part: ``visible`` alone, or the ``hidden`` part's."""
    return hidden if part.hidden else (visible,)


def head_hints(rows: dict[str, str], sizes: Sizes, kind: str) -> dict[tuple[int, ...], str]:
    """Likely causes of a wrong shape of ``kind`` (``"output"``, ``"weights"``, ...): the rows ``<kind>
    <axes>`` of the :func:`~attention_course.checks.engine.table` ``rows``, whose axes are the sizes' names
    (``batch``, ``q_len``, ``k_len``, ``d_model``, ``n_heads``, ``d_head``), ``n_kv`` (the key/value heads),
    ``bh`` (``batch * n_heads``), ``len`` (``q_len``), ``tgt_len`` and ``src_len`` (``q_len``, ``k_len``)."""
    axes = {
        name: getattr(sizes, name) for name in ("batch", "q_len", "k_len", "d_model", "n_heads", "d_head")
    }
    axes |= {"n_kv": sizes.n_kv_heads or sizes.n_heads, "bh": sizes.batch * sizes.n_heads, "len": sizes.q_len}
    return engine.shapes(rows, kind, **axes, tgt_len=sizes.q_len, src_len=sizes.k_len)


# ==================================================================================================
# weights and inputs as data


def linear_weights(
    shapes: dict[str, tuple[int, int]], *, bias: bool, seed: int, device, dtype=torch.float64
) -> dict[str, torch.Tensor | None]:
    """``{<name>_weight, <name>_bias, ...}`` of linear layers ``{name: (out_features, in_features)}``, drawn
    with a scale of 1/sqrt(in_features) (layer ``i`` from seeds ``seed + 2 i`` and ``seed + 2 i + 1``); the
    biases are ``None`` without ``bias``."""
    weights = {}
    for i, (name, shape) in enumerate(shapes.items()):
        scale = 1 / math.sqrt(shape[1])
        weights[f"{name}_weight"] = randn(shape, seed=seed + 2 * i, device=device, dtype=dtype) * scale
        drawn = randn(shape[:1], seed=seed + 2 * i + 1, device=device, dtype=dtype) * scale
        weights[f"{name}_bias"] = drawn if bias else None
    return weights


def mha_weights(sizes: Sizes, *, bias: bool, seed: int, device, dtype=torch.float64) -> dict[str, Any]:
    """Weights of ``nn.MultiheadAttention(d_model, n_heads)`` (:data:`MHA_WEIGHTS`): ``in_proj_weight [3
    d_model, d_model]`` (W_q, W_k, W_v stacked), ``out_proj_weight [d_model, d_model]`` and their biases."""
    d = sizes.d_model
    shapes = {"in_proj": (3 * d, d), "out_proj": (d, d)}
    return linear_weights(shapes, bias=bias, seed=seed, device=device, dtype=dtype)


def sequences(
    sizes: Sizes, names: Sequence[str], *, seed: int, device, dtype=torch.float64
) -> dict[str, torch.Tensor]:
    """N(0, 1) inputs ``[batch, len, d_model]`` named ``names`` (seeds ``seed``, ``seed + 1``, ...): the first
    ``q_len`` long (the queries, the target, x), the others ``k_len`` (keys and values, the source)."""
    return {
        name: randn(
            (sizes.batch, sizes.k_len if i else sizes.q_len, sizes.d_model),
            seed=seed + i,
            device=device,
            dtype=dtype,
        )
        for i, name in enumerate(names)
    }


def layer_weight_names(attentions: Sequence[str], n_norms: int) -> tuple[str, ...]:
    """The names of :func:`layer_weights`, in drawing order: ``<p>_in_w, <p>_in_b, <p>_out_w, <p>_out_b`` for
    each attention ``p``, then ``linear1_w`` to ``linear2_b``, then ``norm<n>_w, norm<n>_b``."""
    names = [f"{p}_{kind}_{wb}" for p in attentions for kind in ("in", "out") for wb in ("w", "b")]
    names += [f"linear{n}_{wb}" for n in (1, 2) for wb in ("w", "b")]
    return (*names, *(f"norm{n}_{wb}" for n in range(1, n_norms + 1) for wb in ("w", "b")))


def layer_weights(
    sizes: Sizes, attentions: Sequence[str], n_norms: int, *, seed: int, device, dtype=torch.float64
) -> dict[str, torch.Tensor]:
    """Weights of a PyTorch transformer layer (``nn.TransformerEncoderLayer``: attention ``("self",)`` and 2
    norms; ``nn.TransformerDecoderLayer``: ``("self", "cross")`` and 3), drawn with a scale of 1/sqrt(fan_in),
    the layer norms' near 1 and 0."""
    d, f = sizes.d_model, sizes.d_ff
    shapes = {"in_w": (3 * d, d), "in_b": (3 * d,), "out_w": (d, d), "out_b": (d,)}
    shapes = {f"{p}_{name}": shape for p in attentions for name, shape in shapes.items()}
    shapes |= {"linear1_w": (f, d), "linear1_b": (f,), "linear2_w": (d, f), "linear2_b": (d,)}
    found = {
        name: randn(shape, seed=seed + i, device=device, dtype=dtype) / math.sqrt(shape[-1])
        for i, (name, shape) in enumerate(shapes.items())
    }
    for i in range(n_norms):
        found[f"norm{i + 1}_w"] = 1 + 0.3 * randn((d,), seed=seed + 20 + 2 * i, device=device, dtype=dtype)
        found[f"norm{i + 1}_b"] = 0.3 * randn((d,), seed=seed + 21 + 2 * i, device=device, dtype=dtype)
    return found


def layer_attention(layer: dict[str, Any], prefix: str, query, memory, mask) -> dict[str, Any]:
    """The arguments of a multi-head attention call (ex04's, with :data:`MHA_WEIGHTS`) that a layer's
    attention ``prefix`` (``"self"``, ``"cross"``) makes of ``query`` and ``memory`` (its keys and values),
    from the layer's arguments (:func:`layer_weights`)."""
    shorts = ("in_w", "in_b", "out_w", "out_b")
    weights = {name: layer[f"{prefix}_{short}"] for name, short in zip(MHA_WEIGHTS, shorts, strict=True)}
    sized = {"d_model": layer["d_model"], "n_heads": layer["n_heads"]}
    return {**sized, **weights, "query": query, "key": memory, "value": memory, "mask": mask}


# ==================================================================================================
# the masks


def masks(sizes: Sizes, seed: int, device) -> list[torch.Tensor | None]:
    """No mask, one ``[q_len, k_len]``, one per sequence ``[batch, q_len, k_len]``, a padding mask."""
    q, k, b = sizes.q_len, sizes.k_len, sizes.batch
    return [
        None,
        family.mask((q, k), seed=seed, device=device),
        family.mask((b, q, k), seed=seed + 1, device=device),
        family.mask((b, 1, 1, k), seed=seed + 2, device=device),
    ]


def empty_row_masks(sizes: Sizes, seed: int, device) -> list[tuple[torch.Tensor, torch.dtype]]:
    """Masks with rows that allow no key, of each accepted shape, and the dtype to try each in: ``[batch,
    q_len, k_len]`` (float64 and float32), a padding mask ``[batch, 1, 1, k_len]`` whose first sequence is
    all padding, ``[q_len, k_len]`` and one per head, ``[batch, n_heads, q_len, k_len]``."""
    b, h, q, k = sizes.batch, sizes.n_heads, sizes.q_len, sizes.k_len
    per_sequence = family.mask((b, q, k), seed=seed, device=device, kind="empty rows")
    padding = padding_only(sizes, device)
    padding[1:, ..., -1] = False  # (the others one key shorter)
    return [
        (per_sequence, torch.float64),
        (per_sequence, torch.float32),
        (padding, torch.float32),
        (family.mask((q, k), seed=seed + 3, device=device, kind="empty rows"), torch.float64),
        (family.mask((b, h, q, k), seed=seed + 5, device=device, kind="empty rows"), torch.float64),
    ]


def empty_row_cases(
    part: Part, sizes: Sizes, index: int, seed: int, visible=(1, 2, 3, 4), hidden=(0, 2, 4)
) -> Iterator[tuple[torch.Tensor, torch.dtype, int]]:
    """The masks of :func:`empty_row_masks` that a cell tries on ``sizes``, the ``index``-th of its part, each
    with its dtype and the seed of its inputs: those numbered ``visible`` in the visible part, one by turns
    (``hidden[index]``) in the hidden part."""
    tried = empty_row_masks(sizes, seed + index, part.device)
    for number in visible if not part.hidden else (hidden[index],):
        yield *tried[number], seed + 10 * index + number


def padding_only(sizes: Sizes, device) -> torch.Tensor:
    """A padding mask ``[batch, 1, 1, k_len]`` whose first sequence is padding only: its queries attend to
    no key."""
    mask = torch.ones(sizes.batch, 1, 1, sizes.k_len, dtype=torch.bool, device=device)
    mask[0] = False
    return mask


def head_axis(mask: torch.Tensor | None) -> torch.Tensor | None:
    """``mask`` with an axis for the heads if it is ``[batch, q_len, k_len]`` (the same for every head)."""
    return mask.unsqueeze(1) if mask is not None and mask.dim() == 3 else mask


def blocked(mask: torch.Tensor | None, shape: tuple[int, int, int, int]) -> torch.Tensor | None:
    """``nn.MultiheadAttention``'s ``attn_mask [batch * n_heads, q_len, k_len]`` (True = blocked) for the
    course's ``mask`` (True = may attend) broadcast to ``shape``, ``(batch, n_heads, q_len, k_len)``."""
    if mask is None:
        return None
    return ~head_axis(mask).expand(shape).reshape(shape[0] * shape[1], *shape[2:])


# ==================================================================================================
# modules built from the weights: the learner's (in the kernel, by a driver) and PyTorch's


def learner_module(cls: Any, *sizes: int, like: torch.Tensor, torch_mha: Any = None, **options: Any) -> Any:
    """The learner's ``cls(*sizes, **options)`` in the dtype and on the device of ``like``, given the weights
    of ``torch_mha`` by its ``load_torch_weights`` when there is one (the kernel)."""
    module = cls(*sizes, **options).to(dtype=like.dtype, device=like.device)
    if torch_mha is not None:
        module.load_torch_weights(torch_mha)
    return module


def load_projections(module: Any, weights: dict[str, torch.Tensor | None]) -> Any:
    """Copy ``{<projection>_weight, <projection>_bias, ...}`` (a bias ``None``: none) into the learner's
    ``module``'s linear projections; one that does not fit raises ValueError (the kernel)."""
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


def load_torch_layer(layer: Any, torch_layer: nn.Module) -> Any:
    """Copy a PyTorch transformer layer's weights into the learner's ``layer``: each attention with its
    ``load_torch_weights`` (:data:`LAYER_ATTENTIONS`), then the state dicts of :data:`LAYER_CHILDREN` that
    PyTorch's layer has (the kernel)."""
    for mine, theirs in LAYER_ATTENTIONS.items():
        if hasattr(torch_layer, theirs):
            getattr(layer, mine).load_torch_weights(getattr(torch_layer, theirs))
    for name in LAYER_CHILDREN:
        if hasattr(torch_layer, name):
            getattr(layer, name).load_state_dict(getattr(torch_layer, name).state_dict())
    return layer


def torch_mha(arguments: dict[str, Any]) -> nn.MultiheadAttention:
    """``nn.MultiheadAttention(batch_first=True)`` with the weights of ``arguments`` (``torch_n_heads``: its
    number of heads where it differs from the module's ``n_heads``)."""
    weight, bias = arguments["in_proj_weight"], arguments["in_proj_bias"]
    mha = nn.MultiheadAttention(
        arguments["d_model"],
        arguments.get("torch_n_heads") or arguments["n_heads"],
        bias=bias is not None,
        batch_first=True,
        device=weight.device,
        dtype=weight.dtype,
    )
    with torch.no_grad():
        mha.in_proj_weight.copy_(weight)
        mha.out_proj.weight.copy_(arguments["out_proj_weight"])
        if bias is not None:
            mha.in_proj_bias.copy_(bias)
            mha.out_proj.bias.copy_(arguments["out_proj_bias"])
    return mha


def prepare_mha(**arguments: Any) -> dict[str, Any]:
    """A driver's ``prepare``: the arguments without the weights, and ``torch_mha``, the
    ``nn.MultiheadAttention`` they make (``None`` for a call without weights)."""
    mha = torch_mha(arguments) if "in_proj_weight" in arguments else None
    rest = {name: value for name, value in arguments.items() if name not in (*MHA_WEIGHTS, "torch_n_heads")}
    return {**rest, "torch_mha": mha}


def torch_answer(arguments: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``nn.MultiheadAttention``'s output and every head's weights, in float64, the mask converted."""
    wide = family.cast(arguments, torch.float64)
    query, key = wide["query"], wide["key"]
    shape = (query.size(0), wide["n_heads"], query.size(1), key.size(1))
    with torch.no_grad():
        return torch_mha(wide)(
            query, key, wide["value"], attn_mask=blocked(wide.get("mask"), shape), average_attn_weights=False
        )


def torch_layer(
    cls: type[nn.Module], arguments: dict[str, Any], attentions: dict[str, str], **options
) -> Any:
    """PyTorch's layer ``cls`` (``nn.TransformerEncoderLayer``, ``nn.TransformerDecoderLayer``) with the
    :func:`layer_weights` of ``arguments``, ``batch_first``, in eval mode; ``attentions`` maps each prefix to
    the layer's ``nn.MultiheadAttention`` attribute (``{"self": "self_attn", "cross": "multihead_attn"}``),
    ``options`` go to ``cls``."""
    layer = cls(
        arguments["d_model"],
        arguments["n_heads"],
        arguments["d_ff"],
        batch_first=True,
        norm_first=arguments["norm_first"],
        device=arguments["x"].device,
        dtype=arguments["self_in_w"].dtype,
        **options,
    )
    with torch.no_grad():
        for prefix, name in attentions.items():
            attention = getattr(layer, name)
            attention.in_proj_weight.copy_(arguments[f"{prefix}_in_w"])
            attention.in_proj_bias.copy_(arguments[f"{prefix}_in_b"])
            attention.out_proj.weight.copy_(arguments[f"{prefix}_out_w"])
            attention.out_proj.bias.copy_(arguments[f"{prefix}_out_b"])
        for name, module in layer.named_children():
            if f"{name}_w" in arguments:  # linear1, linear2, norm1, ...
                module.weight.copy_(arguments[f"{name}_w"])
                module.bias.copy_(arguments[f"{name}_b"])
    return layer.eval()


def prepare_layer(build: Callable[[dict[str, Any]], nn.Module], names: Sequence[str]) -> Callable[..., dict]:
    """A driver's ``prepare``: the arguments without the layer weights ``names``, and ``torch_layer``, the
    PyTorch layer that ``build(arguments)`` makes (``None`` for a call without weights: a documented
    error)."""

    def prepare(**arguments: Any) -> dict[str, Any]:
        rest = {name: value for name, value in arguments.items() if name not in names}
        return {**rest, "torch_layer": build(arguments) if names[0] in arguments else None}

    return prepare


# ==================================================================================================
# the computation of a transformer layer (check code, float64)


def layer_norm(weights: dict[str, Any], n: int, x: torch.Tensor) -> torch.Tensor:
    """``x`` through the layer norm ``norm<n>`` of :func:`layer_weights`."""
    return F.layer_norm(x, x.shape[-1:], weights[f"norm{n}_w"], weights[f"norm{n}_b"])


def feed_forward(weights: dict[str, Any], x: torch.Tensor, activation: Callable) -> torch.Tensor:
    """``linear2(activation(linear1(x)))`` with the weights of :func:`layer_weights`."""
    hidden = activation(F.linear(x, weights["linear1_w"], weights["linear1_b"]))
    return F.linear(hidden, weights["linear2_w"], weights["linear2_b"])


def residuals(
    weights: dict[str, Any],
    sublayers: Sequence[Callable[[torch.Tensor], torch.Tensor]],
    row: Any,
    kept: Sequence[bool],
) -> torch.Tensor:
    """``weights["x"]`` through ``sublayers`` in order, each with its residual connection where ``kept`` and
    the layer norm ``norm<row.norms[i]>``: pre-LN ``x + sublayer(norm(x))``, post-LN ``norm(x +
    sublayer(x))``, the last norm left out without ``row.final_norm``. ``row.norm_first``: ``"as given"``
    (the argument ``norm_first``), ``"ignored"`` (always post-LN) or ``"inverted"``."""
    given = weights["norm_first"]
    pre = given if row.norm_first == "as given" else row.norm_first == "inverted" and not given
    x = weights["x"]
    for i, (sublayer, keep, n) in enumerate(zip(sublayers, kept, row.norms, strict=True)):
        residual = x if keep else 0
        if pre:
            x = residual + sublayer(layer_norm(weights, n, x))
        else:
            x = residual + sublayer(x)
            x = layer_norm(weights, n, x) if (i < len(sublayers) - 1 or row.final_norm) else x
    return x


# ==================================================================================================
# the judge of a module's call, its known mistakes


def row_mistakes(
    rows: Sequence[Any],
    compute: Callable[[dict[str, Any], Any], tuple],
    arguments: dict[str, Any],
    index: int,
) -> Iterator[Mistake]:
    """The output (``index`` 0) or the weights (1) that ``compute(arguments, row)`` gives for each mistake row
    (rows with a ``core`` :class:`~attention_course.checks.attention_family.Variant` and a ``mask3`` field); a
    row about masks is skipped without one, and a row that raises for these sizes is skipped."""
    for row in rows:
        if arguments.get("mask") is None and (row.core.mask != "masked" or row.mask3 != "unsqueeze"):
            continue
        try:
            yield Mistake(row.hint, compute(arguments, row)[index])
        except (ValueError, RuntimeError):
            continue


def distinct(wrong: Any, answer: Any) -> Any:
    """``wrong(arguments, index)`` without the mistakes that give the right ``answer(arguments)[index]``: a
    mistake in the output projection leaves the weights right, and would otherwise be named for weights that
    are NaN in some rows and right in the others (the mistakes are compared on finite elements)."""

    def found(arguments: dict[str, Any], index: int) -> Iterator[Mistake]:
        right = answer(arguments)[index]
        return (m for m in wrong(arguments, index) if not engine.close(m.result, right, torch.float64))

    return found


def module_pair(result: Any, call: Any, sizes: Sizes, rows: dict[str, str]) -> tuple[Any, Any]:
    """The ``(output [batch, q_len, d_model], weights [batch, n_heads, q_len, k_len])`` of a module's call,
    its shapes judged (likely causes: the shape ``rows``, :func:`head_hints`)."""
    output, weights_ = family.pair(result, call)
    shapes = {
        "output": (sizes.batch, sizes.q_len, sizes.d_model),
        "weights": (sizes.batch, sizes.n_heads, sizes.q_len, sizes.k_len),
    }
    for which, actual in (("output", output), ("weights", weights_)):
        assert_shape(actual, f"the {which} of {call}", shapes[which], head_hints(rows, sizes, which))
    return output, weights_


def module_check(
    part: Part,
    arguments: dict[str, Any],
    sizes: Sizes,
    answer: Callable[[dict[str, Any]], tuple],
    wrong: Callable[[dict[str, Any], int], Iterator[Mistake]],
    rows: dict[str, str],
    note: str = "",
    *,
    given: str = "query",
    mask_3d: str = MODULE_TEXT["mask 3d"],
) -> Check:
    """One call of a module of several heads: its shapes (:func:`module_pair`), then its weights and output
    against ``answer(arguments)`` within the tolerance of the input ``given``'s dtype, a mismatch named by
    ``wrong(arguments, index)``. A call that passes a ``[batch, q_len, k_len]`` mask and raises is told
    ``mask_3d``, to give the mask a head axis."""
    call = part.call(**arguments)
    dtype, mask = arguments[given].dtype, arguments.get("mask")

    def judge(result: Any) -> None:
        output, weights_ = module_pair(result, call, sizes, rows)
        expected = answer(arguments)
        for which, actual, index in (("weights", weights_, 1), ("output", output, 0)):
            mistakes = lambda index=index: wrong(arguments, index)  # noqa: E731
            engine.assert_values(
                actual, expected[index], f"the {which} of {call}", dtype=dtype, mistakes=mistakes, note=note
            )

    is_3d = isinstance(mask, torch.Tensor) and mask.dim() == 3
    return Check(call, judge, on_raise=mask_3d if is_3d else "")


def sums_to_one(weights: torch.Tensor, call: Call, over: str, shown: bool = True) -> None:
    """Fail unless each query's ``weights`` sum to 1 over ``over`` (``"the keys"``); ``shown``: the message
    says the first sum."""
    sums = weights.detach().double().sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
        first = f" (one sums to {sums.flatten()[0]:.3g})" if shown else ""
        fail(
            f"the weights of {call} do not sum to 1 over {over}{first}.",
            f"the softmax runs over another axis than {over} (dim=-1)",
        )


def gradients_reach(parameters: Sequence[tuple[str, int, Any]], call: Call, cause: str) -> None:
    """Fail unless each of a module's ``parameters`` ``(name, size, gradient)`` got a finite gradient."""
    for name, _, grad in parameters:
        if not isinstance(grad, torch.Tensor) or not torch.isfinite(grad).all():
            fail(f"the parameter {name} gets no gradient through {call}.", cause)


def layout_check(
    call: Call,
    x: torch.Tensor,
    right: torch.Tensor,
    wrong: Callable[[], Iterator[Mistake]],
    hints: dict[tuple[int, ...], str],
    hint: str,
    says: str = "is",
) -> Check:
    """A call of a function that lays out heads (splits, merges, repeats them) on ``x``: ``right``'s values
    (likely causes: the shape ``hints``, the mistakes ``wrong()``), then ``x``'s dtype (``hint``: the likely
    cause of another; ``says``: the message's verb, "the result ... is float32"); ``x`` left unchanged."""

    def judge(result: Any) -> None:
        engine.assert_values(result, right, f"the result of {call}", mistakes=wrong, hints=hints)
        if result.dtype != x.dtype:
            fail(
                f"the result of {call} {says} {dtype_name(result.dtype)} where x is {dtype_name(x.dtype)}.",
                hint,
            )

    return Check(call, judge, untouched=True)


def format_check(
    part: Part,
    arguments: dict[str, Any],
    sizes: Sizes,
    rows: dict[str, str],
    *,
    hint: str = MODULE_TEXT["module dtype"],
    judge: Callable[[Any, Call], None] | None = None,
    given: str = "",
    returned: int = 2,
) -> Check:
    """A float32 call of a module: the shapes of its ``(output, weights)`` (the first two of ``returned``
    values that the driver returns), ``judge(result, call)``, then that both are float32, the input's dtype
    (``given``: how a message says it, ``"the query is float32"`` by default; ``hint``: the likely
    cause)."""
    call = part.call(**arguments)

    def verdict(result: Any) -> None:
        if returned != 2 and (not isinstance(result, tuple) or len(result) != returned):
            fail(f"{call} should return a tuple (output, weights).")
        pair = module_pair(result[:2] if returned != 2 else result, call, sizes, rows)
        if judge is not None:
            judge(result, call)
        for which, actual in zip(("output", "weights"), pair, strict=True):
            if actual.dtype != torch.float32:
                verb = "are" if which == "weights" else "is"
                where = given or "the query is float32"
                fail(f"the {which} of {call} {verb} {dtype_name(actual.dtype)} where {where}.", hint)

    return Check(call, verdict)


# ==================================================================================================
# the documented errors, and the rule "from scratch"


def mask_errors(
    part: Part,
    arguments: dict[str, Any],
    mask: torch.Tensor,
    kinds: Sequence[torch.dtype],
    hint: str = MODULE_TEXT["module mask dtype"],
    name: str = "mask",
    what: str = "the mask",
) -> Iterator[Check]:
    """The documented TypeError of a mask that is not boolean: calls with the argument ``name`` (``what`` in
    the messages) given as ``mask`` in 0/1 of each of ``kinds``."""
    for kind in kinds:
        wrong = mask.to(kind)
        condition = f"when {what} is not boolean ({engine.describe(wrong)})"
        yield engine.raises(part.call(**{**arguments, name: wrong}), "TypeError", condition, hint)


def n_heads_error(part: Part, arguments: dict[str, Any], sizes: Sizes, hint: str, **changed: Any) -> Check:
    """The documented ValueError of ``__init__`` when n_heads does not divide d_model, for the smallest such
    n_heads above ``sizes.n_heads`` (``changed``: other arguments given another value with it)."""
    n_heads = next(n for n in itertools.count(sizes.n_heads + 1) if sizes.d_model % n)
    condition = f"from __init__ when n_heads={n_heads} does not divide d_model={sizes.d_model}"
    call = part.call(**{**arguments, "n_heads": n_heads, **changed})
    return engine.raises(call, "ValueError", condition, hint)


def from_scratch(
    part: Part,
    what: str,
    correct: Behaviour,
    cases: Sequence[Sizes],
    inputs: Callable[..., dict[str, Any]],
    mask_set: Callable[[Sizes, int, Any], Sequence[torch.Tensor | None]],
    seed: int,
) -> Iterator[Check]:
    """The cell "written from scratch" of a module: in the visible part the checks of ``correct`` first (the
    module must be correct before it counts as from scratch), then no built-in attention in the calls on
    ``inputs(sizes, seed=seed + 10 index, device=..., mask=mask)`` for each mask of ``mask_set(sizes, seed +
    index, device)``, for each of ``cases``."""
    if not part.hidden:
        yield from engine.correct_first(correct.plan(part), part.function)
    calls = [
        part.call(**inputs(sizes, seed=seed + 10 * index, device=part.device, mask=mask))
        for index, sizes in enumerate(cases)
        for mask in mask_set(sizes, seed + index, part.device)
    ]
    yield family.from_scratch(what).check(calls)
