"""The student releases: generated from the references, current, and free of answers."""

from __future__ import annotations

import ast
import inspect
import json

import pytest

from attention_course.grading.release import BEGIN, END, render_solution, stale_releases, synced_notebook
from attention_course.registry import ASSIGNMENTS
from tests.notebook_tools import HIDDEN_BEGIN, ROOT, load_exercise

PRESENT = [name for name, assignment in sorted(ASSIGNMENTS.items()) if assignment.source(ROOT).exists()]


@pytest.mark.parametrize("assignment", PRESENT)
def test_solution_cells_are_the_reference(assignment):
    """One source of truth: every solution cell is generated from the reference (make release)."""
    _, changed = synced_notebook(ASSIGNMENTS[assignment], ROOT)
    assert changed == [], f"solution cells of {assignment} differ from the reference: run `make release`"


@pytest.mark.slow
# on the worker that builds the book: in `make test` the other worker has more to do
@pytest.mark.xdist_group("book")
def test_committed_releases_are_current():
    """Regenerating every release with nbgrader in a scratch course gives the committed notebooks."""
    assert stale_releases([ASSIGNMENTS[name] for name in PRESENT], ROOT) == []


def _body_lines(function) -> list[str]:
    rendered = render_solution(function)
    body = rendered.split(BEGIN, 1)[1].split(END, 1)[0]
    lines = [line.split("#")[0].strip() for line in body.splitlines()]
    return [line for line in lines if len(line) > 12]  # skip trivial lines such as "return x"


def _without_docstrings(source: str) -> str:
    """``source`` without its docstrings, which may quote a condition of the body (``temperature < 0``)."""
    tree = ast.parse(source)
    docstrings = [
        node.body[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    ]
    lines = source.splitlines()
    for docstring in docstrings:
        lines[docstring.lineno - 1 : docstring.end_lineno] = [""] * (
            docstring.end_lineno - docstring.lineno + 1
        )
    return "\n".join(lines)


@pytest.mark.parametrize("assignment", PRESENT)
def test_release_holds_no_solution_and_no_hidden_test(assignment):
    exercise = load_exercise(assignment)
    release = exercise.release_notebook()
    text = json.dumps(release.cells)
    for marker in (BEGIN, END, HIDDEN_BEGIN, "from solutions", "import solutions"):
        assert marker not in text
    code = "\n".join(cell.source for cell in release.cells if cell.cell_type == "code")
    statements = "\n".join(_without_docstrings(c.source) for c in release.cells if c.cell_type == "code")
    for name in exercise.functions:
        for line in _body_lines(getattr(exercise.reference, name)):
            # in a docstring only where the reference's own docstring says it (a condition it documents)
            quoted = line not in statements and line in (
                inspect.getdoc(getattr(exercise.reference, name)) or ""
            )
            assert line not in code or quoted, f"solution line of {name} in the release: {line!r}"
    for cell in exercise.tests:
        for line in (line.strip() for line in cell.hidden.splitlines()):
            assert len(line) <= 12 or line not in code, (
                f"hidden test line of {cell.grade_id} in the release: {line!r}"
            )
    for cell in release.cells:
        nbgrader = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None
            if nbgrader.get("solution"):
                assert "raise NotImplementedError()" in cell.source
        elif nbgrader.get("solution"):  # a written answer: the model answer is gone
            assert cell.source.strip() == "YOUR ANSWER HERE"


@pytest.mark.parametrize("assignment", PRESENT)
def test_source_notebook_has_no_outputs(assignment):
    notebook = load_exercise(assignment).source_notebook()
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")


def test_render_solution_needs_a_docstring():
    def undocumented(x):
        return x

    with pytest.raises(ValueError, match="docstring"):
        render_solution(undocumented)


def test_render_solution_marks_the_body_after_the_docstring():
    def documented(x):
        """Double x."""
        return 2 * x

    rendered = render_solution(documented)
    assert rendered.splitlines() == [
        "def documented(x):",
        '    """Double x."""',
        f"    {BEGIN}",
        "    return 2 * x",
        f"    {END}",
    ]


@pytest.mark.parametrize("assignment", PRESENT)
def test_release_shows_only_the_public_members_of_a_class(assignment):
    """A class's helper methods and private attributes are how the reference is organised: the release
    shows the public methods' signatures and docstrings only."""
    release = load_exercise(assignment).release_notebook()
    for cell in release.cells:
        if cell.cell_type != "code" or not cell.metadata.get("nbgrader", {}).get("solution"):
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.ClassDef):
                names = [
                    member.name if isinstance(member, ast.FunctionDef) else ast.unparse(member)
                    for member in node.body[1:]
                ]
                private = [n for n in names if n.startswith("_") and not n.endswith("__")]
                assert not private, f"{node.name} shows {private}"


def test_render_solution_leaves_private_members_in_the_last_region():
    class Cache:
        """A cache."""

        def get(self, key):
            """The value of ``key``."""
            return self._store()[key]

        def _store(self):
            return {}

        _size: int = 0

    lines = render_solution(Cache).splitlines()
    assert lines[-1] == f"    {END}"  # the region runs to the class's end, ending at its members' indent
    assert lines.index(f"        {BEGIN}") < lines.index("    def _store(self):")

    class Misplaced:
        """A helper before the public method."""

        def _helper(self):
            return 1

        def value(self):
            """One."""
            return self._helper()

    with pytest.raises(ValueError, match="_helper"):
        render_solution(Misplaced)
