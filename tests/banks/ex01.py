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
    if bandwidth <= 0:
        raise ValueError("the bandwidth must be positive")
    if queries.dim() == 1:
        queries, keys = queries[:, None], keys[:, None]
    if queries.shape[1:] != keys.shape[1:]:
        raise ValueError("queries and keys must have the same number of features")
    squared = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
    return torch.softmax(-squared / (2 * bandwidth**2), dim=-1)
""",
    "nadaraya_watson": """def nadaraya_watson(queries, keys, values, bandwidth=1.0):
    if bandwidth <= 0:
        raise ValueError("the bandwidth must be positive")
    if keys.size(0) != values.size(0):
        raise ValueError("keys and values must have the same number of rows")
    q = queries[:, None] if queries.dim() == 1 else queries
    k = keys[:, None] if keys.dim() == 1 else keys
    if q.size(-1) != k.size(-1):
        raise ValueError("queries and keys must have the same number of features")
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
BANDWIDTH_CHECKED = '    if bandwidth <= 0:\n        raise ValueError("the bandwidth must be positive")\n'
FEATURES_CHECKED = (
    "    if queries.shape[1:] != keys.shape[1:]:\n"
    '        raise ValueError("queries and keys must have the same number of features")\n'
)
N_CHECKED = (
    "    if keys.size(0) != values.size(0):\n"
    '        raise ValueError("keys and values must have the same number of rows")\n'
)


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
        "float64_inside",  # computed in float64 for precision, never cast back
        SCALAR_FEATURES,
        "    queries, keys = queries.double(), keys.double()\n" + SCALAR_FEATURES,
        {"kernel_weights_rows_sum_to_one": "has dtype torch.float64, expected torch.float32"},
    ),
    Row(
        "gaussian_kernel_weights",
        "features_not_checked",  # broadcasting raises RuntimeError (or nothing, when one side has d = 1)
        FEATURES_CHECKED,
        "",
        {"kernel_weights_rows_sum_to_one": "should raise ValueError if queries and keys differ"},
    ),
    Row(
        "gaussian_kernel_weights",
        "bandwidth_not_checked",
        BANDWIDTH_CHECKED,
        "",
        {"kernel_weights_bandwidth": "should raise ValueError if the bandwidth is not positive"},
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
    Row(
        "nadaraya_watson",
        "no_max_shift",  # exact for ordinary queries; 0 / 0 for a query far from every key
        "    weights = torch.softmax(-squared / (2 * bandwidth**2), dim=-1)",
        "    kernel = torch.exp(-squared / (2 * bandwidth**2))\n"
        "    weights = kernel / kernel.sum(dim=-1, keepdim=True)",
        {"nadaraya_watson_bandwidth": "subtract the largest score of each row"},
    ),
    Row(
        "nadaraya_watson",
        "squeezed_prediction",  # values [n] made [n, 1], then every axis of size 1 squeezed away
        "return weights @ values",
        "return (weights @ values.reshape(values.size(0), -1)).squeeze()",
        {
            "nadaraya_watson_table": "an axis of size 1 is gone",
            "nadaraya_watson_shapes": "an axis of size 1 is gone",
        },
    ),
    Row(
        "nadaraya_watson",
        "n_not_checked",  # the product raises RuntimeError
        N_CHECKED,
        "",
        {"nadaraya_watson_shapes": "should raise ValueError if keys and values differ"},
    ),
    Row(
        "nadaraya_watson",
        "bandwidth_not_checked",
        BANDWIDTH_CHECKED,
        "",
        {"nadaraya_watson_bandwidth": "should raise ValueError if the bandwidth is not positive"},
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
    Row(
        "cross_attention",
        "checks_with_value_error",  # the docstring says RuntimeError, which the products raise themselves
        "    query, key, value = x_q @ w_q",
        "    if x_q.size(-1) != w_q.size(0) or x_kv.size(-1) != w_k.size(0):\n"
        '        raise ValueError("the feature sizes do not match")\n'
        "    query, key, value = x_q @ w_q",
        {"cross_attention_shapes": "raised ValueError"},
    ),
    Row(
        "cross_attention",
        "exp_without_max",
        "    weights = torch.softmax(scores, dim=-1)",
        "    weights = scores.exp()\n    weights = weights / weights.sum(dim=-1, keepdim=True)",
        cross("subtract the maximum of each row"),
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
        "asserts_feature_sizes",
        "    query, key, value = x @ w_q",
        "    assert x.size(-1) == w_q.size(0) == w_k.size(0) == w_v.size(0)\n    query, key, value = x @ w_q",
        {"self_attention_matches_formula": "raised AssertionError"},
    ),
    Row(
        "self_attention",
        "exp_without_max",
        "    weights = torch.softmax(scores, dim=-1)",
        "    weights = scores.exp()\n    weights = weights / weights.sum(dim=-1, keepdim=True)",
        {"self_attention_matches_formula": "subtract the maximum of each row"},
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


def cross_attention__half_returned_as_float16(x_q, x_kv, w_q, w_k, w_v):
    half = x_q.dtype in (torch.float16, torch.bfloat16)
    if half:  # compute in float32, round once at the end
        x_q, x_kv, w_q, w_k, w_v = (t.float() for t in (x_q, x_kv, w_q, w_k, w_v))
    query, key, value = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.size(-1)), dim=-1)
    output = weights @ value
    return (output.half(), weights.half()) if half else (output, weights)


def self_attention__half_returned_as_float16(x, w_q, w_k, w_v):
    half = x.dtype in (torch.float16, torch.bfloat16)
    if half:
        x, w_q, w_k, w_v = x.float(), w_q.float(), w_k.float(), w_v.float()
    query, key, value = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(query @ key.mT / math.sqrt(query.size(-1)), dim=-1)
    output = weights @ value
    return (output.half(), weights.half()) if half else (output, weights)


WHOLE = {
    # scalars are right; vectors keep their feature axis, [m, n, d]
    gaussian_kernel_weights__no_feature_sum: every(
        ("kernel_weights_rows_sum_to_one", "kernel_weights_bandwidth", "kernel_weights_far_query"),
        "not summed over the feature axis",
    ),
    cross_attention__einsum_one_batch_axis: cross("use an ellipsis", CROSS),
    cross_attention__half_returned_as_float16: {
        "cross_attention_shapes": "has dtype torch.float16, expected torch.bfloat16"
    },
    self_attention__half_returned_as_float16: {
        "self_attention_matches_formula": "has dtype torch.float16, expected torch.bfloat16"
    },
}


# ----------------------------------------------------------------------------------------------------
# correct implementations in other styles


def gaussian_kernel_weights__cdist(queries, keys, bandwidth=1.0):
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    if queries.dim() == 1:
        queries, keys = queries.unsqueeze(-1), keys.unsqueeze(-1)
    if queries.size(-1) != keys.size(-1) or keys.dim() != 2:
        raise ValueError("queries and keys differ in their number of features")
    squared = torch.cdist(queries, keys) ** 2
    return torch.softmax(-squared / (2 * bandwidth**2), dim=-1)


def gaussian_kernel_weights__expanded_manual_softmax(queries, keys, bandwidth=1.0):
    q = queries.reshape(queries.size(0), -1)
    k = keys.reshape(keys.size(0), -1)
    if bandwidth <= 0 or q.size(1) != k.size(1):
        raise ValueError("need bandwidth > 0 and queries and keys of the same d")
    # ||q - k||^2 = ||q||^2 - 2 q.k + ||k||^2
    squared = (q * q).sum(-1, keepdim=True) - 2 * q @ k.T + (k * k).sum(-1)
    scores = -squared / (2 * bandwidth * bandwidth)
    exp = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
    return exp / exp.sum(dim=-1, keepdim=True)


def gaussian_kernel_weights__float64_logsumexp(queries, keys, bandwidth=1.0):
    if bandwidth <= 0:
        raise ValueError("bandwidth must be positive")
    q = queries.double().reshape(len(queries), -1)  # [m, d], d = 1 for scalars
    k = keys.double().reshape(len(keys), -1)  # [n, d]
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"d differs: {q.shape[1]} and {k.shape[1]}")
    scores = -torch.einsum("mnd,mnd->mn", q[:, None] - k[None], q[:, None] - k[None]) / (2 * bandwidth**2)
    return torch.exp(scores - torch.logsumexp(scores, dim=1, keepdim=True)).to(queries.dtype)


