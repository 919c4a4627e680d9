"""What an exercise's test cells say of the reference, the blank stub and each implementation of its bank.

    .venv/bin/python -m tests.try_checks ASSIGNMENT [FILTER ...]

A check cannot be tried on the reference function itself: passing ``solutions.<topic>.<function>`` to a check
fails it, since that is the course's own answer, imported rather than written (and so does a function that
calls it, or one made by ``exec()`` of its source). Here each function is compiled from its source as a
notebook compiles a cell, after the set-up cell (:func:`tests.notebook_tools.implementation`), and each test
cell runs in this process, its visible part alone and then whole, as ``tests/test_checks.py`` runs them
(together; the tests also run them split, recorded then judged).

For each implementation (those whose name contains a ``FILTER``, if any are given) and each test cell of its
function it prints "passes" or the failure's message, and marks with ``!`` a verdict that the bank does not
expect (a cell that fails although the entry does not list it, passes although it does, or says something
without the entry's fragment) or a visible part that passes where the whole cell fails. The exit status is 1
if any verdict is marked.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import textwrap
from collections.abc import Callable, Sequence

from attention_course.registry import ASSIGNMENTS
from tests.banks import _bank
from tests.notebook_tools import (
    Exercise,
    blank_stub,
    implementation,
    load_exercise,
    reference_as_learner_code,
    together,
)


def candidates(exercise: Exercise) -> list[tuple[str, str, Callable, dict[str, str]]]:
    """``(name, function, implementation, expected)`` for the reference, the blank stubs and the bank."""
    reference = reference_as_learner_code(exercise)
    found = [(f"{name} (reference)", name, reference[name], {}) for name in exercise.functions]
    for name in exercise.functions:
        stub = {cell.grade_id: "not implemented yet" for cell in exercise.cells_of(name)}
        found.append((f"{name} (blank stub)", name, blank_stub(name), stub))
    for kind, bank in (("right", _bank.right(exercise.bank)), ("wrong", _bank.wrong(exercise.bank))):
        for candidate in bank:
            fn = implementation(exercise, candidate)
            found.append((f"{candidate.id} ({kind})", candidate.function, fn, candidate.expected))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.try_checks", description=__doc__.split("\n\n")[0])
    parser.add_argument("assignment", choices=sorted(ASSIGNMENTS), metavar="ASSIGNMENT")
    parser.add_argument("filters", nargs="*", metavar="FILTER", help="only implementations named so")
    arguments = parser.parse_args(argv)
    exercise = load_exercise(arguments.assignment)
    with contextlib.redirect_stdout(io.StringIO()):  # the set-up cell prints, each time it runs
        found = candidates(exercise)
    marked = 0
    for name, function, fn, expected in found:
        if arguments.filters and not any(part in name for part in arguments.filters):
            continue
        print(name)
        for cell in exercise.cells_of(function):
            with contextlib.redirect_stdout(io.StringIO()):
                visible = together(exercise, cell.visible, fn, function)
                whole = visible or together(exercise, cell.full, fn, function)
            fragment = expected.get(cell.grade_id)
            surprise = (whole is None) != (fragment is None) or (
                fragment is not None and fragment not in str(whole)
            )
            surprise |= (visible is None) != (whole is None) and not isinstance(fragment, _bank.Chance)
            marked += surprise
            verdict = (
                "passes" if whole is None else f"fails ({'visible part' if visible else 'hidden part'}):"
            )
            print(f"{'!' if surprise else ' '} {cell.grade_id}: {verdict}")
            if whole is not None:
                print(textwrap.indent(str(whole), "      "))
            if surprise:
                wanted = "to pass" if fragment is None else f"to fail, saying {fragment!r}"
                print(f"      the bank expects it {wanted}")
    print(f"{marked} unexpected verdict(s)" if marked else "every verdict is the expected one")
    return 1 if marked else 0


if __name__ == "__main__":
    sys.exit(main())
