"""Implementations of exercise ex11 that a learner could plausibly write: wrong ones and right ones.

Every implementation is self-contained (``torch`` and ``math`` only, and the notebook's own
``online_softmax_merge`` where one calls it), so that its source is also a submission's solution cell.
``ROWS`` are one-line mistakes applied to ``BASES``; ``WHOLE`` holds mistakes of another structure;
``RIGHT`` correct implementations in other styles, which every cell must accept. Expectations name
*exactly* the test cells that reject an implementation (see ``_bank.py``).
"""

import math

import torch

from tests.banks._bank import Row

BASES = {
    "online_softmax_merge": """def online_softmax_merge(max_a, sum_a, out_a, max_b, sum_b, out_b):
    new_max = torch.maximum(max_a, max_b)
    safe = new_max.masked_fill(new_max == float("-inf"), 0.0)
    scale_a, scale_b = torch.exp(max_a - safe), torch.exp(max_b - safe)
    new_sum = scale_a * sum_a + scale_b * sum_b
    new_out = scale_a[..., None] * out_a + scale_b[..., None] * out_b
    return new_max, new_sum, new_out
""",
    # the recurrence written out inline, so that a row can break one step of it
    "tiled_attention": """def tiled_attention(query, key, value, block_size, mask=None):
    if block_size < 1:
        raise ValueError("block_size must be at least 1")
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("the mask must be boolean")
    if mask is not None:
        mask = mask.expand(*mask.shape[:-1], key.size(-2))  # a mask of one key column
    scale = 1 / math.sqrt(query.size(-1))
    like = dict(dtype=query.dtype, device=query.device)
    running_max = torch.full(query.shape[:-1], float("-inf"), **like)
    running_sum = torch.zeros(query.shape[:-1], **like)
    out = torch.zeros(*query.shape[:-1], value.size(-1), **like)
    for start in range(0, key.size(-2), block_size):
        stop = start + block_size
        scores = query @ key[..., start:stop, :].transpose(-2, -1) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask[..., start:stop], float("-inf"))
        new_max = torch.maximum(running_max, scores.amax(dim=-1))
        safe_max = new_max.masked_fill(new_max == float("-inf"), 0.0)
        rescale = torch.exp(running_max - safe_max)
        weights = torch.exp(scores - safe_max[..., None])
        running_sum = running_sum * rescale + weights.sum(dim=-1)
        out = out * rescale[..., None] + weights @ value[..., start:stop, :]
        running_max = new_max
    return out / torch.where(running_sum > 0, running_sum, 1.0)[..., None]
""",
}

MERGE_VALUES = ("merge_two_blocks", "merge_empty_states", "merge_dtype_and_inputs")
MUST_BE_CORRECT = "must be correct before its memory counts"
TILED_VALUES = ("tiled_matches_sdpa", "tiled_masks", "tiled_empty_rows", "tiled_dtype_and_inputs")
MASKED = ("tiled_masks", "tiled_empty_rows", "tiled_dtype_and_inputs")


def every(cells, fragment):
    return dict.fromkeys(cells, fragment)


def values(cells, fragment):
    """The value cells ``cells`` with ``fragment``, and the memory cell, which needs a correct function."""
    return every(cells, fragment) | {"tiled_memory": MUST_BE_CORRECT}


