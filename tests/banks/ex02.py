"""Implementations of exercise ex02 that a learner could plausibly write: wrong ones and right ones.

Every implementation is self-contained (``torch`` and ``math`` only), so that its source is also a
submission's solution cell. ``ROWS`` are one-line mistakes applied to ``BASES``; ``WHOLE`` holds mistakes
of another structure; ``RIGHT`` correct implementations in other styles, which every cell must accept.
Expectations name *exactly* the test cells that reject an implementation (see ``_bank.py``).
"""

import math

import torch

from tests.banks._bank import Chance, Row

BASES = {
    "softmax": """def softmax(x, dim=-1):
    shifted = x - x.amax(dim=dim, keepdim=True)
    exp = torch.exp(shifted)
    return exp / exp.sum(dim=dim, keepdim=True)
""",
    "scaled_dot_product_attention": """def scaled_dot_product_attention(query, key, value, mask=None):
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ValueError("query and key must share d_k, and key and value k_len")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights
""",
    "dot_product_variance": """def dot_product_variance(d_k, n_samples, scaled=False, generator=None):
    if d_k < 1 or n_samples < 2:
        raise ValueError("need d_k >= 1 and n_samples >= 2")
    query = torch.randn(n_samples, d_k, generator=generator, dtype=torch.float64)
    key = torch.randn(n_samples, d_k, generator=generator, dtype=torch.float64)
    dots = (query * key).sum(dim=-1)
    if scaled:
        dots = dots / math.sqrt(d_k)
    return dots.var().item()
""",
}

MUST_BE_CORRECT = "must be correct before it counts as written from scratch"
SOFTMAX_VALUES = ("softmax_sums_to_one", "softmax_matches_torch", "softmax_is_stable", "softmax_from_scratch")
SDPA_VALUES = ("sdpa_matches_builtin", "sdpa_mask", "sdpa_dtype_and_inputs", "sdpa_from_scratch")
SDPA_ALL = ("sdpa_shapes", *SDPA_VALUES)
SHAPES_CHECKED = (
    "    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:\n"
    '        raise ValueError("query and key must share d_k, and key and value k_len")\n'
)
MASK_CHECKED = (
    '    if mask is not None and mask.dtype != torch.bool:\n        raise TypeError("mask must be boolean")\n'
)
SOFTMAX_CALL = "    weights = torch.softmax(scores, dim=-1)\n"


def every(cells, fragment):
    return dict.fromkeys(cells, fragment)


