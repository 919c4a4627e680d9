"""The release for learners (``make student-release DEST=...``): no answers, and what a learner uses works.

The copy is made once, then scanned here for answers: the folders left out, a solution's own code (a function
that only ``solutions/`` defines), a hidden test, an import of ``solutions`` or of the tests. In the copy the
book builds (warnings are errors) and every exercise notebook opens; with the reference solutions filled in,
every visible check of every exercise passes in a Python that imports the copy's library and cannot import
``solutions`` or ``tests``.

The book is built from the chapters' cached executions of the session's book build (``built_book``): the
copy's chapters are the same files, and jupyter-cache matches a notebook by its code, so executing them again
would repeat that build's work. Executing them there is equivalent because no chapter imports ``solutions`` or
the tests (the scan), which are the only files the copy lacks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from attention_course.grading import student_release
from attention_course.registry import ASSIGNMENTS
from tests.conftest import BookBuild
from tests.notebook_tools import ROOT, fill_solutions, load_exercise, reference_sources

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("book"),
]  # beside the book's build, whose cache it uses


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("student-release") / "course"
    done = subprocess.run(
        ["make", "-s", "student-release", f"DEST={dest}"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return dest


def _source_lines(pattern: str) -> set[str]:
    """Lines between nbgrader's markers in the source notebooks (here, independently of the module), less
    the lines that a source shows outside every marked region too (a signature line that a helper method
    inside a solution repeats: released anyway)."""
    begin, end = f"### BEGIN {pattern}", f"### END {pattern}"
    lines: set[str] = set()
    shown: set[str] = set()
    for assignment in ASSIGNMENTS.values():
        for cell in nbformat.read(assignment.source(ROOT), as_version=4).cells:
            inside, depth = False, 0
            for line in cell.source.splitlines():
                if line.strip() == end:
                    inside = False
                if inside and line.strip():
                    lines.add(line.strip())
                if line.strip() == begin:
                    inside = True
                depth += line.strip().startswith("### BEGIN ") - line.strip().startswith("### END ")
                outside = depth == 0 and not line.strip().startswith("### ")
                if cell.cell_type == "code" and outside:
                    shown.add(line.strip())
    return lines - shown


def _all_text(folder: Path) -> str:
    texts = []
    for path in folder.rglob("*"):
        if path.is_file():
            try:
                texts.append(path.read_text())
            except UnicodeDecodeError:
                pass
    return "\n".join(texts)


def test_the_copy_leaves_out_solutions_banks_and_tests(release):
    assert not (release / "solutions").exists() and not (release / "tests").exists()
    assert (release / "exercises").is_dir() and (release / "attention_course" / "checks").is_dir()
    assert not list(release.rglob("*bank*"))
    # an instructor's tool whose templates import the tests' banks
    assert not (release / "attention_course" / "grading" / "scaffold.py").exists()


def test_the_copy_holds_no_hidden_test_and_no_reference_import(release):
    hidden = _source_lines("HIDDEN TESTS")
    assert len(hidden) >= 50  # every behaviour's hidden line
    for path in list(release.rglob("*.ipynb")) + list(release.rglob("*.py")):
        text = path.read_text()
        assert not [line for line in hidden if line in text], path
        assert "import solutions" not in text and "from solutions" not in text, path
        assert "from tests" not in text and "import tests" not in text, path


def test_the_copy_holds_no_solution_of_its_own(release):
    # dot_product_variance exists only in solutions/attention.py: not one line of its body may be copied
    from solutions.attention import dot_product_variance

    body = [line.strip() for line in _body(dot_product_variance)]
    assert len(body) >= 4
    text = _all_text(release)
    assert not [line for line in body if line in text]


def _body(function) -> list[str]:
    import ast
    import inspect

    source = textwrap.dedent(inspect.getsource(function))
    definition = ast.parse(source).body[0]
    lines = source.splitlines()[definition.body[1].lineno - 1 : definition.end_lineno]  # after the docstring
    return [line for line in lines if len(line.strip()) > 20 and not line.strip().startswith("#")]


def test_released_notebooks_hold_no_line_of_a_solution(release):
    solutions = {line for line in _source_lines("SOLUTION") if len(line) > 20}
    for path in (release / "exercises").rglob("*.ipynb"):
        notebook = nbformat.read(path, as_version=4)
        nbformat.validate(notebook)  # it opens
        code = {
            line.strip()
            for cell in notebook.cells
            if cell.cell_type == "code"
            for line in cell.source.splitlines()
        }
        assert not code & solutions, path


def test_the_scan_finds_answers_put_into_a_copy(release, tmp_path):
    assert student_release.scan(release, ROOT) == []
    planted = tmp_path / "planted"
    shutil.copytree(release, planted)
    hidden = sorted(_source_lines("HIDDEN TESTS"))[0]
    (planted / "attention_course" / "extra.py").write_text(f"from solutions import attention\n{hidden}\n")
    solution = sorted(line for line in _source_lines("SOLUTION") if len(line) >= 24)[0]
    (planted / "exercises" / "extra.py").write_text(f"{solution}\n")
    (planted / "solutions").mkdir()
    problems = student_release.scan(planted, ROOT)
    assert any("solutions/ is in the copy" in p for p in problems)
    assert any("imports the answers" in p for p in problems)
    assert any("hidden tests" in p for p in problems)
    assert f"exercises/extra.py: holds a line of the solutions: {solution}" in problems


def test_the_book_builds_in_the_copy(release, built_book: BookBuild, tmp_path):
    cache = built_book.require().parent / ".jupyter_cache"
    output = tmp_path / "book"
    if cache.is_dir():
        shutil.copytree(cache, output / "_build" / ".jupyter_cache")
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    command = [
        "jupyter-book",
        "build",
        str(release),
        "-W",
        "-n",
        "--keep-going",
        "--path-output",
        str(output),
    ]
    built = subprocess.run(command, env=environment, capture_output=True, text=True, cwd=tmp_path)
    log = built.stdout + built.stderr
    assert built.returncode == 0, log[-8000:]
    assert (output / "_build" / "html" / "intro.html").is_file()
    chapters = sorted(p.stem for p in (release / "chapters").glob("*.md"))
    for chapter in chapters:
        assert (output / "_build" / "html" / "chapters" / f"{chapter}.html").is_file(), chapter


CHECKS = textwrap.dedent("""
    import json, sys
    sys.modules["solutions"] = None  # importing the answers fails, as where they are not installed
    sys.modules["tests"] = None
    import attention_course
    import nbformat
    ran = {"library": attention_course.__file__, "cells": {}}
    for path in sys.argv[1:]:
        notebook = nbformat.read(path, as_version=4)
        namespace = {"__name__": "__main__"}
        count = 0
        for cell in notebook.cells:
            if cell.cell_type != "code":
                continue
            exec(compile(cell.source, path, "exec"), namespace)  # a failing visible check raises here
            count += bool(cell.metadata.get("nbgrader", {}).get("grade"))
        ran["cells"][path] = count
    print(json.dumps(ran))
""")


def test_every_visible_check_runs_in_the_copy_without_solutions(release, tmp_path):
    filled = []
    for assignment_id in sorted(ASSIGNMENTS):
        exercise = load_exercise(assignment_id)
        notebook = nbformat.read(
            release / "exercises" / assignment_id / f"{assignment_id}.ipynb", as_version=4
        )
        path = tmp_path / f"{assignment_id}.ipynb"
        nbformat.write(fill_solutions(notebook, reference_sources(exercise)), path)
        filled.append(str(path))
    environment = {**os.environ, "PYTHONPATH": str(release), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, "-c", CHECKS, *filled], cwd=release, env=environment, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    ran = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(ran["library"]).is_relative_to(release)  # the copy's library, not the repository's
    for path in filled:
        exercise = load_exercise(Path(path).stem)
        assert ran["cells"][path] == len(exercise.tests), path  # every test cell ran, and passed
