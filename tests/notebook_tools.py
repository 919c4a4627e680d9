"""The exercises as the tests need them: test cells, the learner's functions, submissions, verdicts.

Everything about an assignment comes from the registry (:mod:`attention_course.registry`): its test cells
are the behaviours of its checks module, each naming the function it checks. Learner code is compiled as
IPython compiles a cell (its source registered in ``linecache``), then run in one namespace after the
setup cell, as in a notebook.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import linecache
import secrets
import tempfile
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import nbformat
from nbformat import NotebookNode

from attention_course.checks import engine
from attention_course.checks.engine import Behaviour, CheckFailure
from attention_course.grading import seals, split
from attention_course.grading.recorder import Recorder
from attention_course.registry import ASSIGNMENTS, Assignment
from tests.banks import _bank

ROOT = Path(__file__).resolve().parents[1]
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


@dataclass(frozen=True)
class TestCell:
    """One nbgrader test cell of a source notebook, and the behaviour it runs."""

    behaviour: Behaviour
    visible: str  # the code before ### BEGIN HIDDEN TESTS
    hidden: str  # the code between the hidden-test markers

    @property
    def grade_id(self) -> str:
        return self.behaviour.name

    @property
    def function(self) -> str:
        return self.behaviour.function

    @property
    def points(self) -> float:
        return self.behaviour.points

    @property
    def full(self) -> str:
        return f"{self.visible}\n{self.hidden}"


@dataclass(frozen=True)
class Exercise:
    """What the tests need to know of one assignment."""

    assignment: Assignment
    setup: str  # the code of the locked, ungraded code cells
    functions: tuple[str, ...]  # the functions the learner writes, in order
    tests: tuple[TestCell, ...]
    bank: ModuleType
    reference: ModuleType

    @property
    def id(self) -> str:
        return self.assignment.id

    def source_notebook(self) -> NotebookNode:
        return nbformat.read(self.assignment.source(ROOT), as_version=4)

    def release_notebook(self) -> NotebookNode:
        return nbformat.read(self.assignment.release(ROOT), as_version=4)

    def cells_of(self, function: str) -> list[TestCell]:
        return [cell for cell in self.tests if cell.function == function]


def _is(cell: NotebookNode, flag: str) -> bool:
    return bool(cell.metadata.get("nbgrader", {}).get(flag))


def defined_functions(source: str) -> list[str]:
    tree = ast.parse(source)
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)]


def load_exercise(assignment_id: str) -> Exercise:
    """Read the source notebook of ``assignment_id``; its test cells must be the registry's behaviours."""
    assignment = ASSIGNMENTS[assignment_id]
    notebook = nbformat.read(assignment.source(ROOT), as_version=4)
    behaviours = {behaviour.name: behaviour for behaviour in engine.behaviours(assignment)}
    setup, functions, tests = [], [], []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        if _is(cell, "solution"):
            functions += defined_functions(cell.source)
        elif _is(cell, "grade"):
            visible, _, rest = cell.source.partition(HIDDEN_BEGIN)
            behaviour = behaviours[cell.metadata.nbgrader["grade_id"]]
            tests.append(TestCell(behaviour, visible, rest.partition(HIDDEN_END)[0]))
        else:
            setup.append(cell.source)
    return Exercise(
        assignment,
        "\n".join(setup),
        tuple(functions),
        tuple(tests),
        importlib.import_module(assignment.bank),
        importlib.import_module(assignment.reference),
    )


def reference_sources(exercise: Exercise) -> dict[str, str]:
    """The source of each reference function, as a learner could write it in the solution cell."""
    return {
        name: textwrap.dedent(inspect.getsource(getattr(exercise.reference, name)))
        for name in exercise.functions
    }


def _compile_cell(source: str, name: str) -> object:
    """Compile ``source`` as IPython compiles a cell: under a file name whose lines ``linecache`` knows."""
    filename = f"<solution cell {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    return compile(source, filename, "exec")


