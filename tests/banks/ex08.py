"""Implementations of exercise ex08 that a learner could plausibly write: wrong ones and right ones.

Every implementation is self-contained (``torch``, ``math``, ``nn`` and ``F`` of the setup cell), so that its
source is also a submission's solution cell. ``ROWS`` are one-line mistakes applied to ``BASES``; ``WHOLE``
holds mistakes of another structure; ``RIGHT`` correct implementations in other styles, which every cell must
accept. Expectations name *exactly* the test cells that reject an implementation (see ``_bank.py``).
"""

import math

import torch

from tests.banks._bank import Row

BASES = {
    "sinusoidal_encoding": """def sinusoidal_encoding(
    max_len, d_model, base=10000.0, dtype=torch.float32, device=None
):
    if d_model % 2 != 0:
        raise ValueError(f"d_model must be even, got {d_model}")
    position = torch.arange(max_len, dtype=torch.float64, device=device).unsqueeze(1)
    div_term = base ** (torch.arange(0, d_model, 2, dtype=torch.float64, device=device) / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64, device=device)
    pe[:, 0::2] = torch.sin(position / div_term)
    pe[:, 1::2] = torch.cos(position / div_term)
    return pe.to(dtype)
""",
    "apply_rope": """def apply_rope(x, positions, base=10000.0, interleaved=False):
    d = x.size(-1)
    if d % 2 != 0:
        raise ValueError(f"the last axis of x must be even, got {d}")
    if positions.dim() not in (1, 2) or positions.size(-1) != x.size(-2):
        raise ValueError(f"positions must be [len] or [batch, len] with len = {x.size(-2)}")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, device=x.device, dtype=work) / d))
    freqs = positions.to(work)[..., None] * inv_freq
    if positions.dim() == 2:
        for _ in range(x.dim() - 3):
            freqs = freqs.unsqueeze(1)
    if interleaved:
        emb = freqs.repeat_interleave(2, dim=-1)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((-x2, x1), dim=-1).flatten(-2)
    else:
        emb = torch.cat((freqs, freqs), dim=-1)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        rotated = torch.cat((-x2, x1), dim=-1)
    return (x * emb.cos() + rotated * emb.sin()).to(x.dtype)
""",
    "alibi_slopes": """def alibi_slopes(n_heads, dtype=torch.float32, device=None):
    if n_heads < 1:
        raise ValueError(f"n_heads must be at least 1, got {n_heads}")

    def power_of_2_slopes(n):
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_2_slopes(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_2_slopes(closest) + power_of_2_slopes(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=dtype, device=device)
""",
    "alibi_bias": """def alibi_bias(n_heads, q_len, k_len, dtype=torch.float32, device=None):
    slopes = alibi_slopes(n_heads, torch.float64, device)
    query_pos = torch.arange(q_len, device=device) + (k_len - q_len)
    key_pos = torch.arange(k_len, device=device)
    distance = key_pos[None, :] - query_pos[:, None]
    return (slopes[:, None, None] * distance).to(dtype)
""",
}


def every(cells, fragment):
    return dict.fromkeys(cells, fragment)


SIN_COS = (
    "    pe[:, 0::2] = torch.sin(position / div_term)\n    pe[:, 1::2] = torch.cos(position / div_term)\n"
)
DEFAULT_ROPE = ("rope_half_split", "rope_batched_positions", "rope_dtype_device")
ROPE_VALUES = ("rope_half_split", "rope_interleaved", "rope_batched_positions")
SLOPES = ("alibi_slopes_power_of_two", "alibi_slopes_other_counts")
BIAS = ("alibi_bias_square", "alibi_bias_bottom_right")
RETURN_SLOPES = "    return torch.tensor(slopes, dtype=dtype, device=device)\n"
RETURN_BIAS = "    return (slopes[:, None, None] * distance).to(dtype)\n"
ROPE_CHECKS = (
    '    if d % 2 != 0:\n        raise ValueError(f"the last axis of x must be even, got {d}")\n'
    "    if positions.dim() not in (1, 2) or positions.size(-1) != x.size(-2):\n"
    '        raise ValueError(f"positions must be [len] or [batch, len] with len = {x.size(-2)}")\n'
)

