"""The KV cache (chapter 10): decoding without recomputing the past, and paged storage for many sequences.

A causal decoder computes the key and value of position ``t`` from the tokens ``0 .. t`` only, so they do
not change when later tokens arrive. Generation can therefore keep them: each step runs the model on the
new token alone, appends its key and value to a cache, and lets its query attend to every cached key. The
cache of a model is ``[layers][K, V]``, each ``[batch, n_kv_heads, len, d_head]`` (:class:`KVCache`; Hugging
Face's ``DynamicCache`` has the same layout). The new token's position is the cache's length, and its causal
mask is aligned bottom-right (chapter 3's :func:`~attention_course.masks.causal_mask`).

Serving many sequences at once, a cache allocated contiguously for the longest possible sequence wastes
most of its memory. PagedAttention (Kwon et al. 2023, "Efficient Memory Management for Large Language Model
Serving with PagedAttention") stores keys and values in fixed-size blocks of one pool, lists each sequence's
blocks in a block table, and lets sequences share blocks, copying one only when a sequence writes into it
(:class:`PagedKVCache`).
"""

from __future__ import annotations

import torch
from torch import nn

from attention_course.grouped_query import GroupedQueryAttention, repeat_kv
from attention_course.masks import causal_mask, masked_attention
from attention_course.transformer import TinyGPT


