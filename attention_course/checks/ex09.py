"""Checks of exercise ex09: the quadratic relative encoding, and K^2 attention heads that are a convolution.

The layer is judged twice: for a large ``alpha`` against ``F.conv2d(padding=K // 2)`` (the limit that
Cordonnier, Loukas and Jaggi prove), and for small ``alpha`` against the attention formula written out here
(each head's softmax over the keys of the zero-padded image), where it is *not* a convolution: a learner who
returns ``F.conv2d`` or puts hard one-hot weights passes the first and fails the second, as they should. The
known mistakes are rows of one parametrised computation, :func:`attention`. Each value cell runs a float32
case with a 5 x 5 kernel, whose scores reach ``alpha ||Delta||^2 = 400``: a softmax without its maximum
subtracted overflows there (``exp(400)`` is inf in float32, not in float64).

The encoding's ``dtype`` and ``device`` are checked as ex08 checks its functions that make a tensor from sizes
(:mod:`~attention_course.checks.position_family`: the dtype by name, the ``meta`` device).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from attention_course.checks import engine
from attention_course.checks.engine import Check, Mistake, Part, assert_values, behaviour, fail, randn
from attention_course.checks.position_family import DTYPED, HERE, META, made_check, named, row_mistakes

engine.meta_ready_in_a_notebook()  # the set-up cell imports the checks: no test cell waits for it

TEXT = engine.table("""
q minus k: the shift is q - k: the paper's (and the task's) is delta = k - q, the key's pixel minus the
    query's
features order: the features are in another order: r = (||delta||^2, delta_1, delta_2)
columns first: delta_1 is the shift in columns: it is the shift in rows (delta_1), then in columns (delta_2)
column-major: the pixels are numbered column by column: number them row by row, index = row * width + col (as
    x.flatten(-2) does)
