"""The hostile bank's verdicts and seconds: ``tests/test_hostile.py``'s batch, printed as a table.

    python benchmarks/hostile.py

One batch, in a scratch course: a clean ex02 submission, the hostile bank (``tests/banks/hostile.py``), the
tampering bank (``tests/banks/tampering.py``) and a clean one again, graded by ``attention-grade`` (split
mode, two jobs). The table gives each submission's status, points and seconds, then whether the course's
files, the gradebook and the listener were untouched and whether any process was left. It asserts nothing
(the test does).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attention_course.grading.sandbox import isolation
from tests.test_hostile import grade_the_banks


def main() -> None:
    console = Console(width=140)
    console.print(f"isolation: {isolation().describe()}", highlight=False)
    with tempfile.TemporaryDirectory() as scratch:
        graded = grade_the_banks(Path(scratch))
    table = Table(title="Hostile ex02 submissions, one batch (15 points)")
    for column in ("submission", "status", "points", "seconds"):
        table.add_column(column, justify="left" if column in ("submission", "status") else "right")
    for name, result in graded["results"].items():
        table.add_row(name, result.status, f"{result.score:g}", f"{result.seconds:.1f}")
    console.print(table)
    console.print(
        f"course files, gradebook and submissions untouched: {graded['untouched']}; "
        f"processes left: {len(graded['left'])}; bytes that reached the listener: "
        f"{sum(map(len, graded['listener']))}",
        highlight=False,
    )


if __name__ == "__main__":
    main()
