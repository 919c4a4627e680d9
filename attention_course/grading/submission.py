"""Grading one submission: read it, prepare it as nbgrader does, run it in the sandbox, judge it, score it.

:func:`grade_submission` is the unit of work of every batch (:mod:`attention_course.grading.batch`), on any
executor: a :class:`Job` names the assignment, the notebook and the limits, and the result is a
:class:`SubmissionResult`. It never raises for a broken or hostile submission: each gets a verdict.

What does not depend on the submission is made once per process and reused: the master notebook, the
split-mode plans with the reference and their inputs (:func:`assignment_context`), and the sandbox's fork
servers (:func:`default_sandbox`, when the caller passes none).
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import functools
import json
import os
import secrets
import shutil
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from attention_course.grading import split
from attention_course.grading.execute import Execution, execute
from attention_course.grading.notebooks import (
    CellResult,
    clean_text,
    master_notebook,
    prepare,
    recover_metadata,
    score,
)
from attention_course.grading.options import Mode
from attention_course.grading.review import Finding, review
from attention_course.grading.sandbox import (
    DEFAULT_LIMITS,
    Limits,
    Sandbox,
    SandboxError,
    owned_folder,
    release_folder,
    solutions_folder,
)
from attention_course.registry import ASSIGNMENTS

MAX_NOTEBOOK_BYTES = 32 * 2**20  # a larger file is not read ("unreadable")
MAX_CELLS = 2000  # nor a notebook with more cells (the assignments have about 30)

#: a submission's status: how its grading went (the cells say what it earned)
STATUSES = {
    "graded": "every cell ran",
    "graded after restarts": "a cell killed or wedged its kernel; a new kernel ran the cells after it",
    "gave up": "the kernel had to be replaced too often; later cells did not run",
    "timeout": "the submission was stopped at its time limit; later cells did not run",
    "unreadable": "the file is not a notebook",
    "killed the sandbox": "a cell killed the sandbox's fork server (its parent); later cells did not run",
    "grader error": "the grader failed (not the submission's fault): grade it again",
}


@dataclass(frozen=True)
class Job:
    """One submission to grade.

    Attributes:
        assignment: the assignment id (a key of :data:`~attention_course.registry.ASSIGNMENTS`).
        student: the name reports use.
        path: the submitted notebook.
        root: the course directory (its ``solutions/`` holds the source notebook and the reference).
        limits: the sandbox's limits.
        mode: how the test cells are judged (:class:`~attention_course.grading.options.Mode`).
        content: the notebook's bytes, read where the job was made, for a process that cannot read ``path``
            (a worker on another machine); ``None``: the grading process reads ``path``.
    """

    assignment: str
    student: str
    path: Path
    root: Path
    limits: Limits = DEFAULT_LIMITS
    mode: Mode = Mode.SPLIT
    content: bytes | None = field(default=None, repr=False)


@dataclass
class SubmissionResult:
    """The grades of one submission (``status``: a key of :data:`STATUSES`).

    ``notebook`` is the prepared submission with the outputs of the cells that ran (``None`` when it could
    not be read): what nbgrader's gradebook and feedback show (:mod:`~attention_course.grading.gradebook`).
    ``mode`` is how its test cells were judged (see :class:`Job`).
    """

    student: str
    path: str
    status: str
    seconds: float
    cells: list[CellResult] = field(default_factory=list)
    message: str = ""
    warnings: list[str] = field(default_factory=list)
    assignment: str = ""
    mode: Mode = Mode.SPLIT
    notebook: nbformat.NotebookNode | None = field(default=None, repr=False)
    review: list[str] = field(default_factory=list)  # lines an instructor should read (grading.review)

    def __post_init__(self) -> None:
        self.message, self.warnings = clean_text(self.message), [clean_text(w) for w in self.warnings]
        self.mode = Mode(self.mode)  # (a result read back from JSON names it)

    @property
    def score(self) -> float:
        return sum(cell.points or 0.0 for cell in self.cells if cell.kind == "auto")

    @property
    def max_score(self) -> float:
        return sum(cell.max_points for cell in self.cells if cell.kind == "auto")

    def as_dict(self) -> dict:
        return {
            "student": self.student,
            "assignment": self.assignment,
            "mode": self.mode,
            "path": self.path,
            "status": self.status,
            "message": self.message,
            "warnings": self.warnings,
            "seconds": round(self.seconds, 2),
            "score": self.score,
            "max_score": self.max_score,
            "manual_max_score": sum(cell.max_points for cell in self.cells if cell.kind == "manual"),
            "needs_review": self.review,
            "cells": [cell.as_dict() for cell in self.cells],
        }


@dataclass(frozen=True)
class AssignmentContext:
    """What grading an assignment needs, whatever the submission: made once per process."""

    master: nbformat.NotebookNode
    source_dir: Path
    plans: split.Plans | None  # split mode
    inputs: Path | None  # the plans' inputs, written once, copied into each submission's session


_contexts: dict[tuple[str, Path, str], AssignmentContext] = {}
_contexts_lock = threading.Lock()


def assignment_context(assignment_id: str, root: Path, mode: Mode) -> AssignmentContext:
    """The master notebook and, in split mode, the plans and their inputs (cached for the process)."""
    key = (assignment_id, root.resolve(), mode)
    with _contexts_lock:
        if key not in _contexts:
            assignment = ASSIGNMENTS[assignment_id]
            source = assignment.source(root)
            plans = inputs = None
            if mode.judged_here:
                plans = split.make_plans(assignment, split.reference_module(assignment, root))
                inputs = owned_folder("grade-inputs-")
                atexit.register(release_folder, inputs)
                split.write_inputs(plans, inputs)
            _contexts[key] = AssignmentContext(master_notebook(source), source.parent, plans, inputs)
        return _contexts[key]


@functools.cache
def default_sandbox(solutions: Path | None = None, limits: Limits = DEFAULT_LIMITS) -> Sandbox:
    """The process's own sandbox, for executors that run :func:`grade_submission` in other processes (a
    process pool, a Dask worker): one per process, its slots growing with the threads that grade at once."""
    sandbox = Sandbox(solutions=solutions, limits=limits)
    atexit.register(sandbox.close)
    return sandbox


def read_submission(
    path: Path, master: nbformat.NotebookNode, content: bytes | None = None
) -> tuple[nbformat.NotebookNode, list[str]]:
    """The submitted notebook (``content``: its bytes, else read from ``path``), its grade cells found even
    where an editor stripped their metadata.

    Raises:
        ValueError, OSError: if the file is too large or not a notebook.
    """
    if content is None:
        content = read_regular_file(path)
    if len(content) > MAX_NOTEBOOK_BYTES:
        raise ValueError(f"the file has more than {MAX_NOTEBOOK_BYTES // 2**20} MiB")
    # the messages say what is wrong and where, never what the file holds (it may be another file's content)
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"the file is not UTF-8 text (byte {error.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"the file is not JSON: {error.msg} (line {error.lineno}, column {error.colno})"
        ) from None
    except RecursionError:
        raise ValueError("the file's JSON is nested too deeply") from None
    cells = data.get("cells") if isinstance(data, dict) else None
    if isinstance(cells, list) and len(cells) > MAX_CELLS:  # before nbformat validates them all
        raise ValueError(f"the notebook has {len(cells)} cells, more than the {MAX_CELLS} the grader reads")
    try:
        submission = nbformat.reads(text, as_version=4)
    except Exception as error:
        raise ValueError(f"the file is JSON but not a Jupyter notebook ({type(error).__name__})") from None
    return recover_metadata(submission, master)


def read_regular_file(path: Path, limit: int = MAX_NOTEBOOK_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes, opened without following a symbolic
    link and without blocking (a FIFO).

    Raises:
        ValueError: if ``path`` is a symbolic link, not a regular file (a FIFO, a device, a folder), larger
            than ``limit`` or cannot be opened; the message never quotes the file.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ValueError("the notebook is a symbolic link, which the grader does not follow") from None
        raise ValueError(f"the notebook cannot be opened: {os.strerror(error.errno or 0)}") from None
    with os.fdopen(descriptor, "rb") as handle:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise ValueError("the notebook is not a regular file (a FIFO, a device or a folder)")
        if status.st_size > limit:
            raise ValueError(f"the file has more than {limit // 2**20} MiB")
        content = handle.read(limit + 1)
    if len(content) > limit:
        raise ValueError(f"the file has more than {limit // 2**20} MiB")
    return content


def _judge(plans: split.Plans, session: Path, key: bytes, executed: nbformat.NotebookNode) -> dict:
    """The verdict on every test cell that ran, from its recordings: ``{grade_id: None or Verdict}``."""
    verdicts: dict[str, split.Verdict | None] = {}
    for index, cell in enumerate(executed.cells):  # each test cell's recordings were sealed by its index
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in plans.behaviours and cell.get("execution_count") is not None:
            verdicts[grade_id] = split.judge_parts(plans, grade_id, session, key, cell=index)
    return verdicts


def _status(execution: Execution) -> tuple[str, str, str | None]:
    """The submission's status, its message, and why cells did not run (for :func:`score`)."""
    if execution.start_failed:
        return "grader error", execution.stopped or "", execution.stopped
    if execution.sandbox_lost:
        return "killed the sandbox", execution.stopped or "", execution.stopped
    if execution.stopped:
        return "timeout", execution.stopped, execution.stopped
    if execution.gave_up_after is not None:
        return "gave up", STATUSES["gave up"], None
    if execution.restarts:
        replaced = ", ".join(f"cell {r.cell} ({r.reason})" for r in execution.restarts)
        return "graded after restarts", f"a new kernel was started after {replaced}", None
    return "graded", "", None


