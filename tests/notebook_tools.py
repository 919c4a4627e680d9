"""Reading the exercise notebooks the way the tests need them: test cells, solution cells, submissions."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import nbformat
from nbformat import NotebookNode

from attention_course.grading.assignments import ASSIGNMENTS

ROOT = Path(__file__).resolve().parents[1]
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


@dataclass(frozen=True)
class TestCell:
    """One nbgrader test cell of a source notebook."""

    grade_id: str
    points: float
    visible: str  # the code before ### BEGIN HIDDEN TESTS
    hidden: str  # the code between the hidden-test markers
    function: str  # the learner's function it checks

    @property
    def full(self) -> str:
        return f"{self.visible}\n{self.hidden}"


@dataclass(frozen=True)
class Exercise:
    """What the tests need to know of one assignment."""

    id: str
    setup: str  # the code of the locked, ungraded code cells
    functions: tuple[str, ...]  # the functions the learner writes, in order
    tests: tuple[TestCell, ...]
    bank: ModuleType  # tests/banks/<exNN>.py: WRONG and RIGHT implementations
    reference: ModuleType

    def source_notebook(self) -> NotebookNode:
        return nbformat.read(ASSIGNMENTS[self.id].source(ROOT), as_version=4)

    def release_notebook(self) -> NotebookNode:
        return nbformat.read(ASSIGNMENTS[self.id].release(ROOT), as_version=4)


def _is(cell: NotebookNode, flag: str) -> bool:
    return bool(cell.metadata.get("nbgrader", {}).get(flag))


def defined_functions(source: str) -> list[str]:
    return [node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)]


def load_exercise(assignment_id: str) -> Exercise:
    """Parse the source notebook of ``assignment_id`` and load its bank of implementations."""
    notebook = nbformat.read(ASSIGNMENTS[assignment_id].source(ROOT), as_version=4)
    setup, functions, tests = [], [], []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        if _is(cell, "solution"):
            functions += defined_functions(cell.source)
        elif _is(cell, "grade"):
            visible, _, rest = cell.source.partition(HIDDEN_BEGIN)
            hidden = rest.partition(HIDDEN_END)[0]
            used = {node.id for node in ast.walk(ast.parse(cell.source)) if isinstance(node, ast.Name)}
            (function,) = [name for name in functions if name in used]
            points = float(cell.metadata.nbgrader["points"])
            tests.append(TestCell(cell.metadata.nbgrader["grade_id"], points, visible, hidden, function))
        else:
            setup.append(cell.source)
    short = assignment_id.split("_")[0]
    return Exercise(
        assignment_id,
        "\n".join(setup),
        tuple(functions),
        tuple(tests),
        importlib.import_module(f"tests.banks.{short}"),
        importlib.import_module(ASSIGNMENTS[assignment_id].reference_module),
    )


def reference_sources(exercise: Exercise) -> dict[str, str]:
    """The source of each reference function, as a learner could write it in the solution cell."""
    return {
        name: textwrap.dedent(inspect.getsource(getattr(exercise.reference, name)))
        for name in exercise.functions
    }


def notebook_functions(exercise: Exercise, sources: dict[str, str]) -> dict[str, Callable]:
    """Compile the solution cells' ``sources`` in order into one namespace after the setup cell.

    As in the notebook, a function calls the others through that namespace (``self_attention`` calls
    ``cross_attention``, ``scaled_dot_product_attention`` calls ``softmax``), and none of them is the
    reference object itself (a learner who imports that fails every check).
    """
    namespace: dict = {"__name__": "__main__"}
    exec(compile(exercise.setup, "<setup>", "exec"), namespace)
    for name in exercise.functions:
        exec(compile(sources[name], f"<solution cell {name}>", "exec"), namespace)
    return {name: namespace[name] for name in exercise.functions}


def reference_as_learner_code(exercise: Exercise) -> dict[str, Callable]:
    """The reference functions compiled from their source, as in a notebook (see notebook_functions)."""
    return notebook_functions(exercise, reference_sources(exercise))


def run_cell(exercise: Exercise, code: str, implementations: dict[str, Callable]) -> None:
    """Execute a test cell's ``code`` after the setup cell, with the learner's functions bound."""
    namespace: dict = {"__name__": "__main__"}
    exec(compile(exercise.setup, "<setup>", "exec"), namespace)
    namespace.update(implementations)
    exec(compile(code, "<test cell>", "exec"), namespace)


def function_of(implementation: Callable) -> str:
    """The exercise function a bank implementation stands for: the part of its name before ``__``."""
    return implementation.__name__.split("__")[0]


def submission_source(implementation: Callable) -> str:
    """The source of a bank implementation, renamed to the exercise's function, for a notebook cell."""
    source = textwrap.dedent(inspect.getsource(implementation))
    return source.replace(f"def {implementation.__name__}(", f"def {function_of(implementation)}(", 1)


def fill_solutions(notebook: NotebookNode, sources: dict[str, str]) -> NotebookNode:
    """A copy of a release notebook whose solution cells defining ``sources``' names hold those sources."""
    filled = nbformat.from_dict(notebook)
    for cell in filled.cells:
        if cell.cell_type == "code" and _is(cell, "solution") and not _is(cell, "grade"):
            names = defined_functions(cell.source)
            if names and names[0] in sources:
                cell.source = sources[names[0]]
    return filled


def blank_stub(name: str) -> Callable:
    """What a learner starts from: a function that raises NotImplementedError."""

    def stub(*args, **kwargs):
        raise NotImplementedError()

    stub.__name__ = name
    return stub
