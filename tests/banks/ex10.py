"""Implementations of exercise ex10 that a learner could plausibly write: wrong ones and right ones.

Every implementation uses only what the notebook's setup cell imports (``math``, ``torch``, ``F``, ``nn``),
and the classes of the cells above it (``generate`` builds the reference's ``KVCache``, as learner code).
Expectations name *exactly* the test cells that reject an implementation (``_bank.py``).
"""

import torch

from tests.banks._bank import Row

KV_CACHE = """class KVCache:
    def __init__(self, n_layers):
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
]

WHOLE = {}

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
CLASSES = {"blocks_taken_before_running_out": (PAGED_HALF_DONE, {FREE: "changed although the append failed"})}


# --- correct implementations in other styles

KV_CACHE_PREALLOCATED = """class KVCache:
    # a buffer per layer that doubles when full; append returns views of the filled part
    def __init__(self, n_layers):
        self.n_layers = n_layers
        self.buffers = [None] * n_layers
        self.filled = [0] * n_layers

    def append(self, layer, key, value):
        n = key.size(-2)
        end = self.filled[layer] + n
        buffer = self.buffers[layer]
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
        table = self.block_tables.setdefault(seq_id, [])
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
        self.lengths[seq_id] = start + n

    def gather(self, seq_id):
        n = self.lengths[seq_id]
        positions = torch.arange(n)
        index = torch.tensor(self.block_tables[seq_id], dtype=torch.long)[positions // self.block_size]
        slots = positions % self.block_size
        index, slots = index.to(self.key_blocks.device), slots.to(self.key_blocks.device)
        keys, values = self.key_blocks[index, :, slots], self.value_blocks[index, :, slots]
        return keys.transpose(0, 1), values.transpose(0, 1)

    def fork(self, parent, child):
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

RIGHT_CLASSES = {
    "preallocated_and_doubled": KV_CACHE_PREALLOCATED,
    "pieces_concatenated_when_read": KV_CACHE_CHUNKS,
    "vectorised_with_a_set_of_free_blocks": PAGED_VECTORISED,
}


def generate__four_dimensional_mask_and_comparisons(model, prompt, max_new_tokens, use_cache=True):
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


RIGHT = [generate__four_dimensional_mask_and_comparisons, generate__positions_per_sequence_float64_argmax]
