"""``attention-grade``: grade a folder of submitted notebooks, fast and in a sandbox.

Usage::

    attention-grade ex02_scaled_dot_product submitted/   # submitted/<student>/<id>/<id>.ipynb, as nbgrader
    attention-grade ex02_scaled_dot_product alice.ipynb bob.ipynb --out report/ --jobs 4
    attention-grade ex02_scaled_dot_product submitted/ --gradebook            # into nbgrader's gradebook.db
    attention-grade ex02_scaled_dot_product submitted/ --scheduler tcp://grader1:8786   # on a Dask cluster
    attention-grade ex02_scaled_dot_product submission/ --format gradescope --out /autograder/results

Each submission is sanitized as ``nbgrader autograde`` sanitizes it (test cells, hidden tests included,
restored from the source notebook), executed in a fresh kernel forked inside a sandbox
(:mod:`attention_course.grading.sandbox`: no network, no solutions, limits on time, memory and processes),
and scored with nbgrader's own rules, so the points are those ``nbgrader autograde`` gives. Test cells are
judged outside the learner's process (``--mode split``, the default; ``--mode together`` judges them in the
kernel, as nbgrader does). A broken or hostile submission gets 0 for the cells it affected; the batch goes
on. The report is written as ``report.json`` and ``report.csv`` and summarised on the console; each
submission gets a feedback page, ``feedback/<student>.html`` and ``.md``, beside it.

This module only parses arguments; the work is in :mod:`~attention_course.grading.submission` (one
submission), :mod:`~attention_course.grading.batch` (a batch on an executor),
:mod:`~attention_course.grading.cluster` (the executor: threads or Dask),
:mod:`~attention_course.grading.reports`, :mod:`~attention_course.grading.feedback`,
:mod:`~attention_course.grading.formats` (Gradescope, GitHub Classroom) and
:mod:`~attention_course.grading.gradebook` (nbgrader's gradebook).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
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
    parser.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="grade on a Dask cluster: a scheduler's address (tcp://HOST:8786), or local:N for a "
        "LocalCluster of N workers started here (default: --jobs threads on this machine)",
    )
    parser.add_argument(
        "--gradebook",
        nargs="?",
        const="",
        default=None,
        metavar="URL",
        help="also record the grades in nbgrader's gradebook, an SQLAlchemy URL (sqlite:///gradebook.db, "
        "postgresql://user@host/db); without URL, the course's own (nbgrader_config.py, else gradebook.db)",
    )
    parser.add_argument(
        "--format",
        action="append",
        default=[],
        choices=("gradescope", "github-classroom"),
        help="also write Gradescope's results.json or GitHub Classroom's test-runner result (repeatable)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    # nbformat imports jsonschema, which imports rfc3987_syntax where it is installed (Jupyter's servers pull
    # it in) to check the "iri" string format: it compiles a grammar, 2 s of this command's start; no
    # notebook schema uses that format, and jsonschema does without the module
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
    from attention_course.grading.sandbox import Limits

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
    limits = Limits(arguments.cell_timeout, arguments.timeout, arguments.memory, arguments.processes)

    from attention_course.grading import cluster  # (the sandbox only: its fork servers start first)

    with contextlib.ExitStack() as stack:
        try:
            backend = stack.enter_context(
                cluster.backend(
                    arguments.scheduler,
                    jobs=jobs,
                    limits=limits,
                    mode=arguments.mode,
                    root=root,
                    submissions=len(submissions),
                )
            )
        except (ValueError, OSError) as error:
            parser().error(f"--scheduler {arguments.scheduler}: {error}")

        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        from attention_course.grading import formats
        from attention_course.grading.batch import grade_batch
        from attention_course.grading.feedback import write_feedback
        from attention_course.grading.gradebook import GradebookError, GradebookWriter, course
        from attention_course.grading.reports import summarise, write_reports
        from attention_course.grading.submission import MAX_NOTEBOOK_BYTES, Job, assignment_context

        console = Console()
        writer = None
        unrecorded: dict[str, str] = {}  # student: why the gradebook does not have the submission
        failed_writes: list[str] = []
        if arguments.gradebook is not None:
            nbgrader_course = course(root)
            url = arguments.gradebook or nbgrader_course.db_url
            try:
                master = assignment_context(arguments.assignment, root, arguments.mode).master
                writer = GradebookWriter(
                    url, arguments.assignment, master, course_id=nbgrader_course.course_id, course_root=root
                )
            except GradebookError as error:
                parser().error(str(error))
            stack.callback(writer.close)

        def content(path: Path) -> bytes | None:  # workers elsewhere cannot read this machine's files
            if not backend.ships_notebooks or path.stat().st_size > MAX_NOTEBOOK_BYTES:
                return None
            return path.read_bytes()

        batch = [
            Job(arguments.assignment, s, path, root, limits, arguments.mode, content(path))
            for s, path in submissions.items()
        ]
        where = (
            f"on {backend.workers} Dask worker(s) at {arguments.scheduler}" if arguments.scheduler else "here"
        )
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
            task = progress.add_task(arguments.assignment, total=len(batch), troubled=0)

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
    out = arguments.out or root / "grading-report" / arguments.assignment
    settings = {
        "mode": arguments.mode,
        "limits": limits.__dict__,
        "isolation": backend.isolation,
        "scheduler": arguments.scheduler or "local",
        "workers": backend.workers,
    }
    write_reports(results, arguments.assignment, out, settings)
    write_feedback(results, out / "feedback")
    for name in arguments.format:
        formats.write_format(name, results, out)
    summarise(results, console)
    elapsed = time.monotonic() - started
    console.print(
        f"{len(results)} submission(s) in {elapsed:.1f} s ({elapsed / len(results):.2f} s each); "
        f"reports: {out / 'report.json'}, {out / 'report.csv'}; feedback: {out / 'feedback'}",
        highlight=False,
    )
    if writer is not None:
        recorded = len(results) - len(unrecorded)
        console.print(f"gradebook {writer.shown_url}: {recorded} submission(s) recorded", highlight=False)
        for student, why in unrecorded.items():
            console.print(f"  not recorded: {student}: {why}", highlight=False, markup=False)
    return 1 if failed_writes else 0


if __name__ == "__main__":
    raise SystemExit(main())
