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
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be [batch, len], got {list(tokens.shape)}")
    return (tokens != pad_id)[:, None, None, :]
""",
    "causal_mask": """def causal_mask(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    if q_len < 1 or k_len < 1:
        raise ValueError(f"q_len and k_len must be at least 1, got {q_len} and {k_len}")
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)[None, None]
""",
    "combine_masks": """def combine_masks(*masks):
    combined = None
    for mask in masks:
        if mask is None:
            continue
        if mask.dtype != torch.bool:
            raise TypeError(f"masks must be boolean, got {mask.dtype}")
        combined = mask if combined is None else combined & mask
    return combined
""",
    "masked_attention": """def masked_attention(query, key, value, mask):
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean, got {mask.dtype}")
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
    Row(
        "padding_mask",
        "true_marks_padding",
        "tokens != pad_id",
        "tokens == pad_id",
        {"padding_mask_values": "True marks the padding"},
    ),
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
    # the docstring's errors, left out or raised as another type
    Row(
        "padding_mask",
        "no_dimension_check",
        "    if tokens.dim() != 2:\n",
        "    if False:\n",
        {"padding_mask_shape": "check tokens.dim() == 2 first and raise ValueError"},
    ),
    Row(
        "causal_mask",
        "no_size_check",
        "    if q_len < 1 or k_len < 1:\n",
        "    if False:\n",
        {"causal_mask_boolean": "check q_len >= 1 and k_len >= 1 first"},
    ),
    Row(
        "causal_mask",
        "device_wrapped",
        "device=device)",
        "device=torch.device(device))",
        {"causal_mask_device": "torch.device(None) raises"},
    ),
    Row(
        "combine_masks",
        "no_type_check",
        "        if mask.dtype != torch.bool:\n",
        "        if False:\n",
        {"combine_masks_and": "check each mask's dtype"},
    ),
    Row(
        "masked_attention",
        "no_type_check",
        "    if mask is not None and mask.dtype != torch.bool:\n",
        "    if False:\n",
        {"masked_attention_dtype_and_inputs": "check mask.dtype != torch.bool first and raise TypeError"},
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
    if q_len < 1 or k_len < 1:
        raise ValueError("q_len and k_len must be at least 1")
    bias = causal_lower_right(q_len, k_len)
    return bias._materialize(device)[None, None]


def causal_mask__k_len_or_q_len(q_len, k_len=None, device=None):
    k_len = k_len or q_len  # k_len=0 is taken for "not given"
    if q_len < 1 or k_len < 1:
        raise ValueError("q_len and k_len must be at least 1")
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)[None, None]


def causal_mask__last_rows_of_square(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    if q_len < 1 or k_len < 1:
        raise ValueError("q_len and k_len must be at least 1")
    square = torch.ones(k_len, k_len, dtype=torch.bool).tril()  # no row for queries before the first key
    return square[k_len - q_len :].to(device)[None, None]


def combine_masks__shape_error_as_value_error(*masks):
    combined = None
    for mask in masks:
        if mask is None:
            continue
        if mask.dtype != torch.bool:
            raise TypeError("masks must be boolean")
        try:
            combined = mask if combined is None else combined & mask
        except RuntimeError as error:
            raise ValueError(f"the masks do not broadcast: {error}") from None
    return combined


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


def masked_attention__logical_not_accepts_any_mask(query, key, value, mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
        return weights @ value, weights
    blocked = torch.logical_not(mask)  # 0/1 floats and integers are taken as masks, not refused
    weights = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1)
    weights = weights.masked_fill(blocked.all(dim=-1, keepdim=True), 0.0)
    return weights @ value, weights


def masked_attention__builtin_sdpa(query, key, value, mask):
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        weights = torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0)
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return torch.nan_to_num(output), weights


# the documented errors that implementations without a check miss
SIZES_UNCHECKED, NO_SIZE_CHECK = "causal_mask_boolean", "check q_len >= 1 and k_len >= 1 first"
NO_TYPE_CHECK = {"combine_masks_and": "check each mask's dtype"}
NO_MASK_CHECK = {"masked_attention_dtype_and_inputs": "check mask.dtype != torch.bool first"}

