"""Test session settings: one thread per process; one build of the book shared by the tests that read it.

The checks work on tiny tensors, for which torch's thread pool costs more than it saves, especially with
several kernels running at once on a small machine; kernels started by the tests inherit the setting.
"""

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # after the environment variable, which torch reads on import

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class BookBuild:
    """One run of `make book`'s command: its exit status, its log, and where the HTML went."""

    returncode: int
    log: str
    html: Path

    def require(self) -> Path:
        """The HTML folder; fails the calling test when the build failed."""
        if self.returncode != 0:
            pytest.fail(f"the book did not build (exit {self.returncode}):\n{self.log[-5000:]}")
        return self.html


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> BookBuild:
    """The book built once per test session, warnings as errors, into a temporary folder.

    While working on the browser tests, ``BOOK_HTML=_build/html`` reuses a book built before (by `make
    book`) instead; the build itself is then not tested.
    """
    if os.environ.get("BOOK_HTML"):
        return BookBuild(0, "", Path(os.environ["BOOK_HTML"]).resolve())
    output = tmp_path_factory.mktemp("book")
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    command = ["jupyter-book", "build", str(ROOT), "-W", "-n", "--keep-going", "--path-output", str(output)]
    built = subprocess.run(command, env=environment, capture_output=True, text=True)
    return BookBuild(built.returncode, built.stdout + built.stderr, output / "_build" / "html")
