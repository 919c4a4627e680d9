"""Attention heads that are convolutions (Cordonnier, Loukas and Jaggi 2020).

A head whose score depends only on the shift ``delta = k - q`` between the key's and the query's pixel,
through the quadratic encoding ``r_delta = (||delta||^2, delta_1, delta_2)`` and the head's vector
``v = -alpha (1, -2 Delta_1, -2 Delta_2)``, scores ``v . r_delta = -alpha ||delta - Delta||^2 + alpha
||Delta||^2``: as ``alpha`` grows, its softmax puts all the weight on the pixel ``q + Delta``. ``K^2`` such
heads, one per shift ``Delta`` of a ``K x K`` window, each followed by the slice ``W[:, :, Delta]`` of a
kernel, sum to the convolution (the cross-correlation of ``F.conv2d``) of the zero-padded image. The content
terms play no part (``W_qry = W_key = 0`` in the paper's construction, equation 9).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def quadratic_relative_encoding(
    height: int,
    width: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The quadratic relative encoding ``r[q, k] = (||delta||^2, delta_1, delta_2)``, ``delta = k - q``,
    between every pair of pixels of a ``height x width`` image.

    Pixels are numbered row by row (``index = row * width + col``, as ``x.flatten(-2)`` does); ``delta_1`` is
    the shift in rows, ``delta_2`` in columns.

    Args:
        height: rows of the image.
        width: columns of the image.
        dtype: the dtype of the result.
        device: the device of the result (default: the CPU).

    Returns:
        ``[height * width, height * width, 3]``: queries, keys, features.

    Source: Cordonnier, Loukas and Jaggi 2020, "On the Relationship between Self-Attention and Convolutional
    Layers" (ICLR), equation 9 and section 3.
    """
    rows, cols = torch.meshgrid(
        torch.arange(height, device=device),
        torch.arange(width, device=device),
        indexing="ij",
    )
    # [height * width, 2]
    pixels = torch.stack((rows, cols), dim=-1).flatten(0, 1).to(dtype)
    # [query, key, 2]: key - query
    delta = pixels.unsqueeze(0) - pixels.unsqueeze(1)
    return torch.cat((delta.pow(2).sum(-1, keepdim=True), delta), dim=-1)


def attention_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    alpha: float = 50.0,
) -> torch.Tensor:
    """A multi-head self-attention layer with ``K^2`` positional heads that computes, as ``alpha`` grows,
    ``F.conv2d(x, weight, bias, padding=K // 2)``.

    The image is zero-padded by ``K // 2``; every original pixel is a query, every pixel of the padded image a
    key. Head ``h`` (shift ``Delta_h``, ``weight[:, :, a, b]`` has ``Delta = (a - K//2, b - K//2)``) has the
    scores ``v_h . r[q, k]`` (:func:`quadratic_relative_encoding`, ``v_h = -alpha (1, -2 Delta_h)``), its
    softmax over the keys, values ``X`` and the value-output map ``weight[:, :, Delta_h]^T`` (``[C_in,
    C_out]``); the heads' outputs add up, then ``bias``. For ``alpha = 50`` the result equals the convolution
    to float64 rounding; for ``alpha = 1`` it does not (each head averages a neighbourhood).

    Args:
        x: ``[batch, C_in, height, width]``, float32 or float64.
        weight: ``[C_out, C_in, K, K]``, ``K`` odd, of ``x``'s dtype and device.
        bias: ``[C_out]`` or ``None``.
        alpha: each head's sharpness, positive.

    Returns:
        ``[batch, C_out, height, width]``, of ``x``'s dtype and device.

    Raises:
        ValueError: if the kernel is not square with an odd side, or its ``C_in`` is not ``x``'s.

    Source: Cordonnier, Loukas and Jaggi 2020, Lemma 1 and Theorem 1.
    """
    c_out, c_in, k, k2 = weight.shape
    if k != k2 or k % 2 == 0:
        raise ValueError(
            f"the kernel must be square with an odd side, got {k} x {k2}"
        )
    if c_in != x.size(1):
        raise ValueError(
            f"the kernel has {c_in} input channels, x has {x.size(1)}"
        )
    batch, _, height, width = x.shape
    pad = k // 2
    # zero padding: the keys outside the image hold zeros
    padded = F.pad(x, (pad, pad, pad, pad))
    r = quadratic_relative_encoding(
        height + 2 * pad, width + 2 * pad, x.dtype, x.device
    )
    rows = torch.arange(pad, pad + height, device=x.device).unsqueeze(1)
    queries = (
        rows * (width + 2 * pad)
        + torch.arange(pad, pad + width, device=x.device)
    ).flatten()
    # [height * width, keys, 3]: the original pixels are the queries
    r = r[queries]
    offsets = torch.arange(k, dtype=x.dtype, device=x.device) - pad
    # [K * K, 2]: Delta of weight[:, :, a, b], row by row
    shifts = torch.cartesian_prod(offsets, offsets)
    ones = torch.ones(k * k, 1, dtype=x.dtype, device=x.device)
    # [K * K, 3]: each head's vector
    v = -alpha * torch.cat((ones, -2 * shifts), dim=-1)
    # [K * K, queries, keys]
    weights = torch.softmax(torch.einsum("qkd,hd->hqk", r, v), dim=-1)
    values = padded.flatten(2).transpose(1, 2)  # [batch, keys, C_in]
    # [K * K, C_in, C_out]: weight[:, :, Delta]^T per head
    value_output = weight.flatten(2).permute(2, 1, 0)
    # the heads' outputs, summed
    out = torch.einsum("hqk,bkc,hco->bqo", weights, values, value_output)
    if bias is not None:
        out = out + bias
    return out.transpose(1, 2).reshape(batch, c_out, height, width)


def attention_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    alpha: float = 50.0,
) -> torch.Tensor:
    """The 1-D case: ``K`` heads with ``r_delta = (delta^2, delta)`` and ``v = -alpha (1, -2 Delta)`` compute
    ``F.conv1d(x, weight, bias, padding=K // 2)`` as ``alpha`` grows.

    Args:
        x: ``[batch, C_in, length]``, floating.
        weight: ``[C_out, C_in, K]``, ``K`` odd.
        bias: ``[C_out]`` or ``None``.
        alpha: each head's sharpness, positive.

    Returns:
        ``[batch, C_out, length]``.

    Raises:
        ValueError: if ``K`` is even, or the kernel's ``C_in`` is not ``x``'s.
    """
    k = weight.size(-1)
    if k % 2 == 0:
        raise ValueError(f"the kernel must have an odd size, got {k}")
    if weight.size(1) != x.size(1):
        raise ValueError(
            f"the kernel has {weight.size(1)} input channels, x has "
            f"{x.size(1)}"
        )
    pad, length = k // 2, x.size(-1)
    padded = F.pad(x, (pad, pad))
    positions = torch.arange(
        length + 2 * pad, dtype=x.dtype, device=x.device
    )
    # [queries, keys]: key - query
    delta = positions - positions[pad : pad + length].unsqueeze(1)
    shifts = torch.arange(k, dtype=x.dtype, device=x.device) - pad  # [K]
    # [K, queries, keys]
    scores = -alpha * (delta.pow(2) - 2 * shifts.view(-1, 1, 1) * delta)
    weights = torch.softmax(scores, dim=-1)
    out = torch.einsum("hqk,bck,och->boq", weights, padded, weight)
    return out if bias is None else out + bias.unsqueeze(-1)
