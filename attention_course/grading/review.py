"""What the grader cannot see from inside the kernel: lines of a submission that make its recorded calls
untrustworthy, found by reading the code (a static analysis), for an instructor to review.

In split mode the grader judges *values* outside the learner's process, but *which functions a learner's
function called* (the "from scratch" cells) is observed inside it, by a profiler the learner's process
hosts. Code in that process can fool the observation: a thread or an IPython hook that rewrites the test
cells' recordings before the grader seals them, an assignment to the recorder's functions, a profiler
replaced, or a built-in called from C (``map(torch.softmax, xs)``: ``sys.setprofile`` reports a C function
only when bytecode calls it). None of this can be made sound in a process the learner controls. So the
grader reads the code too, and a submission with any of these lines loses its "from scratch" points and is
listed as *needs review*, with the lines, for an instructor to decide.

:func:`review` reads the code cells a learner wrote (solution cells and added cells; not test cells or locked
cells, which the grader restores from the assignment) and reports:

- dynamic code and lookups by name: ``exec``, ``eval``, ``compile``, ``globals``, ``vars``, ``__import__``
  of a name computed at run time (of a literal name, it is judged as an import),
  ``locals``, ``__builtins__``, ``breakpoint``; attributes that reach objects without naming them
  (``__globals__``, ``__subclasses__``, ``__dict__``, frames' ``f_back`` and ``f_globals``, ...);
  ``getattr``, ``setattr``, ``delattr`` and ``hasattr`` with a name computed at run time (with a string
  literal they are an attribute's access, which the analysis reads), ``setattr`` on an imported module;
- modules that run code elsewhere or reach into the interpreter or the grader: ``threading``, ``_thread``,
  ``concurrent``, ``multiprocessing``, ``asyncio``, ``signal``, ``ctypes``, ``importlib``, ``builtins``,
  ``gc``, ``inspect``, ``atexit``, ``weakref``, ``IPython``, ``sys.setprofile``/``settrace``/``modules``/
  ``_getframe``, and the course's own ``attention_course.grading`` and ``attention_course.checks``;
- IPython's event hooks (``get_ipython``, ``events.register``, ``post_run_cell``, ...);
- a finaliser (a method ``__del__``): the garbage collector runs it whenever an allocation passes its
  threshold, and the recorder leaves out what the collector runs (finalisers of objects that earlier code
  left behind are not the learner's calls);
- assignments to an attribute of an imported module or name (``recorder.execute = ...``, ``torch.exp = ...``);
- a built-in (a C function) passed as a value rather than called, whose name a "from scratch" rule of the
  course forbids (``map(torch.softmax, ...)``, ``functools.partial(F.scaled_dot_product_attention)``);
- a PyTorch operator's C function called directly (``torch.ops.aten._softmax.default._op(...)``): the
  profiler names an operator by the overload that calls it, and this call has none.

It never runs the code. It can miss what it cannot read (code built from strings at run time is itself a
finding, through ``exec`` or ``getattr``) and can flag honest code that uses these tools; hence "needs
review", not a verdict.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import types
from dataclasses import dataclass
from typing import Any

from nbformat import NotebookNode

from attention_course.grading.notebooks import clean_text

DYNAMIC = {"exec", "eval", "compile", "__import__", "globals", "vars", "locals", "__builtins__", "breakpoint"}
#: attributes that reach objects without naming them: globals, frames, code, every subclass of object
INTROSPECTION = {
    "__globals__",
    "__builtins__",
    "__subclasses__",
    "__code__",
    "__closure__",
    "__dict__",
    "__getattribute__",
    "__setattr__",
    "__import__",
    "__loader__",
    "__spec__",
    "__self__",
    "__func__",
    "f_back",
    "f_globals",
    "f_locals",
    "f_builtins",
    "gi_frame",
    "cr_frame",
    "tb_frame",
}
ATTRIBUTE_FUNCTIONS = {"getattr", "setattr", "delattr", "hasattr"}
MODULES = {
    "threading": "runs code in another thread, which the recorder does not watch",
    "_thread": "runs code in another thread, which the recorder does not watch",
    "concurrent": "runs code in another thread or process, which the recorder does not watch",
    "multiprocessing": "runs code in another process, which the recorder does not watch",
    "asyncio": "runs code outside the call being recorded",
    "signal": "runs code when a signal arrives, outside the call being recorded",
    "ctypes": "reaches into the interpreter's memory",
    "importlib": "imports modules by name at run time",
    "builtins": "can replace Python's built-in functions",
    "gc": "can reach every object of the kernel, the recorder's included",
    "inspect": "can reach the frames and code of the recorder",
    "atexit": "runs code outside the call being recorded",
    "weakref": "runs code when an object is freed, which the recorder does not watch",
    "IPython": "can hook IPython's cell execution, around the test cells",
    "attention_course.grading": "imports the grader's own recorder",
    "attention_course.checks": "imports the course's checks",
}
SYS_ATTRIBUTES = {"setprofile", "settrace", "modules", "_getframe", "setrecursionlimit", "addaudithook"}
HOOKS = {
    "get_ipython",
    "register",
    "register_post_execute",
    "post_run_cell",
    "pre_run_cell",
    "post_execute",
    "pre_execute",
}
#: what a notebook's setup cell imports under these names (the release's locked cells)
KNOWN_NAMES = {"torch": "torch", "F": "torch.nn.functional", "nn": "torch.nn", "np": "numpy", "math": "math"}
C_FUNCTIONS = (
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.ClassMethodDescriptorType,
)


@dataclass(frozen=True)
class Finding:
    """One line that needs review: the code cell's index in the notebook, the line (1-based), its text and
    why it matters."""

    cell: int
    line: int
    text: str
    reason: str

    def __str__(self) -> str:
        return f"cell {self.cell + 1}, line {self.line}: {self.text}  ({self.reason})"


@functools.cache
def forbidden_words() -> tuple[str, ...]:
    """Every word a "from scratch" rule of the course's checks forbids in a function's name."""
    from attention_course.checks.attention_family import ATTENTION_BUILTINS
    from attention_course.checks.engine import FromScratch
    from attention_course.registry import ASSIGNMENTS

    words = set(ATTENTION_BUILTINS)
    for assignment in ASSIGNMENTS.values():
        module = importlib.import_module(assignment.checks)
        for value in vars(module).values():
            if isinstance(value, FromScratch):
                words.update(value.words)
    return tuple(sorted(words))


def _learner_cells(notebook: NotebookNode) -> list[tuple[int, str]]:
    """``(index, source)`` of the code cells a learner wrote: not test cells, not locked cells."""
    cells = []
    for index, cell in enumerate(notebook.cells):
        nbgrader = cell.metadata.get("nbgrader", {})
        if (
            cell.cell_type != "code"
            or nbgrader.get("locked")
            or (nbgrader.get("grade") and not nbgrader.get("solution"))
        ):
            continue
        cells.append((index, cell.source))
    return cells


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _resolve(dotted: str, aliases: dict[str, str]) -> Any:
    """The object ``dotted`` names, through the imports ``aliases``; None where it is not a module's."""
    root, *rest = dotted.split(".")
    if root not in aliases:
        return None
    try:
        value: Any = importlib.import_module(aliases[root])
    except ImportError:
        module, _, name = aliases[root].rpartition(".")
        try:
            value = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            return None
    for name in rest:
        try:
            value = inspect.getattr_static(value, name)
        except AttributeError:
            return None
    return value


