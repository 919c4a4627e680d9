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
import atexit
import functools
import os
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attention_course.grading.options import add_options, limits_of, mode_of
from attention_course.registry import ASSIGNMENTS, course_root


@dataclass
class Scan:
    """The notebooks found under the paths given: ``found`` (``{student: notebook}``) and ``refused``
    (``{what was refused: why}``)."""

    found: dict[str, Path] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


def student_id_problem(student: str) -> str:
    """Why ``student`` cannot be a student id (a folder's or a file's name), ``""`` if it can.

    A student id names the learner in every report and the feedback page's file: it must be UTF-8 text
    (a name that is not arrives from the file system as lone surrogates), must not start with a dot (``.``,
    ``..``, hidden files), and must hold no control characters (terminal escapes, new lines) or path
    separators.
    """
    if not student:
        return "an empty name"
    try:
        student.encode("utf-8")
    except UnicodeEncodeError:
        return "a name that is not UTF-8"
    if student.startswith("."):
        return "a name that starts with a dot"
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") or c in "/\\" for c in student):
        return "a name with control characters or path separators"
    return ""


def file_stem(student: str) -> str:
    """A file name for ``student``'s feedback page: the characters of a portable file name only (two students
    whose names give the same stem are refused by :func:`scan_submissions`)."""
    kept = "".join(c if c.isalnum() or c in "-_." else "_" for c in student).strip(".")
    return kept or "_"


def scan_submissions(paths: Sequence[Path], assignment_id: str) -> Scan:
    """The notebooks to grade under ``paths``, each with its student id, and what was refused.

    A file named on the command line is graded as it is; its student is the folder two levels up in
    nbgrader's layout (``.../<student>/<id>/<id>.ipynb``), else its name without ``.ipynb``. A folder is read
    in exactly these places: ``<folder>/<student>/<id>/<id>.ipynb`` (nbgrader's ``submitted/``),
    ``<folder>/<id>/<id>.ipynb`` (one student's folder, the student being the folder's name) and
    ``<folder>/*.ipynb`` (a folder of notebooks, each named for its student). Nothing else under a folder is
    read: a learner's extra notebook beside their own is not a submission of someone else's. Symbolic links
    among the learners' folders and notebooks, invalid student ids (:func:`student_id_problem`) and two
    notebooks with the same student id or the same feedback file are refused, never renamed.

    Raises:
        FileNotFoundError: if a path does not exist.
    """
    scan = Scan()
    candidates: list[tuple[str, Path]] = []  # (student, notebook)
    for path in paths:
        if path.is_file() or (path.is_symlink() and not path.is_dir()):
            nbgrader_layout = path.parent.name == assignment_id and path.stem == assignment_id
            candidates.append((path.parent.parent.name if nbgrader_layout else path.stem, path))
        elif path.is_dir():
            candidates += [(notebook.stem, notebook) for notebook in sorted(path.glob("*.ipynb"))]
            own = path / assignment_id / f"{assignment_id}.ipynb"
            if own.exists() or own.is_symlink():
                candidates.append((Path(os.path.abspath(path)).name, own))
            for student in sorted(path.iterdir()):
                notebook = student / assignment_id / f"{assignment_id}.ipynb"
                if student.name != assignment_id and (notebook.exists() or notebook.is_symlink()):
                    candidates.append((student.name, notebook))
        else:
            raise FileNotFoundError(path)
    by_student: dict[str, list[Path]] = {}
    for student, notebook in candidates:
        shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in student)  # safe on a terminal
        problem = student_id_problem(student)
        if problem:
            scan.refused[shown] = f"the student id is {problem}"
        elif any(part.is_symlink() for part in (notebook, notebook.parent, notebook.parent.parent)):
            scan.refused[shown] = f"{notebook}: a symbolic link (to a file that may not be the learner's)"
        else:
            by_student.setdefault(student, []).append(notebook)
    stems: dict[str, list[str]] = {}
    for student in by_student:
        stems.setdefault(file_stem(student), []).append(student)
    for student, notebooks in by_student.items():
        same_page = stems[file_stem(student)]
        if len(notebooks) > 1:
            scan.refused[student] = (
                f"{len(notebooks)} notebooks have this student id: {', '.join(map(str, notebooks))}"
            )
        elif len(same_page) > 1:
            others = ", ".join(repr(other) for other in same_page if other != student)
            scan.refused[student] = f"its feedback page would overwrite that of {others}"
        else:
            scan.found[student] = notebooks[0]
    return scan


def find_submissions(paths: Sequence[Path], assignment_id: str) -> dict[str, Path]:
    """``{student: notebook}`` for the notebooks under ``paths`` that are graded (:func:`scan_submissions`).

    Raises:
        FileNotFoundError: if a path does not exist.
    """
    return scan_submissions(paths, assignment_id).found


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attention-grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("assignment", choices=sorted(ASSIGNMENTS), help="the assignment id")
    parser.add_argument("submissions", nargs="+", type=Path, help="notebooks, or folders to search for them")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default grading-report/<id>)")
    parser.add_argument("--course", type=Path, default=None, help="course directory (default: this course)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="submissions graded at once")
    add_options(parser.add_argument)  # --mode, and each of Limits' fields
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

    arguments = parser().parse_args(argv)
    root = course_root(arguments.course)
    try:
        scan = scan_submissions(arguments.submissions, arguments.assignment)
    except FileNotFoundError as missing:
        parser().error(f"no such file or folder: {missing}")
    if not scan.found and not scan.refused:
        parser().error("no notebooks found")
    request = Request(
        assignment=arguments.assignment,
        submissions=scan.found,
        refused=scan.refused,
        root=root,
        out=arguments.out or root / "grading-report" / arguments.assignment,
        jobs=max(1, arguments.jobs),
        limits=limits_of(functools.partial(getattr, arguments)),
        mode=mode_of(functools.partial(getattr, arguments)),
        scheduler=arguments.scheduler,
        gradebook=arguments.gradebook,
        formats=tuple(arguments.format),
    )
    try:
        return run(request)
    except UsageError as error:
        parser().error(str(error))


def command_line() -> None:
    """The ``attention-grade`` command: :func:`main`, then an exit without the interpreter's teardown.

    Once :func:`main` has returned, every report, page and gradebook entry is written and closed; what is left
    is the interpreter's clean-up of torch's and nbgrader's modules, 0.4-0.7 s on a 2-core machine. So the
    exit handlers run (``atexit``: the grader's scratch folders are removed), the standard streams are
    flushed, and the process ends at once. An error (a usage error included) ends it the usual way.
    """
    status = main()
    atexit._run_exitfuncs()  # what the interpreter runs first at an exit, before tearing the modules down
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)


if __name__ == "__main__":
    command_line()
