"""Releasing the exercises: one source of truth for solutions and tests, then nbgrader's generate_assignment.

The functions a learner writes exist once, in the reference modules (``solutions/*.py``, which may
re-export the library's). The solution cells of a source notebook are *generated* from them: the
function's signature and docstring, then its body between ``### BEGIN SOLUTION`` and ``### END
SOLUTION``. nbgrader then replaces each solution region with a stub in the student release. The test cells
are generated too, from the behaviours of the assignment's checks module: a description line with the
points, the visible part's line, and the hidden part's line between nbgrader's hidden-test markers.

The cells themselves follow the checks module too: a behaviour without a test cell gets one (after the
cells of the behaviour before it, or its function's solution cell), a function without a solution cell gets
one and a text cell for its task (placeholder text, to write), and a generated cell whose function or
behaviour is gone is removed. Nothing else of a notebook is touched: its text, set-up and written answers.

Each release exists in every language of ``translation.LANGUAGES`` too, as
``exercises/<id>/<language>/<id>.ipynb``: the source notebook with its markdown translated from
``locales/`` (``translation.py``), released by the same nbgrader command. A release whose catalogue lacks a
translation is left as it was, with a note.

``attention-release`` (``make release``) syncs the source notebooks and regenerates every release;
``attention-release ID ...`` (``make release ASSIGNMENT=ID``) only those; ``attention-release --check``
changes nothing and fails when a source notebook or a committed release is stale (the test suite runs it).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat

from attention_course.checks import engine
from attention_course.grading import translation
from attention_course.registry import ASSIGNMENTS, SOURCE_DIRECTORY, Assignment, course_root

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


def _docstring_end(definition: ast.FunctionDef | ast.ClassDef) -> int | None:
    """The 1-based line where the docstring of ``definition`` ends, or None if it has none."""
    first = definition.body[0] if definition.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first.end_lineno
    return None


def render_solution(function: object) -> str:
    """The source of a solution cell for ``function``: signature and docstring, then the marked body.

    A class keeps its header, its docstring and each public method's signature and docstring; each such
    method's body is a solution region (the release's stub of ``__init__`` raises ``NotImplementedError``, so
    that the blank class fails as a blank function does). The class's private members (``_name``: helper
    methods, a cache's attribute), which come after its public methods, are part of the last public method's
    region: how the reference is organised is a solution too, and the release does not show it.

    Raises:
        ValueError: if ``function`` (or a class) has no docstring (the learner's task is stated there), or a
            class has a private member before one of its public methods.
    """
    source = textwrap.dedent(inspect.getsource(function))  # type: ignore[arg-type]
    definition = ast.parse(source).body[0]
    if not isinstance(definition, ast.FunctionDef | ast.ClassDef) or _docstring_end(definition) is None:
        raise ValueError(f"{function!r} needs a docstring: it is the learner's statement of the task")
    lines = source.rstrip().splitlines()
    if isinstance(definition, ast.FunctionDef):
        methods, last = [definition], None
    else:
        members = definition.body[1:]  # after the docstring
        methods = [node for node in members if isinstance(node, ast.FunctionDef) and not _private(node)]
        if not methods:
            raise ValueError(f"{function!r} has no public method for the learner to write")
        misplaced = [node for node in members if _private(node) and node.lineno < methods[-1].lineno]
        if misplaced:
            raise ValueError(
                f"{function!r}: the private members {[_name(node) for node in misplaced]} come before the "
                f"public method {methods[-1].name!r}; put them after it, where the release leaves them out"
            )
        last = definition.end_lineno
    for method in reversed(methods):
        start = _docstring_end(method) or method.body[0].lineno - 1  # lines[:start] stay
        indent = " " * method.body[0].col_offset
        end, closing = method.end_lineno or start, indent
        if method is methods[-1] and isinstance(definition, ast.ClassDef):
            end, final = last or end, definition.body[-1]
            # the END marker where a comment after the class's last member sits (ruff's format)
            closing = " " * (final.body[0] if isinstance(final, ast.FunctionDef) else final).col_offset
        lines[start:end] = [f"{indent}{BEGIN}", *lines[start:end], f"{closing}{END}"]
    return "\n".join(lines)


def _name(node: ast.stmt) -> str:
    """The name a class member defines: a method's, or an attribute's (``name = ...``, ``name: T = ...``)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name
    target = node.target if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [None])[0]
    return target.id if isinstance(target, ast.Name) else ""


