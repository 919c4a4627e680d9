"""A new exercise in one command: ``make new-exercise NAME=ex12_sliding_window [TITLE=...] [TOPIC=...]``.

Writes the five pieces of an assignment (see ``instructors/authoring.md``), around one example function
(``scaled_scores``) that works from the start: the course's tests pass on it, but for the bank's size
(``test_bank`` wants ten wrong implementations):

- ``solutions/<topic>.py``: the reference, a function with the docstring that states the task;
- ``attention_course/checks/<exNN>.py``: one behaviour (a test cell, visible and hidden part) and the
  ``CONTRACT`` of the function's docstring;
- ``tests/banks/<exNN>.py``: its correct base implementation and one wrong implementation (a row);
- the assignment's entry in ``attention_course/registry.py`` (above the line that marks where they go);
- the source notebook ``solutions/<id>/<id>.ipynb``: introduction, install and set-up cells, then the task,
  solution and test cells, which :func:`attention_course.grading.release.synced_notebook` adds and writes.

It refuses to overwrite anything, and writes nothing unless it can write everything. The command line:
``python -m attention_course.grading.scaffold NAME [--title TITLE] [--topic TOPIC]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import keyword
import re
import string
import sys
from collections.abc import Sequence
from pathlib import Path

import nbformat

import attention_course
from attention_course.grading.release import PLACEHOLDER, new_cell, synced_notebook
from attention_course.registry import ASSIGNMENTS, SOURCE_DIRECTORY, Assignment, course_root

NAME = re.compile(r"^ex(?P<number>\d{2,})_(?P<rest>[a-z][a-z0-9_]*)$")
# the line of registry.py above which a new assignment goes
MARKER = "# `make new-exercise` adds an assignment above this line"

REFERENCE = '''\
"""Reference solutions of exercise ${checks} (${title}).

Each function here is one that the learner writes: `make release` turns its signature and docstring into
the solution cell and hides its body. The docstring states the task: its Args, Returns and Raises are the
clauses of the checks module's CONTRACT. ``scaled_scores`` is the scaffold's example: replace it.
"""

import math

import torch


def scaled_scores(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The attention scores of every query with every key: ``query @ key^T / sqrt(d_k)``.

    Args:
        query: ``[..., q_len, d_k]``.
        key: ``[..., k_len, d_k]``, with the leading axes of ``query``.

    Returns:
        ``[..., q_len, k_len]``, of the dtype and on the device of ``query``.

    Raises:
        ValueError: if ``query`` and ``key`` have different widths ``d_k``.

    Source: Vaswani et al. 2017, eq. (1).
    """
    if query.size(-1) != key.size(-1):
        raise ValueError(
            "query and key must have the same width d_k, got "
            f"{query.size(-1)} and {key.size(-1)}"
        )
    return query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
'''

CHECKS = '''\
"""Checks of exercise ${checks}: ${title}.

Each behaviour is one test cell, in the notebook's order: its plan's name is the cell's grade_id and the first
paragraph of its docstring the cell's description. A visible part uses known answers, properties and PyTorch's
built-ins, never the reference (a learner runs it without solutions/); a hidden part checks the same behaviour
on more inputs, against ``part.reference``. ``scaled_scores_values`` is the scaffold's example: replace it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from attention_course.checks import engine
from attention_course.checks.engine import Call, Check, Mistake, Part, behaviour

# Each promise of a learner's docstring (its Args, Returns and Raises) and the behaviours that check it:
# "<function> <argument>", "<function> returns", "<function> raises <Error>" (tests/test_contracts.py)
CONTRACT = engine.table("""
scaled_scores query: scaled_scores_values; [q_len, d_k] and [batch, heads, q_len, d_k], float64
scaled_scores key: scaled_scores_values; k_len other than q_len, with the leading axes of query
scaled_scores returns: scaled_scores_values; [..., q_len, k_len], query @ key^T / sqrt(d_k)
scaled_scores raises ValueError: scaled_scores_values; widths d_k 4 and 3 (visible), 8 and 6 (hidden)
""")

# Likely causes of the learner's exceptions, tried before the engine's own: fragments of the exception's
# "Type: message" separated by " | ", any of which selects the hint ("A & B": both, in the message or in the
# learner's line that raised it); then ": " and the hint, continued on indented lines.
HINTS = engine.hint_table("""
size of tensor & .T: key.T reverses every axis of a tensor with leading axes: transpose the last two,
    key.transpose(-2, -1)