ROWS = [
    # --- online_softmax_merge
    Row(
        "online_softmax_merge",
        "sum_not_rescaled",
        "scale_a * sum_a + scale_b * sum_b",
        "sum_a + sum_b",
        every(MERGE_VALUES, "the running sum is not rescaled"),
    ),
    Row(
        "online_softmax_merge",
        "output_not_rescaled",
        "scale_a[..., None] * out_a + scale_b[..., None] * out_b",
        "out_a + out_b",
        every(MERGE_VALUES, "the output is not rescaled"),
    ),
    Row(
        "online_softmax_merge",
        "factor_flipped",
        "torch.exp(max_a - safe), torch.exp(max_b - safe)",
        "torch.exp(safe - max_a), torch.exp(safe - max_b)",
        every(MERGE_VALUES, "the wrong way round"),
    ),
    Row(
        "online_softmax_merge",
        "max_not_updated",
        "return new_max, new_sum, new_out",
        "return max_a, new_sum, new_out",
        every(MERGE_VALUES, "the merged max is max_a"),
    ),
    Row(
        "online_softmax_merge",
        "no_guard",
        'new_max.masked_fill(new_max == float("-inf"), 0.0)',
        "new_max",
        {"merge_empty_states": "exp(-inf - (-inf)) is NaN"},
    ),
    Row(
        "online_softmax_merge",
        "returns_the_shift",
        "return new_max, new_sum, new_out",
        "return safe, new_sum, new_out",
        {"merge_empty_states": "must stay -inf"},
    ),
    Row(
        "online_softmax_merge",
        "normalised",
        "    return new_max, new_sum, new_out",
        "    return new_max, new_sum, new_out / new_sum[..., None]",
        every(MERGE_VALUES, "divided by the merged sum"),
    ),
    Row(
        "online_softmax_merge",
        "keepdim_states",
        "    return new_max, new_sum, new_out",
        "    return new_max[..., None], new_sum[..., None], new_out",
        every(MERGE_VALUES, "without a trailing axis of 1"),
    ),
    # --- tiled_attention
    Row(
        "tiled_attention",
        "sum_not_rescaled",
        "running_sum * rescale + ",
        "running_sum + ",
        values(TILED_VALUES, "the running sum is not rescaled"),
    ),
    Row(
        "tiled_attention",
        "max_not_updated",
        "        running_max = new_max\n",
        "",
        values(TILED_VALUES, "only the last block of keys counts"),
    ),
    Row(
        "tiled_attention",
        "factor_flipped",
        "torch.exp(running_max - safe_max)",
        "torch.exp(safe_max - running_max)",
        values(TILED_VALUES, "the wrong way round"),
    ),
    Row(
        "tiled_attention",
        "no_scale",
        " * scale\n",
        "\n",
        values(TILED_VALUES, "the scores are not scaled"),
    ),
    Row(
        "tiled_attention",
        "last_block_dropped",
        "range(0, key.size(-2), block_size)",
        "range(0, key.size(-2) - block_size + 1, block_size)",
        values(TILED_VALUES, "the last, shorter block of keys is dropped"),
    ),
    Row(
        "tiled_attention",
        "no_guard_in_the_loop",
        'new_max.masked_fill(new_max == float("-inf"), 0.0)',
        "new_max",
        every(MASKED, "exp(-inf - (-inf))"),
    ),
    Row(
        "tiled_attention",
        "no_guard_at_the_end",
        "torch.where(running_sum > 0, running_sum, 1.0)",
        "running_sum",
        {"tiled_empty_rows": "0/0 at the end"},
    ),
    Row(
        "tiled_attention",
        "finite_fill",
        '~mask[..., start:stop], float("-inf")',
        "~mask[..., start:stop], torch.finfo(scores.dtype).min",
        {"tiled_empty_rows": "filled with a finite number"},
    ),
    Row(
        "tiled_attention",
        "float32_accumulators",
        "    out = torch.zeros(*query.shape[:-1], value.size(-1), **like)\n",
        "    out = torch.zeros(*query.shape[:-1], value.size(-1), device=query.device)\n",
        {"tiled_dtype_and_inputs": "the dtype must follow the inputs"},
    ),
    # --- the promises of the docstrings, clause by clause
    Row(
        "online_softmax_merge",
        "shift_clamped_at_0",
        'safe = new_max.masked_fill(new_max == float("-inf"), 0.0)',
        "safe = new_max.clamp(min=0.0)",
        every(MERGE_VALUES, "the shift is clamped at 0"),
    ),
    Row(
        "online_softmax_merge",
        "minus_1e30_for_no_key",
        'safe = new_max.masked_fill(new_max == float("-inf"), 0.0)',
        'safe = torch.where(new_max == float("-inf"), -1e30, new_max)',
        {"merge_empty_states": "-1e30 (or torch.finfo(torch.float32).min) is -inf in float16"},
    ),
    Row(
        "tiled_attention",
        "max_starts_at_0",
        '    running_max = torch.full(query.shape[:-1], float("-inf"), **like)\n',
        "    running_max = torch.zeros(query.shape[:-1], **like)\n",
        {"tiled_matches_sdpa": "the running max starts at 0 instead of -inf"},
    ),
    Row(
        "tiled_attention",
        "every_axis_of_1_squeezed",
        "torch.maximum(running_max, scores.amax(dim=-1))",
        "torch.maximum(running_max, scores.amax(dim=-1, keepdim=True).squeeze())",
        {"tiled_matches_sdpa": "squeeze() without an axis removes every axis of size 1"},
    ),
    Row(
        "tiled_attention",
        "shapes_not_checked",
        "    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):\n"
        '        raise ValueError("query, key and value do not fit")\n',
        "",
        {"tiled_matches_sdpa": "should raise ValueError when query and key differ in d_k"},
    ),
    Row(
        "tiled_attention",
        "no_checks",
        '    if block_size < 1:\n        raise ValueError("block_size must be at least 1")\n'
        "    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):\n"
        '        raise ValueError("query, key and value do not fit")\n'
        "    if mask is not None and mask.dtype != torch.bool:\n"
        '        raise TypeError("the mask must be boolean")\n',
        "",
        {
            "tiled_matches_sdpa": "should raise ValueError if block_size < 1",
            "tiled_masks": "should raise TypeError if mask is not boolean",
        },
    ),
    Row(
        "tiled_attention",
        "sum_plus_1e_30",
        "torch.where(running_sum > 0, running_sum, 1.0)",
        "(running_sum + 1e-30)",
        {"tiled_empty_rows": "in float16 a small number added to the sum"},
    ),
    Row(
        "tiled_attention",
        "one_column_mask_sliced",
        "        mask = mask.expand(*mask.shape[:-1], key.size(-2))  # a mask of one key column\n",
        "        pass\n",
        {"tiled_empty_rows": "a mask of one key column"},
    ),
    Row(
        "tiled_attention",
        "query_scaled_in_place",
        "    scale = 1 / math.sqrt(query.size(-1))\n",
        "    query /= math.sqrt(query.size(-1))  # once, not for every block\n    scale = 1.0\n",
        {"tiled_dtype_and_inputs": "modified its argument `query` in place"},
    ),
]


