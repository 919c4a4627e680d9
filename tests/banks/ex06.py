"""Implementations of exercise ex06 that a learner could plausibly write: wrong ones and right ones.

Every implementation uses only what the notebook's setup cell imports (``math``, ``torch``, ``F``, ``nn``),
and the classes of the cells above it (the reference's, as learner code: ``MultiHeadAttention``,
``CrossAttention``). Expectations name *exactly* the test cells that reject an implementation (``_bank.py``).
"""

from tests.banks._bank import Row
from tests.banks.ex04 import MHA

CROSS = """class CrossAttention(MultiHeadAttention):
    def forward(self, target, source, mask=None, use_cache=False):
        batch, tgt_len, _ = target.shape
        q = self.w_q(target).view(batch, tgt_len, self.n_heads, self.d_head).transpose(1, 2)
        k, v = self.source_kv(source) if use_cache else self.keys_values(source)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        if mask is not None:
            if mask.dtype != torch.bool:
                raise TypeError(f"mask must be boolean, got {mask.dtype}")
            if mask.dim() == 3:
                mask = mask.unsqueeze(1)
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = torch.nan_to_num(weights, nan=0.0)
        heads = (weights @ v).transpose(1, 2).reshape(batch, tgt_len, self.d_model)
        return self.w_o(heads), weights

    def source_kv(self, source):
        weights_seen = [p._version for p in (*self.w_k.parameters(), *self.w_v.parameters())]
        state = (source._version, *weights_seen)
        cached = getattr(self, "cached", None)
        if cached is None or cached[0] is not source or cached[1] != state:
            self.cached = (source, state, *self.keys_values(source))
        return self.cached[2], self.cached[3]

    def clear_cache(self):
        self.cached = None

    def keys_values(self, source):
        batch, src_len, _ = source.shape
        k = self.w_k(source).view(batch, src_len, self.n_heads, self.d_head).transpose(1, 2)
        v = self.w_v(source).view(batch, src_len, self.n_heads, self.d_head).transpose(1, 2)
        return k, v
"""

DECODER = """class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.cross_attn = CrossAttention(d_model, n_heads)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(self, x, memory, self_mask=None, memory_mask=None, use_cache=False):
        def self_block(y):
            return self.self_attn(y, y, y, self_mask)[0]

        def cross_block(y):
            return self.cross_attn(y, memory, memory_mask, use_cache)[0]

        def feed_forward(y):
            return self.linear2(torch.relu(self.linear1(y)))

        if self.norm_first:
            x = x + self_block(self.norm1(x))
            x = x + cross_block(self.norm2(x))
            x = x + feed_forward(self.norm3(x))
        else:
            x = self.norm1(x + self_block(x))
            x = self.norm2(x + cross_block(x))
            x = self.norm3(x + feed_forward(x))
        return x
"""

BASES = {"MultiHeadAttention": MHA, "CrossAttention": CROSS, "DecoderLayer": DECODER}

MUST_BE_CORRECT = "must be correct before it counts as written from scratch"
DECODER_CELLS = ("decoder_matches_torch", "decoder_step_by_step")


def every(cells, fragment):
    return dict.fromkeys(cells, fragment)


