"""One run of ``attention-grade``: a batch graded where the request says, then its reports.

:func:`run` takes a :class:`Request` (what the command line asked for, already parsed by
:mod:`~attention_course.grading.cli`): it starts the backend (:mod:`~attention_course.grading.cluster`: the
local sandbox first, so that its fork servers preload while this process imports the rest), grades the batch
with a progress bar (submissions done, those not graded cleanly, the time left), records each result in
nbgrader's gradebook as it arrives when asked (:mod:`~attention_course.grading.gradebook`), and writes the
reports, the feedback pages and the platforms' formats.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from attention_course.grading.options import Mode
from attention_course.grading.sandbox import DEFAULT_LIMITS, Limits
from attention_course.registry import ASSIGNMENTS

if TYPE_CHECKING:
    from rich.console import Console

    from attention_course.grading.cluster import Backend
    from attention_course.grading.gradebook import GradebookWriter
    from attention_course.grading.submission import Job, SubmissionResult


class UsageError(Exception):
    """The request cannot run as asked (an unreachable scheduler, a gradebook of another version): the
    command line reports it as a usage error."""


@dataclass(frozen=True)
class Request:
    """What to grade, where, and what to write.

    Attributes:
        assignment: the assignment id.
        submissions: ``{student: notebook}``.
        root: the course directory.
        out: the report folder.
        jobs: submissions graded at once on this machine (without ``scheduler``).
        limits: the sandbox's limits.
        mode: how the test cells are judged.
        scheduler: ``None`` (this machine), ``local:N`` or a Dask scheduler's address.
        gradebook: ``None`` (no gradebook), ``""`` (the course's own) or an SQLAlchemy URL.
        formats: the platforms' formats to write too (``gradescope``, ``github-classroom``).
        refused: ``{what: why}`` for notebooks found but not graded (see
            :func:`~attention_course.grading.cli.scan_submissions`); listed in the report and on the console.
    """

    assignment: str
    submissions: dict[str, Path]
    root: Path
    out: Path
    jobs: int = 1
    limits: Limits = DEFAULT_LIMITS
    mode: Mode = Mode.SPLIT
    scheduler: str | None = None
    gradebook: str | None = None
    formats: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)


def run(request: Request) -> int:
    """Grade the request's batch and write its reports; the exit status (1 when the gradebook refused a
    result).

    Raises:
        UsageError: if the scheduler cannot be reached or the gradebook cannot take the assignment.
    """
    started = time.monotonic()
    from attention_course.grading import cluster  # (the sandbox only: its fork servers start first)

    with contextlib.ExitStack() as stack:
        stack.callback(gc.unfreeze)  # (what the imports left is frozen while the batch is graded)
        with _collector_paused():
            try:
                backend = stack.enter_context(
                    cluster.backend(
                        request.scheduler,
                        jobs=request.jobs,
                        limits=request.limits,
                        mode=request.mode,
                        root=request.root,
                        submissions=len(request.submissions),
                        preload=ASSIGNMENTS[request.assignment].kernel_modules,
                    )
                )
            except (ValueError, OSError) as error:
                raise UsageError(f"--scheduler {request.scheduler}: {error}") from error
            for module in HEAVY_IMPORTS:
                importlib.import_module(module)
        from rich.console import Console

        console = Console()
        recording = _Recording(_gradebook(request, stack))
        where = f"on {backend.workers} Dask worker(s) at {request.scheduler}" if request.scheduler else "here"
        console.print(f"grading {where}; isolation: {backend.isolation}", highlight=False)
        results = _grade(request, _jobs(request, backend), backend, console, recording.record)
    _write(request, results, backend, console)
    elapsed = time.monotonic() - started
    console.print(
        f"{len(results)} submission(s) in {elapsed:.1f} s ({elapsed / max(1, len(results)):.2f} s each); "
        f"reports: {request.out / 'report.json'}, {request.out / 'report.csv'}; feedback: "
        f"{request.out / 'feedback'}",
        highlight=False,
    )
    recording.summarise(len(results), console)
    return 1 if recording.failed_writes else 0


# the modules of the run that import torch, nbclient and nbgrader
HEAVY_IMPORTS = (
    "rich.console",
    "attention_course.grading.batch",
    "attention_course.grading.feedback",
    "attention_course.grading.gradebook",
    "attention_course.grading.reports",
)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The garbage collector off in the block, where the heavy imports are made (it ran four full collections
    of the growing heap there, half a second of the start); what they leave is then frozen (``gc.freeze``),
    never walked again until the caller's ``gc.unfreeze``."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


def _gradebook(request: Request, stack: contextlib.ExitStack) -> GradebookWriter | None:
    """The writer of nbgrader's gradebook the request names (closed with ``stack``), or None."""
    from attention_course.grading.gradebook import GradebookError, GradebookWriter, course
    from attention_course.grading.submission import assignment_context

    if request.gradebook is None:
        return None
    nbgrader_course = course(request.root)
    url = request.gradebook or nbgrader_course.db_url
    try:
        master = assignment_context(request.assignment, request.root, request.mode).master
        writer = GradebookWriter(
            url, request.assignment, master, course_id=nbgrader_course.course_id, course_root=request.root
        )
    except GradebookError as error:
        raise UsageError(str(error)) from error
    stack.callback(writer.close)
    return writer


