"""Implementations of exercise ex01 that a learner could plausibly write: wrong ones and right ones.

Every implementation is self-contained (``torch`` and ``math`` only), so that its source is also a
submission's solution cell. ``ROWS`` are one-line mistakes applied to ``BASES``; ``WHOLE`` holds mistakes
of another structure; ``RIGHT`` correct implementations in other styles, which every cell must accept.
Expectations name *exactly* the test cells that reject an implementation (see ``_bank.py``).
"""

import math

import torch

from tests.banks._bank import Row

BASES = {
    "gaussian_kernel_weights": """def gaussian_kernel_weights(queries, keys, bandwidth=1.0):
    if queries.dim() == 1:
        queries, keys = queries[:, None], keys[:, None]
    squared = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
    return torch.softmax(-squared / (2 * bandwidth**2), dim=-1)
""",
    "nadaraya_watson": """def nadaraya_watson(queries, keys, values, bandwidth=1.0):
    q = queries[:, None] if queries.dim() == 1 else queries
    k = keys[:, None] if keys.dim() == 1 else keys
    squared = ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1)
    weights = torch.softmax(-squared / (2 * bandwidth**2), dim=-1)
    return weights @ values
""",
    "cross_attention": """def cross_attention(x_q, x_kv, w_q, w_k, w_v):
    query, key, value = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights
""",
    "self_attention": """def self_attention(x, w_q, w_k, w_v):
    query, key, value = x @ w_q, x @ w_k, x @ w_v
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights
""",
}

MUST_BE_CORRECT = "must be correct before it counts as written from scratch"
KERNEL_ALL = (
    "kernel_weights_rows_sum_to_one",
    "kernel_weights_table",
    "kernel_weights_bandwidth",
    "kernel_weights_far_query",
)
# the cells that compare weights: at h = 1 (the table, far queries) and at other h. A far query's right
# weights are one-hot on its nearest key, so a mistake that keeps them there (no 1/2) passes that cell
KERNEL_VALUES = KERNEL_ALL[1:]
REGRESSION = ("nadaraya_watson_table", "nadaraya_watson_shapes", "nadaraya_watson_bandwidth")
CROSS = ("cross_attention_shapes", "cross_attention_matches_formula", "cross_attention_source_permutation")
SELF = ("self_attention_matches_formula", "self_attention_permutation_equivariance")
SCALAR_FEATURES = "    if queries.dim() == 1:\n        queries, keys = queries[:, None], keys[:, None]\n"


def every(cells, fragment):
    return dict.fromkeys(cells, fragment)


def cross(fragment, cells=CROSS[1:2]):
    """Cross-attention cells that reject a mistake; from scratch requires it to be correct first."""
    return every(cells, fragment) | {"cross_attention_from_scratch": MUST_BE_CORRECT}


def self_(fragment, cells=SELF[:1]):
    return every(cells, fragment) | {"self_attention_from_scratch": MUST_BE_CORRECT}