def _private(node: ast.stmt) -> bool:
    """Whether a class member is private (``_name``, not ``__dunder__``)."""
    name = _name(node)
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def render_test_cell(behaviour: Any) -> str:
    """The source of the test cell of ``behaviour``: its description and points, one line per part."""
    points = f"{behaviour.points:g} point{'' if behaviour.points == 1 else 's'}"
    return "\n".join(
        [
            textwrap.fill(f'"""{behaviour.description} ({points})"""', width=110),  # ruff's line length
            "",
            f"checks.{behaviour.name}({behaviour.function})",
            HIDDEN_BEGIN,
            f"checks.{behaviour.name}.hidden({behaviour.function})",
            HIDDEN_END,
        ]
    )


# the text of a new task cell (and of the scaffold's introduction): the release warns about it until an
# author has replaced it
PLACEHOLDER = "Replace this text"


def task_text(function: str) -> str:
    """The placeholder text of the task cell of ``function`` (a markdown cell ``task_<function>``)."""
    return (
        f"## `{function}`\n\n{PLACEHOLDER} with the task: what `{function}` is for, the chapter that "
        "explains it, and what the test cells check (with their points). The cell below is generated from "
        "the reference's signature and docstring."
    )


def new_cell(kind: str, grade_id: str, source: str = "", points: float = 0) -> nbformat.NotebookNode:
    """A cell of a source notebook with the metadata nbgrader and the course give it, by ``kind``:

    - ``"text"``: a markdown cell, locked (read-only, not deletable), not graded;
    - ``"setup"``: a code cell likewise locked and not graded (the install cell, the imports);
    - ``"solution"``: the code cell a learner writes (``solution``), its source generated from the reference;
    - ``"test"``: an autograded test cell (``grade``, locked, ``points``), its source generated from the
      behaviour ``grade_id``.

    Its id is ``grade_id`` with hyphens (``sliding-window-mask-values``), as in the course's notebooks.
    """
    nbgrader = {
        "grade": kind == "test",
        "grade_id": grade_id,
        "locked": kind != "solution",
        "schema_version": 3,
        "solution": kind == "solution",
        "task": False,
    }
    if kind == "test":
        nbgrader["points"] = points
    metadata: dict[str, Any] = {"nbgrader": nbgrader}
    if kind != "solution":
        metadata |= {"deletable": False, "editable": False}
    make = nbformat.v4.new_markdown_cell if kind == "text" else nbformat.v4.new_code_cell
    return make(source, metadata=metadata, id=grade_id.replace("_", "-")[:64])


def _grade_id(cell: nbformat.NotebookNode) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id") or ""


def _kind(cell: nbformat.NotebookNode) -> str:
    """``"solution"``: a code cell the learner writes; ``"test"``: an autograded code cell; else ``""``."""
    metadata = cell.metadata.get("nbgrader", {})
    if cell.cell_type != "code" or bool(metadata.get("solution")) == bool(metadata.get("grade")):
        return ""
    return "solution" if metadata.get("solution") else "test"


def _restructure(notebook: nbformat.NotebookNode, behaviours: Sequence[Any]) -> list[str]:
    """Give ``notebook`` a test cell per behaviour and a solution cell per function the behaviours check.

    Removes the generated cells of functions and behaviours that are gone (and a task cell that still holds
    :func:`task_text`), then adds the missing ones where they belong, their sources placeholders that
    :func:`synced_notebook` generates. Returns what it did: ``"name (new cell)"``, ``"name (cell removed)"``.
    """
    functions = list(dict.fromkeys(behaviour.function for behaviour in behaviours))
    function_of = {behaviour.name: behaviour.function for behaviour in behaviours}

    def about(cell: nbformat.NotebookNode) -> str | None:
        """The function that a solution, test or task cell is about (None for other cells)."""
        kind, grade_id = _kind(cell), _grade_id(cell)
        if kind == "solution":
            return _defined_function(cell.source)
        if kind == "test":
            return function_of.get(grade_id, "")
        if cell.cell_type == "markdown" and grade_id.startswith("task_"):
            return grade_id.removeprefix("task_")
        return None

    def gone(cell: nbformat.NotebookNode) -> bool:
        function, kind = about(cell), _kind(cell)
        if kind == "test":
            return _grade_id(cell) not in function_of
        if kind == "solution":
            return function is not None and function not in functions
        return function is not None and function not in functions and cell.source == task_text(function)

    changes = [f"{_grade_id(cell)} (cell removed)" for cell in notebook.cells if gone(cell)]
    cells = [cell for cell in notebook.cells if not gone(cell)]

    def where(function: str) -> list[int]:
        return [index for index, cell in enumerate(cells) if about(cell) == function]

    for position, function in enumerate(functions):
        if any(_kind(cell) == "solution" and about(cell) == function for cell in cells):
            continue
        # after the cells of the function before it; else before those of the function after it; else last
        earlier = [where(f)[-1] + 1 for f in functions[:position] if where(f)]
        later = [where(f)[0] for f in functions[position + 1 :] if where(f)]
        index = earlier[-1] if earlier else later[0] if later else len(cells)
        new = [new_cell("solution", function, f"def {function}(): ...")]
        if not any(_grade_id(cell) == f"task_{function}" for cell in cells):
            new.insert(0, new_cell("text", f"task_{function}", task_text(function)))
        cells[index:index] = new
        changes.append(f"{function} (new cell)")
    for position, behaviour in enumerate(behaviours):
        if any(_kind(cell) == "test" and _grade_id(cell) == behaviour.name for cell in cells):
            continue
        # after the test cell of the behaviour before it, of the same function; else after the solution cell
        earlier = {b.name for b in behaviours[:position] if b.function == behaviour.function}
        index = max(
            index
            for index, cell in enumerate(cells)
            if (_kind(cell) == "test" and _grade_id(cell) in earlier)
            or (_kind(cell) == "solution" and about(cell) == behaviour.function)
        )
        cells.insert(index + 1, new_cell("test", behaviour.name, points=behaviour.points))
        changes.append(f"{behaviour.name} (new cell)")
    notebook.cells = cells
    return changes


