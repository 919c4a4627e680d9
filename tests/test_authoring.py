"""instructors/authoring.md as written: its walk-through builds a working exercise in a copy of the course.

The guide's section "A new exercise, step by step" scaffolds an exercise (`make new-exercise`), replaces the
scaffold's files by those it shows in full (a code block captioned with the file's path) and runs commands
(the `$` lines of its console blocks), among them `make release ASSIGNMENT=...` and the tests of the new
exercise. Here they run in the guide's order in a copy of the course (the files git would publish, with this
Python's virtual environment linked in): every command must succeed, and every output line the guide shows
under a command must be in what that command printed (a shown line ending in "..." must start one).

The scaffold's refusals, the release's cells and the Makefile's release of one assignment are checked here
too, quickly, without a copy.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from attention_course.grading import release, scaffold
from tests.notebook_tools import ROOT

GUIDE = ROOT / "instructors" / "authoring.md"
WALK_THROUGH = "## A new exercise, step by step"
BLOCK = re.compile(
    r"^```(?:\{code-block\} \w+\n:caption: (?P<path>\S+)|(?P<console>console))\n(?P<body>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)


def guide_steps() -> list[tuple[str, str, list[str]]]:
    """The walk-through's steps in order: ``("file", path, [text])``, ``("run", command, [output shown])``."""
    text = GUIDE.read_text()
    section = text.split(WALK_THROUGH, 1)[1].split("\n## ", 1)[0]
    steps: list[tuple[str, str, list[str]]] = []
    for block in BLOCK.finditer(section):
        if block["path"]:
            steps.append(("file", block["path"], [block["body"]]))
            continue
        continued = False  # the command's line ends with a backslash: the next line is the command's too
        for line in block["body"].splitlines():
            if continued:
                steps[-1] = ("run", f"{steps[-1][1]}\n{line}", [])
            elif line.startswith("$ "):
                steps.append(("run", line[2:], []))
            elif line.strip():
                steps[-1][2].append(line.strip())
                continue
            continued = line.endswith("\\")
    return steps


