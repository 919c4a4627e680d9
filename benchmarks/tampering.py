"""Points that hostile ex02 submissions get from each grader, against what their functions deserve.

    python benchmarks/tampering.py

The submissions are the tampering bank of the tests (``tests/banks/tampering.py``). In a scratch course
directory they are graded by ``nbgrader autograde`` (everything in the learner's kernel), by
``attention-grade --mode together`` (the same, with the course's grader) and by ``attention-grade`` in its
default split mode (test cells judged in the grader's process). "Deserved" is what the same functions earn
without the tampering cells, run in this process. The script prints a table; it asserts nothing (the test
``tests/test_tampering.py`` does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attention_course.grading.batch import grade
from attention_course.grading.sandbox import Limits
from attention_course.registry import ASSIGNMENTS
from tests.banks import _bank, tampering
from tests.notebook_tools import ROOT, load_exercise, points_by_running

ASSIGNMENT = "ex02_scaled_dot_product"
ENVIRONMENT = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def nbgrader_points(course: Path, students: list[str]) -> dict[str, float]:
    """Grade ``submitted/`` with ``nbgrader autograde`` and read each student's automatic points."""
    command = [sys.executable, "-m", "nbgrader", "autograde", ASSIGNMENT, "--force"]
    subprocess.run(command, cwd=course, env=ENVIRONMENT, capture_output=True, check=True)
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id="attention-course") as gradebook:
        return {
            student: sum(
                grade.auto_score or 0.0
                for grade in gradebook.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, student).grades
                if grade.cell_type == "code"
            )
            for student in students
        }


def main() -> None:
    exercise = load_exercise(ASSIGNMENT)
    variants = {candidate.id: candidate.source for candidate in _bank.wrong(exercise.bank)}
    with tempfile.TemporaryDirectory() as scratch:
        course = Path(scratch)
        shutil.copy(ROOT / "nbgrader_config.py", course)
        source = ASSIGNMENTS[ASSIGNMENT].source(course)
        source.parent.mkdir(parents=True)
        shutil.copy(ASSIGNMENTS[ASSIGNMENT].source(ROOT), source)
        generate = [sys.executable, "-m", "nbgrader", "generate_assignment", ASSIGNMENT, "--force"]
        subprocess.run(generate, cwd=course, env=ENVIRONMENT, capture_output=True, check=True)
        paths = {}
        for tamper in tampering.TAMPERS:
            path = course / "submitted" / tamper.name / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
            path.parent.mkdir(parents=True)
            nbformat.write(tampering.notebook(tamper, exercise.release_notebook(), variants), path)
            paths[tamper.name] = path
        by_nbgrader = nbgrader_points(course, list(paths))
        ours = {
            mode: {
                r.student: r.score
                for r in grade(ASSIGNMENT, paths, root=course, limits=Limits(), jobs=2, mode=mode)
            }
            for mode in ("together", "split")
        }
    table = Table(title=f"Points of hostile {ASSIGNMENT} submissions (out of 15)")
    for column in (
        "submission",
        "deserved",
        "nbgrader autograde",
        "attention-grade --mode together",
        "attention-grade",
    ):
        table.add_column(column, justify="left" if column == "submission" else "right")
    for tamper in tampering.TAMPERS:
        deserved = sum(points_by_running(exercise, tampering.sources(tamper, variants)).values())
        row = [by_nbgrader[tamper.name], ours["together"][tamper.name], ours["split"][tamper.name]]
        table.add_row(tamper.name, f"{deserved:g}", *(f"{points:g}" for points in row))
    Console(width=150).print(table)


if __name__ == "__main__":
    main()