ROWS = [
    Row(
        "softmax",
        "no_max_shift",
        "x - x.amax(dim=dim, keepdim=True)",
        "x",
        {"softmax_is_stable": "exp(1000) is inf"},
    ),
    Row(
        "softmax",
        "global_max",
        "x.amax(dim=dim, keepdim=True)",
        "x.max()",
        {"softmax_is_stable": "not the max of the whole tensor"},
    ),
    Row(
        "softmax",
        "ignores_dim",
        "x.amax(dim=dim, keepdim=True)\n    exp = torch.exp(shifted)\n    return exp / exp.sum(dim=dim, "
        "keepdim=True)",
        "x.amax(dim=-1, keepdim=True)\n    exp = torch.exp(shifted)\n    return exp / exp.sum(dim=-1, "
        "keepdim=True)",
        {
            "softmax_sums_to_one": "sums to 1 along axis 2, not along dim=1",
            "softmax_matches_torch": "runs over axis 2 while dim=1",
            "softmax_from_scratch": MUST_BE_CORRECT,
        },
    ),
    Row(
        "softmax",
        "sum_over_everything",
        "exp.sum(dim=dim, keepdim=True)",
        "exp.sum()",
        {
            "softmax_sums_to_one": "the whole tensor sums to 1",
            "softmax_matches_torch": "the sum runs over the whole tensor",
            "softmax_is_stable": "does not match",
            "softmax_from_scratch": MUST_BE_CORRECT,
        },
    ),
    Row(
        "softmax",
        "no_keepdim",
        "x.amax(dim=dim, keepdim=True)\n    exp = torch.exp(shifted)\n    return exp / exp.sum(dim=dim, "
        "keepdim=True)",
        "x.amax(dim=dim)\n    exp = torch.exp(shifted)\n    return exp / exp.sum(dim=dim)",
        every(SOFTMAX_VALUES, "keepdim=True"),
    ),
    Row(
        "softmax",
        "max_without_values",
        "x.amax(dim=dim, keepdim=True)",
        "x.max(dim=dim, keepdim=True)",
        every(SOFTMAX_VALUES, "returns a pair (values, indices)"),
    ),
    Row(
        "softmax",
        "returns_log_probabilities",
        "    exp = torch.exp(shifted)\n    return exp / exp.sum(dim=dim, keepdim=True)",
        "    return shifted - torch.log(torch.exp(shifted).sum(dim=dim, keepdim=True))",
        {
            "softmax_sums_to_one": "negative values",
            "softmax_matches_torch": "log-probabilities",
            "softmax_is_stable": "does not match",
            "softmax_from_scratch": MUST_BE_CORRECT,
        },
    ),
    Row(
        "softmax",
        "not_normalised",
        "return exp / exp.sum(dim=dim, keepdim=True)",
        "return exp",
        {
            "softmax_sums_to_one": "divided by their sum",
            "softmax_matches_torch": "not divided by their sum",
            "softmax_is_stable": "does not match",
            "softmax_from_scratch": MUST_BE_CORRECT,
        },
    ),
    Row(
        "softmax",
        "in_place_shift",
        "    shifted = x - x.amax(dim=dim, keepdim=True)\n    exp = torch.exp(shifted)",
        "    x -= x.amax(dim=dim, keepdim=True)\n    exp = torch.exp(x)",
        {"softmax_sums_to_one": "modified its argument `x` in place"},
    ),
    Row(
        "softmax",
        "always_float32",
        "    shifted = x",
        "    x = x.float()\n    shifted = x",
        {"softmax_sums_to_one": "has dtype torch.float32, expected torch.float64"},
    ),
    Row(
        "softmax",
        "float64_result",  # computed in float64 for precision, never cast back
        "    shifted = x",
        "    x = x.double()\n    shifted = x",
        {"softmax_sums_to_one": "has dtype torch.float64, expected torch.float32"},
    ),
    Row(
        "softmax",
        "nan_to_num",  # a slice all -inf must give NaN, as the docstring says
        "return exp / exp.sum(dim=dim, keepdim=True)",
        "return torch.nan_to_num(exp / exp.sum(dim=dim, keepdim=True))",
        {"softmax_sums_to_one": "where NaN is expected"},
    ),
    Row(
        "softmax",
        "dim_wrapped",  # a dim out of range must raise IndexError
        "    shifted = x",
        "    dim = dim % x.dim()\n    shifted = x",
        {"softmax_sums_to_one": "should raise IndexError"},
    ),
    Row(
        "softmax",
        "builtin_for_half_only",
        "    shifted = x",
        "    if x.dtype in (torch.float16, torch.bfloat16):\n        return x.softmax(dim)\n    shifted = x",
        {"softmax_from_scratch": "calls softmax"},
    ),
    Row(
        "scaled_dot_product_attention",
        "no_scale",
        " / math.sqrt(query.size(-1))",
        "",
        every(SDPA_VALUES, "the scores are not scaled") | {"sdpa_from_scratch": MUST_BE_CORRECT},
    ),
    Row(
        "scaled_dot_product_attention",
        "scale_by_d_k",
        "math.sqrt(query.size(-1))",
        "query.size(-1)",
        every(SDPA_VALUES, "divided by d_k") | {"sdpa_from_scratch": MUST_BE_CORRECT},
    ),
    Row(
        "scaled_dot_product_attention",
        "scale_by_d_v",
        "math.sqrt(query.size(-1))",
        "math.sqrt(value.size(-1))",
        every(SDPA_VALUES, "sqrt(d_v)") | {"sdpa_from_scratch": MUST_BE_CORRECT},
    ),
    Row(
        "scaled_dot_product_attention",
        "scale_by_k_len",
        "math.sqrt(query.size(-1))",
        "math.sqrt(key.size(-2))",
        every(SDPA_VALUES, "divided by sqrt(k_len)") | {"sdpa_from_scratch": MUST_BE_CORRECT},
    ),
    Row(
        "scaled_dot_product_attention",
        "softmax_over_queries",
        "dim=-1",
        "dim=-2",
        every(SDPA_VALUES, "over the query axis") | {"sdpa_from_scratch": MUST_BE_CORRECT},
    ),
    Row(
        "scaled_dot_product_attention",
        "key_dot_T",
        "key.transpose(-2, -1)",
        "key.T",
        every(SDPA_ALL, "key.transpose(-2, -1)")
        | {"sdpa_shapes": "It works for inputs without leading axes"},
    ),
    Row(
        "scaled_dot_product_attention",
        "key_transpose_0_1",
        "key.transpose(-2, -1)",
        "key.transpose(0, 1)",
        every(SDPA_ALL, "key.transpose(-2, -1)"),
    ),
    Row(
        "scaled_dot_product_attention",
        "bmm",
        "query @ key.transpose(-2, -1)",
        "torch.bmm(query, key.transpose(-2, -1))",
        every(SDPA_ALL, "torch.bmm takes 3-D tensors"),
    ),
    Row(
        "scaled_dot_product_attention",
        "einsum_fixed_axes",  # works for two leading axes (batch, heads) only
        "query @ key.transpose(-2, -1)",
        'torch.einsum("bhqd,bhkd->bhqk", query, key)',
        every(SDPA_ALL, "use an ellipsis"),
    ),
    Row(
        "scaled_dot_product_attention",
        "mask_inverted",
        "~mask",
        "mask",
        {"sdpa_mask": "the mask is inverted", "sdpa_dtype_and_inputs": "the mask is inverted"},
    ),
    Row(
        "scaled_dot_product_attention",
        "mask_ignored",
        '    if mask is not None:\n        scores = scores.masked_fill(~mask, float("-inf"))\n',
        "",
        {"sdpa_mask": "the mask is ignored", "sdpa_dtype_and_inputs": "the mask is ignored"},
    ),
    Row(
        "scaled_dot_product_attention",
        "mask_fills_zero",
        'float("-inf")',
        "0.0",
        {"sdpa_mask": "set to 0 instead of -inf", "sdpa_dtype_and_inputs": "set to 0 instead of -inf"},
    ),
    Row(
        "scaled_dot_product_attention",
        "fill_minus_1e9",
        '~mask, float("-inf")',
        "mask == 0, -1e9",
        {
            "sdpa_mask": "spread over keys it may not attend",
            "sdpa_dtype_and_inputs": "does not fit in float16",
        },
    ),
    Row(
        "scaled_dot_product_attention",
        "nan_to_num_weights",  # zeros for a query that may attend no key: ex03's rule, not this docstring's
        SOFTMAX_CALL,
        "    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)\n",
        {"sdpa_mask": "chapter 3's", "sdpa_dtype_and_inputs": "chapter 3's"},
    ),
    Row(
        "scaled_dot_product_attention",
        "exp_without_max",
        SOFTMAX_CALL,
        "    weights = scores.exp()\n    weights = weights / weights.sum(dim=-1, keepdim=True)\n",
        {"sdpa_matches_builtin": "subtract the maximum of each row", "sdpa_from_scratch": MUST_BE_CORRECT},
    ),
    Row(
        "scaled_dot_product_attention",
        "shapes_not_checked",
        SHAPES_CHECKED,
        "",
        {"sdpa_shapes": "should raise ValueError if query and key differ in d_k"},
    ),
    Row(
        "scaled_dot_product_attention",
        "mask_dtype_not_checked",
        MASK_CHECKED,
        "",
        {"sdpa_mask": "should raise TypeError if mask is not boolean"},
    ),
    Row(
        "scaled_dot_product_attention",
        "mask_sliced_to_scores",  # as a causal buffer is sliced: fails for a mask of fewer axes, [k_len]
        '        scores = scores.masked_fill(~mask, float("-inf"))\n',
        "        mask = mask[..., : scores.size(-2), : scores.size(-1)]\n"
        '        scores = scores.masked_fill(~mask, float("-inf"))\n',
        {"sdpa_mask": "a [k_len] mask is broadcastable too"},
    ),
    Row(
        "scaled_dot_product_attention",
        "float64_inside_not_cast_back",  # computed in float64 for precision: float32 inputs give float64
        "    scores = query",
        "    query, key, value = query.double(), key.double(), value.double()\n    scores = query",
        {"sdpa_dtype_and_inputs": "has dtype torch.float64, expected torch.float32"},
    ),
    Row(
        "scaled_dot_product_attention",
        "always_float32",
        "    scores = query",
        "    query, key, value = query.float(), key.float(), value.float()\n    scores = query",
        {"sdpa_dtype_and_inputs": "has dtype torch.float32, expected torch.float64"},
    ),
    Row(
        "scaled_dot_product_attention",
        "returns_weights_first",
        "return weights @ value, weights",
        "return weights, weights @ value",
        every(SDPA_ALL, "return (output, weights) in this order"),
    ),
    Row(
        "scaled_dot_product_attention",
        "returns_output_only",
        "return weights @ value, weights",
        "return weights @ value",
        every(SDPA_ALL, "should return a tuple"),
    ),
    Row(
        "scaled_dot_product_attention",
        "weights_times_key",
        "weights @ value, weights",
        "weights @ key, weights",
        every(SDPA_ALL, "multiply the weights by the values"),
    ),
    Row(
        "dot_product_variance",
        "ignores_scaled",
        "    if scaled:\n        dots = dots / math.sqrt(d_k)\n",
        "",
        {"variance_scaled": "the scaled flag is ignored"},
    ),
    Row(
        "dot_product_variance",
        "scales_by_d_k",
        "math.sqrt(d_k)",
        "d_k",
        {"variance_scaled": "divided by d_k"},
    ),
    Row(
        "dot_product_variance",
        "mean_not_variance",
        "dots.var()",
        "dots.mean()",
        {
            "variance_unscaled": "like a mean",
            "variance_scaled": "like a mean",
            "variance_is_estimate": "exactly n_samples",
        },
    ),
    Row(
        "dot_product_variance",
        "std_not_variance",
        "dots.var()",
        "dots.std()",
        {
            "variance_unscaled": "standard deviation",
            "variance_scaled": "standard deviation",
            "variance_is_estimate": "exactly n_samples",
        },
    ),
    Row(
        "dot_product_variance",
        "sums_over_samples",
        "sum(dim=-1)",
        "sum(dim=0)",
        {
            "variance_unscaled": "over the samples",
            "variance_scaled": "compare your estimate with the theory",
            "variance_is_estimate": "exactly n_samples",
        },
    ),
    Row(
        "dot_product_variance",
        "arguments_not_checked",
        '    if d_k < 1 or n_samples < 2:\n        raise ValueError("need d_k >= 1 and n_samples >= 2")\n',
        "",
        {"variance_unscaled": "should raise ValueError if d_k < 1 or n_samples < 2"},
    ),
    Row(
        "dot_product_variance",
        "returns_tensor",
        "return dots.var().item()",
        "return dots.var()",
        {"variance_is_estimate": "not a Python float"},
    ),
    Row(
        "dot_product_variance",
        "new_generator_for_none",  # a fresh torch.Generator() always starts from the same seed
        "    query = torch.randn(",
        "    if generator is None:\n        generator = torch.Generator()\n    query = torch.randn(",
        {"variance_is_estimate": "returned the same estimate"},
    ),
]


