"""nbgrader's gradebook on PostgreSQL, written by several grading processes at once.

nbgrader's FAQ: SQLite is not safe for concurrent writers; for several graders, PostgreSQL. The test starts
its own server (Debian's binaries, ``make postgresql``; a Unix socket in a temporary folder), and each test
an empty database:

- two ``attention-grade --gradebook postgresql://...`` processes at once, on overlapping sets of the six
  submissions of ``tests/grading_course.py``: both create the assignment in the empty gradebook, both grade
  two of the same students. Every submission is there once, with one grade per cell and the reports' points;
- two processes that write 30 results each as fast as they can, 15 students in common, started together:
  the same, for 45 students.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import zlib

import pytest

from tests import postgres_server
from tests.grading_course import ASSIGNMENT, ENVIRONMENT, make_course
from tests.notebook_tools import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgresql")]


@pytest.fixture(scope="module")
def server():
    reason = postgres_server.why_not()
    if reason:
        pytest.skip(reason)
    with postgres_server.running() as running:
        yield running


def _counts(url: str) -> dict[str, int]:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as connection:
        tables = (
            "assignment",
            "notebook",
            "grade_cells",
            "student",
            "submitted_assignment",
            "grade",
            "comment",
        )
        counts = {t: connection.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in tables}
    engine.dispose()
    return counts


def _points(url: str) -> dict[str, dict[str, float | None]]:
    from nbgrader.api import Gradebook

    with Gradebook(url) as gradebook:
        return {
            submission.student_id: {grade.name: grade.auto_score for grade in submission.notebooks[0].grades}
            for submission in gradebook.assignment_submissions(ASSIGNMENT)
        }


def test_two_grading_processes_write_one_gradebook_at_once(server, tmp_path):
    url = server.create_database("two_graders")
    paths = make_course(tmp_path / "course")
    students = sorted(paths)
    sets = {"first": students[:4], "second": students[2:]}  # two students graded by both
    processes = {}
    for name, chosen in sets.items():
        command = [sys.executable, "-m", "attention_course.grading.cli", ASSIGNMENT]
        command += [str(paths[s]) for s in chosen]
        command += ["--course", str(tmp_path / "course"), "--out", str(tmp_path / name), "--jobs", "1"]
        command += ["--gradebook", url]
        processes[name] = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=ENVIRONMENT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    outputs = {name: process.communicate(timeout=600)[0] for name, process in processes.items()}
    for name, process in processes.items():
        assert process.returncode == 0, outputs[name][-3000:]
        assert f"{len(sets[name])} submission(s) recorded" in " ".join(outputs[name].split())
    reported = {}
    for name in sets:
        for submission in json.loads((tmp_path / name / "report.json").read_text())["submissions"]:
            reported[submission["student"]] = {c["grade_id"]: c["points"] for c in submission["cells"]}
    assert _points(url) == reported
    counts = _counts(url)
    cells = len(next(iter(reported.values())))
    assert counts["assignment"] == counts["notebook"] == 1 and counts["grade_cells"] == cells
    assert counts["student"] == counts["submitted_assignment"] == len(students)
    assert counts["grade"] == len(students) * cells


WRITER = textwrap.dedent("""
    import sys, time, zlib
    from pathlib import Path
    from attention_course.grading.gradebook import GradebookWriter
    from attention_course.grading.notebooks import CellResult, master_notebook
    from attention_course.grading.submission import SubmissionResult
    from attention_course.registry import ASSIGNMENTS

    url, first, last, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    master = master_notebook(ASSIGNMENTS[{assignment!r}].source(Path({root!r})))
    grade_cells = [c for c in master.cells if c.metadata.get("nbgrader", {{}}).get("grade")]
    while time.time() < start:
        time.sleep(0.005)
    writer = GradebookWriter(url, {assignment!r}, master)
    for number in range(first, last):
        student = f"student-{{number:03d}}"
        cells = []
        for cell in grade_cells:
            nbgrader = cell.metadata.nbgrader
            kind = "manual" if nbgrader.get("solution") else "auto"
            full = float(nbgrader["points"])
            coin = zlib.crc32(f"{{student}}{{nbgrader['grade_id']}}".encode()) % 2
            points = None if kind == "manual" else full * coin
            cells.append(CellResult(nbgrader["grade_id"], kind, points, full, "passed"))
        writer.record(SubmissionResult(student, "", "graded", 0.1, cells, assignment={assignment!r}))
    writer.close()
""")


def test_concurrent_writers_lose_and_duplicate_nothing(server, tmp_path):
    url = server.create_database("concurrent_writers")
    script = WRITER.format(assignment=ASSIGNMENT, root=str(ROOT))
    start = time.time() + 8  # both import, then write at once
    ranges = [(0, 30), (15, 45)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, url, str(first), str(last), str(start)],
            env=ENVIRONMENT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for first, last in ranges
    ]
    for process in processes:
        output = process.communicate(timeout=300)[0]
        assert process.returncode == 0, output[-3000:]
    from attention_course.grading.notebooks import master_notebook
    from attention_course.registry import ASSIGNMENTS

    master = master_notebook(ASSIGNMENTS[ASSIGNMENT].source(ROOT))
    grade_cells = [c.metadata.nbgrader for c in master.cells if c.metadata.get("nbgrader", {}).get("grade")]
    expected = {
        f"student-{number:03d}": {
            cell["grade_id"]: None
            if cell.get("solution")
            else float(cell["points"]) * (zlib.crc32(f"student-{number:03d}{cell['grade_id']}".encode()) % 2)
            for cell in grade_cells
        }
        for number in range(45)
    }
    assert _points(url) == expected
    counts = _counts(url)
    assert counts["student"] == counts["submitted_assignment"] == 45
    assert counts["grade"] == 45 * len(grade_cells) and counts["assignment"] == counts["notebook"] == 1
