"""Implementations of exercise ex05 that a learner could plausibly write: wrong ones and right ones.

Every implementation is self-contained (``torch``, ``math``, ``nn`` and ``F`` of the setup cell), so that its
source is also a submission's solution cell. ``ROWS`` are one-line mistakes applied to ``BASES``; ``WHOLE``
and ``CLASSES`` hold mistakes of another structure; ``RIGHT`` and ``RIGHT_CLASSES`` correct implementations
in other styles, which every cell must accept. Expectations name *exactly* the test cells that reject an
implementation (see ``_bank.py``).
"""

import torch

from tests.banks._bank import Row

GQA = """class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, bias=True):
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError("n_heads must divide d_model, and n_kv_heads n_heads")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=bias)
        self.o_proj = nn.Linear(n_heads * self.d_head, d_model, bias=bias)

    def forward(self, query, key, value, mask=None):
        batch, q_len, _ = query.shape
        k_len = key.size(1)
        q = self.q_proj(query).view(batch, q_len, self.n_heads, self.d_head).transpose(1, 2)
        k = self.k_proj(key).view(batch, k_len, self.n_kv_heads, self.d_head).transpose(1, 2)
        v = self.v_proj(value).view(batch, k_len, self.n_kv_heads, self.d_head).transpose(1, 2)
        n_rep = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        if mask is not None:
            if mask.dtype != torch.bool:
                raise TypeError(f"mask must be boolean, got {mask.dtype}")
            if mask.dim() == 3:
                mask = mask.unsqueeze(1)
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0)
        heads = (weights @ v).transpose(1, 2).reshape(batch, q_len, -1)
        return self.o_proj(heads), weights
"""

FROM_MHA = """def gqa_from_mha(mha, n_kv_heads):
    if mha.in_proj_weight is None:
        raise ValueError("mha must project queries, keys and values with one in_proj_weight")
    d_model, n_heads = mha.embed_dim, mha.num_heads
    if n_heads % n_kv_heads:
        raise ValueError("n_kv_heads must divide the heads of mha")
    d_head, n_rep = d_model // n_heads, n_heads // n_kv_heads
    bias = mha.in_proj_bias is not None
    gqa = GroupedQueryAttention(d_model, n_heads, n_kv_heads, bias=bias).to(mha.in_proj_weight)
    w_q, w_k, w_v = mha.in_proj_weight.chunk(3)

    def pool(rows):
        return rows.unflatten(0, (n_kv_heads, n_rep, d_head)).mean(dim=1).flatten(0, 1)

    with torch.no_grad():
        gqa.q_proj.weight.copy_(w_q)
        gqa.k_proj.weight.copy_(pool(w_k))
        gqa.v_proj.weight.copy_(pool(w_v))
        gqa.o_proj.weight.copy_(mha.out_proj.weight)
        if bias:
            b_q, b_k, b_v = mha.in_proj_bias.chunk(3)
            gqa.q_proj.bias.copy_(b_q)
            gqa.k_proj.bias.copy_(pool(b_k))
            gqa.v_proj.bias.copy_(pool(b_v))
            gqa.o_proj.bias.copy_(mha.out_proj.bias)
    return gqa
"""

BASES = {
    "repeat_kv": """def repeat_kv(x, n_rep):
    if x.dim() != 4 or n_rep < 1:
        raise ValueError("x must be [batch, n_kv_heads, len, d_head] and n_rep at least 1")
    return x.repeat_interleave(n_rep, dim=1)
""",
    "GroupedQueryAttention": GQA,
    "kv_cache_bytes": """def kv_cache_bytes(n_layers, n_kv_heads, d_head, seq_len, batch, dtype):
    if min(n_layers, n_kv_heads, d_head, seq_len, batch) < 0:
        raise ValueError("sizes must be non-negative")
    return 2 * n_layers * n_kv_heads * d_head * seq_len * batch * dtype.itemsize
""",
    "gqa_from_mha": FROM_MHA,
}

