"""Implementations of exercise ex03 that a learner could plausibly write: wrong ones and right ones.

Each function is self-contained (it uses only ``torch`` and ``math``, fully qualified), so that its source
can also be pasted into a notebook as a submission. The name is ``<function>__<variant>``; the part before
``__`` is the function of the exercise it stands for.

``WRONG`` maps each wrong implementation to the test cells (by nbgrader grade id) that must reject it,
with a fragment of the message each must give. ``RIGHT`` lists correct implementations in other styles
that every test cell must accept.
"""

import math

import torch

# ----------------------------------------------------------------------------------------------------
# padding_mask


def padding_mask__no_new_axes(tokens, pad_id=0):
    return tokens != pad_id


def padding_mask__unsqueeze_once(tokens, pad_id=0):
    return (tokens != pad_id).unsqueeze(1)


def padding_mask__along_queries(tokens, pad_id=0):
    return (tokens != pad_id)[:, None, :, None]


def padding_mask__true_marks_padding(tokens, pad_id=0):
    return (tokens == pad_id)[:, None, None, :]


def padding_mask__hard_coded_zero(tokens, pad_id=0):
    return tokens.bool()[:, None, None, :]


def padding_mask__hugging_face_integers(tokens, pad_id=0):
    return (tokens != pad_id).long()[:, None, None, :]


# ----------------------------------------------------------------------------------------------------
# causal_mask


