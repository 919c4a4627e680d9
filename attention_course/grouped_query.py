"""Sharing keys and values between heads (chapter 5): multi-query and grouped-query attention.

Multi-query attention (Shazeer 2019, "Fast Transformer Decoding: One Write-Head is All You Need") keeps
``n_heads`` query heads but one key head and one value head, which every query head shares; grouped-query
attention (Ainslie et al. 2023, "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
Checkpoints") uses ``n_kv_heads`` key/value heads, each shared by a group of ``n_heads / n_kv_heads``
consecutive query heads: query head ``i`` uses key/value head ``i // (n_heads / n_kv_heads)``. GQA with
``n_kv_heads = n_heads`` is multi-head attention, with ``n_kv_heads = 1`` it is multi-query attention.

The projections are named as in Hugging Face's Llama (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Repeat each key/value head ``n_rep`` times, next to itself: heads ``[a, b] -> [a, a, b, b]``.

    ``[batch, n_kv_heads, len, d_head] -> [batch, n_kv_heads * n_rep, len, d_head]``, so that query head ``i``
    meets key/value head ``i // n_rep``: head ``i`` of the result equals head ``i // n_rep`` of ``x``. Tiled
    heads (``[a, b, a, b]``) have the right shape and pair query heads with the wrong group.

    Args:
        x: ``[batch, n_kv_heads, len, d_head]``, any dtype and device.
        n_rep: how many query heads share each key/value head, an ``int``, at least 1.

    Returns:
        ``[batch, n_kv_heads * n_rep, len, d_head]``, the dtype and device of ``x``; ``x`` itself when
        ``n_rep == 1``.

    Raises:
        ValueError: if ``x`` is not four-dimensional or ``n_rep < 1``.

    Source: Ainslie et al. 2023, section 2.2 (groups of consecutive query heads); PyTorch documents the same
    pairing for ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)``.
    """
    if x.dim() != 4 or n_rep < 1:
        raise ValueError(
            "x must be [batch, n_kv_heads, len, d_head] and n_rep >= 1, "
            f"got {list(x.shape)}"
        )
    if n_rep == 1:
        return x
    batch, n_kv_heads, length, d_head = x.shape
    # a view: nothing copied yet
    x = x[:, :, None].expand(batch, n_kv_heads, n_rep, length, d_head)
    # heads a, a, ..., b, b, ...
    return x.reshape(batch, n_kv_heads * n_rep, length, d_head)