ROWS = [
    Row(
        "sinusoidal_encoding",
        "cos_sin_swapped",
        SIN_COS,
        SIN_COS.replace("sin", "COS").replace("cos", "sin").replace("COS", "cos"),
        {"sinusoidal_values": "sines and cosines are swapped"},
    ),
    Row(
        "sinusoidal_encoding",
        "halves",
        SIN_COS,
        SIN_COS.replace("0::2", ": d_model // 2").replace("1::2", "d_model // 2 :"),
        {"sinusoidal_values": "tensor2tensor's layout"},
    ),
    Row(
        "sinusoidal_encoding",
        "double_exponent",
        "(torch.arange(0, d_model, 2, dtype=torch.float64, device=device) / d_model)",
        "(2 * torch.arange(0, d_model, 2, dtype=torch.float64, device=device) / d_model)",
        {"sinusoidal_values": "the exponent is doubled"},
    ),
    Row(
        "sinusoidal_encoding",
        "base_multiplied",
        SIN_COS,
        SIN_COS.replace("/ div_term", "* div_term"),
        {"sinusoidal_values": "*divided* by it"},
    ),
    Row(
        "sinusoidal_encoding",
        "from_one",
        "torch.arange(max_len, dtype=torch.float64, device=device)",
        "torch.arange(1, max_len + 1, dtype=torch.float64, device=device)",
        {"sinusoidal_values": "the positions start at 1"},
    ),
    Row(
        "sinusoidal_encoding",
        "batch_axis",
        "    return pe.to(dtype)\n",
        "    return pe.to(dtype).unsqueeze(0)\n",
        {"sinusoidal_values": "no batch axis"},
    ),
    Row(
        "sinusoidal_encoding",
        "transposed",
        "    return pe.to(dtype)\n",
        "    return pe.to(dtype).T\n",
        {"sinusoidal_values": "the axes are swapped"},
    ),
    Row(
        "apply_rope",
        "always_half_split",
        "    if interleaved:\n",
        "    if False:\n",
        {
            "rope_interleaved": "(x[i], x[i + d/2]) (rotate_half) where interleaved=True",
            "rope_dtype_device": "does not match",
        },
    ),
    Row(
        "apply_rope",
        "always_interleaved",
        "    if interleaved:\n",
        "    if True:\n",
        {
            **every(DEFAULT_ROPE[:2], "(the paper's interleaved convention)"),
            "rope_dtype_device": "does not match",
        },
    ),
    Row(
        "apply_rope",
        "reversed",
        "rotated = torch.cat((-x2, x1), dim=-1)",
        "rotated = torch.cat((x2, -x1), dim=-1)",
        {**every(DEFAULT_ROPE[:2], "the rotation goes the wrong way"), "rope_dtype_device": "does not match"},
    ),
    Row(
        "apply_rope",
        "repeat_with_halves",
        "emb = torch.cat((freqs, freqs), dim=-1)",
        "emb = freqs.repeat_interleave(2, dim=-1)",
        {**every(DEFAULT_ROPE[:2], "repeated pairwise"), "rope_dtype_device": "does not match"},
    ),
    Row(
        "apply_rope",
        "cat_with_pairs",
        "emb = freqs.repeat_interleave(2, dim=-1)",
        "emb = torch.cat((freqs, freqs), dim=-1)",
        {"rope_interleaved": "repeat each angle twice", "rope_dtype_device": "does not match"},
    ),
    Row(
        "apply_rope",
        "exponent_i_over_d",
        "torch.arange(0, d, 2, device=x.device, dtype=work) / d",
        "torch.arange(0, d // 2, device=x.device, dtype=work) / d",
        {**every(ROPE_VALUES, "theta_i = base^(-2i / d)"), "rope_dtype_device": "does not match"},
    ),
    Row(
        "apply_rope",
        "base_multiplied",
        "1.0 / (base ** (",
        "(base ** (",
        {**every(ROPE_VALUES, "less than 1"), "rope_dtype_device": "does not match"},
    ),
    Row(
        "apply_rope",
        "base_ignored",
        "1.0 / (base ** (",
        "1.0 / (10000.0 ** (",
        every(ROPE_VALUES[:2], "the base argument is ignored"),
    ),
    Row(
        "apply_rope",
        "positions_ignored",
        "positions.to(work)[..., None]",
        "torch.arange(x.size(-2), device=x.device, dtype=work)[..., None]",
        {
            **every(ROPE_VALUES[:2], "the positions argument is ignored"),
            ROPE_VALUES[2]: "do not line up",
            "rope_dtype_device": "does not match",
        },
    ),
    Row(
        "apply_rope",
        "angles_in_half",
        "work = torch.float64 if x.dtype == torch.float64 else torch.float32",
        "work = x.dtype",
        {"rope_dtype_device": "compute the angles in float32"},
    ),
    Row(
        "apply_rope",
        "outer",
        "positions.to(work)[..., None] * inv_freq",
        "torch.outer(positions.to(work), inv_freq)",
        every(("rope_batched_positions", "rope_dtype_device"), "positions[..., None] * theta"),
    ),
    Row(
        "apply_rope",
        "batched_without_head_axis",
        "    if positions.dim() == 2:\n        for _ in range(x.dim() - 3):\n"
        "            freqs = freqs.unsqueeze(1)\n",
        "",
        every(("rope_batched_positions", "rope_dtype_device"), "the angles do not line up with x"),
    ),
    Row(
        "apply_rope",
        "not_cast_back",
        "    return (x * emb.cos() + rotated * emb.sin()).to(x.dtype)\n",
        "    return x * emb.cos() + rotated * emb.sin()\n",
        {"rope_dtype_device": "the dtype must follow the inputs"},
    ),
    Row(
        "alibi_slopes",
        "geometric_for_every_count",
        "    if math.log2(n_heads).is_integer():\n",
        "    if True:\n",
        {"alibi_slopes_other_counts": "only the rule for powers of two"},
    ),
    Row(
        "alibi_slopes",
        "first_extra_slopes",
        "[0::2][: n_heads - closest]",
        "[: n_heads - closest]",
        {"alibi_slopes_other_counts": "take every other one"},
    ),
    Row(
        "alibi_slopes",
        "from_zero",
        "start ** (i + 1)",
        "start ** i",
        every(SLOPES, "the first slope is 2^0 = 1"),
    ),
    Row(
        "alibi_slopes",
        "reversed",
        RETURN_SLOPES,
        "    return torch.tensor(slopes[::-1], dtype=dtype, device=device)\n",
        every(SLOPES, "reverse order"),
    ),
    Row(
        "alibi_slopes",
        "list",
        RETURN_SLOPES,
        "    return slopes\n",
        every(SLOPES, "torch.tensor(slopes)"),
    ),
    Row(
        "alibi_slopes",
        "broadcast_axes",
        RETURN_SLOPES,
        "    return torch.tensor(slopes, dtype=dtype, device=device)[:, None, None]\n",
        every(SLOPES, "without the axes for broadcasting"),
    ),
    Row(
        "alibi_bias",
        "sign",
        "distance = key_pos[None, :] - query_pos[:, None]",
        "distance = query_pos[:, None] - key_pos[None, :]",
        every(BIAS, "the wrong sign"),
    ),
    Row(
        "alibi_bias",
        "top_left",
        " + (k_len - q_len)",
        "",
        {"alibi_bias_bottom_right": "bottom-right"},
    ),
    Row(
        "alibi_bias",
        "nearest_penalised",
        "distance = key_pos[None, :] - query_pos[:, None]",
        "distance = -key_pos[None, :].expand(q_len, k_len)",
        every(BIAS, "penalises the nearest"),
    ),
    Row(
        "alibi_bias",
        "authors_m_j",
        "distance = key_pos[None, :] - query_pos[:, None]",
        "distance = key_pos[None, :].expand(q_len, k_len)",
        every(BIAS, "the same for every query"),
    ),
    Row(
        "alibi_bias",
        "symmetric",
        "distance = key_pos[None, :] - query_pos[:, None]",
        "distance = -(key_pos[None, :] - query_pos[:, None]).abs()",
        every(BIAS, "a variant for encoders"),
    ),
    Row(
        "alibi_bias",
        "batch_axis",
        RETURN_BIAS,
        "    return (slopes[:, None, None] * distance).to(dtype).unsqueeze(0)\n",
        every(BIAS, "without the batch axis"),
    ),
    # the documented arguments, dtypes, devices and errors
    Row(
        "sinusoidal_encoding",
        "base_ignored",
        "div_term = base ** (",
        "div_term = 10000.0 ** (",
        {"sinusoidal_values": "the base argument is ignored"},
    ),
    Row(
        "sinusoidal_encoding",
        "dtype_ignored",
        "    return pe.to(dtype)\n",
        "    return pe.float()\n",
        {"sinusoidal_values": "but dtype=torch.float64 asks for torch.float64"},
    ),
    Row(
        "sinusoidal_encoding",
        "float64_by_default",
        "    return pe.to(dtype)\n",
        "    return pe\n",
        {"sinusoidal_values": "has dtype torch.float64, but the default dtype, torch.float32, asks"},
    ),
    Row(
        "sinusoidal_encoding",
        "no_validation",
        '    if d_model % 2 != 0:\n        raise ValueError(f"d_model must be even, got {d_model}")\n',
        "",
        {"sinusoidal_values": "it should raise ValueError if d_model is odd"},
    ),
    Row(
        "apply_rope",
        "no_validation",
        ROPE_CHECKS,
        "",
        {"rope_half_split": "it should raise ValueError if d (x.size(-1) = 7) is odd"},
    ),
    Row(
        "apply_rope",
        "validation_with_assert",
        ROPE_CHECKS,
        '    assert d % 2 == 0, "d must be even"\n    assert positions.size(-1) == x.size(-2)\n',
        {"rope_half_split": "raised AssertionError"},
    ),
    Row(
        "apply_rope",
        "theta_without_device",
        "torch.arange(0, d, 2, device=x.device, dtype=work)",
        "torch.arange(0, d, 2, dtype=work)",
        {"rope_dtype_device": "create every tensor on the inputs' device (device=x.device)"},
    ),
    Row(
        "apply_rope",
        "positions_truncated",
        "positions.to(work)[..., None]",
        "positions.long().to(work)[..., None]",
        every(ROPE_VALUES[:2], "the positions are cast to integers"),
    ),
    Row(
        "apply_rope",
        "interleaved_angles_in_half",
        "emb = freqs.repeat_interleave(2, dim=-1)",
        "emb = freqs.to(x.dtype).repeat_interleave(2, dim=-1)",
        {"rope_dtype_device": "compute the angles in float32"},
    ),
    Row(
        "apply_rope",
        "batched_angles_in_half",
        "    if positions.dim() == 2:\n",
        "    if positions.dim() == 2:\n        freqs = freqs.to(x.dtype)\n",
        {"rope_dtype_device": "compute the angles in float32"},
    ),
    Row(
        "apply_rope",
        "cos_sin_in_float64",
        "    return (x * emb.cos() + rotated * emb.sin()).to(x.dtype)\n",
        "    return x * emb.double().cos() + rotated * emb.double().sin()\n",
        {"rope_dtype_device": "has dtype torch.float64, expected torch.float32"},
    ),
    Row(
        "alibi_slopes",
        "dtype_ignored",
        RETURN_SLOPES,
        "    return torch.tensor(slopes, device=device)\n",
        {"alibi_slopes_power_of_two": "the dtype argument is ignored"},
    ),
    Row(
        "alibi_slopes",
        "float64_by_default",
        RETURN_SLOPES,
        "    return torch.tensor(slopes, dtype=torch.float64, device=device)\n",
        {"alibi_slopes_power_of_two": "but the default dtype, torch.float32, asks for torch.float32"},
    ),
    Row(
        "alibi_slopes",
        "device_ignored",
        RETURN_SLOPES,
        "    return torch.tensor(slopes, dtype=dtype)\n",
        {"alibi_slopes_power_of_two": "the device argument is ignored"},
    ),
    Row(
        "alibi_slopes",
        "validation_with_assert",
        '    if n_heads < 1:\n        raise ValueError(f"n_heads must be at least 1, got {n_heads}")\n',
        '    assert n_heads >= 1, "n_heads must be at least 1"\n',
        {"alibi_slopes_power_of_two": "raised AssertionError"},
    ),
    Row(
        "alibi_bias",
        "dtype_ignored",
        RETURN_BIAS,
        "    return slopes[:, None, None] * distance\n",
        {"alibi_bias_square": "the dtype argument is ignored"},
    ),
    Row(
        "alibi_bias",
        "device_ignored",
        "alibi_slopes(n_heads, torch.float64, device)",
        "alibi_slopes(n_heads, torch.float64)",
        {"alibi_bias_square": "or on the device argument (device=device)"},
    ),
]


