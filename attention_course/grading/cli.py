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

This module only parses arguments; :mod:`~attention_course.grading.command` runs the request, over
:mod:`~attention_course.grading.submission` (one submission), :mod:`~attention_course.grading.batch` (a
batch on an executor), :mod:`~attention_course.grading.cluster` (the executor: threads or Dask),
:mod:`~attention_course.grading.reports`, :mod:`~attention_course.grading.feedback`,
:mod:`~attention_course.grading.formats` (Gradescope, GitHub Classroom) and
:mod:`~attention_course.grading.gradebook` (nbgrader's gradebook).
"""

from __future__ import annotations

import argparse
import os
import sys
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
    from attention_course.grading.command import Request, UsageError, run
    from attention_course.grading.sandbox import Limits

    arguments = parser().parse_args(argv)
    root = course_root(arguments.course)
    try:
        submissions = find_submissions(arguments.submissions, arguments.assignment)
    except FileNotFoundError as missing:
        parser().error(f"no such file or folder: {missing}")
    if not submissions:
        parser().error("no notebooks found")
    request = Request(
        assignment=arguments.assignment,
        submissions=submissions,
        root=root,
        out=arguments.out or root / "grading-report" / arguments.assignment,
        jobs=max(1, arguments.jobs),
        limits=Limits(arguments.cell_timeout, arguments.timeout, arguments.memory, arguments.processes),
        mode=arguments.mode,
        scheduler=arguments.scheduler,
        gradebook=arguments.gradebook,
        formats=tuple(arguments.format),
    )
    try:
        return run(request)
    except UsageError as error:
        parser().error(str(error))


if __name__ == "__main__":
    raise SystemExit(main())
