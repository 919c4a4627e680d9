"""Implementations of exercise ex01 that a learner could plausibly write: wrong ones and right ones.

Each function is self-contained (it uses only ``torch`` and ``math``), so that its source can also be
pasted into a notebook as a submission. The name is ``<function>__<variant>``; the part before ``__``
is the function of the exercise it stands for.

``WRONG`` maps each wrong implementation to the test cells (by nbgrader grade id) that must reject it,
with a fragment of the message each must give. ``RIGHT`` lists correct implementations in other styles
that every test cell must accept.
"""

import math

import torch

# ----------------------------------------------------------------------------------------------------
# gaussian_kernel_weights


def gaussian_kernel_weights__no_max_shift(queries, keys, bandwidth=1.0):
    if queries.dim() == 1:
        queries, keys = queries[:, None], keys[:, None]
    squared = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
    kernel = torch.exp(-squared / (2 * bandwidth**2))
    return kernel / kernel.sum(dim=-1, keepdim=True)


def gaussian_kernel_weights__positive_exponent(queries, keys, bandwidth=1.0):
    if queries.dim() == 1:
        queries, keys = queries[:, None], keys[:, None]
    squared = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
    return torch.softmax(squared / (2 * bandwidth**2), dim=-1)


def gaussian_kernel_weights__missing_half(queries, keys, bandwidth=1.0):
    if queries.dim() == 1:
        queries, keys = queries[:, None], keys[:, None]
    squared = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
    return torch.softmax(-squared / bandwidth**2, dim=-1)


def gaussian_kernel_weights__bandwidth_not_squared(queries, keys, bandwidth=1.0):
    if queries.dim() == 1:
        queries, keys = queries[:, None], keys[:, None]
    squared = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
    return torch.softmax(-squared / (2 * bandwidth), dim=-1)


def gaussian_kernel_weights__precedence(queries, keys, bandwidth=1.0):
    if queries.dim() == 1:
        queries, keys = queries[:, None], keys[:, None]
    squared = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
    return torch.softmax(-squared / 2 * bandwidth**2, dim=-1)


def gaussian_kernel_weights__distance_not_squared(queries, keys, bandwidth=1.0):
    if queries.dim() == 1:
        queries, keys = queries[:, None], keys[:, None]
    distance = torch.cdist(queries, keys)
    return torch.softmax(-distance / (2 * bandwidth**2), dim=-1)


def gaussian_kernel_weights__softmax_over_queries(queries, keys, bandwidth=1.0):
    if queries.dim() == 1:
        queries, keys = queries[:, None], keys[:, None]
    squared = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
    return torch.softmax(-squared / (2 * bandwidth**2), dim=0)


def gaussian_kernel_weights__no_feature_sum(queries, keys, bandwidth=1.0):
    squared = (queries[:, None] - keys[None, :]) ** 2
    return torch.softmax(-squared / (2 * bandwidth**2), dim=1)


def gaussian_kernel_weights__vectors_only(queries, keys, bandwidth=1.0):
    squared = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
    return torch.softmax(-squared / (2 * bandwidth**2), dim=-1)


def gaussian_kernel_weights__unsqueeze_in_place(queries, keys, bandwidth=1.0):
    if queries.dim() == 1:
        queries.unsqueeze_(-1)
        keys.unsqueeze_(-1)
    squared = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
    return torch.softmax(-squared / (2 * bandwidth**2), dim=-1)


def gaussian_kernel_weights__casts_to_float32(queries, keys, bandwidth=1.0):
    queries, keys = queries.float(), keys.float()
    if queries.dim() == 1:
        queries, keys = queries[:, None], keys[:, None]
    squared = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
    return torch.softmax(-squared / (2 * bandwidth**2), dim=-1)


def gaussian_kernel_weights__transposed(queries, keys, bandwidth=1.0):
    if queries.dim() == 1:
        queries, keys = queries[:, None], keys[:, None]
    squared = ((keys[:, None, :] - queries[None, :, :]) ** 2).sum(-1)
    return torch.softmax(-squared / (2 * bandwidth**2), dim=-1)


# ----------------------------------------------------------------------------------------------------
# nadaraya_watson (self-contained: each computes its own kernel weights)


def nadaraya_watson__elementwise_product(queries, keys, values, bandwidth=1.0):
    q = queries[:, None] if queries.dim() == 1 else queries
    k = keys[:, None] if keys.dim() == 1 else keys
    squared = ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1)
    weights = torch.softmax(-squared / (2 * bandwidth**2), dim=-1)
    return (weights * values).sum(-1)


def nadaraya_watson__unnormalised_kernel(queries, keys, values, bandwidth=1.0):
    q = queries[:, None] if queries.dim() == 1 else queries
    k = keys[:, None] if keys.dim() == 1 else keys
    squared = ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1)
    return torch.exp(-squared / (2 * bandwidth**2)) @ values


def nadaraya_watson__ignores_bandwidth(queries, keys, values, bandwidth=1.0):
    q = queries[:, None] if queries.dim() == 1 else queries
    k = keys[:, None] if keys.dim() == 1 else keys
    squared = ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1)
    return torch.softmax(-squared / 2, dim=-1) @ values


