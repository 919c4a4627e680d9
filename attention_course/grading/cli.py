"""``attention-grade``: grade a folder of submitted notebooks, fast and in a sandbox.

Usage::

    attention-grade ex02_scaled_dot_product submitted/   # submitted/<student>/<id>/<id>.ipynb, as nbgrader
    attention-grade ex02_scaled_dot_product alice.ipynb bob.ipynb --out report/ --jobs 4

Each submission is sanitized as ``nbgrader autograde`` sanitizes it (test cells, hidden tests included,
restored from the source notebook), executed in a fresh kernel forked inside a sandbox
(:mod:`attention_course.grading.sandbox`: no network, no solutions, limits on time, memory and processes),
and scored with nbgrader's own rules, so the points are those ``nbgrader autograde`` gives. Test cells are
judged outside the learner's process (``--mode split``, the default; ``--mode together`` judges them in the
kernel, as nbgrader does). A broken or hostile submission gets 0 for the cells it affected; the batch goes
on. The report is written as ``report.json`` and ``report.csv`` and summarised on the console.

This module only parses arguments; the work is in :mod:`~attention_course.grading.submission` (one
submission), :mod:`~attention_course.grading.batch` (a batch on an executor) and
:mod:`~attention_course.grading.reports`.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path

from attention_course.registry import ASSIGNMENTS, course_root


def find_submissions(paths: Sequence[Path], assignment_id: str) -> dict[str, Path]:
    """Map a student id to each notebook found under ``paths``.

    In nbgrader's layout (``.../<student>/<assignment>/<assignment>.ipynb``) the student is the folder
    two levels up; otherwise the file name without ``.ipynb``. Checkpoints are skipped.

    Raises:
        FileNotFoundError: if a path does not exist.
    """
    notebooks: list[Path] = []
    for path in paths:
        if path.is_dir():
            notebooks += sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        elif path.is_file():
            notebooks.append(path)
        else:
            raise FileNotFoundError(path)
    found: dict[str, Path] = {}
    for notebook in notebooks:
        nbgrader_layout = notebook.parent.name == assignment_id and notebook.stem == assignment_id
        student = notebook.parent.parent.name if nbgrader_layout else notebook.stem
        name, n = student, 2
        while name in found:
            name, n = f"{student}-{n}", n + 1
        found[name] = notebook
    return found


def parser() -> argparse.ArgumentParser:
    from attention_course.grading.sandbox import Limits

    parser = argparse.ArgumentParser(prog="attention-grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("assignment", choices=sorted(ASSIGNMENTS), help="the assignment id")
    parser.add_argument("submissions", nargs="+", type=Path, help="notebooks, or folders to search for them")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default grading-report/<id>)")
    parser.add_argument("--course", type=Path, default=None, help="course directory (default: this course)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="submissions graded at once")
    parser.add_argument("--cell-timeout", type=int, default=Limits.cell_timeout, help="seconds per cell")
    parser.add_argument("--timeout", type=int, default=Limits.timeout, help="seconds per submission")
    parser.add_argument(
        "--memory", type=int, default=Limits.memory_mib, help="MiB per submission (0: no limit)"
    )
    parser.add_argument(
        "--processes", type=int, default=Limits.processes, help="processes and threads per submission"
    )
    parser.add_argument(
        "--mode",
        choices=("split", "together"),
        default="split",
        help="split (default): test cells judged in this process; together: in the kernel, as nbgrader",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    from attention_course.grading.sandbox import Limits, Sandbox, solutions_folder

    arguments = parser().parse_args(argv)
    started = time.monotonic()
    root = course_root(arguments.course)
    try:
        submissions = find_submissions(arguments.submissions, arguments.assignment)
    except FileNotFoundError as missing:
        parser().error(f"no such file or folder: {missing}")
    if not submissions:
        parser().error("no notebooks found")
    jobs = max(1, arguments.jobs)
    solutions = solutions_folder(root) if arguments.mode == "together" else None
    limits = Limits(arguments.cell_timeout, arguments.timeout, arguments.memory, arguments.processes)
    sandbox = Sandbox(max_slots=jobs, solutions=solutions, limits=limits)
    sandbox.start(min(jobs, len(submissions)))  # the fork servers preload while this process imports below

    import functools
    from concurrent.futures import ThreadPoolExecutor

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from attention_course.grading.batch import grade_batch
    from attention_course.grading.reports import summarise, write_reports
    from attention_course.grading.submission import Job, grade_submission

    console = Console()
    batch = [
        Job(arguments.assignment, s, path, root, limits, arguments.mode) for s, path in submissions.items()
    ]
    console.print(f"isolation: {sandbox.isolation.describe()}", highlight=False)
    columns = (
        TextColumn("grading {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[troubled]} not graded cleanly"),
        TextColumn("about"),
        TimeRemainingColumn(),
        TextColumn("left"),
    )
    clean = {"graded", "graded after restarts"}
    with sandbox, Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(arguments.assignment, total=len(batch), troubled=0)

        def advance(result) -> None:
            troubled = progress.tasks[0].fields["troubled"] + (result.status not in clean)
            progress.update(task, advance=1, troubled=troubled)

        with ThreadPoolExecutor(max_workers=jobs) as executor:
            grade = functools.partial(grade_submission, sandbox=sandbox)
            results = grade_batch(batch, executor, grade, on_result=advance)
    out = arguments.out or root / "grading-report" / arguments.assignment
    settings = {"mode": arguments.mode, "limits": limits.__dict__, "isolation": sandbox.isolation.describe()}
    write_reports(results, arguments.assignment, out, settings)
    summarise(results, console)
    elapsed = time.monotonic() - started
    console.print(
        f"{len(results)} submission(s) in {elapsed:.1f} s ({elapsed / len(results):.2f} s each); "
        f"reports: {out / 'report.json'}, {out / 'report.csv'}",
        highlight=False,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
