"""The release for learners: a copy of the course without the answers (``make student-release DEST=...``).

The copy holds the course's files (those git tracks, and new ones it does not ignore) except what answers
the exercises: ``solutions/`` (reference solutions, source notebooks with hidden tests), ``tests/`` (the
banks of right and wrong implementations, and the tests that import them), ``.ci/``, and any other Python
file that imports ``solutions`` or ``tests`` (it could not run without them) or writes code that does
(the scaffold of ``make new-exercise``). What stays is what a learner
uses: the book's sources, the exercise notebooks as released, and the course library with its visible
checks. The library holds the code that later chapters build on (DESIGN.md), so an answer that the library
provides is in the copy by design; a learner's solution that imports it loses the points
(``*_from_scratch`` checks).

:func:`scan` looks for answers in a copy: a reference solution's own code (a function that only
``solutions/`` defines), a line of a hidden test, a source notebook's solution in a released notebook, an
import of ``solutions`` or of the tests. ``make student-release`` fails when it finds one.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import nbformat

from attention_course.registry import ASSIGNMENTS, course_root

LEFT_OUT = ("solutions", "tests", ".ci")  # top-level folders the copy never holds
SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)
CODE_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.S | re.M)
ANSWER_IMPORT = re.compile(r"^\s*(?:from|import)\s+(?:solutions|tests)\b", re.M)
SIGNIFICANT = 24  # characters: a shorter line (`return output`) proves nothing when found elsewhere


def course_files(root: Path) -> list[Path]:
    """The course's files, relative to ``root``: those git tracks and the new ones it does not ignore
    (without git: every file but the usual build and environment folders)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
        files = [Path(name) for name in listed.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        skipped = {".git", ".venv", "_build", ".jupyter_cache", "__pycache__", "grading-report"}
        files = [
            path.relative_to(root)
            for path in root.rglob("*")
            if path.is_file() and not skipped & set(path.relative_to(root).parts)
        ]
    return sorted(path for path in files if (root / path).is_file())


def _imports_answers(path: Path) -> bool:
    """Whether the Python file ``path`` imports ``solutions`` or ``tests``, or writes code that does (an
    import line in a string: the templates of ``make new-exercise``, an instructor's tool)."""
    text = path.read_text(errors="replace")
    if ANSWER_IMPORT.search(text):
        return True
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        if any(name.split(".")[0] in ("solutions", "tests") for name in names):
            return True
    return False


def released(root: Path) -> list[Path]:
    """The files of the copy, relative to ``root``."""
    return [
        path
        for path in course_files(root)
        if path.parts[0] not in LEFT_OUT and not (path.suffix == ".py" and _imports_answers(root / path))
    ]


def write(root: Path, dest: Path) -> list[Path]:
    """Copy the course at ``root`` without its answers into ``dest`` (new, or empty); return the files.

    Raises:
        FileExistsError: if ``dest`` exists and is not empty.
    """
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty")
    files = released(root)
    for path in files:
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / path, dest / path)
    return files


# --------------------------------------------------------------------------------------------------
# what counts as an answer


def _lines(block: str) -> set[str]:
    """The significant lines of a block of code: long enough to identify it, comments left out."""
    kept = (line.strip() for line in block.splitlines())
    return {line for line in kept if len(line) >= SIGNIFICANT and not line.startswith("#")}


def _defined(source: str) -> str | None:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    names = [node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)]
    return names[0] if names else None