class KVCache:
    """The keys and values of every layer of a decoder, for every position so far.

    Layer ``l`` holds keys and values ``[batch, n_kv_heads, len, d_head]``; :meth:`append` concatenates new
    ones on the length axis (``dim=2``) and returns everything the layer holds, which is what the new queries
    attend to. The layout is Hugging Face's ``DynamicCache`` (``cache.layers[l].keys``), whose keys grow the
    same way.

    Args:
        n_layers: the number of layers of the model, at least 1.

    Raises:
        ValueError: if ``n_layers < 1``.

    Source: Shazeer 2019 (incremental decoding keeps the keys and values of past positions); Hugging Face
    ``transformers``, ``cache_utils.DynamicCache``.
    """

    def __init__(self, n_layers: int) -> None:
        if n_layers < 1:
            raise ValueError(f"n_layers must be at least 1, got {n_layers}")
        self.key_cache: list[torch.Tensor | None] = [None] * n_layers
        self.value_cache: list[torch.Tensor | None] = [None] * n_layers

    def append(
        self, layer: int, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the keys and values of new positions to ``layer``; return all that the layer holds.

        Args:
            layer: the layer's index, ``0 <= layer < n_layers``.
            key: ``[batch, n_kv_heads, new_len, d_head]``, the new positions' keys.
            value: ``[batch, n_kv_heads, new_len, d_head]``, their values.

        Returns:
            ``(keys, values)``, each ``[batch, n_kv_heads, len + new_len, d_head]``: the old positions,
            then the new ones.

        Raises:
            IndexError: if ``layer`` is out of range.
            RuntimeError: if the new keys do not fit the stored ones (another batch, heads or ``d_head``).
        """
        if self.key_cache[layer] is None:
            self.key_cache[layer], self.value_cache[layer] = key, value
        else:  # dim=2: the length axis of [batch, n_kv_heads, len, d_head]
            self.key_cache[layer] = torch.cat(
                [self.key_cache[layer], key], dim=2
            )
            self.value_cache[layer] = torch.cat(
                [self.value_cache[layer], value], dim=2
            )
        return self.key_cache[layer], self.value_cache[layer]

    def keys(self, layer: int) -> torch.Tensor | None:
        """The keys of ``layer`` so far, ``[batch, n_kv_heads, len, d_head]``; ``None`` before any
        append."""
        return self.key_cache[layer]

    def values(self, layer: int) -> torch.Tensor | None:
        """The values of ``layer`` so far, ``[batch, n_kv_heads, len, d_head]``; ``None`` before any
        append."""
        return self.value_cache[layer]

    @property
    def length(self) -> int:
        """The number of positions cached (in layer 0; every layer holds as many after a forward pass)."""
        keys = self.key_cache[0]
        return 0 if keys is None else keys.size(2)

    def reset(self) -> None:
        """Empty every layer (before a new prompt)."""
        self.key_cache = [None] * len(self.key_cache)
        self.value_cache = [None] * len(self.value_cache)


def _projections(
    attention: nn.Module,
) -> tuple[nn.Module, nn.Module, nn.Module, nn.Module, int]:
    """``(w_q, w_k, w_v, w_o, n_kv_heads)`` of chapter 5's grouped-query or chapter 4's multi-head module."""
    if isinstance(attention, GroupedQueryAttention):
        a = attention
        return a.q_proj, a.k_proj, a.v_proj, a.o_proj, a.n_kv_heads
    return (
        attention.w_q,
        attention.w_k,
        attention.w_v,
        attention.w_o,
        attention.n_heads,
    )


class CachedGPT(TinyGPT):
    """Chapter 7's :class:`~attention_course.transformer.TinyGPT` with a forward pass that can use a
    :class:`KVCache`, and grouped-query attention if asked.

    ``model(tokens)`` computes what ``TinyGPT`` computes. ``model(tokens, positions, mask, cache)`` runs new
    tokens only: each layer appends their keys and values to ``cache`` and their queries attend to every
    position cached. The caller says where the new tokens are (``positions``) and what they may attend to
    (``mask``); by default the positions continue from the cache's length and the mask is causal, aligned
    bottom-right.

    Args:
        vocab_size, d_model, n_heads, n_layers, d_ff, max_len, dropout: as for ``TinyGPT``.
        n_kv_heads: key/value heads per layer, a divisor of ``n_heads``; ``None`` (or ``n_heads``) keeps
            chapter 4's multi-head attention, so that :func:`~attention_course.transformer.load_gpt2_weights`
            applies; fewer uses chapter 5's ``GroupedQueryAttention`` (GPT-2's initialisation).

    Raises:
        ValueError: if ``n_kv_heads`` does not divide ``n_heads``.

    Source: Radford et al. 2019 (GPT-2's layout); Ainslie et al. 2023 (GQA); Hugging Face ``transformers``
    (``past_key_values``, ``position_ids`` and ``cache_position`` play the roles of ``cache`` and
    ``positions``).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        d_ff: int = 256,
        max_len: int = 128,
        dropout: float = 0.0,
        n_kv_heads: int | None = None,
    ) -> None:
        super().__init__(
            vocab_size, d_model, n_heads, n_layers, d_ff, max_len, dropout
        )
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if self.n_kv_heads < 1 or n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_kv_heads={self.n_kv_heads} must divide "
                f"n_heads={n_heads}"
            )
        if self.n_kv_heads != n_heads:
            for block in self.blocks:
                block.self_attn = GroupedQueryAttention(
                    d_model, n_heads, self.n_kv_heads
                )
                # GPT-2's initialisation again
                for name, parameter in block.self_attn.named_parameters():
                    if name.endswith("bias"):
                        nn.init.zeros_(parameter)
                    else:
                        nn.init.normal_(parameter, std=0.02)

    @property
    def n_layers(self) -> int:
        """The number of blocks (a :class:`KVCache` holds one pair of tensors per block)."""
        return len(self.blocks)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """The logits of the next token at every new position.

        Args:
            tokens: ``[batch, q_len]`` token ids: the new tokens (the whole sequence without a cache).
            positions: ``[q_len]`` (or ``[batch, q_len]``) their positions, below ``max_len``; ``None``:
                ``cache.length, ..., cache.length + q_len - 1`` (``0, ..., q_len - 1`` without a cache).
            mask: boolean, ``True`` = may attend, broadcastable to ``[batch, n_heads, q_len, k_len]`` with
                ``k_len = cache.length + q_len``; ``None``: the causal mask aligned bottom-right.
            cache: a :class:`KVCache` with one slot per block, or ``None``. Each block appends the new keys
                and values to it.

        Returns:
            ``[batch, q_len, vocab_size]`` (new position ``i`` predicts the token after it).

        Raises:
            ValueError: if a position is ``max_len`` or more.
            TypeError: if ``mask`` is not boolean.
        """
        q_len = tokens.size(1)
        past = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(
                past, past + q_len, device=tokens.device
            )  # [q_len]
        if mask is None:
            # [1, 1, q_len, k_len]
            mask = causal_mask(q_len, past + q_len, device=tokens.device)
        if positions.numel() and int(positions.max()) >= self.max_len:
            raise ValueError(
                f"position {int(positions.max())} is beyond "
                f"max_len={self.max_len}"
            )
        x = self.dropout(
            self.token_embedding(tokens)
            + self.position_embedding(positions)
        )
        # pre-LN blocks, as TransformerBlock with norm_first=True
        for layer, block in enumerate(self.blocks):
            x = x + block.dropout(
                self._attention(
                    block.self_attn, block.norm1(x), mask, cache, layer
                )
            )
            x = x + block._feed_forward(block.norm2(x))
        return self.lm_head(self.norm(x))  # [batch, q_len, vocab_size]

    @staticmethod
    def _attention(
        attention: nn.Module,
        x: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None,
        layer: int,
    ) -> torch.Tensor:
        w_q, w_k, w_v, w_o, n_kv_heads = _projections(attention)
        (batch, q_len, _), n_heads, d_head = (
            x.shape,
            attention.n_heads,
            attention.d_head,
        )
        # [batch, n_heads, q_len, d_head]
        q = w_q(x).view(batch, q_len, n_heads, d_head).transpose(1, 2)
        kv_shape = (batch, q_len, n_kv_heads, d_head)
        # [batch, n_kv_heads, q_len, d_head]
        k = w_k(x).view(kv_shape).transpose(1, 2)
        v = w_v(x).view(kv_shape).transpose(1, 2)
        if cache is not None:
            # [batch, n_kv_heads, k_len, d_head]: every position so far
            k, v = cache.append(layer, k, v)
        n_rep = n_heads // n_kv_heads
        heads, _ = masked_attention(
            q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask
        )
        return w_o(
            heads.transpose(1, 2).reshape(batch, q_len, n_heads * d_head)
        )  # [batch, q_len, d_model]


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    use_cache: bool = True,
) -> torch.Tensor:
    """Greedy decoding, with or without a KV cache: both give the same tokens.

    Each step appends the argmax of the last position's logits (greedy decoding only: no temperature, no
    sampling). Without a cache, every step runs the model on the whole sequence so far, positions ``0 ..
    len - 1``, under a square causal mask. With a cache, the first step runs the prompt and each later step
    the one token chosen last; its position is the number of positions cached, and its causal mask is
    aligned bottom-right: the ``q_len`` new queries are the last of ``k_len = cache.length + q_len`` keys,
    and new query ``i`` may attend key ``j`` when ``j <= cache.length + i``. (PyTorch's ``is_causal=True``
    aligns top-left, which lets one new query see key 0 only.)

    Args:
        model: called as ``model(tokens, positions, mask, cache)`` with ``tokens`` ``[batch, q_len]``,
            ``positions`` ``[q_len]`` (``torch.long``), ``mask`` boolean ``[q_len, k_len]`` (``True`` = may
            attend) and ``cache`` a :class:`KVCache` of ``model.n_layers`` layers or ``None``; returns
            ``[batch, q_len, vocab]`` logits. :class:`CachedGPT` is one such model.
        prompt: ``[batch, prompt_len]`` token ids, ``prompt_len >= 1``.
        max_new_tokens: how many tokens to add, at least 0.
        use_cache: keep the keys and values in a :class:`KVCache` instead of recomputing them.

    Returns:
        ``[batch, prompt_len + max_new_tokens]``: the prompt, then the new tokens.

    Raises:
        ValueError: if ``max_new_tokens < 0``.

    Source: Radford et al. 2019 (autoregressive generation); Shazeer 2019 (incremental decoding); Hugging
    Face ``transformers``' ``generate(use_cache=True)``.
    """
    if max_new_tokens < 0:
        raise ValueError(
            f"max_new_tokens must be at least 0, got {max_new_tokens}"
        )
    cache = KVCache(model.n_layers) if use_cache else None
    tokens, new = prompt, prompt  # new: what the model has not seen yet
    for _ in range(max_new_tokens):
        if cache is None:
            new = tokens  # recompute everything
        past = cache.length if cache is not None else 0
        q_len, k_len = new.size(1), past + new.size(1)
        # [q_len], continuing the cache
        positions = torch.arange(past, k_len, device=prompt.device)
        # bottom-right: new query i sits at position past + i and may
        # attend keys 0 .. past + i
        mask = torch.ones(
            q_len, k_len, dtype=torch.bool, device=prompt.device
        ).tril(diagonal=past)
        logits = model(new, positions, mask, cache)  # [batch, q_len, vocab]
        new = logits[:, -1].argmax(dim=-1, keepdim=True)  # [batch, 1]
        tokens = torch.cat([tokens, new], dim=1)
    return tokens


