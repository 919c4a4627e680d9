"""The launch buttons: every chapter and exercise opens on Colab and Binder as a notebook that runs.

Colab and Binder open a notebook from the repository on GitHub, so the files the buttons point at must
be committed there: the chapters' notebooks `chapters/<name>.ipynb` (generated from the MyST sources by
`make notebooks`, their markdown cells rewritten in the plain Markdown that Jupyter and Colab render by
_ext/plain_markdown.py; a test fails when one is stale), the exercises' student releases, and Binder's
environment file `binder/requirements.txt`. Each notebook starts with a set-up cell that installs the
course library from the repository where it is missing (Colab) and does nothing where it is installed
(Binder, a learner's machine, the graders). Without network access these tests check the URLs, the
files and the set-up cell's logic, not the services themselves.
"""

from __future__ import annotations

import ast
import html as html_entities
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import jupytext
import nbformat
import pytest
import yaml
from IPython.core.inputtransformer2 import TransformerManager
from packaging.requirements import Requirement

from attention_course.grading.scaffold import install_cell
from tests.conftest import ROOT, BookBuild

sys.path.insert(0, str(ROOT / "_ext"))  # the book's own tools, imported as Sphinx and `make notebooks` do
plain_markdown = importlib.import_module("plain_markdown")

# one xdist worker builds the book for every test that reads it (make test runs with --dist loadgroup)
pytestmark = pytest.mark.xdist_group("book")
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
REPOSITORY = CONFIG["repository"]["url"]  # https://github.com/<org>/<repo>, a placeholder until published
BRANCH = CONFIG["repository"]["branch"]
ORG_REPO = urlsplit(REPOSITORY).path.strip("/")
CHAPTERS = sorted((ROOT / "chapters").glob("*.md"))
EXERCISES = sorted((ROOT / "exercises").glob("*/*.ipynb"))

# The first code cell of every notebook that a launch button opens (chapters and exercises alike), as
# make new-exercise writes it
SETUP_CELL = install_cell(ROOT)


def first_code_cell(notebook: nbformat.NotebookNode) -> str:
    return next(cell.source for cell in notebook.cells if cell.cell_type == "code")


def tracked_or_committable(path: Path) -> bool:
    """Whether git would publish the file: not ignored (it may still be uncommitted in a working tree)."""
    ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT, check=False)
    return ignored.returncode == 1


# --- the chapters' notebooks ---


@pytest.fixture(scope="module")
def book() -> plain_markdown.Book:
    return plain_markdown.Book.load(ROOT)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda path: path.stem)
def test_chapter_notebook_is_current(chapter: Path, book: plain_markdown.Book):
    """`chapters/<name>.ipynb` holds exactly the cells of `chapters/<name>.md`, its markdown cells in plain
    Markdown (run `make notebooks`)."""
    committed = nbformat.read(chapter.with_suffix(".ipynb"), as_version=4)
    nbformat.validate(committed)
    page = chapter.relative_to(ROOT).with_suffix("").as_posix()
    expected = plain_markdown.plain_notebook(jupytext.read(chapter), book, page)

    def cells(notebook):
        return [(cell.cell_type, cell.source, dict(cell.metadata)) for cell in notebook.cells]

    assert cells(committed) == cells(expected), (
        f"{chapter.with_suffix('.ipynb').name} is stale: make notebooks"
    )
    assert committed.metadata.kernelspec.name == "python3"
    assert all(not cell.get("outputs") for cell in committed.cells if cell.cell_type == "code")


@pytest.mark.parametrize(
    "notebook",
    [chapter.with_suffix(".ipynb") for chapter in CHAPTERS] + EXERCISES,
    ids=lambda path: path.stem,
)
def test_launched_notebooks_hold_no_myst_markup(notebook: Path):
    """Jupyter and Colab render CommonMark: a citation, cross-reference, target, comment or directive left
    in MyST syntax would show as it is written."""
    cells = nbformat.read(notebook, as_version=4).cells
    markers = [found for cell in cells if cell.cell_type == "markdown" for found in myst_markers(cell.source)]
    assert markers == [], f"{len(markers)} MyST markers in {notebook.name} (make notebooks): {markers[:10]}"


def myst_markers(markdown: str) -> list[str]:
    return plain_markdown.myst_markers(markdown)