# ----------------------------------------------------------------------------------------------------
# mistakes of another structure


def scaled_dot_product_attention__scale_after_softmax(query, key, value, mask=None):
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    scores = query @ key.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1) / math.sqrt(query.size(-1))
    return weights @ value, weights


def scaled_dot_product_attention__mask_after_softmax(query, key, value, mask=None):
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights * mask
    return weights @ value, weights


def scaled_dot_product_attention__scales_query_in_place(query, key, value, mask=None):
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    query /= math.sqrt(query.size(-1))
    scores = query @ key.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def scaled_dot_product_attention__key_times_query(query, key, value, mask=None):
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    scores = key @ query.transpose(-2, -1) / math.sqrt(query.size(-1))
    weights = torch.softmax(scores, dim=-1)
    return weights.transpose(-2, -1) @ value, weights


def scaled_dot_product_attention__builtin_output(query, key, value, mask=None):
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return output, weights


def scaled_dot_product_attention__finfo_min_fill(query, key, value, mask=None):
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    scores = torch.einsum("...qd,...kd->...qk", query, key) * query.size(-1) ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    scores = scores - scores.amax(dim=-1, keepdim=True)
    weights = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)
    return torch.einsum("...qk,...kv->...qv", weights, value), weights


def scaled_dot_product_attention__finite_fill_in_half(query, key, value, mask=None):
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:  # -inf "is risky in half precision": the largest negative number instead
        half = scores.dtype in (torch.float16, torch.bfloat16)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min if half else -math.inf)
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def scaled_dot_product_attention__half_returned_as_float16(query, key, value, mask=None):
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    half = query.dtype in (torch.float16, torch.bfloat16)
    if half:  # compute in float32, round once at the end
        query, key, value = query.float(), key.float(), value.float()
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    output = weights @ value
    return (output.half(), weights.half()) if half else (output, weights)