def nadaraya_watson__distance_weights(queries, keys, values, bandwidth=1.0):
    q = queries[:, None] if queries.dim() == 1 else queries
    k = keys[:, None] if keys.dim() == 1 else keys
    distance = ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1).sqrt()
    return distance / distance.sum(dim=-1, keepdim=True) @ values


def nadaraya_watson__inverse_distance(queries, keys, values, bandwidth=1.0):
    q = queries[:, None] if queries.dim() == 1 else queries
    k = keys[:, None] if keys.dim() == 1 else keys
    inverse = 1 / ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1).sqrt()
    return inverse / inverse.sum(dim=-1, keepdim=True) @ values


def nadaraya_watson__keeps_value_axis(queries, keys, values, bandwidth=1.0):
    q = queries[:, None] if queries.dim() == 1 else queries
    k = keys[:, None] if keys.dim() == 1 else keys
    v = values.reshape(values.size(0), -1)
    squared = ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1)
    return torch.softmax(-squared / (2 * bandwidth**2), dim=-1) @ v


def nadaraya_watson__values_times_weights(queries, keys, values, bandwidth=1.0):
    q = queries[:, None] if queries.dim() == 1 else queries
    k = keys[:, None] if keys.dim() == 1 else keys
    squared = ((q[:, None, :] - k[None, :, :]) ** 2).sum(-1)
    weights = torch.softmax(-squared / (2 * bandwidth**2), dim=-1)
    return values @ weights


# ----------------------------------------------------------------------------------------------------
# cross_attention


def cross_attention__no_scale(x_q, x_kv, w_q, w_k, w_v):
    query, key, value = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
    weights = torch.softmax(query @ key.transpose(-2, -1), dim=-1)
    return weights @ value, weights


def cross_attention__scale_by_d_model(x_q, x_kv, w_q, w_k, w_v):
    query, key, value = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(x_q.size(-1)), dim=-1)
    return weights @ value, weights


def cross_attention__scale_by_d_v(x_q, x_kv, w_q, w_k, w_v):
    query, key, value = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(value.size(-1)), dim=-1)
    return weights @ value, weights


def cross_attention__swapped_projections(x_q, x_kv, w_q, w_k, w_v):
    query, key, value = x_q @ w_k, x_kv @ w_q, x_kv @ w_v
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.size(-1)), dim=-1)
    return weights @ value, weights


def cross_attention__roles_swapped(x_q, x_kv, w_q, w_k, w_v):
    query, key, value = x_kv @ w_q, x_q @ w_k, x_q @ w_v
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.size(-1)), dim=-1)
    return weights @ value, weights


def cross_attention__softmax_over_queries(x_q, x_kv, w_q, w_k, w_v):
    query, key, value = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.size(-1)), dim=-2)
    return weights @ value, weights


def cross_attention__key_transpose_0_1(x_q, x_kv, w_q, w_k, w_v):
    query, key, value = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
    weights = torch.softmax(query @ key.transpose(0, 1) / math.sqrt(query.size(-1)), dim=-1)
    return weights @ value, weights


def cross_attention__linear_convention(x_q, x_kv, w_q, w_k, w_v):
    query = torch.nn.functional.linear(x_q, w_q)
    key = torch.nn.functional.linear(x_kv, w_k)
    value = torch.nn.functional.linear(x_kv, w_v)
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.size(-1)), dim=-1)
    return weights @ value, weights


def cross_attention__einsum_one_batch_axis(x_q, x_kv, w_q, w_k, w_v):
    query, key, value = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
    scores = torch.einsum("bmd,bnd->bmn", query, key) / math.sqrt(query.size(-1))
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("bmn,bnv->bmv", weights, value), weights


def cross_attention__causal_mask(x_q, x_kv, w_q, w_k, w_v):
    query, key, value = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
    weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    return weights @ value, weights


def cross_attention__builtin_output(x_q, x_kv, w_q, w_k, w_v):
    query, key, value = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.size(-1)), dim=-1)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value), weights


# ----------------------------------------------------------------------------------------------------
# self_attention


def self_attention__causal_mask(x, w_q, w_k, w_v):
    query, key, value = x @ w_q, x @ w_k, x @ w_v
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    n = x.size(-2)
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=x.device))
    weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    return weights @ value, weights


def self_attention__swapped_projections(x, w_q, w_k, w_v):
    query, key, value = x @ w_k, x @ w_q, x @ w_v
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.size(-1)), dim=-1)
    return weights @ value, weights


def self_attention__scale_by_d_k(x, w_q, w_k, w_v):
    query, key, value = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(query @ key.transpose(-2, -1) / query.size(-1), dim=-1)
    return weights @ value, weights


def self_attention__key_dot_T(x, w_q, w_k, w_v):
    query, key, value = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(query @ key.T / math.sqrt(query.size(-1)), dim=-1)
    return weights @ value, weights


def self_attention__returns_weights_first(x, w_q, w_k, w_v):
    query, key, value = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.size(-1)), dim=-1)
    return weights, weights @ value