MYST = """\
(ch-example)=
# An example

% a comment for the authors
Scaled {cite:p}`vaswani2017attention{section 3.2.1}`, as {cite:t}`bahdanau2015neural` did not; see
{ref}`ch-masks`, {ref}`the table <ch-masks-fill-values>`, {doc}`../exercises/ex03_masks/ex03_masks`
and {doc}`the next chapter <03_masks>`, with $\\sqrt{d_k}$ and {math}`x^2`.

:::{admonition} The course library's functions
:class: dropdown

```{literalinclude} ../attention_course/masks.py
:language: python
:pyobject: causal_mask
:start-at: k_len = q_len
:end-at: return (key_position
:dedent:
```
:::

```{admonition} A tempting mistake
:class: warning
It is tempting to write {ref}`notation`.
```

```python
text = "{cite}`kept` in code"
```"""


def test_myst_becomes_plain_markdown(book: plain_markdown.Book):
    plain = plain_markdown.plain_markdown(MYST, book, "chapters/02_example")
    site = "https://attention-course.github.io/attention-course/"
    assert plain.startswith("# An example\n\nScaled ([Vaswani et al., 2017, section 3.2.1](https://arxiv")
    assert "as [Bahdanau et al. (2015)](https://arxiv.org/" in plain
    assert f"see\n[Masks]({site}chapters/03_masks.html#ch-masks), " in plain
    assert f"[the table]({site}chapters/03_masks.html#ch-masks-fill-values)" in plain
    assert f"[Exercise 3: masks]({site}exercises/ex03_masks/ex03_masks.html)" in plain
    assert f"[the next chapter]({site}chapters/03_masks.html)" in plain
    assert "$\\sqrt{d_k}$ and $x^2$." in plain
    folded = "<details>\n<summary><b>The course library's functions</b></summary>\n\n```python\n"
    assert f"{folded}k_len = q_len if k_len is None else k_len\n" in plain  # the lines the book shows
    assert "\n    return (key_position <= query_position)[None, None]" not in plain  # dedented
    last_lines = "# [1, 1, q_len, k_len]\nreturn (key_position <= query_position)[None, None]\n"
    assert f"{last_lines}```\n\n</details>" in plain  # the comment above the line, as ruff at 76 wants
    assert f"> **A tempting mistake**\n>\n> It is tempting to write [Notation]({site}notation.html" in plain
    assert plain.endswith('```python\ntext = "{cite}`kept` in code"\n```')
    assert "comment" not in plain and "(ch-example)=" not in plain
    assert myst_markers(MYST) and not myst_markers(plain)
    assert plain_markdown.plain_markdown(plain, book, "chapters/02_example") == plain  # nothing left to do


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda path: path.stem)
def test_chapter_starts_with_the_set_up_cell_hidden_from_the_book(chapter: Path):
    notebook = jupytext.read(chapter)
    first = next(cell for cell in notebook.cells if cell.cell_type == "code")
    assert first.source == SETUP_CELL
    assert first.metadata.get("tags") == ["remove-cell"]  # in the notebook, not on the page


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda path: path.stem)
def test_exercise_starts_with_the_set_up_cell(exercise: Path):
    """Depends on the exercise notebooks: their first code cell must be the set-up cell (before the
    imports of `attention_course`), or the exercise fails at its first import on Colab."""
    notebook = nbformat.read(exercise, as_version=4)
    assert first_code_cell(notebook) == SETUP_CELL
    first = next(cell for cell in notebook.cells if cell.cell_type == "code")
    assert first.metadata.get("tags") == ["remove-cell"]  # in the notebook, not on the book's page


def test_set_up_cell_does_nothing_where_the_course_is_installed(monkeypatch):
    def no_install(*args, **kwargs):
        raise AssertionError(f"the set-up cell ran {args} where the course is installed")

    assert importlib.util.find_spec("attention_course") is not None
    monkeypatch.setattr(subprocess, "run", no_install)
    exec(compile(SETUP_CELL, "<set-up cell>", "exec"), {})


def test_set_up_cell_installs_the_course_from_the_repository_where_it_is_missing(monkeypatch):
    commands = []
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "attention_course" else find_spec(name),
    )
    monkeypatch.setattr(subprocess, "run", lambda command, **kwargs: commands.append((command, kwargs)))
    exec(compile(SETUP_CELL, "<set-up cell>", "exec"), {})
    ((command, kwargs),) = commands
    assert command[:4] == [sys.executable, "-m", "pip", "install"] and kwargs == {"check": True}
    requirement = Requirement(command[-1])  # a valid PEP 508 requirement: name @ git URL of the branch
    assert requirement.name == "attention-course"
    assert requirement.url == f"git+{REPOSITORY}@{BRANCH}"


