"""The static review of a submission's code (:mod:`attention_course.grading.review`): each trick that fools
the recorder's observation is found, with its line; no honest code of the course is flagged.

A finding costs a learner the "from scratch" points until an instructor has read the code, so a false
finding is a wrong grade: every reference solution, every implementation of the eleven banks (right and
wrong, written in many styles) and every source and release notebook is read here, and none is flagged.
"""

from __future__ import annotations

import nbformat
import pytest

from attention_course.grading.review import forbidden_words, review
from attention_course.registry import ASSIGNMENTS
from tests.banks import _bank
from tests.notebook_tools import ROOT, load_exercise, reference_sources


def findings(*sources: str) -> list:
    return review(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources]))


@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_no_honest_code_of_the_course_is_flagged(assignment):
    exercise = load_exercise(assignment)
    sources = [
        *reference_sources(exercise).values(),
        *(candidate.source for candidate in _bank.right(exercise.bank)),
        *(candidate.source for candidate in _bank.wrong(exercise.bank)),
    ]
    flagged = {source.splitlines()[0]: [str(f) for f in findings(source)] for source in sources}
    assert not {first: found for first, found in flagged.items() if found}
    for notebook in (ASSIGNMENTS[assignment].source(ROOT), ASSIGNMENTS[assignment].release(ROOT)):
        assert review(nbformat.read(notebook, as_version=4)) == [], notebook.name


TRICKS = {
    "a thread": ("import threading\nthreading.Thread(target=print).start()", 1, "thread"),
    "a thread, by import from": ("from threading import Thread", 1, "thread"),
    "an IPython hook": ("get_ipython().events.register('post_run_cell', print)", 1, "IPython"),
    "the recorder replaced": (
        "import torch\nfrom attention_course.grading import recorder\nrecorder.save = print",
        3,
        "assigns to recorder.save",
    ),
    "torch patched": ("import torch\ntorch.exp = torch.sin", 2, "assigns to torch.exp"),
    "setattr on a module": ("import torch\nsetattr(torch, 'exp', torch.sin)", 2, "setattr on torch"),
    "a name computed at run time": ("name = 'soft' + 'max'\nf = getattr(x, name)", 2, "computed at run time"),
    "exec": ("exec('x = 1')", 1, "exec"),
    "exec through the builtins": ("f = __builtins__['ex' + 'ec']", 1, "__builtins__"),
    "a module's dictionary": ("import torch\nf = torch.__dict__['soft' + 'max']", 2, "__dict__"),
    "every subclass of object": ("c = ().__class__.__base__.__subclasses__()", 1, "__subclasses__"),
    "a function's globals": ("def f():\n    pass\ng = f.__globals__", 3, "__globals__"),
    "__import__": ("m = __import__('thr' + 'eading')", 1, "__import__"),
    "__import__ of a literal name": ("m = __import__('threading')", 1, "imports threading"),
    "the profiler": ("import sys\nsys.setprofile(None)", 2, "sys.setprofile"),
    "the profiler, by import from": ("from sys import settrace", 1, "sys.settrace"),
    "ctypes": ("import ctypes", 1, "ctypes"),
    "a finaliser": ("class Box:\n    def __del__(self):\n        print(self)", 2, "__del__"),
    "weakref.finalize": ("import weakref\nweakref.finalize(object(), print)", 1, "weakref"),
    "map over a built-in": (
        "import torch\ndef softmax(x, dim=-1):\n    return next(map(torch.softmax, [x], [dim]))",
        3,
        "passes torch.softmax",
    ),
    "partial of a built-in": (
        "import functools\nimport torch.nn.functional as F\n"
        "f = functools.partial(F.scaled_dot_product_attention)",
        3,
        "passes F.scaled_dot_product_attention",
    ),
    "a built-in imported by name": (
        "from torch import softmax\nys = list(map(softmax, [1]))",
        2,
        "passes softmax",
    ),
    "a Tensor method": ("import torch\nys = sorted([1], key=torch.Tensor.softmax)", 2, "Tensor.softmax"),
    "an operator's C function": (
        "import torch\ny = torch.ops.aten._softmax.default._op(x, -1, False)",
        2,
        "operator's C function",
    ),
}


@pytest.mark.parametrize("trick", TRICKS)
def test_each_trick_is_found_on_its_line(trick):
    source, line, reason = TRICKS[trick]
    found = findings(source)
    assert any(f.line == line and reason in f.reason for f in found), [str(f) for f in found]


def test_what_the_profiler_sees_is_not_flagged():
    """Honest idioms that look alike: an attribute looked up by a literal name, a built-in that no rule
    forbids passed to map, dtypes and classes passed as arguments, a lambda that calls a built-in (from
    bytecode, which the profiler sees), an assignment to an attribute of the learner's own object."""
    assert (
        findings(
            "import torch\n"
            "cached = getattr(self, 'cache', None)\n"
            "ys = list(map(torch.exp, [torch.ones(2)]))\n"
            "z = torch.zeros(2, dtype=torch.float32)\n"
            "ok = isinstance(z, torch.Tensor)\n"
            "ws = list(map(lambda s: torch.softmax(s, -1), [z]))\n"
            "self.weight = torch.nn.Parameter(z)\n"
            'print("debugging", file=__import__("sys").stderr)\n'
        )
        == []
    )


def test_test_cells_and_locked_cells_are_not_the_learners():
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("import importlib", metadata={"nbgrader": {"locked": True}}),
            nbformat.v4.new_code_cell("exec('1')", metadata={"nbgrader": {"grade": True, "solution": False}}),
            nbformat.v4.new_code_cell("exec('2')", metadata={"nbgrader": {"grade": True, "solution": True}}),
        ]
    )
    assert [(f.cell, f.line) for f in review(notebook)] == [(2, 1)]


def test_the_forbidden_words_are_the_rules_of_the_checks():
    assert {"softmax", "scaled_dot_product", "conv1d", "lower_right"} <= set(forbidden_words())