ROWS = [
    Row(
        "MultiHeadAttention",
        "scale_by_d_model",
        "/ math.sqrt(self.d_head)",
        "/ math.sqrt(self.d_model)",
        {"mha_carried_over": "sqrt(d_model)"},
    ),
    Row(
        "CrossAttention",
        "arguments_swapped",
        "def forward(self, target, source, mask=None, use_cache=False):",
        "def forward(self, source, target, mask=None, use_cache=False):",
        {
            "cross_shapes": "the queries come from the target",
            "cross_matches_torch": "the queries come from the target",
            "cross_source_permutation": "must match the size",  # the padding mask meets the target's axis
            "cross_cache": "Expected size",
            "cross_from_scratch": MUST_BE_CORRECT,
        },
    ),
    Row(
        "CrossAttention",
        "cache_never_recomputed",
        "if cached is None or cached[0] is not source or cached[1] != state:",
        "if cached is None:",
        {"cross_cache": "reused for a new source"},
    ),
    Row(
        "CrossAttention",
        "cache_keyed_on_shape",
        "if cached is None or cached[0] is not source or cached[1] != state:",
        "if cached is None or cached[2].size(2) != source.size(1):",
        {"cross_cache": "reused for a new source"},
    ),
    Row(
        "CrossAttention",
        "cache_ignored",
        "self.source_kv(source) if use_cache else",
        "self.source_kv(source) if False else",
        {"cross_cache": "recomputed at every step"},
    ),
    Row(
        "CrossAttention",
        "causal_mask_in_cross_attention",
        '            scores = scores.masked_fill(~mask, float("-inf"))\n',
        "        causal = torch.ones(tgt_len, k.size(2), dtype=torch.bool, device=q.device).tril()\n"
        "        mask = causal if mask is None else mask & causal\n"
        '        scores = scores.masked_fill(~mask, float("-inf"))\n',
        {
            "cross_matches_torch": "a causal mask is applied in cross-attention",
            "cross_cache": "does not match",
            "cross_source_permutation": "depends on the source positions' order",
            "cross_from_scratch": MUST_BE_CORRECT,
        },
    ),
    Row(
        "CrossAttention",
        "mask_ignored",
        '            scores = scores.masked_fill(~mask, float("-inf"))\n',
        "",
        {
            "cross_matches_torch": "mask",
            "cross_cache": "does not match",
            "cross_from_scratch": MUST_BE_CORRECT,
        },
    ),
    # what the docstring promises beyond the task's first lines
    Row(
        "CrossAttention",
        "no_head_axis_for_3d_mask",
        "            if mask.dim() == 3:\n                mask = mask.unsqueeze(1)\n",
        "",
        {"cross_matches_torch": "give it a head axis", "cross_from_scratch": MUST_BE_CORRECT},
    ),
    Row(
        "CrossAttention",
        "no_mask_type_check",
        "            if mask.dtype != torch.bool:\n",
        "            if False:\n",
        {"cross_shapes": "check mask.dtype != torch.bool first and raise TypeError"},
    ),
    Row(
        "CrossAttention",
        "empty_rows_nan",
        "        if mask is not None:\n            weights = torch.nan_to_num(weights, nan=0.0)\n",
        "",
        {"cross_matches_torch": "contains NaN or inf", "cross_from_scratch": MUST_BE_CORRECT},
    ),
    Row(
        "CrossAttention",
        "cache_keyed_on_identity",
        "or cached[0] is not source or cached[1] != state:",
        "or cached[0] is not source:",
        {"cross_cache": "source._version"},
    ),
    Row(
        "CrossAttention",
        "cache_ignores_the_weights",
        "        state = (source._version, *weights_seen)\n",
        "        state = (source._version,)\n",
        {"cross_cache": "w_k or w_v changed since"},
    ),
    Row(
        "CrossAttention",
        "clear_cache_keeps_the_cache",
        "        self.cached = None\n",
        "        pass\n",
        {"cross_cache": "clear_cache() forgets the cached keys and values"},
    ),
    Row(
        "DecoderLayer",
        "masks_made_boolean",
        "        def self_block(y):\n",
        "        self_mask = None if self_mask is None else self_mask.bool()\n"
        "        memory_mask = None if memory_mask is None else memory_mask.bool()\n\n"
        "        def self_block(y):\n",
        {"decoder_matches_torch": "converting it (mask.bool(), mask == 1)"},
    ),
    Row(
        "CrossAttention",
        "scale_by_d_model",
        "/ math.sqrt(self.d_head)",
        "/ math.sqrt(self.d_model)",
        {
            "cross_matches_torch": "sqrt(d_model)",
            "cross_cache": "does not match",
            "cross_from_scratch": MUST_BE_CORRECT,
        },
    ),
    Row(
        "CrossAttention",
        "weights_averaged_over_heads",
        "return self.w_o(heads), weights",
        "return self.w_o(heads), weights.mean(dim=1)",
        {
            "cross_shapes": "averaged over heads",
            "cross_matches_torch": "averaged over heads",
            "cross_source_permutation": "averaged over heads",
            "cross_cache": "averaged over heads",
            "cross_from_scratch": MUST_BE_CORRECT,
        },
    ),
    Row(
        "CrossAttention",
        "builtin_sdpa",
        "heads = (weights @ v).transpose(1, 2)",
        "heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)",
        {"cross_from_scratch": "calls"},
    ),
    Row(
        "DecoderLayer",
        "cross_attention_first",
        "            x = self.norm1(x + self_block(x))\n            x = self.norm2(x + cross_block(x))\n",
        "            x = self.norm1(x + cross_block(x))\n            x = self.norm2(x + self_block(x))\n",
        every(DECODER_CELLS, "cross-attention comes before self-attention"),
    ),
    Row(
        "DecoderLayer",
        "always_post_ln",
        "        if self.norm_first:\n",
        "        if False:\n",
        every(DECODER_CELLS, "although norm_first=True"),
    ),
    Row(
        "DecoderLayer",
        "memory_normalised_too",
        "return self.cross_attn(y, memory, memory_mask, use_cache)[0]",
        "m = self.norm2(memory) if self.norm_first else memory\n"
        "            return self.cross_attn(y, m, memory_mask, use_cache)[0]",
        every(DECODER_CELLS, "(memory) is normalised"),
    ),
    Row(
        "DecoderLayer",
        "no_residual_around_cross_attention",
        "            x = x + cross_block(self.norm2(x))\n",
        "            x = cross_block(self.norm2(x))\n",
        every(DECODER_CELLS, "residual connection around cross-attention"),
    ),
    Row(
        "DecoderLayer",
        "causal_mask_passed_to_cross_attention",
        "return self.cross_attn(y, memory, memory_mask, use_cache)[0]",
        "return self.cross_attn(y, memory, self_mask, use_cache)[0]",
        every(DECODER_CELLS, "takes the source padding mask (memory_mask) only"),
    ),
    Row(
        "DecoderLayer",
        "self_mask_ignored",
        "return self.self_attn(y, y, y, self_mask)[0]",
        "return self.self_attn(y, y, y)[0]",
        {"decoder_matches_torch": "ignores self_mask"},
    ),
    Row(
        "DecoderLayer",
        "gelu",
        "torch.relu(self.linear1(y))",
        "F.gelu(self.linear1(y))",
        every(DECODER_CELLS, "GELU"),
    ),
    Row(
        "DecoderLayer",
        "norms_swapped",
        "            x = x + self_block(self.norm1(x))\n            x = x + cross_block(self.norm2(x))\n",
        "            x = x + self_block(self.norm2(x))\n            x = x + cross_block(self.norm1(x))\n",
        every(DECODER_CELLS, "norm1 for self-attention"),
    ),
    Row(
        "DecoderLayer",
        "no_norm_after_the_feed_forward",
        "            x = self.norm3(x + feed_forward(x))\n",
        "            x = x + feed_forward(x)\n",
        every(DECODER_CELLS, "the feed-forward network's too"),
    ),
]

