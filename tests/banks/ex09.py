"""Implementations of exercise ex09 that a learner could plausibly write: wrong ones and right ones.

Every implementation is self-contained (``torch``, ``math``, ``nn`` and ``F`` of the setup cell, and the
notebook's own functions above it), so that its source is also a submission's solution cell. ``ROWS`` are
one-line mistakes applied to ``BASES``; ``WHOLE`` holds mistakes of another structure; ``RIGHT`` correct
implementations in other styles, which every cell must accept. Expectations name *exactly* the test cells that
reject an implementation (see ``_bank.py``).
"""

import torch
import torch.nn.functional as F

from tests.banks._bank import Row

BASES = {
    "quadratic_relative_encoding": """def quadratic_relative_encoding(
    height, width, dtype=torch.float32, device=None
):
    rows = torch.arange(height, device=device).repeat_interleave(width)
    cols = torch.arange(width, device=device).repeat(height)
    d1 = rows[None, :] - rows[:, None]
    d2 = cols[None, :] - cols[:, None]
    return torch.stack((d1**2 + d2**2, d1, d2), dim=-1).to(dtype)
""",
    "attention_conv2d": """def attention_conv2d(x, weight, bias=None, alpha=50.0):
    c_out, c_in, k, k2 = weight.shape
    if k != k2 or k % 2 == 0:
        raise ValueError(f"the kernel must be square with an odd side, got {k} x {k2}")
    if c_in != x.size(1):
        raise ValueError(f"the kernel has {c_in} input channels, x has {x.size(1)}")
    batch, _, height, width = x.shape
    pad = k // 2
    padded = F.pad(x, (pad, pad, pad, pad))
    r = quadratic_relative_encoding(height + 2 * pad, width + 2 * pad).to(x)
    index = torch.arange(height + 2 * pad).view(-1, 1) * (width + 2 * pad) + torch.arange(width + 2 * pad)
    r = r[index[pad : pad + height, pad : pad + width].flatten()]
    values = padded.flatten(2).transpose(1, 2)
    out = 0
    for a in range(k):
        for b in range(k):
            v = torch.tensor([1.0, -2.0 * (a - k // 2), -2.0 * (b - k // 2)], dtype=x.dtype, device=x.device)
            v = -alpha * v
            weights = torch.softmax(r @ v, dim=-1)
            out = out + weights @ values @ weight[:, :, a, b].T
    if bias is not None:
        out = out + bias
    return out.transpose(1, 2).reshape(batch, c_out, height, width)
""",
}

MUST_BE_CORRECT = "must be correct before it counts as written from scratch"
VALUES = ("conv_matches_conv2d", "conv_is_attention", "conv_from_scratch")
ENCODING = ("encoding_shape", "encoding_values")
STACK = "(d1**2 + d2**2, d1, d2)"
VALIDATION = (
    "    if k != k2 or k % 2 == 0:\n"
    '        raise ValueError(f"the kernel must be square with an odd side, got {k} x {k2}")\n'
    "    if c_in != x.size(1):\n"
    '        raise ValueError(f"the kernel has {c_in} input channels, x has {x.size(1)}")\n'
)


def every(cells, fragment):
    return dict.fromkeys(cells, fragment)


def values(fragment, limit="", attention=""):
    """The value cells: conv2d's with ``fragment``, attention's with ``attention`` (default the same)."""
    return {
        "conv_matches_conv2d": limit or fragment,
        "conv_is_attention": attention or fragment,
        "conv_from_scratch": MUST_BE_CORRECT,
    }