def scaled_dot_product_attention__squeezes_a_batch_of_one(query, key, value, mask=None):
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    if query.dim() == 2:  # one sequence: give it a batch axis, removed at the end
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights @ value).squeeze(0), weights.squeeze(0)


def scaled_dot_product_attention__float32_for_every_dtype(query, key, value, mask=None):
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    q, k, v = query.float(), key.float(), value.float()  # float32 inside, whatever the inputs
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights @ v).to(query.dtype), weights.to(query.dtype)


def softmax__half_returned_as_float16(x, dim=-1):
    half = x.dtype in (torch.float16, torch.bfloat16)
    wide = x.float() if half else x  # compute half precision in float32
    exp = torch.exp(wide - wide.amax(dim=dim, keepdim=True))
    result = exp / exp.sum(dim=dim, keepdim=True)
    return result.half() if half else result


def softmax__torch_softmax(x, dim=-1):
    return torch.softmax(x, dim=dim)


def softmax__functional_softmax(x, dim=-1):
    return torch.nn.functional.softmax(x, dim=dim)


def softmax__log_softmax_exp(x, dim=-1):
    return torch.log_softmax(x, dim=dim).exp()


def softmax__aten_overload(x, dim=-1):
    return torch.ops.aten._softmax.default(x, dim, False)


