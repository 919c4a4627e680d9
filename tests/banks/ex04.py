"""Implementations of exercise ex04 that a learner could plausibly write: wrong ones and right ones.

Every implementation uses only what the notebook's setup cell imports (``math``, ``torch``, ``nn``), so that
its source is also a submission's solution cell. ``ROWS`` are one-line mistakes applied to ``BASES``;
``WHOLE`` holds mistakes of another structure; ``RIGHT`` correct implementations in other styles, which every
cell must accept. Expectations name *exactly* the test cells that reject an implementation (``_bank.py``).
"""

import torch

from tests.banks._bank import Row

MHA = """class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError("n_heads must divide d_model")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def split(self, x):
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.d_head).transpose(1, 2)

    def forward(self, query, key, value, mask=None):
        q, k, v = self.split(self.w_q(query)), self.split(self.w_k(key)), self.split(self.w_v(value))
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
        heads = weights @ v
        batch, _, q_len, _ = heads.shape
        output = self.w_o(heads.transpose(1, 2).reshape(batch, q_len, self.d_model))
        return output, weights

    def load_torch_weights(self, torch_mha):
        if (torch_mha.embed_dim, torch_mha.num_heads) != (self.d_model, self.n_heads):
            raise ValueError("torch_mha has other sizes than the module")
        if (torch_mha.in_proj_bias is None) != (self.w_q.bias is None):
            raise ValueError("torch_mha and the module must both have biases, or neither")
        with torch.no_grad():
            w_q, w_k, w_v = torch_mha.in_proj_weight.chunk(3)
            self.w_q.weight.copy_(w_q)
            self.w_k.weight.copy_(w_k)
            self.w_v.weight.copy_(w_v)
            self.w_o.weight.copy_(torch_mha.out_proj.weight)
            if torch_mha.in_proj_bias is not None:
                b_q, b_k, b_v = torch_mha.in_proj_bias.chunk(3)
                self.w_q.bias.copy_(b_q)
                self.w_k.bias.copy_(b_k)
                self.w_v.bias.copy_(b_v)
                self.w_o.bias.copy_(torch_mha.out_proj.bias)
        return self
"""

BASES = {
    "split_heads": """def split_heads(x, n_heads):
    batch, length, d_model = x.shape
    if d_model % n_heads:
        raise ValueError("n_heads must divide d_model")
    return x.view(batch, length, n_heads, d_model // n_heads).transpose(1, 2)
""",
    "merge_heads": """def merge_heads(x):
    batch, n_heads, length, d_head = x.shape
    return x.transpose(1, 2).reshape(batch, length, n_heads * d_head)
""",
    "MultiHeadAttention": MHA,
    "attention_entropy": """def attention_entropy(weights):
    return -torch.xlogy(weights, weights).sum(dim=-1)
""",
    "mha_parameter_count": """def mha_parameter_count(d_model, n_heads, bias=True):
    if d_model < 1 or d_model % n_heads:
        raise ValueError("n_heads must divide d_model, at least 1")
    return 4 * d_model * d_model + (4 * d_model if bias else 0)
""",
}

MUST_BE_CORRECT = "must be correct before it counts as written from scratch"
MODULE_VALUES = ("mha_matches_torch", "mha_empty_rows", "mha_gradients")


def every(cells, fragment):
    return dict.fromkeys(cells, fragment)


def values(fragment, gradients="does not match"):
    """A mistake in the computation: every cell on values rejects it, the from-scratch cell as incorrect."""
    return {
        "mha_matches_torch": fragment,
        "mha_empty_rows": fragment,
        "mha_gradients": gradients,
        "mha_from_scratch": MUST_BE_CORRECT,
    }


