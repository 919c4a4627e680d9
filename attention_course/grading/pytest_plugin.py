"""A pytest plugin that grades notebooks: ``pytest --grade ASSIGNMENT PATH...``.

With ``--grade``, pytest collects the notebooks under ``PATH`` (in nbgrader's layout
``<student>/<assignment>/<assignment>.ipynb`` the student is the folder's name, else the file's stem) and
makes one test item per submission and grade cell, ``alice::sdpa_mask``. The submissions are graded by
``attention-grade``'s engine, with the same isolation (:mod:`~attention_course.grading.cluster`: local
threads and a sandbox, or a Dask cluster with ``--grade-scheduler``), all at once in the background as soon
as collection ends; each item then reports its cell. An item:

- passes when its cell earned its points;
- fails when the learner's cell did not, with the cell's message (for the instructor: hidden checks'
  messages in full);
- is skipped for a written answer (graded by hand);
- fails for an infrastructure error: the grader could not grade the submission.

Every item records ``points``, ``max_points`` and ``status`` as JUnit XML properties (``--junitxml``). The
run exits non-zero only for infrastructure errors (and pytest's own usage or collection errors): a
learner's failed cells are the grades, not a failure of the run.

Without ``--grade`` the plugin does nothing, so it never changes how a project's own tests run. With it,
pytest collects notebooks only, reads no ``conftest.py`` and imports no ``__init__.py`` of the submissions'
folders: code in a submission runs in the sandbox, never in pytest's process.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from attention_course.grading.options import add_options, limits_of, mode_of

if TYPE_CHECKING:
    from attention_course.grading.notebooks import CellResult
    from attention_course.grading.submission import SubmissionResult


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attention-grade", "grading exercise notebooks (attention-grade's engine)")
    group.addoption(
        "--grade",
        metavar="ASSIGNMENT",
        default=None,
        help="grade the notebooks under the given paths for ASSIGNMENT: one item per submission and cell",
    )
    group.addoption("--grade-course", metavar="DIR", default=None, help="course directory (default: this)")
    group.addoption(
        "--grade-jobs", type=int, default=os.cpu_count() or 1, help="submissions graded at once (locally)"
    )
    add_options(group.addoption, prefix="grade-")  # --grade-mode, and each of Limits' fields
    group.addoption(
        "--grade-scheduler",
        metavar="ADDRESS",
        default=None,
        help="grade on a Dask cluster (tcp://HOST:8786, or local:N); default: threads here",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    """With ``--grade``, no ``conftest.py`` is loaded: one in a submission's folder would run in pytest."""
    if getattr(early_config.known_args_namespace, "grade", None):
        early_config.known_args_namespace.noconftest = True


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("grade"):
        config.pluginmanager.register(Grading(config), "attention-grade-session")


class GraderError(Exception):
    """The grader could not grade a submission (not the learner's fault)."""


class CellFailed(Exception):
    """A learner's test cell earned no points (a grade, not an error of the run)."""

    def __init__(self, cell: CellResult) -> None:
        super().__init__(cell.message)
        self.cell = cell


def _students(paths: list[Path], assignment_id: str) -> dict[Path, str]:
    """``{notebook: student}`` as ``attention-grade`` names them (see :func:`~.cli.find_submissions`)."""
    from attention_course.grading.cli import find_submissions

    return {path.resolve(): student for student, path in find_submissions(paths, assignment_id).items()}