# --- mistakes of another structure


def sinusoidal_encoding__feature_exponent(max_len, d_model, base=10000.0, dtype=torch.float32, device=None):
    if d_model % 2:
        raise ValueError("d_model must be even")
    position = torch.arange(max_len, dtype=torch.float64, device=device).unsqueeze(1)
    div_term = base ** (
        torch.arange(d_model, dtype=torch.float64, device=device) / d_model
    )  # one per feature
    pe = torch.zeros(max_len, d_model, dtype=torch.float64, device=device)
    pe[:, 0::2] = torch.sin(position / div_term[0::2])
    pe[:, 1::2] = torch.cos(position / div_term[1::2])
    return pe.to(dtype)


def sinusoidal_encoding__computed_in_float32(
    max_len, d_model, base=10000.0, dtype=torch.float32, device=None
):
    # the usual float32 code, cast to dtype at the end: a float64 result has float32's precision only
    if d_model % 2:
        raise ValueError("d_model must be even")
    position = torch.arange(max_len, device=device).unsqueeze(1).float()
    div_term = torch.exp(torch.arange(0, d_model, 2, device=device).float() * (-math.log(base) / d_model))
    pe = torch.zeros(max_len, d_model, device=device)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe.to(dtype)


def sinusoidal_encoding__device_ignored(max_len, d_model, base=10000.0, dtype=torch.float32, device=None):
    if d_model % 2:
        raise ValueError("d_model must be even")
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    div_term = base ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angles = position / div_term
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(1).to(dtype)