# --- mistakes of another structure


def online_softmax_merge__weighted_by_sums(max_a, sum_a, out_a, max_b, sum_b, out_b):
    # FlashAttention's algorithm 1 merges *normalised* outputs; these states are not normalised
    new_max = torch.maximum(max_a, max_b)
    safe = new_max.masked_fill(new_max == float("-inf"), 0.0)
    scale_a, scale_b = torch.exp(max_a - safe), torch.exp(max_b - safe)
    new_sum = scale_a * sum_a + scale_b * sum_b
    new_out = (scale_a * sum_a)[..., None] * out_a + (scale_b * sum_b)[..., None] * out_b
    return new_max, new_sum, new_out / torch.where(new_sum > 0, new_sum, 1.0)[..., None]


def online_softmax_merge__in_place(max_a, sum_a, out_a, max_b, sum_b, out_b):
    new_max = torch.maximum(max_a, max_b)
    safe = new_max.masked_fill(new_max == float("-inf"), 0.0)
    scale_a, scale_b = torch.exp(max_a - safe), torch.exp(max_b - safe)
    out_a *= scale_a[..., None]  # changes the caller's state
    out_a += scale_b[..., None] * out_b
    return new_max, scale_a * sum_a + scale_b * sum_b, out_a


def tiled_attention__full_scores(query, key, value, block_size, mask=None):
    # the plain form: right values, the whole [..., q_len, k_len] matrix in memory
    if block_size < 1:
        raise ValueError("block_size must be at least 1")
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("the mask must be boolean")
    if mask is not None:
        mask = mask.expand(*mask.shape[:-1], key.size(-2))
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    top = scores.amax(dim=-1, keepdim=True)
    weights = torch.exp(scores - top.masked_fill(top == float("-inf"), 0.0))
    total = weights.sum(dim=-1, keepdim=True)
    return weights @ value / torch.where(total > 0, total, 1.0)


