"""Cross-attention and the decoder layer (chapter 6): queries from the decoder, keys and values from the
encoder.

Source: Vaswani et al. 2017, "Attention Is All You Need", section 3.2.3: "In 'encoder-decoder attention'
layers, the queries come from the previous decoder layer, and the memory keys and values come from the output
of the encoder." Each decoder layer has three sub-layers (section 3.1): masked self-attention, cross-attention
over the encoder's output, and a position-wise feed-forward network, each with a residual connection and a
layer normalisation.

Cross-attention is multi-head attention whose keys and values come from another sequence, so it is built on
chapter 4's :class:`~attention_course.multi_head.MultiHeadAttention` (same projections, same
``load_torch_weights``). Its mask is only the *source* padding mask: every target position may look at every
real source token, because the whole source is known before decoding starts; the causal mask belongs to the
decoder's self-attention.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attention_course.multi_head import MultiHeadAttention


class CrossAttention(MultiHeadAttention):
    """Multi-head attention from a target sequence to a source sequence, with a cache of the source's keys and
    values.

    The projections are those of :class:`~attention_course.multi_head.MultiHeadAttention` (``w_q``, ``w_k``,
    ``w_v``, ``w_o``, and its ``load_torch_weights``); only ``forward`` differs: keys and values both come
    from ``source``. During decoding the source does not change from one step to the next, so with
    ``use_cache=True`` its keys and values are computed once per source and reused; as soon as another source
    comes (or the same tensor, changed in place, or the weights, changed), they must be computed again: a
    cache that is reused for a new sentence silently attends to the old one.

    Args:
        d_model: the width of the target, the source and the output, an ``int``.
        n_heads: the number of heads, an ``int`` that divides ``d_model``.
        bias: whether the four projections have biases.

    Raises:
        ValueError: if ``n_heads`` does not divide ``d_model``.

    Source: Vaswani et al. 2017, section 3.2.3.
    """

    def forward(
        self,
        target: torch.Tensor,
        source: torch.Tensor,
        mask: torch.Tensor | None = None,
        use_cache: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend from every target position to the source.

        Args:
            target: ``[batch, tgt_len, d_model]``, the decoder's states (the queries).
            source: ``[batch, src_len, d_model]``, the encoder's output (keys and values); both floating,
                the dtype and device of the module's parameters.
            mask: boolean, ``True`` = may attend, broadcastable to ``[batch, n_heads, tgt_len, src_len]``:
                usually the source padding mask ``[batch, 1, 1, src_len]``; a ``[batch, tgt_len, src_len]``
                mask is the same for every head. ``None``: every source position. A target position with no
                allowed source position gets zero weights.
            use_cache: reuse the keys and values computed for ``source`` by an earlier call, if that call had
                the same source tensor, unchanged since, and the same weights; otherwise compute them and keep
                them for the next call.

        Returns:
            ``(output, weights)``: ``[batch, tgt_len, d_model]`` and ``[batch, n_heads, tgt_len, src_len]``,
            in the dtype of ``target``. The same with or without the cache.

        Raises:
            TypeError: if ``mask`` is not boolean.

        Source: Vaswani et al. 2017, section 3.2.3 (encoder-decoder attention), with the multi-head attention
        of section 3.2.2.
        """
        batch, tgt_len, _ = target.shape
        q = (
            self.w_q(target)
            .view(batch, tgt_len, self.n_heads, self.d_head)
            .transpose(1, 2)
        )
        k, v = (
            self.source_kv(source)
            if use_cache
            else self._project_source(source)
        )
        # [batch, n_heads, tgt_len, src_len]
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        if mask is None:
            weights = torch.softmax(scores, dim=-1)
        else:
            if mask.dtype != torch.bool:
                raise TypeError(
                    "mask must be boolean (True = may attend), got "
                    f"{mask.dtype}"
                )
            # [batch, tgt_len, src_len]: the same for every head
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
            .reshape(batch, tgt_len, self.d_model)
        )
        return self.w_o(heads), weights

    def source_kv(
        self, source: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of ``source``, from the cache when it holds them for this source, unchanged,
        and the current weights; else computed and cached.

        Args:
            source: ``[batch, src_len, d_model]``, floating, the dtype and device of the module's parameters.

        Returns:
            ``(keys, values)``, ``[batch, n_heads, src_len, d_head]`` each. The cache keeps ``source`` alive
            until :meth:`clear_cache`.
        """
        state = (
            source._version,
            torch.is_grad_enabled(),
            *(p._version for p in self._source_parameters()),
        )
        cached = self._cached
        if (
            cached is not None
            and cached[0] is source
            and cached[1] == state
        ):
            return cached[2], cached[3]
        k, v = self._project_source(source)
        self._cached = (source, state, k, v)
        return k, v

    def clear_cache(self) -> None:
        """Forget the cached keys and values (at the end of a sentence, to free their memory)."""
        self._cached = None

    def _source_parameters(self) -> list[torch.Tensor]:
        # an optimiser step changes their versions
        return [*self.w_k.parameters(), *self.w_v.parameters()]

    def _project_source(
        self, source: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, src_len, _ = source.shape
        k = (
            self.w_k(source)
            .view(batch, src_len, self.n_heads, self.d_head)
            .transpose(1, 2)
        )
        v = (
            self.w_v(source)
            .view(batch, src_len, self.n_heads, self.d_head)
            .transpose(1, 2)
        )
        return k, v

    # (source, its state, keys, values) of the last call with use_cache=True
    _cached: (
        tuple[torch.Tensor, tuple, torch.Tensor, torch.Tensor] | None
    ) = None


class DecoderLayer(nn.Module):
    """One decoder layer: masked self-attention, cross-attention to the encoder's output, then a feed-forward
    network; each sub-layer with a residual connection and a layer normalisation.

    Post-LN (``norm_first=False``, Vaswani et al. 2017): ``x = norm(x + sublayer(x))``. Pre-LN
    (``norm_first=True``, GPT-2 and most current models): ``x = x + sublayer(norm(x))``; the encoder's output
    is not normalised again. The sub-modules are named as in ``nn.TransformerDecoderLayer`` (``self_attn``,
    ``linear1``, ``linear2``, ``norm1`` to ``norm3``), except ``cross_attn`` (PyTorch: ``multihead_attn``).
    Dropout, where ``dropout > 0`` and the layer is training: on each sub-layer's output before the residual
    sum ("residual dropout", Vaswani et al. section 5.4) and after the feed-forward network's activation.

    Args:
        d_model: the model width, an ``int``.
        n_heads: heads of both attentions, an ``int`` that divides ``d_model``.
        d_ff: the feed-forward network's inner width, an ``int`` (2048 for ``d_model = 512`` in the paper).
        norm_first: pre-LN if True, post-LN if False.
        dropout: the dropout probability, a ``float`` in ``[0, 1)``; dropout acts in training mode only.

    Raises:
        ValueError: if ``n_heads`` does not divide ``d_model``.

    Source: Vaswani et al. 2017, sections 3.1 and 3.3; PyTorch's ``nn.TransformerDecoderLayer``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        norm_first: bool = False,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.cross_attn = CrossAttention(d_model, n_heads)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.norm1, self.norm2, self.norm3 = (
            nn.LayerNorm(d_model) for _ in range(3)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        self_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        use_cache: bool = False,
    ) -> torch.Tensor:
        """Apply the three sub-layers.

        Args:
            x: ``[batch, tgt_len, d_model]``, the target so far.
            memory: ``[batch, src_len, d_model]``, the encoder's output; both floating, the dtype and device
                of the layer's parameters.
            self_mask: boolean, ``True`` = may attend, broadcastable to
                ``[batch, n_heads, tgt_len, tgt_len]``: the causal mask, with the target's padding if any.
            memory_mask: boolean, broadcastable to ``[batch, n_heads, tgt_len, src_len]``: the source padding
                mask (no causal part: the whole source is known).
            use_cache: let the cross-attention reuse the keys and values of ``memory``.

        Returns:
            ``[batch, tgt_len, d_model]``, in the dtype of ``x``.

        Raises:
            TypeError: if a mask is not boolean.

        Source: Vaswani et al. 2017, section 3.1 (the decoder's three sub-layers).
        """
        if self.norm_first:
            x = x + self._self_block(self.norm1(x), self_mask)
            x = x + self._cross_block(
                self.norm2(x), memory, memory_mask, use_cache
            )
            return x + self._feed_forward(self.norm3(x))
        x = self.norm1(x + self._self_block(x, self_mask))
        x = self.norm2(
            x + self._cross_block(x, memory, memory_mask, use_cache)
        )
        return self.norm3(x + self._feed_forward(x))

    def _self_block(
        self, x: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        return self.dropout(self.self_attn(x, x, x, mask)[0])

    def _cross_block(
        self, x: torch.Tensor, memory: torch.Tensor, mask, use_cache: bool
    ) -> torch.Tensor:
        return self.dropout(self.cross_attn(x, memory, mask, use_cache)[0])

    def _feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(
            self.linear2(self.dropout(F.relu(self.linear1(x))))
        )


def load_torch_decoder_layer(
    layer: DecoderLayer, torch_layer: nn.TransformerDecoderLayer
) -> DecoderLayer:
    """Copy the weights of ``nn.TransformerDecoderLayer`` into the course's :class:`DecoderLayer`.

    Args:
        layer: the course's layer, of the same sizes.
        torch_layer: ``nn.TransformerDecoderLayer(d_model, n_heads, d_ff, activation="relu")``, biases on.

    Returns:
        ``layer``, its parameters overwritten in place.

    Raises:
        ValueError: if the sizes differ.

    Source: PyTorch's ``nn.TransformerDecoderLayer`` (its sub-module names).
    """
    layer.self_attn.load_torch_weights(torch_layer.self_attn)
    layer.cross_attn.load_torch_weights(torch_layer.multihead_attn)
    for name in ("linear1", "linear2", "norm1", "norm2", "norm3"):
        getattr(layer, name).load_state_dict(
            getattr(torch_layer, name).state_dict()
        )
    return layer