ROWS = [
    # gaussian_kernel_weights
    Row(
        "gaussian_kernel_weights",
        "no_max_shift",
        "    return torch.softmax(-squared / (2 * bandwidth**2), dim=-1)",
        "    kernel = torch.exp(-squared / (2 * bandwidth**2))\n"
        "    return kernel / kernel.sum(dim=-1, keepdim=True)",
        {"kernel_weights_far_query": "underflows to 0 for every key"},
    ),
    Row(
        "gaussian_kernel_weights",
        "positive_exponent",
        "-squared / (2",
        "squared / (2",
        every(KERNEL_VALUES, "the exponent has the wrong sign"),
    ),
    Row(
        "gaussian_kernel_weights",
        "missing_half",
        "(2 * bandwidth**2)",
        "bandwidth**2",
        every(KERNEL_VALUES[:2], "the 1/2 of the Gaussian kernel"),
    ),
    Row(
        "gaussian_kernel_weights",
        "bandwidth_not_squared",
        "(2 * bandwidth**2)",
        "(2 * bandwidth)",
        {"kernel_weights_bandwidth": "the bandwidth is not squared"},
    ),
    # the defect of the issue: at h = 1 the precedence does not matter, so only the cell of other
    # bandwidths rejects it, visible part and hidden part alike
    Row(
        "gaussian_kernel_weights",
        "precedence",
        "-squared / (2 * bandwidth**2)",
        "-squared / 2 * bandwidth**2",
        {"kernel_weights_bandwidth": "multiplied by h^2 instead of divided"},
    ),
    Row(
        "gaussian_kernel_weights",
        "distance_not_squared",
        "squared = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)\n"
        "    return torch.softmax(-squared",
        "distance = torch.cdist(queries, keys)\n    return torch.softmax(-distance",
        every(KERNEL_VALUES, "the distance is not squared"),
    ),
    Row(
        "gaussian_kernel_weights",
        "softmax_over_queries",
        "dim=-1",
        "dim=0",
        every(KERNEL_ALL, "the softmax runs over the queries (dim=0)"),
    ),
    Row(
        "gaussian_kernel_weights",
        "vectors_only",
        SCALAR_FEATURES,
        "",
        every(KERNEL_ALL, "give them a feature axis"),
    ),
    Row(
        "gaussian_kernel_weights",
        "unsqueeze_in_place",
        SCALAR_FEATURES,
        "    if queries.dim() == 1:\n        queries.unsqueeze_(-1)\n        keys.unsqueeze_(-1)\n",
        {"kernel_weights_rows_sum_to_one": "modified its argument `queries` in place"},
    ),
    Row(
        "gaussian_kernel_weights",
        "casts_to_float32",
        SCALAR_FEATURES,
        "    queries, keys = queries.float(), keys.float()\n" + SCALAR_FEATURES,
        # dtypes are judged by the cell that names them; elsewhere float32 values pass at float32 tolerance
        {"kernel_weights_rows_sum_to_one": "has dtype torch.float32, expected torch.float64"},
    ),
    Row(
        "gaussian_kernel_weights",
        "transposed",
        "(queries[:, None, :] - keys[None, :, :])",
        "(keys[:, None, :] - queries[None, :, :])",
        every(KERNEL_ALL, "one row per query"),
    ),
    # nadaraya_watson
    Row(
        "nadaraya_watson",
        "elementwise_product",
        "return weights @ values",
        "return (weights * values).sum(-1)",
        every(REGRESSION[1:], "the prediction is weights @ values"),
    ),
    Row(
        "nadaraya_watson",
        "values_times_weights",
        "weights @ values",
        "values @ weights",
        every(REGRESSION, "the prediction is weights @ values"),
    ),
    Row(
        "nadaraya_watson",
        "unnormalised_kernel",
        "torch.softmax(-squared / (2 * bandwidth**2), dim=-1)",
        "torch.exp(-squared / (2 * bandwidth**2))",
        every(REGRESSION[::2], "are not normalised"),
    ),
    Row(
        "nadaraya_watson",
        "ignores_bandwidth",
        "(2 * bandwidth**2)",
        "2",
        {"nadaraya_watson_bandwidth": "the bandwidth is not passed on"},
    ),
    Row(
        "nadaraya_watson",
        "distance_weights",
        "squared = ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1)\n"
        "    weights = torch.softmax(-squared / (2 * bandwidth**2), dim=-1)",
        "distance = ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1).sqrt()\n"
        "    weights = distance / distance.sum(dim=-1, keepdim=True)",
        every(REGRESSION[::2], "the farthest key weighs most"),
    ),
    Row(
        "nadaraya_watson",
        "inverse_distance",
        "squared = ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1)\n"
        "    weights = torch.softmax(-squared / (2 * bandwidth**2), dim=-1)",
        "inverse = 1 / ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1).sqrt()\n"
        "    weights = inverse / inverse.sum(dim=-1, keepdim=True)",
        every(REGRESSION[::2], "inverse-distance weights"),
    ),
    Row(
        "nadaraya_watson",
        "keeps_value_axis",
        "return weights @ values",
        "return weights @ values.reshape(values.size(0), -1)",
        every(REGRESSION, "for values [n] the prediction is [m]"),
    ),
    # cross_attention
    Row(
        "cross_attention",
        "roles_swapped",
        "x_q @ w_q, x_kv @ w_k, x_kv @ w_v",
        "x_kv @ w_q, x_q @ w_k, x_q @ w_v",
        cross("the queries come from x_q", CROSS),
    ),
    Row(
        "cross_attention", "no_scale", " / math.sqrt(query.size(-1))", "", cross("the scores are not scaled")
    ),
    Row("cross_attention", "scale_by_d_model", "query.size(-1)", "x_q.size(-1)", cross("sqrt(d_model)")),
    Row("cross_attention", "scale_by_d_v", "query.size(-1)", "value.size(-1)", cross("sqrt(d_v)")),
    Row(
        "cross_attention",
        "swapped_projections",
        "x_q @ w_q, x_kv @ w_k",
        "x_q @ w_k, x_kv @ w_q",
        cross("w_q and w_k are swapped"),
    ),
    Row("cross_attention", "softmax_over_queries", "dim=-1", "dim=-2", cross("over the query axis")),
    Row(
        "cross_attention",
        "key_transpose_0_1",
        "key.transpose(-2, -1)",
        "key.transpose(0, 1)",
        cross("key.transpose(-2, -1)", CROSS) | {"cross_attention_shapes": "It works for inputs without"},
    ),
    Row(
        "cross_attention",
        "linear_convention",
        "query, key, value = x_q @ w_q, x_kv @ w_k, x_kv @ w_v",
        "F = torch.nn.functional\n    query, key, value = F.linear(x_q, w_q), F.linear(x_kv, w_k), "
        "F.linear(x_kv, w_v)",
        cross("not x @ w.T nor F.linear(x, w)", CROSS),
    ),
    Row(
        "cross_attention",
        "causal_mask",
        "    weights = torch.softmax(scores, dim=-1)",
        "    causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()\n"
        '    weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)',
        cross("a causal mask is applied")
        | {"cross_attention_source_permutation": "depends on the order of the source positions"},
    ),
    Row(
        "cross_attention",
        "builtin_output",
        "return weights @ value, weights",
        "return torch.nn.functional.scaled_dot_product_attention(query, key, value), weights",
        {"cross_attention_from_scratch": "scaled_dot_product_attention"},
    ),
    # self_attention
    Row(
        "self_attention",
        "causal_mask",
        "    weights = torch.softmax(scores, dim=-1)",
        "    n = x.size(-2)\n"
        "    causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=x.device))\n"
        '    weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)',
        self_("a causal mask is applied")
        | {"self_attention_permutation_equivariance": "depends on the order of the positions"},
    ),
    Row(
        "self_attention",
        "swapped_projections",
        "x @ w_q, x @ w_k",
        "x @ w_k, x @ w_q",
        self_("w_q and w_k are swapped"),
    ),
    Row(
        "self_attention",
        "scale_by_d_k",
        "math.sqrt(query.size(-1))",
        "query.size(-1)",
        self_("divided by d_k"),
    ),
    Row(
        "self_attention", "key_dot_T", "key.transpose(-2, -1)", "key.T", self_("key.transpose(-2, -1)", SELF)
    ),
    Row(
        "self_attention",
        "returns_weights_first",
        "return weights @ value, weights",
        "return weights, weights @ value",
        self_("return (output, weights)", SELF),
    ),
    Row(
        "self_attention",
        "builtin_output",
        "return weights @ value, weights",
        "return torch.nn.functional.scaled_dot_product_attention(query, key, value), weights",
        {"self_attention_from_scratch": "scaled_dot_product_attention"},
    ),
]