WHOLE = {}

CLASSES = {}  # (filled below, once the class sources are defined)


# --- correct implementations in other styles

CROSS_STANDALONE = """class CrossAttention(nn.Module):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"{n_heads} heads do not divide d_model={d_model}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.cache = {}

    def load_torch_weights(self, torch_mha):
        with torch.no_grad():
            for linear, weight in zip((self.w_q, self.w_k, self.w_v), torch_mha.in_proj_weight.chunk(3)):
                linear.weight.copy_(weight)
            if torch_mha.in_proj_bias is not None:
                for linear, bias in zip((self.w_q, self.w_k, self.w_v), torch_mha.in_proj_bias.chunk(3)):
                    linear.bias.copy_(bias)
                self.w_o.bias.copy_(torch_mha.out_proj.bias)
            self.w_o.weight.copy_(torch_mha.out_proj.weight)
        return self

    def heads(self, x):
        return x.unflatten(-1, (self.n_heads, self.d_head)).transpose(1, 2)

    def source_state(self, source):
        # copies of what the keys and values depend on: the source and the weights of w_k and w_v
        return [x.detach().clone() for x in (source, *self.w_k.parameters(), *self.w_v.parameters())]

    def cache_holds(self, source):
        kept = self.cache.get("state")
        now = [source, *self.w_k.parameters(), *self.w_v.parameters()]
        return kept is not None and all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(kept, now))

    def source_kv(self, source):
        if not self.cache_holds(source):
            k, v = self.heads(self.w_k(source)), self.heads(self.w_v(source))
            self.cache = {"state": self.source_state(source), "k": k, "v": v}
        return self.cache["k"], self.cache["v"]

    def clear_cache(self):
        self.cache = {}

    def forward(self, target, source, mask=None, use_cache=False):
        if use_cache:
            k, v = self.source_kv(source)
        else:
            k, v = self.heads(self.w_k(source)), self.heads(self.w_v(source))
        q = self.heads(self.w_q(target))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / self.d_head**0.5
        if mask is not None:
            if mask.dtype != torch.bool:
                raise TypeError("the mask is boolean: True = may attend")
            scores = scores.masked_fill(~(mask[:, None] if mask.ndim == 3 else mask), float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        out = torch.einsum("bhqk,bhkd->bqhd", weights, v).flatten(2)
        return self.w_o(out), weights
"""