""")

# (query's shape, key's shape): every axis a different size; the visible part's, then the hidden part's
SIZES = (
    (((5, 4), (7, 4)), ((2, 3, 5, 4), (2, 3, 6, 4))),
    (((1, 8), (9, 8)), ((3, 2, 6, 16), (3, 2, 4, 16)), ((4, 1, 7, 2), (4, 1, 3, 2))),
)
MISMATCHED = (((5, 4), (7, 3)), ((2, 6, 8), (2, 5, 6)))  # widths that differ: a ValueError


def _values(call: Call, expected: torch.Tensor) -> Check:
    """A check that ``call`` returns ``expected``; a wrong result is named by the first mistake it matches."""
    query, key = call.arguments["query"], call.arguments["key"]

    def mistakes() -> Iterator[Mistake]:
        scores = query @ key.transpose(-2, -1)
        yield Mistake("the scores are not divided by sqrt(d_k)", scores)
        yield Mistake("the scores are divided by d_k: the scale is 1/sqrt(d_k)", scores / query.size(-1))
        yield Mistake("the scores are multiplied by sqrt(d_k): divide", scores * math.sqrt(query.size(-1)))

    def judge(result: Any) -> None:
        engine.assert_values(result, expected, f"the scores returned by {call}", mistakes=mistakes)

    return Check(call, judge)


@behaviour(function="scaled_scores", points=2, hints=HINTS)
def scaled_scores_values(part: Part) -> Iterator[Check]:
    """scaled_scores is query @ key^T / sqrt(d_k) with any leading axes, and rejects different widths."""
    for seed, (query_shape, key_shape) in enumerate(SIZES[part.hidden]):
        query = engine.randn(query_shape, seed=10 + seed, device=part.device)
        key = engine.randn(key_shape, seed=20 + seed, device=part.device)
        if part.hidden:  # the reference, on more inputs
            expected = part.reference(query, key)
        else:  # PyTorch's matmul: a visible part never uses the reference
            expected = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.size(-1))
        yield _values(part.call(query=query, key=key), expected)
    query_shape, key_shape = MISMATCHED[part.hidden]
    query, key = (engine.randn(shape, seed=30, device=part.device) for shape in (query_shape, key_shape))
    yield engine.raises(
        part.call(query=query, key=key), "ValueError", "if query and key have different widths d_k"
    )
'''

BANK = '''\
"""Implementations of exercise ${checks} that a learner could plausibly write: wrong ones and right ones.

``BASES`` holds a correct implementation of each function, as the source of a solution cell (it runs after
the set-up cell: torch and math are there). ``ROWS`` are wrong implementations that differ from a base by a
line or two; ``WHOLE`` wrong ones of another structure, functions named ``<function>__<variant>``; ``RIGHT``
correct ones in other styles. An expectation lists *exactly* the test cells that reject an implementation,
with a fragment of each one's message (see ``_bank.py``); the tests want at least ten wrong ones.
"""

from tests.banks._bank import Row

BASES = {
    "scaled_scores": """def scaled_scores(query, key):
    if query.size(-1) != key.size(-1):
        raise ValueError("query and key must have the same width")
    return query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
""",
}

ROWS = [
    Row(
        "scaled_scores",
        "no_scale",
        " / math.sqrt(query.size(-1))",  # find: must occur exactly once in the base
        "",  # replace
        {"scaled_scores_values": "not divided by sqrt(d_k)"},
    ),
]

WHOLE = {}  # {function named <function>__<variant>: expectations}

RIGHT = []  # [functions named <function>__<variant>]
'''

SETUP = """\
import math

import torch

from attention_course.checks import ${checks} as checks
from attention_course.device import default_device

print(f"torch {torch.__version__}; the checks run on {default_device()}")"""

INTRO = """\
# Exercise ${number}: ${title}