def grade_submission(job: Job, sandbox: Sandbox | None = None) -> SubmissionResult:
    """Grade one submission in a sandbox slot (``sandbox``: default, the process's own); never raises for
    a broken or hostile submission."""
    start = time.monotonic()
    context = assignment_context(job.assignment, job.root, job.mode)

    def result(
        status: str, cells: list[CellResult], message: str = "", warnings=(), notebook=None, review=()
    ):
        return SubmissionResult(
            job.student,
            str(job.path),
            status,
            time.monotonic() - start,
            cells,
            message,
            list(warnings),
            job.assignment,
            job.mode,
            notebook,
            list(review),
        )

    try:
        submission, warnings = read_submission(job.path, context.master, job.content)
        prepared = prepare(submission, context.master)
    except Exception as error:  # not a notebook, broken JSON, too large, ...
        cells = score(nbformat.v4.new_notebook(), context.master, stopped="the notebook could not be read")
        return result("unreadable", cells, f"{type(error).__name__}: {str(error)[:500]}")
    # split mode's guarantee: calls that the kernel's profiler may not see are read in the code (together
    # mode judges as nbgrader does, in the kernel, and nothing more)
    findings = review(prepared) if job.mode.judged_here else []
    solutions = solutions_folder(job.root) if job.mode.shows_solutions else None
    sandbox = sandbox or default_sandbox(solutions, job.limits)
    key = secrets.token_bytes(32)
    private = owned_folder("grade-recordings-")  # outside every sandbox
    try:
        try:
            with sandbox.slot() as slot:
                for extra in context.source_dir.iterdir():  # files beside the source notebook, as nbgrader
                    if extra.is_file() and extra.suffix != ".ipynb":
                        shutil.copy(extra, slot.scratch)
                session = None
                if context.inputs is not None:
                    session = slot.scratch / "session"
                    shutil.copytree(context.inputs, session / "inputs")
                execution = execute(
                    prepared,
                    slot,
                    job.limits,
                    session=session,
                    key=key,
                    deadline=start + job.limits.timeout,
                    preload=ASSIGNMENTS[job.assignment].kernel_modules,
                )
                if session is not None:
                    if slot.alive:
                        slot.request("sweep")  # nothing may write the recordings from now on
                    if (session / "recordings").is_dir():  # (a dead slot's namespace died with it)
                        shutil.move(session / "recordings", private / "recordings")
        except SandboxError as error:
            cells = score(prepared, context.master, stopped=f"the grader failed: {error}")
            return result("grader error", cells, str(error), warnings)
        status, message, stopped = _status(execution)
        judged = None
        if context.plans is not None:
            judged = _judge(context.plans, private, key, execution.notebook)
        cells = score(
            execution.notebook,
            context.master,
            stopped=stopped,
            judged=judged,
            gave_up_after=execution.gave_up_after,
        )
    finally:
        release_folder(private)
    if findings:
        cells = withhold_from_scratch(cells, findings)
    return result(status, cells, message, warnings, execution.notebook, [str(f) for f in findings])


def is_from_scratch(grade_id: str) -> bool:
    """Whether test cell ``grade_id`` checks that a function is written from scratch (the course names every
    such cell ``*_from_scratch``): what it observes, the calls, is what a learner's process can fake."""
    return grade_id.endswith("_from_scratch")


def withhold_from_scratch(cells: list[CellResult], findings: list[Finding]) -> list[CellResult]:
    """``cells`` with the points of the "from scratch" cells withheld (0, "failed") for an instructor's
    review, because of ``findings`` (:func:`~attention_course.grading.review.review`)."""
    reasons = "; ".join(
        dict.fromkeys(f"line {f.line} of cell {f.cell + 1}: {f.reason}" for f in findings[:3])
    )
    more = f" (and {len(findings) - 3} more)" if len(findings) > 3 else ""
    message = (
        "needs review: the points of this cell are withheld until an instructor has read your code, whose "
        f"calls the grader cannot observe reliably: {reasons}{more}."
    )
    return [
        dataclasses.replace(cell, points=0.0, status="failed", message=message)
        if cell.kind == "auto" and is_from_scratch(cell.grade_id) and (cell.points or 0) > 0
        else cell
        for cell in cells
    ]
