"""The machinery behind every check: call a learner's function safely, compare, say what is wrong.

A check raises :class:`CheckFailure` (an ``AssertionError``) whose message names the call that failed, what
was expected, and, where a known mistake explains the result, the likely cause. Nothing here writes to
stderr: nbgrader gives 0 points to a test cell that prints to stderr, so warnings raised by a learner's
code are collected and reported on stdout instead.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from attention_course.device import seeded_generator


class CheckFailure(AssertionError):
    """A check failed. The message says what was expected, what came back, and the likely cause."""


def fail(message: str) -> None:
    """Raise :class:`CheckFailure` with ``message``."""
    __tracebackhide__ = True  # pytest and IPython hide this frame from the learner's traceback
    raise CheckFailure(message)


# --------------------------------------------------------------------------------------------------
# describing values and calls


def describe(value: Any) -> str:
    """``float32 [2, 3, 5, 4] on cpu`` for a tensor, the type name and a short repr for anything else."""
    if isinstance(value, torch.Tensor):
        where = "" if value.device.type == "cpu" else f" on {value.device}"
        return f"{str(value.dtype).removeprefix('torch.')} {list(value.shape)}{where}"
    text = repr(value)
    return text if len(text) <= 40 else f"{type(value).__name__} ({text[:37]}...)"


@dataclass(frozen=True)
class Call:
    """A call of a learner's function, kept to describe it in messages."""

    name: str
    args: dict[str, Any]

    def __str__(self) -> str:
        shown = ", ".join(f"{key}: {describe(value)}" for key, value in self.args.items())
        return f"{self.name}({shown})"


# --------------------------------------------------------------------------------------------------
# which functions a learner's code calls

# modules whose functions are the answers: a learner's solution may not call them
ANSWER_MODULES = (
    "solutions",
    "attention_course.attention",
    "attention_course.masks",
    "attention_course.pooling",
)


def _is_answer_module(module: str) -> bool:
    return any(module == answer or module.startswith(answer + ".") for answer in ANSWER_MODULES)


@contextmanager
def recorded_calls(owner_globals: dict[str, Any]) -> Iterator[list[tuple[str, str]]]:
    """Record the ``(module, name)`` of every function called, except those defined beside the learner's.

    Python functions are seen on entry and C functions (``torch.softmax``, ``Tensor.softmax``, SDPA) when
    called, through :func:`sys.setprofile`, so an alias or a helper does not hide a built-in.
    """
    seen: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event == "call":
            if frame.f_globals is not owner_globals:
                seen.append((str(frame.f_globals.get("__name__", "")), frame.f_code.co_name))
        elif event == "c_call":
            seen.append((str(getattr(arg, "__module__", "") or ""), str(getattr(arg, "__name__", ""))))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


# --------------------------------------------------------------------------------------------------
# calling the learner's code

_EXCEPTION_HINTS: Sequence[tuple[Sequence[str], str]] = (
    (
        ("cannot be converted to type", "without overflow"),
        "a fill value such as -1e9 does not fit in float16 (its largest value is 65504): fill masked "
        "scores with float('-inf') or torch.finfo(scores.dtype).min",
    ),
    (
        ("bitwise_and", "bitwise_or"),
        "masks are combined with & only when both are boolean: build them with dtype=torch.bool "
        "(torch.ones(..., dtype=torch.bool)) or call .bool()",
    ),
    (
        ("with a bool tensor is not supported",),
        "a boolean mask is negated with ~mask (logical not), not with 1 - mask or -mask",
    ),
    (
        ("same device",),
        "create new tensors on the device of the inputs (device=x.device), never on a fixed device",
    ),
    (
        ("expected scalar type", "same dtype", "expected m1 and m2 to have the same dtype", "dtype mismatch"),
        "create new tensors with the dtype of the inputs (dtype=x.dtype) so that every dtype works",
    ),
    (
        ("out of range", "Dimension out of range"),
        "an axis index is out of range: with leading (batch, head) axes, count axes from the end "
        "(-1 for the last, -2 for the one before)",
    ),
    (
        (
            "size of tensor",
            "mat1 and mat2",
            "cannot be multiplied",
            "must match the size",
            "Expected size",
            "shape",
            "expand",
            "broadcast",
        ),
        "shapes do not fit: check which axes you transpose, sum and broadcast over; with leading "
        "(batch, head) axes use key.transpose(-2, -1), not key.T or key.transpose(0, 1)",
    ),
    (
        ("unexpected keyword argument", "missing 1 required positional argument", "positional arguments"),
        "keep the signature given in the task, argument names and defaults included",
    ),
    (
        ("is not defined",),
        "a name your function uses is not defined: run the cell that defines or imports it first",
    ),
)


