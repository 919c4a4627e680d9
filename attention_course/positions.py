"""Positional information: sinusoidal encodings, rotary embeddings (RoPE) and linear biases (ALiBi).

Self-attention without positions is permutation-equivariant: permuting the tokens permutes the outputs.
Three ways of telling it where each token is:

- add a vector per position to the token embedding: sinusoidal (Vaswani et al. 2017, section 3.5) or learned;
- rotate each query and key by an angle proportional to its position (RoPE, Su et al. 2021), so that the
  score of query ``m`` and key ``n`` depends on ``m - n`` only;
- add a bias ``slope_h * (j - i)`` to the scores of head ``h`` (ALiBi, Press, Smith and Lewis 2022).

:class:`PositionalGPT` is chapter 7's :class:`~attention_course.transformer.TinyGPT` with any of them, for
chapter 8's experiment (train on short sequences, test on longer ones).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attention_course.multi_head import MultiHeadAttention
from attention_course.transformer import TinyGPT

POSITIONS = ("none", "learned", "sinusoidal", "rope", "alibi")


def sinusoidal_encoding(
    max_len: int,
    d_model: int,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The sinusoidal position encodings ``PE[pos, 2i] = sin(pos / base^(2i/d_model))``, ``PE[pos, 2i+1] =
    cos(pos / base^(2i/d_model))``.

    Sines and cosines interleave (even and odd features), as in the paper's formula; the wavelengths grow
    geometrically from ``2 pi`` to ``base * 2 pi``. Computed in float64, then cast to ``dtype``.

    Args:
        max_len: the number of positions, ``0 .. max_len - 1``.
        d_model: the width of an encoding, even.
        base: the base of the wavelengths, 10000 in the paper.
        dtype: the dtype of the result.
        device: the device of the result (default: the CPU).

    Returns:
        ``[max_len, d_model]``.

    Raises:
        ValueError: if ``d_model`` is odd.

    Source: Vaswani et al. 2017, "Attention Is All You Need", section 3.5.
    """
    if d_model % 2:
        raise ValueError(
            "d_model must be even (sines and cosines come in pairs), got "
            f"{d_model}"
        )
    positions = torch.arange(
        max_len, dtype=torch.float64, device=device
    ).unsqueeze(1)  # [max_len, 1]
    exponents = (
        torch.arange(0, d_model, 2, dtype=torch.float64, device=device)
        / d_model
    )  # 2i / d_model
    angles = positions / base**exponents  # [max_len, d_model / 2]
    # sin, cos, sin, cos, ...
    encoding = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(1)
    return encoding.to(dtype)


