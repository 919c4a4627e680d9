"""``attention-grade`` at its limits and on the command line.

A submission that outlasts its own time limit is stopped: the cells graded before keep their points, the
cell running at the limit is interrupted, the rest did not run. The command line writes its reports. (The
hostile and broken submissions are in ``tests/test_hostile.py``.)
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import nbformat
import pytest
import torch

from attention_course.grading import sandbox
from attention_course.grading.batch import grade
from attention_course.grading.cli import main
from attention_course.grading.execute import execute
from attention_course.grading.notebooks import CellResult
from attention_course.grading.reports import write_reports
from attention_course.grading.sandbox import Limits, isolation
from attention_course.grading.submission import SubmissionResult
from attention_course.grading.zygote import TORCH_DEFAULT_SEED
from attention_course.registry import ASSIGNMENTS
from tests.notebook_tools import ROOT, fill_solutions, load_exercise, reference_sources

pytestmark = pytest.mark.slow
ASSIGNMENT = "ex02_scaled_dot_product"
# hangs without spinning: the limit is the same to the grader, and its 20 s are not taken from the tests that
# run beside this one (tests/banks/hostile.py's loops-forever spins)
HANGS = (
    "def dot_product_variance(d_k, n_samples, scaled=False, generator=None):\n"
    "    while True:\n"
    "        __import__('time').sleep(1)"
)


def test_a_submission_past_its_time_limit_is_stopped(tmp_path):
    exercise = load_exercise(ASSIGNMENT)
    path = tmp_path / "slow.ipynb"
    sources = {**reference_sources(exercise), "dot_product_variance": HANGS}
    nbformat.write(fill_solutions(exercise.release_notebook(), sources), path)
    (result,) = grade(
        ASSIGNMENT, {"slow": path}, root=ROOT, limits=Limits(cell_timeout=600, timeout=20), jobs=1
    )
    assert result.status == "timeout" and "time limit of 20 s" in result.message
    variance = [c.status for c in result.cells if c.grade_id.startswith("variance")]
    assert variance[0] == "timeout" and set(variance[1:]) == {"not run"}
    assert {c.status for c in result.cells if c.kind == "auto"} <= {"passed", "timeout", "not run"}
    assert result.score == 12  # softmax and attention were graded before the limit


def test_command_line_writes_json_and_csv(tmp_path, capsys):
    exercise = load_exercise(ASSIGNMENT)
    submitted = tmp_path / "submitted" / "ada" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    submitted.parent.mkdir(parents=True)
    nbformat.write(exercise.release_notebook(), submitted)
    out = tmp_path / "report"
    assert main([ASSIGNMENT, str(tmp_path / "submitted"), "--out", str(out), "--course", str(ROOT)]) == 0
    report = json.loads((out / "report.json").read_text())
    (submission,) = report["submissions"]
    assert submission["student"] == "ada" and submission["score"] == 0 and submission["max_score"] == 15
    assert report["isolation"] and report["limits"]["cell_timeout"] == 30
    with open(out / "report.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(submission["cells"]) and {row["student"] for row in rows} == {"ada"}
    assert "ada" in capsys.readouterr().out
    assert ASSIGNMENTS[ASSIGNMENT].release(ROOT).exists()


def test_the_csv_report_opens_in_a_spreadsheet_as_text(tmp_path):
    """A message, a student id or a path that starts like a formula is text once the CSV is read back: every
    field a spreadsheet would evaluate (OWASP's list of first characters) is escaped, numbers stay numbers."""
    starts = ("=", "+", "-", "@", "\t", "\r")
    cells = [
        CellResult(f"cell{i}", "auto", 0.0, 5.0, "failed", f'{start}HYPERLINK("http://x", "see")')
        for i, start in enumerate(starts)
    ]
    results = [
        SubmissionResult("=1+1", "-2+3/ex02.ipynb", "graded", 1.0, cells),
        SubmissionResult("ada", "a", "graded", 1.0, [CellResult("a", "auto", 5.0, 5.0, "passed", "fine")]),
    ]
    write_reports(results, ASSIGNMENT, tmp_path, {})
    with open(tmp_path / "report.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    text_columns = ("student", "grade_id", "kind", "status", "message", "path")
    texts = [row[name] for row in rows for name in text_columns]
    assert not [text for text in texts if text.startswith(starts)]
    assert rows[0]["student"] == "'=1+1" and rows[0]["message"] == """'=HYPERLINK("http://x", "see")"""
    assert (rows[-1]["student"], rows[-1]["points"], rows[-1]["message"]) == ("ada", "5.0", "fine")


@pytest.fixture
def fresh_scratch_base():
    """:func:`sandbox.scratch_base` computed anew in the test, and again after it (it is cached)."""
    sandbox.scratch_base.cache_clear()
    yield sandbox.scratch_base
    sandbox.scratch_base.cache_clear()


@pytest.mark.parametrize(
    ("mounts", "needed", "expected"),
    [
        ([("tmpfs", "/dev/shm")], 1, "/dev/shm"),
        ([("tmpfs", "/dev/shm")], 2**62, "/tmp"),  # a container's 64 MiB /dev/shm
        ([("tmpfs", "/dev/shm"), ("ext4", "/dev/shm")], 1, "/tmp"),  # a disk mounted over it
        ([("ext4", "/")], 1, "/tmp"),  # /dev/shm is a folder of the disk
    ],
    ids=["big-tmpfs", "small-tmpfs", "disk-over-tmpfs", "no-mount"],
)
def test_scratch_folders_go_to_dev_shm_only_where_it_is_a_big_enough_tmpfs(
    fresh_scratch_base, monkeypatch, mounts, needed, expected
):
    if not os.access("/dev/shm", os.W_OK | os.X_OK):
        pytest.skip("this machine has no writable /dev/shm")
    parts = [SimpleNamespace(fstype=fstype, mountpoint=mountpoint) for fstype, mountpoint in mounts]
    monkeypatch.setattr(sandbox.psutil, "disk_partitions", lambda all=False: parts)
    monkeypatch.setattr(sandbox, "SHM_NEEDED", needed)
    assert fresh_scratch_base() == expected


def test_the_folders_of_a_killed_grader_are_removed_by_the_next_one(tmp_path, monkeypatch):
    """A grader killed with SIGKILL leaves its folders (in memory, on /dev/shm); the next one removes those
    that no living process has locked, and keeps its own, a young one (its owner may not have locked it
    yet) and whatever is not the grader's."""
    monkeypatch.setattr(sandbox, "scratch_base", lambda: str(tmp_path))
    killed = f"""
import os, signal
from attention_course.grading import sandbox
sandbox.scratch_base = lambda: {str(tmp_path)!r}
for prefix in sandbox.OWNED_PREFIXES:
    (sandbox.owned_folder(prefix) / "left").write_text("behind")
os.kill(os.getpid(), signal.SIGKILL)
"""
    assert subprocess.run([sys.executable, "-c", killed], cwd=ROOT).returncode == -signal.SIGKILL
    abandoned = sorted(tmp_path.iterdir())
    assert [folder.name.rsplit("-", 1)[0] + "-" for folder in abandoned] == sorted(sandbox.OWNED_PREFIXES)
    living = sandbox.owned_folder("ag-")  # this process's own, locked
    (tmp_path / "ag-young").mkdir()
    (tmp_path / "not-the-graders").mkdir()
    long_ago = time.time() - 3600
    for folder in [*abandoned, living, tmp_path / "not-the-graders"]:
        os.utime(folder, (long_ago, long_ago))
    assert sandbox.remove_abandoned_folders.__wrapped__() == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([living.name, "ag-young", "not-the-graders"])
    sandbox.release_folder(living)
    assert not living.exists() and sandbox.remove_abandoned_folders.__wrapped__() == 0


@pytest.mark.skipif(not isolation().namespaces, reason="bubblewrap cannot create namespaces here")
def test_a_python_or_course_under_tmp_stays_readable_in_the_sandbox(tmp_path, monkeypatch):
    """The slot's private /tmp is mounted first and the folders a kernel must read on top of it: a clone
    of the course with its .venv under /tmp (a CI checkout) would otherwise lose its Python there."""
    course = tmp_path / "course"  # under /tmp: pytest's base temporary folder
    course.mkdir()
    (course / "python-was-here").write_text("yes")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    roots = sandbox._readable_roots()
    monkeypatch.setattr(sandbox, "_readable_roots", lambda: [*roots, course])
    arguments = sandbox.bwrap_arguments(isolation().bwrap, scratch)
    inside = subprocess.run(
        [*arguments, "cat", str(course / "python-was-here")], capture_output=True, text=True
    )
    assert (inside.returncode, inside.stdout, inside.stderr) == (0, "yes", "")


def test_each_kernel_starts_with_the_same_torch_random_state():
    """A kernel forked by a slot draws what a generator seeded with ``TORCH_DEFAULT_SEED`` draws first,
    however much the fork server's warm-up or an earlier kernel of the slot drew."""
    cell = nbformat.v4.new_code_cell(
        "import torch\nprint(torch.initial_seed(), torch.rand(4).tolist())\ntorch.rand(1000)"
    )
    expected = torch.rand(4, generator=torch.Generator().manual_seed(TORCH_DEFAULT_SEED)).tolist()
    printed = []
    with sandbox.Sandbox(max_slots=1) as pool:
        for _ in range(2):
            with pool.slot() as slot:
                executed = execute(nbformat.v4.new_notebook(cells=[cell]), slot, Limits(cell_timeout=60))
            printed.append("".join(o.get("text", "") for o in executed.notebook.cells[0].outputs))
    assert printed == [f"{TORCH_DEFAULT_SEED} {expected}\n"] * 2


FAULTS = (  # a CUDA device-side assert as torch raises it now, and an illegal access as older releases did
    "raise AcceleratorError('CUDA error: device-side assert triggered')",
    "raise RuntimeError('CUDA error: an illegal memory access was encountered')",
)


# torch.AcceleratorError is new in torch 2.8; the grader knows a fault by its name and message
ACCELERATOR_ERROR = (
    "AcceleratorError = getattr(torch, 'AcceleratorError', None)\n"
    "AcceleratorError = AcceleratorError or type('AcceleratorError', (RuntimeError,), {})"
)


def test_the_cells_after_a_gpu_fault_run_in_a_new_kernel():
    """A CUDA device-side assert (an index out of range in a kernel) leaves the process's GPU unusable, so
    that every later cell would fail on a GPU where it passes on a CPU. The faulting cell keeps its error;
    the cells after it run in a new kernel, with the definitions before replayed (not the faulting cell).

    On a CPU the fault is simulated: each faulting cell raises the error and marks its process, and a later
    cell fails if it runs in a marked process. Faults are not counted against ``max_restarts``: each moves on
    by a cell.
    """
    sources = [
        f"import builtins\nimport torch\n\n{ACCELERATOR_ERROR}\nvalue = 41",
        f"builtins.faulted = True\n{FAULTS[0]}",
        "assert not getattr(builtins, 'faulted', False), 'ran in the faulted kernel'\nprint(value + 1)",
        f"builtins.faulted = True\n{FAULTS[1]}",
        "assert not getattr(builtins, 'faulted', False), 'ran in the faulted kernel'\nprint(value + 2)",
        "raise RuntimeError('the shapes do not match')",  # an ordinary error: the same kernel goes on
        "print(builtins.__dict__.get('faulted', 'same kernel'))",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    with sandbox.Sandbox(max_slots=1) as pool, pool.slot() as slot:
        executed = execute(notebook, slot, Limits(cell_timeout=60), max_restarts=1)
    faults = [(1, "AcceleratorError"), (3, "AcceleratorError")]
    assert [(r.cell, r.reason) for r in executed.restarts] == faults
    assert executed.gave_up_after is None and executed.stopped is None
    cells = executed.notebook.cells
    assert [[o.ename for o in c.outputs if o.output_type == "error"] for c in cells] == [
        [],
        ["AcceleratorError"],
        [],
        ["RuntimeError"],
        [],
        ["RuntimeError"],
        [],
    ]
    printed = ["".join(o.get("text", "") for o in cell.outputs) for cell in cells]
    assert printed[2] == "42\n" and printed[4] == "43\n" and printed[6] == "same kernel\n"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_real_device_side_assert_costs_only_its_own_cell():
    """The same on a GPU, with a real device-side assert: an index out of range in a CUDA kernel."""
    sources = [
        "import torch\n\nx = torch.arange(4.0, device='cuda')",
        "x[torch.tensor([7], device='cuda')].sum().item()",
        "print(x.sum().item())",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    with sandbox.Sandbox(max_slots=1) as pool, pool.slot() as slot:
        executed = execute(notebook, slot, Limits(cell_timeout=60))
    assert [(r.cell, r.reason) for r in executed.restarts] == [(1, "AcceleratorError")]
    assert "".join(o.get("text", "") for o in executed.notebook.cells[2].outputs) == "6.0\n"


def test_a_fork_server_imports_the_graded_assignments_checks_only():
    """A fork server started for ex01 has ex01's checks imported before it forks (a kernel finds them ready)
    and no other exercise's: ex03's would import ``torch._dynamo``, a second of every batch's start-up; a
    kernel spawned for ex03 in the same slot then finds ex03's checks imported before its fork."""
    look = nbformat.v4.new_code_cell(
        "import sys\n"
        "print(sorted(m for m in sys.modules if m.startswith('attention_course.checks.ex')), "
        "'torch._dynamo' in sys.modules)"
    )
    printed = []
    with sandbox.Sandbox(max_slots=1, preload=ASSIGNMENTS["ex01_attention_pooling"].kernel_modules) as pool:
        for assignment in ("ex01_attention_pooling", "ex03_masks"):
            with pool.slot() as slot:
                notebook = nbformat.v4.new_notebook(cells=[look])
                kernel_modules = ASSIGNMENTS[assignment].kernel_modules
                executed = execute(notebook, slot, Limits(cell_timeout=60), preload=kernel_modules)
            printed.append("".join(o.get("text", "") for o in executed.notebook.cells[0].outputs).strip())
    assert printed[0] == "['attention_course.checks.ex01'] False"
    assert printed[1] == "['attention_course.checks.ex01', 'attention_course.checks.ex03'] True"