def tiled_attention__sdpa(query, key, value, block_size, mask=None):
    # PyTorch's fused attention (its flash kernel tiles on the CPU too): right values, not from scratch
    import torch.nn.functional as F

    if block_size < 1:
        raise ValueError("block_size must be at least 1")
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("the mask must be boolean")
    if mask is not None:
        mask = mask.expand(*query.shape[:-2], query.size(-2), key.size(-2))

    output = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    if mask is not None:
        output = output.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return output


def tiled_attention__per_block_normalised(query, key, value, block_size, mask=None):
    # each block's output divided by the block's own sum, and no division at the end
    if block_size < 1:
        raise ValueError("block_size must be at least 1")
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("the mask must be boolean")
    if mask is not None:
        mask = mask.expand(*mask.shape[:-1], key.size(-2))
    scale = 1 / math.sqrt(query.size(-1))
    like = dict(dtype=query.dtype, device=query.device)
    running_max = torch.full(query.shape[:-1], float("-inf"), **like)
    out = torch.zeros(*query.shape[:-1], value.size(-1), **like)
    for start in range(0, key.size(-2), block_size):
        scores = query @ key[..., start : start + block_size, :].transpose(-2, -1) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask[..., start : start + block_size], float("-inf"))
        new_max = torch.maximum(running_max, scores.amax(dim=-1))
        safe_max = new_max.masked_fill(new_max == float("-inf"), 0.0)
        weights = torch.exp(scores - safe_max[..., None])
        sums = weights.sum(dim=-1, keepdim=True)
        block = weights @ value[..., start : start + block_size, :] / torch.where(sums > 0, sums, 1.0)
        out = out * torch.exp(running_max - safe_max)[..., None] + block
        running_max = new_max
    return out


def tiled_attention__mask_after_exp(query, key, value, block_size, mask=None):
    # the max taken over every score, the masked ones included, and the mask applied to the exponentials
    if block_size < 1:
        raise ValueError("block_size must be at least 1")
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("the mask must be boolean")
    if mask is not None:
        mask = mask.expand(*mask.shape[:-1], key.size(-2))
    scale = 1 / math.sqrt(query.size(-1))
    like = dict(dtype=query.dtype, device=query.device)
    running_max = torch.full(query.shape[:-1], float("-inf"), **like)
    running_sum = torch.zeros(query.shape[:-1], **like)
    out = torch.zeros(*query.shape[:-1], value.size(-1), **like)
    for start in range(0, key.size(-2), block_size):
        scores = query @ key[..., start : start + block_size, :].transpose(-2, -1) * scale
        new_max = torch.maximum(running_max, scores.amax(dim=-1))
        rescale = torch.exp(running_max - new_max)
        weights = torch.exp(scores - new_max[..., None])
        if mask is not None:
            weights = weights * mask[..., start : start + block_size]
        running_sum = running_sum * rescale + weights.sum(dim=-1)
        out = out * rescale[..., None] + weights @ value[..., start : start + block_size, :]
        running_max = new_max
    return out / torch.where(running_sum > 0, running_sum, 1.0)[..., None]


def tiled_attention__first_max_kept(query, key, value, block_size, mask=None):
    # the max of the first block, never updated: exact until a later block has much larger scores
    if block_size < 1:
        raise ValueError("block_size must be at least 1")
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("the mask must be boolean")
    if mask is not None:
        mask = mask.expand(*mask.shape[:-1], key.size(-2))
    scale = 1 / math.sqrt(query.size(-1))
    like = dict(dtype=query.dtype, device=query.device)
    running_max = None
    running_sum = torch.zeros(query.shape[:-1], **like)
    out = torch.zeros(*query.shape[:-1], value.size(-1), **like)
    for start in range(0, key.size(-2), block_size):
        scores = query @ key[..., start : start + block_size, :].transpose(-2, -1) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask[..., start : start + block_size], float("-inf"))
        if running_max is None:
            running_max = scores.amax(dim=-1)
            running_max = running_max.masked_fill(running_max == float("-inf"), 0.0)
        weights = torch.exp(scores - running_max[..., None])
        running_sum = running_sum + weights.sum(dim=-1)
        out = out + weights @ value[..., start : start + block_size, :]
    return out / torch.where(running_sum > 0, running_sum, 1.0)[..., None]


