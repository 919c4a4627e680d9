"""Attention as a soft lookup: kernel regression and single-head attention (chapter 1).

Nadaraya (1964) and Watson (1964) predict ``f(q) = sum_i w_i(q) v_i`` with weights from a kernel that
decreases with the distance between the query ``q`` and the keys ``k_i``; with the Gaussian kernel the
weights are a softmax of ``-(q - k_i)^2 / (2 h^2)``. Learned projections of the inputs turn this into the
attention of Vaswani et al. 2017.
"""

from __future__ import annotations

import math

import torch


def gaussian_kernel_weights(
    queries: torch.Tensor, keys: torch.Tensor, bandwidth: float = 1.0
) -> torch.Tensor:
    """Nadaraya-Watson weights of the Gaussian kernel: ``w_ij = softmax_j(-||q_i - k_j||^2 / (2 h^2))``.

    Args:
        queries: ``[m]`` (scalars) or ``[m, d]``, floating dtype.
        keys: ``[n]`` or ``[n, d]``, same dtype, device and ``d`` as ``queries``.
        bandwidth: the kernel width ``h > 0``, in the units of the keys. It acts as a temperature: a
            small ``h`` puts almost all weight on the nearest key, a large one spreads it evenly.

    Returns:
        ``[m, n]`` weights, each row non-negative and summing to 1, finite even for a query far from
        every key (the softmax subtracts the row maximum).

    Raises:
        ValueError: if ``bandwidth`` is not positive, or the feature sizes of queries and keys differ.

    Source: d2l.ai section 11.2 (attention pooling by similarity); Nadaraya 1964; Watson 1964.
    """
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth}")
    if queries.dim() == 1:
        queries = queries[:, None]  # [m, 1]
    if keys.dim() == 1:
        keys = keys[:, None]  # [n, 1]
    if queries.size(-1) != keys.size(-1):
        raise ValueError(
            f"queries and keys must share d, got {queries.size(-1)} and "
            f"{keys.size(-1)}"
        )
    squared_distance = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(
        -1
    )  # [m, n]
    return torch.softmax(-squared_distance / (2 * bandwidth**2), dim=-1)


def nadaraya_watson(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bandwidth: float = 1.0,
) -> torch.Tensor:
    """Nadaraya-Watson kernel regression with the Gaussian kernel: ``f(q_i) = sum_j w_ij v_j``.

    Args:
        queries: ``[m]`` or ``[m, d]``, floating dtype.
        keys: ``[n]`` or ``[n, d]``, same dtype and device.
        values: ``[n]`` or ``[n, d_v]``, same dtype and device.
        bandwidth: the kernel width ``h > 0`` (see :func:`gaussian_kernel_weights`).

    Returns:
        ``[m]`` predictions for ``[n]`` values, ``[m, d_v]`` for ``[n, d_v]`` values (also when ``m``
        or ``d_v`` is 1), in the dtype and device of the inputs; finite even for a query far from every
        key, whose prediction is then (almost) the value of its nearest key.

    Raises:
        ValueError: as :func:`gaussian_kernel_weights`, or if keys and values differ in ``n``.

    Source: d2l.ai section 11.2, eq. (11.2.1) with the Gaussian kernel.
    """
    if keys.size(0) != values.size(0):
        raise ValueError(
            f"keys and values must share n, got {keys.size(0)} and "
            f"{values.size(0)}"
        )
    weights = gaussian_kernel_weights(queries, keys, bandwidth)  # [m, n]
    return weights @ values  # [m] or [m, d_v]


def cross_attention(
    x_q: torch.Tensor,
    x_kv: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Single-head cross-attention: queries from one sequence, keys and values from another.

    ``Q = x_q W_Q``, ``K = x_kv W_K``, ``V = x_kv W_V`` (no bias), then
    ``softmax(Q K^T / sqrt(d_k)) V``, with no mask.

    Args:
        x_q: ``[..., m, d_model]``, the sequence that asks (the decoder side, the target).
        x_kv: ``[..., n, d_model]``, the sequence that is looked up (the encoder side, the source).
        w_q: ``[d_model, d_k]``; w_k: ``[d_model, d_k]``; w_v: ``[d_model, d_v]``. All the same dtype
            and device; ``x_q`` and ``x_kv`` share their leading axes ``...``.

    Returns:
        ``(output, weights)``: ``[..., m, d_v]`` and ``[..., m, n]``; row ``i`` of the weights is the
        distribution of target position ``i`` over the source positions.

    Raises:
        RuntimeError: from the matrix products, if the feature sizes do not match.

    Source: Vaswani et al. 2017, section 3.2.3 (encoder-decoder attention) and eq. (1).
    """
    query = x_q @ w_q  # [..., m, d_k]
    key = x_kv @ w_k  # [..., n, d_k]
    value = x_kv @ w_v  # [..., n, d_v]
    # [..., m, n]
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights  # [..., m, d_v], [..., m, n]


def self_attention(
    x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Single-head self-attention: queries, keys and values are projections of the same sequence.

    Args:
        x: ``[..., n, d_model]``.
        w_q: ``[d_model, d_k]``; w_k: ``[d_model, d_k]``; w_v: ``[d_model, d_v]``.

    Returns:
        ``(output, weights)``: ``[..., n, d_v]`` and ``[..., n, n]``. Permuting the positions of ``x``
        permutes the rows of the output the same way (self-attention alone knows no order).

    Raises:
        RuntimeError: from the matrix products, if the feature sizes do not match.

    Source: Vaswani et al. 2017, section 3.2.3 (self-attention layers) and eq. (1).
    """
    return cross_attention(x, x, w_q, w_k, w_v)
