"""Every test cell of every exercise, visible and hidden parts, proven both ways.

A test cell must accept the reference and every correct implementation in ``RIGHT`` (einsum, float64 or
float32 inside, other stable softmaxes), reject the blank stub, and reject each wrong implementation in
``WRONG`` with the expected hint. The cells run exactly as grading runs them, on the default device.
"""

from __future__ import annotations

import sys

import pytest

from attention_course.checks._harness import CheckFailure
from attention_course.grading.assignments import ASSIGNMENTS as REGISTERED
from tests.notebook_tools import (
    ROOT,
    blank_stub,
    function_of,
    load_exercise,
    reference_as_learner_code,
    run_cell,
)

# every registered assignment whose source notebook exists; test_every_assignment_exists fails for the others
ASSIGNMENTS = [name for name, assignment in sorted(REGISTERED.items()) if assignment.source(ROOT).exists()]
EXERCISES = {assignment: load_exercise(assignment) for assignment in ASSIGNMENTS}


def test_every_assignment_exists():
    assert ASSIGNMENTS == sorted(REGISTERED)


def _cells(assignment: str):
    exercise = EXERCISES[assignment]
    return [pytest.param(exercise, cell, id=f"{assignment[:4]}-{cell.grade_id}") for cell in exercise.tests]


ALL_CELLS = [param for assignment in ASSIGNMENTS for param in _cells(assignment)]


def _wrong_cases():
    for assignment in ASSIGNMENTS:
        exercise = EXERCISES[assignment]
        cells = {cell.grade_id: cell for cell in exercise.tests}
        for implementation, expected in exercise.bank.WRONG.items():
            for grade_id, fragment in expected.items():
                assert grade_id in cells, f"{implementation.__name__}: unknown test cell {grade_id}"
                yield pytest.param(
                    exercise,
                    cells[grade_id],
                    implementation,
                    fragment,
                    id=f"{grade_id}-{implementation.__name__}",
                )


@pytest.mark.parametrize(("exercise", "cell"), ALL_CELLS)
def test_reference_passes(exercise, cell):
    run_cell(exercise, cell.full, reference_as_learner_code(exercise))


@pytest.mark.parametrize(("exercise", "cell"), ALL_CELLS)
def test_imported_or_wrapped_reference_fails(exercise, cell):
    """A learner who imports the course's answer, or calls it from their own function, gets no points."""
    reference = getattr(exercise.reference, cell.function)

    def wrapper(*args, **kwargs):
        return reference(*args, **kwargs)

    for implementation in (reference, wrapper):
        with pytest.raises(
            CheckFailure, match=r"imported rather than written|calls the course's own|course's reference"
        ):
            run_cell(exercise, cell.full, {cell.function: implementation})


@pytest.mark.parametrize(("exercise", "cell"), ALL_CELLS)
def test_right_implementations_pass(exercise, cell):
    right = [impl for impl in exercise.bank.RIGHT if function_of(impl) == cell.function]
    assert right, f"no correct alternative implementation of {cell.function} in the bank"
    for implementation in right:
        run_cell(exercise, cell.full, {cell.function: implementation})


@pytest.mark.parametrize(("exercise", "cell"), ALL_CELLS)
def test_blank_stub_fails(exercise, cell):
    for code in (cell.visible, cell.full):
        with pytest.raises(CheckFailure, match="not implemented yet"):
            run_cell(exercise, code, {cell.function: blank_stub(cell.function)})


@pytest.mark.parametrize(("exercise", "cell", "implementation", "fragment"), list(_wrong_cases()))
def test_wrong_implementation_fails_with_hint(exercise, cell, implementation, fragment):
    with pytest.raises(CheckFailure) as failure:
        run_cell(exercise, cell.full, {cell.function: implementation})
    assert fragment in str(failure.value), (
        f"expected a message containing {fragment!r}, got:\n{failure.value}"
    )


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_cell_rejects_some_wrong_implementation(assignment):
    exercise = EXERCISES[assignment]
    covered = {grade_id for expected in exercise.bank.WRONG.values() for grade_id in expected}
    assert covered == {cell.grade_id for cell in exercise.tests}


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_bank_size(assignment):
    """At least ten realistic wrong implementations per exercise, and some for every function."""
    exercise = EXERCISES[assignment]
    assert len(exercise.bank.WRONG) >= 10
    assert {function_of(impl) for impl in exercise.bank.WRONG} == set(exercise.functions)


@pytest.mark.parametrize(("exercise", "cell"), ALL_CELLS)
def test_visible_part_runs_without_solutions(exercise, cell, monkeypatch):
    """The boundary of DESIGN.md: a learner without solutions/ can run every visible check."""
    assert "solutions" not in cell.visible
    monkeypatch.setitem(sys.modules, "solutions", None)  # any import of solutions now fails
    for name in list(sys.modules):
        if name.startswith("solutions."):
            monkeypatch.setitem(sys.modules, name, None)
    run_cell(exercise, cell.visible, reference_as_learner_code(exercise))