def online_softmax_merge__stacked_without_broadcasting(max_a, sum_a, out_a, max_b, sum_b, out_b):
    # both states stacked on a new first axis, then reduced over it
    maxima = torch.stack((max_a, max_b))  # [2, ..., q_len]
    new_max = maxima.amax(dim=0)
    scales = torch.exp(maxima - new_max.masked_fill(new_max == float("-inf"), 0.0))
    new_sum = (scales * torch.stack((sum_a, sum_b))).sum(dim=0)
    new_out = (scales[..., None] * torch.stack((out_a, out_b))).sum(dim=0)
    return new_max, new_sum, new_out


WHOLE = {
    online_softmax_merge__weighted_by_sums: {
        "merge_two_blocks": "the merge of normalised outputs",
        "merge_empty_states": "the merge of normalised outputs",
        "merge_dtype_and_inputs": "the merge of normalised outputs",
    },
    online_softmax_merge__in_place: {"merge_dtype_and_inputs": "modified its argument `out_a` in place"},
    tiled_attention__full_scores: {"tiled_memory": "the whole score matrix"},
    tiled_attention__sdpa: {"tiled_memory": "from scratch"},
    tiled_attention__per_block_normalised: values(TILED_VALUES, "divided by its own sum"),
    tiled_attention__mask_after_exp: {"tiled_masks": "the mask is applied after exp"},
    tiled_attention__first_max_kept: {"tiled_matches_sdpa": "the running max stays the first block's"},
    online_softmax_merge__stacked_without_broadcasting: {"merge_two_blocks": "leading axes broadcast"},
}


# --- right implementations in other styles


def online_softmax_merge__where_branches(max_a, sum_a, out_a, max_b, sum_b, out_b):
    # rescale only the state whose max is the smaller; an empty state contributes nothing
    a_larger = max_a >= max_b
    new_max = torch.where(a_larger, max_a, max_b)
    empty = new_max == float("-inf")
    low = torch.where(a_larger, max_b, max_a)
    factor = torch.where(empty, torch.zeros_like(low), torch.exp(low - torch.where(empty, 0.0, new_max)))
    sum_high, sum_low = torch.where(a_larger, sum_a, sum_b), torch.where(a_larger, sum_b, sum_a)
    out_high = torch.where(a_larger[..., None], out_a, out_b)
    out_low = torch.where(a_larger[..., None], out_b, out_a)
    keep = torch.where(empty, 0.0, 1.0).to(sum_a.dtype)
    return (
        new_max,
        keep * sum_high + factor * sum_low,
        keep[..., None] * out_high + factor[..., None] * out_low,
    )


def online_softmax_merge__stacked(max_a, sum_a, out_a, max_b, sum_b, out_b):
    maxima = torch.stack(torch.broadcast_tensors(max_a, max_b))  # [2, ..., q_len]
    new_max = maxima.amax(dim=0)
    scales = torch.exp(maxima - torch.nan_to_num(new_max, neginf=0.0)).nan_to_num(0.0)  # [2, ..., q_len]
    new_sum = (scales * torch.stack(torch.broadcast_tensors(sum_a, sum_b))).sum(dim=0)
    outs = torch.stack(torch.broadcast_tensors(out_a, out_b))
    return new_max, new_sum, (scales[..., None] * outs).sum(dim=0)