def _defined_function(cell_source: str) -> str | None:
    try:
        tree = ast.parse(cell_source)
    except SyntaxError:
        return None
    names = [node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)]
    return names[0] if len(names) == 1 else None


def synced_notebook(
    assignment: Assignment, root: Path, notebook: nbformat.NotebookNode | None = None
) -> tuple[nbformat.NotebookNode, list[str]]:
    """The source notebook (or ``notebook``) with its solution and test cells regenerated from the reference
    and the checks: a cell for each behaviour and each function it checks, none for others (see the module).

    Returns:
        The notebook and the names of the functions and behaviours whose cells changed, were added
        (``"name (new cell)"``) or removed (``"name (cell removed)"``).

    Raises:
        ValueError: if a solution code cell does not define exactly one function of the reference module,
            or the test cells are not in the order of the behaviours of the checks module.
    """
    module = importlib.import_module(assignment.reference)
    if notebook is None:
        notebook = nbformat.read(assignment.source(root), as_version=4)
    behaviours = list(engine.behaviours(assignment))
    changed = _restructure(notebook, behaviours)
    tests = [
        cell
        for cell in notebook.cells
        if cell.cell_type == "code"
        and cell.metadata.get("nbgrader", {}).get("grade")
        and not cell.metadata.nbgrader.get("solution")
    ]
    ids = [cell.metadata.nbgrader.get("grade_id") for cell in tests]
    if ids != [behaviour.name for behaviour in behaviours]:
        raise ValueError(
            f"the test cells of {assignment.id} are {ids}, but {assignment.checks} defines the behaviours "
            f"{[behaviour.name for behaviour in behaviours]}: put the cells or the behaviours in one order"
        )
    for cell, behaviour in zip(tests, behaviours, strict=True):
        rendered = render_test_cell(behaviour)
        if cell.source != rendered or cell.metadata.nbgrader.get("points") != behaviour.points:
            cell.source, cell.metadata.nbgrader["points"] = rendered, behaviour.points
            if f"{behaviour.name} (new cell)" not in changed:
                changed.append(behaviour.name)
    for cell in notebook.cells:
        metadata = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not metadata.get("solution") or metadata.get("grade"):
            continue
        name = _defined_function(cell.source)
        if name is None or not hasattr(module, name):
            raise ValueError(
                f"solution cell {metadata.get('grade_id')!r} of {assignment.id} must define exactly one "
                f"function or class of {assignment.reference}"
                + (f" (it defines {name}, which {assignment.reference} lacks)" if name else "")
            )
        rendered = render_solution(getattr(module, name))
        if cell.source != rendered:
            cell.source = rendered
            if f"{name} (new cell)" not in changed:
                changed.append(name)
    return notebook, changed


def generate(assignments: Sequence[Assignment], root: Path, *, database: bool = True) -> None:
    """Run nbgrader's ``generate_assignment --force`` for ``assignments`` in the course directory ``root``.

    nbgrader takes one assignment id per command, but the id may be a glob: when ``assignments`` are all
    the source notebooks ``root`` holds, one command (id ``*``) releases them all, which saves nbgrader's
    start-up (several seconds) for each of the others; otherwise one command per assignment.

    Raises:
        RuntimeError: if nbgrader fails, with its output.
    """
    present = {path.parent.name for path in (root / SOURCE_DIRECTORY).glob("*/*.ipynb")}
    ids = [assignment.id for assignment in assignments]
    # nbgrader runs `alembic` to create its database: find it beside this Python, venv or not
    environment = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    for assignment_id in ["*"] if ids and set(ids) == present else ids:
        command = [sys.executable, "-m", "nbgrader", "generate_assignment", assignment_id, "--force"]
        if not database:
            command.append("--no-db")
        result = subprocess.run(
            command, cwd=root, env=environment, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"nbgrader generate_assignment {assignment_id} failed:\n{result.stdout}{result.stderr}"
            )


