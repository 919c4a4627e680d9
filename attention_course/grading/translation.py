"""The exercise notebooks in other languages: the same notebooks, with their markdown translated.

An exercise exists once, in English: its source notebook ``solutions/<id>/<id>.ipynb``. Its text cells
(tasks, introductions) are the messages of a gettext catalogue,
``locales/<language>/LC_MESSAGES/notebooks/<id>.po``, one message per markdown cell, whose context is the
cell's grade id. The model answers of written questions are not among them: they are the instructors'
(nbgrader replaces them in the release), and the catalogues are published with the course. The translated
source notebook is the English one with each other markdown cell replaced by its translation; nbgrader's
``generate_assignment`` then releases it as it releases the English one, into
``exercises/<id>/<language>/<id>.ipynb``. Code cells, grade ids, points and tests are those of the English
notebook, so a submission is graded alike in either language (``tests/test_translation.py``).

The book's pages are translated by Sphinx, paragraph by paragraph, from the other catalogues of
``locales/`` (``_ext/build_book.py``); its Chinese exercise pages show the Chinese release notebooks.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import nbformat
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

from attention_course.registry import ASSIGNMENTS, RELEASE_DIRECTORY, SOURCE_DIRECTORY, Assignment

LANGUAGES = ("zh_CN",)
LOCALES = "locales"


class UntranslatedError(ValueError):
    """A catalogue lacks the translation of some cells (missing, empty or fuzzy)."""


def catalogue_path(root: Path, language: str, assignment: Assignment) -> Path:
    """``locales/<language>/LC_MESSAGES/notebooks/<id>.po``."""
    return root / LOCALES / language / "LC_MESSAGES" / "notebooks" / f"{assignment.id}.po"


def release_path(root: Path, language: str, assignment: Assignment) -> Path:
    """``exercises/<id>/<language>/<id>.ipynb``: the release in ``language``."""
    return root / RELEASE_DIRECTORY / assignment.id / language / f"{assignment.id}.ipynb"


def _translated(cell: nbformat.NotebookNode) -> bool:
    """A text cell that learners read: markdown, not empty, not a model answer (a solution cell)."""
    return (
        cell.cell_type == "markdown"
        and bool(cell.source.strip())
        and not cell.metadata.get("nbgrader", {}).get("solution")
    )


def _context(cell: nbformat.NotebookNode, index: int) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id") or f"cell-{index}"


def template(root: Path, assignment: Assignment) -> Catalog:
    """The message template of an assignment: one message per markdown cell of its source notebook."""
    source = assignment.source(root)
    notebook = nbformat.read(source, as_version=4)
    catalogue = Catalog(project=assignment.id, charset="utf-8")
    where = source.relative_to(root).as_posix()
    for index, cell in enumerate(notebook.cells):
        if _translated(cell):
            catalogue.add(cell.source, context=_context(cell, index), locations=[(where, index)])
    return catalogue


def write_templates(root: Path, folder: Path) -> list[Path]:
    """Write ``<id>.pot`` for every assignment into ``folder``; return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for assignment in ASSIGNMENTS.values():
        path = folder / f"{assignment.id}.pot"
        with path.open("wb") as file:
            write_po(file, template(root, assignment), omit_header=False, width=0)
        written.append(path)
    return written


def read_catalogue(path: Path) -> Catalog:
    with path.open("rb") as file:
        return read_po(file)


def translated_source(root: Path, language: str, assignment: Assignment) -> nbformat.NotebookNode:
    """The source notebook with every markdown cell in ``language``.

    Raises:
        UntranslatedError: if a markdown cell has no translation, an empty one or a fuzzy one in the
            catalogue, naming the cells.
        FileNotFoundError: if the catalogue does not exist.
    """
    notebook = nbformat.read(assignment.source(root), as_version=4)
    catalogue = read_catalogue(catalogue_path(root, language, assignment))
    translated = copy.deepcopy(notebook)
    missing = []
    for index, cell in enumerate(translated.cells):
        if not _translated(cell):
            continue
        message = catalogue.get(cell.source, context=_context(cell, index))
        if message is None or not message.string or message.fuzzy:
            missing.append(_context(cell, index))
            continue
        cell.source = message.string
    if missing:
        raise UntranslatedError(
            f"{catalogue_path(root, language, assignment).relative_to(root)} has no finished translation of "
            f"the cells {missing} of {assignment.source(root).relative_to(root)}: run `make locales` and "
            "translate them"
        )
    return translated


def write_translated_sources(root: Path, course: Path, language: str, assignments) -> None:
    """Write the translated source notebooks of ``assignments`` into the nbgrader course ``course``."""
    for assignment in assignments:
        target = course / SOURCE_DIRECTORY / assignment.id / f"{assignment.id}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(translated_source(root, language, assignment), target)


def forget_obsolete(root: Path, language: str) -> None:
    """Drop the obsolete messages (cells that are gone) of every notebook catalogue of ``language``."""
    for path in sorted((root / LOCALES / language / "LC_MESSAGES" / "notebooks").glob("*.po")):
        catalogue = read_catalogue(path)
        if catalogue.obsolete:
            catalogue.obsolete.clear()
            with path.open("wb") as file:
                write_po(file, catalogue, width=0)


def main(argv: list[str] | None = None) -> int:
    """``python -m attention_course.grading.translation LANGUAGE COURSE [ID ...]``: an nbgrader course taught
    in LANGUAGE, in the folder COURSE: the course's ``nbgrader_config.py`` (if COURSE has none) and the
    translated source notebooks (``COURSE/solutions/<id>/<id>.ipynb``), from which ``nbgrader
    generate_assignment`` there releases the notebooks that ``autograde`` then grades."""
    import argparse
    import shutil

    from attention_course.registry import course_root

    parser = argparse.ArgumentParser(prog="python -m attention_course.grading.translation")
    parser.add_argument("language", choices=LANGUAGES)
    parser.add_argument("course", type=Path, help="the nbgrader course folder to write")
    parser.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    arguments = parser.parse_args(argv)
    unknown = [name for name in arguments.assignments if name not in ASSIGNMENTS]
    if unknown:
        parser.error(f"unknown assignment(s) {unknown}; known: {sorted(ASSIGNMENTS)}")
    root = course_root()
    arguments.course.mkdir(parents=True, exist_ok=True)
    if not (arguments.course / "nbgrader_config.py").exists():
        shutil.copy(root / "nbgrader_config.py", arguments.course)
    for name in arguments.assignments or ASSIGNMENTS:
        try:
            write_translated_sources(root, arguments.course, arguments.language, [ASSIGNMENTS[name]])
        except (UntranslatedError, FileNotFoundError) as error:
            print(f"{name}: {error}", file=sys.stderr)
            return 1
        print(f"wrote {arguments.course / SOURCE_DIRECTORY / name / f'{name}.ipynb'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
