"""A scratch nbgrader course with six ex02 submissions, for the tests of the grader's platforms.

The six, each with the points its cells must get from either grader:

- ``solved``: the reference solutions and a written answer (waiting for manual grading);
- ``blank``: the release as it is;
- ``few-samples``: ``dot_product_variance`` draws 100 samples whatever it is asked: its visible checks pass,
  and the *hidden* checks of two cells fail (their messages name hidden inputs);
- ``no-scale``: the scores are not divided by sqrt(d_k): visible checks fail;
- ``mask-ignored``: the mask is not applied;
- ``torch-softmax``: ``softmax`` calls ``torch.softmax`` (the from-scratch cell fails).

``few-samples`` came through nbgrader's ``collect`` (it has a ``timestamp.txt``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from attention_course.registry import ASSIGNMENTS
from tests.banks import _bank
from tests.notebook_tools import ROOT, fill_solutions, load_exercise, reference_sources

ASSIGNMENT = "ex02_scaled_dot_product"
# the commands' own pytest runs take no options from the outer run's (PYTEST_ADDOPTS="-v" changes what
# --collect-only prints)
ENVIRONMENT = {
    **{name: value for name, value in os.environ.items() if name != "PYTEST_ADDOPTS"},
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
}
WRONG = {
    "few-samples": "dot_product_variance__only_100_samples",
    "no-scale": "scaled_dot_product_attention__no_scale",
    "mask-ignored": "scaled_dot_product_attention__mask_ignored",
    "torch-softmax": "softmax__torch_softmax",
}
TIMESTAMP = "2026-11-20 09:30:00.000000 UTC"


def submissions() -> dict[str, nbformat.NotebookNode]:
    exercise = load_exercise(ASSIGNMENT)
    release, right = exercise.release_notebook(), reference_sources(exercise)
    wrong = {candidate.id: candidate for candidate in _bank.wrong(exercise.bank)}
    solved = fill_solutions(release, right)
    for cell in solved.cells:
        if cell.cell_type == "markdown" and cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = "Because the variance of q . k grows with d_k, which saturates the softmax."
    made = {"solved": solved, "blank": release}
    for student, candidate in WRONG.items():
        function = wrong[candidate].function
        made[student] = fill_solutions(release, {**right, function: wrong[candidate].source})
    return made


def nbgrader(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nbgrader", *arguments],
        cwd=cwd,
        env=ENVIRONMENT,
        capture_output=True,
        text=True,
    )


def start_nbgrader(*arguments: str, cwd: Path) -> subprocess.Popen:
    """An nbgrader command started in the background (``communicate()`` gives its output): the tests run
    ``nbgrader autograde`` while attention-grade grades another copy of the same submissions, since neither
    reads what the other writes, and on a machine whose cores other processes want too two take more."""
    return subprocess.Popen(
        [sys.executable, "-m", "nbgrader", *arguments],
        cwd=cwd,
        env=ENVIRONMENT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def write_config(folder: Path) -> None:
    """The course's ``nbgrader_config.py`` in the scratch course ``folder``, with nbgrader's kernels over
    Unix sockets in ``folder``, as attention-grade's: over TCP, two kernels started at once by the test's
    workers now and then pick the same port, and one of them dies at start."""
    shutil.copy(ROOT / "nbgrader_config.py", folder)
    with (folder / "nbgrader_config.py").open("a") as config:
        config.write(
            f"\nc.KernelManager.transport = 'ipc'\nc.KernelManager.ip = {str(folder / 'kernel')!r}\n"
        )


def make_course(folder: Path) -> dict[str, Path]:
    """A course directory at ``folder`` with the source notebook and the six submissions in nbgrader's
    layout; returns ``{student: notebook}``."""
    folder.mkdir(parents=True, exist_ok=True)
    write_config(folder)
    source = ASSIGNMENTS[ASSIGNMENT].source(folder)
    source.parent.mkdir(parents=True)
    shutil.copy(ASSIGNMENTS[ASSIGNMENT].source(ROOT), source)
    paths = {}
    for student, notebook in submissions().items():
        path = folder / "submitted" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(notebook, path)
        paths[student] = path
    (paths["few-samples"].parent / "timestamp.txt").write_text(TIMESTAMP)
    return paths