class GroupedQueryAttention(nn.Module):
    """Grouped-query attention: ``n_heads`` query heads share ``n_kv_heads`` key/value heads.

    Projections (attributes, named as in Hugging Face's Llama): ``q_proj`` ``d_model -> n_heads d_head``,
    ``k_proj`` and ``v_proj`` ``d_model -> n_kv_heads d_head``, ``o_proj`` ``n_heads d_head -> d_model``, with
    ``d_head = d_model // n_heads``.

    Args:
        d_model: the width of the inputs and the output, an ``int``.
        n_heads: the number of query heads, an ``int`` that divides ``d_model``.
        n_kv_heads: the number of key/value heads, an ``int`` that divides ``n_heads`` (``n_heads``:
            multi-head attention; 1: multi-query attention).
        bias: whether the projections have biases.

    Raises:
        ValueError: if ``n_heads`` does not divide ``d_model`` or ``n_kv_heads`` does not divide ``n_heads``.

    Source: Ainslie et al. 2023, section 2.2; Shazeer 2019, section 3 (multi-query attention).
    """

    def __init__(
        self, d_model: int, n_heads: int, n_kv_heads: int, bias: bool = True
    ) -> None:
        super().__init__()
        if (
            n_heads < 1
            or d_model % n_heads
            or n_kv_heads < 1
            or n_heads % n_kv_heads
        ):
            raise ValueError(
                f"need n_heads={n_heads} to divide d_model={d_model} and "
                f"n_kv_heads={n_kv_heads} to divide "
                "n_heads"
            )
        self.d_model, self.n_heads, self.n_kv_heads = (
            d_model,
            n_heads,
            n_kv_heads,
        )
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.d_head, bias=bias)
        self.k_proj = nn.Linear(
            d_model, n_kv_heads * self.d_head, bias=bias
        )
        self.v_proj = nn.Linear(
            d_model, n_kv_heads * self.d_head, bias=bias
        )
        self.o_proj = nn.Linear(n_heads * self.d_head, d_model, bias=bias)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``query`` to ``key`` and ``value``; the contract of chapter 4's module.

        Args:
            query: ``[batch, q_len, d_model]``.
            key: ``[batch, k_len, d_model]``.
            value: ``[batch, k_len, d_model]``; all three floating, the dtype and device of the module's
                parameters.
            mask: boolean, ``True`` = may attend: ``[q_len, k_len]``, ``[batch, q_len, k_len]`` (the same for
                every head) or broadcastable to ``[batch, n_heads, q_len, k_len]``; or ``None``. A query with
                no allowed key gets zero weights.

        Returns:
            ``(output, weights)``: ``[batch, q_len, d_model]`` and ``[batch, n_heads, q_len, k_len]`` (every
            query head's weights), in the dtype of ``query``.

        Raises:
            TypeError: if ``mask`` is not boolean.
        """
        batch, q_len, _ = query.shape
        k_len = key.size(1)
        q = (
            self.q_proj(query)
            .view(batch, q_len, self.n_heads, self.d_head)
            .transpose(1, 2)
        )
        k = (
            self.k_proj(key)
            .view(batch, k_len, self.n_kv_heads, self.d_head)
            .transpose(1, 2)
        )
        v = (
            self.v_proj(value)
            .view(batch, k_len, self.n_kv_heads, self.d_head)
            .transpose(1, 2)
        )
        # query heads per key/value head
        n_rep = self.n_heads // self.n_kv_heads
        # [batch, n_heads, k_len, d_head]
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        # [batch, n_heads, q_len, k_len]
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        if mask is None:
            weights = torch.softmax(scores, dim=-1)
        else:
            if mask.dtype != torch.bool:
                raise TypeError(
                    "mask must be boolean (True = may attend), got "
                    f"{mask.dtype}"
                )
            # [batch, q_len, k_len]: the same mask for every head
            if mask.dim() == 3:
                mask = mask.unsqueeze(1)
            # a row with no allowed key gets zero weights
            has_key = mask.any(dim=-1, keepdim=True)
            scores = torch.where(
                mask & has_key, scores, float("-inf")
            ).masked_fill(~has_key, 0.0)
            weights = torch.where(
                has_key, torch.softmax(scores, dim=-1), 0.0
            )
        heads = (
            (weights @ v)
            .transpose(1, 2)
            .reshape(batch, q_len, self.n_heads * self.d_head)
        )
        # [batch, q_len, d_model], [batch, n_heads, q_len, k_len]
        return self.o_proj(heads), weights


def kv_cache_bytes(
    n_layers: int,
    n_kv_heads: int,
    d_head: int,
    seq_len: int,
    batch: int,
    dtype: torch.dtype,
) -> int:
    """The bytes of the keys and values that a decoder caches, with every number stored in ``dtype``.

    Args:
        n_layers: decoder layers, an ``int``.
        n_kv_heads: key/value heads per layer, an ``int``.
        d_head: the width of one head, an ``int``.
        seq_len: tokens cached per sequence, an ``int``.
        batch: sequences, an ``int``. All five sizes at least 0.
        dtype: the cache's ``torch.dtype`` (``torch.float16``: 2 bytes per number).

    Returns:
        The size in bytes, an ``int``.

    Raises:
        ValueError: if a size is negative.

    Source: Shazeer 2019, section 2.4 (the memory traffic of incremental decoding); Ainslie et al. 2023.
    """
    sizes = (n_layers, n_kv_heads, d_head, seq_len, batch)
    if min(sizes) < 0:
        raise ValueError(f"sizes must be non-negative, got {sizes}")
    return (
        2
        * n_layers
        * n_kv_heads
        * d_head
        * seq_len
        * batch
        * dtype.itemsize
    )


def gqa_from_mha(
    mha: nn.MultiheadAttention, n_kv_heads: int
) -> GroupedQueryAttention:
    """Convert a multi-head layer into grouped-query attention by mean-pooling key and value heads.

    Key/value head ``g`` of the result is the mean of the key (value) heads ``g r, ..., g r + r - 1`` of
    ``mha``, weights and biases alike, with ``r = n_heads / n_kv_heads``: the group of query heads that
    :func:`repeat_kv` pairs with it. Query and output projections are copied. With ``n_kv_heads = n_heads``
    the result computes what ``mha`` computes; otherwise it approximates it, and Ainslie et al. continue
    pre-training ("uptraining") for about 5% of the original compute to recover the quality.

    Args:
        mha: ``nn.MultiheadAttention`` (floating, any device) with one ``in_proj_weight`` (no
            ``kdim``/``vdim``), no ``add_bias_kv``; with biases or without (``bias=False``: the result has
            none either).
        n_kv_heads: the key/value heads of the result, an ``int`` that divides ``mha.num_heads``.

    Returns:
        A new :class:`GroupedQueryAttention` with the dtype and device of ``mha``.

    Raises:
        ValueError: if ``n_kv_heads`` does not divide the number of heads, or ``mha`` has separate
            ``kdim``/``vdim`` projections.

    Source: Ainslie et al. 2023, section 2.1 ("mean pooling ... of the key and value heads").
    """
    if mha.in_proj_weight is None or mha.bias_k is not None:
        raise ValueError(
            "mha must use one in_proj_weight (no kdim/vdim) and no "
            "add_bias_kv"
        )
    d_model, n_heads = mha.embed_dim, mha.num_heads
    bias = mha.in_proj_bias is not None
    gqa = GroupedQueryAttention(d_model, n_heads, n_kv_heads, bias=bias)
    gqa = gqa.to(
        device=mha.in_proj_weight.device, dtype=mha.in_proj_weight.dtype
    )
    d_head, n_rep = d_model // n_heads, n_heads // n_kv_heads

    # [n_heads * d_head, ...] -> [n_kv_heads * d_head, ...]
    def pooled(rows: torch.Tensor) -> torch.Tensor:
        # heads g r .. g r + r - 1
        grouped = rows.reshape(n_kv_heads, n_rep, d_head, *rows.shape[1:])
        return grouped.mean(dim=1).reshape(
            n_kv_heads * d_head, *rows.shape[1:]
        )

    w_q, w_k, w_v = mha.in_proj_weight.chunk(3)  # [d_model, d_model] each
    with torch.no_grad():
        gqa.q_proj.weight.copy_(w_q)
        gqa.k_proj.weight.copy_(pooled(w_k))
        gqa.v_proj.weight.copy_(pooled(w_v))
        gqa.o_proj.weight.copy_(mha.out_proj.weight)
        if bias:
            b_q, b_k, b_v = mha.in_proj_bias.chunk(3)
            gqa.q_proj.bias.copy_(b_q)
            gqa.k_proj.bias.copy_(pooled(b_k))
            gqa.v_proj.bias.copy_(pooled(b_v))
            gqa.o_proj.bias.copy_(mha.out_proj.bias)
    return gqa