MODULE_VALUES = ("gqa_matches_sdpa", "gqa_ladder")
REPEAT = "        k = k.repeat_interleave(n_rep, dim=1)\n        v = v.repeat_interleave(n_rep, dim=1)\n"


def every(cells, fragment):
    return dict.fromkeys(cells, fragment)


ROWS = [
    Row(
        "repeat_kv",
        "tiled",
        "x.repeat_interleave(n_rep, dim=1)",
        "x.repeat(1, n_rep, 1, 1)",
        {"repeat_kv_interleaves": "query head i must meet key/value head i // n_rep"},
    ),
    Row(
        "repeat_kv",
        "positions_repeated",
        "dim=1",
        "dim=2",
        {"repeat_kv_interleaves": "the positions are repeated"},
    ),
    Row(
        "repeat_kv",
        "batch_repeated",
        "dim=1",
        "dim=0",
        {"repeat_kv_interleaves": "the batch is repeated"},
    ),
    Row(
        "GroupedQueryAttention",
        "tiled_heads",
        REPEAT,
        "        k = k.repeat(1, n_rep, 1, 1)\n        v = v.repeat(1, n_rep, 1, 1)\n",
        {"gqa_matches_sdpa": "repeat_interleave(n_rep, dim=1)"},
    ),
    Row(
        "GroupedQueryAttention",
        "scale_d_model",
        "math.sqrt(self.d_head)",
        "math.sqrt(self.n_heads * self.d_head)",
        every(MODULE_VALUES, "divided by sqrt(d_model)"),
    ),
    Row(
        "GroupedQueryAttention",
        "no_output_projection",
        "return self.o_proj(heads), weights",
        "return heads, weights",
        every(MODULE_VALUES, "o_proj is missing"),
    ),
    Row(
        "GroupedQueryAttention",
        "mask_3d_without_head_axis",
        "            if mask.dim() == 3:\n                mask = mask.unsqueeze(1)\n",
        "",
        {"gqa_matches_sdpa": "mask.unsqueeze(1)"},
    ),
    Row(
        "GroupedQueryAttention",
        "softmax_over_queries",
        "torch.softmax(scores, dim=-1)",
        "torch.softmax(scores, dim=-2)",
        every(MODULE_VALUES, "dim=-2"),
    ),
    Row(
        "GroupedQueryAttention",
        "mask_inverted",
        "masked_fill(~mask,",
        "masked_fill(mask,",
        {"gqa_matches_sdpa": "the mask is inverted"},
    ),
    Row(
        "GroupedQueryAttention",
        "kv_projections_full_width",
        "self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=bias)",
        "self.k_proj = nn.Linear(d_model, d_model, bias=bias)",
        every(("gqa_shapes", *MODULE_VALUES), "n_kv_heads * d_head features"),
    ),
    Row(
        "GroupedQueryAttention",
        "weights_averaged",
        "return self.o_proj(heads), weights",
        "return self.o_proj(heads), weights.mean(dim=1)",
        every(("gqa_shapes", *MODULE_VALUES), "averaged over heads"),
    ),
    Row(
        "kv_cache_bytes",
        "no_factor_2",
        "2 * n_layers",
        "n_layers",
        {"kv_cache_values": "the factor 2 is missing"},
    ),
    Row(
        "kv_cache_bytes",
        "bits",
        "dtype.itemsize",
        "torch.finfo(dtype).bits",
        {"kv_cache_values": "in bits"},
    ),
    Row(
        "kv_cache_bytes",
        "four_bytes",
        "dtype.itemsize",
        "4",
        {"kv_cache_values": "the dtype is ignored"},
    ),
    Row(
        "kv_cache_bytes",
        "no_layers",
        "2 * n_layers * ",
        "2 * ",
        {"kv_cache_values": "n_layers is ignored"},
    ),
    Row(
        "kv_cache_bytes",
        "float_bytes",
        "dtype.itemsize",
        "torch.finfo(dtype).bits / 8",
        {"kv_cache_values": "return an int, not a float"},
    ),
    # the docstrings' errors, and what the new checks ask
    Row(
        "repeat_kv",
        "no_checks",
        "    if x.dim() != 4 or n_rep < 1:\n",
        "    if False:\n",
        {"repeat_kv_interleaves": "check x.dim() == 4 and n_rep >= 1 first"},
    ),
    Row(
        "GroupedQueryAttention",
        "no_size_check",
        "        if d_model % n_heads or n_heads % n_kv_heads:\n",
        "        if False:\n",
        {"gqa_shapes": "n_kv_heads divides n_heads, and raise"},
    ),
    Row(
        "GroupedQueryAttention",
        "no_mask_type_check",
        "            if mask.dtype != torch.bool:\n",
        "            if False:\n",
        {"gqa_shapes": "check mask.dtype != torch.bool first and raise TypeError"},
    ),
    Row(
        "GroupedQueryAttention",
        "empty_rows_nan",
        "            weights = torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0)\n",
        "            pass\n",
        {"gqa_matches_sdpa": "contains NaN or inf"},
    ),
    Row(
        "kv_cache_bytes",
        "no_check",
        "    if min(n_layers, n_kv_heads, d_head, seq_len, batch) < 0:\n",
        "    if False:\n",
        {"kv_cache_values": "raise ValueError for a negative one"},
    ),
    Row(
        "kv_cache_bytes",
        "zero_refused",
        "seq_len, batch) < 0:",
        "seq_len, batch) <= 0:",
        {"kv_cache_values": "a size of 0 is allowed"},
    ),
    Row(
        "gqa_from_mha",
        "biases_assumed",
        "    bias = mha.in_proj_bias is not None\n",
        "    bias = True\n",
        {"gqa_from_mha_pools": "mha may have no biases"},
    ),
    Row(
        "gqa_from_mha",
        "biases_left_random",
        ", bias=bias)",
        ")",
        {"gqa_from_mha_pools": "the new module must have none either"},
    ),
    Row(
        "gqa_from_mha",
        "no_kdim_check",
        "    if mha.in_proj_weight is None:\n",
        "    if False:\n",
        {"gqa_from_mha_pools": "one in_proj_weight (not None"},
    ),
    Row(
        "gqa_from_mha",
        "first_head",
        ".mean(dim=1)",
        "[:, 0]",
        {"gqa_from_mha_pools": "the first head of its group"},
    ),
    Row(
        "gqa_from_mha",
        "summed",
        ".mean(dim=1)",
        ".sum(dim=1)",
        {"gqa_from_mha_pools": "are summed"},
    ),
    Row(
        "gqa_from_mha",
        "strided_groups",
        "rows.unflatten(0, (n_kv_heads, n_rep, d_head)).mean(dim=1)",
        "rows.unflatten(0, (n_rep, n_kv_heads, d_head)).mean(dim=0)",
        {"gqa_from_mha_pools": "consecutive heads"},
    ),
    Row(
        "gqa_from_mha",
        "float32_module",
        ".to(mha.in_proj_weight)",
        "",
        {"gqa_from_mha_pools": "dtype and device of mha"},
    ),
]


