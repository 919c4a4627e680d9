"""Where a batch is graded: threads on this machine, or a Dask cluster when one machine is not enough.

:func:`backend` gives what :func:`~attention_course.grading.batch.grade_batch` needs, an executor and the
function that grades one :class:`~attention_course.grading.submission.Job`, for a scheduler named on the
command line (``--scheduler``):

- none: ``jobs`` threads sharing one :class:`~attention_course.grading.sandbox.Sandbox` of ``jobs`` slots;
- ``local:N``: a Dask ``LocalCluster`` of ``N`` worker processes, one thread each, started here;
- ``tcp://HOST:PORT`` (any address ``distributed.Client`` takes): the workers of a running Dask scheduler
  (``dask scheduler`` on one machine, ``dask worker tcp://HOST:8786 --nthreads 2`` on each of the others).

On Dask, the executor is ``distributed.Client.get_executor()``, a :class:`concurrent.futures.Executor`, so
the batch runs the same code as locally; each task grades one submission with
:func:`~attention_course.grading.submission.grade_submission` in the worker's process, inside that process's
own sandbox (:func:`~attention_course.grading.submission.default_sandbox`): the same fork servers, bubblewrap
namespaces and limits as a local run. A worker needs the course installed (``pip install
"attention-course[grading]"``) and the course directory at the same path as the machine that submits
(``Job.root``); the notebooks travel with the jobs (``Job.content``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attention_course.grading.options import Mode
from attention_course.grading.sandbox import Limits, Sandbox, solutions_folder

if TYPE_CHECKING:  # (imported when a backend starts: a local sandbox starts first, then torch is imported)
    from attention_course.grading.submission import Job, SubmissionResult


@dataclass(frozen=True)
class Backend:
    """An executor, the function it runs per job, and how the submissions are isolated where it runs."""

    executor: Executor
    grade: Callable[[Job], SubmissionResult]
    workers: int  # processes (Dask workers) or threads (locally) that grade at once
    isolation: str  # a description of the sandbox, per machine where it differs
    ships_notebooks: bool  # whether jobs must carry their notebook's bytes (workers on other machines)


def parse_scheduler(scheduler: str) -> int | str:
    """The number of workers of ``local:N``, else the scheduler's address as given.

    Raises:
        ValueError: for ``local:`` without a positive number.
    """
    if scheduler.startswith("local:"):
        count = scheduler.removeprefix("local:")
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"--scheduler local:N needs a number of workers N >= 1, not {scheduler!r}")
        return int(count)
    return scheduler


def _worker_isolation() -> str:
    from attention_course.grading.sandbox import isolation

    return isolation().describe()


@contextlib.contextmanager
def backend(
    scheduler: str | None,
    *,
    jobs: int,
    limits: Limits,
    mode: Mode,
    root: Path,
    submissions: int,
    preload: tuple[str, ...] = (),
) -> Iterator[Backend]:
    """The backend for ``scheduler`` (``None``, ``local:N`` or a Dask scheduler's address), closed on exit.

    ``jobs`` is the number of threads of a local run, ``submissions`` the size of the batch (slots are
    started for no more than it), ``preload`` what a local run's fork servers import as they start (the
    assignments' ``kernel_modules``). Raises ``ValueError`` for a malformed ``local:N``, and what
    ``distributed.Client`` raises when the scheduler cannot be reached (``OSError``, ``TimeoutError``).
    """
    if scheduler is None:
        solutions = solutions_folder(root) if mode.shows_solutions else None
        with (
            Sandbox(max_slots=jobs, solutions=solutions, limits=limits, preload=preload) as sandbox,
            ThreadPoolExecutor(max_workers=jobs) as executor,
        ):
            sandbox.start(min(jobs, submissions))  # the fork servers preload while this process imports
            from attention_course.grading.submission import grade_submission

            grade = functools.partial(grade_submission, sandbox=sandbox)
            yield Backend(executor, grade, jobs, sandbox.isolation.describe(), ships_notebooks=False)
        return
    from distributed import Client, LocalCluster

    from attention_course.grading.submission import grade_submission

    target = parse_scheduler(scheduler)
    with contextlib.ExitStack() as stack:
        if isinstance(target, int):
            cluster = stack.enter_context(
                LocalCluster(n_workers=target, threads_per_worker=1, processes=True, dashboard_address=None)
            )
            client = stack.enter_context(Client(cluster))
        else:
            client = stack.enter_context(Client(target, timeout="30s"))
        descriptions = client.run(_worker_isolation)  # {worker address: its sandbox}
        distinct = sorted(set(descriptions.values()))
        isolation = (
            distinct[0] if len(distinct) == 1 else "; ".join(f"{w}: {d}" for w, d in descriptions.items())
        )
        # every task is a new key: two jobs with equal fields are still two gradings
        executor = client.get_executor(pure=False)
        yield Backend(executor, grade_submission, len(descriptions), isolation, ships_notebooks=True)
