"""Are the grader's verdicts stable? The banks of ex01-ex03 graded many times, every difference reported.

    python benchmarks/repeat_grading.py                      # ex01-ex03, 100 runs each
    python benchmarks/repeat_grading.py ex02_scaled_dot_product --runs 5
    python benchmarks/repeat_grading.py --save cpu.json       # and every verdict seen, saved after each run
    python benchmarks/repeat_grading.py --compare cpu.json gpu.json   # verdicts that differ between two saves

For each assignment, one submission per implementation of its bank (``tests/banks/``): every wrong one, each
in place of the reference's function, and every right one. They are graded ``--runs`` times by the
course's grader (split mode, one job per core, one sandbox for all runs), and every cell whose points or
whose submission's status ever differ between runs is listed. The script prints a table; it asserts nothing
(``tests/test_repeat_grading.py`` runs a short version). ``--save`` writes every value each cell and status
took (JSON, rewritten after each run, so that a long run stopped early keeps what it did); ``--compare`` lists
the cells whose values differ between two such files, say one graded on a CPU and one on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import nbformat
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attention_course.device import default_device
from attention_course.grading.batch import grade_batch
from attention_course.grading.sandbox import Limits, Sandbox
from attention_course.grading.submission import Job, SubmissionResult, grade_submission
from tests.banks import _bank
from tests.notebook_tools import ROOT, fill_solutions, load_exercise, reference_sources

DEFAULT = ("ex01_attention_pooling", "ex02_scaled_dot_product", "ex03_masks")


def bank_submissions(assignment: str, folder: Path, every: int = 1) -> dict[str, Path]:
    """One notebook per implementation of the assignment's bank (every ``every``-th one), written to
    ``folder``."""
    exercise = load_exercise(assignment)
    release, right = exercise.release_notebook(), reference_sources(exercise)
    candidates = [*_bank.wrong(exercise.bank), *_bank.right(exercise.bank)][::every]
    paths = {}
    for candidate in candidates:
        path = folder / f"{candidate.id}.ipynb"
        nbformat.write(fill_solutions(release, {**right, candidate.function: candidate.source}), path)
        paths[candidate.id] = path
    return paths


def verdicts(
    runs: list[list[SubmissionResult]], seen: dict[tuple[str, str], set] | None = None
) -> dict[tuple[str, str], set]:
    """``{(student, grade_id or "status"): the distinct values seen}`` over ``runs``, added to ``seen``."""
    seen = defaultdict(set) if seen is None else seen
    for results in runs:
        for result in results:
            seen[(result.student, "status")].add(result.status)
            for cell in result.cells:
                seen[(result.student, cell.grade_id)].add(cell.points)
    return seen


def differences(runs: list[list[SubmissionResult]]) -> dict[tuple[str, str], set]:
    """``{(student, grade_id or "status"): the distinct values seen}`` for those that ever differ."""
    return {key: values for key, values in verdicts(runs).items() if len(values) > 1}


def repeat(
    assignment: str,
    paths: dict[str, Path],
    runs: int,
    jobs: int,
    limits: Limits,
    after_each: Callable[[list[SubmissionResult]], None] | None = None,
) -> list[list]:
    """Grade ``paths`` ``runs`` times on one sandbox; the results of each run. ``after_each`` is called with
    each run's results as it ends."""
    batch = [Job(assignment, student, path, ROOT, limits) for student, path in paths.items()]
    done: list[list[SubmissionResult]] = []
    with Sandbox(max_slots=jobs, limits=limits) as sandbox, ThreadPoolExecutor(max_workers=jobs) as executor:
        sandbox.start(jobs)
        grade = partial(grade_submission, sandbox=sandbox)
        for _ in range(runs):
            done.append(grade_batch(batch, executor, grade))
            if after_each:
                after_each(done[-1])
    return done


def save(path: Path, found: dict[str, dict], runs: dict[str, int]) -> None:
    """Write every value seen, ``{assignment: {"runs": n, "verdicts": {"student grade_id": [values]}}}``."""
    data = {
        assignment: {
            "runs": runs[assignment],
            "verdicts": {f"{s} {g}": sorted(map(str, v)) for (s, g), v in sorted(seen.items())},
        }
        for assignment, seen in found.items()
    }
    path.write_text(json.dumps({"device": str(default_device()), **data}, indent=1))


def compare(first: Path, second: Path) -> None:
    """Print every cell or status whose values differ between two files written by ``--save``."""
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    console = Console(width=160)
    for assignment in sorted(set(a) & set(b) - {"device"}):
        va, vb = a[assignment]["verdicts"], b[assignment]["verdicts"]
        differ = sorted(key for key in set(va) | set(vb) if va.get(key) != vb.get(key))
        console.print(
            f"{assignment}: {len(va)} and {len(vb)} cells and statuses ({a[assignment]['runs']} and "
            f"{b[assignment]['runs']} runs); {len(differ)} differ",
            highlight=False,
        )
        for key in differ:
            console.print(f"  {key}: {va.get(key)} against {vb.get(key)}", highlight=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("assignments", nargs="*", default=DEFAULT)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--save", type=Path, help="write every verdict seen to this JSON file after each run")
    parser.add_argument("--compare", type=Path, nargs=2, help="list the differences of two --save files")
    arguments = parser.parse_args()
    if arguments.compare:
        compare(*arguments.compare)
        return
    table = Table(title=f"Verdicts over {arguments.runs} runs")
    for column in ("assignment", "submissions", "cells graded", "cells or statuses that differ", "seconds"):
        table.add_column(column, justify="left" if column == "assignment" else "right")
    found, seen, done = {}, {}, {}

    def record(assignment: str, results: list[SubmissionResult]) -> None:
        verdicts([results], seen.setdefault(assignment, defaultdict(set)))
        done[assignment] = done.get(assignment, 0) + 1
        save(arguments.save, seen, done)

    for assignment in arguments.assignments:
        with tempfile.TemporaryDirectory() as scratch:
            paths = bank_submissions(assignment, Path(scratch))
            started = time.monotonic()
            after_each = partial(record, assignment) if arguments.save else None
            runs = repeat(assignment, paths, arguments.runs, arguments.jobs, Limits(), after_each=after_each)
            seconds = time.monotonic() - started
        cells = sum(len(result.cells) for results in runs for result in results)
        found[assignment] = differences(runs)
        table.add_row(assignment, str(len(paths)), str(cells), str(len(found[assignment])), f"{seconds:.0f}")
    console = Console(width=160)
    console.print(table)
    for assignment, differing in found.items():
        for (student, what), values in sorted(differing.items()):
            console.print(f"{assignment} {student} {what}: {sorted(map(str, values))}", highlight=False)


if __name__ == "__main__":
    main()