def apply_rope__cos_sin_table(x, positions, base=10000.0, interleaved=False):
    # a table of cos and sin per integer position, indexed by the positions (as a KV-cache model keeps it)
    d = x.size(-1)
    if d % 2 or positions.dim() not in (1, 2) or positions.size(-1) != x.size(-2):
        raise ValueError("x must have an even d, and positions [len] or [batch, len]")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    theta = 1.0 / base ** (torch.arange(0, d, 2, dtype=work, device=x.device) / d)
    table = torch.arange(int(positions.max()) + 1, dtype=work, device=x.device)[:, None] * theta
    angles = table[positions]  # [(batch,) len, d / 2]
    if positions.dim() == 2:
        angles = angles.view(angles.size(0), *([1] * (x.dim() - 3)), *angles.shape[1:])
    cos, sin = angles.cos(), angles.sin()
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).to(x.dtype)


def alibi_slopes__seed(n_heads, dtype=torch.float32, device=None):
    if n_heads < 1:
        raise ValueError("n_heads must be at least 1")
    return torch.tensor([2.0 ** (-8 - i) for i in range(n_heads)], dtype=dtype, device=device)


def alibi_slopes__no_validation(n_heads, dtype=torch.float32, device=None):
    # the largest power of two found with a loop: n_heads = 0 returns one slope instead of an error
    power = 1
    while power * 2 <= n_heads:
        power *= 2
    slopes = [2 ** (-8 * h / power) for h in range(1, power + 1)]
    slopes += [2 ** (-8 * h / (2 * power)) for h in range(1, 2 * power + 1, 2)][: n_heads - power]
    return torch.tensor(slopes, dtype=dtype, device=device)


