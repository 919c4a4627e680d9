"""Attention in O(n) memory, in the order chapter 11 derives it: the online softmax's merge, tiled attention,
and the count of memory traffic that explains why fused kernels are fast.

Scaled dot-product attention (chapter 2) forms the scores ``[..., q_len, k_len]``: memory that grows with the
square of the sequence length. The online softmax (Milakov and Gimelshein 2018) computes a softmax's
normaliser in one pass, keeping a running maximum and a running sum; attention's output can ride along
(Dao et al. 2022, section 3.1). Tiled attention walks over blocks of keys and keeps, for every query, three
things: the running max ``m``, the running sum ``l`` and the unnormalised output ``o``. Its largest
intermediate is one block of scores, ``[..., q_len, block_size]``, and the result is exact, not an
approximation: it equals chapter 3's ``masked_attention`` to rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def online_softmax_merge(
    max_a: torch.Tensor,
    sum_a: torch.Tensor,
    out_a: torch.Tensor,
    max_b: torch.Tensor,
    sum_b: torch.Tensor,
    out_b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge two partial softmax-attention states, each over its own set of keys, into the state of both.

    The state of a query over a set of keys ``J``, with scores ``s_j``, is ``(m, l, o)``::

        m = max_j s_j                       the running max
        l = sum_j exp(s_j - m)              the running sum
        o = sum_j exp(s_j - m) v_j          the unnormalised output

    and the attention output over ``J`` is ``o / l``. Given the states of the same queries over two disjoint
    sets of keys ``A`` and ``B``, the merge returns their state over the union of ``A`` and ``B`` (up to
    rounding). It is therefore associative and commutative: blocks of keys can be merged in any order or
    grouping.

    A state over no key (every key masked, or none seen yet) is ``(-inf, 0, 0)``; it is the merge's
    identity, and merging two of them gives ``(-inf, 0, 0)``, never NaN.

    Args:
        max_a: ``[..., q_len]``, the first state's running max (``-inf`` where it has seen no key).
        sum_a: ``[..., q_len]``, its running sum (0 where it has seen no key).
        out_a: ``[..., q_len, d_v]``, its unnormalised output.
        max_b: ``[..., q_len]``, the second state's running max.
        sum_b: ``[..., q_len]``, its running sum.
        out_b: ``[..., q_len, d_v]``, its unnormalised output.
        All six share one floating dtype and device; leading axes ``...`` broadcast.

    Returns:
        ``(max, sum, out)``: ``[..., q_len]``, ``[..., q_len]``, ``[..., q_len, d_v]``, in the inputs' dtype
        and device; the inputs are left unchanged.

    Source: Milakov and Gimelshein 2018, "Online normalizer calculation for softmax" (the running max and
    sum, and the operator that merges two partial results for a parallel reduction); Dao et al. 2022,
    "FlashAttention", section 3.1 (the output rescaled the same way).
    """
    new_max = torch.maximum(max_a, max_b)  # [..., q_len]
    # where neither state has seen a key the max is -inf, and
    # exp(-inf - (-inf)) would be NaN: shift by 0 there instead, so
    # that both scales are exp(-inf) = 0
    shift = new_max.masked_fill(new_max == -math.inf, 0.0)
    # [..., q_len], each at most 1
    scale_a, scale_b = torch.exp(max_a - shift), torch.exp(max_b - shift)
    new_sum = scale_a * sum_a + scale_b * sum_b
    # [..., q_len, d_v]
    new_out = scale_a.unsqueeze(-1) * out_a + scale_b.unsqueeze(-1) * out_b
    return new_max, new_sum, new_out