class PagedKVCache:
    """The keys and values of many sequences in fixed-size blocks of one pool: PagedAttention's KV cache.

    The pool is ``key_blocks`` and ``value_blocks``, ``[n_blocks, n_kv_heads, block_size, d_head]`` each.
    Sequence ``s`` lists its blocks in ``block_tables[s]``: position ``p`` lives in block
    ``block_tables[s][p // block_size]``, slot ``p % block_size``. A sequence takes a free block only when
    its last block is full, so each wastes fewer than ``block_size`` slots, where a contiguous cache
    allocated for the longest sequence wastes the rest of that length.

    Sequences share blocks: :meth:`fork` gives a child the parent's blocks (a shared prompt, for parallel
    sampling or beam search) and adds one to each block's ``ref_counts``. A block held by several sequences
    is copied before one of them writes into it (copy on write); since only a sequence's last block is
    partly filled, only that one is ever copied. :meth:`free` gives a block back to ``free_blocks`` when no
    sequence holds it any more.

    Attributes (the state that the checks read):
        block_size: positions per block.
        key_blocks, value_blocks: the pool.
        block_tables: ``{seq_id: [block, ...]}``, the blocks of each sequence, in order.
        lengths: ``{seq_id: positions stored}``.
        ref_counts: ``[n_blocks]`` ints, how many block tables hold each block (0: free).
        free_blocks: the blocks that no sequence holds.

    Args:
        block_size: positions per block, at least 1.
        n_blocks: blocks in the pool, at least 1.
        n_kv_heads: key/value heads (of one layer; a model keeps one pool per layer and one block table).
        d_head: the width of a key and of a value.
        dtype, device: of the pool (``device=None``: the default device).

    Raises:
        ValueError: if a size is below 1.

    Source: Kwon et al. 2023, section 4 (PagedAttention, block tables, copy on write for parallel sampling
    and beam search).
    """

    def __init__(
        self,
        block_size: int,
        n_blocks: int,
        n_kv_heads: int,
        d_head: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        if min(block_size, n_blocks, n_kv_heads, d_head) < 1:
            raise ValueError(
                "sizes must be at least 1, got "
                f"{block_size, n_blocks, n_kv_heads, d_head}"
            )
        self.block_size = block_size
        shape = (n_blocks, n_kv_heads, block_size, d_head)
        self.key_blocks = torch.zeros(shape, dtype=dtype, device=device)
        self.value_blocks = torch.zeros(shape, dtype=dtype, device=device)
        self.block_tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self.ref_counts = [0] * n_blocks
        self.free_blocks = list(range(n_blocks))

    def append(
        self, seq_id: int, key: torch.Tensor, value: torch.Tensor
    ) -> None:
        """Store the keys and values of new positions of sequence ``seq_id`` (a new id starts a sequence).

        Args:
            seq_id: the sequence.
            key: ``[n_kv_heads, new_len, d_head]``, the new positions' keys.
            value: ``[n_kv_heads, new_len, d_head]``, their values.

        Raises:
            RuntimeError: if too few blocks are free; the cache is then left unchanged.
        """
        length, table = (
            self.lengths.get(seq_id, 0),
            list(self.block_tables.get(seq_id, [])),
        )
        end = length + key.size(1)
        # ceil(end / block_size) blocks in all
        needed = -(-end // self.block_size) - len(table)
        # a partly filled last block that another sequence holds too must be
        # copied before the write
        copy = (
            end > length
            and length % self.block_size != 0
            and self.ref_counts[table[-1]] > 1
        )
        if needed + copy > len(self.free_blocks):
            raise RuntimeError(
                f"out of blocks: sequence {seq_id} needs {needed + copy}, "
                f"{len(self.free_blocks)} are free"
            )
        if copy:
            shared, block = table[-1], self.free_blocks.pop(0)
            self.key_blocks[block] = self.key_blocks[shared]
            self.value_blocks[block] = self.value_blocks[shared]
            self.ref_counts[shared] -= 1
            self.ref_counts[block], table[-1] = 1, block
        for _ in range(needed):
            block = self.free_blocks.pop(0)
            self.ref_counts[block] = 1
            table.append(block)
        for i in range(key.size(1)):
            position = length + i
            block, slot = (
                table[position // self.block_size],
                position % self.block_size,
            )
            self.key_blocks[block, :, slot] = key[:, i]
            self.value_blocks[block, :, slot] = value[:, i]
        self.block_tables[seq_id], self.lengths[seq_id] = table, end

    def fork(self, parent: int, child: int) -> None:
        """Start sequence ``child`` as a copy of ``parent`` that shares all its blocks (nothing is copied).

        Raises:
            KeyError: if there is no sequence ``parent``.
            ValueError: if sequence ``child`` exists.
        """
        if child in self.block_tables:
            raise ValueError(f"sequence {child} exists")
        table = self.block_tables[parent]
        for block in table:
            self.ref_counts[block] += 1
        self.block_tables[child], self.lengths[child] = (
            list(table),
            self.lengths[parent],
        )

    def free(self, seq_id: int) -> None:
        """Forget sequence ``seq_id``; its blocks that no other sequence holds become free.

        Raises:
            KeyError: if there is no such sequence.
        """
        for block in self.block_tables.pop(seq_id):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_blocks.append(block)
        del self.lengths[seq_id]

    def gather(self, seq_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of sequence ``seq_id``, ``[n_kv_heads, len, d_head]`` each, in order.

        Raises:
            KeyError: if there is no such sequence.
        """
        table = torch.tensor(
            self.block_tables[seq_id],
            dtype=torch.long,
            device=self.key_blocks.device,
        )
        n_kv_heads, d_head = (
            self.key_blocks.size(1),
            self.key_blocks.size(3),
        )
        gathered = []
        for blocks in (self.key_blocks, self.value_blocks):
            # [n_kv_heads, n_used, block_size, d_head]
            picked = blocks[table].transpose(0, 1)
            # [n_kv_heads, n_used * block_size, d_head]
            flat = picked.reshape(n_kv_heads, -1, d_head)
            gathered.append(flat[:, : self.lengths[seq_id]])
        return gathered[0], gathered[1]