def tiled_attention__merge_helper(query, key, value, block_size, mask=None):
    # the notebook's own online_softmax_merge, blocks from torch.split
    k_len, d_k = key.size(-2), query.size(-1)
    if not block_size >= 1:
        raise ValueError(f"block_size={block_size}")
    if d_k != key.size(-1):
        raise ValueError("query and key have different widths")
    if value.size(-2) != k_len:
        raise ValueError("key and value have different lengths")
    if mask is not None:
        if mask.dtype is not torch.bool:
            raise TypeError(f"mask of dtype {mask.dtype}")
        mask = torch.broadcast_to(mask, (*mask.shape[:-1], k_len))
    state = (
        torch.full(query.shape[:-1], -math.inf, dtype=query.dtype, device=query.device),
        torch.zeros(query.shape[:-1], dtype=query.dtype, device=query.device),
        torch.zeros(*query.shape[:-1], value.size(-1), dtype=query.dtype, device=query.device),
    )
    masks = [None] * math.ceil(k_len / block_size) if mask is None else mask.split(block_size, dim=-1)
    blocks = zip(key.split(block_size, dim=-2), value.split(block_size, dim=-2), masks, strict=True)
    for key_block, value_block, mask_block in blocks:
        scores = torch.einsum("...qd,...kd->...qk", query, key_block) / math.sqrt(d_k)
        if mask_block is not None:
            scores = torch.where(mask_block, scores, -math.inf)
        top = scores.amax(dim=-1)
        weights = torch.exp(scores - torch.where(top == -math.inf, 0.0, top).unsqueeze(-1))
        state = online_softmax_merge(*state, top, weights.sum(-1), weights @ value_block)  # noqa: F821
    _, total, out = state
    return torch.where(total[..., None] > 0, out / total[..., None], 0.0)


def tiled_attention__normalised_running_output(query, key, value, block_size, mask=None):
    # FlashAttention's algorithm 1: the running output kept normalised, rescaled by l_old / l_new
    if block_size <= 0:
        raise ValueError("block_size <= 0")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ValueError(f"shapes {query.shape}, {key.shape}, {value.shape} do not fit")
    if mask is not None and (not torch.is_tensor(mask) or mask.dtype != torch.bool):
        raise TypeError("mask must be a boolean tensor")
    if mask is not None:
        mask = mask.expand(*mask.shape[:-1], key.shape[-2])
    scale = 1 / math.sqrt(query.size(-1))
    m = torch.full(query.shape[:-1], -math.inf, dtype=query.dtype, device=query.device)
    l = torch.zeros_like(m)  # the paper's names: m, l, o
    o = torch.zeros(*query.shape[:-1], value.size(-1), dtype=query.dtype, device=query.device)
    for start in range(0, key.size(-2), block_size):
        s = query @ key[..., start : start + block_size, :].mT * scale
        if mask is not None:
            s = s.masked_fill(~mask[..., start : start + block_size], -math.inf)
        m_new = torch.maximum(m, s.amax(-1))
        shift = torch.where(m_new == -math.inf, 0.0, m_new)
        p = torch.exp(s - shift[..., None])
        l_new = torch.exp(m - shift) * l + p.sum(-1)
        safe = torch.where(l_new > 0, l_new, 1.0)
        o = (
            (torch.exp(m - shift) * l)[..., None] * o + p @ value[..., start : start + block_size, :]
        ) / safe[..., None]
        m, l = m_new, l_new
    return o


def tiled_attention__float64_inside(query, key, value, block_size, mask=None):
    if block_size < 1 or query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("block_size must be positive, query and key of one d_k, key and value of one k_len")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("boolean mask expected")
    if mask is not None and mask.size(-1) == 1:
        mask = mask.expand(*mask.shape[:-1], key.size(-2))
    q, k, v = query.double(), key.double(), value.double()
    q = q / math.sqrt(q.size(-1))
    m = torch.full(q.shape[:-1], -math.inf, dtype=torch.float64, device=q.device)
    total = torch.zeros_like(m)
    out = torch.zeros(*q.shape[:-1], v.size(-1), dtype=torch.float64, device=q.device)
    for start in range(0, k.size(-2), block_size):
        stop = min(start + block_size, k.size(-2))
        scores = q @ k[..., start:stop, :].transpose(-1, -2)
        if mask is not None:
            scores = scores.masked_fill(~mask[..., start:stop], -math.inf)
        new = torch.maximum(m, scores.max(dim=-1).values)
        shift = torch.nan_to_num(new, neginf=0.0)
        factor = torch.exp(m - shift)
        weights = torch.exp(scores - shift[..., None])
        total = total * factor + weights.sum(-1)
        out = out * factor[..., None] + weights @ v[..., start:stop, :]
        m = new
    total = total.masked_fill(total == 0, 1.0)
    return (out / total[..., None]).to(query.dtype)


