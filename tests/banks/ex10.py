"""Implementations of exercise ex10 that a learner could plausibly write: wrong ones and right ones.

Every implementation uses only what the notebook's setup cell imports (``math``, ``torch``, ``F``, ``nn``),
and the classes of the cells above it (``generate`` builds the reference's ``KVCache``, as learner code).
Expectations name *exactly* the test cells that reject an implementation (``_bank.py``).
"""

import torch

from tests.banks._bank import Row

KV_CACHE = """class KVCache:
    def __init__(self, n_layers):
        if n_layers < 1:
            raise ValueError("n_layers must be at least 1")
        self.k = [None] * n_layers
        self.v = [None] * n_layers

    def append(self, layer, key, value):
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = key, value
        else:
            self.k[layer] = torch.cat([self.k[layer], key], dim=2)
            self.v[layer] = torch.cat([self.v[layer], value], dim=2)
        return self.k[layer], self.v[layer]

    def keys(self, layer):
        return self.k[layer]

    def values(self, layer):
        return self.v[layer]

    @property
    def length(self):
        return 0 if self.k[0] is None else self.k[0].shape[2]

    def reset(self):
        self.k = [None] * len(self.k)
        self.v = [None] * len(self.v)
"""

GENERATE = """def generate(model, prompt, max_new_tokens, use_cache=True):
    if max_new_tokens < 0:
        raise ValueError("max_new_tokens must be at least 0")
    cache = KVCache(model.n_layers) if use_cache else None
    tokens = prompt
    new = prompt
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if not use_cache:
                new = tokens
            past = cache.length if use_cache else 0
            q_len = new.shape[1]
            positions = torch.arange(past, past + q_len, device=prompt.device)
            mask = torch.ones(q_len, past + q_len, dtype=torch.bool, device=prompt.device).tril(diagonal=past)
            logits = model(new, positions, mask, cache)
            new = logits[:, -1].argmax(dim=-1, keepdim=True)
            tokens = torch.cat([tokens, new], dim=1)
    return tokens
"""

PAGED = """class PagedKVCache:
    def __init__(self, block_size, n_blocks, n_kv_heads, d_head, dtype=torch.float32, device=None):
        if min(block_size, n_blocks, n_kv_heads, d_head) < 1:
            raise ValueError("every size must be at least 1")
        self.block_size = block_size
        self.key_blocks = torch.zeros(n_blocks, n_kv_heads, block_size, d_head, dtype=dtype, device=device)
        self.value_blocks = torch.zeros_like(self.key_blocks)
        self.block_tables = {}
        self.lengths = {}
        self.ref_counts = [0] * n_blocks
        self.free_blocks = list(range(n_blocks))

    def append(self, seq_id, key, value):
        table = list(self.block_tables.get(seq_id, []))
        length = self.lengths.get(seq_id, 0)
        end = length + key.shape[1]
        needed = math.ceil(end / self.block_size) - len(table)
        copy = end > length and length % self.block_size != 0 and self.ref_counts[table[-1]] > 1
        if needed + copy > len(self.free_blocks):
            raise RuntimeError("no free block left")
        if copy:
            new = self.free_blocks.pop(0)
            self.key_blocks[new] = self.key_blocks[table[-1]]
            self.value_blocks[new] = self.value_blocks[table[-1]]
            self.ref_counts[table[-1]] -= 1
            self.ref_counts[new] = 1
            table[-1] = new
        for _ in range(needed):
            new = self.free_blocks.pop(0)
            self.ref_counts[new] = 1
            table.append(new)
        for i in range(key.shape[1]):
            block = table[(length + i) // self.block_size]
            slot = (length + i) % self.block_size
            self.key_blocks[block, :, slot] = key[:, i]
            self.value_blocks[block, :, slot] = value[:, i]
        self.block_tables[seq_id] = table
        self.lengths[seq_id] = end

    def gather(self, seq_id):
        blocks = self.block_tables[seq_id]
        keys = torch.cat([self.key_blocks[b] for b in blocks], dim=1)
        values = torch.cat([self.value_blocks[b] for b in blocks], dim=1)
        return keys[:, : self.lengths[seq_id]], values[:, : self.lengths[seq_id]]

    def fork(self, parent, child):
        if child in self.block_tables:
            raise ValueError(f"sequence {child} exists")
        self.block_tables[child] = list(self.block_tables[parent])
        self.lengths[child] = self.lengths[parent]
        for block in self.block_tables[child]:
            self.ref_counts[block] += 1

    def free(self, seq_id):
        for block in self.block_tables.pop(seq_id):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_blocks.append(block)
        del self.lengths[seq_id]
"""

