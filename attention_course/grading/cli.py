"""``attention-grade``: grade a folder of submitted notebooks, each in its own process, with limits.

Usage::

    attention-grade ex02_scaled_dot_product submitted/   # submitted/<student>/<id>/<id>.ipynb, as nbgrader
    attention-grade ex02_scaled_dot_product alice.ipynb bob.ipynb --out report/ --jobs 4

Each submission is sanitized as ``nbgrader autograde`` sanitizes it (test cells, hidden tests included,
restored from the source notebook), executed by a worker process in a fresh kernel with a time limit per
cell, a time limit per submission and a memory limit, and scored with nbgrader's own rules, so the points
are those ``nbgrader autograde`` gives. A submission that crashes, hangs or exhausts its memory gets 0 for
the cells it affected; the batch goes on. The report is written as ``report.json`` and ``report.csv`` (one
row per submission and grade cell, with the message of each failing cell), and summarised on the console.

Test cells are judged outside the learner's process (``--mode split``, the default): in the kernel they
only call the learner's functions on the grader's inputs and record what came back; this process judges
the recordings (:mod:`attention_course.grading.split`), so that nothing a submission does to its kernel
(replacing the checks, ``torch.allclose`` or the profiler, hiding its errors) changes a verdict.
``--mode together`` runs the test cells, hidden tests included, in the kernel, as ``nbgrader autograde``.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from attention_course.checks.engine import CheckFailure
from attention_course.grading import split
from attention_course.grading.notebooks import CellResult, master_notebook, prepare, score
from attention_course.grading.worker import GAVE_UP_EXIT
from attention_course.registry import ASSIGNMENTS, Assignment, course_root


@dataclass(frozen=True)
class Limits:
    """Resource limits of one submission.

    Attributes:
        cell_timeout: seconds one cell may run before it is interrupted (nbgrader's ``Execute.timeout``).
        timeout: seconds the whole submission may take, kernel start included, before it is killed.
        memory_mib: data memory (``RLIMIT_DATA``) of the worker and its kernel, in MiB; 0 for no limit.
    """

    cell_timeout: int = 30
    timeout: int = 300
    memory_mib: int = 4096


@dataclass
class SubmissionResult:
    """The grades of one submission."""

    student: str
    path: str
    # "graded", "graded after restarts" (a cell killed or wedged its kernel), "gave up" (too many restarts),
    # "timeout" (killed at the submission's time limit), "unreadable", "worker failed"
    status: str
    seconds: float
    cells: list[CellResult] = field(default_factory=list)
    message: str = ""

    @property
    def score(self) -> float:
        return sum(cell.points or 0.0 for cell in self.cells if cell.kind == "auto")

    @property
    def max_score(self) -> float:
        return sum(cell.max_points for cell in self.cells if cell.kind == "auto")

    def as_dict(self) -> dict:
        return {
            "student": self.student,
            "path": self.path,
            "status": self.status,
            "message": self.message,
            "seconds": round(self.seconds, 2),
            "score": self.score,
            "max_score": self.max_score,
            "manual_max_score": sum(cell.max_points for cell in self.cells if cell.kind == "manual"),
            "cells": [cell.as_dict() for cell in self.cells],
        }


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


def _kill_tree(pid: int) -> None:
    try:
        parent = psutil.Process(pid)
        processes = [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=10)


@dataclass(frozen=True)
class Split:
    """What split mode needs for every submission of a batch: the plans, and their inputs written once."""

    plans: split.Plans
    inputs: Path


def _judge(judging: Split, session: Path, key: bytes, executed: nbformat.NotebookNode) -> dict:
    """The verdict on every test cell that ran, from its recordings: ``{grade_id: None or failure}``."""
    verdicts: dict[str, CheckFailure | None] = {}
    for index, cell in enumerate(executed.cells):  # the worker sealed each test cell's recordings by index
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in judging.plans.behaviours and cell.get("execution_count") is not None:
            verdicts[grade_id] = split.judge_cell(judging.plans, grade_id, session, key, cell=index)
    return verdicts


def grade_one(
    student: str,
    path: Path,
    master: nbformat.NotebookNode,
    source_dir: Path,
    root: Path,
    limits: Limits,
    judging: Split | None = None,
) -> SubmissionResult:
    """Grade one submission in a worker process; never raises for a broken submission.

    With ``judging`` (split mode) the kernel records and this process judges the recordings.
    """
    start = time.monotonic()
    try:
        submission = nbformat.read(path, as_version=4)
        prepared = prepare(submission, master)
    except Exception as error:  # not a notebook, broken JSON, ...
        cells = score(nbformat.v4.new_notebook(), master, stopped="the notebook could not be read")
        return SubmissionResult(
            student,
            str(path),
            "unreadable",
            time.monotonic() - start,
            cells,
            f"{type(error).__name__}: {error}",
        )
    with tempfile.TemporaryDirectory(prefix=f"grade-{student}-") as scratch:
        work = Path(scratch)
        for extra in source_dir.iterdir():  # files beside the source notebook, as nbgrader copies them
            if extra.is_file() and extra.suffix != ".ipynb":
                shutil.copy(extra, work)
        prepared_path, output_path = work / path.name, work / f"{path.stem}.executed.ipynb"
        nbformat.write(prepared, prepared_path)
        session, key = work / "session", secrets.token_bytes(32)
        if judging is not None:
            shutil.copytree(judging.inputs, session / "inputs")
        # together, hidden tests import the reference package `solutions`: from the course directory when it
        # holds it, otherwise from the installed project (a bare solutions/ folder would shadow that one);
        # split, the kernel never needs it
        has_solutions = (root / "solutions" / "__init__.py").is_file()
        importable = [str(root)] if has_solutions and judging is None else []
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([*importable, *filter(None, [os.environ.get("PYTHONPATH")])]),
            "NBGRADER_EXECUTION": "autograde",
            "MPLBACKEND": "Agg",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }
        command = [
            sys.executable,
            "-m",
            "attention_course.grading.worker",
            str(prepared_path),
            str(output_path),
            "--cell-timeout",
            str(limits.cell_timeout),
            "--memory",
            str(limits.memory_mib),
            *(["--session", str(session)] if judging is not None else []),
        ]
        process = subprocess.Popen(
            command,
            cwd=work,
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        status, message, stopped = "graded", "", None
        try:
            _, stderr = process.communicate(input=key.hex().encode() + b"\n", timeout=limits.timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(process.pid)
            process.communicate()
            status = "timeout"
            stopped = message = f"the submission was stopped at its time limit of {limits.timeout} s"
        else:
            if process.returncode == GAVE_UP_EXIT:
                status, message = (
                    "gave up",
                    "the kernel had to be replaced too often; later cells did not run",
                )
            elif process.returncode != 0:
                status = "worker failed"
                tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
                stopped = message = (
                    f"the grading worker failed (exit {process.returncode}): {' / '.join(tail)}"
                )
        executed = nbformat.read(output_path, as_version=4) if output_path.exists() else prepared
        judged = _judge(judging, session, key, executed) if judging is not None else None
    restarts = executed.metadata.get("attention_grade", {}).get("restarts", [])
    if restarts and status == "graded":
        status = "graded after restarts"
        message = "a new kernel was started after " + ", ".join(
            f"cell {r['cell']} ({r['reason']})" for r in restarts
        )
    cells = score(executed, master, stopped=stopped, judged=judged)
    return SubmissionResult(student, str(path), status, time.monotonic() - start, cells, message)


def reference_module(assignment: Assignment, root: Path) -> object:
    """The reference module, from the course directory ``root`` when it holds ``solutions/``."""
    if (root / "solutions" / "__init__.py").is_file() and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(assignment.reference)


def grade(
    assignment_id: str,
    submissions: dict[str, Path],
    *,
    root: Path,
    limits: Limits,
    jobs: int,
    console: Console | None = None,
    mode: str = "split",
) -> list[SubmissionResult]:
    """Grade ``submissions`` of ``assignment_id``, ``jobs`` at a time, with a progress bar.

    ``mode``: ``"split"`` (test cells judged in this process) or ``"together"`` (in the kernel, as nbgrader).
    """
    assignment = ASSIGNMENTS[assignment_id]
    source = assignment.source(root)
    master = master_notebook(source)
    with tempfile.TemporaryDirectory(prefix="grade-inputs-") as inputs:
        judging = None
        if mode == "split":
            judging = Split(split.make_plans(assignment, reference_module(assignment, root)), Path(inputs))
            split.write_inputs(judging.plans, judging.inputs)
        return _grade_all(
            assignment_id, submissions, master, source.parent, root, limits, jobs, console, judging
        )


def _grade_all(assignment_id, submissions, master, source_dir, root, limits, jobs, console, judging):
    """Grade every submission on a pool of ``jobs`` threads, each driving one worker process."""
    console = console or Console(stderr=True)
    results: list[SubmissionResult] = []
    columns = (
        TextColumn("grading {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(assignment_id, total=len(submissions))
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [
                pool.submit(grade_one, student, path, master, source_dir, root, limits, judging)
                for student, path in submissions.items()
            ]
            for future in futures:
                results.append(future.result())
                progress.advance(task)
    return results


def write_reports(
    results: list[SubmissionResult], assignment_id: str, out: Path, limits: Limits, mode: str = "split"
) -> None:
    """Write ``report.json`` (everything) and ``report.csv`` (a row per submission and grade cell)."""
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "assignment": assignment_id,
        "graded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "mode": mode,
        "limits": limits.__dict__,
        "submissions": [result.as_dict() for result in results],
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    with open(out / "report.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "grade_id", "kind", "points", "max_points", "status", "message", "path"])
        for result in results:
            for cell in result.cells:
                points = "" if cell.points is None else cell.points
                writer.writerow(
                    [
                        result.student,
                        cell.grade_id,
                        cell.kind,
                        points,
                        cell.max_points,
                        cell.status,
                        cell.message,
                        result.path,
                    ]
                )


def summarise(results: list[SubmissionResult], console: Console) -> None:
    """A table of scores, then the failing cells of each submission with their messages."""
    table = Table(title="Automatic scores (written answers are graded by hand)")
    for column in ("student", "score", "status", "seconds"):
        table.add_column(column, justify="right" if column in ("score", "seconds") else "left")
    for result in results:
        table.add_row(
            result.student, f"{result.score:g} / {result.max_score:g}", result.status, f"{result.seconds:.1f}"
        )
    console.print(table)
    for result in results:
        failing = [cell for cell in result.cells if cell.kind == "auto" and cell.status != "passed"]
        if failing:
            console.print(f"[bold]{result.student}[/bold]: {len(failing)} failing cell(s)", highlight=False)
            for cell in failing:
                first = cell.message.splitlines()[0] if cell.message else ""
                console.print(f"  {cell.grade_id} ({cell.status}): {first}", highlight=False, markup=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="attention-grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("assignment", choices=sorted(ASSIGNMENTS), help="the assignment id")
    parser.add_argument("submissions", nargs="+", type=Path, help="notebooks, or folders to search for them")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default grading-report/<id>)")
    parser.add_argument(
        "--course",
        type=Path,
        default=None,
        help="course directory (default: the one around here, or this course)",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="submissions graded at once")
    parser.add_argument("--cell-timeout", type=int, default=Limits.cell_timeout, help="seconds per cell")
    parser.add_argument("--timeout", type=int, default=Limits.timeout, help="seconds per submission")
    parser.add_argument(
        "--memory", type=int, default=Limits.memory_mib, help="MiB of memory per submission (0: no limit)"
    )
    parser.add_argument(
        "--mode",
        choices=("split", "together"),
        default="split",
        help="split (default): test cells judged in this process; together: in the kernel, as nbgrader",
    )
    arguments = parser.parse_args(argv)
    console = Console()
    root = course_root(arguments.course)
    try:
        submissions = find_submissions(arguments.submissions, arguments.assignment)
    except FileNotFoundError as missing:
        parser.error(f"no such file or folder: {missing}")
    if not submissions:
        parser.error("no notebooks found")
    limits = Limits(arguments.cell_timeout, arguments.timeout, arguments.memory)
    started = time.monotonic()
    results = grade(
        arguments.assignment, submissions, root=root, limits=limits, jobs=arguments.jobs, mode=arguments.mode
    )
    out = arguments.out or root / "grading-report" / arguments.assignment
    write_reports(results, arguments.assignment, out, limits, arguments.mode)
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