def notebook_functions(exercise: Exercise, sources: dict[str, str]) -> dict[str, Callable]:
    """Compile the solution cells' ``sources`` in order into one namespace after the setup cell.

    As in the notebook, a function calls the others through that namespace (``self_attention`` calls
    ``cross_attention``, ``scaled_dot_product_attention`` calls ``softmax``), and none of them is the
    reference object itself (a learner who imports that fails every check).
    """
    namespace: dict = {"__name__": "__main__"}
    exec(compile(exercise.setup, "<setup>", "exec"), namespace)
    for name in exercise.functions:
        if name in sources:
            exec(_compile_cell(sources[name], name), namespace)
    return {name: namespace[name] for name in exercise.functions if name in namespace}


def reference_as_learner_code(exercise: Exercise) -> dict[str, Callable]:
    """The reference functions compiled from their source, as in a notebook (see notebook_functions)."""
    return notebook_functions(exercise, reference_sources(exercise))


def _global_names(code: types.CodeType) -> set[str]:
    """The global names that ``code`` and the code nested in it (functions, class bodies, methods) use."""
    nested = (const for const in code.co_consts if isinstance(const, types.CodeType))
    return set(code.co_names).union(*map(_global_names, nested))


def implementation(exercise: Exercise, candidate: _bank.Implementation) -> Callable:
    """A bank implementation compiled as learner code after the setup cell, with the reference (as learner
    code) of the exercise's functions and classes that it uses, as the cells above it define them, and of
    what those use in turn: ``gqa_from_mha`` builds a ``GroupedQueryAttention``, whose ``forward`` calls
    ``repeat_kv``; ``alibi_bias`` calls ``alibi_slopes``."""
    sources = reference_sources(exercise)
    wanted = set(_global_names(compile(candidate.source, "<candidate>", "exec"))) & set(sources)
    needed: dict[str, str] = {}
    while wanted:
        name = wanted.pop()
        if name in needed or name == candidate.function:
            continue
        needed[name] = sources[name]
        wanted |= _global_names(compile(sources[name], f"<{name}>", "exec")) & set(sources)
    return notebook_functions(exercise, {**needed, candidate.function: candidate.source})[candidate.function]


def run_cell(exercise: Exercise, code: str, implementations: dict[str, Callable]) -> None:
    """Execute a test cell's ``code`` after the setup cell, with the learner's functions bound."""
    namespace: dict = {"__name__": "__main__"}
    exec(compile(exercise.setup, "<setup>", "exec"), namespace)
    namespace.update(implementations)
    exec(compile(code, "<test cell>", "exec"), namespace)


def together(exercise: Exercise, code: str, fn: Callable, name: str) -> CheckFailure | None:
    """The failure that a test cell's ``code`` raises in one process, ``fn`` bound to ``name``; or None."""
    try:
        run_cell(exercise, code, {name: fn})
    except CheckFailure as failure:
        return failure
    return None


def split_verdict(plans: split.Plans, cell: TestCell, fn: Callable) -> CheckFailure | None:
    """The verdict on ``cell`` in split mode, in this process: record as a kernel does, judge as the grader.

    Inputs and recordings go through files (JSON and safetensors), sealed, as under ``attention-grade``.
    """
    with tempfile.TemporaryDirectory() as scratch:
        session, key = Path(scratch), secrets.token_bytes(32)
        split.write_inputs(plans, session / "inputs", names={cell.grade_id})
        recorder = Recorder(session, generation=0)
        recorder.run(cell.behaviour, fn, hidden=False)
        recorder.run(cell.behaviour, fn, hidden=True)
        seals.seal(session, 0, key)  # as the worker does when a test cell ends
        return split.judge_cell(plans, cell.grade_id, session, key, cell=0)


def points_by_running(exercise: Exercise, sources: dict[str, str]) -> dict[str, float]:
    """The points of each test cell run in this process after the solution ``sources`` (the oracle).

    A function without a source is the blank stub, as in the release.
    """
    stubs = {
        name: f"def {name}(*args, **kwargs):\n    raise NotImplementedError()\n"
        for name in exercise.functions
    }
    functions = notebook_functions(exercise, {**stubs, **sources})
    points = {}
    for cell in exercise.tests:
        try:
            run_cell(exercise, cell.full, functions)
        except CheckFailure:
            points[cell.grade_id] = 0.0
        else:
            points[cell.grade_id] = cell.points
    return points


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