def copy_course(destination: Path) -> None:
    """The files git would publish (tracked, or new and not ignored), and this Python's venv as ``.venv``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        pytest.skip(f"the course is not a git checkout here: {listed.stderr.strip()}")
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    venv = destination / ".venv"
    venv.mkdir()
    for entry in Path(sys.prefix).iterdir():  # bin, lib, pyvenv.cfg...: the same environment, not a new one
        if entry.name != ".installed":
            (venv / entry.name).symlink_to(entry)
    (venv / ".installed").touch()  # newer than the copied pyproject.toml: make installs nothing


def environment(course: Path) -> dict[str, str]:
    """This process's environment, less pytest's and make's own, importing the copy's packages first."""
    kept = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("PYTEST_") and name not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "PYTHONPATH")
    }
    return {**kept, "PYTHONPATH": str(course)}


@pytest.mark.slow
def test_the_guide_builds_an_exercise_that_passes_its_tests(tmp_path):
    """About a minute on two cores: two releases (nbgrader), two runs of the exercise's tests."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the walk-through runs make, which needs the course's virtual environment (make's .venv)")
    steps = guide_steps()
    assert [kind for kind, _, _ in steps].count("file") == 3, "the guide shows the three files in full"
    assert steps[0][0] == "run" and steps[0][1].startswith("make new-exercise NAME=")
    course = tmp_path / "course"
    copy_course(course)
    env = environment(course)
    # make must see the linked environment as installed: a stale .installed would pip-install into it
    fresh = subprocess.run(["make", "-q", ".venv/.installed"], cwd=course, env=env)
    assert fresh.returncode == 0, "make would reinstall the environment"
    timings = []
    for kind, what, shown in steps:
        if kind == "file":
            path = course / what
            assert path.is_file(), f"the guide replaces {what}, which the scaffold should have written"
            path.write_text(shown[0])
            continue
        start = time.monotonic()
        done = subprocess.run(
            what, shell=True, cwd=course, env=env, capture_output=True, text=True, timeout=600
        )
        timings.append(f"{time.monotonic() - start:5.1f} s  {what[:70]}")
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"`{what}` failed ({done.returncode}):\n{output[-6000:]}"
        lines = [line.strip() for line in output.splitlines()]
        for line in shown:
            if line.endswith("..."):
                assert any(printed.startswith(line[:-3]) for printed in lines), (
                    f"`{what}` did not print {line!r}"
                )
            else:
                assert line in lines, (
                    f"`{what}` did not print the line {line!r}; it printed:\n{output[-3000:]}"
                )
    print("\n".join(timings))  # pytest -s shows where the time goes
    assert (course / "exercises/ex12_sliding_window/ex12_sliding_window.ipynb").is_file()


def test_the_walk_through_has_its_steps():
    """Quickly: the commands the slow test runs are there, and each file the guide shows is Python."""
    steps = guide_steps()
    commands = [what for kind, what, _ in steps if kind == "run"]
    assert commands[0] == 'make new-exercise NAME=ex12_sliding_window TITLE="Sliding-window masks"'
    assert commands.count("make release ASSIGNMENT=ex12_sliding_window") == 2
    assert any(
        command.startswith(".venv/bin/python -m pytest") and "-k ex12" in command for command in commands
    )
    for kind, what, body in steps:
        if kind == "file":
            compile(body[0], what, "exec")
    assert "solutions/multihead.py" not in GUIDE.read_text()


@pytest.mark.parametrize(
    ("name", "title", "topic", "refusal"),
    [
        ("ex12-sliding-window", None, None, "NAME must be"),
        ("ex03_masks", None, None, "already has ex03_masks"),
        ("ex03_other_masks", None, None, "already has ex03_masks"),  # the number: its checks module
        ("ex12_device", None, None, "attention_course/device exists"),  # the library's, an answer module
        ("ex12_sliding_window", None, "Sliding", "TOPIC must be"),
        ("ex12_sliding_window", "x" * 61, None, "TITLE must be"),
    ],
)
def test_the_scaffold_refuses_what_it_cannot_write(name, title, topic, refusal):
    with pytest.raises(scaffold.Refused, match=re.escape(refusal)):
        scaffold.plan(ROOT, name, title, topic)


def test_the_scaffold_overwrites_nothing(tmp_path):
    (tmp_path / "tests" / "banks").mkdir(parents=True)
    (tmp_path / "tests" / "banks" / "ex99.py").write_text("")
    with pytest.raises(scaffold.Refused, match=re.escape("tests/banks/ex99.py exists")):
        scaffold.plan(tmp_path, "ex99_sliding_window", None, None)
    assignment, files = scaffold.plan(tmp_path, "ex98_sliding_window", None, None)
    assert assignment.title == "Sliding window" and assignment.reference == "solutions.sliding_window"
    assert sorted(path.relative_to(tmp_path).as_posix() for path in files) == [
        "attention_course/checks/ex98.py",
        "solutions/sliding_window.py",
        "tests/banks/ex98.py",
    ]
    for path, text in files.items():
        compile(text, str(path), "exec")
    assert scaffold.MARKER in (ROOT / "attention_course" / "registry.py").read_text()


def test_the_scaffold_writes_everything_or_nothing(tmp_path, monkeypatch):
    for folder in ("solutions", "attention_course/checks", "tests/banks"):
        (tmp_path / folder).mkdir(parents=True)
    registry = tmp_path / "attention_course" / "registry.py"
    shutil.copy(ROOT / "attention_course" / "registry.py", registry)
    monkeypatch.setattr(scaffold, "attention_course", SimpleNamespace(__file__=str(registry)))

    def fails(assignment, root):
        raise RuntimeError("the checks module does not import")

    monkeypatch.setattr(scaffold, "notebook", fails)
    with pytest.raises(RuntimeError, match="does not import"):
        scaffold.scaffold(tmp_path, "ex98_sliding_window")
    assert registry.read_text() == (ROOT / "attention_course" / "registry.py").read_text()
    assert sorted(path.name for path in tmp_path.rglob("*") if path.is_file()) == ["registry.py"]


def test_make_release_of_one_assignment():
    def command(*arguments: str) -> str:
        # under `make test`, make prints the directories it enters and leaves unless told not to
        done = subprocess.run(
            ["make", "--no-print-directory", "-n", "release", *arguments],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    assert command().endswith("/attention-release")  # every assignment, whatever ASSIGNMENT's default is
    assert command("ASSIGNMENT=ex02_scaled_dot_product").endswith("attention-release ex02_scaled_dot_product")


def test_the_release_adds_and_removes_generated_cells_only():
    """A behaviour without a test cell gets one after its function's cells; the cells of a function and a
    behaviour that are gone go (a task cell only while it holds the placeholder); other cells stay."""
    behaviours = [
        SimpleNamespace(name="f_values", function="f", points=2),
        SimpleNamespace(name="f_format", function="f", points=1),
        SimpleNamespace(name="g_values", function="g", points=1),
    ]
    cells = [
        release.new_cell("text", "intro", "# An exercise"),
        release.new_cell("text", "task_old", release.task_text("old")),
        release.new_cell("solution", "old", "def old(): ..."),
        release.new_cell("test", "old_values", points=1),
        release.new_cell("text", "task_f", "The task of f, written."),
        release.new_cell("solution", "f", "def f(): ..."),
        release.new_cell("test", "f_format", points=1),
        release.new_cell("text", "task_gone", "A task written for a function now gone."),
    ]
    notebook = nbformat.v4.new_notebook(cells=cells)
    changes = release._restructure(notebook, behaviours)
    assert [cell.metadata.nbgrader.grade_id for cell in notebook.cells] == [
        "intro",
        "task_f",
        "f",
        "f_values",
        "f_format",
        "task_g",
        "g",
        "g_values",
        "task_gone",
    ]
    assert changes == [
        "task_old (cell removed)",
        "old (cell removed)",
        "old_values (cell removed)",
        "g (new cell)",
        "f_values (new cell)",
        "g_values (new cell)",
    ]
    test = notebook.cells[3].metadata
    assert test.nbgrader.grade and test.nbgrader.locked and test.nbgrader.points == 2 and not test.editable
    assert notebook.cells[6].metadata.nbgrader.solution and not notebook.cells[6].metadata.nbgrader.locked
    nbformat.validate(notebook)