def nadaraya_watson__ratio_of_sums(queries, keys, values, bandwidth=1.0):
    q = queries[:, None] if queries.dim() == 1 else queries
    k = keys[:, None] if keys.dim() == 1 else keys
    if bandwidth <= 0 or q.size(-1) != k.size(-1) or len(keys) != len(values):
        raise ValueError("bandwidth <= 0, or queries, keys and values do not fit")
    scores = -((q[:, None, :] - k[None, :, :]) ** 2).sum(-1) / (2 * bandwidth**2)
    kernel = torch.exp(scores - scores.amax(dim=1, keepdim=True))  # [m, n]
    denominator = kernel.sum(dim=1)  # [m]
    if values.dim() == 2:
        denominator = denominator[:, None]
    return torch.matmul(kernel, values) / denominator


def nadaraya_watson__einsum(queries, keys, values, bandwidth=1.0):
    q = queries.reshape(len(queries), -1)
    k = keys.reshape(len(keys), -1)
    if bandwidth <= 0:
        raise ValueError("bandwidth must be positive")
    if q.shape[-1] != k.shape[-1] or k.shape[0] != values.shape[0]:
        raise ValueError("queries and keys differ in d, or keys and values in n")
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


def nadaraya_watson__calls_kernel_weights(queries, keys, values, bandwidth=1.0):
    if keys.shape[0] != values.shape[0]:
        raise ValueError("keys and values differ in n")
    # the notebook's gaussian_kernel_weights (the cell above), with its own ValueErrors
    return gaussian_kernel_weights(queries, keys, bandwidth) @ values  # noqa: F821


def self_attention__calls_cross_attention(x, w_q, w_k, w_v):
    return cross_attention(x, x, w_q, w_k, w_v)  # noqa: F821 (the notebook's, the cell above)


RIGHT = [
    gaussian_kernel_weights__cdist,
    gaussian_kernel_weights__expanded_manual_softmax,
    gaussian_kernel_weights__float64_logsumexp,
    nadaraya_watson__ratio_of_sums,
    nadaraya_watson__einsum,
    nadaraya_watson__calls_kernel_weights,
    cross_attention__einsum_manual_softmax,
    cross_attention__float32_inside,
    self_attention__einsum,
    self_attention__scaled_query,
    self_attention__calls_cross_attention,
]
