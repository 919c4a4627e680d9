"""Grading a batch of submissions on any :class:`concurrent.futures.Executor`.

:func:`grade_batch` submits :func:`~attention_course.grading.submission.grade_submission` once per
:class:`~attention_course.grading.submission.Job` to the executor it is given: threads sharing one sandbox
(the command line's default), processes, or a Dask cluster's executor. A submission whose grading fails for a
reason of the grader's own (an exception, a worker lost, a kernel that never started) is graded once more,
then reported as ``grader error``; no failure stops the batch or costs another submission anything.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, ThreadPoolExecutor, wait
from pathlib import Path

import nbformat

from attention_course.grading.notebooks import score
from attention_course.grading.options import Mode
from attention_course.grading.sandbox import DEFAULT_LIMITS, Limits, Sandbox, solutions_folder
from attention_course.grading.submission import Job, SubmissionResult, assignment_context, grade_submission
from attention_course.registry import ASSIGNMENTS


def _grader_error(job: Job, error: BaseException) -> SubmissionResult:
    last = traceback.format_exception_only(type(error), error)[-1].strip()
    message = f"the grader failed (not the submission's fault): {last[:500]}"
    try:
        master = assignment_context(job.assignment, job.root, job.mode).master
        cells = score(nbformat.v4.new_notebook(), master, stopped=message)
    except Exception:  # the assignment itself cannot be loaded (what failed the grading, likely)
        cells = []
    return SubmissionResult(
        job.student,
        str(job.path),
        "grader error",
        0.0,
        cells,
        message,
        assignment=job.assignment,
        mode=job.mode,
    )


def grade_batch(
    jobs: Sequence[Job],
    executor: Executor,
    grade: Callable[[Job], SubmissionResult],
    *,
    retries: int = 1,
    on_result: Callable[[SubmissionResult], None] | None = None,
) -> list[SubmissionResult]:
    """Grade every job on ``executor`` with ``grade``; results in the order of ``jobs``.

    Args:
        jobs: the submissions, of one assignment or several (a student may have a job in each).
        executor: where ``grade`` runs (``grade`` and the jobs must be picklable for a process pool or Dask).
        grade: grades one job: :func:`~attention_course.grading.submission.grade_submission`, or a partial.
        retries: how many times a job whose grading fails for the grader's reasons is graded again.
        on_result: called in this thread with each final result as it arrives (a progress bar).
    """
    # {future: (the job's index, its tries so far)}
    pending = {executor.submit(grade, job): (index, 0) for index, job in enumerate(jobs)}
    results: dict[int, SubmissionResult] = {}
    while pending:
        done, _ = wait(pending, return_when=FIRST_COMPLETED)
        for future in done:
            index, tries = pending.pop(future)
            try:
                result = future.result()
            except Exception as error:  # a lost worker or a bug is one submission's verdict
                result = _grader_error(jobs[index], error)
            if result.status == "grader error" and tries < retries:
                pending[executor.submit(grade, jobs[index])] = (index, tries + 1)
                continue
            results[index] = result
            if on_result is not None:
                on_result(result)
    return [results[index] for index in range(len(jobs))]


def grade(
    assignment_id: str,
    submissions: dict[str, Path],
    *,
    root: Path,
    limits: Limits = DEFAULT_LIMITS,
    jobs: int = 2,
    mode: Mode | str = Mode.SPLIT,
    on_result: Callable[[SubmissionResult], None] | None = None,
) -> list[SubmissionResult]:
    """Grade ``{student: notebook}`` on ``jobs`` threads sharing a sandbox of ``jobs`` slots (locally)."""
    mode = Mode(mode)
    batch = [Job(assignment_id, student, path, root, limits, mode) for student, path in submissions.items()]
    return grade_jobs(batch, jobs=jobs, limits=limits, mode=mode, on_result=on_result)


def grade_jobs(
    batch: Sequence[Job],
    *,
    jobs: int = 2,
    limits: Limits = DEFAULT_LIMITS,
    mode: Mode = Mode.SPLIT,
    on_result: Callable[[SubmissionResult], None] | None = None,
) -> list[SubmissionResult]:
    """Grade ``batch`` (of one assignment or several, with one root and ``mode``) on ``jobs`` threads sharing
    a sandbox of ``jobs`` slots, whose fork servers import every assignment's kernel modules as they start."""
    solutions = solutions_folder(batch[0].root) if batch and mode.shows_solutions else None
    preload = tuple(dict.fromkeys(m for job in batch for m in ASSIGNMENTS[job.assignment].kernel_modules))
    with (
        Sandbox(max_slots=jobs, solutions=solutions, limits=limits, preload=preload) as sandbox,
        ThreadPoolExecutor(max_workers=jobs) as executor,
    ):
        sandbox.start(min(jobs, len(batch)))
        return grade_batch(
            batch, executor, functools.partial(grade_submission, sandbox=sandbox), on_result=on_result
        )