# ----------------------------------------------------------------------------------------------------
# mistakes of another structure


def gaussian_kernel_weights__no_feature_sum(queries, keys, bandwidth=1.0):
    squared = (queries[:, None] - keys[None, :]) ** 2
    return torch.softmax(-squared / (2 * bandwidth**2), dim=1)


def cross_attention__einsum_one_batch_axis(x_q, x_kv, w_q, w_k, w_v):
    query, key, value = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
    scores = torch.einsum("bmd,bnd->bmn", query, key) / math.sqrt(query.size(-1))
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("bmn,bnv->bmv", weights, value), weights


WHOLE = {
    # scalars are right; vectors keep their feature axis, [m, n, d]
    gaussian_kernel_weights__no_feature_sum: every(
        ("kernel_weights_rows_sum_to_one", "kernel_weights_bandwidth", "kernel_weights_far_query"),
        "not summed over the feature axis",
    ),
    cross_attention__einsum_one_batch_axis: cross("use an ellipsis", CROSS),
}


# ----------------------------------------------------------------------------------------------------
# correct implementations in other styles


def gaussian_kernel_weights__cdist(queries, keys, bandwidth=1.0):
    if queries.dim() == 1:
        queries, keys = queries.unsqueeze(-1), keys.unsqueeze(-1)
    squared = torch.cdist(queries, keys) ** 2
    return torch.softmax(-squared / (2 * bandwidth**2), dim=-1)