def alibi_bias__hand_loops(n_heads, q_len, k_len, dtype=torch.float32, device=None):
    slopes = alibi_slopes(n_heads, dtype, device)  # noqa: F821 (the notebook's own)
    bias = torch.zeros(n_heads, q_len, k_len, dtype=dtype, device=device)
    for i in range(q_len):
        for j in range(i + 1):  # only the causal part: the rest stays 0
            bias[:, i, j] = slopes * (j - i)
    return bias


def alibi_bias__slopes_from_zero(n_heads, q_len, k_len, dtype=torch.float32, device=None):
    # its own slopes, with h from 0: the distances are right, the slopes are not
    slopes = torch.tensor(
        [2 ** (-8 * h / n_heads) for h in range(n_heads)], dtype=torch.float64, device=device
    )
    rows = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    return (slopes[:, None, None] * (torch.arange(k_len, device=device) - rows)).to(dtype)


def alibi_bias__seed_slopes(n_heads, q_len, k_len, dtype=torch.float32, device=None):
    slopes = torch.tensor([2.0 ** (-8 - h) for h in range(n_heads)], dtype=torch.float64, device=device)
    rows = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    return (slopes[:, None, None] * (torch.arange(k_len, device=device) - rows)).to(dtype)


WHOLE = {
    sinusoidal_encoding__feature_exponent: {"sinusoidal_values": "pair i (features 2i and"},
    sinusoidal_encoding__computed_in_float32: {"sinusoidal_values": "some step computes in float32"},
    sinusoidal_encoding__device_ignored: {"sinusoidal_values": "the device argument is ignored"},
    apply_rope__cos_sin_table: {
        **every(ROPE_VALUES[:2], "the positions are used as indices"),
        "rope_dtype_device": "avoid .item(), .tolist()",
    },
    alibi_slopes__seed: every(SLOPES, "for 8 heads each is 128 times too"),
    alibi_slopes__no_validation: {"alibi_slopes_power_of_two": "it should raise ValueError if n_heads < 1"},
    alibi_bias__slopes_from_zero: every(BIAS, "the first slope is 2^0 = 1"),
    alibi_bias__seed_slopes: every(
        BIAS, "but its slopes (bias[h] / (j - i - (k_len - q_len))) are 2^-8, 2^-9"
    ),
    alibi_bias__hand_loops: {
        "alibi_bias_square": "the bias of later keys",
        "alibi_bias_bottom_right": "does not match",
    },
}