def hint_for_exception(
    error: BaseException, extra_hints: Sequence[tuple[Sequence[str], str]] = ()
) -> str | None:
    """The likely cause of an exception raised by a learner's function, from its message."""
    text = f"{type(error).__name__}: {error}"
    for patterns, hint in (*extra_hints, *_EXCEPTION_HINTS):
        if any(pattern in text for pattern in patterns):
            return hint
    return None


def call(
    fn: Callable[..., Any],
    name: str,
    extra_hints: Sequence[tuple[Sequence[str], str]] = (),
    **arguments: Any,
) -> Any:
    """Call ``fn(**arguments)`` as a learner's function: exceptions and in-place edits become failures.

    Args:
        fn: the learner's function.
        name: its name, for messages.
        extra_hints: ``(patterns, hint)`` pairs tried before the general ones on an exception.
        **arguments: keyword arguments, passed by keyword so that argument order mistakes show up as
            a clear ``TypeError``.

    Returns:
        Whatever ``fn`` returns.

    Raises:
        CheckFailure: if ``fn`` is not callable, is or calls one of the course's answers (the reference
            solutions, or the library modules that hold them), raises, or modifies a tensor argument.
    """
    __tracebackhide__ = True
    description = str(Call(name, arguments))  # now: an in-place edit must not change what it says
    if not callable(fn):
        fail(f"{name} is not a function (got {describe(fn)}): run the cell that defines it.")
    if _is_answer_module(getattr(fn, "__module__", None) or ""):
        fail(
            f"{name} is the course's own {fn.__module__}.{getattr(fn, '__name__', name)}, imported "
            "rather than written: the exercise is to write it yourself."
        )
    snapshots = {key: value.clone() for key, value in arguments.items() if isinstance(value, torch.Tensor)}
    with (
        warnings.catch_warnings(record=True) as caught,
        recorded_calls(getattr(fn, "__globals__", {})) as seen,
    ):
        warnings.simplefilter("always")
        try:
            result = fn(**arguments)
        except NotImplementedError:
            fail(f"{name} is not implemented yet: replace `raise NotImplementedError()` with your code.")
        except CheckFailure:
            raise
        except Exception as error:  # the learner's code may raise anything
            hint = hint_for_exception(error, extra_hints)
            message = f"{description} raised {type(error).__name__}: {error}"
            fail(message + (f"\n  Likely cause: {hint}." if hint else ""))
    answers = sorted({f"{module}.{function}" for module, function in seen if _is_answer_module(module)})
    if answers:
        fail(
            f"{description} calls the course's own {', '.join(answers)}: the exercise is to write it "
            "yourself, without the reference solutions or the course library's answers."
        )
    for message in {str(w.message) for w in caught}:
        print(f"note: {name} emitted a warning: {message}")  # stdout: a warning is not a failure
    for key, before in snapshots.items():
        after = arguments[key]
        if after.shape != before.shape or after.dtype != before.dtype or not torch.equal(after, before):
            fail(
                f"{description} modified its argument `{key}` in place. Likely cause: an in-place "
                f"operation such as `{key} /= ...`, `{key} -= ...` or `{key}.masked_fill_(...)`; compute "
                "new tensors instead (`x = x / s`, `x.masked_fill(...)`), since callers reuse their inputs."
            )
    return result


# --------------------------------------------------------------------------------------------------
# inputs


