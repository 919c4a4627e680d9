"""What the checks of functions that make a tensor from sizes share (ex08's encodings and ALiBi, ex09's
relative encoding): their cases, their ``dtype`` and ``device``, and their known mistakes as rows.

A case is keyword arguments, its sizes written as a tuple (:func:`named`). A dtype is not data, so its name
travels (``dtype="torch.float64"``) and :data:`DTYPED` turns it into the dtype in the learner's process; the
device is checked on ``meta``, a device of shapes without data, so that it needs no GPU, and on the checks'
own (:data:`HERE`). The answer and each known mistake are one computation of check code, ``compute(**sizes,
row=...)``, where ``row`` names a mistake in an exercise's table (:func:`row_mistakes`). :func:`made_check`
judges one call: its values, then the shape, the dtype and the device that the call asks for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from attention_course.checks import engine
from attention_course.checks.engine import Call, Check, Driver, Mistake, Part, assert_values, fail

TEXT = engine.table("""
dtype ignored: the dtype argument is ignored: make the result in dtype (float32 by default), as in
    torch.tensor(values, dtype=dtype), or cast it at the end with .to(dtype)
device ignored: the device argument is ignored: create every tensor with device=device (torch.arange(...,
    device=device), torch.tensor(values, device=device)), or move the result at the end with .to(device)
""")


def _named_dtype(fn: Any, **arguments: Any) -> Any:
    """Call ``fn`` with its ``dtype`` argument, which travels as a name ("torch.float64"), as the dtype.

    PyTorch raises ``NotImplementedError`` when data is read from a ``meta`` tensor: raised again as a
    ``RuntimeError``, so that the engine does not take it for the blank stub's."""
    if isinstance(arguments.get("dtype"), str):
        arguments["dtype"] = dtype_of(arguments["dtype"])
    try:
        return fn(**arguments)
    except NotImplementedError as error:
        if "meta" not in str(error):
            raise
        raise RuntimeError(str(error)).with_traceback(error.__traceback__) from None


DTYPED = Driver(_named_dtype)
META = torch.device("meta")
HERE = "the checks' device"  # a case's device: the part's own, where the other checks make their inputs


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def named(names: Sequence[str], cases: Iterable[tuple | dict]) -> list[dict[str, Any]]:
    """Each case as keyword arguments: a dict as it is, a tuple as the values of ``names``."""
    return [case if isinstance(case, dict) else dict(zip(names, case, strict=True)) for case in cases]


def row_mistakes(
    text: dict[str, str], rows: Sequence[str], compute: Callable[[str], torch.Tensor], right=None
) -> Callable[[], Iterator[Mistake]]:
    """The known mistakes ``rows``: ``compute(row)``, whose likely cause is ``text[row]``, but for those whose
    result is the ``right`` answer (they would name a result that is right but for a few NaN)."""

    def mistakes() -> Iterator[Mistake]:
        for row in rows:
            result = compute(row)
            if right is None or not torch.equal(result, right):
                yield Mistake(text[row], result)

    return mistakes


def assert_made(result: Any, call: Call, where: str, shape, hints: dict | None = None) -> None:
    """Fail unless ``result`` is a tensor of ``shape`` with the ``dtype`` and on the ``device`` that ``call``
    asks for (float32 and the CPU by default): the promise of a function that makes a tensor from sizes."""
    name, place = call.arguments.get("dtype"), call.arguments.get("device")
    dtype, device = dtype_of(name) if name else torch.float32, torch.device(place or "cpu")
    engine.assert_shape(result, where, shape, hints, dtype)
    if result.dtype != dtype:
        asked = f"dtype={name}" if name else "the default dtype, torch.float32,"
        message = f"{where} has dtype {result.dtype}, but {asked} asks for {dtype}."
        fail(message, TEXT["dtype ignored"], expected=str(dtype), got=str(result.dtype))
    if result.device.type != device.type or device.index not in (None, result.device.index):
        asked = f"device='{place}'" if place is not None else "the default device, the CPU,"
        message = f"{where} is on {result.device}, but {asked} asks for {device}."
        fail(message, TEXT["device ignored"], expected=str(device), got=str(result.device))


def made_check(
    part: Part,
    arguments: dict[str, Any],
    shape: Sequence[int],
    hints: dict[tuple[int, ...], str],
    compute: Callable[..., torch.Tensor] | None = None,
    rows: Sequence[str] = (),
    text: dict[str, str] | None = None,
    *,
    written: Callable[..., torch.Tensor] | None = None,
    where: str = "the result of {call}",
    formats: bool = True,
    dtype: torch.dtype | None = None,
    before: Callable[[Any, Call], None] | None = None,
) -> Check:
    """A check of one call with ``arguments``: sizes, and maybe ``dtype`` (by name) and ``device`` (``HERE``).

    ``before(result, call)`` judges first. Then, given ``compute`` and off ``meta``, the values against the
    reference (hidden) or ``written(**sizes)`` (default ``compute``) in float64, within ``dtype``'s tolerance
    at least, the likely causes ``hints`` (shapes) and ``rows`` (:func:`row_mistakes` of ``text``); with
    ``formats``, the result's shape ``[*shape]``, dtype and device (:func:`assert_made`).
    """
    arguments = {name: part.device if value is HERE else value for name, value in arguments.items()}
    sizes = {name: value for name, value in arguments.items() if name not in ("dtype", "device")}
    call, expected = part.call(**arguments), None
    where = where.format(call=call)
    if arguments.get("device") in (META, "meta"):
        engine.meta_ready()
    elif compute is not None:
        expected = (
            part.reference(**sizes, dtype=torch.float64) if part.hidden else (written or compute)(**sizes)
        )
    mistakes = row_mistakes(text or {}, rows, lambda row: compute(**sizes, row=row), expected)

    def judge(result: Any) -> None:
        if before is not None:
            before(result, call)
        if expected is not None:
            assert_values(result, expected, where, dtype=dtype, mistakes=mistakes, hints=hints)
        if formats:
            assert_made(result, call, where, shape, hints)

    return Check(call, judge)
