"""Softmax and scaled dot-product attention, from scratch (chapter 2).

Source: Vaswani et al. 2017, "Attention Is All You Need", section 3.2.1, equation (1)::

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Axis names follow the book's notation page: ``[..., q_len, d_k]`` for queries, ``[..., k_len, d_k]`` for
keys, ``[..., k_len, d_v]`` for values, where ``...`` is any number of leading axes (batch, heads).
"""

from __future__ import annotations

import math

import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax along one axis.

    ``softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m)`` with ``m = max_j x_j``. Subtracting ``m`` changes
    nothing mathematically (softmax is invariant to adding a constant to every element of the slice), but
    it keeps ``exp`` from overflowing: float16 overflows above ``exp(11.09)``, float32 above ``exp(88.7)``.

    Args:
        x: scores of any shape; a floating dtype (float16, bfloat16, float32 or float64) on any device.
        dim: the axis to normalise over; for attention scores ``[..., q_len, k_len]`` it is the key
            axis, ``-1``.

    Returns:
        A tensor with the shape, dtype and device of ``x``: non-negative, summing to 1 along ``dim``. A
        slice whose elements are all ``-inf`` has no distribution and gives NaN; chapter 3's
        ``masked_attention`` handles such rows.

    Raises:
        IndexError: if ``dim`` is out of range for ``x``.

    Source: Vaswani et al. 2017, eq. (1); Goodfellow, Bengio and Courville 2016, section 4.1.
    """
    # subtract the max of each slice: softmax is shift invariant, and exp()
    # would overflow otherwise
    shifted = x - x.amax(dim=dim, keepdim=True)  # same shape as x
    exp = torch.exp(shifted)
    return exp / exp.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, ``softmax(Q K^T / sqrt(d_k)) V``, with an optional boolean mask.

    Precision: float64 and float32 inputs are computed in their own dtype. This implementation computes
    float16 and bfloat16 inputs in float32 (the scores, the softmax and the weighted sum of the values) and
    rounds the results to the input dtype once, at the end, as mixed-precision practice keeps reductions
    such as softmax's sum in float32; rounding every step to the 11 or 8 bits of a half-precision significand
    is a few times less exact than ``F.scaled_dot_product_attention``, and is also correct here.

    Args:
        query: ``[..., q_len, d_k]``, float64, float32, float16 or bfloat16, on any device.
        key: ``[..., k_len, d_k]``, same dtype and device as ``query``.
        value: ``[..., k_len, d_v]``, same dtype and device as ``query``.
        mask: optional boolean tensor broadcastable to ``[..., q_len, k_len]``; ``True`` means the query
            may attend to the key (the convention of ``torch.nn.functional.scaled_dot_product_attention``).
            ``query``, ``key`` and ``value`` share their leading axes ``...``.

    Returns:
        ``(output, weights)``: ``output`` is ``[..., q_len, d_v]``, ``weights`` is ``[..., q_len, k_len]``
        with rows that sum to 1; both have the dtype and device of ``query``. Masked keys get weight 0. A
        query whose mask row is all ``False`` gets NaN (chapter 3 explains why, and ``masked_attention``
        gives such rows zero weights instead).

    Raises:
        ValueError: if ``query`` and ``key`` differ in ``d_k``, or ``key`` and ``value`` in ``k_len``.
        TypeError: if ``mask`` is not boolean.

    Source: Vaswani et al. 2017, section 3.2.1, eq. (1); the scale is footnote 4's ``Var(q . k) = d_k``.
    Half precision: Micikevicius et al. 2018, "Mixed Precision Training", section 3.3.
    """
    if query.size(-1) != key.size(-1):
        raise ValueError(
            f"query and key must share d_k, got {query.size(-1)} and "
            f"{key.size(-1)}"
        )
    if key.size(-2) != value.size(-2):
        raise ValueError(
            f"key and value must share k_len, got {key.size(-2)} and "
            f"{value.size(-2)}"
        )
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be boolean (True = may attend), got {mask.dtype}"
        )
    if query.dtype in (torch.float16, torch.bfloat16):
        # half precision: compute in float32 and round once (see above);
        # float32 and float64 run below
        output, weights = scaled_dot_product_attention(
            query.float(), key.float(), value.float(), mask
        )
        return output.to(query.dtype), weights.to(query.dtype)
    d_k = query.size(-1)
    # Vaswani et al. 2017, footnote 4: q . k has variance d_k, so divide by
    # sqrt(d_k) to keep it near 1
    # [..., q_len, k_len]
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        # exp(-inf) = 0: a masked key gets no weight; torch.where broadcasts
        # mask and scores both ways
        scores = torch.where(mask, scores, float("-inf"))
    weights = softmax(scores, dim=-1)  # normalise over the keys
    # [..., q_len, d_v], [..., q_len, k_len]
    return weights @ value, weights