BASES = {"KVCache": KV_CACHE, "generate": GENERATE, "PagedKVCache": PAGED}

APPEND, LENGTH = "kv_cache_append", "kv_cache_length_reset"
WITHOUT, WITH, USES = "generate_without_cache", "generate_with_cache", "generate_uses_cache"
GATHER, FORK, FREE = "paged_gather", "paged_fork", "paged_free"
RIGHT_TOKENS = "must give the right tokens before its use of the cache counts"


def every(cells, fragment):
    return dict.fromkeys(cells, fragment)


ROWS = [
    Row(
        "KVCache",
        "appended_on_the_heads_axis",
        "            self.k[layer] = torch.cat([self.k[layer], key], dim=2)\n"
        "            self.v[layer] = torch.cat([self.v[layer], value], dim=2)\n",
        "            self.k[layer] = torch.cat([self.k[layer], key], dim=1)\n"
        "            self.v[layer] = torch.cat([self.v[layer], value], dim=1)\n",
        every((APPEND, LENGTH), "concatenated on the wrong axis"),
    ),
    Row(
        "KVCache",
        "appended_on_the_last_axis",
        "            self.k[layer] = torch.cat([self.k[layer], key], dim=2)\n"
        "            self.v[layer] = torch.cat([self.v[layer], value], dim=2)\n",
        "            self.k[layer] = torch.cat([self.k[layer], key], dim=-1)\n"
        "            self.v[layer] = torch.cat([self.v[layer], value], dim=-1)\n",
        every((APPEND, LENGTH), "concatenated on the wrong axis"),
    ),
    Row(
        "KVCache",
        "returns_the_new_keys_only",
        "        return self.k[layer], self.v[layer]\n",
        "        return key, value\n",
        {APPEND: "only the new keys"},
    ),
    Row(
        "KVCache",
        "one_cache_for_every_layer",
        "    def append(self, layer, key, value):\n",
        "    def append(self, layer, key, value):\n        layer = 0\n",
        {APPEND: "the layers share one cache", LENGTH: "cache.length in"},
    ),
    Row(
        "KVCache",
        "length_counts_heads",
        "self.k[0].shape[2]",
        "self.k[0].shape[1]",
        {LENGTH: "cache.length in"},
    ),
    Row(
        "KVCache",
        "reset_assigns_locals",
        "        self.k = [None] * len(self.k)\n        self.v = [None] * len(self.v)\n",
        "        k, v = [None] * len(self.k), [None] * len(self.v)\n",
        {LENGTH: "reset() did not empty the cache"},
    ),
    Row(
        "KVCache",
        "keys_and_values_swapped",
        "    def keys(self, layer):\n        return self.k[layer]\n",
        "    def keys(self, layer):\n        return self.v[layer]\n",
        every((APPEND, LENGTH), "keys and values are swapped"),
    ),
    Row(
        "generate",
        "positions_not_advanced",
        "torch.arange(past, past + q_len, device=prompt.device)",
        "torch.arange(q_len, device=prompt.device)",
        {WITH: "put at positions 0, 1, ... at every step", USES: RIGHT_TOKENS},
    ),
    Row(
        "generate",
        "top_left_causal_mask",
        ".tril(diagonal=past)",
        ".tril()",
        {WITH: "aligned top-left", USES: RIGHT_TOKENS},
    ),
    Row(
        "generate",
        "no_mask",
        "            logits = model(new, positions, mask, cache)\n",
        "            logits = model(new, positions, None, cache)\n",
        {WITHOUT: "no causal mask", WITH: "no causal mask", USES: RIGHT_TOKENS},
    ),
    Row(
        "generate",
        "recomputes_everything",
        "    cache = KVCache(model.n_layers) if use_cache else None\n",
        "    use_cache, cache = False, None  # the cache is never used\n",
        {USES: "recomputes the keys and values of earlier positions"},
    ),
    Row(
        "generate",
        "whole_sequence_into_the_cache",
        "            if not use_cache:\n                new = tokens\n",
        "            new = tokens\n",
        every((WITH, USES), "feed only the tokens the model has not seen"),
    ),
    Row(
        "generate",
        "prompt_skipped",
        "    new = prompt\n",
        "    new = prompt[:, -1:]\n",
        {WITH: "only the prompt's last token", USES: RIGHT_TOKENS},
    ),
    Row(
        "generate",
        "mask_without_the_new_keys",
        "torch.ones(q_len, past + q_len, dtype=torch.bool",
        "torch.ones(q_len, max(past, q_len), dtype=torch.bool",
        every((WITH, USES), "the mask must be [q_len, k_len]"),
    ),
    Row(
        "generate",
        "float_positions",
        "torch.arange(past, past + q_len, device=prompt.device)",
        "torch.arange(past, past + q_len, device=prompt.device, dtype=torch.float32)",
        every((WITHOUT, WITH, USES), "positions are integer"),
    ),
    Row(
        "PagedKVCache",
        "no_copy_on_write",
        "        copy = end > length and length % self.block_size != 0 and self.ref_counts[table[-1]] > 1\n",
        "        copy = False\n",
        every((FORK, FREE), "copy on write is missing"),
    ),
    Row(
        "PagedKVCache",
        "fork_copies_the_blocks",
        "        self.block_tables[child] = list(self.block_tables[parent])\n",
        "        self.block_tables[child] = []\n"
        "        for block in self.block_tables[parent]:\n"
        "            new = self.free_blocks.pop(0)\n"
        "            self.key_blocks[new] = self.key_blocks[block]\n"
        "            self.value_blocks[new] = self.value_blocks[block]\n"
        "            self.block_tables[child].append(new)\n",
        every((FORK, FREE), "that it shares with another sequence"),
    ),
    Row(
        "PagedKVCache",
        "fork_without_reference_counts",
        "        for block in self.block_tables[child]:\n            self.ref_counts[block] += 1\n",
        "",
        every((FORK, FREE), "block tables hold block"),
    ),
    Row(
        "PagedKVCache",
        "free_ignores_reference_counts",
        "            if self.ref_counts[block] == 0:\n                self.free_blocks.append(block)\n",
        "            self.free_blocks.append(block)\n",
        {FREE: "was freed while a sequence still holds it"},
    ),
    Row(
        "PagedKVCache",
        "free_leaks_the_blocks",
        "            if self.ref_counts[block] == 0:\n                self.free_blocks.append(block)\n",
        "",
        {FREE: "(a leak)"},
    ),
    Row(
        "PagedKVCache",
        "one_block_too_many",
        "math.ceil(end / self.block_size)",
        "(end + self.block_size) // self.block_size",
        every((GATHER, FORK, FREE), "ceil(len / block_size)"),
    ),
    Row(
        "PagedKVCache",
        "slot_off_by_one",
        "            slot = (length + i) % self.block_size\n",
        "            slot = (length + i + 1) % self.block_size\n",
        every((GATHER, FORK, FREE), "gathered by"),
    ),
    Row(
        "PagedKVCache",
        "gather_reads_the_first_blocks",
        "        blocks = self.block_tables[seq_id]\n",
        "        blocks = range(len(self.block_tables[seq_id]))\n",
        every((GATHER, FORK, FREE), "gathered by"),
    ),
    Row(
        "PagedKVCache",
        "no_check_before_allocating",
        "        if needed + copy > len(self.free_blocks):\n"
        '            raise RuntimeError("no free block left")\n',
        "",
        {FREE: "should raise RuntimeError"},
    ),
    # --- the documented errors and promises, clause by clause
    Row(
        "KVCache",
        "n_layers_not_checked",
        '        if n_layers < 1:\n            raise ValueError("n_layers must be at least 1")\n',
        "",
        {APPEND: "should raise ValueError if n_layers < 1"},
    ),
    Row(
        "KVCache",
        "misfit_keys_raise_value_error",
        "        else:\n            self.k[layer] = torch.cat([self.k[layer], key], dim=2)\n",
        "        else:\n"
        "            if key.shape[:2] != self.k[layer].shape[:2] or key.shape[3] != self.k[layer].shape[3]:\n"
        '                raise ValueError("the new keys do not fit the cached ones")\n'
        "            self.k[layer] = torch.cat([self.k[layer], key], dim=2)\n",
        {APPEND: "raised ValueError: the new keys do not fit"},
    ),
    Row(
        "KVCache",
        "length_of_the_last_layer",
        "        return 0 if self.k[0] is None else self.k[0].shape[2]\n",
        "        return 0 if self.k[-1] is None else self.k[-1].shape[2]\n",
        {LENGTH: "length reads another layer than layer 0"},
    ),
    Row(
        "KVCache",
        "reset_empties_layer_0_only",
        "        self.k = [None] * len(self.k)\n        self.v = [None] * len(self.v)\n",
        "        self.k[0] = self.v[0] = None\n",
        {LENGTH: "reset() did not empty the cache"},
    ),
    Row(
        "generate",
        "negative_max_new_tokens_accepted",
        '    if max_new_tokens < 0:\n        raise ValueError("max_new_tokens must be at least 0")\n',
        "",
        {WITHOUT: "should raise ValueError if max_new_tokens < 0"},
    ),
    Row(
        "PagedKVCache",
        "sizes_not_checked",
        "        if min(block_size, n_blocks, n_kv_heads, d_head) < 1:\n"
        '            raise ValueError("every size must be at least 1")\n',
        "",
        {GATHER: "should raise ValueError if a size is below 1"},
    ),
    Row(
        "PagedKVCache",
        "pool_in_the_default_dtype",
        "block_size, d_head, dtype=dtype, device=device)",
        "block_size, d_head, device=device)",
        {GATHER: "but the cache was made with dtype=torch.float64"},
    ),
    Row(
        "PagedKVCache",
        "overflow_check_forgets_the_copy",
        "        if needed + copy > len(self.free_blocks):\n",
        "        if needed > len(self.free_blocks):\n",
        {FREE: "should raise RuntimeError, but gave IndexError"},
    ),
    Row(
        "PagedKVCache",
        "overflow_check_counts_a_full_shared_block",
        "        if needed + copy > len(self.free_blocks):\n",
        "        if needed + (bool(table) and self.ref_counts[table[-1]] > 1) > len(self.free_blocks):\n",
        {FREE: "raised RuntimeError: no free block left"},
    ),
    Row(
        "PagedKVCache",
        "length_stored_before_the_check",
        "        if needed + copy > len(self.free_blocks):\n",
        "        self.lengths[seq_id] = end\n        if needed + copy > len(self.free_blocks):\n",
        {FREE: "the cache changed although the append failed"},
    ),
    Row(
        "PagedKVCache",
        "fork_overwrites_a_sequence",
        '        if child in self.block_tables:\n            raise ValueError(f"sequence {child} exists")\n',
        "",
        {FORK: "should raise ValueError since sequence 2 exists"},
    ),
    Row(
        "PagedKVCache",
        "fork_from_no_sequence",
        "        self.block_tables[child] = list(self.block_tables[parent])\n"
        "        self.lengths[child] = self.lengths[parent]\n",
        "        self.block_tables[child] = list(self.block_tables.get(parent, []))\n"
        "        self.lengths[child] = self.lengths.get(parent, 0)\n",
        {FORK: "should raise KeyError since there is no parent sequence 9"},
    ),
    Row(
        "PagedKVCache",
        "free_of_no_sequence_passes",
        "        for block in self.block_tables.pop(seq_id):\n",
        "        if seq_id not in self.block_tables:\n"
        "            return  # nothing to free\n"
        "        for block in self.block_tables.pop(seq_id):\n",
        {FREE: "should raise KeyError since there is no sequence 0"},
    ),
    Row(
        "PagedKVCache",
        "free_keeps_the_length",
        "        del self.lengths[seq_id]\n",
        "",
        {FREE: "free must forget the sequence entirely"},
    ),
    Row(
        "PagedKVCache",
        "gather_of_no_sequence_is_empty",
        "        blocks = self.block_tables[seq_id]\n",
        "        blocks = self.block_tables.get(seq_id, [])\n"
        "        if not blocks:\n"
        "            return self.key_blocks[0, :, :0], self.value_blocks[0, :, :0]\n",
        every((GATHER, FREE), "should raise KeyError since there is no sequence"),
    ),
]


