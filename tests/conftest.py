"""Test session settings: one thread per process; one build of the book shared by the tests that read it.

The checks work on tiny tensors, for which torch's thread pool costs more than it saves, especially with
several kernels running at once on a small machine; kernels started by the tests inherit the setting.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # after the environment variable, which torch reads on import

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
#: the chapters that train models (tests/test_book.py proves the list complete)
TRAINING_CHAPTERS = ("06_cross_attention", "07_transformer_block", "08_positions")
#: executes the chapter ``argv[1]`` (a MyST file) top to bottom into the notebook ``argv[2]``, in a kernel
#: that inherits this process's environment, over Unix sockets (two kernels started at once over TCP now and
#: then pick the same port)
RERUN = """
import sys, tempfile
from pathlib import Path
import jupytext, nbclient, nbformat
from jupyter_client.manager import KernelManager
notebook = jupytext.read(sys.argv[1])
with tempfile.TemporaryDirectory() as sockets:
    kernel = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(sockets) / "kernel"))
    client = nbclient.NotebookClient(
        notebook, km=kernel, timeout=900, shutdown_kernel="immediate",
        resources={"metadata": {"path": str(Path(sys.argv[1]).parent)}},
    )
    client.execute()
nbformat.write(notebook, sys.argv[2])
"""


@dataclass(frozen=True)
class Rerun:
    """A training chapter executed again in a kernel of its own, with ``OMP_NUM_THREADS=2`` (the book's
    build runs every chapter with 1), started beside the build: it needs nothing the build makes."""

    process: subprocess.Popen
    notebook: Path

    @classmethod
    def start(cls, name: str, folder: Path) -> Rerun:
        environment = {**os.environ, "OMP_NUM_THREADS": "2"}
        notebook = folder / f"{name}.ipynb"
        chapter = ROOT / "chapters" / f"{name}.md"
        process = subprocess.Popen(
            [sys.executable, "-c", RERUN, str(chapter), str(notebook)],
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its kernel in its process group, killed with it
        )
        return cls(process, notebook)

    def stop(self) -> None:
        """Kill the run and its kernel if it is still going (its test did not run)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.communicate()

    def result(self) -> Path:
        """The executed notebook, once the run has ended; the calling test fails with the run's log if it
        failed."""
        log, _ = self.process.communicate()
        if self.process.returncode != 0:
            pytest.fail(f"the chapter failed to execute with 2 threads:\n{log[-5000:]}", pytrace=False)
        return self.notebook


@dataclass(frozen=True)
class BookBuild:
    """One run of `make book`'s command: its exit status, its log, and where the HTML went; and the training
    chapters executed again with two threads meanwhile (:class:`Rerun`)."""

    returncode: int
    log: str
    html: Path
    reruns: dict[str, Rerun] = field(default_factory=dict)

    def failed_chapters(self) -> dict[str, str]:
        """{chapter's name: the log of its failed execution} for each page whose execution failed.

        myst-nb writes the traceback of a notebook that failed to execute, with the failing cell's source, to
        ``reports/<page>.err.log`` in the HTML folder (and the build then fails on its warning).
        """
        reports = self.html / "reports"
        return {
            log.name.removesuffix(".err.log"): log.read_text(errors="replace")
            for log in sorted(reports.rglob("*.err.log"))
        }

    def require(self) -> Path:
        """The HTML folder of a clean build.

        When chapters failed to execute, the calling test is skipped, naming them: each such chapter has one
        failing test of its own (``test_chapter_executes_top_to_bottom``) with its failing cell and traceback,
        and every test that reads the built book would otherwise fail with the same build log. Any other
        failure of the build fails the calling test with the end of the log.
        """
        if self.returncode != 0:
            failed = self.failed_chapters()
            if failed:
                pytest.skip(
                    f"the book did not build because {', '.join(failed)} failed to execute "
                    "(see test_book.py::test_chapter_executes_top_to_bottom)"
                )
            pytest.fail(f"the book did not build (exit {self.returncode}):\n{self.log[-5000:]}")
        return self.html


@pytest.fixture(scope="session")
def built_book(request, tmp_path_factory) -> Iterator[BookBuild]:
    """The book built once per test session, both editions (`make book`), warnings as errors, into a
    temporary folder: the English one in ``html``, the Chinese one in ``html/zh``.

    The training chapters' second executions (:class:`Rerun`) run beside the build: on a machine whose
    cores other processes also want, the tests' share of them grows with the processes they run at once.

    While working on the browser tests, ``BOOK_HTML=_build/html`` reuses a book built before (by `make
    book`) instead; the build itself is then not tested.
    """
    folder = tmp_path_factory.mktemp("two-threads")
    collected = {item.name for item in request.session.items}
    reruns = {
        name: Rerun.start(name, folder)
        for name in TRAINING_CHAPTERS
        if f"test_a_training_chapter_prints_the_same_numbers_with_two_threads[{name}]" in collected
    }
    try:
        if os.environ.get("BOOK_HTML"):
            yield BookBuild(0, "", Path(os.environ["BOOK_HTML"]).resolve(), reruns)
            return
        output = tmp_path_factory.mktemp("book")
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        command = [sys.executable, str(ROOT / "_ext" / "build_book.py"), "--path-output", str(output)]
        with busy_processes(2):
            built = subprocess.run(command, env={**os.environ, "PATH": path}, capture_output=True, text=True)
        yield BookBuild(built.returncode, built.stdout + built.stderr, output / "_build" / "html", reruns)
    finally:
        for rerun in reruns.values():
            rerun.stop()


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` processes that spin on the CPU while the block runs, then are killed.

    The book is built under load, as on a busy machine: every core stays busy for the whole build, so an
    assertion that depends on how fast a cell runs, rather than on what it computes, shows up here. They run
    at the lowest priority (``nice 19``) so that they take the cores only when the build and the other test
    worker leave them idle, and the suite's time hardly changes.
    """
    spinners = [
        subprocess.Popen(
            [sys.executable, "-c", "import os; os.nice(19)\nwhile True: pass"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


UNGROUPED: set[str] = set()  # tests whose xdist group this run ignores (see below)


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook, which adds the suffix
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Find the tests whose xdist group would be ignored; each of them fails at once, saying why.

    ``make test`` runs with ``--dist loadgroup`` so that the tests of one expensive fixture (the book's
    build, one assignment's nbgrader round trip, a batch of hostile submissions) share one worker and pay
    for it once. pytest-xdist groups by suffixing a node id with ``@group``; where the installed pytest
    does not let it (pytest 9.2 with xdist 3.8), every group would be split across workers and each
    fixture paid for once per worker, silently doubling the run's time.
    """
    if getattr(config.option, "loadgroup", False):  # set on each worker of a --dist loadgroup run
        UNGROUPED.update(
            item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.nodeid in UNGROUPED:
        pytest.fail(
            f"pytest-xdist could not put this test in its xdist_group under pytest {pytest.__version__}, so "
            "its fixture would be built once per worker: install the versions pyproject.toml pins",
            pytrace=False,
        )
