"""One sandbox slot, one submission after another: what a submission does in the slot never reaches the next.

Each probe of ``tests/banks/slot_probes.py`` runs in the slot, then a correct ex02 submission is graded in the
same slot and must keep its full marks: survivors that hide from a sweep that reads process states (a
process whose main thread exited, one whose pid changes with every fork), the slot's PID 1 (traced, its
memory read, its descriptors opened), another process's memory, ``ptrace`` itself, and files in the
private tmpfs folders beyond the memory limit. Probes that can tell whether their attack worked assert that
it did not. At the end, no process of the slot is left.

These probes would harm a machine without the sandbox's namespaces: without them the test is skipped.
"""

from __future__ import annotations

import shutil

import nbformat
import psutil
import pytest

from attention_course.grading.execute import execute
from attention_course.grading.sandbox import Limits, Sandbox, isolation, seccomp_filter
from attention_course.grading.submission import Job, grade_submission
from tests.banks.slot_probes import PROBES
from tests.notebook_tools import ROOT, fill_solutions, load_exercise, reference_sources

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slots")]
ASSIGNMENT = "ex02_scaled_dot_product"
FULL = 15.0
LIMITS = Limits(cell_timeout=60, timeout=120, memory_mib=512)


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> dict:
    """``{"outputs": {probe: its cell's outputs}, "after": {probe: (status, score) of the next submission},
    "first": the first submission's (status, score), "left": processes of the slot still alive}``"""
    if not isolation().namespaces:
        reason = isolation().reason
        pytest.skip(f"the sandbox cannot isolate here ({reason}): the probes would harm the machine")
    course = tmp_path_factory.mktemp("course")
    shutil.copytree(ROOT / "solutions", course / "solutions", ignore=shutil.ignore_patterns("__pycache__"))
    exercise = load_exercise(ASSIGNMENT)
    clean = fill_solutions(exercise.release_notebook(), reference_sources(exercise))

    def grade_clean(sandbox: Sandbox, student: str) -> tuple[str, float]:
        path = course / "submitted" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(clean, path)
        result = grade_submission(Job(ASSIGNMENT, student, path, course, LIMITS), sandbox)
        return result.status, result.score

    outputs, after = {}, {}
    with Sandbox(max_slots=1, limits=LIMITS) as sandbox:
        first = grade_clean(sandbox, "first")
        for name, source in PROBES.items():
            cell = nbformat.v4.new_code_cell(source.replace("{memory_mib}", str(LIMITS.memory_mib)))
            with sandbox.slot() as slot:
                executed = execute(nbformat.v4.new_notebook(cells=[cell]), slot, LIMITS)
            outputs[name] = executed.notebook.cells[0].outputs
            after[name] = grade_clean(sandbox, f"after-{name}")
        root = sandbox._root
    left = [
        process
        for process in psutil.process_iter(["cmdline", "cwd"])
        if str(root) in f"{process.info['cmdline']} {process.info['cwd']}"
    ]
    _, alive = psutil.wait_procs(left, timeout=5)
    return {"outputs": outputs, "after": after, "first": first, "left": alive}


def test_the_first_submission_gets_full_marks(probed):
    assert probed["first"] == ("graded", FULL)


@pytest.mark.parametrize("probe", PROBES)
def test_the_probe_is_refused(probed, probe):
    if probe == "traces-itself" and seccomp_filter() is None:
        pytest.skip("libseccomp is not installed here: the sandbox applies no seccomp filter")
    errors = [f"{o.ename}: {o.evalue}" for o in probed["outputs"][probe] if o.output_type == "error"]
    assert not errors


@pytest.mark.parametrize("probe", PROBES)
def test_the_submission_graded_after_the_probe_keeps_full_marks(probed, probe):
    assert probed["after"][probe] == ("graded", FULL)


def test_no_process_of_the_slot_is_left(probed):
    assert probed["left"] == []


def test_the_sandbox_has_no_init_of_its_own():
    """The fork server is PID 1 of the slot's namespace (``--as-pid-1``), not bubblewrap's init, which would
    hold the protocol pipes where a kernel could reach them."""
    if not isolation().namespaces:
        pytest.skip(f"the sandbox cannot isolate here ({isolation().reason})")
    cell = nbformat.v4.new_code_cell(
        "import os\n"
        "command = open('/proc/1/cmdline', 'rb').read().split(b'\\0')\n"
        "assert b'attention_course.grading.zygote' in command, command\n"
        "assert os.getppid() == 1"
    )
    with Sandbox(max_slots=1) as sandbox, sandbox.slot() as slot:
        executed = execute(nbformat.v4.new_notebook(cells=[cell]), slot, Limits(cell_timeout=60))
    assert not [o for o in executed.notebook.cells[0].outputs if o.output_type == "error"]
