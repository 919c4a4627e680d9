"""The book: the whole book builds with warnings as errors, every chapter executed top to bottom in it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import jupytext
import nbformat
import pytest

from tests.conftest import ROOT, TRAINING_CHAPTERS, BookBuild

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
    failed = built_book.failed_chapters()
    if chapter.stem in failed:
        pytest.fail(f"{chapter.name} failed to execute in the book's build:\n{failed[chapter.stem][-8000:]}")
    if not failed:  # when another chapter broke the build, this one's execution is still read back below
        built_book.require()
    executed = built_book.html.parent / "jupyter_execute" / "chapters" / f"{chapter.stem}.ipynb"
    assert executed.is_file(), f"the build left no executed notebook for {chapter.name}"
    code = [cell for cell in nbformat.read(executed, as_version=4).cells if cell.cell_type == "code"]
    written = [cell for cell in jupytext.read(chapter).cells if cell.cell_type == "code"]
    assert [cell.source for cell in code] == [cell.source for cell in written]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    errors = [output for cell in code for output in cell.outputs if output.output_type == "error"]
    assert not errors


def test_each_chapter_is_executed_once_before_sphinx_reads_it(built_book: BookBuild):
    """``make book`` executes the chapters side by side into the jupyter-cache (_ext/build_book.py), and
    both editions' builds find every chapter there: were the notebook it caches not the one myst-nb makes of
    the page (another hash), the build would execute each chapter again, one after another."""
    built_book.require()
    if os.environ.get("BOOK_HTML"):
        pytest.skip("BOOK_HTML: a book built before is read, its build is not tested")
    for chapter in CHAPTERS:
        assert f"{chapter.name} executed in" in built_book.log, chapter.name
        assert built_book.log.count(f"chapters/{chapter.name}: Using cached notebook") == 2, chapter.name
    assert "Executing notebook" not in built_book.log


@pytest.mark.parametrize("edition", ["", "zh"])
def test_a_chapter_s_download_is_the_executed_notebook(built_book: BookBuild, edition: str):
    """The page's download button (``_sources/chapters/<name>.ipynb``) gives the notebook with its outputs,
    in both editions, although every page's outputs came from the cache (myst-nb writes there the notebook
    as it read the page; _ext/build_book.py writes the executed one)."""
    html = built_book.require() / edition
    for chapter in CHAPTERS:
        executed = built_book.html.parent / "jupyter_execute" / "chapters" / f"{chapter.stem}.ipynb"
        download = html / "_sources" / "chapters" / f"{chapter.stem}.ipynb"
        outputs = [cell.get("outputs") for cell in nbformat.read(download, as_version=4).cells]
        assert outputs == [cell.get("outputs") for cell in nbformat.read(executed, as_version=4).cells]
        assert any(outputs), chapter.name


def test_book_builds_without_warnings(built_book: BookBuild):
    """The build passes with warnings as errors. A chapter that failed to execute fails its own test above,
    not this one too."""
    failed = built_book.failed_chapters()
    if built_book.returncode != 0 and failed:
        pytest.skip(f"the build failed because {', '.join(failed)} failed to execute (their own tests fail)")
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
        assert (html / "zh" / f"{page}.html").is_file(), f"zh/{page}"
    # the exercise page shows the student release: no solution, no hidden test
    exercise = (html / "exercises/ex02_scaled_dot_product/ex02_scaled_dot_product.html").read_text()
    assert "NotImplementedError" in exercise and "BEGIN HIDDEN TESTS" not in exercise
    assert "from solutions" not in exercise
    # MathJax is served from the build, so the maths renders offline
    assert list(html.glob("_static/**/tex-chtml*.js")) or list(html.glob("_static/**/mathjax/**"))


def test_a_chapter_that_fails_to_execute_is_named_once(tmp_path):
    """A failed chapter fails its own test; the tests that read the built book skip, naming the chapter."""
    html = tmp_path / "html"
    (html / "reports" / "chapters").mkdir(parents=True)
    (html / "reports" / "chapters" / "07_transformer_block.err.log").write_text("AssertionError in cell 31")
    broken = BookBuild(1, "the whole build log", html)
    assert broken.failed_chapters() == {"07_transformer_block": "AssertionError in cell 31"}
    with pytest.raises(pytest.skip.Exception, match="07_transformer_block failed to execute"):
        broken.require()
    # a build that failed for another reason (a warning) fails every test that needs it, with its log
    (html / "reports" / "chapters" / "07_transformer_block.err.log").unlink()
    with pytest.raises(pytest.fail.Exception, match="the whole build log"):
        broken.require()
    assert BookBuild(0, "", html).require() == html


# The chapters that train models: their asserted numbers depend on the trained weights.
def _printed(notebook: nbformat.NotebookNode) -> list[list[str]]:
    """What each code cell printed or displayed as text, in order; cells tagged ``timing`` left out (they
    print how long something took, which no two runs share).

    Consecutive outputs of one stream are joined: how a kernel cuts what a cell prints into messages
    depends on timing (a line and its new line can arrive apart on a busy machine), not on what it printed.
    """
    texts = []
    for cell in notebook.cells:
        if cell.cell_type != "code" or "timing" in cell.metadata.get("tags", []):
            continue
        shown: list[tuple[str, str]] = []  # (stream name, or "" for a display; its text)
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                if shown and shown[-1][0] == output.get("name"):
                    shown[-1] = (shown[-1][0], shown[-1][1] + output.get("text", ""))
                else:
                    shown.append((output.get("name", "stdout"), output.get("text", "")))
            elif "data" in output:
                shown.append(("", output["data"].get("text/plain", "")))
        texts.append([text for _, text in shown])
    return texts


def test_training_chapters_are_listed():
    """Every chapter that builds an optimiser is in TRAINING_CHAPTERS, and each fixes its threads."""
    training = {chapter.stem for chapter in CHAPTERS if "torch.optim." in chapter.read_text()}
    assert training == set(TRAINING_CHAPTERS)
    for name in TRAINING_CHAPTERS:
        assert "make_reproducible()" in (ROOT / "chapters" / f"{name}.md").read_text(), name


@pytest.mark.parametrize("name", TRAINING_CHAPTERS)
def test_a_training_chapter_prints_the_same_numbers_with_two_threads(built_book, name):
    """The book's build runs every chapter with ``OMP_NUM_THREADS=1`` (tests/conftest.py); run again with 2
    (beside the build, :class:`tests.conftest.Rerun`), a chapter that trains prints exactly the same text:
    the same losses, accuracies and generated text.

    Without ``make_reproducible`` at its top, a chapter's models train with as many threads as the
    environment gives, and the sums inside each product are added in another order: the weights, and what
    the chapter prints of them, differ in the last digits or more.
    """
    failed = built_book.failed_chapters()
    if name in failed:
        pytest.skip(f"{name} failed to execute in the book's build (its own test fails)")
    built = built_book.html.parent / "jupyter_execute" / "chapters" / f"{name}.ipynb"
    again = nbformat.read(built_book.reruns[name].result(), as_version=4)
    assert _printed(again) == _printed(nbformat.read(built, as_version=4))


def _text(page: Path) -> str:
    """A built page's article prose: its tags, code and formulas left out."""
    html = page.read_text()
    article = html[html.find('<article class="bd-article">') :]
    article = re.sub(r"<(script|style|pre|code)\b.*?</\1>", " ", article, flags=re.DOTALL)
    article = re.sub(
        r'<span class="math[^"]*">.*?</span>|<div class="math[^"]*">.*?</div>', " ", article, flags=re.DOTALL
    )
    return re.sub(r"<[^>]+>", " ", article)


