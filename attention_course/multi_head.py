"""Multi-head attention (chapter 4): heads split and merged, the module, its entropy and its size.

Source: Vaswani et al. 2017, "Attention Is All You Need", section 3.2.2::

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,   head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

with ``W_i^Q, W_i^K in R^{d_model x d_k}``, ``W_i^V in R^{d_model x d_v}`` and ``W^O in R^{h d_v x d_model}``;
here ``d_k = d_v = d_head = d_model / n_heads``, as in the paper. The ``h`` projections of width ``d_head``
are computed as one ``d_model x d_model`` projection whose output is split into heads: the cost is that
of one head of full width, not less.

Masks follow the course's convention (chapter 3): boolean, ``True`` = may attend. ``nn.MultiheadAttention``
uses the opposite (``True`` = blocked); :func:`load_torch_weights` copies its weights, and a test checks the
two modules agree given the same weights.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Split the last axis into heads: ``[batch, len, d_model] -> [batch, n_heads, len, d_head]``.

    Head ``i`` gets features ``i * d_head`` to ``(i + 1) * d_head - 1`` of each position, the layout of
    ``nn.MultiheadAttention`` and of Hugging Face's BERT. The head axis is moved in front of the positions so
    that ``@`` treats ``(batch, n_heads)`` as batch axes.

    Args:
        x: ``[batch, len, d_model]``, any dtype and device.
        n_heads: the number of heads, a divisor of ``d_model``.

    Returns:
        ``[batch, n_heads, len, d_head]`` with ``d_head = d_model // n_heads``: a view of ``x`` (no copy).

    Raises:
        ValueError: if ``x`` is not three-dimensional or ``n_heads`` does not divide ``d_model``.

    Source: Vaswani et al. 2017, section 3.2.2.
    """
    if x.dim() != 3:
        raise ValueError(
            f"x must be [batch, len, d_model], got shape {list(x.shape)}"
        )
    batch, length, d_model = x.shape
    if n_heads < 1 or d_model % n_heads:
        raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
    # [batch, len, n_heads, d_head]
    x = x.view(batch, length, n_heads, d_model // n_heads)
    return x.transpose(1, 2)  # [batch, n_heads, len, d_head]


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Undo :func:`split_heads`: ``[batch, n_heads, len, d_head] -> [batch, len, n_heads * d_head]``.

    This is the concatenation ``Concat(head_1, ..., head_h)`` of Vaswani et al.: position ``t`` of the result
    holds head 0's ``d_head`` features, then head 1's, and so on.

    Args:
        x: ``[batch, n_heads, len, d_head]``, any dtype and device.

    Returns:
        ``[batch, len, n_heads * d_head]``, a new contiguous tensor.

    Raises:
        ValueError: if ``x`` is not four-dimensional.

    Source: Vaswani et al. 2017, section 3.2.2.
    """
    if x.dim() != 4:
        raise ValueError(
            "x must be [batch, n_heads, len, d_head], got shape "
            f"{list(x.shape)}"
        )
    batch, n_heads, length, d_head = x.shape
    # [batch, len, n_heads, d_head], no longer contiguous
    x = x.transpose(1, 2)
    # reshape copies where view cannot
    return x.reshape(batch, length, n_heads * d_head)


class MultiHeadAttention(nn.Module):
    """Multi-head attention, ``Concat(head_1, ..., head_h) W^O`` with ``head_i = Attention(Q W_i^Q, ...)``.

    Exercises 6 and 7 build on this module and expect its four projections, ``d_model -> d_model`` each, as
    the attributes ``w_q``, ``w_k``, ``w_v`` (queries, keys and values of all heads) and ``w_o`` (``W^O``).

    Args:
        d_model: the width of the inputs and the output, an ``int``.
        n_heads: the number of heads, an ``int`` that divides ``d_model`` (``d_head = d_model // n_heads``).
        bias: whether the four projections have biases (as ``nn.MultiheadAttention`` does by default).

    Raises:
        ValueError: if ``n_heads`` does not divide ``d_model``.

    Source: Vaswani et al. 2017, section 3.2.2 (the equation of ``MultiHead``).
    """

    def __init__(
        self, d_model: int, n_heads: int, bias: bool = True
    ) -> None:
        super().__init__()
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(
                f"n_heads={n_heads} must divide d_model={d_model}"
            )
        self.d_model, self.n_heads, self.d_head = (
            d_model,
            n_heads,
            d_model // n_heads,
        )
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``query`` to ``key`` and ``value`` with every head.

        Args:
            query: ``[batch, q_len, d_model]``.
            key: ``[batch, k_len, d_model]``.
            value: ``[batch, k_len, d_model]``; all three floating, the dtype and device of the module's
                parameters.
            mask: boolean, ``True`` = may attend: ``[q_len, k_len]``, ``[batch, q_len, k_len]`` (the same
                for every head) or broadcastable to ``[batch, n_heads, q_len, k_len]`` (chapter 3's masks);
                or ``None``. A query with no allowed key gets zero weights (chapter 3's rule).

        Returns:
            ``(output, weights)``: ``[batch, q_len, d_model]`` and ``[batch, n_heads, q_len, k_len]``, the
            weights of every head (``nn.MultiheadAttention`` with ``average_attn_weights=False``), both in
            the dtype of ``query``.

        Raises:
            TypeError: if ``mask`` is not boolean.

        Source: Vaswani et al. 2017, section 3.2.2, with each head's scaled dot-product attention (equation 1)
        at the scale ``1 / sqrt(d_head)``.
        """
        # split_heads, written out, so that the module stands alone
        # (exercises 6 and 7 carry it over)
        batch, q_len, k_len, shape = (
            query.size(0),
            query.size(1),
            key.size(1),
            (self.n_heads, self.d_head),
        )
        # [batch, n_heads, q_len, d_head]
        q = self.w_q(query).view(batch, q_len, *shape).transpose(1, 2)
        # [batch, n_heads, k_len, d_head]
        k = self.w_k(key).view(batch, k_len, *shape).transpose(1, 2)
        # [batch, n_heads, k_len, d_head]
        v = self.w_v(value).view(batch, k_len, *shape).transpose(1, 2)
        # each head scales by 1/sqrt(d_head), the width of its
        # own queries and keys
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
                mask = mask.unsqueeze(1)  # [batch, 1, q_len, k_len]
            # a row with no allowed key gets zero weights
            has_key = mask.any(dim=-1, keepdim=True)
            scores = torch.where(
                mask & has_key, scores, float("-inf")
            ).masked_fill(~has_key, 0.0)
            weights = torch.where(
                has_key, torch.softmax(scores, dim=-1), 0.0
            )
        heads = weights @ v  # [batch, n_heads, q_len, d_head]
        # merge_heads
        merged = heads.transpose(1, 2).reshape(batch, q_len, self.d_model)
        output = self.w_o(merged)  # [batch, q_len, d_model]
        return output, weights  # weights: [batch, n_heads, q_len, k_len]

    def load_torch_weights(
        self, torch_mha: nn.MultiheadAttention
    ) -> nn.Module:
        """Copy the weights of ``torch_mha`` into this module, so that both compute the same function.

        ``nn.MultiheadAttention`` stacks the three input projections in one ``in_proj_weight`` of shape
        ``[3 d_model, d_model]`` (rows: ``W_q``, then ``W_k``, then ``W_v``, each applied as ``x W^T + b``)
        with ``in_proj_bias`` ``[3 d_model]``, and keeps ``W^O`` in ``out_proj``.

        Args:
            torch_mha: ``nn.MultiheadAttention`` of this module's ``d_model``, ``n_heads``, dtype and device,
                with equal query, key and value widths (no ``kdim``/``vdim``), biases as this module's, no
                ``add_bias_kv``.

        Returns:
            This module, its parameters overwritten in place (without recording gradients).

        Raises:
            ValueError: if the sizes or the biases of the two modules differ.

        Source: PyTorch's ``nn.MultiheadAttention`` (its ``in_proj_weight`` layout).
        """
        if torch_mha.in_proj_weight is None or torch_mha.bias_k is not None:
            raise ValueError(
                "torch_mha must use one in_proj_weight (no kdim/vdim) and "
                "no add_bias_kv"
            )
        if (torch_mha.embed_dim, torch_mha.num_heads) != (
            self.d_model,
            self.n_heads,
        ):
            raise ValueError(
                f"torch_mha has d_model={torch_mha.embed_dim}, "
                f"n_heads={torch_mha.num_heads}; the module has "
                f"d_model={self.d_model}, n_heads={self.n_heads}"
            )
        if (torch_mha.in_proj_bias is None) != (self.w_q.bias is None):
            raise ValueError(
                "torch_mha and this module must both have biases, or both "
                "have none"
            )
        inputs = (self.w_q, self.w_k, self.w_v)
        with torch.no_grad():
            for projection, weight in zip(
                inputs, torch_mha.in_proj_weight.chunk(3), strict=True
            ):
                # [d_model, d_model]: rows are output features
                projection.weight.copy_(weight)
            self.w_o.weight.copy_(torch_mha.out_proj.weight)
            if torch_mha.in_proj_bias is not None:
                for projection, bias in zip(
                    inputs, torch_mha.in_proj_bias.chunk(3), strict=True
                ):
                    projection.bias.copy_(bias)
                self.w_o.bias.copy_(torch_mha.out_proj.bias)
        return self


def load_torch_weights(
    module: MultiHeadAttention, torch_mha: nn.MultiheadAttention
) -> MultiHeadAttention:
    """``module.load_torch_weights(torch_mha)``: copy the weights of ``nn.MultiheadAttention`` into the
    course's module (see :meth:`MultiHeadAttention.load_torch_weights`)."""
    return module.load_torch_weights(torch_mha)


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """The entropy of each query's attention distribution, ``H = -sum_j w_j ln w_j``, in nats.

    ``0 ln 0`` counts as 0 (its limit), so a one-hot row has entropy 0 and a uniform row over ``n`` keys
    has ``ln n``, the largest possible. A row of zeros (a query with no allowed key) gets 0.

    Args:
        weights: ``[..., q_len, k_len]`` attention weights (rows non-negative, summing to 1 or 0), floating.

    Returns:
        ``[..., q_len]``, the dtype and device of ``weights``.

    Source: Shannon 1948; used on attention heads by Clark et al. 2019, "What Does BERT Look At?".
    """
    return -torch.xlogy(weights, weights).sum(dim=-1)  # xlogy(0, 0) = 0


def mha_parameter_count(
    d_model: int, n_heads: int, bias: bool = True
) -> int:
    """The number of parameters of ``MultiHeadAttention(d_model, n_heads, bias)``, without building it.

    Args:
        d_model: the model width, an ``int``, at least 1.
        n_heads: the number of heads, an ``int`` that divides ``d_model``.
        bias: whether to count the biases of the four projections (a ``bool``).

    Returns:
        An ``int``, the number that ``nn.MultiheadAttention(d_model, n_heads, bias=bias)`` has too.

    Raises:
        ValueError: if ``d_model < 1`` or ``n_heads`` does not divide it.

    Source: Vaswani et al. 2017, section 3.2.2 (the matrices ``W_i^Q``, ``W_i^K``, ``W_i^V`` and ``W^O``).
    """
    if d_model < 1 or n_heads < 1 or d_model % n_heads:
        raise ValueError(
            f"n_heads={n_heads} must divide d_model={d_model}, both at "
            "least 1"
        )
    return 4 * d_model * d_model + (4 * d_model if bias else 0)