# --- right implementations in other styles


def sinusoidal_encoding__exp_log(max_len, d_model, base=10000.0, dtype=torch.float32, device=None):
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
    position = torch.arange(0, max_len, device=device).unsqueeze(1).double()
    div_term = torch.exp(torch.arange(0, d_model, 2, device=device).double() * (-math.log(base) / d_model))
    pe = torch.empty(max_len, d_model, dtype=torch.float64, device=device)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe.to(dtype)


def sinusoidal_encoding__python_loops(max_len, d_model, base=10000.0, dtype=torch.float32, device=None):
    if d_model % 2 == 1:
        raise ValueError("d_model must be even")
    rows = []
    for pos in range(max_len):
        row = []
        for i in range(d_model // 2):
            angle = pos / base ** (2 * i / d_model)
            row += [math.sin(angle), math.cos(angle)]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64).reshape(max_len, d_model).to(dtype=dtype, device=device)


def sinusoidal_encoding__made_on_device(max_len, d_model, base=10000.0, dtype=torch.float32, device=None):
    # made in dtype on device from the start, the angles in float64
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
    i = torch.arange(d_model // 2, dtype=torch.float64, device=device)
    angles = torch.arange(max_len, dtype=torch.float64, device=device)[:, None] * base ** (-2 * i / d_model)
    pe = torch.empty(max_len, d_model, dtype=dtype, device=device)
    pe[:, 0::2], pe[:, 1::2] = angles.sin(), angles.cos()
    return pe


def apply_rope__complex(x, positions, base=10000.0, interleaved=False):
    # Meta's LLaMA style: pairs as complex numbers, multiplied by e^(i p theta)
    d = x.size(-1)
    if d % 2:
        raise ValueError("d must be even")
    if positions.dim() > 2 or positions.dim() == 0 or positions.shape[-1] != x.shape[-2]:
        raise ValueError("positions must be [len] or [batch, len]")
    order = torch.arange(d, device=x.device)
    if not interleaved:  # (x[i], x[i + d/2]) -> adjacent pairs
        order = torch.stack((order[: d // 2], order[d // 2 :]), dim=-1).flatten()
    wide = torch.float64
    theta = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=wide, device=x.device)
    angles = positions.to(wide).unsqueeze(-1) * theta
    while angles.dim() < x.dim():
        angles = angles.unsqueeze(-3) if positions.dim() == 2 else angles.unsqueeze(0)
    pairs = torch.view_as_complex(x[..., order].to(wide).reshape(*x.shape[:-1], d // 2, 2).contiguous())
    turned = torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)
    out = torch.empty_like(turned)
    out[..., order] = turned
    return out.to(x.dtype)


def apply_rope__einsum_rotation(x, positions, base=10000.0, interleaved=False):
    # an explicit 2x2 rotation matrix per pair, applied with einsum
    d = x.size(-1)
    if d % 2 != 0 or positions.ndim not in (1, 2) or positions.size(-1) != x.size(-2):
        raise ValueError(f"bad shapes: x {tuple(x.shape)}, positions {tuple(positions.shape)}")
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    i = torch.arange(d // 2, device=x.device, dtype=dtype)
    angles = positions.to(dtype)[..., None] * torch.exp(-2 * i / d * math.log(base))
    if positions.dim() == 2:
        angles = angles.reshape(angles.size(0), *([1] * (x.dim() - 3)), *angles.shape[1:])
    cos, sin = angles.cos(), angles.sin()
    rotation = torch.stack(
        (torch.stack((cos, -sin), -1), torch.stack((sin, cos), -1)), -2
    )  # [..., d/2, 2, 2]
    if interleaved:
        pairs = x.to(dtype).unflatten(-1, (d // 2, 2))
        return torch.einsum("...pab,...pb->...pa", rotation, pairs).flatten(-2).to(x.dtype)
    pairs = x.to(dtype).unflatten(-1, (2, d // 2)).transpose(-1, -2)  # [..., d/2, 2]
    turned = torch.einsum("...pab,...pb->...pa", rotation, pairs)
    return turned.transpose(-1, -2).flatten(-2).to(x.dtype)


def alibi_slopes__fairseq_recursive(n_heads, dtype=torch.float32, device=None):
    if n_heads < 1:
        raise ValueError("n_heads must be positive")

    def get_slopes(n):
        def power_of_2(n):
            start = 2 ** (-(2 ** -(math.log2(n) - 3)))
            return [start * start**i for i in range(n)]

        if math.log2(n).is_integer():
            return power_of_2(n)
        closest = 2 ** math.floor(math.log2(n))
        return power_of_2(closest) + get_slopes(2 * closest)[0::2][: n - closest]

    return torch.tensor(get_slopes(n_heads), dtype=torch.float64).to(device=device, dtype=dtype)


def alibi_slopes__torch_float32(n_heads, dtype=torch.float32, device=None):
    # computed with tensors in float32, then cast: dtype is the result's dtype
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")
    p = 2 ** int(math.log2(n_heads))
    slopes = 2.0 ** (-8.0 * torch.arange(1, p + 1, device=device) / p)
    extra = 2.0 ** (-8.0 * torch.arange(1, 2 * p + 1, 2, device=device) / (2 * p))
    return torch.cat((slopes, extra[: n_heads - p])).to(dtype)


def alibi_bias__outer_difference(n_heads, q_len, k_len, dtype=torch.float32, device=None):
    slopes = alibi_slopes(n_heads, torch.float64, device)  # noqa: F821 (the notebook's own)
    offset = k_len - q_len
    rows = torch.arange(q_len, dtype=torch.float64, device=device)[:, None] + offset
    cols = torch.arange(k_len, dtype=torch.float64, device=device)[None, :]
    return torch.einsum("h,ij->hij", slopes, cols - rows).to(dtype)


def alibi_bias__in_dtype(n_heads, q_len, k_len, dtype=torch.float32, device=None):
    # the slopes in dtype on device, times the integer distances
    distance = torch.arange(k_len, device=device) - torch.arange(k_len - q_len, k_len, device=device)[:, None]
    return alibi_slopes(n_heads, dtype=dtype, device=device).view(-1, 1, 1) * distance  # noqa: F821


RIGHT = [
    sinusoidal_encoding__exp_log,
    sinusoidal_encoding__python_loops,
    sinusoidal_encoding__made_on_device,
    apply_rope__complex,
    apply_rope__einsum_rotation,
    alibi_slopes__fairseq_recursive,
    alibi_slopes__torch_float32,
    alibi_bias__outer_difference,
    alibi_bias__in_dtype,
]