ROWS = [
    Row(
        "split_heads",
        "view_without_transpose",
        "x.view(batch, length, n_heads, d_model // n_heads).transpose(1, 2)",
        "x.view(batch, n_heads, length, d_model // n_heads)",
        {"split_heads_layout": "no transpose"},
    ),
    Row(
        "split_heads",
        "head_axis_last",
        "x.view(batch, length, n_heads, d_model // n_heads).transpose(1, 2)",
        "x.view(batch, length, n_heads, d_model // n_heads)",
        {"split_heads_layout": "transpose(1, 2) after view()"},
    ),
    Row(
        "merge_heads",
        "view_of_a_transpose",
        "x.transpose(1, 2).reshape(batch, length, n_heads * d_head)",
        "x.transpose(1, 2).view(batch, length, n_heads * d_head)",
        {"merge_heads_inverse": "not contiguous"},
    ),
    Row(
        "merge_heads",
        "reshape_without_transpose",
        "x.transpose(1, 2).reshape(batch, length, n_heads * d_head)",
        "x.reshape(batch, length, n_heads * d_head)",
        {"merge_heads_inverse": "no transpose back"},
    ),
    Row(
        "MultiHeadAttention",
        "scale_by_d_model",
        "math.sqrt(self.d_head)",
        "math.sqrt(self.d_model)",
        values("divided by sqrt(d_model)"),
    ),
    Row(
        "MultiHeadAttention",
        "no_output_projection",
        "output = self.w_o(heads.transpose(1, 2).reshape(batch, q_len, self.d_model))",
        "output = heads.transpose(1, 2).reshape(batch, q_len, self.d_model)",
        values("W_O is missing"),
    ),
    Row(
        "MultiHeadAttention",
        "split_without_transpose",
        "return x.view(batch, length, self.n_heads, self.d_head).transpose(1, 2)",
        "return x.view(batch, self.n_heads, length, self.d_head)",
        values("no transpose"),
    ),
    Row(
        "MultiHeadAttention",
        "merge_without_transpose",
        "heads.transpose(1, 2).reshape(batch, q_len, self.d_model)",
        "heads.reshape(batch, q_len, self.d_model)",
        values("no transpose back"),
    ),
    Row(
        "MultiHeadAttention",
        "mask_not_broadcast_over_heads",
        "            if mask.dim() == 3:\n                mask = mask.unsqueeze(1)\n",
        "",
        {
            "mha_matches_torch": "an axis for the heads",
            "mha_empty_rows": "an axis for the heads",
            "mha_from_scratch": MUST_BE_CORRECT,
        },
    ),
    Row(
        "MultiHeadAttention",
        "mask_inverted",
        'scores.masked_fill(~mask, float("-inf"))',
        'scores.masked_fill(mask, float("-inf"))',
        values("the mask is inverted"),
    ),
    Row(
        "MultiHeadAttention",
        "weights_transposed_when_loaded",
        "self.w_q.weight.copy_(w_q)",
        "self.w_q.weight.copy_(w_q.T)",
        values("does not match"),
    ),
    # the docstrings' errors, left out
    Row(
        "split_heads",
        "no_divisibility_check",
        '    if d_model % n_heads:\n        raise ValueError("n_heads must divide d_model")\n',
        "",
        {"split_heads_layout": "check x.dim() == 3 and d_model % n_heads == 0 first"},
    ),
    Row(
        "MultiHeadAttention",
        "load_without_checks",
        "        if (torch_mha.embed_dim, torch_mha.num_heads) != (self.d_model, self.n_heads):\n",
        "        if False:\n",
        {"mha_shapes": "load_torch_weights raises ValueError when torch_mha does not fit"},
    ),
    Row(
        "MultiHeadAttention",
        "load_returns_nothing",
        "        return self\n",
        "",
        {"mha_gradients": "load_torch_weights returns the module, `return self`"},
    ),
    Row(
        "mha_parameter_count",
        "no_check",
        "    if d_model < 1 or d_model % n_heads:\n",
        "    if False:\n",
        {"parameter_count": "check d_model >= 1 and d_model % n_heads == 0 first"},
    ),
    Row(
        "attention_entropy",
        "bits",
        "return -torch.xlogy(weights, weights).sum(dim=-1)",
        "return -torch.xlogy(weights, weights).sum(dim=-1) / math.log(2)",
        {"entropy_in_nats": "in bits"},
    ),
    Row(
        "attention_entropy",
        "zero_times_log_zero",
        "return -torch.xlogy(weights, weights).sum(dim=-1)",
        "return -(weights * weights.log()).sum(dim=-1)",
        {"entropy_in_nats": "0 ln 0 gives NaN"},
    ),
    Row(
        "attention_entropy",
        "sum_over_queries",
        "sum(dim=-1)",
        "sum(dim=-2)",
        {"entropy_in_nats": "sum runs over the queries"},
    ),
    Row(
        "mha_parameter_count",
        "three_projections",
        "4 * d_model * d_model + (4 * d_model if bias else 0)",
        "3 * d_model * d_model + (3 * d_model if bias else 0)",
        {"parameter_count": "only three projections"},
    ),
    Row(
        "mha_parameter_count",
        "bias_ignored",
        "4 * d_model * d_model + (4 * d_model if bias else 0)",
        "4 * d_model * d_model + 4 * d_model",
        {"parameter_count": "biases are counted although bias=False"},
    ),
    Row(
        "mha_parameter_count",
        "per_head_full_width",
        "4 * d_model * d_model + (4 * d_model if bias else 0)",
        "n_heads * (4 * d_model * d_model + (4 * d_model if bias else 0))",
        {"parameter_count": "full-width projections"},
    ),
]