def causal_mask__top_left(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril()[None, None]


def causal_mask__ignores_k_len(q_len, k_len=None, device=None):
    return torch.ones(q_len, q_len, dtype=torch.bool, device=device).tril()[None, None]


def causal_mask__diagonal_excluded(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None, :]
    return (j < i)[None, None]


def causal_mask__upper_triangle(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).triu(k_len - q_len)[None, None]


def causal_mask__true_marks_future(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    return torch.triu(torch.ones(q_len, k_len, device=device), diagonal=k_len - q_len + 1).bool()[None, None]


def causal_mask__float_ones(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    return torch.tril(torch.ones(q_len, k_len, device=device), diagonal=k_len - q_len)[None, None]


def causal_mask__two_dimensional(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)


def causal_mask__ignores_device(q_len, k_len=None, device=None):
    k_len = q_len if k_len is None else k_len
    return torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)[None, None]


def causal_mask__builtin_lower_right(q_len, k_len=None, device=None):
    from torch.nn.attention.bias import causal_lower_right

    k_len = q_len if k_len is None else k_len
    bias = causal_lower_right(q_len, k_len)
    return bias._materialize(device)[None, None]


# ----------------------------------------------------------------------------------------------------
# combine_masks


def combine_masks__or(*masks):
    combined = None
    for mask in masks:
        if mask is not None:
            combined = mask if combined is None else combined | mask
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


# ----------------------------------------------------------------------------------------------------
# masked_attention (torch.softmax is allowed in this exercise)


def masked_attention__minus_inf_fill(query, key, value, mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def masked_attention__finfo_min_fill(query, key, value, mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def masked_attention__minus_1e9_fill(query, key, value, mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def masked_attention__minus_1e9_then_zeroed(query, key, value, mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
        return weights @ value, weights
    weights = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)
    weights = torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0)
    return weights @ value, weights


def masked_attention__nan_times_zero(query, key, value, mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
        return weights @ value, weights
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    weights = weights * mask.any(dim=-1, keepdim=True)
    return weights @ value, weights


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


def masked_attention__mask_inverted(query, key, value, mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
        return weights @ value, weights
    weights = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    weights = torch.where((~mask).any(dim=-1, keepdim=True), weights, 0.0)
    return weights @ value, weights


def masked_attention__mask_after_softmax(query, key, value, mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights * mask
    return weights @ value, weights


def masked_attention__mask_not_optional(query, key, value, mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    weights = torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0)
    return weights @ value, weights


def masked_attention__always_float32(query, key, value, mask):
    query, key, value = query.float(), key.float(), value.float()
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
        return weights @ value, weights
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    weights = torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0)
    return weights @ value, weights


def masked_attention__scales_query_in_place(query, key, value, mask):
    query /= math.sqrt(query.size(-1))
    scores = query @ key.transpose(-2, -1)
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
        return weights @ value, weights
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    weights = torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0)
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


# ----------------------------------------------------------------------------------------------------
# what each wrong implementation must trigger: {grade id of a test cell: fragment of its message}

WRONG = {
    padding_mask__no_new_axes: {"padding_mask_shape": "add an axis for the heads and one for the queries"},
    padding_mask__unsqueeze_once: {"padding_mask_shape": "one axis is missing"},
    padding_mask__along_queries: {"padding_mask_shape": "laid along the query axis"},
    padding_mask__true_marks_padding: {"padding_mask_values": "True marks the padding"},
    padding_mask__hard_coded_zero: {"padding_mask_values": "not a hard-coded 0"},
    padding_mask__hugging_face_integers: {"padding_mask_shape": "drop the .long()"},
    causal_mask__top_left: {"causal_mask_bottom_right": "aligned top-left"},
    causal_mask__ignores_k_len: {"causal_mask_bottom_right": "k_len argument is ignored"},
    causal_mask__diagonal_excluded: {
        "causal_mask_square": "the diagonal is excluded",
        "causal_mask_bottom_right": "the diagonal is excluded",
    },
    causal_mask__upper_triangle: {"causal_mask_square": "transposed"},
    causal_mask__true_marks_future: {"causal_mask_square": "True marks the blocked"},
    causal_mask__float_ones: {"causal_mask_boolean": "dtype=torch.bool"},
    causal_mask__two_dimensional: {"causal_mask_boolean": "add the batch and heads axes"},
    causal_mask__ignores_device: {"causal_mask_device": "the device argument is ignored"},
    causal_mask__builtin_lower_right: {"causal_mask_from_scratch": "causal_lower_right"},
    combine_masks__or: {"combine_masks_and": "combined with | (or)"},
    combine_masks__in_place_and: {
        "combine_masks_and": "in place",
        "combine_masks_broadcasts": "combined = combined &",
    },
    combine_masks__stack_all: {"combine_masks_broadcasts": "torch.stack needs masks of one shape"},
    combine_masks__float_product: {"combine_masks_and": "combine them with &"},
    combine_masks__none_not_skipped: {"combine_masks_skips_none": "must be skipped"},
    combine_masks__all_none_is_true: {"combine_masks_skips_none": "Start from `combined = None`"},
    masked_attention__minus_inf_fill: {"masked_attention_empty_rows": "exp(-inf - (-inf)) = NaN"},
    masked_attention__finfo_min_fill: {"masked_attention_empty_rows": "spreads the weight evenly"},
    masked_attention__minus_1e9_fill: {"masked_attention_empty_rows": "spreads the weight evenly"},
    masked_attention__minus_1e9_then_zeroed: {"masked_attention_half_precision": "does not fit in float16"},
    masked_attention__nan_times_zero: {"masked_attention_empty_rows": "NaN * 0 = NaN"},
    masked_attention__weights_fixed_after_output: {
        "masked_attention_empty_rows": "computed from the weights before they were corrected"
    },
    masked_attention__output_fixed_only: {"masked_attention_empty_rows": "exp(-inf - (-inf)) = NaN"},
    masked_attention__mask_inverted: {"masked_attention_matches_sdpa": "the mask is inverted"},
    masked_attention__mask_after_softmax: {"masked_attention_matches_sdpa": "applied after the softmax"},
    masked_attention__mask_not_optional: {"masked_attention_matches_sdpa": "mask may be None"},
    masked_attention__always_float32: {"masked_attention_dtype_and_inputs": "expected torch.bfloat16"},
    masked_attention__scales_query_in_place: {
        "masked_attention_dtype_and_inputs": "modified its argument `query` in place"
    },
    masked_attention__builtin_sdpa: {"masked_attention_from_scratch": "scaled_dot_product_attention"},
}

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
