"""Grades into nbgrader's own gradebook, as ``nbgrader autograde`` leaves them.

``attention-grade --gradebook URL`` records each graded submission where nbgrader's tools look for it, so
that ``nbgrader formgrader``, ``nbgrader export`` and ``nbgrader generate_feedback`` work on the grades
unmodified, and written answers wait for manual grading in the formgrader:

- in the gradebook (``nbgrader.api.Gradebook``, any SQLAlchemy URL: SQLite, nbgrader's default, or
  PostgreSQL for several graders at once), the student, the submission (with its ``timestamp.txt``, where
  nbgrader's ``collect`` left one), an automatic score per grade cell with nbgrader's rule for
  ``needs_manual_grade``, and nbgrader's automatic comment on each solution cell ("No response." for one left
  as released), to which the feedback on the cells that test it is added;
- in the course directory, the executed notebook as ``autograded/<student>/<id>/<id>.ipynb``, each failing
  test cell showing the feedback a learner may read (:mod:`~attention_course.grading.feedback`): what
  ``generate_feedback`` renders.

The assignment, its notebook and cells are recorded as ``nbgrader generate_assignment`` records them (its
``SaveCells`` preprocessor, on the same master notebook) when the gradebook does not have them yet.

Several grading processes may write to one PostgreSQL gradebook at once: each write holds a PostgreSQL
advisory lock (setting up the assignment included), and every write is an update-or-create, retried when the
database reports a conflict, so that nothing is lost or written twice. nbgrader's FAQ warns that SQLite is not
safe for concurrent writers; one ``attention-grade`` process writes from one thread.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import datetime
import hashlib
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
from nbformat import NotebookNode

from attention_course.grading.feedback import CellFeedback, cells_for_learner
from attention_course.grading.submission import SubmissionResult, read_regular_file

#: the PostgreSQL advisory lock that serialises the writers of one gradebook (any 64-bit number of our own)
LOCK_KEY = int.from_bytes(hashlib.sha256(b"attention-grade gradebook").digest()[:8], "big", signed=True)
ATTEMPTS = 6


class GradebookError(RuntimeError):
    """The gradebook could not be written, or disagrees with the assignment being graded."""


@dataclass(frozen=True)
class Course:
    """Where nbgrader keeps a course's grades: its gradebook URL, its course id, and its root folder."""

    db_url: str
    course_id: str
    root: Path

    def autograded(self, student: str, assignment_id: str) -> Path:
        """nbgrader's folder of a student's autograded assignment (``autograded/<student>/<id>/``)."""
        from nbgrader.coursedir import CourseDirectory

        directory = CourseDirectory(root=str(self.root))
        return Path(directory.format_path(directory.autograded_directory, student, assignment_id))


def course(root: Path) -> Course:
    """The course directory's gradebook URL and course id, read by nbgrader from its ``nbgrader_config.py``
    (nbgrader's default URL: ``sqlite:///<root>/gradebook.db``)."""
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    config = None
    if (root / "nbgrader_config.py").is_file():
        config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    directory = CourseDirectory(config=config, root=str(root.resolve()))
    return Course(directory.db_url, directory.course_id, root.resolve())


def _defining_cells(master: NotebookNode) -> dict[str, str]:
    """``{function or class name: grade id}`` of the solution cells that define them."""
    defined = {}
    for cell in master.cells:
        nbgrader = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not nbgrader.get("solution") or not nbgrader.get("grade_id"):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        kinds = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
        defined |= {node.name: nbgrader["grade_id"] for node in tree.body if isinstance(node, kinds)}
    return defined


def _grade_id(cell: NotebookNode) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def autograded_notebook(result: SubmissionResult) -> NotebookNode:
    """The executed submission as nbgrader's feedback shows it: each failing test cell ends with an error
    output that says what the learner may know (a hidden check's failure in general terms only), and an
    error that the feedback withholds is replaced by that text.

    Raises:
        ValueError: if the result has no notebook (the submission could not be read).
    """
    if result.notebook is None:
        raise ValueError(f"{result.student}'s submission has no executed notebook ({result.status})")
    notebook = copy.deepcopy(result.notebook)
    feedback = {cell.grade_id: cell for cell in cells_for_learner(result)}
    for cell in notebook.cells:
        shown: CellFeedback | None = feedback.get(_grade_id(cell))
        if cell.cell_type != "code" or shown is None or shown.kind != "auto" or shown.passed:
            continue
        errors = [output for output in cell.outputs if output.output_type == "error"]
        if shown.withheld:
            cell.outputs = [output for output in cell.outputs if output.output_type != "error"]
        if shown.withheld or not errors:
            ename = "CheckFailure" if shown.status == "failed" else shown.status.title().replace(" ", "")
            cell.outputs.append(
                nbformat.v4.new_output("error", ename=ename, evalue=shown.text, traceback=[shown.text])
            )
    return notebook