def gaussian_kernel_weights__expanded_manual_softmax(queries, keys, bandwidth=1.0):
    q = queries.reshape(queries.size(0), -1)
    k = keys.reshape(keys.size(0), -1)
    # ||q - k||^2 = ||q||^2 - 2 q.k + ||k||^2
    squared = (q * q).sum(-1, keepdim=True) - 2 * q @ k.T + (k * k).sum(-1)
    scores = -squared / (2 * bandwidth * bandwidth)
    exp = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
    return exp / exp.sum(dim=-1, keepdim=True)


def gaussian_kernel_weights__float64_logsumexp(queries, keys, bandwidth=1.0):
    q = queries.double().reshape(len(queries), -1)  # [m, d], d = 1 for scalars
    k = keys.double().reshape(len(keys), -1)  # [n, d]
    scores = -torch.einsum("mnd,mnd->mn", q[:, None] - k[None], q[:, None] - k[None]) / (2 * bandwidth**2)
    return torch.exp(scores - torch.logsumexp(scores, dim=1, keepdim=True)).to(queries.dtype)


def nadaraya_watson__ratio_of_sums(queries, keys, values, bandwidth=1.0):
    q = queries[:, None] if queries.dim() == 1 else queries
    k = keys[:, None] if keys.dim() == 1 else keys
    scores = -((q[:, None, :] - k[None, :, :]) ** 2).sum(-1) / (2 * bandwidth**2)
    kernel = torch.exp(scores - scores.amax(dim=1, keepdim=True))  # [m, n]
    denominator = kernel.sum(dim=1)  # [m]
    if values.dim() == 2:
        denominator = denominator[:, None]
    return torch.matmul(kernel, values) / denominator


def nadaraya_watson__einsum(queries, keys, values, bandwidth=1.0):
    q = queries.reshape(len(queries), -1)
    k = keys.reshape(len(keys), -1)
    weights = torch.softmax(-torch.cdist(q, k).square() / (2 * bandwidth**2), dim=-1)
    return torch.einsum("mn,n...->m...", weights, values)


def cross_attention__einsum_manual_softmax(x_q, x_kv, w_q, w_k, w_v):
    query = torch.einsum("...md,dk->...mk", x_q, w_q)
    key = torch.einsum("...nd,dk->...nk", x_kv, w_k)
    value = torch.einsum("...nd,dv->...nv", x_kv, w_v)
    scores = torch.einsum("...mk,...nk->...mn", query, key) * w_q.shape[1] ** -0.5
    exp = (scores - scores.amax(dim=-1, keepdim=True)).exp()
    weights = exp / exp.sum(dim=-1, keepdim=True)
    return torch.einsum("...mn,...nv->...mv", weights, value), weights


def cross_attention__float32_inside(x_q, x_kv, w_q, w_k, w_v):
    wide = torch.promote_types(x_q.dtype, torch.float32)  # half types are computed in float32
    query = torch.matmul(x_q.to(wide), w_q.to(wide)) / math.sqrt(w_q.shape[-1])
    key = torch.matmul(x_kv.to(wide), w_k.to(wide))
    value = torch.matmul(x_kv.to(wide), w_v.to(wide))
    weights = torch.softmax(torch.matmul(query, key.mT), dim=-1)
    return torch.matmul(weights, value).to(x_q.dtype), weights.to(x_q.dtype)


def self_attention__einsum(x, w_q, w_k, w_v):
    query, key, value = (torch.einsum("...nd,de->...ne", x, w) for w in (w_q, w_k, w_v))
    scores = torch.einsum("...id,...jd->...ij", query, key) / math.sqrt(key.shape[-1])
    weights = scores.softmax(dim=-1)
    return torch.einsum("...ij,...jv->...iv", weights, value), weights


def self_attention__scaled_query(x, w_q, w_k, w_v):
    query = x @ (w_q / math.sqrt(w_q.size(-1)))
    key, value = x @ w_k, x @ w_v
    weights = torch.nn.functional.softmax(query @ key.mT, dim=-1)
    return weights @ value, weights


RIGHT = [
    gaussian_kernel_weights__cdist,
    gaussian_kernel_weights__expanded_manual_softmax,
    gaussian_kernel_weights__float64_logsumexp,
    nadaraya_watson__ratio_of_sums,
    nadaraya_watson__einsum,
    cross_attention__einsum_manual_softmax,
    cross_attention__float32_inside,
    self_attention__einsum,
    self_attention__scaled_query,
]