def rope_frequencies(
    d_head: int,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """RoPE's angular frequencies ``theta_i = base^(-2i / d_head)``, ``i = 0 .. d_head / 2 - 1``.

    Computed as ``1 / base^(2i / d_head)`` in ``dtype``, the form of Hugging Face's, LitGPT's and Meta's code.
    In float32, ``base ** -(2i / d_head)`` differs from it by one unit in the last place for about a third of
    the frequencies, and the position multiplies that difference: for ``d_head = 64`` the ``cos`` of the two
    differ by up to 6e-5 within 4,096 positions and 1e-3 within 40,960.

    Args:
        d_head: the width of a query or key, even.
        base: the base of the frequencies, 10000 in the paper and LLaMA.
        dtype: the dtype of the computation and of the result, float64 or float32.
        device: the device of the result (default: the CPU).

    Returns:
        ``[d_head / 2]``, decreasing from 1.

    Raises:
        ValueError: if ``d_head`` is odd.

    Source: Su et al. 2021, "RoFormer", equation 15.
    """
    if d_head % 2:
        raise ValueError(
            f"d_head must be even (features rotate in pairs), got {d_head}"
        )
    return 1.0 / base ** (
        torch.arange(0, d_head, 2, dtype=dtype, device=device) / d_head
    )


def apply_rope(
    x: torch.Tensor,
    positions: torch.Tensor,
    base: float = 10000.0,
    interleaved: bool = False,
) -> torch.Tensor:
    """Rotate each pair of features of ``x`` by the angle ``position * theta_i`` (rotary position embedding).

    Two conventions pair the features differently and give the same scores up to a fixed permutation of the
    features (:func:`rope_permutation`):

    - ``interleaved=True``: pairs ``(x[2i], x[2i+1])``, as in the paper and Meta's original LLaMA code;
    - ``interleaved=False`` (the default): pairs ``(x[i], x[i + d/2])``, ``rotate_half`` as in GPT-NeoX and
      Hugging Face ``transformers``' LLaMA (``apply_rotary_pos_emb``).

    Angles are computed in float64 for a float64 ``x`` and in float32 otherwise, with the frequencies
    ``1 / base^(2i / d)`` and the positions multiplied by them element by element, as Hugging Face's
    ``LlamaRotaryEmbedding`` does (in float32 its ``cos`` and ``sin`` are the same to the last bit); the
    result has ``x``'s dtype.

    Args:
        x: ``[..., len, d]`` queries or keys (e.g. ``[batch, n_heads, len, d_head]``), ``d`` even.
        positions: integer or float positions, ``[len]`` (the same for every sequence) or ``[batch, len]``
            (``batch`` being ``x``'s first axis).
        base: the base of the frequencies, 10000 in the paper and LLaMA.
        interleaved: the pairing convention, above.

    Returns:
        A tensor of ``x``'s shape, dtype and device.

    Raises:
        ValueError: if ``d`` is odd, or ``positions`` is not ``[len]`` or ``[batch, len]`` for ``x``'s
            ``len``.

    Source: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", equations 13-15.
    """
    d = x.size(-1)
    if d % 2:
        raise ValueError(
            "the last axis of x must be even (features rotate in pairs), "
            f"got {d}"
        )
    if (
        positions.dim() not in (1, 2)
        or positions.size(-1) != x.size(-2)
        or positions.dim() > x.dim() - 1
    ):
        raise ValueError(
            "positions must be [len] or [batch, len] with len = "
            f"x.size(-2) = {x.size(-2)}, "
            f"got {list(positions.shape)} for x of shape {list(x.shape)}"
        )
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    # 1 / base^(2i/d), Hugging Face's form: in float32, base ** -(2i/d) is
    # one ulp off it for some i
    theta = 1.0 / base ** (
        torch.arange(0, d, 2, dtype=compute, device=x.device) / d
    )  # [d / 2]: theta_i
    angles = (
        positions.to(device=x.device, dtype=compute).unsqueeze(-1) * theta
    )  # [(batch,) len, d / 2]
    # [batch, 1, ..., len, d / 2]: broadcast over x's axes
    # between batch and len
    if positions.dim() == 2:
        angles = angles.view(
            angles.size(0), *([1] * (x.dim() - 3)), *angles.shape[1:]
        )
    cos, sin = angles.cos(), angles.sin()
    if interleaved:
        even, odd = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack(
            (even * cos - odd * sin, even * sin + odd * cos), dim=-1
        ).flatten(-2)
    else:
        first, second = x[..., : d // 2], x[..., d // 2 :]
        rotated = torch.cat(
            (first * cos - second * sin, second * cos + first * sin), dim=-1
        )
    return rotated.to(x.dtype)


def rope_permutation(d: int, device=None) -> torch.Tensor:
    """The permutation ``[0, 2, 4, ..., 1, 3, 5, ...]`` between RoPE's two conventions: for any ``x``,
    ``apply_rope(x[..., perm], p) == apply_rope(x, p, interleaved=True)[..., perm]``.

    Applied to the rows of each head of ``W_q`` and ``W_k``, it converts weights trained with interleaved
    pairs into weights that give the same scores with ``rotate_half`` (what Hugging Face's
    ``convert_llama_weights_to_hf.py`` does with its ``permute``).

    Returns:
        ``[d]`` int64 indices.
    """
    return torch.cat(
        (
            torch.arange(0, d, 2, device=device),
            torch.arange(1, d, 2, device=device),
        )
    )


def alibi_slopes(
    n_heads: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """ALiBi's slope of each head: ``2^(-8h/n)``, ``h = 1 .. n``, when ``n = n_heads`` is a power of two.

    For other head counts, the slopes of the largest power of two ``p < n_heads``, then every other slope of
    ``2p`` heads (``2^(-4/p)``, ``2^(-12/p)``, ...) until there are ``n_heads``: the authors' code's rule.
    For 8 heads ``2^-1, ..., 2^-8``; for 6 heads ``2^-2, 2^-4, 2^-6, 2^-8, 2^-1, 2^-3``.

    Args:
        n_heads: the number of heads, at least 1.
        dtype: the dtype of the result.
        device: the device of the result (default: the CPU).

    Returns:
        ``[n_heads]``.

    Raises:
        ValueError: if ``n_heads < 1``.

    Source: Press, Smith and Lewis 2022, "Train Short, Test Long" (ICLR), section 3;
    ``ofirpress/attention_with_linear_biases``, ``get_slopes``.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads must be at least 1, got {n_heads}")

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    # the largest power of two <= n_heads
    power = 1 << (n_heads.bit_length() - 1)
    slopes = (
        geometric(power) + geometric(2 * power)[0::2][: n_heads - power]
    )
    return torch.tensor(slopes, dtype=torch.float64, device=device).to(
        dtype
    )


def alibi_bias(
    n_heads: int,
    q_len: int,
    k_len: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """ALiBi's bias, added to the scaled scores: ``bias[h, i, j] = slope_h * (j - i - (k_len - q_len))``.

    Query ``i`` sits at position ``i + k_len - q_len``, bottom-right aligned as chapter 3's causal mask (the
    last query is the last key, as when decoding with a cache). The bias is 0 for a query's own position and
    ``-slope_h * distance`` for earlier keys; it is positive for later keys, which the causal mask removes:
    use it with that mask (ALiBi is defined for causal language models).

    Args:
        n_heads: the number of heads (slopes from :func:`alibi_slopes`).
        q_len: the number of queries.
        k_len: the number of keys.
        dtype: the dtype of the result.
        device: the device of the result (default: the CPU).

    Returns:
        ``[n_heads, q_len, k_len]``.

    Source: Press, Smith and Lewis 2022, section 3 (``softmax(q_i K^T + m [-(i-1), ..., -1, 0])``).
    """
    slopes = alibi_slopes(n_heads, torch.float64, device)
    keys = torch.arange(k_len, dtype=torch.float64, device=device)
    queries = torch.arange(q_len, dtype=torch.float64, device=device) + (
        k_len - q_len
    )
    distance = keys - queries.unsqueeze(1)  # [q_len, k_len]: j - i
    return (slopes.view(-1, 1, 1) * distance).to(dtype)


class PositionalAttention(MultiHeadAttention):
    """Chapter 4's multi-head self-attention with rotary embeddings or linear biases in its scores.

    Args:
        d_model: the model width.
        n_heads: heads, a divisor of ``d_model``.
        position: ``"rope"`` (queries and keys rotated, ``rotate_half`` convention), ``"alibi"`` (bias added
            to the scaled scores) or ``"none"`` (plain multi-head attention).
        base: RoPE's base.

    Raises:
        ValueError: for another ``position``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        position: str = "none",
        base: float = 10000.0,
    ) -> None:
        super().__init__(d_model, n_heads)
        if position not in ("none", "rope", "alibi"):
            raise ValueError(
                "position must be 'none', 'rope' or 'alibi', got "
                f"{position!r}"
            )
        self.position, self.base = position, base

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`MultiHeadAttention.forward`; the queries are the last ``q_len`` of ``k_len`` positions.

        Returns:
            ``(output [batch, q_len, d_model], weights [batch, n_heads, q_len, k_len])``.
        """
        batch, q_len, k_len = query.size(0), query.size(1), key.size(1)
        q = (
            self.w_q(query)
            .view(batch, q_len, self.n_heads, self.d_head)
            .transpose(1, 2)
        )
        k = (
            self.w_k(key)
            .view(batch, k_len, self.n_heads, self.d_head)
            .transpose(1, 2)
        )
        v = (
            self.w_v(value)
            .view(batch, k_len, self.n_heads, self.d_head)
            .transpose(1, 2)
        )
        if self.position == "rope":
            positions = torch.arange(k_len, device=key.device)
            q = apply_rope(q, positions[k_len - q_len :], self.base)
            k = apply_rope(k, positions, self.base)
        # [batch, n_heads, q_len, k_len]
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        if self.position == "alibi":
            scores = scores + alibi_bias(
                self.n_heads, q_len, k_len, scores.dtype, scores.device
            )
        if mask is not None:
            if mask.dim() == 3:
                mask = mask.unsqueeze(1)
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        # a query with no allowed key gets zero weights (chapter 3)
        if mask is not None:
            weights = torch.where(
                mask.any(dim=-1, keepdim=True), weights, 0.0
            )
        heads = (weights @ v).transpose(1, 2).reshape(batch, q_len, -1)
        return self.w_o(heads), weights


class PositionalGPT(TinyGPT):
    """:class:`~attention_course.transformer.TinyGPT` with a choice of positional information.

    Args:
        vocab_size: the number of tokens.
        position: one of :data:`POSITIONS`: ``"none"``; ``"learned"`` (``max_len`` vectors, as GPT-2);
            ``"sinusoidal"`` (:func:`sinusoidal_encoding` added to the token embeddings scaled by
            ``sqrt(d_model)``, as Vaswani et al. do in section 3.4); ``"rope"``; ``"alibi"``.
        d_model, n_heads, n_layers, d_ff, max_len, dropout: as for ``TinyGPT``. ``max_len`` bounds the
            sequences the model accepts, whatever the position (for ``"learned"``, positions beyond those seen
            in training keep their initial random vectors).

    Raises:
        ValueError: for an unknown ``position``.
    """

    def __init__(
        self,
        vocab_size: int,
        position: str = "learned",
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        d_ff: int = 256,
        max_len: int = 128,
        dropout: float = 0.0,
    ) -> None:
        if position not in POSITIONS:
            raise ValueError(
                f"position must be one of {POSITIONS}, got {position!r}"
            )
        super().__init__(
            vocab_size, d_model, n_heads, n_layers, d_ff, max_len, dropout
        )
        self.position = position
        attention = position if position in ("rope", "alibi") else "none"
        for block in self.blocks:
            block.self_attn = PositionalAttention(
                d_model, n_heads, attention
            )
            # GPT-2's initialisation again
            for name, parameter in block.self_attn.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(parameter)
                else:
                    nn.init.normal_(parameter, std=0.02)
        if position != "learned":
            self.position_embedding = None
        self.register_buffer(
            "sinusoidal",
            sinusoidal_encoding(max_len, d_model)
            if position == "sinusoidal"
            else None,
        )

    def position_terms(
        self, length: int, device: torch.device
    ) -> torch.Tensor | float:
        if self.position == "learned":
            return self.position_embedding(
                torch.arange(length, device=device)
            )
        if self.position == "sinusoidal":
            return self.sinusoidal[:length]
        return 0.0

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """The logits of the next token at every position: ``[batch, len] -> [batch, len, vocab_size]``.

        Raises:
            ValueError: if the sequence is longer than ``max_len``.
        """
        length = tokens.size(1)
        if length > self.max_len:
            raise ValueError(
                f"the sequence has {length} tokens, more than "
                f"max_len={self.max_len}"
            )
        x = self.token_embedding(tokens)
        if self.position == "sinusoidal":
            x = x * math.sqrt(x.size(-1))
        x = self.dropout(x + self.position_terms(length, tokens.device))
        causal = torch.ones(
            length, length, dtype=torch.bool, device=tokens.device
        ).tril()
        for block in self.blocks:
            x = block(x, causal)
        return self.lm_head(self.norm(x))