class Grading:
    """The state of one ``pytest --grade`` run: what was collected, the background grading, the results."""

    def __init__(self, config: pytest.Config) -> None:
        from attention_course.grading.notebooks import master_notebook
        from attention_course.registry import ASSIGNMENTS, course_root

        self.config = config
        self.assignment_id = config.getoption("grade")
        if self.assignment_id not in ASSIGNMENTS:
            raise pytest.UsageError(
                f"--grade: unknown assignment {self.assignment_id!r}; known: {sorted(ASSIGNMENTS)}"
            )
        course = config.getoption("grade_course")
        try:
            self.root = course_root(Path(course) if course else None)
        except FileNotFoundError as error:
            raise pytest.UsageError(f"--grade-course: {error}") from error
        paths = [Path(arg.split("::")[0]) for arg in config.args]
        inipath = config.inipath.resolve() if config.inipath else None
        if inipath and any(path.resolve() in inipath.parents for path in paths):
            raise pytest.UsageError(
                f"the configuration file {inipath} is inside the submissions: run pytest with -c pointing to "
                "the course's pyproject.toml (or any file of your own)"
            )
        self.students = _students([path for path in paths if path.exists()], self.assignment_id)
        master = master_notebook(ASSIGNMENTS[self.assignment_id].source(self.root))
        self.cells = [
            cell.metadata.nbgrader["grade_id"]
            for cell in master.cells
            if cell.metadata.get("nbgrader", {}).get("grade")
        ]
        self.results: dict[str, SubmissionResult] = {}
        self.done: dict[str, threading.Event] = {}
        self.failure: BaseException | None = None
        self.learner_failures: set[str] = set()
        self.infrastructure_failures: set[str] = set()
        self.thread: threading.Thread | None = None

    # --- collection: notebooks only, no Python file and no package of a submission's folder

    @pytest.hookimpl(tryfirst=True)
    def pytest_collect_directory(self, path: Path, parent: pytest.Collector) -> pytest.Collector | None:
        return pytest.Dir.from_parent(parent, path=path)  # never a Package, whose __init__.py pytest imports

    def pytest_ignore_collect(self, collection_path: Path, config: pytest.Config) -> bool | None:
        if ".ipynb_checkpoints" in collection_path.parts:
            return True
        if collection_path.is_file() and collection_path.suffix != ".ipynb":
            return True
        return None

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
        student = self.students.get(file_path.resolve())
        if file_path.suffix != ".ipynb" or student is None:
            return None
        return Submission.from_parent(parent, path=file_path, name=student, nodeid=student)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Grade every submission that has a selected item, in the background, all at once."""
        chosen = {item.parent.path: item.parent.name for item in session.items if isinstance(item, GradeCell)}
        if not chosen:
            return
        self.done = {student: threading.Event() for student in chosen.values()}
        self.thread = threading.Thread(
            target=self._grade, args=(chosen,), name="attention-grade", daemon=True
        )
        self.thread.start()

    def _grade(self, chosen: dict[Path, str]) -> None:
        from attention_course.grading import cluster
        from attention_course.registry import ASSIGNMENTS

        try:
            get = self.config.getoption
            limits, mode = limits_of(get, prefix="grade-"), mode_of(get, prefix="grade-")
            with cluster.backend(
                self.config.getoption("grade_scheduler"),
                jobs=max(1, self.config.getoption("grade_jobs")),
                limits=limits,
                mode=mode,
                root=self.root,
                submissions=len(chosen),
                preload=ASSIGNMENTS[self.assignment_id].kernel_modules,
            ) as backend:
                from attention_course.grading.batch import grade_batch
                from attention_course.grading.submission import Job

                def content(path: Path) -> bytes | None:
                    return path.read_bytes() if backend.ships_notebooks else None

                jobs = [
                    Job(self.assignment_id, student, path, self.root, limits, mode, content(path))
                    for path, student in chosen.items()
                ]
                grade_batch(jobs, backend.executor, backend.grade, on_result=self._arrived)
        except BaseException as error:  # reported by every item still waiting
            self.failure = error
        finally:
            for event in self.done.values():
                event.set()

    def _arrived(self, result: SubmissionResult) -> None:
        self.results[result.student] = result
        self.done[result.student].set()

    def result(self, student: str) -> SubmissionResult:
        """The graded submission (waits for it).

        Raises:
            GraderError: if the grading stopped before it.
        """
        self.done[student].wait()
        if student not in self.results:
            raise GraderError(f"the submission was not graded: {self.failure!r}")
        return self.results[student]

    # --- outcomes: a learner's failed cell is a grade, an infrastructure error fails the run

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            kind = (
                self.learner_failures if hasattr(report, "learner_failure") else self.infrastructure_failures
            )
            kind.add(report.nodeid)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Iterator[Any]:
        outcome = yield
        if call.excinfo is not None and call.excinfo.errisinstance(CellFailed):
            outcome.get_result().learner_failure = True

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus == pytest.ExitCode.TESTS_FAILED and not self.infrastructure_failures:
            session.exitstatus = pytest.ExitCode.OK

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        graded = len(self.results)
        line = (
            f"attention-grade: {graded} submission(s) of {self.assignment_id} graded; "
            f"{len(self.learner_failures)} cell(s) without their points (grades, not errors)"
        )
        if self.infrastructure_failures:
            line += f"; {len(self.infrastructure_failures)} infrastructure error(s)"
        terminalreporter.write_sep("-", line)


class Submission(pytest.File):
    """One submitted notebook: an item per grade cell of the assignment."""

    def collect(self) -> Iterator[pytest.Item]:
        grading: Grading = self.config.pluginmanager.get_plugin("attention-grade-session")
        for grade_id in grading.cells:
            yield GradeCell.from_parent(self, name=grade_id)


class GradeCell(pytest.Item):
    """One grade cell of one submission; its points are JUnit XML properties."""

    def runtest(self) -> None:
        grading: Grading = self.config.pluginmanager.get_plugin("attention-grade-session")
        result = grading.result(self.parent.name)
        if result.status == "grader error":
            raise GraderError(result.message)
        cell = next(cell for cell in result.cells if cell.grade_id == self.name)
        points = "" if cell.points is None else f"{cell.points:g}"
        self.user_properties += [
            ("points", points),
            ("max_points", f"{cell.max_points:g}"),
            ("status", cell.status),
            ("submission_status", result.status),
        ]
        if cell.kind == "manual":
            pytest.skip(f"a written answer, graded by hand ({cell.status})")
        if cell.status != "passed":
            raise CellFailed(cell)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CellFailed):
            cell = excinfo.value.cell
            return f"{cell.status}, {cell.points:g} / {cell.max_points:g} points: {cell.message}"
        if isinstance(excinfo.value, GraderError):
            return f"infrastructure error: {excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.parent.name}::{self.name}"
