"""``attention-grade`` against hostile submissions: each gets its verdict, and nothing else is touched.

One batch, in a scratch course with its own ``solutions/``, ``submitted/`` and ``gradebook.db``: a clean
submission, the hostile bank (``tests/banks/hostile.py``: loops, sleeps, memory, fork bombs, daemons, 50 MB
of output, crashes, a GPU fault, exits, forbidden imports, deleting and truncating files, the network, the
grader's environment, killing the grader's processes, edited, deleted, duplicated and stripped cells, a
changed kernel spec, a file that is not JSON), the tampering bank (``tests/banks/tampering.py``, judged in
split mode), and a clean submission again. Every hostile submission gets exactly its expected status and
points; both clean ones keep full marks; the batch finishes; no process of the batch is left; the course's
files, the gradebook and a TCP listener on 127.0.0.1 are untouched; the grader's environment never reaches a
kernel.

These submissions would harm a machine without the sandbox's namespaces: without them the test is skipped.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import socket
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import psutil
import pytest

from attention_course.grading.batch import grade_batch
from attention_course.grading.execute import execute
from attention_course.grading.sandbox import Limits, Sandbox, isolation
from attention_course.grading.submission import Job, grade_submission
from tests.banks import _bank, tampering
from tests.banks.hostile import FULL, HOSTILE, notebook
from tests.notebook_tools import ROOT, fill_solutions, load_exercise, points_by_running, reference_sources

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hostile")]
ASSIGNMENT = "ex02_scaled_dot_product"
EXERCISE = load_exercise(ASSIGNMENT)
SECRET = "ATTENTION_GRADE_TEST_TOKEN"
VARIANTS = {candidate.id: candidate.source for candidate in _bank.wrong(EXERCISE.bank)}
LIMITS = Limits(cell_timeout=10, timeout=200)


def _digest(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


class Listener:
    """A TCP server on 127.0.0.1 that records every connection it accepts."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.received: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            with connection:
                self.received.append(connection.recv(1 << 16))

    def close(self) -> None:
        self.server.close()


