"""The nbgrader round trip, and the course's grader against it.

In scratch course directories (each holding several assignments), with the course's nbgrader_config.py
and nbgrader's own commands: ``generate_assignment``, ``autograde`` and ``generate_feedback`` of a solved
submission, buggy submissions (wrong functions from the bank, in two submissions), and, for three
assignments, the blank release and a submission that deleted and edited test cells and prints to stderr.
Each gets the points expected, and ``attention-grade`` gives the same points, cell by cell. ``nbgrader
validate`` passes on a source notebook, and ``nbgrader validate --invert`` finds that no test cell of a
release passes (one of each: for every assignment, the solved submissions show the first, and
tests/test_checks.py the second on the blank stubs).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from attention_course.grading.batch import grade_jobs
from attention_course.grading.sandbox import Limits
from attention_course.grading.submission import Job, SubmissionResult
from attention_course.registry import ASSIGNMENTS
from tests.banks import _bank
from tests.grading_course import nbgrader, start_nbgrader, write_config
from tests.notebook_tools import (
    ROOT,
    Exercise,
    fill_solutions,
    load_exercise,
    points_by_running,
    reference_sources,
)

pytestmark = pytest.mark.slow
PRESENT = [name for name, assignment in sorted(ASSIGNMENTS.items()) if assignment.source(ROOT).exists()]
# prints to stderr in its last function, and has deleted and edited test cells
CHATTY = "prints-to-stderr-edits-tests"
# The promises of the CHATTY and the blank submissions are the graders', whatever the exercise: they are
# made for one assignment or two of each round-trip course below (a notebook more costs nbgrader a kernel,
# about 4 s on a loaded machine). That no test cell of any release passes on the blank stubs is shown for
# every cell of every assignment by tests/test_checks.py::test_blank_stub_fails (the cells' own checks).
GRADERS_PROMISES_IN = ("ex01_attention_pooling", "ex02_scaled_dot_product", "ex11_tiled_attention")
WRITTEN_ANSWER = "Because the queries come from the target, which is generated left to right..."


@dataclass
class Submission:
    student: str
    notebook: nbformat.NotebookNode
    expected: dict[str, float | None]  # grade id -> points (None: waiting for manual grading)


def _answer_written_answers(notebook: nbformat.NotebookNode) -> None:
    for cell in notebook.cells:
        nbgrader_metadata = cell.metadata.get("nbgrader", {})
        if (
            cell.cell_type == "markdown"
            and nbgrader_metadata.get("solution")
            and nbgrader_metadata.get("grade")
        ):
            cell.source = WRITTEN_ANSWER


def submissions(exercise: Exercise) -> list[Submission]:
    """The submissions of the round trip, each with the points it must get."""
    release = exercise.release_notebook()
    right_sources = reference_sources(exercise)
    manual = [
        c.metadata.nbgrader["grade_id"]
        for c in release.cells
        if c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("grade")
    ]
    full = {cell.grade_id: cell.points for cell in exercise.tests}

    solved = fill_solutions(release, right_sources)
    _answer_written_answers(solved)
    result = [Submission("solved", solved, {**full, **dict.fromkeys(manual)})]
    if exercise.assignment.id in GRADERS_PROMISES_IN:
        result.append(
            Submission("blank", release, {**dict.fromkeys(full, 0.0), **dict.fromkeys(manual, 0.0)})
        )
    # wrong functions from the bank, in two submissions: the first wrong implementation of each function, the
    # functions taken alternately, so that each submission keeps some functions right and gets partial points
    # (nbgrader starts a kernel for every notebook, about 3 s with its feedback on 2 cores: one submission per
    # function cost 37 of them)
    first: dict[str, _bank.Implementation] = {}
    for candidate in _bank.wrong(exercise.bank):
        first.setdefault(candidate.function, candidate)
    wrong = list(first.values())
    for group in (wrong[0::2], wrong[1::2]):
        sources = {**right_sources, **{candidate.function: candidate.source for candidate in group}}
        expected = points_by_running(exercise, sources)
        for candidate in group:  # the bank agrees: each wrong function loses its cells
            assert all(expected[grade_id] == 0 for grade_id in candidate.expected), candidate.function
        buggy = fill_solutions(release, sources)
        name = "-".join(candidate.function for candidate in group)
        result.append(Submission(f"buggy-{name}", buggy, {**expected, **dict.fromkeys(manual, 0.0)}))
    if exercise.assignment.id not in GRADERS_PROMISES_IN:
        return result
    # one submission for three promises, each seen in its points (each submission costs nbgrader a kernel):
    # a function that prints to stderr gets 0 in every test cell that shows it, from nbgrader; a deleted test
    # cell and edited ones come back from the source, hidden tests included (left as the learner made them,
    # the edited cells of that function would pass and the deleted one would have no grade)
    chatty_name = exercise.functions[-1]  # no other function calls the last one
    lines = right_sources[chatty_name].splitlines()
    docstring_end = max(i for i, line in enumerate(lines) if line.strip().endswith('"""'))
    body = next(line for line in lines[docstring_end + 1 :] if line.strip())  # a class: its last method
    indent = body[: len(body) - len(body.lstrip())]
    lines.insert(docstring_end + 1, f'{indent}print("debugging", file=__import__("sys").stderr)')
    chatty = fill_solutions(release, {**right_sources, chatty_name: "\n".join(lines)})
    _answer_written_answers(chatty)
    first_test = exercise.tests[0].grade_id
    chatty.cells = [c for c in chatty.cells if c.metadata.get("nbgrader", {}).get("grade_id") != first_test]
    for cell in chatty.cells:
        if cell.metadata.get("nbgrader", {}).get("grade") and cell.cell_type == "code":
            cell.source = "pass  # the learner emptied this test"
    chatty_expected = {
        cell.grade_id: (0.0 if cell.function == chatty_name else cell.points) for cell in exercise.tests
    }
    result.append(Submission(CHATTY, chatty, {**chatty_expected, **dict.fromkeys(manual)}))
    return result