def _module_reason(name: str) -> str | None:
    for module, reason in MODULES.items():
        if name == module or name.startswith(module + "."):
            return reason
    return None


def review(notebook: NotebookNode) -> list[Finding]:
    """The lines of the learner's code cells of ``notebook`` that need review (see the module's docstring),
    in the notebook's order. A cell that does not parse is left out: it defines nothing the checks call."""
    aliases = dict(KNOWN_NAMES)
    parsed = []
    for index, source in _learner_cells(notebook):
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        parsed.append((index, source, tree))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    aliases[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    words = forbidden_words()
    findings: list[Finding] = []
    for index, source, tree in parsed:
        lines = source.splitlines()
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

        def found(node: ast.AST, reason: str, index: int = index, lines: list[str] = lines) -> None:
            line = getattr(node, "lineno", 1)
            text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
            findings.append(Finding(index, line, clean_text(text)[:200], reason))

        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if reason := _module_reason(alias.name):
                        found(node, f"imports {alias.name}, which {reason}")
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    name = f"{node.module}.{alias.name}"
                    reason = _module_reason(node.module) or _module_reason(name)
                    if reason:
                        found(node, f"imports {name}, which {reason}")
                    elif node.module == "sys" and alias.name in SYS_ATTRIBUTES:
                        found(node, f"uses sys.{alias.name}, which reaches the recorder's machinery")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "__del__":
                found(node, "defines __del__, which the garbage collector runs outside the recorded calls")
            elif isinstance(node, ast.Name) and node.id == "__import__":
                call = parents.get(node)
                literal = (
                    isinstance(call, ast.Call)
                    and call.func is node
                    and call.args
                    and isinstance(call.args[0], ast.Constant)
                    and isinstance(call.args[0].value, str)
                )
                if not literal:  # __import__("sys") is `import sys`, judged as an import below
                    found(node, "uses __import__ with a name computed at run time")
                elif reason := _module_reason(call.args[0].value):
                    found(node, f"imports {call.args[0].value}, which {reason}")
            elif isinstance(node, ast.Name) and node.id in DYNAMIC:
                found(node, f"uses {node.id}, which runs or finds code by name")
            elif isinstance(node, ast.Name) and node.id == "get_ipython":
                found(node, "uses get_ipython, which hooks IPython's cell execution")
            elif isinstance(node, ast.Name) and node.id in ATTRIBUTE_FUNCTIONS:
                call = parents.get(node)
                named = (
                    isinstance(call, ast.Call)
                    and call.func is node
                    and len(call.args) >= 2
                    and isinstance(call.args[1], ast.Constant)
                    and isinstance(call.args[1].value, str)
                )
                if not named:  # getattr(x, "name") is x.name; a name computed at run time is not readable
                    found(node, f"uses {node.id} with a name computed at run time")
                elif (
                    node.id in ("setattr", "delattr")
                    and (_dotted(call.args[0]) or "").split(".")[0] in aliases
                ):
                    found(node, f"uses {node.id} on {_dotted(call.args[0])}, an imported module or name")
            elif isinstance(node, ast.Attribute):
                dotted = _dotted(node)
                if node.attr in INTROSPECTION:
                    found(
                        node,
                        f"uses {node.attr}, which reaches objects (the recorder's too) without naming them",
                    )
                elif node.attr == "_op":
                    found(node, "calls a PyTorch operator's C function directly, unnamed to the profiler")
                elif dotted and aliases.get(dotted.split(".")[0]) == "sys" and node.attr in SYS_ATTRIBUTES:
                    found(node, f"uses sys.{node.attr}, which reaches the recorder's machinery")
                elif node.attr in HOOKS - {"register"} or (
                    node.attr == "register"
                    and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "events"
                ):
                    found(node, f"uses {node.attr}, which hooks IPython's cell execution")
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for target in targets:
                    dotted = _dotted(target) if isinstance(target, ast.Attribute) else None
                    if dotted and dotted.split(".")[0] in aliases:
                        found(node, f"assigns to {dotted}, an attribute of an imported module or name")
            if isinstance(node, ast.Call):
                passed = [*node.args, *(keyword.value for keyword in node.keywords)]
                for argument in passed:
                    dotted = _dotted(argument)
                    if dotted is None:
                        continue
                    value = _resolve(dotted, aliases)
                    name = dotted.rsplit(".", 1)[-1].lower()
                    if isinstance(value, C_FUNCTIONS) and any(word in name for word in words):
                        found(
                            node,
                            f"passes {dotted} to a function that calls it from C, where the profiler "
                            "does not see the call",
                        )
    return sorted(set(findings), key=lambda finding: (finding.cell, finding.line, finding.reason))