def generate_translations(
    assignments: Sequence[Assignment], root: Path, into: Path | None = None
) -> list[str]:
    """Release ``assignments`` in every translated language, from their translated source notebooks, into
    ``into`` (default ``root``) at ``translation.release_path``.

    Returns:
        A note for each release left as it was because its catalogue lacks a translation.
    """
    into = root if into is None else into
    notes = []
    for language in translation.LANGUAGES:
        with tempfile.TemporaryDirectory() as scratch:
            course = Path(scratch)
            shutil.copy(root / "nbgrader_config.py", course)
            ready = []
            for assignment in assignments:
                try:
                    translation.write_translated_sources(root, course, language, [assignment])
                except (translation.UntranslatedError, FileNotFoundError) as error:
                    notes.append(f"{assignment.id} ({language}) is not released: {error}")
                else:
                    ready.append(assignment)
            if ready:
                generate(ready, course, database=False)
            for assignment in ready:
                target = translation.release_path(into, language, assignment)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(assignment.release(course), target)
    return notes


def stale_releases(assignments: Sequence[Assignment], root: Path) -> list[str]:
    """Regenerate the releases (every language) in a temporary course directory and list those that differ
    from ``root``'s: an assignment's id, or ``"<id> (<language>)"``."""
    with tempfile.TemporaryDirectory() as scratch:
        scratch_root = Path(scratch)
        shutil.copy(root / "nbgrader_config.py", scratch_root)
        for assignment in assignments:
            assignment.source(scratch_root).parent.mkdir(parents=True)
            shutil.copy(assignment.source(root), assignment.source(scratch_root))
        generate(assignments, scratch_root, database=False)
        untranslated = generate_translations(assignments, root, into=scratch_root)
        stale = []
        for assignment in assignments:
            releases = [(assignment.id, assignment.release(scratch_root), assignment.release(root))] + [
                (
                    f"{assignment.id} ({language})",
                    translation.release_path(scratch_root, language, assignment),
                    translation.release_path(root, language, assignment),
                )
                for language in translation.LANGUAGES
            ]
            for name, fresh_path, committed_path in releases:
                fresh = json.loads(fresh_path.read_text()) if fresh_path.exists() else None
                committed = json.loads(committed_path.read_text()) if committed_path.exists() else None
                if fresh is None or fresh != committed:
                    stale.append(name)
    for note in untranslated:
        print(note, file=sys.stderr)
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``attention-release [--check] [ASSIGNMENT ...]``."""
    parser = argparse.ArgumentParser(prog="attention-release", description=__doc__.split("\n\n")[0])
    parser.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a source notebook or release is stale"
    )
    arguments = parser.parse_args(argv)
    root = course_root()
    unknown = [name for name in arguments.assignments if name not in ASSIGNMENTS]
    if unknown:
        parser.error(f"unknown assignment(s) {unknown}; known: {sorted(ASSIGNMENTS)}")
    chosen = [ASSIGNMENTS[name] for name in arguments.assignments or ASSIGNMENTS]
    problems = []
    for assignment in chosen:
        notebook, changed = synced_notebook(assignment, root)
        if changed and arguments.check:
            problems.append(
                f"{assignment.source(root)}: cells differ from the reference and checks: {changed}"
            )
        elif changed:
            nbformat.write(notebook, assignment.source(root))
            print(f"synced {', '.join(changed)} into {assignment.source(root).relative_to(root)}")
        placeholders = [_grade_id(cell) for cell in notebook.cells if PLACEHOLDER in cell.source]
        if placeholders:
            print(
                f"note: the cells {placeholders} of {assignment.source(root).relative_to(root)} still hold "
                "placeholder text: write it before the exercise is published",
                file=sys.stderr,
            )
    if arguments.check:
        problems += [
            f"the release of {name} is stale: run `make release`" for name in stale_releases(chosen, root)
        ]
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    generate(chosen, root)
    notes = generate_translations(chosen, root)
    for assignment in chosen:
        print(f"released {assignment.release(root).relative_to(root)}")
        for language in translation.LANGUAGES:
            if not any(note.startswith(f"{assignment.id} ({language})") for note in notes):
                print(f"released {translation.release_path(root, language, assignment).relative_to(root)}")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