${placeholder} with the exercise's introduction: the chapter it follows, what the learner writes and for
how many points. Each function's task follows, then its solution cell and its test cells."""


def install_cell(root: Path) -> str:
    """The first code cell of every notebook: it installs the course from the repository where it is missing
    (Colab), from ``_config.yml``'s repository (tests/test_launch.py holds the notebooks to it)."""
    import yaml  # the book's configuration; yaml comes with jupyter-book and nbgrader

    repository = yaml.safe_load((root / "_config.yml").read_text())["repository"]
    url, branch = repository["url"], repository["branch"]
    return f"""\
# Colab and Binder: install the course library where it is missing
# (nothing happens where it is installed).
import importlib
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("attention_course") is None:
    repository = "{url}"
    course = f"attention-course @ git+{{repository}}@{branch}"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", course],
        check=True,
    )
    # let this running kernel see the new package
    importlib.invalidate_caches()"""


def registry_entry(assignment: Assignment) -> str:
    """The lines of ``assignment`` in the registry's table, formatted as ruff formats them."""

    def text(value: str) -> str:
        return json.dumps(value, ensure_ascii=False)

    return (
        f"        Assignment(\n"
        f"            {text(assignment.id)},\n"
        f"            {text(assignment.title)},\n"
        f"            reference={text(assignment.reference)},\n"
        f"            checks={text(assignment.checks)},\n"
        f"            bank={text(assignment.bank)},\n"
        f"        ),\n"
    )


class Refused(Exception):
    """The scaffold cannot write the exercise (a file exists, a name is taken): nothing was written."""


def plan(root: Path, name: str, title: str | None, topic: str | None) -> tuple[Assignment, dict[Path, str]]:
    """The assignment ``name`` and ``{path: text}`` of the files to create.

    Raises:
        Refused: if ``name`` or ``topic`` is not valid, is taken, or a file to write exists.
    """
    match = NAME.match(name)
    if not match:
        raise Refused(f"NAME must be ex<two digits>_<snake_case>, such as ex12_sliding_window; got {name!r}")
    number, topic = match["number"], topic or match["rest"]
    checks = f"ex{number}"
    if not topic.isidentifier() or keyword.iskeyword(topic) or not topic.islower():
        raise Refused(f"TOPIC must be a lower-case Python module name, got {topic!r}")
    title = title or match["rest"].replace("_", " ").capitalize()
    if len(title) > 60 or '"' in title or "\n" in title:
        raise Refused(f"TITLE must be at most 60 characters, without double quotes; got {title!r}")
    assignment = Assignment(
        name,
        title,
        reference=f"{SOURCE_DIRECTORY}.{topic}",
        checks=f"attention_course.checks.{checks}",
        bank=f"tests.banks.{checks}",
    )
    taken = [a.id for a in ASSIGNMENTS.values() if name == a.id or a.checks == assignment.checks]
    if taken:
        raise Refused(f"the registry already has {taken[0]}: number the new exercise differently")
    library = root / "attention_course" / topic
    if library.with_suffix(".py").exists() or library.is_dir():
        raise Refused(
            f"attention_course/{topic} exists: the reference module solutions.{topic} makes the library's "
            f"attention_course.{topic} an answer module, which a learner's code may not call. Choose another "
            "TOPIC, or re-export the library's functions from the reference by hand (see the guide)"
        )
    fields = {"id": name, "title": title, "checks": checks, "number": str(int(number))}
    files = {
        root / SOURCE_DIRECTORY / f"{topic}.py": REFERENCE,
        root / "attention_course" / "checks" / f"{checks}.py": CHECKS,
        root / "tests" / "banks" / f"{checks}.py": BANK,
    }
    files = {path: string.Template(text).substitute(fields) for path, text in files.items()}
    existing = [path for path in [*files, assignment.source(root)] if path.exists()]
    if existing:
        raise Refused(f"{existing[0].relative_to(root)} exists: the scaffold overwrites nothing")
    return assignment, files


