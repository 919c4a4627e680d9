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
import time
from dataclasses import dataclass, field
from pathlib import Path

from attention_course.grading.sandbox import DEFAULT_LIMITS, Limits


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
        mode: ``"split"`` or ``"together"``.
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
    mode: str = "split"
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

    collecting = gc.isenabled()
    with contextlib.ExitStack() as stack:
        # torch, nbclient and nbgrader are imported below: the collector is off meanwhile (it ran four full
        # collections of the growing heap there, half a second of the start), and what they leave is frozen
        # for the run, never walked again (gc.freeze); both are undone when the batch is graded
        gc.disable()
        stack.callback(gc.unfreeze)
        if collecting:
            stack.callback(gc.enable)
        try:
            backend = stack.enter_context(
                cluster.backend(
                    request.scheduler,
                    jobs=request.jobs,
                    limits=request.limits,
                    mode=request.mode,
                    root=request.root,
                    submissions=len(request.submissions),
                )
            )
        except (ValueError, OSError) as error:
            raise UsageError(f"--scheduler {request.scheduler}: {error}") from error

        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        from attention_course.grading import formats
        from attention_course.grading.batch import grade_batch
        from attention_course.grading.feedback import write_feedback
        from attention_course.grading.gradebook import GradebookError, GradebookWriter, course
        from attention_course.grading.reports import summarise, write_reports
        from attention_course.grading.submission import Job, assignment_context, read_regular_file

        gc.freeze()
        if collecting:
            gc.enable()
        console = Console()
        writer = None
        unrecorded: dict[str, str] = {}  # student: why the gradebook does not have the submission
        failed_writes: list[str] = []
        if request.gradebook is not None:
            nbgrader_course = course(request.root)
            url = request.gradebook or nbgrader_course.db_url
            try:
                master = assignment_context(request.assignment, request.root, request.mode).master
                writer = GradebookWriter(
                    url,
                    request.assignment,
                    master,
                    course_id=nbgrader_course.course_id,
                    course_root=request.root,
                )
            except GradebookError as error:
                raise UsageError(str(error)) from error
            stack.callback(writer.close)

        def content(path: Path) -> bytes | None:  # workers elsewhere cannot read this machine's files
            if not backend.ships_notebooks:
                return None
            try:
                return read_regular_file(path)
            except ValueError:  # the worker refuses it again, with the reason
                return None

        batch = [
            Job(request.assignment, s, path, request.root, request.limits, request.mode, content(path))
            for s, path in request.submissions.items()
        ]
        where = f"on {backend.workers} Dask worker(s) at {request.scheduler}" if request.scheduler else "here"
        console.print(f"grading {where}; isolation: {backend.isolation}", highlight=False)
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

            def on_result(result) -> None:
                troubled = progress.tasks[0].fields["troubled"] + (result.status not in clean)
                progress.update(task, advance=1, troubled=troubled)
                if writer is not None:  # as each result arrives: a batch cut short keeps what was graded
                    try:
                        if not writer.record(result):
                            unrecorded[result.student] = "a grader error: grade it again"
                    except GradebookError as error:
                        unrecorded[result.student] = str(error)
                        failed_writes.append(result.student)

            results = grade_batch(batch, backend.executor, backend.grade, on_result=on_result)
    out = request.out
    settings = {
        "mode": request.mode,
        "limits": request.limits.__dict__,
        "isolation": backend.isolation,
        "scheduler": request.scheduler or "local",
        "workers": backend.workers,
        "refused": request.refused,
    }
    write_reports(results, request.assignment, out, settings)
    not_written: dict[str, str] = {}  # one student's page that cannot be written stops no other
    write_feedback(results, out / "feedback", not_written)
    for name in request.formats:
        formats.write_format(name, results, out, not_written)
    summarise(results, console)
    for student, why in not_written.items():
        console.print(f"not written: {student}: {why}", highlight=False, markup=False)
    for what, why in request.refused.items():
        console.print(f"not graded: {what}: {why}", highlight=False, markup=False)
    elapsed = time.monotonic() - started
    console.print(
        f"{len(results)} submission(s) in {elapsed:.1f} s ({elapsed / max(1, len(results)):.2f} s each); "
        f"reports: {out / 'report.json'}, {out / 'report.csv'}; feedback: {out / 'feedback'}",
        highlight=False,
    )
    if writer is not None:
        recorded = len(results) - len(unrecorded)
        console.print(f"gradebook {writer.shown_url}: {recorded} submission(s) recorded", highlight=False)
        for student, why in unrecorded.items():
            console.print(f"  not recorded: {student}: {why}", highlight=False, markup=False)
    return 1 if failed_writes else 0
