"""The book: the whole book builds with warnings as errors, every chapter executed top to bottom in it."""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import nbformat
import pytest

from tests.conftest import ROOT, BookBuild

# one xdist worker builds the book for every test that reads it (make test runs with --dist loadgroup)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("book")]
CHAPTERS = sorted((ROOT / "chapters").glob("*.md"))


PUBLIC_PAGES = sorted(
    path
    for pattern in ("*.md", "chapters/*.md", "instructors/*.md")
    for path in ROOT.glob(pattern)
    if path.name != "README.md"
)


@pytest.mark.parametrize("page", PUBLIC_PAGES, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_pages_cite_what_readers_can_see(page: Path):
    """The book cites papers and documentation, never the course's internal notes or their erratum ids."""
    text = page.read_text()
    assert not re.search(r"\bseed (document|errat)|\berrat(um|a)\b|\bS[0-4]-\d+\b", text, re.IGNORECASE)


def test_there_are_chapters():
    assert [chapter.stem[:2] for chapter in CHAPTERS] == [
        "01",
        "02",
        "03",
        "04",
        "05",
        "06",
        "07",
        "08",
        "09",
        "10",
        "11",
    ]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda path: path.stem)
def test_chapter_executes_top_to_bottom(built_book: BookBuild, chapter: Path):
    """The build ran every code cell of the chapter once, in order, in one kernel, and none failed.

    Read back from the notebook the build executed (``_build/jupyter_execute``) rather than run a second
    time: the build is what readers see, and executing each chapter twice doubled the book's share of
    the test run.
    """
    executed = built_book.require().parent / "jupyter_execute" / "chapters" / f"{chapter.stem}.ipynb"
    assert executed.is_file(), f"the build left no executed notebook for {chapter.name}"
    code = [cell for cell in nbformat.read(executed, as_version=4).cells if cell.cell_type == "code"]
    written = [cell for cell in jupytext.read(chapter).cells if cell.cell_type == "code"]
    assert [cell.source for cell in code] == [cell.source for cell in written]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    errors = [output for cell in code for output in cell.outputs if output.output_type == "error"]
    assert not errors


def test_book_builds_without_warnings(built_book: BookBuild):
    assert built_book.returncode == 0, built_book.log[-10000:]
    html = built_book.html
    for page in (
        "intro",
        "how_to_use",
        "notation",
        "chapters/01_soft_lookup",
        "chapters/02_scaled_dot_product",
        "chapters/03_masks",
        "chapters/04_multi_head",
        "chapters/05_grouped_query",
        "chapters/06_cross_attention",
        "chapters/07_transformer_block",
        "chapters/08_positions",
        "chapters/09_conv_heads",
        "chapters/10_kv_cache",
        "chapters/11_tiled_attention",
        "exercises/ex04_multi_head/ex04_multi_head",
        "exercises/ex05_grouped_query/ex05_grouped_query",
        "exercises/ex06_cross_attention/ex06_cross_attention",
        "exercises/ex07_transformer_block/ex07_transformer_block",
        "exercises/ex08_positional/ex08_positional",
        "exercises/ex09_conv_heads/ex09_conv_heads",
        "exercises/ex10_kv_cache/ex10_kv_cache",
        "exercises/ex11_tiled_attention/ex11_tiled_attention",
        "instructors/index",
        "instructors/authoring",
        "glossary",
        "bibliography",
    ):
        assert (html / f"{page}.html").is_file(), page
    # the exercise page shows the student release: no solution, no hidden test
    exercise = (html / "exercises/ex02_scaled_dot_product/ex02_scaled_dot_product.html").read_text()
    assert "NotImplementedError" in exercise and "BEGIN HIDDEN TESTS" not in exercise
    assert "from solutions" not in exercise
    # MathJax is served from the build, so the maths renders offline
    assert list(html.glob("_static/**/tex-chtml*.js")) or list(html.glob("_static/**/mathjax/**"))
