"""The book: every chapter executes top to bottom, and the whole book builds with warnings as errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest
from nbclient import NotebookClient

from tests.notebook_tools import ROOT

pytestmark = pytest.mark.slow
CHAPTERS = sorted((ROOT / "chapters").glob("*.md"))


def test_there_are_chapters():
    assert [chapter.stem[:2] for chapter in CHAPTERS] == ["01", "02", "03"]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda path: path.stem)
def test_chapter_executes_top_to_bottom(chapter: Path):
    notebook = jupytext.read(chapter)
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "chapters")}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails
    errors = [
        o
        for cell in notebook.cells
        if cell.cell_type == "code"
        for o in cell.outputs
        if o.output_type == "error"
    ]
    assert not errors


def test_book_builds_without_warnings(tmp_path):
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    command = ["jupyter-book", "build", str(ROOT), "-W", "-n", "--keep-going", "--path-output", str(tmp_path)]
    built = subprocess.run(command, env=environment, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-5000:] + built.stderr[-5000:]
    html = tmp_path / "_build" / "html"
    for page in (
        "intro",
        "notation",
        "chapters/01_soft_lookup",
        "chapters/02_scaled_dot_product",
        "chapters/03_masks",
    ):
        assert (html / f"{page}.html").is_file(), page
    # the exercise page shows the student release: no solution, no hidden test
    exercise = (html / "exercises/ex02_scaled_dot_product/ex02_scaled_dot_product.html").read_text()
    assert "NotImplementedError" in exercise and "BEGIN HIDDEN TESTS" not in exercise
    assert "from solutions" not in exercise
    # MathJax is served from the build, so the maths renders offline
    assert list(html.glob("_static/**/tex-chtml*.js")) or list(html.glob("_static/**/mathjax/**"))