# --- mistakes of another structure


MHA_BUILTIN = MHA.replace(
    """        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        if mask is not None:
            if mask.dtype != torch.bool:
                raise TypeError(f"mask must be boolean, got {mask.dtype}")
            if mask.dim() == 3:
                mask = mask.unsqueeze(1)
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = torch.nan_to_num(weights, nan=0.0)
        heads = weights @ v
""",
    """        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        if mask is not None:
            if mask.dtype != torch.bool:
                raise TypeError(f"mask must be boolean, got {mask.dtype}")
            if mask.dim() == 3:
                mask = mask.unsqueeze(1)
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
        heads = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        heads = torch.nan_to_num(heads, nan=0.0)
""",
)
MHA_MINUS_1E9 = MHA.replace('scores.masked_fill(~mask, float("-inf"))', "scores.masked_fill(~mask, -1e9)")
MHA_NO_PARAMETERS = MHA.replace(
    "        self.w_o = nn.Linear(d_model, d_model, bias=bias)\n",
    "        self.w_o = nn.Linear(d_model, d_model, bias=bias)\n        self.w_o.requires_grad_(False)\n",
)

MHA_AVERAGED = MHA.replace("        return output, weights\n", "        return output, weights.mean(dim=1)\n")

# no argument checked: the mask's dtype (its check comes first), n_heads in __init__, torch_mha when loaded
MHA_NO_CHECKS = (
    MHA.replace("        if d_model % n_heads:\n", "        if False:\n")
    .replace("            if mask.dtype != torch.bool:\n", "            if False:\n")
    .replace(
        "        if (torch_mha.embed_dim, torch_mha.num_heads) != (self.d_model, self.n_heads):\n",
        "        if False:\n",
    )
    .replace(
        "        if (torch_mha.in_proj_bias is None) != (self.w_q.bias is None):\n", "        if False:\n"
    )
)
MHA_FLOAT64_WEIGHTS = MHA.replace(
    "        weights = torch.softmax(scores, dim=-1)\n",
    "        weights = torch.softmax(scores.double(), dim=-1)  # a stable softmax\n",
).replace("        heads = weights @ v\n", "        heads = weights.to(v.dtype) @ v\n")
MHA_MASK_EQ_ZERO = MHA.replace(
    """            if mask.dtype != torch.bool:
                raise TypeError(f"mask must be boolean, got {mask.dtype}")
""",
    "",
).replace('scores.masked_fill(~mask, float("-inf"))', 'scores.masked_fill(mask == 0, float("-inf"))')
MHA_BIAS_IGNORED = (
    MHA.replace(", bias=bias)", ")")
    .replace(
        """        if (torch_mha.in_proj_bias is None) != (self.w_q.bias is None):
            raise ValueError("torch_mha and the module must both have biases, or neither")
""",
        "",
    )
    .replace(
        """            if torch_mha.in_proj_bias is not None:
                b_q, b_k, b_v = torch_mha.in_proj_bias.chunk(3)
""",
        """            in_bias, out_bias = torch_mha.in_proj_bias, torch_mha.out_proj.bias
            if in_bias is None:  # no biases in torch_mha: zeros compute the same function
                in_bias, out_bias = torch.zeros(3 * self.d_model), torch.zeros(self.d_model)
            if True:
                b_q, b_k, b_v = in_bias.chunk(3)
""",
    )
    .replace("self.w_o.bias.copy_(torch_mha.out_proj.bias)", "self.w_o.bias.copy_(out_bias)")
)
MHA_EMPTY_ROWS_3D_ONLY = MHA.replace(
    """            if mask.dim() == 3:
                mask = mask.unsqueeze(1)
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = torch.nan_to_num(weights, nan=0.0)
""",
    """            per_sequence = mask.dim() == 3  # a sequence's own mask may leave a query no key
            if per_sequence:
                mask = mask.unsqueeze(1)
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if mask is not None and per_sequence:
            weights = torch.nan_to_num(weights, nan=0.0)
""",
)