@pytest.mark.parametrize(
    "page",
    [
        "intro",
        "chapters/03_masks",
        "chapters/11_tiled_attention",
        "exercises/ex02_scaled_dot_product/ex02_scaled_dot_product",
    ],
)
def test_the_chinese_edition_is_chinese_and_links_to_the_english(built_book: BookBuild, page: str):
    """The Chinese edition's page is written in Chinese, keeps the English page's formulas and code, and each
    edition links to the same page in the other."""
    html = built_book.require()
    english, chinese = html / f"{page}.html", html / "zh" / f"{page}.html"
    text = _text(chinese)
    han = len(re.findall(r"[\u4e00-\u9fff]", text))
    assert han > 0.5 * len(re.findall(r"[A-Za-z]", text)), "most of the page's prose is not Chinese"
    assert '<html lang="zh-CN"' in chinese.read_text()
    for source, target, language in ((english, chinese, "zh-CN"), (chinese, english, "en")):
        links = re.findall(
            rf'<a class="course-edition" href="([^"]+)" hreflang="{language}"', source.read_text()
        )
        assert len(links) == 1, f"{source.relative_to(html)} has no link to its {language} edition"
        assert (source.parent / links[0]).resolve() == target.resolve()
    # the same formulas and the same code
    formulas = re.compile(r'<span class="math notranslate nohighlight">(.*?)</span>', re.DOTALL)
    # (as multisets: a translated sentence may name two formulas in the other order)
    assert sorted(formulas.findall(english.read_text())) == sorted(formulas.findall(chinese.read_text()))
    code = re.compile(r'<div class="highlight[^"]*"><pre>(.*?)</pre>', re.DOTALL)
    assert code.findall(english.read_text()) == code.findall(chinese.read_text())