def randn(
    shape: Sequence[int], *, seed: int, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Standard normal draws made on the CPU in float64 from ``seed``, then moved: the same on any device."""
    values = torch.randn(*shape, generator=seeded_generator(seed), dtype=torch.float64)
    return values.to(device=device, dtype=dtype)


def random_attention_inputs(
    lead: Sequence[int], q_len: int, k_len: int, d_k: int, d_v: int, *, seed: int, device: torch.device | str
) -> dict[str, torch.Tensor]:
    """Float64 N(0, 1) query [*lead, q_len, d_k], key [*lead, k_len, d_k] and value [*lead, k_len, d_v]."""
    return {
        "query": randn((*lead, q_len, d_k), seed=seed, device=device),
        "key": randn((*lead, k_len, d_k), seed=seed + 1, device=device),
        "value": randn((*lead, k_len, d_v), seed=seed + 2, device=device),
    }


def random_mask(shape: Sequence[int], *, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A boolean mask (True = may attend) with about 30% blocked and at least one allowed key per row."""
    generator = seeded_generator(seed)
    mask = torch.rand(*shape, generator=generator) > 0.3
    first_allowed = torch.randint(0, shape[-1], tuple(shape[:-1]), generator=generator)
    mask.scatter_(-1, first_allowed[..., None], True)  # no row may be fully masked
    return mask.to(device)


# --------------------------------------------------------------------------------------------------
# comparing

# (rtol, atol) floors per dtype, for results of size about 1 computed in that dtype
_FLOORS: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 2e-3),
    torch.bfloat16: (5e-2, 1.6e-2),
}


def tolerance(dtype: torch.dtype, naive_error: float = 0.0) -> tuple[float, float]:
    """``(rtol, atol)`` for results in ``dtype``: a floor per dtype, or four times ``naive_error``.

    ``naive_error`` is the largest error of a plain same-dtype implementation against float64 on the
    same inputs (the rule of PyTorch's own attention tests): a learner may be a few times less exact
    than the plain computation, never more.
    """
    rtol, atol = _FLOORS.get(dtype, _FLOORS[torch.float32])
    return rtol, max(atol, 4.0 * naive_error)


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, naive_error: float = 0.0) -> bool:
    """Whether ``actual`` matches ``expected`` within the tolerance of ``dtype``, compared in float64."""
    if actual.shape != expected.shape:
        return False
    rtol, atol = tolerance(dtype, naive_error)
    return bool(torch.allclose(actual.double(), expected.double(), rtol=rtol, atol=atol, equal_nan=False))


@dataclass(frozen=True)
class Mistake:
    """A known wrong computation, and the hint that names it."""

    hint: str
    result: torch.Tensor


def diagnose(
    actual: torch.Tensor, mistakes: Iterable[Mistake], dtype: torch.dtype, naive_error: float = 0.0
) -> str | None:
    """The hint of the first known mistake whose result ``actual`` reproduces, if any."""
    for mistake in mistakes:
        if close(actual, mistake.result, dtype, naive_error):
            return mistake.hint
    return None


def assert_like(
    actual: Any,
    *,
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
    what: str,
    call_text: str,
    shape_hints: dict[tuple[int, ...], str] | None = None,
) -> None:
    """Fail unless ``actual`` is a tensor of ``shape``, ``dtype`` and ``device``.

    Args:
        actual: what the learner's function returned.
        shape, dtype, device: what it should be.
        what: a name for the value in messages (``"the output"``, ``"the weights"``).
        call_text: the call that produced it.
        shape_hints: likely causes of specific wrong shapes.

    Raises:
        CheckFailure: on the first property that does not hold.
    """
    __tracebackhide__ = True
    where = f"{what} of {call_text}"
    expected = f"{str(dtype).removeprefix('torch.')} {list(shape)}"
    if not isinstance(actual, torch.Tensor):
        fail(f"{where} should be a tensor ({expected}), got {describe(actual)}.")
    if tuple(actual.shape) != tuple(shape):
        hint = (shape_hints or {}).get(tuple(actual.shape))
        fail(
            f"{where} has shape {list(actual.shape)}, expected {list(shape)}."
            + (f"\n  Likely cause: {hint}." if hint else "")
        )
    if actual.dtype != dtype:
        fail(
            f"{where} has dtype {actual.dtype}, expected {dtype}: the dtype must follow the inputs. "
            "Likely cause: a .float()/.double() call, or a new tensor created without dtype=x.dtype."
        )
    if actual.device != device:
        fail(
            f"{where} is on {actual.device}, expected {device}: the device must follow the inputs. "
            "Likely cause: a tensor created without device=x.device, or a .cpu()/.cuda() call."
        )