def repeat_kv__new_axis(x, n_rep):
    return x[:, :, None].expand(-1, -1, n_rep, -1, -1)


def repeat_kv__zeros_filled(x, n_rep):
    if x.dim() != 4 or n_rep < 1:
        raise ValueError("x must be [batch, n_kv_heads, len, d_head] and n_rep >= 1")
    batch, n_kv_heads, length, d_head = x.shape
    out = torch.zeros(batch, n_kv_heads * n_rep, length, d_head, device=x.device)
    for head in range(n_kv_heads * n_rep):
        out[:, head] = x[:, head // n_rep]
    return out


WHOLE = {
    repeat_kv__new_axis: {
        "repeat_kv_interleaves": "the repeats are a new axis",
    },
    repeat_kv__zeros_filled: {"repeat_kv_interleaves": "the result must keep the dtype of x"},
}

GQA_FLOAT64_WEIGHTS = GQA.replace(
    "        weights = torch.softmax(scores, dim=-1)\n",
    "        weights = torch.softmax(scores.double(), dim=-1)  # a stable softmax\n",
).replace("(weights @ v)", "(weights.to(v.dtype) @ v)")

GQA_FINFO_MIN = GQA.replace(
    'scores.masked_fill(~mask, float("-inf"))', "scores.masked_fill(~mask, torch.finfo(scores.dtype).min)"
)
GQA_EMPTY_ROWS_UNIFORM = GQA_FINFO_MIN.replace(
    "            weights = torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0)\n", "            pass\n"
)

CLASSES = {
    "float64_weights_returned": (GQA_FLOAT64_WEIGHTS, {"gqa_shapes": "must be undone"}),
    "empty_rows_uniform": (GQA_EMPTY_ROWS_UNIFORM, {"gqa_matches_sdpa": "The course's rule"}),
}


# ----------------------------------------------------------------------------------------------------
# correct implementations in other styles


def repeat_kv__expand_reshape(x, n_rep):
    batch, n_kv_heads, length, d_head = x.shape  # (a ValueError unless x has four axes)
    if n_rep < 1:
        raise ValueError(f"n_rep={n_rep}: at least 1")
    if n_rep == 1:
        return x
    expanded = x[:, :, None, :, :].expand(batch, n_kv_heads, n_rep, length, d_head)
    return expanded.reshape(batch, n_kv_heads * n_rep, length, d_head)


def repeat_kv__cat_loop(x, n_rep):
    if len(x.shape) != 4 or n_rep <= 0:
        raise ValueError("expected [batch, n_kv_heads, len, d_head] and n_rep >= 1")
    heads = [x[:, i : i + 1] for i in range(x.size(1)) for _ in range(n_rep)]
    return torch.cat(heads, dim=1)


def kv_cache_bytes__element_size(n_layers, n_kv_heads, d_head, seq_len, batch, dtype):
    if any(size < 0 for size in (n_layers, n_kv_heads, d_head, seq_len, batch)):
        raise ValueError("a size is negative")
    per_token = 2 * n_kv_heads * d_head * torch.empty((), dtype=dtype).element_size()
    return n_layers * batch * seq_len * per_token


def kv_cache_bytes__finfo_bits(n_layers, n_kv_heads, d_head, seq_len, batch, dtype):
    keys = n_layers * n_kv_heads * d_head * seq_len * batch
    if min(n_layers, n_kv_heads, d_head, seq_len, batch) < 0:
        raise ValueError(f"negative sizes: {n_layers, n_kv_heads, d_head, seq_len, batch}")
    return 2 * keys * (torch.finfo(dtype).bits // 8)


GQA_GROUPED = """class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, bias=True):
        super().__init__()
        if n_heads * (d_model // n_heads) != d_model or n_heads % n_kv_heads != 0:
            raise ValueError(f"d_model={d_model}, n_heads={n_heads}, n_kv_heads={n_kv_heads} do not fit")
        self.h, self.g, self.d = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d, bias=bias)
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key, value, mask=None):
        b, n, _ = query.shape
        m = key.size(1)
        r = self.h // self.g
        # no repeat: the query heads of group j are an extra axis that meets key/value head j
        q = self.q_proj(query).reshape(b, n, self.g, r, self.d)
        k = self.k_proj(key).reshape(b, m, self.g, self.d)
        v = self.v_proj(value).reshape(b, m, self.g, self.d)
        scores = torch.einsum("bngrd,bmgd->bgrnm", q, k).reshape(b, self.h, n, m) / self.d**0.5
        if mask is not None:
            if mask.dtype != torch.bool:
                raise TypeError("mask: True = may attend, a boolean tensor")
            allowed = mask.unsqueeze(1) if mask.dim() == 3 else mask
            scores = scores.masked_fill(~allowed, -math.inf)
        top = scores.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).min)
        exp = torch.exp(scores - top)
        total = exp.sum(dim=-1, keepdim=True)
        weights = exp / torch.where(total > 0, total, 1.0)
        heads = torch.einsum("bgrnm,bmgd->bngrd", weights.reshape(b, self.g, r, n, m), v)
        return self.o_proj(heads.reshape(b, n, self.h * self.d)), weights
"""

GQA_FLOAT64_INSIDE = (
    GQA.replace(
        "        batch, q_len, _ = query.shape\n",
        "        dtype = query.dtype\n        batch, q_len, _ = query.shape\n",
    )
    .replace(
        "        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)\n",
        "        q, k, v = q.double(), k.double(), v.double()\n"
        "        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)\n",
    )
    .replace(
        "        return self.o_proj(heads), weights\n",
        "        return self.o_proj(heads.to(dtype)), weights.to(dtype)\n",
    )
)

GQA_EXPAND_VIEW = GQA.replace(
    REPEAT,
    "        k = k[:, :, None].expand(-1, -1, n_rep, -1, -1).reshape(batch, self.n_heads, k_len, -1)\n"
    "        v = v[:, :, None].expand(-1, -1, n_rep, -1, -1).reshape(batch, self.n_heads, k_len, -1)\n",
).replace(".view(batch, q_len, self.n_heads, self.d_head)", ".reshape(batch, q_len, self.n_heads, -1)")

RIGHT_CLASSES = {
    "grouped_einsum_own_softmax": GQA_GROUPED,
    "float64_inside": GQA_FLOAT64_INSIDE,
    "expand_reshape": GQA_EXPAND_VIEW,
    "finfo_min_fill_then_zeroed": GQA_FINFO_MIN,
}


def gqa_from_mha__loop_over_groups(mha, n_kv_heads):
    if mha.bias_k is not None or not mha._qkv_same_embed_dim:
        raise ValueError("only an nn.MultiheadAttention with one in_proj_weight is converted")
    d_model, n_heads = mha.embed_dim, mha.num_heads
    if n_kv_heads < 1 or n_heads % n_kv_heads != 0:
        raise ValueError(f"{n_kv_heads} key/value heads cannot share {n_heads} query heads")
    d_head, n_rep = d_model // n_heads, n_heads // n_kv_heads
    has_bias = mha.in_proj_bias is not None
    gqa = GroupedQueryAttention(d_model, n_heads, n_kv_heads, bias=has_bias)  # noqa: F821
    gqa = gqa.to(device=mha.in_proj_weight.device, dtype=mha.in_proj_weight.dtype)
    weights = mha.in_proj_weight.chunk(3)
    biases = mha.in_proj_bias.chunk(3) if has_bias else (None, None, None)
    with torch.no_grad():
        gqa.q_proj.weight.copy_(weights[0])
        if has_bias:
            gqa.q_proj.bias.copy_(biases[0])
        for projection, weight, bias in (
            (gqa.k_proj, weights[1], biases[1]),
            (gqa.v_proj, weights[2], biases[2]),
        ):
            for group in range(n_kv_heads):
                rows = slice(group * n_rep * d_head, (group + 1) * n_rep * d_head)
                target = slice(group * d_head, (group + 1) * d_head)
                projection.weight[target] = weight[rows].reshape(n_rep, d_head, d_model).mean(dim=0)
                if has_bias:
                    projection.bias[target] = bias[rows].reshape(n_rep, d_head).mean(dim=0)
        gqa.o_proj.load_state_dict(mha.out_proj.state_dict())
    return gqa


RIGHT = [
    gqa_from_mha__loop_over_groups,
    repeat_kv__expand_reshape,
    repeat_kv__cat_loop,
    kv_cache_bytes__element_size,
    kv_cache_bytes__finfo_bits,
]