def generate__first_token_before_the_loop(model, prompt, max_new_tokens, use_cache=True):
    # the prompt runs once before the loop (prefill), then one step per remaining token (decode)
    if max_new_tokens < 0:
        raise ValueError("max_new_tokens must be at least 0")
    cache = KVCache(model.n_layers) if use_cache else None  # noqa: F821 (the notebook's own)
    length = prompt.size(1)
    positions = torch.arange(length, device=prompt.device)
    mask = torch.ones(length, length, dtype=torch.bool, device=prompt.device).tril()
    with torch.no_grad():
        next_token = model(prompt, positions, mask, cache)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([prompt, next_token], dim=1)
        for _ in range(max_new_tokens - 1):
            past = cache.length if use_cache else 0
            new = next_token if use_cache else tokens
            q_len = new.size(1)
            positions = torch.arange(past, past + q_len, device=prompt.device)
            mask = torch.ones(q_len, past + q_len, dtype=torch.bool, device=prompt.device).tril(past)
            next_token = model(new, positions, mask, cache)[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, next_token], dim=1)
    return tokens


def generate__cache_kept_on_the_model(model, prompt, max_new_tokens, use_cache=True):
    # one cache per model, made at its first use and kept for later calls
    if max_new_tokens < 0:
        raise ValueError("max_new_tokens must be at least 0")
    if use_cache and not hasattr(model, "kv_cache"):
        model.kv_cache = KVCache(model.n_layers)  # noqa: F821 (the notebook's own)
    cache = model.kv_cache if use_cache else None
    tokens = new = prompt
    with torch.no_grad():
        for _ in range(max_new_tokens):
            past = cache.length if use_cache else 0
            new = new if use_cache else tokens
            q_len = new.size(1)
            positions = torch.arange(past, past + q_len, device=prompt.device)
            mask = torch.ones(q_len, past + q_len, dtype=torch.bool, device=prompt.device).tril(diagonal=past)
            new = model(new, positions, mask, cache)[:, -1].argmax(dim=-1, keepdim=True)
            tokens = torch.cat([tokens, new], dim=1)
    return tokens