def dot_product_variance__theory_typed_in(d_k, n_samples, scaled=False, generator=None):
    if d_k < 1 or n_samples < 2:
        raise ValueError("d_k must be at least 1 and n_samples at least 2")
    return 1.0 if scaled else float(d_k)


def dot_product_variance__variance_of_components(d_k, n_samples, scaled=False, generator=None):
    if d_k < 1 or n_samples < 2:
        raise ValueError("d_k must be at least 1 and n_samples at least 2")
    query = torch.randn(n_samples, d_k, generator=generator)
    return query.var().item()


def dot_product_variance__variance_of_products(d_k, n_samples, scaled=False, generator=None):
    if d_k < 1 or n_samples < 2:
        raise ValueError("d_k must be at least 1 and n_samples at least 2")
    query = torch.randn(n_samples, d_k, generator=generator)
    key = torch.randn(n_samples, d_k, generator=generator)
    products = query * key
    if scaled:
        products = products / math.sqrt(d_k)
    return products.var().item()


def dot_product_variance__uniform_samples(d_k, n_samples, scaled=False, generator=None):
    if d_k < 1 or n_samples < 2:
        raise ValueError("d_k must be at least 1 and n_samples at least 2")
    query = torch.rand(n_samples, d_k, generator=generator)
    key = torch.rand(n_samples, d_k, generator=generator)
    dots = (query * key).sum(-1)
    return (dots / math.sqrt(d_k) if scaled else dots).var().item()


def dot_product_variance__ignores_generator(d_k, n_samples, scaled=False, generator=None):
    if d_k < 1 or n_samples < 2:
        raise ValueError("d_k must be at least 1 and n_samples at least 2")
    query = torch.randn(n_samples, d_k)
    key = torch.randn(n_samples, d_k)
    dots = (query * key).sum(-1)
    return (dots / math.sqrt(d_k) if scaled else dots).var().item()


def dot_product_variance__only_100_samples(d_k, n_samples, scaled=False, generator=None):
    if d_k < 1 or n_samples < 2:
        raise ValueError("d_k must be at least 1 and n_samples at least 2")
    query = torch.randn(100, d_k, generator=generator)
    key = torch.randn(100, d_k, generator=generator)
    dots = (query * key).sum(-1)
    return (dots / math.sqrt(d_k) if scaled else dots).var().item()