def _write_atomically(path: Path, notebook: NotebookNode) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".attention-grade-", suffix=".ipynb")
    with os.fdopen(handle, "w", encoding="utf-8") as stream:
        nbformat.write(notebook, stream)
    os.replace(temporary, path)


def submission_timestamp(result: SubmissionResult) -> datetime.datetime | None:
    """When the submission was made: the ``timestamp.txt`` beside its notebook (nbgrader's ``collect``
    writes it), parsed as nbgrader parses it, in UTC; ``None`` where there is none, or it is a symbolic link,
    not a regular file, longer than a timestamp or not a time."""
    from nbgrader import utils

    path = Path(result.path).parent / "timestamp.txt"
    if not path.exists() and not path.is_symlink():
        return None
    try:
        text = read_regular_file(path, limit=256).decode("utf-8").strip()
        return utils.parse_utc(text)
    except (ValueError, OverflowError, UnicodeDecodeError):
        return None


class _Database:
    """nbgrader's gradebook at ``url``: opened for each write, under an advisory lock on PostgreSQL (SQLite's
    own locking serialises its writers), a write tried again after a database error."""

    def __init__(self, url: str, course_id: str) -> None:
        from sqlalchemy import create_engine

        self.url, self.course_id = url, course_id
        self._lock_engine = create_engine(url) if url.startswith("postgresql") else None

    def close(self) -> None:
        if self._lock_engine is not None:
            self._lock_engine.dispose()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._lock_engine is None:
            yield
            return
        from sqlalchemy import text

        with self._lock_engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": LOCK_KEY})
            try:
                yield
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": LOCK_KEY})

    def retrying(self, write: Callable[[], None]) -> None:
        """Run ``write`` under the lock; again after a database error (a conflict, a locked SQLite file).

        Raises:
            GradebookError: after the last attempt.
        """
        from nbgrader.api import InvalidEntry
        from sqlalchemy.exc import SQLAlchemyError

        for attempt in range(ATTEMPTS):
            try:
                with self._locked():
                    write()
                return
            except (SQLAlchemyError, InvalidEntry) as error:
                if attempt == ATTEMPTS - 1:
                    raise GradebookError(f"the gradebook could not be written: {error}") from error
                time.sleep(0.05 * 2**attempt)

    def open(self):
        """nbgrader's ``Gradebook`` (a context manager)."""
        from nbgrader.api import Gradebook

        # nbgrader stamps a new gradebook with `alembic heads`, found on PATH: beside this Python, venv or not
        if shutil.which("alembic") is None:
            os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        return Gradebook(self.url, self.course_id)