def tiled_attention__query_and_key_blocks(query, key, value, block_size, mask=None):
    # two-dimensional tiling: blocks of queries too, each with its own running state
    q_len, d_k = query.size(-2), query.size(-1)
    if block_size < 1:
        raise ValueError("no block of fewer than 1 key")
    if key.size(-1) != d_k or value.size(-2) != key.size(-2):
        raise ValueError("the shapes of query, key and value do not fit")
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError("mask must be torch.bool")
        mask = mask.expand(*mask.shape[:-2], 1 if mask.dim() < 2 else mask.size(-2), key.size(-2))
    outputs = []
    for q_start in range(0, q_len, block_size):
        q_block = query[..., q_start : q_start + block_size, :]
        m = torch.full(q_block.shape[:-1], -math.inf, dtype=query.dtype, device=query.device)
        total = torch.zeros_like(m)
        out = torch.zeros(*q_block.shape[:-1], value.size(-1), dtype=query.dtype, device=query.device)
        for k_start in range(0, key.size(-2), block_size):
            k_block = key[..., k_start : k_start + block_size, :]
            scores = q_block @ k_block.transpose(-2, -1) / math.sqrt(d_k)
            if mask is not None:
                rows = mask[..., q_start : q_start + block_size, :] if mask.size(-2) > 1 else mask
                scores = scores.masked_fill(~rows[..., k_start : k_start + block_size], -math.inf)
            new = torch.maximum(m, scores.amax(-1))
            shift = new.masked_fill(new == -math.inf, 0)
            weights = (scores - shift[..., None]).exp()
            total = total * (m - shift).exp() + weights.sum(-1)
            out = out * (m - shift).exp()[..., None] + weights @ value[..., k_start : k_start + block_size, :]
            m = new
        outputs.append(out / total.clamp_min(torch.finfo(total.dtype).tiny)[..., None])
    return torch.cat(outputs, dim=-2)


def tiled_attention__running_logsumexp(query, key, value, block_size, mask=None):
    # the state as one log-sum-exp per query, the output kept normalised: exp(scores - lse) @ value
    if block_size < 1:
        raise ValueError("block_size < 1")
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("mismatched query, key and value")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask is not boolean")
    k_len = key.size(-2)
    if mask is not None:
        mask = mask.expand(*mask.shape[:-1], k_len)
    lse = torch.full(query.shape[:-1], -math.inf, dtype=query.dtype, device=query.device)
    out = torch.zeros(*query.shape[:-1], value.size(-1), dtype=query.dtype, device=query.device)
    for start in range(0, k_len, block_size):
        scores = query @ key[..., start : start + block_size, :].transpose(-2, -1) / math.sqrt(query.size(-1))
        if mask is not None:
            scores = scores.masked_fill(~mask[..., start : start + block_size], -math.inf)
        new_lse = torch.logaddexp(lse, torch.logsumexp(scores, dim=-1))  # -inf while no key is allowed
        shift = torch.where(new_lse == -math.inf, 0.0, new_lse)
        weights = torch.exp(scores - shift[..., None])
        out = out * torch.exp(lse - shift)[..., None] + weights @ value[..., start : start + block_size, :]
        lse = new_lse
    return out


RIGHT = [
    online_softmax_merge__where_branches,
    online_softmax_merge__stacked,
    tiled_attention__merge_helper,
    tiled_attention__normalised_running_output,
    tiled_attention__float64_inside,
    tiled_attention__query_and_key_blocks,
    tiled_attention__running_logsumexp,
]