CROSS_DATA_PTR = CROSS.replace(
    "if cached is None or cached[0] is not source or cached[1] != state:",
    "if cached is None or cached[0] != (source.data_ptr(), source.shape) or cached[1] != state:",
).replace(
    "self.cached = (source, state, *self.keys_values(source))",
    "self.cached = ((source.data_ptr(), source.shape), state, *self.keys_values(source))",
)
CROSS_SOURCE_KV_UNCACHED = CROSS.replace(
    "k, v = self.source_kv(source) if use_cache else", "k, v = self.cached_kv(source) if use_cache else"
).replace(
    "    def source_kv(self, source):\n",
    "    def source_kv(self, source):\n"
    "        return self.keys_values(source)\n\n"
    "    def cached_kv(self, source):\n",
)
CROSS_FLOAT64_WEIGHTS = CROSS.replace(
    "        weights = torch.softmax(scores, dim=-1)\n",
    "        weights = torch.softmax(scores.double(), dim=-1)  # a stable softmax\n",
).replace("(weights @ v)", "(weights.to(v.dtype) @ v)")
CROSS_BIAS_DROPPED = CROSS.replace(
    "    def forward(self, target, source, mask=None, use_cache=False):\n",
    "    def __init__(self, d_model, n_heads, bias=True):\n"
    "        super().__init__(d_model, n_heads)  # bias is not passed on\n\n"
    "    def forward(self, target, source, mask=None, use_cache=False):\n",
)

DECODER_LOOP = """class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.cross_attn = CrossAttention(d_model, n_heads)
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))

    def forward(self, x, memory, self_mask=None, memory_mask=None, use_cache=False):
        sublayers = [
            (self.norm1, lambda y: self.self_attn(y, y, y, mask=self_mask)[0]),
            (self.norm2, lambda y: self.cross_attn(y, memory, mask=memory_mask, use_cache=use_cache)[0]),
            (self.norm3, lambda y: self.linear2(F.relu(self.linear1(y)))),
        ]
        for norm, sublayer in sublayers:
            x = x + sublayer(norm(x)) if self.norm_first else norm(x + sublayer(x))
        return x
"""

CLASSES |= {
    "source_kv_bypasses_the_cache": (CROSS_SOURCE_KV_UNCACHED, {"cross_cache": "share one cache"}),
    "float64_weights_returned": (
        CROSS_FLOAT64_WEIGHTS,
        {"cross_shapes": "must be undone with .to(target.dtype)"},
    ),
    "bias_not_passed_on": (
        CROSS_BIAS_DROPPED,
        {"cross_matches_torch": "pass it on", "cross_from_scratch": MUST_BE_CORRECT},
    ),
}

RIGHT_CLASSES = {
    "standalone_einsum_copies_keyed_cache": CROSS_STANDALONE,
    "cache_keyed_on_data_ptr_and_versions": CROSS_DATA_PTR,
    "sublayers_in_a_loop": DECODER_LOOP,
}
RIGHT = []