def self_attention__builtin_output(x, w_q, w_k, w_v):
    query, key, value = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(query.size(-1)), dim=-1)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value), weights


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


# ----------------------------------------------------------------------------------------------------
# what each wrong implementation must trigger: {grade id of a test cell: fragment of its message}

WRONG = {
    gaussian_kernel_weights__no_max_shift: {"kernel_weights_far_query": "underflows to 0 for every key"},
    gaussian_kernel_weights__positive_exponent: {
        "kernel_weights_table": "the exponent has the wrong sign",
        "kernel_weights_bandwidth": "the exponent has the wrong sign",
    },
    gaussian_kernel_weights__missing_half: {"kernel_weights_table": "the 1/2 of the Gaussian kernel"},
    gaussian_kernel_weights__bandwidth_not_squared: {
        "kernel_weights_bandwidth": "the bandwidth is not squared"
    },
    gaussian_kernel_weights__precedence: {"kernel_weights_bandwidth": "multiplied by h^2 instead of divided"},
    gaussian_kernel_weights__distance_not_squared: {"kernel_weights_table": "the distance is not squared"},
    gaussian_kernel_weights__softmax_over_queries: {
        "kernel_weights_rows_sum_to_one": "the softmax runs over the queries (dim=0)",
        "kernel_weights_table": "the softmax runs over the queries (dim=0)",
    },
    gaussian_kernel_weights__no_feature_sum: {
        "kernel_weights_rows_sum_to_one": "not summed over the feature axis"
    },
    gaussian_kernel_weights__vectors_only: {"kernel_weights_rows_sum_to_one": "give them a feature axis"},
    gaussian_kernel_weights__unsqueeze_in_place: {
        "kernel_weights_rows_sum_to_one": "modified its argument `queries` in place"
    },
    gaussian_kernel_weights__casts_to_float32: {
        "kernel_weights_table": "has dtype torch.float32, expected torch.float64"
    },
    gaussian_kernel_weights__transposed: {"kernel_weights_rows_sum_to_one": "one row per query"},
    nadaraya_watson__elementwise_product: {"nadaraya_watson_shapes": "the prediction is weights @ values"},
    nadaraya_watson__unnormalised_kernel: {"nadaraya_watson_table": "are not normalised"},
    nadaraya_watson__ignores_bandwidth: {"nadaraya_watson_bandwidth": "the bandwidth is not passed on"},
    nadaraya_watson__distance_weights: {"nadaraya_watson_table": "the farthest key weighs most"},
    nadaraya_watson__inverse_distance: {"nadaraya_watson_table": "inverse-distance weights"},
    nadaraya_watson__keeps_value_axis: {"nadaraya_watson_shapes": "for values [n] the prediction is [m]"},
    nadaraya_watson__values_times_weights: {
        "nadaraya_watson_table": "the prediction is weights @ values",
        "nadaraya_watson_shapes": "the prediction is weights @ values",
    },
    # first of its function: the round trip of tests/test_grading.py fills the other functions with the
    # reference, whose self_attention calls the notebook's cross_attention; with x_q = x_kv this bug
    # vanishes, so the self_attention cells keep their points as its oracle expects
    cross_attention__roles_swapped: {"cross_attention_shapes": "the queries come from x_q"},
    cross_attention__no_scale: {"cross_attention_matches_formula": "the scores are not scaled"},
    cross_attention__scale_by_d_model: {"cross_attention_matches_formula": "sqrt(d_model)"},
    cross_attention__scale_by_d_v: {"cross_attention_matches_formula": "sqrt(d_v)"},
    cross_attention__swapped_projections: {"cross_attention_matches_formula": "w_q and w_k are swapped"},
    cross_attention__softmax_over_queries: {"cross_attention_matches_formula": "over the query axis"},
    cross_attention__key_transpose_0_1: {"cross_attention_shapes": "key.transpose(-2, -1)"},
    cross_attention__linear_convention: {"cross_attention_shapes": "not x @ w.T nor F.linear(x, w)"},
    cross_attention__einsum_one_batch_axis: {"cross_attention_shapes": "use an ellipsis"},
    cross_attention__causal_mask: {
        "cross_attention_matches_formula": "a causal mask is applied",
        "cross_attention_source_permutation": "depends on the order of the source positions",
    },
    cross_attention__builtin_output: {"cross_attention_from_scratch": "scaled_dot_product_attention"},
    self_attention__causal_mask: {
        "self_attention_matches_formula": "a causal mask is applied",
        "self_attention_permutation_equivariance": "depends on the order of the positions",
    },
    self_attention__swapped_projections: {"self_attention_matches_formula": "w_q and w_k are swapped"},
    self_attention__scale_by_d_k: {"self_attention_matches_formula": "divided by d_k"},
    self_attention__key_dot_T: {"self_attention_matches_formula": "key.transpose(-2, -1)"},
    self_attention__returns_weights_first: {"self_attention_matches_formula": "return (output, weights)"},
    self_attention__builtin_output: {"self_attention_from_scratch": "scaled_dot_product_attention"},
}

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
