"""Implementations of exercise ex03 that a learner could plausibly write: wrong ones and right ones.

Every implementation is self-contained (``torch`` and ``math`` only), so that its source is also a
submission's solution cell. ``ROWS`` are one-line mistakes applied to ``BASES``; ``WHOLE`` holds mistakes
of another structure; ``RIGHT`` correct implementations in other styles, which every cell must accept.
Expectations name *exactly* the test cells that reject an implementation (see ``_bank.py``).
"""

import math

import torch

from tests.banks._bank import Row

BASES = {
    "padding_mask": """def padding_mask(tokens, pad_id=0):
    return (tokens != pad_id)[:, None, None, :]
""",
    "causal_mask": """def causal_mask(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)[None, None]
""",
    "combine_masks": """def combine_masks(*masks):
    combined = None
    for mask in masks:
        if mask is None:
            continue
        combined = mask if combined is None else combined & mask
    return combined
""",
    "masked_attention": """def masked_attention(query, key, value, mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
        return weights @ value, weights
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    weights = torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0)
    return weights @ value, weights
""",
}

MUST_BE_CORRECT = "must be correct before it counts as written from scratch"
# the two lines of masked_attention's base that fill the masked scores, then zero the rows with no key
FILL = '    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)\n'
ZEROED = "    weights = torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0)\n"
RULE = ("masked_attention_empty_rows", "masked_attention_half_precision")  # the cells on rows with no key
VALUES = ("masked_attention_matches_sdpa", *RULE, "masked_attention_dtype_and_inputs")
CAUSAL_VALUES = ("causal_mask_square", "causal_mask_bottom_right")


def every(cells, fragment):
    return dict.fromkeys(cells, fragment)


