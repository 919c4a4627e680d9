"""The shape of a bank: implementations a learner could plausibly write, wrong and right.

A wrong implementation that differs from a correct one by a line or two is a :class:`Row`: a ``find`` that
must occur exactly once in the function's base source, its ``replace``, and what each test cell must say.
A mistake of another structure is a whole function, named ``<function>__<variant>``, with its
expectations in ``WHOLE``; a class is a whole source in ``CLASSES`` (``{variant: (source, expected)}``), a
right one in ``RIGHT_CLASSES`` (``{variant: source}``). ``expected`` lists *exactly* the test cells that
reject the implementation, with a fragment of each one's message: every other cell of the function must accept
it.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType


class Chance(str):
    """The fragment of a cell that rejects the implementation in grading, but whose visible part may not.

    For estimators noisier than asked (fewer samples): a value cell rejects them with high probability
    per call, so the visible part's three calls can all pass by chance where the hidden part's fail.
    """


@dataclass(frozen=True)
class Implementation:
    """One implementation of an exercise function, as the source a learner writes in its solution cell."""

    function: str
    variant: str
    source: str
    expected: dict[str, str] = field(default_factory=dict)  # grade id -> fragment (empty: a right one)

    @property
    def id(self) -> str:
        return f"{self.function}__{self.variant}"


@dataclass(frozen=True)
class Row:
    """A wrong implementation: ``find`` replaced by ``replace`` in the base source of ``function``."""

    function: str
    variant: str
    find: str
    replace: str
    expected: dict[str, str]


def source_of(function: Callable) -> str:
    """The source of a bank function ``<name>__<variant>``, renamed to the exercise's ``<name>``."""
    name = function.__name__.split("__")[0]
    source = textwrap.dedent(inspect.getsource(function))
    return source.replace(f"def {function.__name__}(", f"def {name}(", 1)


def whole(function: Callable, expected: dict[str, str] | None = None) -> Implementation:
    name, variant = function.__name__.split("__")
    return Implementation(name, variant, source_of(function), dict(expected or {}))


def wrong(bank: ModuleType) -> list[Implementation]:
    """Every wrong implementation of ``bank``: its rows applied to their bases, then its whole functions."""
    from_rows = [
        Implementation(
            row.function, row.variant, bank.BASES[row.function].replace(row.find, row.replace), row.expected
        )
        for row in bank.ROWS
    ]
    classes = [
        Implementation(_class_name(source), variant, source, expected)
        for variant, (source, expected) in getattr(bank, "CLASSES", {}).items()
    ]
    return from_rows + [whole(function, expected) for function, expected in bank.WHOLE.items()] + classes


def right(bank: ModuleType) -> list[Implementation]:
    """The base implementations and the other correct ones of ``bank``."""
    bases = [Implementation(name, "base", source) for name, source in bank.BASES.items()]
    classes = [
        Implementation(_class_name(source), variant, source)
        for variant, source in getattr(bank, "RIGHT_CLASSES", {}).items()
    ]
    return bases + [whole(function) for function in bank.RIGHT] + classes


def _class_name(source: str) -> str:
    return source.split("class ", 1)[1].split("(", 1)[0].split(":", 1)[0].strip()
