"""Every test cell of every exercise, visible and hidden parts, proven both ways and in both modes.

A test cell must accept the reference and every correct implementation of the bank (einsum, float64 or
float32 inside, other stable softmaxes), reject the blank stub, and reject each wrong implementation of the
bank with the expected hint. A wrong implementation fails *exactly* the cells its bank entry lists, and the
same ones whether a cell runs its visible part only (what a learner sees) or both parts (what is graded).
Split mode (the learner's process records, the grader's process judges) gives every verdict and message of
together mode (one process), for every implementation of the banks.
"""

from __future__ import annotations

import functools
import inspect
import sys
import textwrap

import pytest
import torch

from attention_course.checks import engine
from attention_course.checks.engine import CheckFailure
from attention_course.grading import split
from attention_course.registry import ASSIGNMENTS as REGISTERED
from tests.banks import _bank
from tests.notebook_tools import (
    ROOT,
    blank_stub,
    implementation,
    load_exercise,
    notebook_functions,
    reference_as_learner_code,
    reference_sources,
    run_cell,
    split_verdict,
    together,
)

ASSIGNMENTS = sorted(name for name, assignment in REGISTERED.items() if assignment.source(ROOT).exists())
EXERCISES = {assignment: load_exercise(assignment) for assignment in ASSIGNMENTS}


@functools.cache
def plans(assignment: str) -> split.Plans:
    return split.make_plans(REGISTERED[assignment])


def test_every_assignment_exists():
    assert ASSIGNMENTS == sorted(REGISTERED)


ALL_CELLS = [
    pytest.param(exercise, cell, id=f"{assignment[:4]}-{cell.grade_id}")
    for assignment, exercise in EXERCISES.items()
    for cell in exercise.tests
]
WRONG = [
    pytest.param(exercise, candidate, id=f"{assignment[:4]}-{candidate.id}")
    for assignment, exercise in EXERCISES.items()
    for candidate in _bank.wrong(exercise.bank)
]
RIGHT = [
    pytest.param(exercise, candidate, id=f"{assignment[:4]}-{candidate.id}")
    for assignment, exercise in EXERCISES.items()
    for candidate in _bank.right(exercise.bank)
]


def verdicts(exercise, fn, cells) -> dict[str, tuple[CheckFailure | None, CheckFailure | None]]:
    """``{grade_id: (failure of the visible part, failure of the whole cell)}`` in one process."""
    result = {}
    for cell in cells:
        visible = together(exercise, cell.visible, fn, cell.function)
        result[cell.grade_id] = (visible, visible or together(exercise, cell.hidden, fn, cell.function))
    return result


@pytest.mark.parametrize(("exercise", "cell"), ALL_CELLS)
def test_reference_passes_in_both_modes(exercise, cell):
    fn = reference_as_learner_code(exercise)[cell.function]
    run_cell(exercise, cell.full, {cell.function: fn})
    assert split_verdict(plans(exercise.id), cell, fn) is None


@pytest.mark.parametrize(("exercise", "candidate"), RIGHT)
def test_right_implementations_pass(exercise, candidate):
    fn = implementation(exercise, candidate)
    cells = exercise.cells_of(candidate.function)
    assert cells, f"{candidate.id}: {candidate.function} has no test cell"
    failed = {grade_id: str(full) for grade_id, (_, full) in verdicts(exercise, fn, cells).items() if full}
    assert not failed


@pytest.mark.parametrize(("exercise", "candidate"), WRONG)
def test_wrong_implementation_fails_exactly_its_cells_with_its_hints(exercise, candidate):
    """Exactly the listed cells fail, visible part and whole cell alike, each with its hint, in both modes."""
    fn = implementation(exercise, candidate)
    cells = exercise.cells_of(candidate.function)
    results = verdicts(exercise, fn, cells)
    seen = {grade_id for grade_id, (visible, _) in results.items() if visible}
    graded = {grade_id for grade_id, (_, full) in results.items() if full}
    by_chance = {
        grade_id for grade_id, fragment in candidate.expected.items() if isinstance(fragment, _bank.Chance)
    }
    assert seen - by_chance == graded - by_chance, (
        f"points seen {sorted(seen)} differ from graded {sorted(graded)}"
    )
    assert graded == set(candidate.expected), {k: str(v[1])[:300] for k, v in results.items() if v[1]}
    for grade_id, fragment in candidate.expected.items():
        assert fragment in str(results[grade_id][1]), (
            f"{grade_id}: no {fragment!r} in:\n{results[grade_id][1]}"
        )
    for cell in cells:
        in_split = split_verdict(plans(exercise.id), cell, fn)
        assert str(in_split) == str(results[cell.grade_id][1]), cell.grade_id


@pytest.mark.parametrize(("exercise", "cell"), ALL_CELLS)
def test_blank_stub_fails(exercise, cell):
    stub = blank_stub(cell.function)
    for code in (cell.visible, cell.full):
        assert "not implemented yet" in str(together(exercise, code, stub, cell.function))
    assert "not implemented yet" in str(split_verdict(plans(exercise.id), cell, stub))