ROWS = [
    Row(
        "quadratic_relative_encoding",
        "q_minus_k",
        "d1 = rows[None, :] - rows[:, None]\n    d2 = cols[None, :] - cols[:, None]",
        "d1 = rows[:, None] - rows[None, :]\n    d2 = cols[:, None] - cols[None, :]",
        {"encoding_values": "the shift is q - k"},
    ),
    Row(
        "quadratic_relative_encoding",
        "features_order",
        STACK,
        "(d1, d2, d1**2 + d2**2)",
        {"encoding_values": "the features are in another order"},
    ),
    Row(
        "quadratic_relative_encoding",
        "columns_first",
        STACK,
        "(d1**2 + d2**2, d2, d1)",
        {"encoding_values": "delta_1 is the shift in columns"},
    ),
    Row(
        "quadratic_relative_encoding",
        "column_major",
        "rows = torch.arange(height, device=device).repeat_interleave(width)\n"
        "    cols = torch.arange(width, device=device).repeat(height)",
        "rows = torch.arange(height, device=device).repeat(width)\n"
        "    cols = torch.arange(width, device=device).repeat_interleave(height)",
        {"encoding_values": "numbered column by column"},
    ),
    Row(
        "quadratic_relative_encoding",
        "norm_not_squared",
        STACK,
        "((d1**2 + d2**2) ** 0.5, d1, d2)",
        {"encoding_values": "not its square"},
    ),
    Row(
        "quadratic_relative_encoding",
        "components_squared",
        STACK,
        "(d1**2 + d2**2, d1**2, d2**2)",
        {"encoding_values": "the last two features are squared"},
    ),
    Row(
        "quadratic_relative_encoding",
        "no_squared_norm",
        STACK,
        "(d1, d2)",
        every(ENCODING, "the squared norm ||delta||^2 is missing"),
    ),
    Row(
        "quadratic_relative_encoding",
        "image_axes_kept",
        "    return torch.stack((d1**2 + d2**2, d1, d2), dim=-1).to(dtype)\n",
        "    out = torch.stack((d1**2 + d2**2, d1, d2), dim=-1).to(dtype)\n"
        "    return out.view(height, width, height, width, 3)\n",
        every(ENCODING, "flatten the pixels"),
    ),
    Row(
        "attention_conv2d",
        "no_padding",
        "    pad = k // 2\n",
        "    pad = 0\n",
        values("the image is not zero-padded"),
    ),
    Row(
        "attention_conv2d",
        "flipped_kernel",
        "weight[:, :, a, b].T",
        "weight[:, :, k - 1 - a, k - 1 - b].T",
        values("the kernel is flipped"),
    ),
    Row(
        "attention_conv2d",
        "transposed_kernel",
        "weight[:, :, a, b].T",
        "weight[:, :, b, a].T",
        values("the kernel is transposed"),
    ),
    Row(
        "attention_conv2d",
        "alpha_sign",
        "v = -alpha * v",
        "v = alpha * v",
        values("the wrong sign"),
    ),
    Row(
        "attention_conv2d",
        "shifts_from_zero",
        "[1.0, -2.0 * (a - k // 2), -2.0 * (b - k // 2)]",
        "[1.0, -2.0 * a, -2.0 * b]",
        values("the shifts run from 0 to K - 1"),
    ),
    Row(
        "attention_conv2d",
        "no_bias",
        "        out = out + bias\n",
        "        out = out\n",
        values("the bias is not added"),
    ),
    Row(
        "attention_conv2d",
        "bias_per_head",
        "        out = out + bias\n",
        "        out = out + k * k * bias  # once per head\n",
        values("K^2 times"),
    ),
    Row(
        "attention_conv2d",
        "softmax_over_queries",
        "torch.softmax(r @ v, dim=-1)",
        "torch.softmax(r @ v, dim=-2)",
        values("the softmax runs over the queries"),
    ),
    Row(
        "attention_conv2d",
        "kernel_not_transposed",
        "weight[:, :, a, b].T",
        "weight[:, :, a, b]",
        {
            **every(("conv_shapes", "conv_matches_conv2d", "conv_is_attention"), "[C_in, C_out]"),
            "conv_from_scratch": MUST_BE_CORRECT,
        },
    ),
    Row(
        "attention_conv2d",
        "channels_last",
        "    return out.transpose(1, 2).reshape(batch, c_out, height, width)\n",
        "    return out.reshape(batch, height, width, c_out)\n",
        {
            **every(("conv_shapes", "conv_matches_conv2d", "conv_is_attention"), "the channels are last"),
            "conv_from_scratch": MUST_BE_CORRECT,
        },
    ),
    # the documented arguments, dtypes, devices and errors
    Row(
        "quadratic_relative_encoding",
        "dtype_ignored",
        ".to(dtype)\n",
        ".float()\n",
        {"encoding_shape": "but dtype=torch.float64 asks for torch.float64"},
    ),
    Row(
        "quadratic_relative_encoding",
        "integer_shifts",
        ".to(dtype)\n",
        "\n",
        {"encoding_shape": "has dtype torch.int64, but the default dtype, torch.float32, asks"},
    ),
    Row(
        "quadratic_relative_encoding",
        "device_ignored",
        "rows = torch.arange(height, device=device).repeat_interleave(width)\n"
        "    cols = torch.arange(width, device=device).repeat(height)",
        "rows = torch.arange(height).repeat_interleave(width)\n    cols = torch.arange(width).repeat(height)",
        {"encoding_shape": "the device argument is ignored"},
    ),
    Row(
        "attention_conv2d",
        "no_validation",
        VALIDATION,
        "",
        {"conv_shapes": "it should raise ValueError if the kernel's side (2) is even"},
    ),
    Row(
        "attention_conv2d",
        "validation_with_assert",
        VALIDATION,
        '    assert k == k2 and k % 2 == 1, "bad kernel"\n    assert c_in == x.size(1), "bad channels"\n',
        {"conv_shapes": "raised AssertionError"},
    ),
    Row(
        "attention_conv2d",
        "no_defaults",
        "def attention_conv2d(x, weight, bias=None, alpha=50.0):",
        "def attention_conv2d(x, weight, bias, alpha):",
        {"conv_matches_conv2d": "keep the signature given in the task", "conv_from_scratch": MUST_BE_CORRECT},
    ),
]