# whole-class sources, each with the exercise's name
CLASSES = {
    "checks_nothing": (
        MHA_NO_CHECKS,
        {"mha_shapes": "check mask.dtype != torch.bool first and raise TypeError"},
    ),
    "float64_weights_returned": (MHA_FLOAT64_WEIGHTS, {"mha_shapes": "must be undone with .to(query.dtype)"}),
    "mask_eq_zero_accepts_integers": (MHA_MASK_EQ_ZERO, {"mha_shapes": "would be accepted by `mask == 0`"}),
    "bias_flag_ignored": (
        MHA_BIAS_IGNORED,
        {
            "mha_gradients": "has biases although bias=False",
            "mha_shapes": "biases on one side only",  # zeros for missing biases rather than the ValueError
        },
    ),
    "empty_rows_fixed_for_3d_masks_only": (MHA_EMPTY_ROWS_3D_ONLY, {"mha_empty_rows": "contains NaN or inf"}),
    "weights_averaged_over_heads": (
        MHA_AVERAGED,
        {
            "mha_shapes": "averaged over heads",
            "mha_matches_torch": "averaged over heads",
            "mha_empty_rows": "averaged over heads",
            "mha_from_scratch": MUST_BE_CORRECT,
        },
    ),
    "builtin_sdpa": (MHA_BUILTIN, {"mha_from_scratch": "calls"}),
    "finite_fill": (MHA_MINUS_1E9, {"mha_empty_rows": "does not match"}),
    "frozen_output_projection": (MHA_NO_PARAMETERS, {"mha_gradients": "gets no gradient"}),
}


def attention_entropy__mean_over_keys(weights):
    return -torch.xlogy(weights, weights).mean(dim=-1)


def attention_entropy__float64_inside(weights):
    wide = weights.double()  # ln of small weights, more exactly
    return -torch.xlogy(wide, wide).sum(dim=-1)


def attention_entropy__fixed_axes(weights):
    return -torch.xlogy(weights, weights).sum(dim=3)  # [batch, n_heads, q_len, k_len] only