def assert_tensor(
    actual: Any,
    expected: torch.Tensor,
    *,
    what: str,
    call_text: str,
    dtype: torch.dtype | None = None,
    naive_error: float = 0.0,
    mistakes: Callable[[], Iterable[Mistake]] | None = None,
    shape_hints: dict[tuple[int, ...], str] | None = None,
    note: str | None = None,
) -> None:
    """Fail unless ``actual`` matches ``expected``: shape, dtype, device, finiteness, then values.

    Args:
        actual: what the learner's function returned.
        expected: the right answer, best computed in float64; values are compared in float64.
        what, call_text, shape_hints: as for :func:`assert_like`.
        dtype: the dtype ``actual`` must have, whose tolerance applies (default ``expected.dtype``).
        naive_error: error of a plain same-dtype computation (see :func:`tolerance`).
        mistakes: called on a value mismatch only; known wrong results to diagnose against.
        note: what the right answer is in words, added to a value mismatch message.

    Raises:
        CheckFailure: on the first property that does not hold.
    """
    __tracebackhide__ = True
    dtype = expected.dtype if dtype is None else dtype
    assert_like(
        actual,
        shape=expected.shape,
        dtype=dtype,
        device=expected.device,
        what=what,
        call_text=call_text,
        shape_hints=shape_hints,
    )
    where = f"{what} of {call_text}"
    finite_expected = torch.isfinite(expected)
    bad = ~torch.isfinite(actual) & finite_expected
    if bad.any():
        index = tuple(torch.nonzero(bad)[0].tolist())
        fail(
            f"{where} contains NaN or inf ({int(bad.sum())} of {bad.numel()} elements, first at index "
            f"{list(index)}: {actual[index].item()}) where the right answer is finite.\n  Likely cause: "
            "exp() overflowed (subtract the maximum before exponentiating), or a 0/0 from a row whose "
            "elements all became -inf or underflowed to 0."
        )
    rtol, atol = tolerance(dtype, naive_error)
    a, e = actual.detach().double(), expected.detach().double()
    mismatch = ~((a - e).abs() <= atol + rtol * e.abs()) & finite_expected
    if mismatch.any():
        error = ((a - e).abs() - rtol * e.abs()).masked_fill(~mismatch, float("-inf"))
        index = tuple(torch.nonzero(error == error.max())[0].tolist())
        hint = diagnose(actual, mistakes(), dtype, naive_error) if mistakes is not None else None
        share = mismatch.float().mean().item()
        fail(
            f"{where} does not match ({str(dtype).removeprefix('torch.')}, shape {list(actual.shape)}): "
            f"{int(mismatch.sum())} of {mismatch.numel()} elements differ ({share:.0%}); "
            f"the worst, at index {list(index)}, is {a[index].item():.6g} where {e[index].item():.6g} is "
            f"expected (rtol {rtol:g}, atol {atol:.2g})."
            + (f" {note}" if note else "")
            + (f"\n  Likely cause: {hint}." if hint else "")
        )


# --------------------------------------------------------------------------------------------------
# attention functions: (output, weights) against a float64 answer


def unpack_output_and_weights(result: Any, call_text: str) -> tuple[Any, Any]:
    """The ``(output, weights)`` that an attention function returns; fail on anything else."""
    __tracebackhide__ = True
    if not isinstance(result, tuple | list) or len(result) != 2:
        length = f" of length {len(result)}" if isinstance(result, tuple | list) else ""
        fail(f"{call_text} should return a tuple (output, weights), got {type(result).__name__}{length}.")
    return result[0], result[1]


