"""Results in the formats that grading platforms read: Gradescope's ``results.json`` and GitHub Classroom's
test-runner result.

**Gradescope** runs an autograder per submission and reads ``/autograder/results/results.json``
(https://gradescope-autograders.readthedocs.io/en/latest/specs/): a total ``score`` and a list of ``tests``
with ``name``, ``score``, ``max_score``, ``status``, ``output`` and ``visibility``. Each test cell of the
notebook becomes two tests:

- ``<grade_id>: visible check``, shown at once (``visibility: visible``), without points: whether the visible
  part passed, with its message, which the learner's notebook shows anyway;
- ``<grade_id>``, with the cell's points and the feedback of :mod:`~attention_course.grading.feedback`,
  shown when the instructor publishes the grades (``visibility: after_published``), since its points and
  output depend on the hidden check. The total and the submission's own output follow the same rule.

Written answers are left out (they are graded by hand, on Gradescope as elsewhere).

**GitHub Classroom**'s reporter (``classroom-resources/autograding-grading-reporter``) reads one JSON
object per test runner, base64-encoded in a step output: ``max_score`` and ``tests`` with ``name``,
``status`` (``pass`` or ``fail``), ``score`` and ``message``; it records the sum of the tests' scores.
:func:`github_classroom` writes that object, so that one grading run reports every cell's points.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attention_course.grading.feedback import CellFeedback, cells_for_learner, file_stem, markdown_page
from attention_course.grading.submission import SubmissionResult

VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")


def _visible_check(result: SubmissionResult, feedback: CellFeedback) -> tuple[str, str] | None:
    """The status and output of a test cell's visible check; ``None`` where it is not known (a cell that
    failed in together mode, where both parts ran in the learner's kernel)."""
    if feedback.passed or feedback.part == "hidden":
        return "passed", "The visible check passed."
    if not result.mode.judged_here and feedback.status == "failed":
        return None
    return "failed", feedback.text


def gradescope(result: SubmissionResult) -> dict[str, Any]:
    """Gradescope's ``results.json`` for one submission (see the module's docstring)."""
    tests = []
    for feedback in cells_for_learner(result):
        if feedback.kind != "auto":
            continue
        name = f"{feedback.grade_id}: {feedback.description}".rstrip(": ")
        visible = _visible_check(result, feedback)
        if visible is not None:
            status, output = visible
            tests.append(
                {
                    "name": f"{feedback.grade_id}: visible check",
                    "status": status,
                    "output": output,
                    "visibility": "visible",
                }
            )
        tests.append(
            {
                "name": name,
                "score": feedback.points or 0.0,
                "max_score": feedback.max_points,
                "status": "passed" if feedback.passed else "failed",
                "output": feedback.text or "Passed: the visible and the hidden checks.",
                "visibility": "after_published",
            }
        )
    return {
        "score": result.score,
        "execution_time": round(result.seconds),
        "output": markdown_page(result),
        "output_format": "md",
        "visibility": "after_published",
        "stdout_visibility": "hidden",
        "tests": tests,
    }


def github_classroom(result: SubmissionResult) -> dict[str, Any]:
    """GitHub Classroom's test-runner result for one submission: every test cell with its points."""
    tests = [
        {
            "name": feedback.grade_id,
            "status": "pass" if feedback.passed else "fail",
            "score": feedback.points or 0.0,
            "message": feedback.text or "passed",
        }
        for feedback in cells_for_learner(result)
        if feedback.kind == "auto"
    ]
    failed = any(test["status"] == "fail" for test in tests)
    status = "error" if result.status == "grader error" else "fail" if failed else "pass"
    return {"version": 1, "status": status, "max_score": result.max_score, "tests": tests}


FORMATS = {
    "gradescope": ("results.json", gradescope),
    "github-classroom": ("github-classroom.json", github_classroom),
}


def write_format(
    name: str, results: Sequence[SubmissionResult], out: Path, failed: dict[str, str] | None = None
) -> list[Path]:
    """Write format ``name`` (a key of :data:`FORMATS`): ``out/<file>`` for one submission, as the platform
    expects it, else ``out/<student>/<file>`` for each. ``failed``: as in
    :func:`~attention_course.grading.feedback.write_feedback`."""
    file_name, make = FORMATS[name]
    written = []
    for result in results:
        try:
            folder = out if len(results) == 1 else out / file_stem(result.student)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / file_name
            path.write_text(json.dumps(make(result), indent=2) + "\n", encoding="utf-8")
        except Exception as error:
            if failed is None:
                raise
            failed[result.student] = f"{name}: {type(error).__name__}: {error}"
            continue
        written.append(path)
    return written