def dot_product_variance__quarter_samples_repeated(d_k, n_samples, scaled=False, generator=None):
    if d_k < 1 or n_samples < 2:
        raise ValueError("d_k must be at least 1 and n_samples at least 2")
    query = torch.randn(n_samples // 4, d_k, generator=generator).repeat(4, 1)
    key = torch.randn(n_samples // 4, d_k, generator=generator).repeat(4, 1)
    dots = (query * key).sum(-1)
    return (dots / math.sqrt(d_k) if scaled else dots).var().item()


def dot_product_variance__theory_plus_noise(d_k, n_samples, scaled=False, generator=None):
    if d_k < 1 or n_samples < 2:
        raise ValueError("d_k must be at least 1 and n_samples at least 2")
    theory = 1.0 if scaled else float(d_k)
    return theory * (1 + 0.002 * torch.randn(1, generator=generator).item())


WHOLE = {
    scaled_dot_product_attention__scale_after_softmax: every(SDPA_VALUES, "after the softmax")
    | {"sdpa_from_scratch": MUST_BE_CORRECT},
    scaled_dot_product_attention__mask_after_softmax: {
        "sdpa_mask": "applied after the softmax",
        "sdpa_dtype_and_inputs": "applied after the softmax",
    },
    scaled_dot_product_attention__scales_query_in_place: {
        "sdpa_dtype_and_inputs": "modified its argument `query` in place"
    },
    scaled_dot_product_attention__key_times_query: every(SDPA_ALL, "the scores are query @ key^T"),
    # F.scaled_dot_product_attention takes no [k_len] mask, and gives zeros to a query that may attend no key
    scaled_dot_product_attention__builtin_output: {
        "sdpa_mask": "Dimension out of range",
        "sdpa_dtype_and_inputs": "the output of",
        "sdpa_from_scratch": "scaled_dot_product_attention",
    },
    softmax__torch_softmax: {"softmax_from_scratch": "calls torch.softmax"},
    softmax__functional_softmax: {"softmax_from_scratch": "torch.nn.functional.softmax"},
    softmax__log_softmax_exp: {"softmax_from_scratch": "log_softmax"},
    softmax__aten_overload: {"softmax_from_scratch": "aten._softmax"},
    dot_product_variance__theory_typed_in: {"variance_is_estimate": "whatever the generator's seed"},
    dot_product_variance__variance_of_components: {
        "variance_unscaled": "variance of one component",
        "variance_scaled": "does not depend on",
        "variance_is_estimate": "exactly n_samples",
    },
    dot_product_variance__variance_of_products: {
        "variance_unscaled": "individual products",
        "variance_scaled": "individual products",
        "variance_is_estimate": "exactly n_samples",
    },
    dot_product_variance__uniform_samples: {
        "variance_unscaled": "uniform",
        "variance_scaled": "uniform",
        "variance_is_estimate": "exactly n_samples",
    },
    dot_product_variance__ignores_generator: {"variance_is_estimate": "ignore the generator"},
    # 100 draws miss the visible tolerance (5 standard errors of 2000 draws) with probability 0.26 per
    # call, and its three visible calls may all land inside by chance; its four hidden ones (5 standard errors
    # of 1000 to 25000 draws) all land inside with probability about 0.04, and with these seeds do not
    dot_product_variance__only_100_samples: {
        "variance_unscaled": Chance("within"),
        "variance_scaled": Chance("within"),
        "variance_is_estimate": "exactly n_samples",
    },
    dot_product_variance__quarter_samples_repeated: {"variance_is_estimate": "exactly n_samples"},
    dot_product_variance__theory_plus_noise: {"variance_is_estimate": "times the"},
    scaled_dot_product_attention__finfo_min_fill: {
        "sdpa_mask": "spread over keys it may not attend",
        "sdpa_dtype_and_inputs": "spread over keys it may not attend",
    },
    scaled_dot_product_attention__finite_fill_in_half: {"sdpa_dtype_and_inputs": "spread over keys"},
    scaled_dot_product_attention__half_returned_as_float16: {
        "sdpa_dtype_and_inputs": "has dtype torch.float16, expected torch.bfloat16"
    },
    # the docstring: float64 inputs are computed in float64
    scaled_dot_product_attention__float32_for_every_dtype: every(SDPA_VALUES[:3], "float32's precision")
    | {"sdpa_from_scratch": MUST_BE_CORRECT},
    scaled_dot_product_attention__squeezes_a_batch_of_one: {"sdpa_shapes": "an axis of size 1 is gone"},
    softmax__half_returned_as_float16: {
        "softmax_sums_to_one": "has dtype torch.float16, expected torch.bfloat16"
    },
}


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
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    scores = torch.einsum("...qd,...kd->...qk", query, key) * query.size(-1) ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, -torch.inf)
    scores = scores - scores.amax(dim=-1, keepdim=True)  # a row of -inf: -inf - -inf = NaN
    weights = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)
    return torch.einsum("...qk,...kv->...qv", weights, value), weights