def answers(root: Path) -> dict[str, set[str]]:
    """What the copy must not hold, from the course at ``root``, as significant lines:

    - ``"own solutions"``: the solutions of the functions that only ``solutions/`` defines (the others are
      the library's, by design in the copy);
    - ``"solutions"``: every solution region of the source notebooks (none may be in a released notebook);
    - ``"hidden tests"``: every hidden test of the source notebooks.

    A line that a source notebook shows outside its solution and hidden-test regions (a signature's
    ``) -> tuple[torch.Tensor, torch.Tensor]:``, which a helper method inside a region may repeat) is
    released anyway, so it is not an answer.
    """
    found: dict[str, set[str]] = {"own solutions": set(), "solutions": set(), "hidden tests": set()}
    shown: set[str] = set()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # the course's own solutions/, as the graders import them
    for assignment in ASSIGNMENTS.values():
        source = assignment.source(root)
        if not source.is_file():
            continue
        module = importlib.import_module(assignment.reference)
        for cell in nbformat.read(source, as_version=4).cells:
            for region in SOLUTION.findall(cell.source):
                found["solutions"] |= _lines(region)
                name = _defined(cell.source)
                defined = getattr(module, name, None) if name else None
                if defined is not None and getattr(defined, "__module__", "").startswith("solutions"):
                    found["own solutions"] |= _lines(region)
            for region in HIDDEN.findall(cell.source):
                found["hidden tests"] |= {line.strip() for line in region.splitlines() if line.strip()}
            if cell.cell_type == "code":
                outside = HIDDEN.sub("", SOLUTION.sub("", cell.source))
                shown |= {line.strip() for line in outside.splitlines()}
    found["solutions"] -= shown
    found["own solutions"] -= shown
    return found


def _texts(dest: Path) -> Iterator[tuple[Path, str]]:
    for path in sorted(dest.rglob("*")):
        if path.is_file():
            try:
                yield path.relative_to(dest), path.read_text()
            except (UnicodeDecodeError, OSError):
                continue  # images and other binary files


def _code(path: Path, text: str) -> str:
    """The code of a file: a notebook's code cells, a MyST page's ``{code-cell}`` blocks, a Python file."""
    if path.suffix == ".ipynb":
        cells = nbformat.reads(text, as_version=4).cells
        return "\n".join(cell.source for cell in cells if cell.cell_type == "code")
    if path.suffix == ".md":  # prose may show nbgrader's format (instructors/authoring.md): not code
        return "\n".join(CODE_CELL.findall(text))
    return text


def scan(dest: Path, root: Path) -> list[str]:
    """Answers found in the copy ``dest`` of the course at ``root``: one line per finding (none: ``[]``)."""
    problems = [f"{name}/ is in the copy" for name in LEFT_OUT if (dest / name).exists()]
    banned = answers(root)
    for path, text in _texts(dest):
        code = _code(path, text)
        for match in ANSWER_IMPORT.finditer(code):
            problems.append(f"{path}: imports the answers: {match.group(0).strip()}")
        if path.suffix == ".ipynb" and ("### BEGIN HIDDEN TESTS" in code or "### BEGIN SOLUTION" in code):
            problems.append(f"{path}: holds nbgrader's solution or hidden-test markers")
        lines = {line.strip() for line in code.splitlines()}
        kinds = ["hidden tests"] + (["solutions"] if path.parts[0] == "exercises" else [])
        for kind in kinds:
            problems += [
                f"{path}: holds a line of the {kind}: {line}" for line in sorted(banned[kind] & lines)
            ]
        written = {line.strip() for line in text.splitlines()}  # an exercise-only solution: nowhere at all
        own = sorted(banned["own solutions"] & written)
        problems += [f"{path}: holds a line of a solution that only solutions/ has: {line}" for line in own]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m attention_course.grading.student_release DEST``: write the copy, then scan it."""
    parser = argparse.ArgumentParser(prog="student-release", description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="where the copy goes (a new or empty folder)")
    parser.add_argument("--course", type=Path, default=None, help="course directory (default: this course)")
    arguments = parser.parse_args(argv)
    root = course_root(arguments.course)
    try:
        files = write(root, arguments.dest)
    except FileExistsError as error:
        parser.error(str(error))
    problems = scan(arguments.dest, root)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} answer(s) in {arguments.dest}: not a release for learners", file=sys.stderr)
        return 1
    print(f"{len(files)} files copied to {arguments.dest}, without solutions/, tests/ and hidden tests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
