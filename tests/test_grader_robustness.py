"""``attention-grade`` on broken submissions: each gets a clear verdict, and the batch always finishes.

One batch holds a good submission and submissions that hang (interruptibly or not), exhaust memory, kill
their kernel, return NaN, lost a solution cell, or are not notebooks at all. Every one is graded, the
cells a failure did not affect keep their points (a dead or wedged kernel is replaced and the definitions
replayed), and the report files are written. A submission that outlasts its own time limit is killed.
"""

from __future__ import annotations

import csv
import json
import textwrap

import nbformat
import pytest

from attention_course.grading.cli import Limits, grade, main
from attention_course.registry import ASSIGNMENTS
from tests.notebook_tools import ROOT, fill_solutions, load_exercise, reference_sources

# the tests of one module fixture run on one xdist worker (make test runs with --dist loadgroup)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("robustness")]
ASSIGNMENT = "ex02_scaled_dot_product"


def _body(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


VARIANCE_HEADER = "def dot_product_variance(d_k, n_samples, scaled=False, generator=None):"
BROKEN = {
    # a loop that the per-cell time limit interrupts
    "hangs": {"dot_product_variance": VARIANCE_HEADER + "\n    while True:\n        pass"},
    # allocations beyond the memory limit fail inside the cell
    "exhausts-memory": {
        "dot_product_variance": VARIANCE_HEADER
        + "\n    hoard = []\n    while True:\n        hoard.append(torch.ones(2**25))"
    },
    # the kernel dies when the cell is run
    "kills-its-kernel": {"dot_product_variance": "import os\n\nos._exit(1)"},
    # a loop that ignores the interrupt (SIGINT, as the kernel's interrupt sends it): only the
    # submission's time limit stops it. (A loop catching KeyboardInterrupt would race: an interrupt that
    # lands between two `try`s ends the cell.)
    "ignores-interrupts": {
        "softmax": _body(
            """
            import signal
            import time

            signal.signal(signal.SIGINT, signal.SIG_IGN)
            while True:
                time.sleep(0.05)
            """
        )
    },
    "returns-nan": {"softmax": "def softmax(x, dim=-1):\n    return x * float('nan')"},
}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    exercise = load_exercise(ASSIGNMENT)
    release = exercise.release_notebook()
    right = reference_sources(exercise)
    folder = tmp_path_factory.mktemp("submissions")
    paths = {}
    for student, replaced in {"good": {}, **BROKEN}.items():
        paths[student] = folder / f"{student}.ipynb"
        nbformat.write(fill_solutions(release, {**right, **replaced}), paths[student])
    deleted = fill_solutions(release, right)
    deleted.cells = [c for c in deleted.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "softmax"]
    paths["deleted-solution-cell"] = folder / "deleted-solution-cell.ipynb"
    nbformat.write(deleted, paths["deleted-solution-cell"])
    paths["not-a-notebook"] = folder / "not-a-notebook.ipynb"
    paths["not-a-notebook"].write_text("{ this is not JSON")
    # generous limits: a loaded CI machine must not turn a correct cell into a timeout
    limits = Limits(cell_timeout=6, timeout=120, memory_mib=2048)
    results = grade(ASSIGNMENT, paths, root=ROOT, limits=limits, jobs=2)
    return {result.student: result for result in results}, exercise


def _points(result, function: str, exercise) -> dict[str, float]:
    cells = {cell.grade_id for cell in exercise.tests if cell.function == function}
    return {cell.grade_id: cell.points for cell in result.cells if cell.grade_id in cells}


def test_every_submission_gets_a_verdict(batch):
    results, exercise = batch
    assert set(results) == {"good", *BROKEN, "deleted-solution-cell", "not-a-notebook"}
    for result in results.values():
        assert [cell.grade_id for cell in result.cells][: len(exercise.tests)] == [
            c.grade_id for c in exercise.tests
        ]
    assert results["good"].score == results["good"].max_score == 15


def test_a_hang_is_interrupted_and_only_its_cells_lose_points(batch):
    results, exercise = batch
    hangs = results["hangs"]
    assert set(_points(hangs, "dot_product_variance", exercise).values()) == {0.0}
    assert {c.status for c in hangs.cells if c.grade_id.startswith("variance")} == {"timeout"}
    assert hangs.score == 12  # softmax and attention are untouched


def test_a_memory_blow_up_fails_only_its_cells(batch):
    results, exercise = batch
    hoarder = results["exhausts-memory"]
    assert set(_points(hoarder, "dot_product_variance", exercise).values()) == {0.0}
    messages = " ".join(c.message for c in hoarder.cells if c.grade_id.startswith("variance"))
    assert "allocate memory" in messages or "MemoryError" in messages
    assert hoarder.score == 12


def test_a_dead_kernel_is_replaced_and_later_cells_still_count(batch):
    results, _ = batch
    crashed = results["kills-its-kernel"]
    assert crashed.status == "graded after restarts"
    assert crashed.score == 12  # softmax and attention before the crash; nothing after needs the lost kernel
    messages = [c.message for c in crashed.cells if c.grade_id.startswith("variance")]
    assert all("the cell that defines `dot_product_variance` failed: DeadKernelError" in m for m in messages)


def test_a_cell_that_swallows_interrupts_is_abandoned_and_grading_goes_on(batch):
    results, _ = batch
    stuck = results["ignores-interrupts"]
    assert stuck.status == "graded after restarts" and "CellTimeoutError" in stuck.message
    softmax_messages = [c.message for c in stuck.cells if c.grade_id.startswith("softmax")]
    assert all("could not be interrupted" in m for m in softmax_messages)
    assert stuck.score == 3  # attention needs the lost softmax; the variance cells still count


def test_a_submission_past_its_time_limit_is_killed(batch, tmp_path):
    _, exercise = batch
    release = exercise.release_notebook()
    path = tmp_path / "slow.ipynb"
    nbformat.write(fill_solutions(release, {**reference_sources(exercise), **BROKEN["hangs"]}), path)
    limits = Limits(cell_timeout=600, timeout=20)
    (result,) = grade(ASSIGNMENT, {"slow": path}, root=ROOT, limits=limits, jobs=1)
    assert result.status == "timeout" and "time limit of 20 s" in result.message
    # cells graded before the kill keep their points; the rest did not run
    assert {c.status for c in result.cells if c.kind == "auto"} <= {"passed", "not run"}
    assert {c.status for c in result.cells if c.grade_id.startswith("variance")} == {"not run"}
    assert result.score == sum(c.points for c in result.cells if c.status == "passed")


def test_nan_and_a_deleted_cell_are_explained(batch):
    results, _ = batch
    nan = results["returns-nan"]
    assert "NaN" in next(c.message for c in nan.cells if c.grade_id == "softmax_sums_to_one")
    deleted = results["deleted-solution-cell"]
    messages = [c.message for c in deleted.cells if c.grade_id.startswith("softmax")]
    assert all("deleted from the submission" in m for m in messages)
    assert deleted.score == 15 - 5 - 7  # attention calls the missing softmax too; the variance is fine


def test_an_unreadable_file_is_reported(batch):
    results, _ = batch
    unreadable = results["not-a-notebook"]
    assert unreadable.status == "unreadable" and unreadable.score == 0 and "JSON" in unreadable.message


def test_command_line_writes_json_and_csv(tmp_path, capsys):
    exercise = load_exercise(ASSIGNMENT)
    release = exercise.release_notebook()
    submitted = tmp_path / "submitted" / "ada" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    submitted.parent.mkdir(parents=True)
    nbformat.write(release, submitted)
    out = tmp_path / "report"
    assert main([ASSIGNMENT, str(tmp_path / "submitted"), "--out", str(out), "--course", str(ROOT)]) == 0
    report = json.loads((out / "report.json").read_text())
    (submission,) = report["submissions"]
    assert submission["student"] == "ada" and submission["score"] == 0 and submission["max_score"] == 15
    with open(out / "report.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(submission["cells"]) and {row["student"] for row in rows} == {"ada"}
    assert "ada" in capsys.readouterr().out
    assert ASSIGNMENTS[ASSIGNMENT].release(ROOT).exists()