@pytest.mark.parametrize(("exercise", "cell"), ALL_CELLS)
def test_imported_wrapped_or_exec_copied_reference_fails(exercise, cell):
    """A learner who imports the course's answer, calls it, or exec()s its source gets no points."""
    reference = getattr(exercise.reference, cell.function)

    def wrapper(*args, **kwargs):
        return reference(*args, **kwargs)

    namespace = {}
    exec(exercise.setup, namespace)
    namespace.update(reference_as_learner_code(exercise))  # the cells above (a class may subclass one)
    exec(textwrap.dedent(inspect.getsource(reference)), namespace)  # no file: as exec() in a notebook
    copied = namespace[cell.function]
    messages = {
        reference: "imported rather than written",
        wrapper: "calls the course's own",
        copied: "loaded with exec() rather than written",
    }
    for fn, fragment in messages.items():
        assert fragment in str(together(exercise, cell.full, fn, cell.function))
        assert fragment in str(split_verdict(plans(exercise.id), cell, fn))


@pytest.mark.parametrize(("exercise", "cell"), ALL_CELLS)
def test_switching_off_the_profiler_fails(exercise, cell):
    """A function that hides its calls by switching off the profiler gets no points, even if correct."""
    reference = getattr(exercise.reference, cell.function)

    def hidden(*args, **kwargs):
        sys.setprofile(None)
        return reference(*args, **kwargs)

    for verdict in (
        together(exercise, cell.full, hidden, cell.function),
        split_verdict(plans(exercise.id), cell, hidden),
    ):
        assert "could not be observed" in str(verdict)


@pytest.mark.parametrize(("exercise", "cell"), ALL_CELLS)
def test_visible_part_runs_without_solutions(exercise, cell, monkeypatch):
    """The boundary of DESIGN.md: a learner without solutions/ can run every visible check."""
    assert "solutions" not in cell.visible
    monkeypatch.setitem(sys.modules, "solutions", None)  # any import of solutions now fails
    for name in list(sys.modules):
        if name.startswith("solutions."):
            monkeypatch.setitem(sys.modules, name, None)
    run_cell(exercise, cell.visible, reference_as_learner_code(exercise))


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_cell_rejects_some_wrong_implementation(assignment):
    exercise = EXERCISES[assignment]
    covered = {grade_id for candidate in _bank.wrong(exercise.bank) for grade_id in candidate.expected}
    assert covered == {cell.grade_id for cell in exercise.tests}


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_bank(assignment):
    """At least ten wrong implementations, some for every function; each row's find occurs exactly once."""
    exercise = EXERCISES[assignment]
    wrong = _bank.wrong(exercise.bank)
    assert len(wrong) >= 10
    assert {candidate.function for candidate in wrong} == set(exercise.functions)
    for row in exercise.bank.ROWS:
        assert exercise.bank.BASES[row.function].count(row.find) == 1, f"{row.variant}: find must occur once"
    assert len({candidate.id for candidate in wrong}) == len(wrong)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_test_cells_are_the_registry_behaviours(assignment):
    """The registry names the grade cells: the notebook's test cells are its behaviours, in order."""
    exercise = EXERCISES[assignment]
    behaviours = engine.behaviours(REGISTERED[assignment])
    assert [cell.behaviour for cell in exercise.tests] == list(behaviours)
    assert set(exercise.functions) == {behaviour.function for behaviour in behaviours}
    assert set(reference_sources(exercise)) == set(exercise.functions)
    assert notebook_functions(exercise, reference_sources(exercise)).keys() == set(exercise.functions)


@pytest.mark.parametrize(
    "error",
    [
        # torch.AcceleratorError is new in torch 2.8: the engine knows a fault by its name and message
        (getattr(torch, "AcceleratorError", None) or type("AcceleratorError", (RuntimeError,), {}))(
            "CUDA error: device-side assert triggered"
        ),
        RuntimeError("CUDA error: an illegal memory access was encountered"),  # as torch < 2.8 raised it
    ],
    ids=["AcceleratorError", "RuntimeError"],
)
def test_an_accelerator_fault_is_the_cells_error_not_an_outcome(error):
    """After a CUDA device-side assert every CUDA call of the process fails, so a fault is raised (with a note
    that says so), not recorded as what the function returned; an ordinary error is recorded."""
    call = engine.Call("attention", {"query": torch.ones(2, 3)})

    def faulty(query):
        raise error

    def wrong(query):
        raise RuntimeError("the shapes do not match")

    with pytest.raises(type(error)) as raised:
        engine.execute(faulty, call)
    assert "restart the kernel" in " ".join(getattr(raised.value, "__notes__", []))
    assert engine.execute(wrong, call).raised == "RuntimeError"