def reference_answer(
    reference: Callable[..., Any], inputs: dict[str, Any]
) -> tuple[tuple[torch.Tensor, ...], tuple[float, ...]]:
    """The right answer in float64 for ``inputs``, and the error a plain same-dtype computation makes.

    The reference runs twice: on the inputs upcast to float64 (the truth, for exactly the values the
    learner's function sees) and on the inputs as they are (its error sets the tolerance, see
    :func:`tolerance`). A reference returning one tensor gives tuples of one.
    """
    wide = {
        name: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for name, v in inputs.items()
    }
    truth, naive = reference(**wide), reference(**inputs)
    truth = truth if isinstance(truth, tuple) else (truth,)
    naive = naive if isinstance(naive, tuple) else (naive,)
    errors = tuple((n.double() - t).abs().max().item() for n, t in zip(naive, truth, strict=True))
    return truth, errors


def assert_output_and_weights(
    output: Any,
    weights: Any,
    expected_output: torch.Tensor,
    expected_weights: torch.Tensor,
    *,
    call_text: str,
    dtype: torch.dtype,
    naive_errors: tuple[float, float] = (0.0, 0.0),
    shape_hints: dict[str, dict[tuple[int, ...], str]] | None = None,
    mistakes: Callable[[str], Iterable[Mistake]] | None = None,
    note: str | None = None,
) -> None:
    """Compare the weights, then the output (the weights say more about a mistake), as assert_tensor.

    Args:
        naive_errors: ``(output, weights)`` errors of a plain same-dtype computation.
        shape_hints: ``{"output": {...}, "weights": {...}}``, likely causes of wrong shapes.
        mistakes: called with ``"output"`` or ``"weights"`` on a mismatch; known wrong results.
    """
    __tracebackhide__ = True
    for part, actual, expected, naive_error in (
        ("weights", weights, expected_weights, naive_errors[1]),
        ("output", output, expected_output, naive_errors[0]),
    ):
        assert_tensor(
            actual,
            expected,
            dtype=dtype,
            naive_error=naive_error,
            what=f"the {part}",
            call_text=call_text,
            shape_hints=(shape_hints or {}).get(part),
            mistakes=(lambda part=part: mistakes(part)) if mistakes is not None else None,
            note=note,
        )


# --------------------------------------------------------------------------------------------------
# "from scratch": which built-ins a function calls


def forbidden_calls(fn: Callable[..., Any], arguments: dict[str, Any], forbidden: Sequence[str]) -> list[str]:
    """Run ``fn(**arguments)`` and list the forbidden functions it called.

    A call is forbidden when the function's name contains one of ``forbidden`` (case-insensitive), or when
    it lives in one of :data:`ANSWER_MODULES` (the reference solutions and the library's answers).
    """
    owner_globals = getattr(fn, "__globals__", {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with recorded_calls(owner_globals) as seen:
            try:
                fn(**arguments)
            except Exception:  # correctness is checked elsewhere; here only the calls matter
                pass
    found: list[str] = []
    for module, name in seen:
        lowered = name.lower()
        if _is_answer_module(module) or any(word in lowered for word in forbidden):
            label = f"{module}.{name}" if module else name
            if label not in found:
                found.append(label)
    return found


def assert_from_scratch(
    fn: Callable[..., Any],
    name: str,
    cases: Iterable[dict[str, Any]],
    forbidden: Sequence[str],
    what: str,
) -> None:
    """Fail if ``fn`` calls a forbidden built-in or a reference solution on any of ``cases``."""
    __tracebackhide__ = True
    for arguments in cases:
        found = forbidden_calls(fn, arguments, forbidden)
        if found:
            fail(
                f"{Call(name, arguments)} calls {', '.join(found)}: the task is to write {what} from "
                "scratch, so a built-in that computes it (or the course's reference) cannot be used here."
            )
