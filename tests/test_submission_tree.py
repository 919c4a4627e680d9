"""The submission tree is input, not trust: what the grader reads from a folder of submissions, and how.

A learner controls the files of their own folder (``submitted/<student>/<id>/``) and its name. The grader
reads exactly nbgrader's layout (or the notebooks named on the command line), regular files only, without
following a symbolic link; it refuses invalid and colliding student ids instead of renaming them; it
parses ``timestamp.txt`` instead of copying it; and its messages never quote a file it could not read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from attention_course.grading.cli import main, scan_submissions, student_id_problem
from attention_course.grading.gradebook import submission_timestamp
from attention_course.grading.submission import MAX_CELLS, read_regular_file, read_submission
from tests.notebook_tools import ROOT, fill_solutions, load_exercise, reference_sources

ASSIGNMENT = "ex02_scaled_dot_product"
EXERCISE = load_exercise(ASSIGNMENT)
SOLVED = fill_solutions(EXERCISE.release_notebook(), reference_sources(EXERCISE))


def submit(root: Path, student: str, name: str = f"{ASSIGNMENT}.ipynb") -> Path:
    path = root / student / ASSIGNMENT / name
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(SOLVED, path)
    return path


def test_a_folder_is_read_in_nbgrader_layout_only(tmp_path):
    submit(tmp_path, "ada")
    submit(tmp_path, "mallory")
    submit(tmp_path, "mallory", "zz_victim.ipynb")  # an extra notebook in the attacker's own folder
    (tmp_path / "mallory" / ASSIGNMENT / "deeper").mkdir()
    nbformat.write(SOLVED, tmp_path / "mallory" / ASSIGNMENT / "deeper" / f"{ASSIGNMENT}.ipynb")
    scan = scan_submissions([tmp_path], ASSIGNMENT)
    assert sorted(scan.found) == ["ada", "mallory"] and scan.refused == {}
    assert scan.found["mallory"] == tmp_path / "mallory" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"


def test_one_students_folder_and_a_folder_of_notebooks(tmp_path):
    submit(tmp_path, "ada")
    assert scan_submissions([tmp_path / "ada"], ASSIGNMENT).found == {
        "ada": tmp_path / "ada" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    }
    loose = tmp_path / "loose"
    loose.mkdir()
    nbformat.write(SOLVED, loose / "grace.ipynb")
    assert scan_submissions([loose], ASSIGNMENT).found == {"grace": loose / "grace.ipynb"}


def test_symbolic_links_are_refused(tmp_path):
    submitted = tmp_path / "submitted"
    (submitted / "thief" / ASSIGNMENT).mkdir(parents=True)
    solution = ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    assert solution.is_file()
    (submitted / "thief" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").symlink_to(solution)
    elsewhere = submit(tmp_path / "elsewhere", "x").parent
    (submitted / "linked-folder").mkdir()
    (submitted / "linked-folder" / ASSIGNMENT).symlink_to(elsewhere)
    (submitted / "linked-student").symlink_to(tmp_path / "elsewhere" / "x")
    submit(submitted, "ada")
    scan = scan_submissions([submitted], ASSIGNMENT)
    assert list(scan.found) == ["ada"]
    assert sorted(scan.refused) == ["linked-folder", "linked-student", "thief"]
    assert all("symbolic link" in why for why in scan.refused.values())


def test_student_ids_that_are_not_names_are_refused(tmp_path):
    for bad in ("..", ".hidden", "a\x1b]52;c;aGk=\x07b", "tab\tname"):
        assert student_id_problem(bad), bad
    for good in ("ada", "Zhāng Wěi", "o'brien", "a b", "x-1"):
        assert student_id_problem(good) == "", good
    loose = tmp_path / "loose"
    loose.mkdir()
    nbformat.write(SOLVED, loose / "...ipynb")  # student id ".."
    nbformat.write(SOLVED, loose / "ok.ipynb")
    nbformat.write(SOLVED, loose / "\x1b[2Jevil.ipynb")  # a terminal escape in the name
    with open(os.path.join(os.fsencode(loose), b"caf\xe9.ipynb"), "w") as handle:  # not UTF-8
        handle.write(nbformat.writes(SOLVED))
    scan = scan_submissions([loose], ASSIGNMENT)
    assert list(scan.found) == ["ok"]
    assert len(scan.refused) == 3
    assert not any("\x1b" in shown for shown in scan.refused)  # the names are shown escaped
    for shown in scan.refused:
        shown.encode("utf-8")  # printable, encodable


def test_colliding_ids_and_feedback_pages_are_refused_never_renamed(tmp_path):
    first, second = tmp_path / "one" / "ada.ipynb", tmp_path / "two" / "ada.ipynb"
    for path in (first, second):
        path.parent.mkdir()
        nbformat.write(SOLVED, path)
    scan = scan_submissions([first, second], ASSIGNMENT)
    assert scan.found == {} and list(scan.refused) == ["ada"]
    submit(tmp_path / "submitted", "a b")
    submit(tmp_path / "submitted", "a_b")  # both would get the feedback page a_b.html
    submit(tmp_path / "submitted", "grace")
    scan = scan_submissions([tmp_path / "submitted"], ASSIGNMENT)
    assert list(scan.found) == ["grace"] and sorted(scan.refused) == ["a b", "a_b"]
    assert "feedback page" in scan.refused["a b"]


def test_only_regular_files_are_read_and_never_quoted(tmp_path):
    passwd = tmp_path / "passwd-link.ipynb"
    passwd.symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match="symbolic link"):
        read_regular_file(passwd)
    fifo = tmp_path / "fifo.ipynb"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def read_the_fifo() -> None:
        try:
            read_regular_file(fifo)
        except BaseException as error:
            outcome.append(error)

    reader = threading.Thread(target=read_the_fifo, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert isinstance(outcome[0], ValueError) and "not a regular file" in str(outcome[0])
    with pytest.raises(ValueError, match="not a regular file"):
        read_regular_file(Path("/dev/zero"))
    big = tmp_path / "big.ipynb"
    big.write_bytes(b" " * 2049)
    with pytest.raises(ValueError, match="more than"):
        read_regular_file(big, limit=2048)
    copied = tmp_path / "copied.ipynb"
    copied.write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(ValueError) as raised:
        read_submission(copied, EXERCISE.release_notebook())
    assert "JSON" in str(raised.value) and "root:" not in str(raised.value)
    json_not_notebook = tmp_path / "list.ipynb"
    json_not_notebook.write_text(json.dumps(["secret-value"]))
    with pytest.raises(ValueError) as raised:
        read_submission(json_not_notebook, EXERCISE.release_notebook())
    assert "not a Jupyter notebook" in str(raised.value) and "secret-value" not in str(raised.value)


def test_the_timestamp_is_parsed_never_copied(tmp_path):
    notebook = submit(tmp_path, "ada")
    result = SimpleNamespace(path=str(notebook))
    assert submission_timestamp(result) is None
    (notebook.parent / "timestamp.txt").write_text("2026-11-27 10:00:00.000000 UTC\n")
    assert str(submission_timestamp(result)) == "2026-11-27 10:00:00"
    (notebook.parent / "timestamp.txt").write_text("not a time")
    assert submission_timestamp(result) is None
    (notebook.parent / "timestamp.txt").unlink()
    (notebook.parent / "timestamp.txt").symlink_to("/etc/hostname")
    assert submission_timestamp(result) is None


def test_the_command_grades_the_others_and_lists_what_it_refused(tmp_path, capsys):
    submitted = tmp_path / "submitted"
    submit(submitted, "ada")
    (submitted / "thief" / ASSIGNMENT).mkdir(parents=True)
    source = ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    (submitted / "thief" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").symlink_to(source)
    out = tmp_path / "report"
    assert main([ASSIGNMENT, str(submitted), "--out", str(out), "--course", str(ROOT), "--jobs", "1"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert [s["student"] for s in report["submissions"]] == ["ada"]
    assert report["submissions"][0]["score"] == 15
    assert list(report["refused"]) == ["thief"]
    assert "not graded: thief" in capsys.readouterr().out
    assert not (out / "feedback" / "thief.html").exists()


def test_the_installed_command_exits_with_everything_written(tmp_path):
    """``attention-grade`` leaves without the interpreter's teardown (os._exit, after the exit handlers): its
    status, its console summary and its reports all arrive; a usage error still exits with 2."""
    command = Path(sys.executable).with_name("attention-grade")
    if not command.is_file():
        pytest.skip(f"the course is not installed with its console script beside {sys.executable}")
    submitted = tmp_path / "submitted"
    submit(submitted, "ada")
    out = tmp_path / "report"
    arguments = [ASSIGNMENT, str(submitted), "--out", str(out), "--course", str(ROOT), "--jobs", "1"]
    done = subprocess.run([command, *arguments], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 submission(s) in" in done.stdout and done.stdout.endswith("\n"), done.stdout[-500:]
    assert json.loads((out / "report.json").read_text())["submissions"][0]["score"] == 15
    assert (out / "feedback" / "ada.html").is_file()
    (tmp_path / "empty").mkdir()
    refused = subprocess.run([command, ASSIGNMENT, str(tmp_path / "empty")], capture_output=True, text=True)
    assert refused.returncode == 2 and "no notebooks found" in refused.stderr


def test_a_notebook_with_too_many_cells_is_refused_before_it_is_parsed(tmp_path):
    many = tmp_path / "many.ipynb"
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("x") for _ in range(MAX_CELLS + 1)]
    )
    nbformat.write(notebook, many)
    with pytest.raises(ValueError, match="more than the"):
        read_submission(many, EXERCISE.release_notebook())


def test_a_deep_empty_tree_is_not_walked(tmp_path):
    """A learner's folder 1,500 levels deep: the grader reads nbgrader's layout only, two levels."""
    submit(tmp_path, "ada")
    deep = "mallory" + "/d" * 1500  # os.makedirs would recurse 1,500 deep
    subprocess.run(["mkdir", "-p", deep], cwd=tmp_path, check=True)
    try:
        scan = scan_submissions([tmp_path], ASSIGNMENT)
    finally:  # shutil.rmtree, which pytest uses to clean up, would recurse 1,500 deep
        subprocess.run(["rm", "-rf", "mallory"], cwd=tmp_path, check=True)
    assert list(scan.found) == ["ada"] and scan.refused == {}


def test_a_page_that_cannot_be_written_stops_no_other(tmp_path):
    from attention_course.grading.feedback import write_feedback
    from attention_course.grading.notebooks import CellResult
    from attention_course.grading.submission import SubmissionResult

    cells = [CellResult("softmax_sums_to_one", "auto", 1.0, 1.0, "passed")]
    results = [SubmissionResult(name, "a", "graded", 1.0, cells) for name in ("ada", "blocked", "grace")]
    (tmp_path / "blocked.html").mkdir()  # a folder where the page goes: writing it fails
    failed: dict[str, str] = {}
    pages = write_feedback(results, tmp_path, failed)
    assert [page.stem for page in pages] == ["ada", "grace"] and list(failed) == ["blocked"]