def scaled_dot_product_attention__float64_inside(query, key, value, mask=None):
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"d_k differs: {query.shape[-1]} and {key.shape[-1]}")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"k_len differs: {key.shape[-2]} and {value.shape[-2]}")
    if mask is not None and mask.dtype is not torch.bool:
        raise TypeError(f"mask must be boolean, got {mask.dtype}")
    q, k, v = query.double(), key.double(), value.double()
    scores = q @ k.transpose(-1, -2) / math.sqrt(k.size(-1))
    if mask is not None:
        scores = scores + torch.zeros_like(mask, dtype=scores.dtype).masked_fill(~mask, -math.inf)
    weights = torch.softmax(scores, dim=-1)
    return (weights @ v).to(query.dtype), weights.to(query.dtype)


def scaled_dot_product_attention__finite_fill_then_nan_rows(query, key, value, mask=None):
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:  # the docstring: a query that may attend no key gets NaN
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), math.nan)
    return weights @ value, weights


def scaled_dot_product_attention__float32_inside(query, key, value, mask=None):
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        raise ValueError("query, key and value do not fit")
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError("mask must be boolean")
    wide = torch.promote_types(query.dtype, torch.float32)  # half types are computed in float32
    q, k, v = query.to(wide), key.to(wide), value.to(wide)
    scores = torch.matmul(q / math.sqrt(q.shape[-1]), k.mT)
    if mask is not None:
        scores = torch.where(mask, scores, torch.tensor(float("-inf"), dtype=wide, device=scores.device))
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v).to(query.dtype), weights.to(query.dtype)


def dot_product_variance__biased_mean_of_squares(d_k, n_samples, scaled=False, generator=None):
    if d_k < 1 or n_samples < 2:
        raise ValueError("d_k must be at least 1 and n_samples at least 2")
    pairs = torch.randn(2, n_samples, d_k, generator=generator, dtype=torch.float64)
    dots = torch.einsum("nd,nd->n", pairs[0], pairs[1])
    if scaled:
        dots = dots / d_k**0.5
    return float((dots**2).mean())


def dot_product_variance__float32_unbiased(d_k, n_samples, scaled=False, generator=None):
    if d_k < 1 or n_samples < 2:
        raise ValueError("d_k must be at least 1 and n_samples at least 2")
    q = torch.randn(n_samples, d_k, generator=generator)
    k = torch.randn(n_samples, d_k, generator=generator)
    dots = (q * k).sum(dim=1) / (math.sqrt(d_k) if scaled else 1.0)
    return torch.var(dots, unbiased=True).item()


def dot_product_variance__numpy_float(d_k, n_samples, scaled=False, generator=None):
    if d_k < 1 or n_samples < 2:
        raise ValueError("d_k must be at least 1 and n_samples at least 2")
    q = torch.randn(n_samples, d_k, generator=generator, dtype=torch.float64)
    k = torch.randn(n_samples, d_k, generator=generator, dtype=torch.float64)
    dots = (q * k).sum(dim=1).numpy()
    if scaled:
        dots = dots / math.sqrt(d_k)
    return dots.var(ddof=1)  # a numpy float64, which is a Python float


RIGHT = [
    softmax__logsumexp,
    softmax__float64_inside,
    softmax__moved_axis,
    scaled_dot_product_attention__einsum,
    scaled_dot_product_attention__float32_inside,
    scaled_dot_product_attention__float64_inside,
    scaled_dot_product_attention__finite_fill_then_nan_rows,
    dot_product_variance__biased_mean_of_squares,
    dot_product_variance__float32_unbiased,
    dot_product_variance__numpy_float,
]