WHOLE = {
    generate__first_token_before_the_loop: every((WITHOUT, WITH, USES), "has shape [2, 4], expected [2, 3]"),
    generate__cache_kept_on_the_model: every(
        (WITH, USES), "the keys and values of an earlier call were used"
    ),
}

# blocks taken one at a time, each checked as it is taken: running out leaves the blocks taken before
PAGED_HALF_DONE = PAGED.replace(
    "        if needed + copy > len(self.free_blocks):\n",
    "        if copy > len(self.free_blocks):\n",
).replace(
    "        for _ in range(needed):\n            new = self.free_blocks.pop(0)\n",
    "        for _ in range(needed):\n"
    "            if not self.free_blocks:\n"
    '                raise RuntimeError("no free block left")\n'
    "            new = self.free_blocks.pop(0)\n",
)
# copy on write decided by a set of the blocks that a fork ever shared, never emptied: a block that its other
# holders have left (by a copy or a free) is still copied, and the old one freed
PAGED_STICKY = (
    PAGED.replace(
        "        self.free_blocks = list(range(n_blocks))\n",
        "        self.free_blocks = list(range(n_blocks))\n        self.forked = set()\n",
    )
    .replace(
        "and self.ref_counts[table[-1]] > 1\n",
        "and table[-1] in self.forked\n",
    )
    .replace(
        "            self.ref_counts[table[-1]] -= 1\n",
        "            self.ref_counts[table[-1]] -= 1\n"
        "            if self.ref_counts[table[-1]] == 0:\n"
        "                self.free_blocks.append(table[-1])\n",
    )
    .replace(
        "        for block in self.block_tables[child]:\n            self.ref_counts[block] += 1\n",
        "        for block in self.block_tables[child]:\n"
        "            self.ref_counts[block] += 1\n"
        "            self.forked.add(block)\n",
    )
)
assert PAGED_STICKY.count("forked") == 3 and PAGED_STICKY.count("self.free_blocks.append") == 2
CLASSES = {"blocks_taken_before_running_out": (PAGED_HALF_DONE, {FREE: "changed although the append failed"})}