WHOLE = {
    causal_mask__ignores_k_len: {
        "causal_mask_bottom_right": "k_len argument is ignored",
        "causal_mask_boolean": "k_len argument is ignored",
        "causal_mask_from_scratch": MUST_BE_CORRECT,
    },
    causal_mask__diagonal_excluded: every(CAUSAL_VALUES, "the diagonal is excluded")
    | {"causal_mask_from_scratch": MUST_BE_CORRECT, SIZES_UNCHECKED: NO_SIZE_CHECK},
    causal_mask__true_marks_future: every(CAUSAL_VALUES, "True marks the blocked")
    | {"causal_mask_from_scratch": MUST_BE_CORRECT, SIZES_UNCHECKED: NO_SIZE_CHECK},
    causal_mask__builtin_lower_right: {"causal_mask_from_scratch": "causal_lower_right"},
    causal_mask__k_len_or_q_len: {"causal_mask_boolean": "`k_len or q_len` also replaces k_len=0"},
    causal_mask__last_rows_of_square: {"causal_mask_boolean": "also when q_len > k_len"},
    combine_masks__shape_error_as_value_error: {"combine_masks_broadcasts": "let it propagate"},
    masked_attention__logical_not_accepts_any_mask: {
        "masked_attention_dtype_and_inputs": "mask == 0 or logical_not() would silently accept it"
    },
    # (the implementations below check no dtype, and so miss the documented TypeError too)
    combine_masks__in_place_and: {"combine_masks_broadcasts": "combined = combined &", **NO_TYPE_CHECK},
    combine_masks__stack_all: {
        "combine_masks_broadcasts": "torch.stack needs masks of one shape",
        **NO_TYPE_CHECK,
    },
    combine_masks__float_product: {
        "combine_masks_and": "combine them with &",
        "combine_masks_skips_none": "Start from `combined = None`",
    },
    combine_masks__none_not_skipped: {"combine_masks_skips_none": "must be skipped", **NO_TYPE_CHECK},
    combine_masks__all_none_is_true: {
        "combine_masks_skips_none": "Start from `combined = None`",
        **NO_TYPE_CHECK,
    },
    masked_attention__weights_fixed_after_output: every(
        RULE, "computed from the weights before they were corrected"
    )
    | NO_MASK_CHECK,
    masked_attention__output_fixed_only: every(RULE, "exp(-inf - (-inf)) = NaN") | NO_MASK_CHECK,
    masked_attention__mask_after_softmax: every(VALUES, "applied after the softmax")
    | {"masked_attention_from_scratch": MUST_BE_CORRECT},
    masked_attention__builtin_sdpa: {"masked_attention_from_scratch": "scaled_dot_product_attention"},
}


# ----------------------------------------------------------------------------------------------------
# correct implementations in other styles


def padding_mask__unsqueeze_twice(tokens, pad_id=0):
    if tokens.ndim != 2:
        raise ValueError("tokens must be two-dimensional")
    return tokens.ne(pad_id).unsqueeze(1).unsqueeze(2)


def padding_mask__view(tokens, pad_id=0):
    if len(tokens.shape) != 2:
        raise ValueError(f"expected [batch, len] tokens, got {tuple(tokens.shape)}")
    batch, length = tokens.shape
    return torch.logical_not(tokens == pad_id).view(batch, 1, 1, length)


def causal_mask__tril_offset(q_len, k_len=None, device=None):
    if k_len is None:
        k_len = q_len
    if min(q_len, k_len) < 1:
        raise ValueError("empty mask")
    mask = torch.tril(torch.ones(q_len, k_len, dtype=torch.bool, device=device), diagonal=k_len - q_len)
    return mask.view(1, 1, q_len, k_len)


def causal_mask__negated_triu(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    if q_len <= 0 or k_len <= 0:
        raise ValueError("q_len and k_len must be positive")
    future = torch.ones(q_len, k_len, device=device).triu(diagonal=k_len - q_len + 1).bool()
    return ~future[None, None]


def causal_mask__arange_positions(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    if q_len < 1 or k_len < 1:
        raise ValueError("q_len and k_len must be at least 1")
    query_position = torch.arange(k_len - q_len, k_len, device=device)  # the last q_len positions
    return (torch.arange(k_len, device=device) <= query_position[:, None]).view(1, 1, q_len, k_len)


def causal_mask__python_loops(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    if not (q_len >= 1 and k_len >= 1):
        raise ValueError("q_len and k_len must be at least 1")
    rows = [[j <= i + k_len - q_len for j in range(k_len)] for i in range(q_len)]
    return torch.tensor(rows, dtype=torch.bool, device=device).reshape(1, 1, q_len, k_len)


def combine_masks__logical_and(*masks):
    given = [mask for mask in masks if mask is not None]
    if any(mask.dtype is not torch.bool for mask in given):
        raise TypeError("masks must be boolean (True = may attend)")
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
    for mask in given:
        if mask.dtype != torch.bool:
            raise TypeError(f"a mask of {mask.dtype}: masks are boolean")
    return torch.stack(torch.broadcast_tensors(*given)).all(dim=0)


def masked_attention__nan_to_num_before_output(query, key, value, mask):
    if mask is not None and mask.dtype is not torch.bool:
        raise TypeError("mask must be boolean")
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.matmul(weights, value), weights


def masked_attention__finfo_min_times_mask(query, key, value, mask):
    if mask is not None and (mask.is_floating_point() or mask.dtype != torch.bool):
        raise TypeError("mask must be boolean")
    scores = torch.einsum("...qd,...kd->...qk", query, key) * query.size(-1) ** -0.5
    if mask is None:
        weights = scores.softmax(dim=-1)
    else:
        weights = scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(dim=-1) * mask
    return torch.einsum("...qk,...kv->...qv", weights, value), weights


def masked_attention__float32_inside(query, key, value, mask):
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean, got {mask.dtype}")
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
    causal_mask__arange_positions,
    causal_mask__python_loops,
    combine_masks__logical_and,
    combine_masks__broadcast_then_all,
    masked_attention__nan_to_num_before_output,
    masked_attention__finfo_min_times_mask,
    masked_attention__float32_inside,
]
