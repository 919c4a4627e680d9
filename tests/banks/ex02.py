"""Implementations of exercise ex02 that a learner could plausibly write: wrong ones and right ones.

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
# softmax


def softmax__no_max_shift(x, dim=-1):
    exp = torch.exp(x)
    return exp / exp.sum(dim=dim, keepdim=True)


def softmax__global_max(x, dim=-1):
    exp = torch.exp(x - x.max())
    return exp / exp.sum(dim=dim, keepdim=True)


def softmax__ignores_dim(x, dim=-1):
    exp = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return exp / exp.sum(dim=-1, keepdim=True)


def softmax__sum_over_everything(x, dim=-1):
    exp = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return exp / exp.sum()


def softmax__no_keepdim(x, dim=-1):
    exp = torch.exp(x - x.amax(dim=dim))
    return exp / exp.sum(dim=dim)


def softmax__returns_log_probabilities(x, dim=-1):
    shifted = x - x.amax(dim=dim, keepdim=True)
    return shifted - torch.log(torch.exp(shifted).sum(dim=dim, keepdim=True))


def softmax__not_normalised(x, dim=-1):
    return torch.exp(x - x.amax(dim=dim, keepdim=True))


def softmax__in_place_shift(x, dim=-1):
    x -= x.amax(dim=dim, keepdim=True)
    exp = torch.exp(x)
    return exp / exp.sum(dim=dim, keepdim=True)


def softmax__always_float32(x, dim=-1):
    x = x.float()
    exp = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return exp / exp.sum(dim=dim, keepdim=True)


def softmax__torch_softmax(x, dim=-1):
    return torch.softmax(x, dim=dim)


def softmax__functional_softmax(x, dim=-1):
    return torch.nn.functional.softmax(x, dim=dim)


def softmax__log_softmax_exp(x, dim=-1):
    return torch.log_softmax(x, dim=dim).exp()


def softmax__builtin_for_half_only(x, dim=-1):
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.softmax(dim)
    exp = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return exp / exp.sum(dim=dim, keepdim=True)


# ----------------------------------------------------------------------------------------------------
# scaled dot-product attention (self-contained: each computes its own softmax with torch.softmax)


def scaled_dot_product_attention__no_scale(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def scaled_dot_product_attention__scale_by_d_k(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / query.size(-1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def scaled_dot_product_attention__scale_by_d_v(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(value.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def scaled_dot_product_attention__softmax_over_queries(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-2)
    return weights @ value, weights


def scaled_dot_product_attention__scale_after_softmax(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1) / math.sqrt(query.size(-1))
    return weights @ value, weights


def scaled_dot_product_attention__key_dot_T(query, key, value, mask=None):
    scores = query @ key.T / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def scaled_dot_product_attention__key_transpose_0_1(query, key, value, mask=None):
    scores = query @ key.transpose(0, 1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def scaled_dot_product_attention__mask_inverted(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def scaled_dot_product_attention__mask_after_softmax(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights * mask
    return weights @ value, weights


def scaled_dot_product_attention__mask_ignored(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def scaled_dot_product_attention__mask_fills_zero(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, 0.0)
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def scaled_dot_product_attention__fill_minus_1e9(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def scaled_dot_product_attention__scales_query_in_place(query, key, value, mask=None):
    query /= math.sqrt(query.size(-1))
    scores = query @ key.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def scaled_dot_product_attention__always_float32(query, key, value, mask=None):
    query, key, value = query.float(), key.float(), value.float()
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def scaled_dot_product_attention__returns_weights_first(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights, weights @ value


def scaled_dot_product_attention__returns_output_only(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ value


def scaled_dot_product_attention__weights_times_key(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ key, weights


def scaled_dot_product_attention__key_times_query(query, key, value, mask=None):
    scores = key @ query.transpose(-2, -1) / math.sqrt(query.size(-1))
    weights = torch.softmax(scores, dim=-1)
    return weights.transpose(-2, -1) @ value, weights


def scaled_dot_product_attention__builtin_output(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return output, weights


# ----------------------------------------------------------------------------------------------------
# dot_product_variance


def dot_product_variance__theory_typed_in(d_k, n_samples, scaled=False, generator=None):
    return 1.0 if scaled else float(d_k)


def dot_product_variance__ignores_scaled(d_k, n_samples, scaled=False, generator=None):
    query = torch.randn(n_samples, d_k, generator=generator)
    key = torch.randn(n_samples, d_k, generator=generator)
    return (query * key).sum(-1).var().item()


def dot_product_variance__scales_by_d_k(d_k, n_samples, scaled=False, generator=None):
    query = torch.randn(n_samples, d_k, generator=generator)
    key = torch.randn(n_samples, d_k, generator=generator)
    dots = (query * key).sum(-1)
    return (dots / d_k if scaled else dots).var().item()


def dot_product_variance__variance_of_components(d_k, n_samples, scaled=False, generator=None):
    query = torch.randn(n_samples, d_k, generator=generator)
    return query.var().item()


def dot_product_variance__mean_not_variance(d_k, n_samples, scaled=False, generator=None):
    query = torch.randn(n_samples, d_k, generator=generator)
    key = torch.randn(n_samples, d_k, generator=generator)
    dots = (query * key).sum(-1)
    return (dots / math.sqrt(d_k) if scaled else dots).mean().item()


def dot_product_variance__uniform_samples(d_k, n_samples, scaled=False, generator=None):
    query = torch.rand(n_samples, d_k, generator=generator)
    key = torch.rand(n_samples, d_k, generator=generator)
    dots = (query * key).sum(-1)
    return (dots / math.sqrt(d_k) if scaled else dots).var().item()


def dot_product_variance__sums_over_samples(d_k, n_samples, scaled=False, generator=None):
    query = torch.randn(n_samples, d_k, generator=generator)
    key = torch.randn(n_samples, d_k, generator=generator)
    dots = (query * key).sum(0)
    return (dots / math.sqrt(d_k) if scaled else dots).var().item()


def dot_product_variance__ignores_generator(d_k, n_samples, scaled=False, generator=None):
    query = torch.randn(n_samples, d_k)
    key = torch.randn(n_samples, d_k)
    dots = (query * key).sum(-1)
    return (dots / math.sqrt(d_k) if scaled else dots).var().item()


def dot_product_variance__only_100_samples(d_k, n_samples, scaled=False, generator=None):
    query = torch.randn(100, d_k, generator=generator)
    key = torch.randn(100, d_k, generator=generator)
    dots = (query * key).sum(-1)
    return (dots / math.sqrt(d_k) if scaled else dots).var().item()


def dot_product_variance__theory_plus_noise(d_k, n_samples, scaled=False, generator=None):
    theory = 1.0 if scaled else float(d_k)
    return theory * (1 + 0.002 * torch.randn(1, generator=generator).item())


# ----------------------------------------------------------------------------------------------------
# correct implementations in other styles


def softmax__logsumexp(x, dim=-1):
    return torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True))


def softmax__float64_inside(x, dim=-1):
    wide = x.double()
    exp = (wide - wide.max(dim=dim, keepdim=True).values).exp()
    return (exp / torch.sum(exp, dim=dim, keepdim=True)).to(x.dtype)


def softmax__moved_axis(x, dim=-1):
    moved = x.movedim(dim, -1)
    exp = torch.exp(moved - moved.max(-1, keepdim=True).values)
    return (exp / exp.sum(-1, keepdim=True)).movedim(-1, dim)


def scaled_dot_product_attention__einsum(query, key, value, mask=None):
    scores = torch.einsum("...qd,...kd->...qk", query, key) * query.size(-1) ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    scores = scores - scores.amax(dim=-1, keepdim=True)
    weights = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)
    return torch.einsum("...qk,...kv->...qv", weights, value), weights


def scaled_dot_product_attention__float32_inside(query, key, value, mask=None):
    wide = torch.promote_types(query.dtype, torch.float32)  # half types are computed in float32
    q, k, v = query.to(wide), key.to(wide), value.to(wide)
    scores = torch.matmul(q / math.sqrt(q.shape[-1]), k.mT)
    if mask is not None:
        scores = torch.where(mask, scores, torch.tensor(float("-inf"), dtype=wide, device=scores.device))
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v).to(query.dtype), weights.to(query.dtype)


def dot_product_variance__biased_mean_of_squares(d_k, n_samples, scaled=False, generator=None):
    pairs = torch.randn(2, n_samples, d_k, generator=generator, dtype=torch.float64)
    dots = torch.einsum("nd,nd->n", pairs[0], pairs[1])
    if scaled:
        dots = dots / d_k**0.5
    return float((dots**2).mean())


def dot_product_variance__float32_unbiased(d_k, n_samples, scaled=False, generator=None):
    q = torch.randn(n_samples, d_k, generator=generator)
    k = torch.randn(n_samples, d_k, generator=generator)
    dots = (q * k).sum(dim=1) / (math.sqrt(d_k) if scaled else 1.0)
    return torch.var(dots, unbiased=True).item()


# ----------------------------------------------------------------------------------------------------
# what each wrong implementation must trigger: {grade id of a test cell: fragment of its message}

WRONG = {
    softmax__no_max_shift: {"softmax_is_stable": "exp(1000) is inf in float32"},
    softmax__global_max: {"softmax_is_stable": "not the max of the whole tensor"},
    softmax__ignores_dim: {
        "softmax_sums_to_one": "sums to 1 along axis 2, not along dim=1",
        "softmax_matches_torch": "runs over axis 2 while dim=1",
    },
    softmax__sum_over_everything: {"softmax_sums_to_one": "the whole tensor sums to 1"},
    softmax__no_keepdim: {"softmax_sums_to_one": "keepdim=True"},
    softmax__returns_log_probabilities: {
        "softmax_sums_to_one": "negative values",
        "softmax_matches_torch": "log-probabilities",
    },
    softmax__not_normalised: {
        "softmax_sums_to_one": "divided by their sum",
        "softmax_matches_torch": "not divided by their sum",
    },
    softmax__in_place_shift: {"softmax_sums_to_one": "modified its argument `x` in place"},
    softmax__always_float32: {"softmax_matches_torch": "has dtype torch.float32, expected torch.float64"},
    softmax__torch_softmax: {"softmax_from_scratch": "calls torch.softmax"},
    softmax__functional_softmax: {"softmax_from_scratch": "torch.nn.functional.softmax"},
    softmax__log_softmax_exp: {"softmax_from_scratch": "log_softmax"},
    softmax__builtin_for_half_only: {"softmax_from_scratch": "calls softmax"},
    scaled_dot_product_attention__no_scale: {"sdpa_matches_builtin": "the scores are not scaled"},
    scaled_dot_product_attention__scale_by_d_k: {"sdpa_matches_builtin": "divided by d_k"},
    scaled_dot_product_attention__scale_by_d_v: {"sdpa_matches_builtin": "sqrt(d_v)"},
    scaled_dot_product_attention__softmax_over_queries: {"sdpa_matches_builtin": "over the query axis"},
    scaled_dot_product_attention__scale_after_softmax: {"sdpa_matches_builtin": "after the softmax"},
    scaled_dot_product_attention__key_dot_T: {"sdpa_shapes": "key.transpose(-2, -1)"},
    scaled_dot_product_attention__key_transpose_0_1: {"sdpa_shapes": "key.transpose(-2, -1)"},
    scaled_dot_product_attention__mask_inverted: {"sdpa_mask": "the mask is inverted"},
    scaled_dot_product_attention__mask_after_softmax: {"sdpa_mask": "applied after the softmax"},
    scaled_dot_product_attention__mask_ignored: {"sdpa_mask": "the mask is ignored"},
    scaled_dot_product_attention__mask_fills_zero: {"sdpa_mask": "set to 0 instead of -inf"},
    scaled_dot_product_attention__fill_minus_1e9: {"sdpa_dtype_and_inputs": "does not fit in float16"},
    scaled_dot_product_attention__scales_query_in_place: {
        "sdpa_shapes": "modified its argument `query` in place"
    },
    scaled_dot_product_attention__always_float32: {"sdpa_dtype_and_inputs": "expected torch.float64"},
    scaled_dot_product_attention__returns_weights_first: {"sdpa_shapes": "return (output, weights)"},
    scaled_dot_product_attention__returns_output_only: {"sdpa_shapes": "should return a tuple"},
    scaled_dot_product_attention__weights_times_key: {"sdpa_shapes": "multiply the weights by the values"},
    scaled_dot_product_attention__key_times_query: {"sdpa_shapes": "the scores are query @ key^T"},
    scaled_dot_product_attention__builtin_output: {"sdpa_from_scratch": "scaled_dot_product_attention"},
    dot_product_variance__theory_typed_in: {"variance_is_estimate": "whatever the generator's seed"},
    dot_product_variance__ignores_scaled: {"variance_scaled": "the scaled flag is ignored"},
    dot_product_variance__scales_by_d_k: {"variance_scaled": "divided by d_k"},
    dot_product_variance__variance_of_components: {"variance_unscaled": "variance of one component"},
    dot_product_variance__mean_not_variance: {"variance_unscaled": "like a mean"},
    dot_product_variance__uniform_samples: {"variance_unscaled": "uniform"},
    dot_product_variance__sums_over_samples: {"variance_unscaled": "over the samples"},
    dot_product_variance__ignores_generator: {"variance_is_estimate": "ignore the generator"},
    dot_product_variance__only_100_samples: {"variance_is_estimate": "exactly n_samples"},
    dot_product_variance__theory_plus_noise: {"variance_is_estimate": "times the"},
}

RIGHT = [
    softmax__logsumexp,
    softmax__float64_inside,
    softmax__moved_axis,
    scaled_dot_product_attention__einsum,
    scaled_dot_product_attention__float32_inside,
    dot_product_variance__biased_mean_of_squares,
    dot_product_variance__float32_unbiased,
]