class _Recording:
    """Each result recorded in the gradebook as it arrives, so that a batch cut short keeps what was graded;
    why a student is not recorded."""

    def __init__(self, writer: GradebookWriter | None) -> None:
        self.writer = writer
        self.unrecorded: dict[str, str] = {}  # student: why the gradebook does not have the submission
        self.failed_writes: list[str] = []

    def record(self, result: SubmissionResult) -> None:
        from attention_course.grading.gradebook import GradebookError

        if self.writer is None:
            return
        try:
            if not self.writer.record(result):
                self.unrecorded[result.student] = "a grader error: grade it again"
        except GradebookError as error:
            self.unrecorded[result.student] = str(error)
            self.failed_writes.append(result.student)

    def summarise(self, graded: int, console: Console) -> None:
        if self.writer is None:
            return
        recorded = graded - len(self.unrecorded)
        console.print(
            f"gradebook {self.writer.shown_url}: {recorded} submission(s) recorded", highlight=False
        )
        for student, why in self.unrecorded.items():
            console.print(f"  not recorded: {student}: {why}", highlight=False, markup=False)


def _jobs(request: Request, backend: Backend) -> list[Job]:
    """The batch's jobs; with the notebooks' bytes for workers that cannot read this machine's files."""
    from attention_course.grading.submission import Job, read_regular_file

    def content(path: Path) -> bytes | None:
        if not backend.ships_notebooks:
            return None
        try:
            return read_regular_file(path)
        except ValueError:  # the worker refuses it again, with the reason
            return None

    return [
        Job(request.assignment, s, path, request.root, request.limits, request.mode, content(path))
        for s, path in request.submissions.items()
    ]


def _grade(
    request: Request,
    batch: list[Job],
    backend: Backend,
    console: Console,
    on_result: Callable[[SubmissionResult], None],
) -> list[SubmissionResult]:
    """Grade ``batch`` on ``backend`` with a progress bar (done, not graded cleanly, time left)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from attention_course.grading.batch import grade_batch

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
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(request.assignment, total=len(batch), troubled=0)

        def arrived(result: SubmissionResult) -> None:
            troubled = progress.tasks[0].fields["troubled"] + (result.status not in clean)
            progress.update(task, advance=1, troubled=troubled)
            on_result(result)

        return grade_batch(batch, backend.executor, backend.grade, on_result=arrived)


def _write(request: Request, results: list[SubmissionResult], backend: Backend, console: Console) -> None:
    """The reports, feedback pages and formats; what was not written and not graded, on the console."""
    from attention_course.grading import formats
    from attention_course.grading.feedback import write_feedback
    from attention_course.grading.reports import summarise, write_reports

    settings = {
        "mode": request.mode,
        "limits": request.limits.__dict__,
        "isolation": backend.isolation,
        "scheduler": request.scheduler or "local",
        "workers": backend.workers,
        "refused": request.refused,
    }
    write_reports(results, request.assignment, request.out, settings)
    not_written: dict[str, str] = {}  # one student's page that cannot be written stops no other
    write_feedback(results, request.out / "feedback", not_written)
    for name in request.formats:
        formats.write_format(name, results, request.out, not_written)
    summarise(results, console)
    for student, why in not_written.items():
        console.print(f"not written: {student}: {why}", highlight=False, markup=False)
    for what, why in request.refused.items():
        console.print(f"not graded: {what}: {why}", highlight=False, markup=False)