# The round trips of several assignments share one scratch course: nbgrader takes an assignment id glob, so
# one generate_assignment, one autograde and one generate_feedback serve them all, and nbgrader's start-up
# (several seconds a command) is paid once per course. Two courses, one per worker of `make test`, of
# about the same grading time (measured per assignment on 2 cores).
ROUND_TRIP_A = ["ex01_attention_pooling", "ex03_masks", "ex07_transformer_block", "ex08_positional"]
ROUND_TRIP_B = ["ex02_scaled_dot_product", "ex04_multi_head", "ex05_grouped_query", "ex06_cross_attention"]
COURSES = {
    "round-trip-a": [*ROUND_TRIP_A, "ex11_tiled_attention"],
    "round-trip-b": [*ROUND_TRIP_B, "ex09_conv_heads", "ex10_kv_cache"],
}
# an assignment added later and not listed above has a course of its own
COURSES |= {f"round-trip-{a}": [a] for a in PRESENT if not any(a in listed for listed in COURSES.values())}
COURSE_OF = {assignment: course for course, assignments in COURSES.items() for assignment in assignments}


@dataclass
class RoundTrip:
    """One assignment's submissions and their points from nbgrader and from attention-grade."""

    cases: list[Submission]
    by_nbgrader: dict[str, dict[str, float | None]]
    by_us: dict[str, dict[str, float | None]]
    results: dict[str, SubmissionResult]


def grade_course(assignments: list[str], course: Path) -> dict[str, RoundTrip]:
    """Grade the submissions of ``assignments`` in the scratch course ``course`` with nbgrader's commands and
    with attention-grade."""
    write_config(course)
    for assignment in assignments:
        source = ASSIGNMENTS[assignment].source(course)
        source.parent.mkdir(parents=True)
        shutil.copy(ASSIGNMENTS[assignment].source(ROOT), source)
    generated = nbgrader("generate_assignment", "*", "--force", cwd=course)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    cases = {assignment: submissions(load_exercise(assignment)) for assignment in assignments}
    paths: dict[str, dict[str, Path]] = {assignment: {} for assignment in assignments}
    for assignment, submitted in cases.items():
        for case in submitted:
            path = course / "submitted" / case.student / assignment / f"{assignment}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(case.notebook, path)
            paths[assignment][case.student] = path
    autograding = start_nbgrader("autograde", "*", "--force", cwd=course)
    try:
        # attention-grade: every assignment of the course in one batch on one sandbox (its fork servers
        # import torch once for all of them)
        batch = [Job(a, s, path, course, Limits()) for a in assignments for s, path in paths[a].items()]
        ours = grade_jobs(batch)
    finally:
        log, _ = autograding.communicate()
    assert autograding.returncode == 0, log

    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id="attention-course") as gradebook:
        by_nbgrader = {
            assignment: {
                case.student: {
                    g.name: g.auto_score
                    for g in gradebook.find_submission_notebook(assignment, assignment, case.student).grades
                }
                for case in submitted
            }
            for assignment, submitted in cases.items()
        }
    feedback = nbgrader("generate_feedback", "*", "--force", cwd=course)
    assert feedback.returncode == 0, feedback.stdout + feedback.stderr
    for assignment, submitted in cases.items():
        for case in submitted:
            assert (course / "feedback" / case.student / assignment / f"{assignment}.html").is_file()
    round_trips = {}
    for assignment, submitted in cases.items():
        results = {result.student: result for result in ours if result.assignment == assignment}
        points = {student: {cell.grade_id: cell.points for cell in r.cells} for student, r in results.items()}
        round_trips[assignment] = RoundTrip(submitted, by_nbgrader[assignment], points, results)
    return round_trips