# --- correct implementations in other styles

KV_CACHE_PREALLOCATED = """class KVCache:
    # a buffer per layer that doubles when full; append returns views of the filled part
    def __init__(self, n_layers):
        if n_layers < 1:
            raise ValueError(f"a cache needs at least one layer, got n_layers={n_layers}")
        self.n_layers = n_layers
        self.buffers = [None] * n_layers
        self.filled = [0] * n_layers

    def append(self, layer, key, value):
        n = key.size(-2)
        end = self.filled[layer] + n
        buffer = self.buffers[layer]
        if buffer is not None and (key.shape[:2] != buffer.shape[1:3] or key.size(-1) != buffer.size(-1)):
            raise RuntimeError(f"keys {list(key.shape)} do not fit the cached {list(buffer.shape[1:])}")
        if buffer is None or buffer.size(3) < end:
            size = max(end, 2 * (buffer.size(3) if buffer is not None else 1))
            grown = key.new_zeros(2, *key.shape[:2], size, key.shape[-1])
            if buffer is not None:
                grown[:, :, :, : self.filled[layer]] = buffer[:, :, :, : self.filled[layer]]
            self.buffers[layer] = buffer = grown
        buffer[0, :, :, self.filled[layer] : end] = key
        buffer[1, :, :, self.filled[layer] : end] = value
        self.filled[layer] = end
        return self.keys(layer), self.values(layer)

    def keys(self, layer):
        return None if self.buffers[layer] is None else self.buffers[layer][0, :, :, : self.filled[layer]]

    def values(self, layer):
        return None if self.buffers[layer] is None else self.buffers[layer][1, :, :, : self.filled[layer]]

    @property
    def length(self):
        return self.filled[0]

    def reset(self):
        self.filled = [0] * self.n_layers
"""