def split_heads__unflatten_no_checks(x, n_heads):
    return x.unflatten(-1, (n_heads, x.size(-1) // n_heads)).transpose(1, 2)


def split_heads__zeros_filled(x, n_heads):
    batch, length, d_model = x.shape
    if d_model % n_heads:
        raise ValueError("n_heads must divide d_model")
    d_head = d_model // n_heads
    heads = torch.zeros(batch, n_heads, length, d_head)
    for h in range(n_heads):
        heads[:, h] = x[:, :, h * d_head : (h + 1) * d_head]
    return heads


def merge_heads__flatten_no_check(x):
    return x.transpose(1, 2).flatten(2)


def merge_heads__zeros_filled(x):
    batch, n_heads, length, d_head = x.shape
    merged = torch.zeros(batch, length, n_heads * d_head, device=x.device)
    for h in range(n_heads):
        merged[:, :, h * d_head : (h + 1) * d_head] = x[:, h]
    return merged


WHOLE = {
    attention_entropy__mean_over_keys: {"entropy_in_nats": "mean over the keys"},
    attention_entropy__float64_inside: {"entropy_in_nats": "the entropy keeps the dtype of the weights"},
    attention_entropy__fixed_axes: {"entropy_in_nats": "count axes from the end"},
    split_heads__unflatten_no_checks: {"split_heads_layout": "and raise ValueError"},
    split_heads__zeros_filled: {"split_heads_layout": "the result must keep the dtype of its input"},
    merge_heads__flatten_no_check: {"merge_heads_inverse": "check x.dim() == 4 first"},
    merge_heads__zeros_filled: {"merge_heads_inverse": "the result must keep the dtype of its input"},
}


# --- correct implementations in other styles


def split_heads__reshape_permute(x, n_heads):
    if x.ndim != 3 or x.size(-1) % n_heads != 0:
        raise ValueError(f"cannot split {tuple(x.shape)} into {n_heads} heads")
    batch, length, _ = x.shape
    return x.reshape(batch, length, n_heads, -1).permute(0, 2, 1, 3)


def merge_heads__contiguous_view(x):
    if x.dim() != 4:
        raise ValueError("x must be [batch, n_heads, len, d_head]")
    batch, _, length, _ = x.shape
    return x.permute(0, 2, 1, 3).contiguous().view(batch, length, -1)


def attention_entropy__where(weights):
    logs = torch.where(weights > 0, weights.clamp_min(torch.finfo(weights.dtype).tiny).log(), 0.0)
    return -(weights * logs).sum(-1)


def mha_parameter_count__by_parts(d_model, n_heads, bias=True):
    if not (d_model >= 1 and d_model % n_heads == 0):
        raise ValueError("n_heads must divide d_model")
    projection = d_model * d_model + (d_model if bias else 0)
    return sum(projection for _ in ("q", "k", "v", "o"))


MHA_FUSED = """class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        if n_heads <= 0 or d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not a multiple of n_heads={n_heads}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key, value, mask=None):
        w_q, w_k, w_v = self.qkv.weight.chunk(3)
        b_q, b_k, b_v = self.qkv.bias.chunk(3) if self.qkv.bias is not None else (None, None, None)
        heads = []
        for x, w, b in ((query, w_q, b_q), (key, w_k, b_k), (value, w_v, b_v)):
            y = nn.functional.linear(x, w, b)
            heads.append(y.unflatten(-1, (self.n_heads, self.d_head)).transpose(1, 2))
        q, k, v = heads
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * self.d_head**-0.5
        if mask is not None:
            if mask.dtype is not torch.bool:
                raise TypeError("a boolean mask is expected (True = may attend)")
            mask = mask[:, None] if mask.dim() == 3 else mask
            allowed = mask.expand_as(scores)
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
            weights = torch.softmax(scores, dim=-1) * allowed.any(-1, keepdim=True)
        else:
            weights = torch.softmax(scores, dim=-1)
        out = torch.einsum("bhqk,bhkd->bqhd", weights, v).flatten(2)
        return self.out(out), weights

    def load_torch_weights(self, torch_mha):
        if torch_mha.num_heads != self.n_heads or torch_mha.in_proj_weight.shape != self.qkv.weight.shape:
            raise ValueError("torch_mha has other sizes")
        if (torch_mha.in_proj_bias is None) is not (self.qkv.bias is None):
            raise ValueError("torch_mha has biases where the module has none, or the reverse")
        with torch.no_grad():
            self.qkv.weight.copy_(torch_mha.in_proj_weight)
            self.out.weight.copy_(torch_mha.out_proj.weight)
            if self.qkv.bias is not None:
                self.qkv.bias.copy_(torch_mha.in_proj_bias)
                self.out.bias.copy_(torch_mha.out_proj.bias)
        return self
"""

MHA_FLOAT64_INSIDE = MHA.replace(
    """        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)""",
    """        dtype = q.dtype
        q, k, v = q.double(), k.double(), v.double()
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)""",
).replace(
    "        heads = weights @ v\n",
    "        heads = (weights @ v).to(dtype)\n        weights = weights.to(dtype)\n",
)

MHA_OWN_SOFTMAX = MHA.replace(
    """        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = torch.nan_to_num(weights, nan=0.0)
""",
    """        top = scores.amax(dim=-1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, 0.0)
        exp = torch.exp(scores - top)
        total = exp.sum(dim=-1, keepdim=True)
        weights = exp / torch.where(total > 0, total, 1.0)
""",
)

RIGHT_CLASSES = {
    "fused_qkv_einsum": MHA_FUSED,
    "float64_inside": MHA_FLOAT64_INSIDE,
    "own_softmax": MHA_OWN_SOFTMAX,
}

RIGHT = [
    split_heads__reshape_permute,
    merge_heads__contiguous_view,
    attention_entropy__where,
    mha_parameter_count__by_parts,
]