@pytest.fixture(scope="module")
def graded_courses(tmp_path_factory) -> Callable[[str], dict[str, RoundTrip]]:
    """``graded(course)``: the round trips of a course of COURSES, graded at its first use in this worker."""
    graded: dict[str, dict[str, RoundTrip]] = {}

    def of(course: str) -> dict[str, RoundTrip]:
        if course not in graded:
            graded[course] = grade_course(COURSES[course], tmp_path_factory.mktemp(course))
        return graded[course]

    return of


# each course's round trips run on one xdist worker (make test runs with --dist loadgroup)
@pytest.fixture(params=[pytest.param(a, marks=pytest.mark.xdist_group(COURSE_OF[a])) for a in PRESENT])
def round_trip(request, graded_courses) -> RoundTrip:
    """The round trip of one assignment."""
    return graded_courses(COURSE_OF[request.param])[request.param]


def test_nbgrader_gives_the_expected_points(round_trip):
    for case in round_trip.cases:
        assert round_trip.by_nbgrader[case.student] == case.expected, case.student


def test_the_course_grader_agrees_with_nbgrader(round_trip):
    for case in round_trip.cases:
        assert round_trip.by_us[case.student] == round_trip.by_nbgrader[case.student], case.student


def test_the_course_grader_explains_failures(round_trip):
    results = round_trip.results
    for result in results.values():
        assert result.status == "graded"
        for cell in result.cells:
            if cell.kind == "auto" and cell.points == 0:
                assert cell.message, f"{result.student}/{cell.grade_id} failed without a message"
    if "blank" in results:
        assert all("not implemented yet" in c.message for c in results["blank"].cells if c.kind == "auto")
    if CHATTY in results:
        assert all("stderr" in c.message for c in results[CHATTY].cells if c.points == 0)


SUCCESS = {
    False: "Success! Your notebook passes all the tests.",
    True: "Success! The notebook does not pass any tests.",
}


def _validate(notebook: Path, invert: bool) -> None:
    validated = nbgrader("validate", *(["--invert"] if invert else []), str(notebook), cwd=ROOT)
    assert SUCCESS[invert] in validated.stdout, validated.stdout + validated.stderr


@pytest.mark.xdist_group("validate")
def test_nbgrader_validate_passes_on_a_source():
    """``nbgrader validate`` works with the course's configuration, on one source notebook (each notebook
    costs it a kernel, about 2.5 s on 2 cores). That every source's solutions pass every test cell, hidden
    parts included, is shown for every assignment by its round trip: the release filled with the reference
    solutions (``solved``) gets full points from ``nbgrader autograde``."""
    _validate(ASSIGNMENTS["ex02_scaled_dot_product"].source(ROOT), False)


@pytest.mark.xdist_group("validate")
def test_nbgrader_validate_invert_fails_every_test_cell_of_a_release():
    """``nbgrader validate --invert`` works with the course's configuration, on one release. That no test cell
    of any release passes is shown for every cell of every assignment by tests/test_checks.py (each cell's
    check fails on the blank stub), and under ``nbgrader autograde`` by three round trips' ``blank``."""
    _validate(ASSIGNMENTS["ex02_scaled_dot_product"].release(ROOT), True)