class GradebookWriter:
    """Records graded submissions of one assignment into nbgrader's gradebook and autograded folder.

    Args:
        url: the gradebook's SQLAlchemy URL (``sqlite:///gradebook.db``, ``postgresql+psycopg://...``).
        assignment_id: the assignment (its notebook has the same name, as in this course).
        master: the master notebook (:func:`~attention_course.grading.notebooks.master_notebook`).
        course_id: nbgrader's course id (``CourseDirectory.course_id``).
        course_root: the course directory whose ``autograded/`` receives the executed notebooks (``None``:
            none is written).

    Raises:
        GradebookError: if the gradebook's copy of the assignment has other grade cells or points than
            ``master`` (regenerate it with ``nbgrader generate_assignment``).
    """

    def __init__(
        self,
        url: str,
        assignment_id: str,
        master: NotebookNode,
        *,
        course_id: str = "default_course",
        course_root: Path | None = None,
    ) -> None:
        self.url, self.assignment_id, self.master = with_driver(url), assignment_id, master
        self.course_id, self.course_root = course_id, course_root
        self.solution_of = _defining_cells(master)
        self._database = _Database(self.url, course_id)
        self._database.retrying(self._set_up)

    @property
    def shown_url(self) -> str:
        """The gradebook's URL without its password, to print."""
        from sqlalchemy.engine import make_url

        return make_url(self.url).render_as_string(hide_password=True)

    def close(self) -> None:
        self._database.close()

    def __enter__(self) -> GradebookWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _set_up(self) -> None:
        """Record the assignment as ``generate_assignment`` does, unless the gradebook has it; check it."""
        recorded = self._recorded_cells()
        expected = {
            _grade_id(cell): float(cell.metadata.nbgrader["points"])
            for cell in self.master.cells
            if cell.metadata.get("nbgrader", {}).get("grade")
        }
        if recorded is None:
            from nbgrader.preprocessors import SaveCells

            nbgrader = {"notebook": self.assignment_id, "assignment": self.assignment_id, "db_url": self.url}
            SaveCells().preprocess(copy.deepcopy(self.master), {"nbgrader": nbgrader})
        elif recorded != expected:
            raise GradebookError(
                f"the gradebook's {self.assignment_id} has the grade cells {recorded}, but the source "
                f"notebook has {expected}: run `nbgrader generate_assignment {self.assignment_id}` (or use "
                "another gradebook)"
            )

    def _recorded_cells(self) -> dict[str, float] | None:
        """``{grade id: points}`` of the gradebook's copy of the assignment; None (and the assignment
        created) if it has none."""
        from nbgrader.api import MissingEntry

        with self._database.open() as gradebook:
            try:
                notebook = gradebook.find_notebook(self.assignment_id, self.assignment_id)
            except MissingEntry:
                gradebook.update_or_create_assignment(self.assignment_id)
                return None
            return {c.name: c.max_score for c in notebook.grade_cells}

    def record(self, result: SubmissionResult) -> bool:
        """Record one graded submission; ``False`` (nothing written) for a grader error, whose grades are
        not known.

        Raises:
            GradebookError: if the gradebook cannot be written.
        """
        if result.status == "grader error":
            return False
        notebook = autograded_notebook(result) if result.notebook is not None else None
        if notebook is not None and self.course_root is not None:
            self._write_autograded(result, notebook)
        self._database.retrying(lambda: self._write(result, notebook))
        return True

    def _write_autograded(self, result: SubmissionResult, notebook: NotebookNode) -> None:
        """``autograded/<student>/<id>/``: the executed notebook and the submission's time, as nbgrader."""
        course = Course(self.url, self.course_id, self.course_root)
        folder = course.autograded(result.student, self.assignment_id)
        _write_atomically(folder / f"{self.assignment_id}.ipynb", notebook)
        timestamp = submission_timestamp(result)
        if timestamp is not None:  # written from the parsed time, never copied from the learner's file
            (folder / "timestamp.txt").write_text(f"{timestamp:%Y-%m-%d %H:%M:%S.%f} UTC")

    def _write(self, result: SubmissionResult, notebook: NotebookNode | None) -> None:
        """The submission's grades and comments, in one transaction; checked after it."""
        timestamp = submission_timestamp(result)
        fields = {"timestamp": timestamp} if timestamp is not None else {}
        with warnings.catch_warnings(), self._database.open() as gradebook:
            # nbgrader's add_submission builds its rows in an order SQLAlchemy warns about (harmlessly)
            warnings.filterwarnings("ignore", "Object of type", module="nbgrader")
            gradebook.update_or_create_student(result.student)
            gradebook.update_or_create_submission(self.assignment_id, result.student, **fields)
            self._write_grades(gradebook, result)
            if notebook is not None:  # (nbgrader leaves a missing notebook's comments as they are)
                self._write_comments(gradebook, result, notebook)
            gradebook.db.commit()
            written = {
                grade.name: grade.auto_score
                for grade in gradebook.find_submission_notebook(
                    self.assignment_id, self.assignment_id, result.student
                ).grades
            }
        expected = {cell.grade_id: cell.points for cell in result.cells}
        if written != expected:  # the gradebook holds another cell set: it was changed while we wrote
            raise GradebookError(f"{result.student}: the gradebook holds {written}, not {expected}")

    def _write_grades(self, gradebook: Any, result: SubmissionResult) -> None:
        """nbgrader's SaveAutoGrades: each cell's automatic score; manual review where it has none."""
        assignment, student = self.assignment_id, result.student
        for cell in result.cells:
            grade = gradebook.find_grade(cell.grade_id, assignment, assignment, student)
            grade.auto_score = cell.points
            grade.needs_manual_grade = grade.manual_score is not None or cell.points is None

    def _write_comments(self, gradebook: Any, result: SubmissionResult, notebook: NotebookNode) -> None:
        """The feedback on each failed test cell, as the comment of the solution cell it tests; "No
        response." for a solution cell left as released (nbgrader's SaveAutoGrades)."""
        from nbgrader import utils

        comments: dict[str, list[str]] = {}
        for cell in {c.grade_id: c for c in cells_for_learner(result)}.values():
            tested = self.solution_of.get(_function(result.assignment, cell.grade_id))
            if cell.kind == "auto" and not cell.passed and tested:
                comments.setdefault(tested, []).append(f"{cell.grade_id} ({cell.points_text}): {cell.text}")
        submitted = {_grade_id(cell): cell for cell in notebook.cells if _grade_id(cell)}
        for name in {_grade_id(cell) for cell in self.master.cells if utils.is_solution(cell)}:
            comment = gradebook.find_comment(name, self.assignment_id, self.assignment_id, result.student)
            cell = submitted.get(name)
            if cell is not None and _unchanged(cell) and not utils.is_task(cell):
                comment.auto_comment = "No response."
            else:
                comment.auto_comment = "\n\n".join(comments[name]) if name in comments else None


def with_driver(url: str) -> str:
    """``url`` with the PostgreSQL driver that the grading extra installs (psycopg 3) when it names none."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url.removeprefix(plain)
    return url


def _unchanged(cell: NotebookNode) -> bool:
    from nbgrader import utils

    return cell.metadata.nbgrader.get("checksum") == utils.compute_checksum(cell)


def _function(assignment_id: str, grade_id: str) -> str:
    from attention_course.grading.feedback import descriptions

    described = descriptions(assignment_id).get(grade_id)
    return described.function if described else ""