ROWS = [
    Row(
        "masked_attention",
        "einsum_fixed_axes",  # works for two leading axes (batch, heads) only
        "query @ key.transpose(-2, -1)",
        'torch.einsum("bhqd,bhkd->bhqk", query, key)',
        dict.fromkeys(
            [f"masked_attention_{cell}" for cell in ("matches_sdpa", "empty_rows", "half_precision")]
            + ["masked_attention_dtype_and_inputs", "masked_attention_from_scratch"],
            "use an ellipsis",
        ),
    ),
    Row(
        "padding_mask",
        "no_new_axes",
        "(tokens != pad_id)[:, None, None, :]",
        "tokens != pad_id",
        {"padding_mask_shape": "add an axis for the heads and one for the queries"},
    ),
    Row(
        "padding_mask",
        "unsqueeze_once",
        "[:, None, None, :]",
        ".unsqueeze(1)",
        {"padding_mask_shape": "one axis is missing"},
    ),
    Row(
        "padding_mask",
        "along_queries",
        "[:, None, None, :]",
        "[:, None, :, None]",
        {"padding_mask_shape": "laid along the query axis"},
    ),
    Row("padding_mask", "true_marks_padding", "!=", "==", {"padding_mask_values": "True marks the padding"}),
    Row(
        "padding_mask",
        "hard_coded_zero",
        "(tokens != pad_id)",
        "tokens.bool()",
        {"padding_mask_values": "not a hard-coded 0"},
    ),
    Row(
        "padding_mask",
        "hugging_face_integers",
        "(tokens != pad_id)",
        "(tokens != pad_id).long()",
        {"padding_mask_shape": "drop the .long()"},
    ),
    Row(
        "causal_mask",
        "top_left",
        ".tril(k_len - q_len)",
        ".tril()",
        {"causal_mask_bottom_right": "aligned top-left", "causal_mask_from_scratch": MUST_BE_CORRECT},
    ),
    Row(
        "causal_mask",
        "upper_triangle",
        ".tril(",
        ".triu(",
        every(CAUSAL_VALUES, "transposed") | {"causal_mask_from_scratch": MUST_BE_CORRECT},
    ),
    Row(
        "causal_mask",
        "float_ones",
        "dtype=torch.bool, ",
        "",
        {"causal_mask_boolean": "dtype=torch.bool"},
    ),
    Row(
        "causal_mask",
        "two_dimensional",
        "[None, None]",
        "",
        {"causal_mask_boolean": "add the batch and heads axes"},
    ),
    Row(
        "causal_mask",
        "ignores_device",
        ", device=device",
        "",
        {"causal_mask_device": "the device argument is ignored"},
    ),
    # the hint: k_len=None left as it is makes torch.ones(q_len, None) raise a TypeError
    Row(
        "causal_mask",
        "k_len_not_defaulted",
        "    k_len = q_len if k_len is None else k_len\n",
        "",
        {
            "causal_mask_square": "set k_len = q_len when it is None",
            "causal_mask_from_scratch": MUST_BE_CORRECT,
        },
    ),
    Row(
        "combine_masks",
        "or",
        "combined & mask",
        "combined | mask",
        {"combine_masks_and": "combined with | (or)"},
    ),
    Row(
        "masked_attention",
        "minus_inf_fill",
        ZEROED,
        "",
        every(RULE, "exp(-inf - (-inf)) = NaN"),
    ),
    Row(
        "masked_attention",
        "finfo_min_fill",
        FILL + ZEROED,
        "    weights = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=-1)\n",
        every(RULE, "spreads the weight evenly"),
    ),
    Row(
        "masked_attention",
        "minus_1e9_fill",
        FILL + ZEROED,
        "    weights = torch.softmax(scores.masked_fill(mask == 0, -1e9), dim=-1)\n",
        {
            "masked_attention_empty_rows": "spreads the weight evenly",
            "masked_attention_half_precision": "does not fit in float16",
        },
    ),
    Row(
        "masked_attention",
        "minus_1e9_then_zeroed",
        'float("-inf")',
        "-1e9",
        {"masked_attention_half_precision": "does not fit in float16"},
    ),
    Row(
        "masked_attention",
        "nan_times_zero",
        ZEROED,
        "    weights = weights * mask.any(dim=-1, keepdim=True)\n",
        every(RULE, "NaN * 0 = NaN"),
    ),
    Row(
        "masked_attention",
        "mask_inverted",
        'masked_fill(~mask, float("-inf")), dim=-1)\n    weights = torch.where(mask.any(',
        'masked_fill(mask, float("-inf")), dim=-1)\n    weights = torch.where((~mask).any(',
        {
            "masked_attention_matches_sdpa": "the mask is inverted",
            "masked_attention_empty_rows": "neither inverted nor ignored",
            "masked_attention_half_precision": "neither inverted nor ignored",
            "masked_attention_dtype_and_inputs": "the mask is inverted",
            "masked_attention_from_scratch": MUST_BE_CORRECT,
        },
    ),
    Row(
        "masked_attention",
        "mask_not_optional",
        "    if mask is None:\n        weights = torch.softmax(scores, dim=-1)\n"
        "        return weights @ value, weights\n",
        "",
        {
            "masked_attention_matches_sdpa": "mask may be None",
            "masked_attention_from_scratch": MUST_BE_CORRECT,
        },
    ),
    Row(
        "masked_attention",
        "always_float32",
        "    scores = query",
        "    query, key, value = query.float(), key.float(), value.float()\n    scores = query",
        {"masked_attention_dtype_and_inputs": "expected torch.bfloat16"},
    ),
    Row(
        "masked_attention",
        "scales_query_in_place",
        "    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))",
        "    query /= math.sqrt(query.size(-1))\n    scores = query @ key.transpose(-2, -1)",
        {"masked_attention_dtype_and_inputs": "modified its argument `query` in place"},
    ),
    # the hints: a row test without keepdim, and a float mask given to masked_fill
    Row(
        "masked_attention",
        "any_without_keepdim",
        "mask.any(dim=-1, keepdim=True)",
        "mask.any(dim=-1)",
        every(VALUES, "keep the key axis (keepdim=True)")
        | {"masked_attention_from_scratch": MUST_BE_CORRECT},
    ),
    Row(
        "masked_attention",
        "float_mask_fill",
        "masked_fill(~mask,",
        "masked_fill(1 - mask.float(),",
        every(VALUES, "masked_fill takes a boolean mask")
        | {"masked_attention_from_scratch": MUST_BE_CORRECT},
    ),
]