# --- mistakes of another structure


def attention_conv2d__conv2d(x, weight, bias=None, alpha=50.0):
    if weight.size(-1) != weight.size(-2) or weight.size(-1) % 2 == 0 or weight.size(1) != x.size(1):
        raise ValueError("the kernel must be square, odd, with x's channels")
    return F.conv2d(x, weight, bias, padding=weight.size(-1) // 2)


def attention_conv2d__hard_one_hot(x, weight, bias=None, alpha=50.0):
    # hard attention: each head takes the pixel at q + Delta (a convolution written with shifts)
    if weight.size(-1) != weight.size(-2) or weight.size(-1) % 2 == 0 or weight.size(1) != x.size(1):
        raise ValueError("the kernel must be square, odd, with x's channels")
    c_out, _, k, _ = weight.shape
    pad = k // 2
    padded = F.pad(x, (pad, pad, pad, pad))
    height, width = x.shape[-2:]
    out = torch.zeros(x.size(0), c_out, height, width, dtype=x.dtype, device=x.device)
    for a in range(k):
        for b in range(k):
            window = padded[:, :, a : a + height, b : b + width]
            out = out + torch.einsum("bchw,oc->bohw", window, weight[:, :, a, b])
    return out if bias is None else out + bias.view(1, -1, 1, 1)


def attention_conv2d__query_minus_key(x, weight, bias=None, alpha=50.0):
    if weight.size(-1) != weight.size(-2) or weight.size(-1) % 2 == 0 or weight.size(1) != x.size(1):
        raise ValueError("the kernel must be square, odd, with x's channels")
    c_out, _, k, _ = weight.shape
    batch, _, height, width = x.shape
    pad = k // 2
    padded = F.pad(x, (pad, pad, pad, pad))
    ys, xs = torch.meshgrid(torch.arange(height + 2 * pad), torch.arange(width + 2 * pad), indexing="ij")
    keys = torch.stack((ys.flatten(), xs.flatten()), -1).to(x)
    queries = keys.view(height + 2 * pad, width + 2 * pad, 2)[pad : pad + height, pad : pad + width].reshape(
        -1, 2
    )
    delta = queries[:, None, :] - keys[None, :, :]  # q - k
    values = padded.flatten(2).transpose(1, 2)
    out = 0
    for a in range(k):
        for b in range(k):
            centre = torch.tensor([a - pad, b - pad], dtype=x.dtype, device=x.device)
            weights = torch.softmax(-alpha * ((delta - centre) ** 2).sum(-1), dim=-1)
            out = out + weights @ values @ weight[:, :, a, b].T
    if bias is not None:
        out = out + bias
    return out.transpose(1, 2).reshape(batch, c_out, height, width)


def attention_conv2d__sdpa(x, weight, bias=None, alpha=50.0):
    # right values, but PyTorch's attention takes the softmax: zero content, positional scores as the mask
    if weight.size(-1) != weight.size(-2) or weight.size(-1) % 2 == 0 or weight.size(1) != x.size(1):
        raise ValueError("the kernel must be square, odd, with x's channels")
    c_out, _, k, _ = weight.shape
    batch, _, height, width = x.shape
    pad = k // 2
    pixels = F.pad(x, (pad, pad, pad, pad)).flatten(2).transpose(1, 2)  # [batch, keys, C_in]
    r = quadratic_relative_encoding(height + 2 * pad, width + 2 * pad).to(x)  # noqa: F821 (the notebook's own)
    index = torch.arange((height + 2 * pad) * (width + 2 * pad)).view(height + 2 * pad, width + 2 * pad)
    r = r[index[pad : pad + height, pad : pad + width].flatten()]
    shifts = torch.cartesian_prod(torch.arange(k), torch.arange(k)).to(x) - pad
    v = -alpha * torch.cat((torch.ones(k * k, 1).to(x), -2 * shifts), dim=1)
    scores = torch.einsum("qkd,hd->hqk", r, v)
    zeros = torch.zeros(batch, k * k, height * width, 1).to(x)
    keys = torch.zeros(batch, k * k, r.size(1), 1).to(x)
    values = pixels.unsqueeze(1) @ weight.flatten(2).permute(2, 1, 0)  # [batch, heads, keys, C_out]
    heads = F.scaled_dot_product_attention(zeros, keys, values, attn_mask=scores)
    out = heads.sum(dim=1) + (bias if bias is not None else 0)
    return out.transpose(1, 2).reshape(batch, c_out, height, width)


def attention_conv2d__unshifted_softmax(x, weight, bias=None, alpha=50.0):
    # the encoding's scores and a softmax written out without subtracting the maximum: exp(400) overflows in
    # float32 for a 5 x 5 kernel
    c_out, c_in, k, k2 = weight.shape
    if k != k2 or k % 2 == 0 or c_in != x.size(1):
        raise ValueError("the kernel must be square, odd, with x's channels")
    batch, _, height, width = x.shape
    p = k // 2
    r = quadratic_relative_encoding(height + 2 * p, width + 2 * p).to(x)  # noqa: F821 (the notebook's own)
    grid = torch.arange((height + 2 * p) * (width + 2 * p), device=x.device).view(height + 2 * p, -1)
    r = r[grid[p : p + height, p : p + width].flatten()]
    values = F.pad(x, (p, p, p, p)).flatten(2).transpose(1, 2)  # [batch, keys, C_in]
    out = torch.zeros(batch, height * width, c_out, dtype=x.dtype, device=x.device)
    for a in range(k):
        for b in range(k):
            v = -alpha * torch.tensor([1.0, -2.0 * (a - p), -2.0 * (b - p)], dtype=x.dtype, device=x.device)
            e = torch.exp(r @ v)
            out = out + (e / e.sum(-1, keepdim=True)) @ values @ weight[:, :, a, b].T
    if bias is not None:
        out = out + bias
    return out.transpose(1, 2).reshape(batch, c_out, height, width)


def attention_conv2d__one_max_for_all_heads(x, weight, bias=None, alpha=50.0):
    # every head's scores at once, shifted by their single largest value: in float32 the heads whose scores
    # are far below it underflow to 0 / 0
    c_out, c_in, k, k2 = weight.shape
    if k != k2 or k % 2 == 0 or c_in != x.size(1):
        raise ValueError("the kernel must be square, odd, with x's channels")
    batch, _, height, width = x.shape
    p = k // 2
    r = quadratic_relative_encoding(height + 2 * p, width + 2 * p).to(x)  # noqa: F821 (the notebook's own)
    grid = torch.arange((height + 2 * p) * (width + 2 * p), device=x.device).view(height + 2 * p, -1)
    r = r[grid[p : p + height, p : p + width].flatten()]
    shifts = torch.cartesian_prod(torch.arange(k), torch.arange(k)).to(x) - p
    v = -alpha * torch.cat((torch.ones(k * k, 1).to(x), -2 * shifts), dim=1)  # [heads, 3]
    scores = torch.einsum("qkd,hd->hqk", r, v)
    e = torch.exp(scores - scores.max())
    weights = e / e.sum(-1, keepdim=True)
    values = F.pad(x, (p, p, p, p)).flatten(2)  # [batch, C_in, keys]
    out = torch.einsum("hqk,bck,och->boq", weights, values, weight.flatten(2))
    if bias is not None:
        out = out + bias[:, None]
    return out.reshape(batch, c_out, height, width)


def attention_conv2d__float64_inside(x, weight, bias=None, alpha=50.0):
    # computed in float64 for accuracy, and returned so: a float32 x gives a float64 result
    c_out, c_in, k, k2 = weight.shape
    if k != k2 or k % 2 == 0 or c_in != x.size(1):
        raise ValueError("the kernel must be square, odd, with x's channels")
    batch, _, height, width = x.shape
    p = k // 2
    on = {"device": x.device, "dtype": torch.float64}
    kh, kw = height + 2 * p, width + 2 * p
    r = quadratic_relative_encoding(kh, kw, **on)  # noqa: F821 (the notebook's own)
    r = r[torch.arange(kh * kw, device=x.device).view(kh, kw)[p : p + height, p : p + width].flatten()]
    shifts = torch.cartesian_prod(torch.arange(k), torch.arange(k)).to(**on) - p
    v = -alpha * torch.cat((torch.ones(k * k, 1, **on), -2 * shifts), dim=1)
    weights = torch.softmax(torch.einsum("qkd,hd->hqk", r, v), dim=-1)
    padded = F.pad(x, (p, p, p, p)).double().flatten(2)
    out = torch.einsum("hqk,bck,och->boq", weights, padded, weight.double().flatten(2))
    if bias is not None:
        out = out + bias.double()[:, None]
    return out.view(batch, c_out, height, width)


WHOLE = {
    attention_conv2d__conv2d: {
        "conv_is_attention": "the result is the convolution itself",
        "conv_from_scratch": "calls",
    },
    attention_conv2d__hard_one_hot: {"conv_is_attention": "the result is the convolution itself"},
    attention_conv2d__query_minus_key: values("the kernel is flipped"),
    attention_conv2d__sdpa: {"conv_from_scratch": "calls"},
    attention_conv2d__unshifted_softmax: {
        "conv_matches_conv2d": "a softmax written out without subtracting each row's maximum",
        "conv_from_scratch": MUST_BE_CORRECT,
    },
    attention_conv2d__one_max_for_all_heads: {
        "conv_matches_conv2d": "or with one maximum for every head",
        "conv_from_scratch": MUST_BE_CORRECT,
    },
    attention_conv2d__float64_inside: {"conv_shapes": "has dtype torch.float64, expected torch.float32"},
}


# --- right implementations in other styles


def quadratic_relative_encoding__meshgrid(height, width, dtype=torch.float32, device=None):
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    pixels = torch.stack((ys, xs), dim=-1).reshape(-1, 2).double()
    delta = pixels.unsqueeze(0) - pixels.unsqueeze(1)  # [q, k, 2] = k - q
    return torch.cat(((delta**2).sum(-1, keepdim=True), delta), dim=-1).to(device=device, dtype=dtype)


def quadratic_relative_encoding__loops(height, width, dtype=torch.float32, device=None):
    n = height * width
    r = torch.zeros(n, n, 3, dtype=dtype, device=device)
    for q in range(n):
        for k in range(n):
            d1, d2 = k // width - q // width, k % width - q % width
            r[q, k] = torch.tensor([d1 * d1 + d2 * d2, d1, d2], dtype=dtype, device=device)
    return r


def attention_conv2d__einsum_heads(x, weight, bias=None, alpha=50.0):
    # all heads at once: scores [heads, queries, keys], then one einsum; float64 inside, cast back
    if weight.dim() != 4 or weight.size(2) != weight.size(3) or weight.size(2) % 2 != 1:
        raise ValueError(f"weight must be [C_out, C_in, K, K] with K odd, got {list(weight.shape)}")
    if weight.size(1) != x.size(1):
        raise ValueError("weight's C_in differs from x's")
    c_out, _, k, _ = weight.shape
    batch, _, height, width = x.shape
    p = k // 2
    padded = F.pad(x, (p, p, p, p)).double()
    on = {"device": x.device, "dtype": torch.float64}
    kh, kw = height + 2 * p, width + 2 * p
    r = quadratic_relative_encoding(kh, kw).to(**on)  # noqa: F821 (the notebook's own)
    grid = torch.arange(kh * kw, device=x.device).view(kh, kw)
    r = r[grid[p : p + height, p : p + width].flatten()]
    shifts = torch.cartesian_prod(torch.arange(k), torch.arange(k)).to(**on) - p  # [heads, 2]
    v = -alpha * torch.cat((torch.ones(k * k, 1, **on), -2 * shifts), dim=1)
    weights = torch.softmax(torch.einsum("qkd,hd->hqk", r, v), dim=-1)
    w = weight.double().flatten(2).permute(2, 1, 0)  # [heads, C_in, C_out]
    out = torch.einsum("hqk,bck,hco->boq", weights, padded.flatten(2), w).view(batch, c_out, height, width)
    if bias is not None:
        out = out + bias.double().view(1, -1, 1, 1)
    return out.to(x.dtype)


def attention_conv2d__stable_by_hand(x, weight, bias=None, alpha=50.0):
    # squared distances directly, a softmax written out (max subtracted), the padded image as keys
    c_out, c_in, k, k_w = weight.shape
    if k != k_w or not k % 2 or c_in != x.shape[1]:
        raise ValueError("expected a square kernel of odd side with x's input channels")
    batch, _, height, width = x.shape
    p = k // 2
    keys = F.pad(x, (p, p, p, p)).flatten(2)  # [batch, C_in, keys]
    kh, kw = height + 2 * p, width + 2 * p
    key_pos = torch.stack(torch.meshgrid(torch.arange(kh), torch.arange(kw), indexing="ij"), -1).view(-1, 2)
    query_pos = key_pos.view(kh, kw, 2)[p : p + height, p : p + width].reshape(-1, 2)
    delta = (key_pos[None] - query_pos[:, None]).to(x)
    out = torch.zeros(batch, c_out, height * width, dtype=x.dtype, device=x.device)
    for a in range(k):
        for b in range(k):
            centre = torch.tensor([a - p, b - p], dtype=x.dtype, device=x.device)
            scores = -alpha * ((delta - centre) ** 2).sum(-1)
            e = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
            attn = e / e.sum(dim=-1, keepdim=True)  # [queries, keys]
            head = torch.einsum("qk,bck->bcq", attn, keys)
            out = out + torch.einsum("oc,bcq->boq", weight[:, :, a, b], head)
    if bias is not None:
        out = out + bias[:, None]
    return out.view(batch, c_out, height, width)


def attention_conv2d__distances_unshifted(x, weight, bias=None, alpha=50.0):
    # scores -alpha ||delta - Delta||^2, whose largest value is 0 in every row (the key q + Delta is in the
    # padded image): exp() needs no shift here
    c_out, c_in, k, k_w = weight.shape
    if k_w != k or k % 2 == 0:
        raise ValueError(f"the kernel must be square with an odd side, got {k} x {k_w}")
    if c_in != x.size(1):
        raise ValueError(f"C_in: kernel {c_in}, x {x.size(1)}")
    batch, _, height, width = x.shape
    p = k // 2
    ys, xs = torch.meshgrid(torch.arange(height + 2 * p), torch.arange(width + 2 * p), indexing="ij")
    keys = torch.stack((ys, xs), -1).flatten(0, 1).to(x)  # [keys, 2]
    queries = torch.stack((ys, xs), -1)[p : p + height, p : p + width].flatten(0, 1).to(x)
    shifts = torch.cartesian_prod(torch.arange(k), torch.arange(k)).to(x) - p  # [heads, 2]
    delta = keys[None, None] - queries[None, :, None] - shifts[:, None, None]  # [heads, queries, keys, 2]
    e = torch.exp(-alpha * delta.pow(2).sum(-1))
    weights = e / e.sum(-1, keepdim=True)
    values = F.pad(x, (p, p, p, p)).flatten(2)  # [batch, C_in, keys]
    out = torch.einsum("hqk,bck,och->boq", weights, values, weight.flatten(2))
    if bias is not None:
        out = out + bias.view(1, -1, 1)
    return out.reshape(batch, c_out, height, width)


RIGHT = [
    quadratic_relative_encoding__meshgrid,
    quadratic_relative_encoding__loops,
    attention_conv2d__einsum_heads,
    attention_conv2d__stable_by_hand,
    attention_conv2d__distances_unshifted,
]