# --- what the notebooks import is installed on Colab and Binder ---


def imported_modules(source: str) -> set[str]:
    """Top-level names of the modules a piece of Python code imports (absolute imports only)."""
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from package import name`: name may be a submodule (`from attention_course.checks import ex01`)
            modules |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return modules


def course_modules_needed(start: set[str]) -> set[str]:
    """Every module the given ones import, following the imports inside `attention_course`."""
    needed, todo = set(), set(start)
    while todo:
        module = todo.pop()
        if module in needed:
            continue
        needed.add(module)
        if module.split(".")[0] == "attention_course":
            try:
                spec = importlib.util.find_spec(module)
            except ModuleNotFoundError:  # `from module import function`: not a module itself
                continue
            if spec is not None and spec.origin and spec.origin.endswith(".py"):
                todo |= imported_modules(Path(spec.origin).read_text())
    return needed


def test_notebooks_import_only_what_the_course_installs():
    """What chapters and exercises import, directly or through the library, is the standard library, the
    library itself or a dependency of the project: what Colab gets from the set-up cell and Binder from
    binder/requirements.txt (`-e .`)."""
    distributions = importlib.metadata.packages_distributions()
    dependencies = {
        Requirement(line).name.lower()
        for line in importlib.metadata.requires("attention-course") or []
        if "extra ==" not in line
    }
    cells_as_python = TransformerManager().transform_cell  # a magic (`%config`) as the Python IPython runs
    sources = [
        cells_as_python(cell.source)
        for path in [*CHAPTERS, *EXERCISES]
        for cell in (jupytext.read(path) if path.suffix == ".md" else nbformat.read(path, 4)).cells
        if cell.cell_type == "code"
    ]
    needed = course_modules_needed({module for source in sources for module in imported_modules(source)})
    missing = sorted(
        module
        for module in {name.split(".")[0] for name in needed}
        if module not in sys.stdlib_module_names
        and module != "attention_course"
        and not {name.lower() for name in distributions.get(module, [])} & dependencies
    )
    assert missing == [], f"imported by a notebook but not a dependency in pyproject.toml: {missing}"


def test_binder_installs_the_cpu_build_of_torch_and_the_course():
    lines = [
        line.split("#")[0].strip() for line in (ROOT / "binder/requirements.txt").read_text().splitlines()
    ]
    lines = [line for line in lines if line]
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    assert "-e ." in lines  # repo2docker installs the repository itself when a line refers to it
    (torch,) = [Requirement(line) for line in lines if line.startswith("torch")]
    project = [Requirement(line) for line in importlib.metadata.requires("attention-course") or []]
    assert torch.specifier == next(r for r in project if r.name == "torch").specifier  # the same range


# --- the buttons on the built pages ---


def launch_links(page: Path) -> dict[str, str]:
    links = re.findall(
        r'href="(https://(?:colab\.research\.google\.com|mybinder\.org)/[^"]+)"', page.read_text()
    )
    return {urlsplit(link).netloc: html_entities.unescape(link) for link in links}


@pytest.mark.slow
@pytest.mark.parametrize(
    "page",
    [path.with_suffix("").relative_to(ROOT).as_posix() for path in [*CHAPTERS, *EXERCISES]],
)
def test_launch_buttons_open_the_page_notebook(built_book: BookBuild, page: str):
    notebook = ROOT / f"{page}.ipynb"
    links = launch_links(built_book.require() / f"{page}.html")
    assert links == {
        "colab.research.google.com": f"https://colab.research.google.com/github/{ORG_REPO}/blob/{BRANCH}/{page}.ipynb",
        "mybinder.org": f"https://mybinder.org/v2/gh/{ORG_REPO}/{BRANCH}?urlpath=tree/{page}.ipynb",
    }
    (target,) = parse_qs(urlsplit(links["mybinder.org"]).query)["urlpath"]
    assert target == f"tree/{page}.ipynb"
    assert notebook.is_file() and tracked_or_committable(notebook)
    assert tracked_or_committable(ROOT / "binder/requirements.txt")
    nbformat.validate(nbformat.read(notebook, as_version=4))