KV_CACHE_CHUNKS = """class KVCache:
    # the pieces of each layer, concatenated when read
    def __init__(self, n_layers):
        if not n_layers >= 1:
            raise ValueError("n_layers < 1")
        self.pieces = [[] for _ in range(n_layers)]

    def append(self, layer, key, value):
        self.pieces[layer].append((key, value))
        return self.keys(layer), self.values(layer)

    def keys(self, layer):
        return torch.cat([k for k, _ in self.pieces[layer]], dim=-2) if self.pieces[layer] else None

    def values(self, layer):
        return torch.cat([v for _, v in self.pieces[layer]], dim=-2) if self.pieces[layer] else None

    @property
    def length(self):
        return sum(k.size(-2) for k, _ in self.pieces[0])

    def reset(self):
        for pieces in self.pieces:
            pieces.clear()
"""

PAGED_VECTORISED = """class PagedKVCache:
    # writes with index_put, a set of free blocks, blocks handed out from the highest id
    def __init__(self, block_size, n_blocks, n_kv_heads, d_head, dtype=torch.float32, device=None):
        sizes = {"block_size": block_size, "n_blocks": n_blocks, "n_kv_heads": n_kv_heads, "d_head": d_head}
        for name, size in sizes.items():
            if size < 1:
                raise ValueError(f"{name} must be at least 1, got {size}")
        self.block_size = block_size
        self.key_blocks = torch.zeros(n_blocks, n_kv_heads, block_size, d_head, dtype=dtype, device=device)
        self.value_blocks = torch.zeros(n_blocks, n_kv_heads, block_size, d_head, dtype=dtype, device=device)
        self.block_tables, self.lengths = {}, {}
        self.ref_counts = [0] * n_blocks
        self.free_blocks = set(range(n_blocks))

    def _take(self):
        block = max(self.free_blocks)
        self.free_blocks.remove(block)
        self.ref_counts[block] = 1
        return block

    def append(self, seq_id, key, value):
        table = list(self.block_tables.get(seq_id, []))
        start = self.lengths.get(seq_id, 0)
        n = key.size(1)
        blocks_after = -(-(start + n) // self.block_size)
        shared_tail = n > 0 and start % self.block_size > 0 and self.ref_counts[table[-1]] >= 2
        if blocks_after - len(table) + int(shared_tail) > len(self.free_blocks):
            raise RuntimeError(f"cannot store {n} positions: only {len(self.free_blocks)} blocks are free")
        if shared_tail:
            old = table[-1]
            table[-1] = self._take()
            self.key_blocks[table[-1]] = self.key_blocks[old]
            self.value_blocks[table[-1]] = self.value_blocks[old]
            self.ref_counts[old] -= 1
        while len(table) < blocks_after:
            table.append(self._take())
        positions = torch.arange(start, start + n)
        index = torch.tensor(table)[positions // self.block_size].to(self.key_blocks.device)
        slots = (positions % self.block_size).to(self.key_blocks.device)
        self.key_blocks[index, :, slots] = key.transpose(0, 1)
        self.value_blocks[index, :, slots] = value.transpose(0, 1)
        self.block_tables[seq_id], self.lengths[seq_id] = table, start + n

    def gather(self, seq_id):
        n = self.lengths[seq_id]
        positions = torch.arange(n)
        index = torch.tensor(self.block_tables[seq_id], dtype=torch.long)[positions // self.block_size]
        slots = positions % self.block_size
        index, slots = index.to(self.key_blocks.device), slots.to(self.key_blocks.device)
        keys, values = self.key_blocks[index, :, slots], self.value_blocks[index, :, slots]
        return keys.transpose(0, 1), values.transpose(0, 1)

    def fork(self, parent, child):
        if child in self.lengths:
            raise ValueError(f"cannot fork into {child}: it is a sequence already")
        for block in self.block_tables[parent]:
            self.ref_counts[block] += 1
        self.block_tables[child] = self.block_tables[parent][:]
        self.lengths[child] = self.lengths[parent]

    def free(self, seq_id):
        self.lengths.pop(seq_id)
        for block in self.block_tables.pop(seq_id):
            self.ref_counts[block] -= 1
            if not self.ref_counts[block]:
                self.free_blocks.add(block)
"""