norm not squared: the first feature is ||delta||, not its square ||delta||^2
components squared: the last two features are squared: they are delta_1 and delta_2 themselves
no padding: the image is not zero-padded: pad it by K // 2 (F.pad) so that the keys include the zeros around
    it, as conv2d(padding=K // 2) does; otherwise the heads at the border look at the nearest pixel inside
flipped: the kernel is flipped (a true convolution): head Delta attends to q - Delta, so the shift is q - k
    somewhere, or the kernel index is reversed. conv2d is a cross-correlation: out[q] = sum_Delta W[Delta]
    x[q + Delta], with delta = k - q
transposed kernel: the kernel is transposed: weight[:, :, a, b] belongs to Delta = (a - K//2, b - K//2), a the
    row shift and b the column shift
alpha sign: the heads' vector has the wrong sign: v = -alpha (1, -2 Delta_1, -2 Delta_2), so that the score
    -alpha ||delta - Delta||^2 is largest at delta = Delta
shifts from zero: the shifts run from 0 to K - 1: they are centred, Delta = (a - K//2, b - K//2)
bias per head: the bias is added by every head (K^2 times): add it once, after summing the heads
no bias: the bias is not added
softmax over queries: the softmax runs over the queries: each head's weights sum to 1 over the keys (dim=-1)
unstable: a softmax written out without subtracting each row's maximum (per head and query, over the keys:
    scores.amax(dim=-1, keepdim=True)), or with one maximum for every head, which leaves the other heads' rows
    at exp(-400) = 0 and 0 / 0: subtract each row's own maximum, or call torch.softmax(scores, dim=-1)
hard: the result is the convolution itself, at this alpha too: with alpha = {alpha} each head's softmax
    spreads its weight over a neighbourhood (weights exp(-alpha ||delta - Delta||^2), normalised), so the
    layer is not a convolution. Compute the softmax of the scores; do not call F.conv2d or put one-hot weights
encoding hw hw 3: the features of each pair are [||delta||^2, delta_1, delta_2]: that is the shape
encoding h w h w 3: flatten the pixels: [H * W, H * W, 3], pixel index row * width + col
encoding hw hw 2: the squared norm ||delta||^2 is missing: three features, (||delta||^2, delta_1, delta_2)
encoding 3 hw hw: put the features last: [H * W, H * W, 3]
conv batch c_in h w: the result has C_in channels: each head's value-output map is weight[:, :, a, b]^T,
    [C_in, C_out]
conv batch h w c_out: the channels are last: return [batch, C_out, height, width]
conv batch c_out hw: reshape the pixels back into the image: [batch, C_out, height, width]
""")
HINTS = engine.hint_table("""
mat1 and mat2 shapes | size of tensor | must match the size: each head maps the C_in channels of a pixel to
    C_out with weight[:, :, a, b]^T, [C_in, C_out]; the checks use C_in != C_out
""")
ENCODING_HINTS = engine.hint_table("""
meta tensor | expected device: the check passes device='meta' (a device of shapes without data, so that it
    needs no GPU): create every tensor with device=device, and avoid .item(), .tolist() and Python loops over
    a tensor's values
""")
VALIDATION = (
    "check the kernel first and raise ValueError(...) with a message: when weight.size(-2) != "
    "weight.size(-1) or the side is even, and when weight.size(1) != x.size(1)"
)
# The learner's docstrings clause by clause, and the behaviours that check each (tests/test_contracts.py).
CONTRACT = engine.table("""
quadratic_relative_encoding height: encoding_shape, encoding_values; 1 .. 5 rows, pixels numbered row by row
quadratic_relative_encoding width: encoding_shape, encoding_values; 1 .. 5 columns, every height != width too
quadratic_relative_encoding dtype: encoding_shape; float32 by default, float64, float16 (visible), bfloat16
    (hidden)
quadratic_relative_encoding device: encoding_shape; 'meta' as a torch.device and as a string (no GPU
    needed), the CPU by default; the checks' device, hidden
quadratic_relative_encoding returns: encoding_shape, encoding_values; [H * W, H * W, 3], queries, keys,
    (||delta||^2, delta_1, delta_2) with delta = k - q, of dtype on device
attention_conv2d x: conv_shapes, conv_matches_conv2d, conv_is_attention; [batch, C_in, height, width],
    float32 and float64, every size different, left unchanged
attention_conv2d weight: conv_shapes, conv_matches_conv2d, conv_is_attention; K = 3 and 5 (visible), 1, 3
    and 5 (hidden), C_in != C_out, weight[:, :, a, b] for Delta = (a - K//2, b - K//2), left unchanged
attention_conv2d bias: conv_matches_conv2d, conv_is_attention; a tensor [C_out] added once, None, and left out
    (its default None)
attention_conv2d alpha: conv_matches_conv2d, conv_is_attention; 50 (its default too), 3, 1, 0.5 and 0.25
attention_conv2d returns: conv_shapes, conv_matches_conv2d; [batch, C_out, height, width] of x's dtype and
    device; F.conv2d(padding=K // 2) for alpha = 50
attention_conv2d raises ValueError: conv_shapes; an even side, a kernel that is not square, C_in other than
    x's
attention_conv2d softmax over the keys: conv_matches_conv2d, conv_is_attention; float32 with scores up to 400
    (a softmax needs each row's maximum subtracted), small alpha against the formula
attention_conv2d zero padding: conv_matches_conv2d, conv_is_attention; the border pixels' heads see zeros
attention_conv2d from scratch: conv_from_scratch; no convolution, unfold or built-in attention
""")


# PyTorch's convolutions compute the answer; its attention would take the softmax that the task asks for
RULE = engine.FromScratch(
    "the convolution as attention heads, with your own softmax of the scores",
    ("conv1d", "conv2d", "conv3d", "convolution", "unfold", "scaled_dot_product", "multi_head_attention"),
)


# --- 1. the encoding


def encoding(height: int, width: int, row: str = "") -> torch.Tensor:
    """The quadratic relative encoding as a row computes it, float64 (check code)."""
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    if row == "column-major":
        rows, cols = rows.T, cols.T
    pixels = torch.stack((rows.flatten(), cols.flatten()), dim=-1).double()  # [H * W, 2]
    delta = pixels[None, :, :] - pixels[:, None, :]  # [query, key, 2]: k - q
    if row == "q minus k":
        delta = -delta
    if row == "columns first":
        delta = delta.flip(-1)
    squared = delta.pow(2).sum(-1, keepdim=True)
    if row == "norm not squared":
        squared = squared.sqrt()
    if row == "components squared":
        delta = delta.pow(2)
    if row == "features order":
        return torch.cat((delta, squared), dim=-1)
    return torch.cat((squared, delta), dim=-1)


ENCODING_ROWS = ("q minus k", "features order", "columns first", "column-major", "norm not squared")
ENCODING_ROWS += ("components squared",)
# a 2 x 2 image, written out: pixels 0 (0, 0), 1 (0, 1), 2 (1, 0), 3 (1, 1); r[q, k] = (||k - q||^2, k - q)
BY_HAND = [
    [[0, 0, 0], [1, 0, 1], [1, 1, 0], [2, 1, 1]],
    [[1, 0, -1], [0, 0, 0], [2, 1, -1], [1, 1, 0]],
    [[1, -1, 0], [2, -1, 1], [0, 0, 0], [1, 0, 1]],
    [[2, -1, -1], [1, -1, 0], [1, 0, -1], [0, 0, 0]],
]


def _written(height: int, width: int) -> torch.Tensor:
    """The visible parts' answer: :data:`BY_HAND` for a 2 x 2 image, else :func:`encoding`."""
    by_hand = (height, width) == (2, 2)
    return torch.tensor(BY_HAND, dtype=torch.float64) if by_hand else encoding(height, width)


def _encoding_check(part: Part, arguments: dict[str, Any], values: bool = False) -> Check:
    """The encoding's shape, dtype and device, or (``values``) its values, which may be integers."""
    height, width = arguments["height"], arguments["width"]
    n = height * width
    shape, hints = (n, n, 3), engine.shapes(TEXT, "encoding", hw=n, h=height, w=width)
    if not values:
        return made_check(part, arguments, shape, hints)
    options = {"written": _written, "where": "the encoding returned by {call}", "formats": False}
    return made_check(part, arguments, shape, hints, encoding, ENCODING_ROWS, TEXT, **options)


# the calls of encoding_shape that pass dtype (by name) and device
ENCODING_OPTIONS = {
    False: (
        {"height": 3, "width": 2, "dtype": "torch.float64"},
        {"height": 2, "width": 2, "device": META},
        {"height": 1, "width": 3, "dtype": "torch.float16", "device": "meta"},
    ),
    True: (
        {"height": 4, "width": 3, "dtype": "torch.bfloat16"},
        {"height": 2, "width": 5, "dtype": "torch.float64", "device": "cpu"},
        {"height": 3, "width": 3, "device": "meta"},
        {"height": 2, "width": 2, "dtype": "torch.float64", "device": META},
        {"height": 2, "width": 3, "device": HERE},
    ),
}


@behaviour(function="quadratic_relative_encoding", points=1, hints=ENCODING_HINTS, driver=DTYPED)
def encoding_shape(part: Part) -> Iterator[Check]:
    """quadratic_relative_encoding(height, width) returns a tensor [height * width, height * width, 3].

    Of ``dtype`` (float32 by default, float64, half precision) on ``device`` (checked on ``meta``).
    """
    sizes = ((2, 3), (4, 4)) if not part.hidden else ((1, 5), (3, 2), (5, 4))
    for arguments in named(("height", "width"), (*sizes, *ENCODING_OPTIONS[part.hidden])):
        yield _encoding_check(part, arguments)


@behaviour(function="quadratic_relative_encoding", points=2)
def encoding_values(part: Part) -> Iterator[Check]:
    """r[q, k] = (||delta||^2, delta_1, delta_2) with delta = k - q (rows, then columns), the pixels numbered
    row by row."""
    sizes = ((2, 3), (2, 2), (3, 4)) if not part.hidden else ((1, 5), (4, 2), (5, 3))
    for arguments in named(("height", "width"), sizes):
        yield _encoding_check(part, arguments, values=True)


# --- 2. the layer


def attention(x: torch.Tensor, weight: torch.Tensor, bias, alpha: float, row: str = "") -> torch.Tensor:
    """K^2 positional heads as a row computes them, in float64 on the CPU (check code, written apart from the
    reference): head Delta's weights are softmax_k(-alpha ||k - q - Delta||^2) over the padded image."""
    x, weight, bias = (None if t is None else t.detach().cpu().double() for t in (x, weight, bias))
    c_out, _, k, _ = weight.shape
    batch, _, height, width = x.shape
    pad = 0 if row == "no padding" else k // 2
    padded = F.pad(x, (pad,) * 4)
    grid = lambda h, w, offset=0: torch.cartesian_prod(torch.arange(h), torch.arange(w)).double() + offset  # noqa: E731
    queries = grid(height, width, pad)  # [HW, 2]: the original pixels, in padded coordinates
    keys = grid(height + 2 * pad, width + 2 * pad)  # [keys, 2]
    delta = keys[None, :, :] - queries[:, None, :]  # [HW, keys, 2]
    if row == "flipped":
        delta = -delta
    centre = 0 if row == "shifts from zero" else k // 2
    out = torch.zeros(batch, height * width, c_out, dtype=torch.float64)
    values = padded.flatten(2).transpose(1, 2)  # [batch, keys, C_in]
    for a, b in itertools.product(range(k), range(k)):
        shift = torch.tensor([a - centre, b - centre], dtype=torch.float64)
        scores = -alpha * (delta - shift).pow(2).sum(-1)  # [HW, keys]
        if row == "alpha sign":
            scores = -scores
        weights = torch.softmax(scores, dim=-2 if row == "softmax over queries" else -1)
        kernel = weight[:, :, b, a] if row == "transposed kernel" else weight[:, :, a, b]  # [C_out, C_in]
        out = out + weights @ values @ kernel.T
        if row == "bias per head" and bias is not None:
            out = out + bias
    if bias is not None and row not in ("no bias", "bias per head"):
        out = out + bias
    return out.transpose(1, 2).reshape(batch, c_out, height, width)


CONV_ROWS = ("no padding", "flipped", "transposed kernel", "alpha sign", "shifts from zero", "bias per head")
CONV_ROWS += ("no bias", "softmax over queries")
# (batch, C_in, C_out, height, width, K): every size different
VISIBLE = ((2, 3, 4, 5, 6, 3), (1, 2, 3, 4, 7, 3))
HIDDEN = ((2, 3, 2, 6, 5, 5), (3, 1, 4, 4, 4, 3), (1, 4, 5, 3, 8, 1), (2, 2, 3, 7, 3, 3))
LARGE_SCORES = (1, 2, 3, 4, 5, 5)  # a 5 x 5 kernel: head Delta = (2, 2) scores up to 50 * 8 = 400


def _inputs(part: Part, sizes, seed: int, dtype=torch.float64, bias=True) -> dict[str, Any]:
    """x [batch, C_in, height, width], weight [C_out, C_in, K, K] and bias [C_out] (or None) of ``sizes``."""
    batch, c_in, c_out, height, width, k = sizes
    x = randn((batch, c_in, height, width), seed=seed, device=part.device, dtype=dtype)
    weight = randn((c_out, c_in, k, k), seed=seed + 1, device=part.device, dtype=dtype) / k
    b = randn((c_out,), seed=seed + 2, device=part.device, dtype=dtype) if bias else None
    return {"x": x, "weight": weight, "bias": b}


def _conv2d(arguments: dict[str, Any]) -> torch.Tensor:
    """F.conv2d of the arguments, padded by K // 2, in float64: the limit of a large alpha."""
    x, weight, bias = (None if t is None else t.double() for t in arguments.values())
    return F.conv2d(x, weight, bias, padding=weight.size(-1) // 2)


def _conv_check(
    part: Part, arguments: dict[str, Any], alpha=50.0, expected=None, label="", finite=False
) -> Check:
    """A call with ``alpha``: the result's values against ``expected`` (likely causes: the rows of
    :func:`attention`, and the convolution itself for a small ``alpha``), or without ``expected`` its shape
    [batch, C_out, height, width], x's dtype and device. ``finite``: a float32 call whose scores reach 400,
    failing first, with the cause, on NaN or inf."""
    call = part.call(label, **arguments, alpha=alpha)
    x, weight, bias = arguments.values()
    (batch, c_in, height, width), c_out = x.shape, weight.size(0)
    hints = engine.shapes(
        TEXT, "conv", batch=batch, c_in=c_in, c_out=c_out, h=height, w=width, hw=height * width
    )
    rows = [row for row in CONV_ROWS if bias is not None or row not in ("no bias", "bias per head")]

    def mistakes() -> Iterator[Mistake]:
        yield from row_mistakes(TEXT, rows, lambda row: attention(x, weight, bias, alpha, row))()
        if alpha < 10:
            yield Mistake(TEXT["hard"].format(alpha=alpha), _conv2d(arguments))

    def judge(result: Any) -> None:
        where = f"the result of {call}"
        floating = isinstance(result, torch.Tensor) and result.is_floating_point()
        if finite and floating and (bad := int((~result.isfinite()).sum())):
            fail(
                f"{where} contains NaN or inf ({bad} of {result.numel()} elements): with a 5 x 5 kernel and "
                "alpha = 50 the scores v . r of head Delta reach alpha ||Delta||^2 = 400, and exp() is inf "
                "past 88 in float32.",
                TEXT["unstable"],
            )
        if expected is None:
            engine.assert_format(result, where, (batch, c_out, height, width), x.dtype, x.device, hints)
        else:
            assert_values(result, expected, where, dtype=x.dtype, mistakes=mistakes, hints=hints)

    return Check(call, judge, untouched=True)


# (x's shape, weight's shape, the condition) of the documented ValueErrors
CONV_ERRORS = {
    False: (
        ((1, 2, 4, 5), (3, 2, 2, 2), "if the kernel's side (2) is even"),
        ((1, 2, 4, 5), (3, 2, 3, 1), "if the kernel (3 x 1) is not square"),
        ((1, 3, 4, 5), (3, 2, 3, 3), "if the kernel's C_in (2) is not x's (3)"),
    ),
    True: (
        ((2, 1, 5, 4), (2, 1, 4, 4), "if the kernel's side (4) is even"),
        ((1, 2, 6, 6), (1, 2, 5, 3), "if the kernel (5 x 3) is not square"),
        ((2, 1, 4, 4), (2, 4, 3, 3), "if the kernel's C_in (4) is not x's (1)"),
    ),
}


@behaviour(function="attention_conv2d", points=1, hints=HINTS)
def conv_shapes(part: Part) -> Iterator[Check]:
    """attention_conv2d(x [batch, C_in, height, width], weight [C_out, C_in, K, K], bias, alpha) returns
    [batch, C_out, height, width].

    Of x's dtype (float32 and float64) and device; ``ValueError`` for a kernel that is not square with an odd
    side, or whose ``C_in`` is not x's.
    """
    cases = VISIBLE if not part.hidden else HIDDEN
    for index, (sizes, dtype) in enumerate(zip(cases, itertools.cycle((torch.float32, torch.float64)))):
        yield _conv_check(part, _inputs(part, sizes, seed=10 * index, dtype=dtype))
    for index, (x_shape, weight_shape, condition) in enumerate(CONV_ERRORS[part.hidden]):
        x = randn(x_shape, seed=50 + index, device=part.device)
        weight = randn(weight_shape, seed=60 + index, device=part.device)
        yield engine.raises(
            part.call(x=x, weight=weight, bias=None, alpha=50.0), "ValueError", condition, VALIDATION
        )


@behaviour(function="attention_conv2d", points=3, hints=HINTS)
def conv_matches_conv2d(part: Part) -> Iterator[Check]:
    """With alpha = 50 the K^2 heads compute F.conv2d(x, weight, bias, padding=K // 2): a 3 x 3 kernel (and,
    hidden, 1 x 1 and 5 x 5), with and without bias."""
    cases, dtypes = (
        (VISIBLE, (torch.float64,)) if not part.hidden else (HIDDEN, (torch.float64, torch.float32))
    )
    for (index, sizes), bias, dtype in itertools.product(enumerate(cases), (True, False), dtypes):
        arguments = _inputs(part, sizes, seed=100 + 10 * index, dtype=dtype, bias=bias)
        yield _conv_check(part, arguments, expected=_conv2d(arguments))
    if not part.hidden:
        # float32 with a 5 x 5 kernel: scores up to alpha ||Delta||^2 = 400, past float32's exp (88)
        arguments = _inputs(part, LARGE_SCORES, seed=150, dtype=torch.float32)
        label = " (float32, scores up to 400)"
        yield _conv_check(part, arguments, expected=_conv2d(arguments), label=label, finite=True)
        # bias and alpha left to their defaults, None and 50
        arguments = _inputs(part, VISIBLE[1], seed=160, bias=False)
        call = part.call(" (bias and alpha by default)", x=arguments["x"], weight=arguments["weight"])
        expected = _conv2d(arguments)
        judge = lambda result: assert_values(result, expected, f"the result of {call}", dtype=torch.float64)  # noqa: E731
        yield Check(call, judge, untouched=True)


@behaviour(function="attention_conv2d", points=2, hints=HINTS)
def conv_is_attention(part: Part) -> Iterator[Check]:
    """With a small alpha (1, 0.5, 3) each head's softmax spreads over a neighbourhood of q + Delta: the
    layer is attention, softmax_k(-alpha ||k - q - Delta||^2) over the zero-padded image, not a
    convolution."""
    cases = (
        ((0, 1.0), (1, 0.5)) if not part.hidden else ((0, 1.0), (1, 3.0), (3, 0.25))
    )  # (sizes' index, alpha)
    for index, (case, alpha) in enumerate(cases):
        arguments = _inputs(part, (HIDDEN if part.hidden else VISIBLE)[case], seed=300 + 10 * index)
        answer = part.reference if part.hidden else attention
        expected = answer(**{name: tensor.double() for name, tensor in arguments.items()}, alpha=alpha)
        yield _conv_check(part, arguments, alpha, expected)


@behaviour(function="attention_conv2d", points=1, hints=HINTS)
def conv_from_scratch(part: Part) -> Iterator[Check]:
    """attention_conv2d is correct and calls no convolution (F.conv2d, F.unfold, ...) and no built-in
    attention (F.scaled_dot_product_attention): the heads do the work."""
    if not part.hidden:
        yield from engine.correct_first(conv_matches_conv2d.plan(part), part.function)
    sizes = VISIBLE if not part.hidden else HIDDEN
    calls = [
        part.call(**_inputs(part, s, seed=500 + i), alpha=a) for i, s in enumerate(sizes) for a in (1.0, 50.0)
    ]
    yield RULE.check(calls)