# ----------------------------------------------------------------------------------------------------
# mistakes of another structure


def causal_mask__ignores_k_len(q_len, k_len=None, device=None):
    return torch.ones(q_len, q_len, dtype=torch.bool, device=device).tril()[None, None]


def causal_mask__diagonal_excluded(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None, :]
    return (j < i)[None, None]


def causal_mask__true_marks_future(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    return torch.triu(torch.ones(q_len, k_len, device=device), diagonal=k_len - q_len + 1).bool()[None, None]


def causal_mask__builtin_lower_right(q_len, k_len=None, device=None):
    from torch.nn.attention.bias import causal_lower_right

    k_len = q_len if k_len is None else k_len
    bias = causal_lower_right(q_len, k_len)
    return bias._materialize(device)[None, None]


def combine_masks__in_place_and(*masks):
    combined = None
    for mask in masks:
        if mask is None:
            continue
        if combined is None:
            combined = mask
        else:
            combined &= mask
    return combined


def combine_masks__stack_all(*masks):
    given = [mask for mask in masks if mask is not None]
    if not given:
        return None
    return torch.stack(given).all(dim=0)


def combine_masks__float_product(*masks):
    combined = torch.ones(1)
    for mask in masks:
        if mask is not None:
            combined = combined.to(mask.device) * mask
    return combined


def combine_masks__none_not_skipped(*masks):
    combined = masks[0]
    for mask in masks[1:]:
        combined = combined & mask
    return combined


def combine_masks__all_none_is_true(*masks):
    combined = torch.tensor(True)
    for mask in masks:
        if mask is not None:
            combined = combined.to(mask.device) & mask
    return combined


def masked_attention__weights_fixed_after_output(query, key, value, mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    output = weights @ value
    return output, torch.nan_to_num(weights, nan=0.0)


def masked_attention__output_fixed_only(query, key, value, mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.nan_to_num(weights @ value), weights


def masked_attention__mask_after_softmax(query, key, value, mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights * mask
    return weights @ value, weights


def masked_attention__builtin_sdpa(query, key, value, mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        weights = torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0)
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return torch.nan_to_num(output), weights


WHOLE = {
    causal_mask__ignores_k_len: {
        "causal_mask_bottom_right": "k_len argument is ignored",
        "causal_mask_boolean": "k_len argument is ignored",
        "causal_mask_from_scratch": MUST_BE_CORRECT,
    },
    causal_mask__diagonal_excluded: every(CAUSAL_VALUES, "the diagonal is excluded")
    | {"causal_mask_from_scratch": MUST_BE_CORRECT},
    causal_mask__true_marks_future: every(CAUSAL_VALUES, "True marks the blocked")
    | {"causal_mask_from_scratch": MUST_BE_CORRECT},
    causal_mask__builtin_lower_right: {"causal_mask_from_scratch": "causal_lower_right"},
    combine_masks__in_place_and: {"combine_masks_broadcasts": "combined = combined &"},
    combine_masks__stack_all: {"combine_masks_broadcasts": "torch.stack needs masks of one shape"},
    combine_masks__float_product: {
        "combine_masks_and": "combine them with &",
        "combine_masks_skips_none": "Start from `combined = None`",
    },
    combine_masks__none_not_skipped: {"combine_masks_skips_none": "must be skipped"},
    combine_masks__all_none_is_true: {"combine_masks_skips_none": "Start from `combined = None`"},
    masked_attention__weights_fixed_after_output: every(
        RULE, "computed from the weights before they were corrected"
    ),
    masked_attention__output_fixed_only: every(RULE, "exp(-inf - (-inf)) = NaN"),
    masked_attention__mask_after_softmax: every(VALUES, "applied after the softmax")
    | {"masked_attention_from_scratch": MUST_BE_CORRECT},
    masked_attention__builtin_sdpa: {"masked_attention_from_scratch": "scaled_dot_product_attention"},
}


# ----------------------------------------------------------------------------------------------------
# correct implementations in other styles


def padding_mask__unsqueeze_twice(tokens, pad_id=0):
    return tokens.ne(pad_id).unsqueeze(1).unsqueeze(2)


def padding_mask__view(tokens, pad_id=0):
    batch, length = tokens.shape
    return torch.logical_not(tokens == pad_id).view(batch, 1, 1, length)


def causal_mask__tril_offset(q_len, k_len=None, device=None):
    if k_len is None:
        k_len = q_len
    mask = torch.tril(torch.ones(q_len, k_len, dtype=torch.bool, device=device), diagonal=k_len - q_len)
    return mask.view(1, 1, q_len, k_len)


def causal_mask__negated_triu(q_len, k_len=None, device=None):
    k_len = k_len or q_len
    future = torch.ones(q_len, k_len, device=device).triu(diagonal=k_len - q_len + 1).bool()
    return ~future[None, None]


def causal_mask__last_rows_of_square(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    square = torch.ones(k_len, k_len, dtype=torch.bool).tril()
    return square[k_len - q_len :].to(device)[None, None]


def causal_mask__python_loops(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    rows = [[j <= i + k_len - q_len for j in range(k_len)] for i in range(q_len)]
    return torch.tensor(rows, dtype=torch.bool, device=device).reshape(1, 1, q_len, k_len)


def combine_masks__logical_and(*masks):
    given = [mask for mask in masks if mask is not None]
    if len(given) == 0:
        return None
    combined = given[0]
    for mask in given[1:]:
        combined = torch.logical_and(combined, mask)
    return combined


def combine_masks__broadcast_then_all(*masks):
    given = [mask for mask in masks if mask is not None]
    if not given:
        return None
    return torch.stack(torch.broadcast_tensors(*given)).all(dim=0)


def masked_attention__nan_to_num_before_output(query, key, value, mask):
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.matmul(weights, value), weights


def masked_attention__finfo_min_times_mask(query, key, value, mask):
    scores = torch.einsum("...qd,...kd->...qk", query, key) * query.size(-1) ** -0.5
    if mask is None:
        weights = scores.softmax(dim=-1)
    else:
        weights = scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(dim=-1) * mask
    return torch.einsum("...qk,...kv->...qv", weights, value), weights


def masked_attention__float32_inside(query, key, value, mask):
    wide = torch.promote_types(query.dtype, torch.float32)  # half types are computed in float32
    q, k, v = query.to(wide), key.to(wide), value.to(wide)
    scores = q @ k.mT / math.sqrt(q.size(-1))
    if mask is None:
        mask = torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
    exp = torch.exp(scores - scores.amax(dim=-1, keepdim=True)) * mask
    total = exp.sum(dim=-1, keepdim=True)
    weights = exp / torch.where(total > 0, total, 1.0)
    return (weights @ v).to(query.dtype), weights.to(query.dtype)


RIGHT = [
    padding_mask__unsqueeze_twice,
    padding_mask__view,
    causal_mask__tril_offset,
    causal_mask__negated_triu,
    causal_mask__last_rows_of_square,
    causal_mask__python_loops,
    combine_masks__logical_and,
    combine_masks__broadcast_then_all,
    masked_attention__nan_to_num_before_output,
    masked_attention__finfo_min_times_mask,
    masked_attention__float32_inside,
]