KV_CACHE_DICT = """class KVCache:
    # a dict of layers: a layer is created when it is first appended to
    def __init__(self, n_layers):
        if n_layers < 1:
            raise ValueError("n_layers must be at least 1")
        self.held = {}

    def append(self, layer, key, value):
        if layer in self.held:
            old_keys, old_values = self.held[layer]
            key, value = torch.cat([old_keys, key], dim=2), torch.cat([old_values, value], dim=2)
        self.held[layer] = (key, value)
        return key, value

    def keys(self, layer):
        return self.held[layer][0] if layer in self.held else None

    def values(self, layer):
        return self.held[layer][1] if layer in self.held else None

    @property
    def length(self):
        return self.held[0][0].size(2) if 0 in self.held else 0

    def reset(self):
        self.held = {}
"""

KV_CACHE_EMPTY_TENSORS = """class KVCache:
    # every layer starts as an empty tensor, so that append always concatenates
    def __init__(self, n_layers):
        if n_layers < 1:
            raise ValueError("n_layers must be at least 1")
        self.k = [torch.empty(0) for _ in range(n_layers)]
        self.v = [torch.empty(0) for _ in range(n_layers)]

    def append(self, layer, key, value):
        self.k[layer] = torch.cat([self.k[layer], key], dim=2)
        self.v[layer] = torch.cat([self.v[layer], value], dim=2)
        return self.k[layer], self.v[layer]

    def keys(self, layer):
        return self.k[layer]

    def values(self, layer):
        return self.v[layer]

    @property
    def length(self):
        return self.k[0].shape[2] if self.k[0].dim() == 4 else 0

    def reset(self):
        self.__init__(len(self.k))
"""

# the right preallocated cache without its check of the new keys' shape: a batch of 1 broadcasts
KV_CACHE_BROADCASTS = KV_CACHE_PREALLOCATED.replace(
    "        if buffer is not None and (key.shape[:2] != buffer.shape[1:3] or key.size(-1) != buffer.size(-1)"
    "):\n"
    '            raise RuntimeError(f"keys {list(key.shape)} do not fit the cached {list(buffer.shape[1:])}"'
    ")\n",
    "",
)
assert KV_CACHE_BROADCASTS != KV_CACHE_PREALLOCATED
# and with its buffers in the default dtype, float32
KV_CACHE_FLOAT32 = KV_CACHE_PREALLOCATED.replace(
    "grown = key.new_zeros(2, *key.shape[:2], size, key.shape[-1])",
    "grown = torch.zeros(2, *key.shape[:2], size, key.shape[-1], device=key.device)",
)


