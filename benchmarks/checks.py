"""Seconds per test cell: each behaviour's visible part (what a learner runs) and its hidden part.

    python benchmarks/checks.py                      # every assignment, on the default device
    python benchmarks/checks.py ex02_scaled_dot_product --repeat 5

Each part runs together (in this process) on the reference compiled as a learner's code, as a test cell
runs it; the figures are its first run (what a learner waits for) and the median of ``--repeat`` runs after
it. Run one assignment per process to see its first runs as a fresh kernel does (imports made by an earlier
assignment are not paid again). The target for a visible part is at most 1 s on a CPU. The script prints a
table; it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import IPython  # noqa: F401 (loaded in a notebook's kernel: the checks modules then load what meta calls need)

from attention_course.device import default_device
from attention_course.registry import ASSIGNMENTS
from tests.notebook_tools import load_exercise, reference_as_learner_code


def seconds(run, repeat: int) -> tuple[float, float]:
    """``(first, median)``: the first run (imports, first kernels, the plan's answers: what a learner waits
    for when the cell runs once) and the median of ``repeat`` runs after it."""
    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("assignments", nargs="*", default=sorted(ASSIGNMENTS))
    parser.add_argument("--repeat", type=int, default=3)
    arguments = parser.parse_args()
    table = Table(title=f"Seconds per test cell part, median of {arguments.repeat}, on {default_device()}")
    for column in ("assignment", "test cell", "visible, first run", "visible", "hidden"):
        table.add_column(column, justify="left" if column in ("assignment", "test cell") else "right")
    for assignment_id in arguments.assignments:
        exercise = load_exercise(assignment_id)
        functions = reference_as_learner_code(exercise)
        for cell in exercise.tests:
            fn = functions[cell.function]
            first, visible = seconds(lambda cell=cell, fn=fn: cell.behaviour(fn), arguments.repeat)
            hidden = seconds(lambda cell=cell, fn=fn: cell.behaviour.hidden(fn), arguments.repeat)[1]
            table.add_row(assignment_id, cell.grade_id, f"{first:.3f}", f"{visible:.3f}", f"{hidden:.3f}")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