def tiled_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_size: int,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention computed over blocks of keys, never forming the ``[q_len, k_len]`` scores.

    The keys are taken ``block_size`` at a time (the last block may be shorter), each block's state merged
    into a running one (:func:`online_softmax_merge`). The result equals ``softmax(Q K^T / sqrt(d_k)) V``
    (and chapter 3's ``masked_attention``) up to rounding; the largest tensor it creates has
    ``q_len * block_size`` elements per leading index, or that of the inputs or the output if larger.

    Precision: float64 and float32 inputs are computed in their own dtype. This implementation computes
    float16 and bfloat16 inputs in float32 (the scores and the running max, sum and output, as mixed-precision
    practice keeps sums in float32) and rounds the output to the input dtype once, at the end; a computation
    in the inputs' own dtype is a few times less exact, and is also correct here.

    Args:
        query: ``[..., q_len, d_k]``, float64, float32, float16 or bfloat16, on any device.
        key: ``[..., k_len, d_k]``, same dtype and device.
        value: ``[..., k_len, d_v]``, same dtype and device; ``...`` are the same leading axes for all three.
        block_size: the number of keys per block, at least 1.
        mask: optional boolean tensor broadcastable to ``[..., q_len, k_len]``, ``True`` = may attend. A
            query whose mask allows no key gets a zero output (chapter 3's rule), never NaN.

    Returns:
        ``[..., q_len, d_v]``, in the dtype and on the device of ``query``. The inputs are left unchanged.

    Raises:
        ValueError: if ``block_size`` is smaller than 1, ``query`` and ``key`` differ in ``d_k``, or ``key``
            and ``value`` in ``k_len``.
        TypeError: if ``mask`` is not boolean.

    Source: Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness",
    algorithm 1 (the forward pass, here with every query in one block); Milakov and Gimelshein 2018. Half
    precision: Micikevicius et al. 2018, "Mixed Precision Training", section 3.3.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
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
        return tiled_attention(
            query.float(), key.float(), value.float(), block_size, mask
        ).to(query.dtype)
    k_len, q_len, d_v = key.size(-2), query.size(-2), value.size(-1)
    if mask is not None:
        # a view: a mask of one column broadcasts over the keys
        mask = mask.expand(*mask.shape[:-1], k_len)
    lead = query.shape[:-2]
    like = {"dtype": query.dtype, "device": query.device}
    # the state over no key: max -inf, sum 0, output 0
    # (online_softmax_merge's identity)
    state = (
        # running max [..., q_len]
        torch.full((*lead, q_len), -math.inf, **like),
        torch.zeros(*lead, q_len, **like),  # running sum [..., q_len]
        # unnormalised output [..., q_len, d_v]
        torch.zeros(*lead, q_len, d_v, **like),
    )
    # Vaswani et al. 2017, footnote 4: q . k has variance d_k,
    # so divide by sqrt(d_k)
    scale = 1.0 / math.sqrt(query.size(-1))
    # the last block may be shorter than block_size
    for start in range(0, k_len, block_size):
        stop = min(start + block_size, k_len)
        # [..., q_len, block]
        scores = query @ key[..., start:stop, :].transpose(-2, -1) * scale
        if mask is not None:
            # exp(-inf) = 0: no weight
            scores = scores.masked_fill(~mask[..., start:stop], -math.inf)
        # [..., q_len]; -inf where the block allows the query no key
        block_max = scores.amax(dim=-1)
        # no NaN from -inf - (-inf)
        shift = block_max.masked_fill(block_max == -math.inf, 0.0)
        # unnormalised, [..., q_len, block]
        weights = torch.exp(scores - shift.unsqueeze(-1))
        block = (
            block_max,
            weights.sum(dim=-1),
            weights @ value[..., start:stop, :],
        )
        state = online_softmax_merge(*state, *block)
    _, total, output = state
    # divide once, at the end; a query that saw no key has sum 0 and
    # output 0, and keeps output 0
    # [..., q_len, d_v]
    return output / torch.where(total > 0, total, 1.0).unsqueeze(-1)


# --------------------------------------------------------------------------------------------------
# memory traffic between HBM and SRAM (Dao et al. 2022, section 3.2, Theorem 2)


@dataclass(frozen=True)
class Traffic:
    """Numbers (elements, not bytes) read from and written to a GPU's HBM by one attention head's forward."""

    reads: int
    writes: int

    @property
    def total(self) -> int:
        return self.reads + self.writes


def standard_attention_traffic(n: int, d: int) -> Traffic:
    """HBM traffic of standard attention (Dao et al. 2022, algorithm 0) for ``n`` queries and keys of width
    ``d``: read Q and K, write S = Q K^T; read S, write P = softmax(S); read P and V, write O = P V.

    ``4 n d + 4 n^2`` elements in all: Theorem 2's ``Theta(n d + n^2)``.
    """
    reads = 2 * n * d + n * n + n * n + n * d  # Q, K; S; P, V
    writes = n * n + n * n + n * d  # S; P; O
    return Traffic(reads, writes)


def flash_attention_traffic(n: int, d: int, sram: int) -> Traffic:
    """HBM traffic of FlashAttention's forward pass (Dao et al. 2022, algorithm 1) for ``n`` queries and keys
    of width ``d`` and an on-chip SRAM of ``sram`` elements (``d <= sram <= n d``).

    Blocks of ``B_c = ceil(M / 4d)`` keys and ``B_r = min(B_c, d)`` queries. The output O, the sums l and the
    maxima m start in HBM (written once); the outer loop loads each block of K and V once; for each of the
    ``T_c = ceil(n / B_c)`` key blocks, the inner loop reads every block of Q, O, l and m and writes back O, l
    and m: ``n (3 d + 4)`` elements per key block. In all ``3 n d + 2 n + T_c n (3 d + 4)``:
    Theorem 2's ``Theta(n^2 d^2 / M)``.

    Raises:
        ValueError: unless ``d <= sram <= n * d``, the range of Theorem 2.
    """
    if not d <= sram <= n * d:
        raise ValueError(
            f"Theorem 2 takes d <= M <= n d, got d={d}, M={sram}, n "
            f"d={n * d}"
        )
    key_block = math.ceil(sram / (4 * d))  # B_c
    key_blocks = math.ceil(n / key_block)  # T_c
    # K and V once; Q, O, l, m for every key block
    reads = 2 * n * d + key_blocks * (2 * n * d + 2 * n)
    # O, l, m initialised; written back per key block
    writes = n * d + 2 * n + key_blocks * (n * d + 2 * n)
    return Traffic(reads, writes)