RIGHT_CLASSES = {
    "preallocated_and_doubled": KV_CACHE_PREALLOCATED,
    "pieces_concatenated_when_read": KV_CACHE_CHUNKS,
    "vectorised_with_a_set_of_free_blocks": PAGED_VECTORISED,
}
CLASSES |= {
    "layers_in_a_dict": (KV_CACHE_DICT, {APPEND: "should raise IndexError for layer 2 of 2 layers"}),
    "empty_tensors_before_the_first_append": (KV_CACHE_EMPTY_TENSORS, {APPEND: "expected None"}),
    "preallocated_buffer_broadcasts_a_batch_of_1": (
        KV_CACHE_BROADCASTS,
        {APPEND: "should raise RuntimeError if the new keys do not fit"},
    ),
    "preallocated_buffer_in_float32": (KV_CACHE_FLOAT32, every((APPEND, LENGTH), "dtype=key.dtype")),
    "copies_every_block_ever_forked": (PAGED_STICKY, every((FORK, FREE), "is written in place")),
}


def generate__four_dimensional_mask_and_comparisons(model, prompt, max_new_tokens, use_cache=True):
    if max_new_tokens < 0:
        raise ValueError(f"cannot generate {max_new_tokens} tokens")
    batch = prompt.size(0)
    cache = KVCache(model.n_layers) if use_cache else None  # noqa: F821 (the notebook's own)
    out = prompt.clone()
    for step in range(max_new_tokens):
        todo = out if cache is None else (out if step == 0 else out[:, -1:])
        start = 0 if cache is None else cache.length
        query_positions = torch.arange(start, start + todo.size(1), device=out.device)
        key_positions = torch.arange(start + todo.size(1), device=out.device)
        mask = (key_positions[None, :] <= query_positions[:, None]).expand(batch, 1, -1, -1)
        logits = model(todo, query_positions, mask, cache).detach()
        out = torch.cat([out, logits[:, -1, :].argmax(-1)[:, None]], dim=-1)
    return out


def generate__positions_per_sequence_float64_argmax(model, prompt, max_new_tokens, use_cache=True):
    if not max_new_tokens >= 0:
        raise ValueError("max_new_tokens must not be negative")
    cache = KVCache(model.n_layers) if use_cache else None  # noqa: F821 (the notebook's own)
    tokens, pending = prompt, prompt
    for _ in range(max_new_tokens):
        feed = pending if use_cache else tokens
        seen = cache.length if use_cache else 0
        positions = (seen + torch.arange(feed.size(1), device=feed.device)).expand(feed.size(0), -1)
        mask = (
            torch.tril(torch.ones(feed.size(1), seen + feed.size(1), device=feed.device), diagonal=seen) > 0
        )
        with torch.no_grad():
            logits = model(feed, positions, mask, cache)
        pending = torch.argmax(logits[:, -1].double(), dim=-1).unsqueeze(-1)
        tokens = torch.cat((tokens, pending), dim=1)
    return tokens


def generate__one_cache_per_model_reset_every_call(model, prompt, max_new_tokens, use_cache=True):
    # the cache lives on the model and is emptied at the start of every call
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} is negative")
    cache = None
    if use_cache:
        if getattr(model, "kv_cache", None) is None:
            model.kv_cache = KVCache(model.n_layers)  # noqa: F821 (the notebook's own)
        cache = model.kv_cache
        cache.reset()
    generated = prompt
    todo = prompt
    for _ in range(max_new_tokens):
        start = cache.length if cache is not None else 0
        positions = torch.arange(start, start + todo.size(1), device=prompt.device)
        allowed = torch.arange(start + todo.size(1), device=prompt.device)[None, :] <= positions[:, None]
        with torch.no_grad():
            logits = model(todo, positions, allowed, cache)
        step = logits[:, -1].argmax(dim=-1, keepdim=True)
        generated = torch.cat([generated, step], dim=1)
        todo = step if cache is not None else generated
    return generated


RIGHT = [
    generate__four_dimensional_mask_and_comparisons,
    generate__positions_per_sequence_float64_argmax,
    generate__one_cache_per_model_reset_every_call,
]
