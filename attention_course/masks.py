"""Masks, in the order chapter 3 derives them: padding, causal, their combination, masked attention.

The course's convention is the one of ``torch.nn.functional.scaled_dot_product_attention``: a mask is
boolean and ``True`` means "may attend"; it broadcasts to ``[batch, heads, q_len, k_len]``.
``torch.nn.MultiheadAttention`` uses the opposite (``True`` = blocked) and Hugging Face models pass
``attention_mask`` as ``[batch, len]`` integers (1 = real token); chapter 3 converts between them.
"""

from __future__ import annotations

import math

import torch


def padding_mask(tokens: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
    """Which keys are real tokens: ``True`` where ``tokens != pad_id``.

    Args:
        tokens: ``[batch, len]`` integer token ids.
        pad_id: the id of the padding token.

    Returns:
        Boolean ``[batch, 1, 1, len]``, on the device of ``tokens``: broadcastable over heads and queries
        to ``[batch, heads, q_len, len]``.

    Raises:
        ValueError: if ``tokens`` is not two-dimensional.

    Source: Vaswani et al. 2017 pad their batches; the shape is the one SDPA broadcasts.
    """
    if tokens.dim() != 2:
        raise ValueError(
            f"tokens must be [batch, len], got shape {list(tokens.shape)}"
        )
    return (tokens != pad_id)[:, None, None, :]  # [batch, 1, 1, len]


def causal_mask(
    q_len: int,
    k_len: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Causal mask aligned bottom-right: query ``i`` may attend key ``j`` when ``j <= i + (k_len - q_len)``.

    With ``q_len == k_len`` this is the lower-triangular matrix of decoder self-attention. With
    ``q_len < k_len`` the queries are the *last* ``q_len`` positions, as in decoding with a KV cache
    (``torch.nn.attention.bias.causal_lower_right``). PyTorch's ``is_causal=True`` aligns top-left
    instead, which is only the same when ``q_len == k_len``.

    Args:
        q_len: number of queries, at least 1; it may exceed ``k_len``: the first ``q_len - k_len`` queries
            then attend no key (their rows are all ``False``).
        k_len: number of keys, at least 1; defaults to ``q_len``.
        device: where to build the mask (the device of the scores it will meet); ``None``: PyTorch's
            default device.

    Returns:
        Boolean ``[1, 1, q_len, k_len]``.

    Raises:
        ValueError: if ``q_len`` or ``k_len`` is smaller than 1.

    Source: Vaswani et al. 2017, section 3.2.3 ("masking out ... all values in the input of the softmax
    which correspond to illegal connections").
    """
    k_len = q_len if k_len is None else k_len
    if q_len < 1 or k_len < 1:
        raise ValueError(
            f"q_len and k_len must be at least 1, got {q_len} and {k_len}"
        )
    query_position = torch.arange(q_len, device=device)[:, None] + (
        k_len - q_len
    )  # [q_len, 1]
    key_position = torch.arange(k_len, device=device)[None, :]  # [1, k_len]
    # [1, 1, q_len, k_len]
    return (key_position <= query_position)[None, None]


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Combine boolean masks with a logical *and*, broadcasting them; ``None`` entries are skipped.

    A key is allowed only where every mask allows it: for decoder self-attention, combine the causal
    mask ``[1, 1, q_len, k_len]`` with the padding mask ``[batch, 1, 1, k_len]``.

    Args:
        *masks: boolean tensors broadcastable to a common shape, or ``None``.

    Returns:
        The broadcast conjunction, or ``None`` if every argument is ``None`` (no mask at all).

    Raises:
        TypeError: if a mask is not boolean (``&`` of a float and a bool tensor fails in PyTorch, and a
            0/1 float mask would be mistaken for additive scores).
        RuntimeError: if the shapes do not broadcast.
    """
    combined = None
    for mask in masks:
        if mask is None:
            continue
        if mask.dtype != torch.bool:
            raise TypeError(
                "masks must be boolean (True = may attend), got "
                f"{mask.dtype}"
            )
        combined = mask if combined is None else combined & mask
    return combined


def masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention with the course's rule for a query that may attend no key.

    Like ``scaled_dot_product_attention`` of chapter 2, except that a query whose mask row is all
    ``False`` gets zero weights and a zero output, never NaN, in every floating dtype (an ``-inf`` fill
    would give ``exp(-inf - (-inf)) = NaN``, and a finite fill such as ``-1e9`` would spread the weight
    uniformly over the masked keys, or overflow float16).

    Args:
        query: ``[..., q_len, d_k]``; key: ``[..., k_len, d_k]``; value: ``[..., k_len, d_v]``.
        mask: boolean, broadcastable to ``[..., q_len, k_len]``, ``True`` = may attend; or ``None``.

    Returns:
        ``(output, weights)``: ``[..., q_len, d_v]`` and ``[..., q_len, k_len]``, dtype and device of
        ``query``. Rows of allowed keys sum to 1; rows with no allowed key are 0.

    Raises:
        TypeError: if ``mask`` is not boolean.

    Source: Vaswani et al. 2017, eq. (1) and section 3.2.3; PyTorch's SDPA backends disagree on fully
    masked rows (zeros on the math backend, other values on cuDNN), so the course fixes a rule.
    """
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be boolean (True = may attend), got {mask.dtype}"
        )
    # [..., q_len, k_len]
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
        return weights @ value, weights
    # [..., q_len, 1]: does the row allow any key?
    has_key = mask.any(dim=-1, keepdim=True)
    scores = torch.where(mask, scores, float("-inf"))
    # rows with no allowed key: give them finite scores so that softmax
    # makes no NaN, then zero them
    scores = torch.where(has_key, scores, 0.0)
    weights = torch.where(has_key, torch.softmax(scores, dim=-1), 0.0)
    # [..., q_len, d_v], [..., q_len, k_len]
    return weights @ value, weights
