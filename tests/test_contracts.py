"""Each exercise's contract as data: every promise of a learner-facing docstring is listed with its checks.

A checks module's ``CONTRACT`` (:func:`attention_course.checks.engine.table`) maps a *clause* to the
behaviours (test cells) that exercise it. Its keys name, for each function or class the learner writes (the
solution cells of the release notebook): each documented argument (``softmax dim``; ``KVCache.append key``
for a method; a class's own ``Args`` under the class's name), each documented error (``softmax raises
IndexError``) and what it returns (``softmax returns``), and any further promise in words. This test fails
when a release docstring documents an argument, an error or a result that no clause lists, or when a clause
names a behaviour that does not exist or checks another function. That a listed behaviour really rejects an
implementation breaking the clause is proven by the bank (``tests/test_checks.py``), where each family of
mistakes has its entry.
"""

from __future__ import annotations

import ast
import importlib
import re

import nbformat
import pytest

from attention_course.checks import engine
from attention_course.registry import ASSIGNMENTS
from tests.notebook_tools import ROOT

SECTION = re.compile(r"^(\s*)(Args|Arguments|Raises|Returns|Yields)[^:\n]*:\s*$")


def sections(docstring: str) -> dict[str, list[str]]:
    """``{"Args": [names], "Raises": [error types], "Returns": [...]}`` of a Google-style docstring."""
    found: dict[str, list[str]] = {}
    lines = docstring.splitlines()
    for number, line in enumerate(lines):
        if not (match := SECTION.match(line)):
            continue
        indent, name = len(match.group(1)), match.group(2).replace("Arguments", "Args")
        entries = found.setdefault(name, [])
        for entry in lines[number + 1 :]:
            if entry.strip() and len(entry) - len(entry.lstrip()) <= indent:
                break  # the section ends where the indentation comes back
            depth = len(entry) - len(entry.lstrip())
            if name != "Returns" and depth == indent + 4 and (head := re.match(r"\s*([\w, *]+):", entry)):
                entries += [part.strip().lstrip("*") for part in head.group(1).split(",")]
    return found


def promises(assignment: str) -> dict[str, set[str]]:
    """``{owner: clauses it must list}`` for the solution cells of ``assignment``'s release notebook."""
    notebook = nbformat.read(ASSIGNMENTS[assignment].release(ROOT), as_version=4)
    found: dict[str, set[str]] = {}

    def add(owner: str, node: ast.AST) -> None:
        documented = sections(ast.get_docstring(node) or "")
        clauses = found.setdefault(owner, set())
        clauses |= {f"{owner} {name}" for name in documented.get("Args", [])}
        clauses |= {f"{owner} raises {error}" for error in documented.get("Raises", [])}
        clauses |= {f"{owner} returns"} if "Returns" in documented else set()

    for cell in notebook.cells:
        if cell.cell_type != "code" or not cell.metadata.get("nbgrader", {}).get("solution"):
            continue
        for node in ast.parse(cell.source).body:
            if isinstance(node, ast.FunctionDef):
                add(node.name, node)
            elif isinstance(node, ast.ClassDef):
                add(node.name, node)
                for method in node.body:
                    if isinstance(method, ast.FunctionDef) and (
                        method.name == "__init__" or method.name[0] != "_"
                    ):
                        add(node.name if method.name == "__init__" else f"{node.name}.{method.name}", method)
    return found


@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_every_documented_promise_is_a_clause_with_its_checks(assignment):
    module = importlib.import_module(ASSIGNMENTS[assignment].checks)
    contract: dict[str, str] = getattr(module, "CONTRACT", {})
    behaviours = {b.name: b.function for b in engine.behaviours(ASSIGNMENTS[assignment])}
    documented = promises(assignment)
    missing = sorted(
        clause for clauses in documented.values() for clause in clauses if clause not in contract
    )
    assert not missing, f"{module.__name__}.CONTRACT lists no checks for: {missing}"
    for clause, listed in contract.items():
        owner = clause.split(" ")[0]
        assert owner in documented, f"clause {clause!r} names {owner}, which the learner does not write"
        names = [name.strip() for name in listed.split(";")[0].split(",")]
        unknown = [name for name in names if name not in behaviours]
        assert names and not unknown, f"clause {clause!r}: {unknown or 'no'} behaviour of {module.__name__}"
        function = owner.split(".")[0]
        wrong = [name for name in names if behaviours[name] != function]
        assert not wrong, f"clause {clause!r}: {wrong} check another function than {function}"


def test_the_docstring_reader_finds_arguments_errors_and_results():
    documented = sections("""Do it.

    Args:
        x: scores, ``[..., n]``.
        dtype, device: of the pool
            (continued: not an argument).

    Returns:
        A tensor.

    Raises:
        ValueError: if ``n < 1``.
        IndexError: if ``dim`` is out of range.
    """)
    assert documented == {
        "Args": ["x", "dtype", "device"],
        "Returns": [],
        "Raises": ["ValueError", "IndexError"],
    }