def _ours(root: Path) -> list[psutil.Process]:
    """Processes still alive whose working folder or command line is in the sandbox's folder."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "cwd"]):
        text = " ".join(process.info["cmdline"] or []) + " " + (process.info["cwd"] or "")
        if str(root) in text:
            found.append(process)
    _, alive = psutil.wait_procs(found, timeout=5)  # exiting ones get a moment to be reaped
    return alive


def grade_the_banks(course: Path) -> dict:
    """Build the scratch course in ``course``, grade the clean, hostile and tampering submissions in one
    batch, and return the results, whether the course's files are untouched, the processes left and what
    reached the listener (also ``benchmarks/hostile.py``'s table)."""
    shutil.copy(ROOT / "nbgrader_config.py", course)
    shutil.copytree(ROOT / "solutions", course / "solutions", ignore=shutil.ignore_patterns("__pycache__"))
    with sqlite3.connect(course / "gradebook.db") as database:
        database.execute("create table grade (student text, points real)")
        database.execute("insert into grade values ('someone', 15)")
    listener = Listener()
    context = {"port": str(listener.port), "secret": SECRET}
    release, right = EXERCISE.release_notebook(), reference_sources(EXERCISE)
    submissions: dict[str, nbformat.NotebookNode | str] = {"clean-first": fill_solutions(release, right)}
    submissions |= {hostile.name: notebook(hostile, release, right, **context) for hostile in HOSTILE}
    submissions |= {
        f"tamper-{tamper.name}": tampering.notebook(tamper, release, VARIANTS) for tamper in tampering.TAMPERS
    }
    if os.environ.get("HOSTILE_ONLY"):  # while working on the sandbox: a few cases, by name
        chosen = {"clean-first", "clean-last", *os.environ["HOSTILE_ONLY"].split(",")}
        submissions = {name: submission for name, submission in submissions.items() if name in chosen}
    submissions["clean-last"] = fill_solutions(release, right)
    paths = {}
    for student, submission in submissions.items():
        path = course / "submitted" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
        path.parent.mkdir(parents=True)
        if isinstance(submission, str):
            path.write_text(submission)
        else:
            nbformat.write(submission, path)
        paths[student] = path
    before = {name: _digest(course / name) for name in ("solutions", "submitted")}
    before["gradebook.db"] = hashlib.sha256((course / "gradebook.db").read_bytes()).hexdigest()
    jobs = [Job(ASSIGNMENT, student, path, course, LIMITS) for student, path in paths.items()]
    os.environ[SECRET] = "the grader's token must stay in the grader"
    try:
        with Sandbox(max_slots=2, limits=LIMITS) as sandbox, ThreadPoolExecutor(max_workers=2) as executor:
            sandbox.start(2)
            results = grade_batch(jobs, executor, functools.partial(grade_submission, sandbox=sandbox))
            sandbox_root = sandbox._root
    finally:
        del os.environ[SECRET]
        listener.close()
    after = {name: _digest(course / name) for name in ("solutions", "submitted")}
    after["gradebook.db"] = hashlib.sha256((course / "gradebook.db").read_bytes()).hexdigest()
    return {
        "results": {result.student: result for result in results},
        "untouched": before == after,
        "left": _ours(sandbox_root),
        "listener": listener.received,
    }


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if not isolation().namespaces:
        reason = isolation().reason
        pytest.skip(f"the sandbox cannot isolate here ({reason}): hostile code would harm the machine")
    return grade_the_banks(tmp_path_factory.mktemp("course"))


def test_the_bank_is_large():
    assert len(HOSTILE) + len(tampering.TAMPERS) >= 30


def test_clean_submissions_around_them_keep_full_marks(graded):
    for name in ("clean-first", "clean-last"):
        result = graded["results"][name]
        assert (result.status, result.score) == ("graded", FULL), [
            c.message for c in result.cells if c.points == 0
        ]


def result_of(graded, name: str):
    """The result of the submission ``name``; skipped where ``HOSTILE_ONLY`` left it out of the batch."""
    if name not in graded["results"]:
        pytest.skip("not chosen by HOSTILE_ONLY")
    return graded["results"][name]


@pytest.mark.parametrize("hostile", HOSTILE, ids=lambda hostile: hostile.name)
def test_each_hostile_submission_gets_its_verdict(graded, hostile):
    result = result_of(graded, hostile.name)
    messages = " | ".join(
        [result.message, *(cell.message for cell in result.cells if cell.status != "passed")]
    )
    points = hostile.points
    if points is None:  # what its functions earn when the test cells run them in this process
        points = sum(
            points_by_running(EXERCISE, {**reference_sources(EXERCISE), **hostile.functions}).values()
        )
    assert (result.status, result.score) == (hostile.status, points), messages[:2000]
    assert hostile.message in messages


@pytest.mark.parametrize("tamper", tampering.TAMPERS, ids=lambda tamper: tamper.name)
def test_no_tamper_earns_more_than_its_functions_deserve(graded, tamper):
    result = result_of(graded, f"tamper-{tamper.name}")
    deserved = sum(points_by_running(EXERCISE, tampering.sources(tamper, VARIANTS)).values())
    assert result.score <= deserved, {
        c.grade_id: (c.points, c.message[:120]) for c in result.cells if c.points
    }


def test_stripped_metadata_is_matched_with_a_warning(graded):
    (warning,) = result_of(graded, "strips-nbgrader-metadata").warnings
    assert "matched to the assignment by their content" in warning


def test_no_process_of_the_batch_is_left(graded):
    assert graded["left"] == []


def test_course_files_gradebook_and_submissions_are_untouched(graded):
    assert graded["untouched"]
    assert not Path("/tmp/attention-grade-escaped").exists()


def test_nothing_reached_the_listener(graded):
    assert graded["listener"] == []


def test_nothing_a_submission_leaves_in_its_slot_reaches_the_next_one():
    """One slot grades two submissions in turn: what the first leaves in the slot's private /tmp, /dev/shm,
    home, matplotlib's configuration folder, working folder, the folder above it, or System V shared memory
    is gone when the second runs."""
    if not isolation().namespaces:
        pytest.skip(f"the sandbox cannot isolate here ({isolation().reason})")
    places = (
        "('/tmp', '/tmp/matplotlib', '/dev/shm', os.path.expanduser('~'),"
        " os.environ.get('MPLCONFIGDIR', '/tmp'), os.getcwd(), os.path.dirname(os.getcwd()))"
    )
    plant = nbformat.v4.new_code_cell(
        "import ctypes, os, pathlib\n"
        "os.makedirs('/tmp/matplotlib', exist_ok=True)  # matplotlib's folder when no MPLCONFIGDIR is set\n"
        f"for folder in {places}:\n"
        "    pathlib.Path(folder, 'planted').write_text('for the next submission')\n"
        "libc = ctypes.CDLL(None)\n"
        "assert libc.shmget(0x5EED, 4096, 0o1666) >= 0  # IPC_CREAT"
    )
    look = nbformat.v4.new_code_cell(
        "import ctypes, os, pathlib\n"
        f"found = [f for f in {places}\n"
        "         if pathlib.Path(f, 'planted').exists()]\n"
        "assert not found, found\n"
        "assert ctypes.CDLL(None).shmget(0x5EED, 0, 0o666) == -1, 'the shared memory segment is still there'"
    )
    with Sandbox(max_slots=1) as sandbox:
        outputs = []
        for cell in (plant, look):
            with sandbox.slot() as slot:
                executed = execute(nbformat.v4.new_notebook(cells=[cell]), slot, Limits(cell_timeout=60))
            outputs.append(executed.notebook.cells[0].outputs)
    assert not [o for o in outputs[0] if o.output_type == "error"], outputs[0]  # the planting worked
    assert not [o for o in outputs[1] if o.output_type == "error"], outputs[1]