def notebook(assignment: Assignment, root: Path) -> nbformat.NotebookNode:
    """The source notebook: introduction, install and set-up cells, then the cells that the release makes
    for the behaviours of the checks module (which must be importable)."""
    checks = assignment.checks.rsplit(".", 1)[1]
    fields = {"number": str(int(checks[2:])), "title": assignment.title, "placeholder": PLACEHOLDER}
    book = nbformat.v4.new_notebook(
        metadata={
            "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        }
    )
    book.cells = [
        new_cell("text", "intro", string.Template(INTRO).substitute(fields)),
        new_cell("setup", "install", install_cell(root)),
        new_cell("setup", "setup", string.Template(SETUP).substitute(checks=checks)),
    ]
    book.cells[1].metadata["tags"] = ["remove-cell"]  # on Colab, not on the book's page
    book, _ = synced_notebook(assignment, root, book)
    nbformat.validate(book)
    return book


def scaffold(
    root: Path, name: str, title: str | None = None, topic: str | None = None
) -> tuple[Assignment, list[Path]]:
    """Write the new exercise ``name`` into the course at ``root``: its assignment, and the paths written
    (the reference, the checks, the bank, the registry and the source notebook).

    Raises:
        Refused: if something to write exists or a name is taken (then nothing is written).
    """
    library = Path(attention_course.__file__).resolve().parent
    if library != (root / "attention_course").resolve():
        raise Refused(
            f"this Python imports the course library from {library}, not from {root}: run from there"
        )
    assignment, files = plan(root, name, title, topic)
    registry = root / "attention_course" / "registry.py"
    table = registry.read_text()
    if table.count(MARKER) != 1:
        raise Refused(f"{registry.relative_to(root)} lacks the line {MARKER!r} that marks where entries go")
    written: list[Path] = []
    try:
        for path, text in files.items():
            path.write_text(text)
            written.append(path)
        at = table.index(MARKER)
        at = table.rindex("\n", 0, at) + 1  # the start of the marker's line
        registry.write_text(table[:at] + registry_entry(assignment) + table[at:])
        importlib.invalidate_caches()
        source = notebook(assignment, root)
        assignment.source(root).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(source, assignment.source(root))
        written.append(assignment.source(root))
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        registry.write_text(table)
        raise
    return assignment, [*written[:-1], registry, written[-1]]


NEXT = """
Next, as instructors/authoring.md walks through it:
  make release ASSIGNMENT={id}
    the student notebook, {release}
  .venv/bin/python -m pytest -p no:cacheprovider -q tests/test_checks.py tests/test_contracts.py \\
      tests/test_release.py -k "{checks} and not test_bank"
    the example passes every test (test_bank wants ten wrong implementations, the bank has one)
  replace the example, scaled_scores, by the exercise's functions:
    the reference {reference},
    the behaviours and CONTRACT {checks_path}, the bank {bank};
    `make release ASSIGNMENT={id}` then makes their cells; write the notebook's text (the cells
    that say "{placeholder}")"""


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m attention_course.grading.scaffold NAME [--title TITLE] [--topic TOPIC]``."""
    parser = argparse.ArgumentParser(
        prog="make new-exercise", description=__doc__.split("\n\n")[0].removesuffix(":")
    )
    parser.add_argument("name", help="the assignment id, ex<NN>_<snake_case> (ex12_sliding_window)")
    parser.add_argument("--title", help="a short title (default: from the name)")
    parser.add_argument(
        "--topic", help="the reference module's name, solutions/<topic>.py (default: from the name)"
    )
    arguments = parser.parse_args(argv)
    root = course_root()
    try:
        assignment, written = scaffold(root, arguments.name, arguments.title, arguments.topic)
    except Refused as refusal:
        print(f"make new-exercise: {refusal}; nothing was written", file=sys.stderr)
        return 2
    print(f"wrote the exercise {assignment.id}:")
    for path in written:
        lines = len(path.read_text().splitlines())
        shown = f"{path.relative_to(root)} ({lines} lines)"
        print(f"  {'an entry in ' + str(path.relative_to(root)) if path.name == 'registry.py' else shown}")
    reference, checks, bank = (path.relative_to(root) for path in written[:3])
    print(
        NEXT.format(
            id=assignment.id,
            release=assignment.release(root).relative_to(root),
            checks=checks.stem,
            reference=reference,
            checks_path=checks,
            bank=bank,
            placeholder=PLACEHOLDER,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
