"""Preparing a submission as ``nbgrader autograde`` does, and scoring it with nbgrader's own rules.

``nbgrader autograde`` first *sanitizes* a submission (preprocessors ``ClearOutput``, ``DeduplicateIds``,
``OverwriteKernelspec``, ``OverwriteCells``), then executes it and scores each grade cell with
``nbgrader.utils.determine_grade``. The first two preprocessors and the scoring are nbgrader's own code,
used here as is. ``OverwriteCells`` and ``OverwriteKernelspec`` read nbgrader's database; here they read
the *master* notebook instead: the source notebook after ``ClearSolutions``, ``ClearOutput`` and
``ComputeChecksums``, which is exactly what ``nbgrader generate_assignment`` stores in that database.
The test ``tests/test_grading.py`` checks that both graders give the same points.
"""

from __future__ import annotations

import ast
import copy
import difflib
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode
from nbgrader import utils
from nbgrader.preprocessors import ClearOutput, ClearSolutions, ComputeChecksums, DeduplicateIds

#: what nbgrader writes at the top of a grade cell it restores (OverwriteCells.missing_cell_notification)
MISSING_CELL_NOTIFICATION = (
    "This cell (id:{cell_id}) was missing from the submission. It was added back by nbgrader.\n\n"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def master_notebook(source: Path) -> NotebookNode:
    """The source notebook as ``generate_assignment`` records it: solutions stubbed, checksums computed.

    Test cells keep their hidden tests: they are what a submission's test cells are replaced with.
    """
    notebook = nbformat.read(source, as_version=4)
    resources: dict = {}
    for preprocessor in (ClearSolutions(), ClearOutput(), ComputeChecksums()):
        notebook, resources = preprocessor.preprocess(notebook, resources)
    return notebook


def _grade_id(cell: NotebookNode) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _recorded_cells(master: NotebookNode) -> list[NotebookNode]:
    """The cells nbgrader's ``SaveCells`` records: grade, solution and locked cells, in order."""
    return [
        cell
        for cell in master.cells
        if _grade_id(cell) and (utils.is_grade(cell) or utils.is_solution(cell) or utils.is_locked(cell))
    ]


def _convert_cell_type(cell: NotebookNode, cell_type: str) -> None:
    cell.cell_type = cell_type
    if cell_type == "code":
        cell.outputs, cell.execution_count = [], None
    else:
        cell.pop("outputs", None)
        cell.pop("execution_count", None)


def _restored_cell(source: NotebookNode) -> NotebookNode:
    """A missing grade cell as nbgrader's ``OverwriteCells.missing_cell_transform`` re-creates it."""
    text = MISSING_CELL_NOTIFICATION.format(cell_id=_grade_id(source)) + source.source
    nbgrader = {
        "grade": True,
        "grade_id": _grade_id(source),
        "locked": utils.is_locked(source),
        "checksum": source.metadata.nbgrader["checksum"],
        "cell_type": source.cell_type,
        "points": float(source.metadata.nbgrader["points"]),
        "solution": utils.is_solution(source),
        "schema_version": 3,
    }
    metadata = {"deletable": False, "nbgrader": nbgrader}
    if not utils.is_solution(source):
        metadata["editable"] = False
    if source.cell_type == "code":
        return nbformat.v4.new_code_cell("# " + text, metadata=metadata)
    return nbformat.v4.new_markdown_cell(text, metadata=metadata)


def prepare(submission: NotebookNode, master: NotebookNode) -> NotebookNode:
    """Sanitize a submission as ``nbgrader autograde`` does before executing it.

    Outputs are cleared, duplicated grade ids dropped, the kernelspec, cell types, the ``locked``, ``grade``
    and ``solution`` flags, points and locked cells restored from ``master``, and deleted grade cells added
    back (``add_missing_cells = True`` in
    the course's ``nbgrader_config.py``). Test cells thereby get their hidden tests back.
    """
    notebook = copy.deepcopy(submission)
    resources: dict = {}
    for preprocessor in (ClearOutput(), DeduplicateIds()):
        notebook, resources = preprocessor.preprocess(notebook, resources)
    notebook.metadata["kernelspec"] = copy.deepcopy(master.metadata.get("kernelspec", {}))
    recorded = {_grade_id(cell): cell for cell in _recorded_cells(master)}
    for cell in notebook.cells:
        grade_id = _grade_id(cell)
        if grade_id is None:
            continue
        source = recorded.get(grade_id)
        if source is None:  # a grade id the assignment does not know: not graded
            del cell.metadata.nbgrader["grade_id"]
            continue
        if cell.cell_type != source.cell_type:
            _convert_cell_type(cell, source.cell_type)
        # every flag from the assignment: a test cell turned into a solution cell (its grade flag off, so
        # that nbgrader would not restore it) is a test cell again, with its source and its points
        for flag, value in (
            ("locked", utils.is_locked(source)),
            ("grade", utils.is_grade(source)),
            ("solution", utils.is_solution(source)),
        ):
            cell.metadata.nbgrader[flag] = value
        if utils.is_grade(source):
            cell.metadata.nbgrader["points"] = float(source.metadata.nbgrader["points"])
        else:
            cell.metadata.nbgrader.pop("points", None)
        cell.metadata.nbgrader["checksum"] = source.metadata.nbgrader["checksum"]
        if utils.is_locked(source) and utils.compute_checksum(cell) != source.metadata.nbgrader["checksum"]:
            cell.source = source.source
    _add_missing_grade_cells(notebook, master)
    return notebook


def _comparable(cell: NotebookNode) -> tuple[str, str]:
    """A cell as the release shows it: its type and its source without hidden tests, trimmed."""
    source = re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", "", cell.source, flags=re.S)
    return cell.cell_type, source.strip()


def _defined_names(cell: NotebookNode) -> set[str]:
    if cell.cell_type != "code":
        return set()
    try:
        tree = ast.parse(cell.source)
    except SyntaxError:
        return set()
    kinds = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    return {node.name for node in tree.body if isinstance(node, kinds)}


def recover_metadata(submission: NotebookNode, master: NotebookNode) -> tuple[NotebookNode, list[str]]:
    """Give back their nbgrader metadata to cells whose editor stripped it, by matching cells to ``master``.

    Cells are aligned by content (:class:`difflib.SequenceMatcher` on type and source, hidden tests left
    out): a locked or test cell matches its identical copy; a solution cell, the one cell of its type
    between the same matched neighbours (for code, the one defining the same functions or classes). A
    grade id the submission has is never moved.

    Returns:
        The notebook (a copy if anything changed) and warnings naming the recovered cells.
    """
    present = {_grade_id(cell) for cell in submission.cells if _grade_id(cell)}
    if all(_grade_id(cell) in present for cell in master.cells if _grade_id(cell)):
        return submission, []
    notebook = copy.deepcopy(submission)
    matcher = difflib.SequenceMatcher(
        a=[_comparable(cell) for cell in master.cells],
        b=[_comparable(cell) for cell in notebook.cells],
        autojunk=False,
    )
    pairs = {block.a + k: block.b + k for block in matcher.get_matching_blocks() for k in range(block.size)}
    taken = set(pairs.values())
    recovered = []
    for index, cell in enumerate(master.cells):
        grade_id = _grade_id(cell)
        if not grade_id or grade_id in present:
            continue
        match = pairs.get(index)
        if match is None and utils.is_solution(cell):
            low = max((pairs[i] for i in pairs if i < index), default=-1)
            high = min((pairs[i] for i in pairs if i > index), default=len(notebook.cells))
            candidates = [
                j
                for j in range(low + 1, high)
                if j not in taken
                and notebook.cells[j].cell_type == cell.cell_type
                and not _grade_id(notebook.cells[j])
            ]
            names = _defined_names(cell)
            if names:
                candidates = [j for j in candidates if _defined_names(notebook.cells[j]) & names]
            match = candidates[0] if len(candidates) == 1 else None
        if match is None or _grade_id(notebook.cells[match]):
            continue
        notebook.cells[match].metadata["nbgrader"] = copy.deepcopy(cell.metadata["nbgrader"])
        taken.add(match)
        present.add(grade_id)
        recovered.append(grade_id)
    if not recovered:
        return submission, []
    warning = (
        f"{len(recovered)} cell(s) had lost their nbgrader metadata (another editor?) and were matched to "
        "the "
        f"assignment by their content: {', '.join(recovered)}"
    )
    return notebook, [warning]


def _add_missing_grade_cells(notebook: NotebookNode, master: NotebookNode) -> None:
    """Put each missing grade cell back after the cell that precedes it in the source, as nbgrader does."""
    order = [_grade_id(cell) for cell in _recorded_cells(master)]
    recorded = {_grade_id(cell): cell for cell in _recorded_cells(master)}
    present = {
        _grade_id(cell): index
        for index, cell in enumerate(notebook.cells)
        if utils.is_grade(cell) or utils.is_solution(cell)
    }
    added = 0
    for grade_id, source in recorded.items():
        if not utils.is_grade(source) or grade_id in present:
            continue
        position = order.index(grade_id)
        previous = order[position - 1] if position > 0 else None
        if previous is None:
            index = 0
        elif previous in present:
            index = present[previous] + added + 1
        else:  # nbgrader fails here (KeyError); keep going: after the nearest earlier cell still present
            earlier = [present[name] for name in order[:position] if name in present]
            index = (max(earlier) + added + 1) if earlier else 0
        notebook.cells.insert(index, _restored_cell(source))
        present[grade_id] = present.get(previous, index - added - 1) if previous in present else index - added
        added += 1


# --------------------------------------------------------------------------------------------------
# scoring


@dataclass
class CellResult:
    """The grade of one grade cell of one submission.

    ``status`` is one of ``passed``, ``failed``, ``timeout``, ``stderr`` (the cell wrote to stderr, which
    nbgrader scores as a failure), ``not run`` (the kernel died or the submission ran out of time before
    the cell), ``manual`` (a written answer waiting for a human) and ``no response`` (a written answer
    left blank, scored 0 by nbgrader).

    When the grader's judge failed the cell (split mode), ``part`` says which part of its check failed,
    ``"visible"`` or ``"hidden"``, ``cause`` is the failure's likely cause and ``raised`` whether the
    learner's function raised an exception; otherwise ``part`` is ``""``. Feedback for learners reveals a
    hidden part's failure only in general terms (:mod:`~attention_course.grading.feedback`).
    """

    grade_id: str
    kind: str  # "auto" (a test cell) or "manual" (a written answer)
    points: float | None  # None: waiting for manual grading
    max_points: float
    status: str
    message: str = ""
    part: str = ""
    cause: str = ""
    raised: bool = False

    def __post_init__(self) -> None:
        # a message quotes what the learner's code raised or printed: cleaned here, once, for every output
        self.message, self.cause = clean_text(self.message), clean_text(self.cause)

    def as_dict(self) -> dict:
        return asdict(self)


#: terminal escape sequences (CSI, OSC, and single-character ones), then the remaining control characters but
#: tab and new line, and the bidirectional overrides that make text read other than it is
_UNSAFE_TEXT = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]"
)

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` from a learner's kernel, safe to print on a terminal, to write to any file and to show:
    escape sequences (colours, titles, clipboard writes, disguised links), control characters but tab and
    new line, and bidirectional overrides removed; lone surrogates and other text that is not UTF-8
    replaced by U+FFFD."""
    if not text:
        return text
    return _SURROGATE.sub("\ufffd", _UNSAFE_TEXT.sub("", text))


def _error_text(output: NotebookNode) -> str:
    text = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}".strip()
    return _ANSI.sub("", text).rstrip(": ")


def _defining_cells(notebook: NotebookNode) -> dict[str, NotebookNode]:
    """Map each function name to the (solution) cell that defines it."""
    defined = {}
    for cell in notebook.cells:
        if cell.cell_type != "code" or not utils.is_solution(cell):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                defined[node.name] = cell
    return defined


def _explain_name_error(message: str, executed: NotebookNode, master: NotebookNode) -> str:
    """Say why a name is undefined: its solution cell was deleted, or raised an error."""
    match = re.search(r"name '(\w+)' is not defined", message)
    if not match:
        return message
    name = match.group(1)
    expected = _defining_cells(master).get(name)
    if expected is None:
        return message
    solution_id = _grade_id(expected)
    cells = {_grade_id(cell): cell for cell in executed.cells if _grade_id(cell)}
    cell = cells.get(solution_id)
    if cell is None:
        return f"{message} (the cell that defines `{name}` was deleted from the submission)"
    errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
    if errors:
        return f"{message} (the cell that defines `{name}` failed: {_error_text(errors[0]).splitlines()[0]})"
    return f"{message} (the cell that should define `{name}` does not define it)"


def score(
    executed: NotebookNode,
    master: NotebookNode,
    *,
    stopped: str | None = None,
    judged: dict | None = None,
    gave_up_after: int | None = None,
) -> list[CellResult]:
    """Score every grade cell of an executed (maybe partly executed) submission, with nbgrader's rules.

    Args:
        executed: the prepared submission after execution.
        master: the master notebook (:func:`master_notebook`), for the list of grade cells.
        stopped: why execution stopped early, if it did (cells that did not run get 0 and this reason).
        judged: split mode: the grader's verdict on each test cell that ran (``None`` when its recordings
            pass, else a :class:`~attention_course.grading.split.Verdict`). A test cell then passes when it
            ran without error or stderr output, as nbgrader requires, *and* its verdict passes; what its
            outputs show cannot earn points.
        gave_up_after: the index of the cell after which execution gave up replacing dead kernels, if it did.

    Returns:
        One :class:`CellResult` per grade cell of the assignment, in the source notebook's order.
    """
    cells = {
        _grade_id(cell): (index, cell) for index, cell in enumerate(executed.cells) if utils.is_grade(cell)
    }
    results = []
    for source in master.cells:
        if not utils.is_grade(source):
            continue
        grade_id = _grade_id(source)
        max_points = float(source.metadata.nbgrader["points"])
        kind = "manual" if utils.is_solution(source) else "auto"
        if grade_id not in cells:
            results.append(CellResult(grade_id, kind, 0.0, max_points, "not run", "the cell is missing"))
            continue
        index, cell = cells[grade_id]
        auto_score, _ = utils.determine_grade(cell)
        if kind == "manual":
            status = "no response" if auto_score == 0 else "manual"
            message = "the answer was left blank" if auto_score == 0 else "to be graded by hand"
            results.append(CellResult(grade_id, kind, auto_score, max_points, status, message))
            continue
        ran = cell.get("execution_count") is not None or bool(cell.get("outputs"))
        if not ran:
            if gave_up_after is not None and index > gave_up_after:
                reason = "grading stopped after the kernel had to be replaced too often"
            else:
                reason = stopped or "the cell did not run"
            results.append(CellResult(grade_id, kind, 0.0, max_points, "not run", reason))
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        stderr = [o for o in cell.outputs if o.output_type == "stream" and o.name == "stderr"]
        if errors and errors[0].get("ename") in ("CellTimeoutError", "KeyboardInterrupt"):
            status = "timeout"
            message = "the cell ran past its time limit and was interrupted: " + _error_text(errors[-1])
        elif errors:
            status = "failed"
            message = _explain_name_error(_error_text(errors[0]), executed, master)
        elif stderr:
            status = "stderr"
            first = _ANSI.sub("", stderr[0].text).strip().splitlines()
            message = "the cell wrote to stderr, which nbgrader scores as a failure: " + (
                first[0] if first else ""
            )
        else:
            status, message = "passed", ""
        part, cause, raised = "", "", False
        if judged is not None:  # split mode: the recordings decide, on top of a clean run
            verdict = judged.get(grade_id, "the cell's check did not run")
            if status == "passed" and isinstance(verdict, str):
                status, message = "failed", verdict
            elif status == "passed" and verdict is not None:
                failure = verdict.failure
                status, message = "failed", f"CheckFailure: {failure}"
                part, cause, raised = verdict.part, failure.cause, failure.raised
            auto_score = max_points if status == "passed" else 0.0
        elif status != "passed" and auto_score:
            status = "passed"  # a partial-credit output; nbgrader's rule wins
        points = float(auto_score or 0.0)
        results.append(CellResult(grade_id, kind, points, max_points, status, message, part, cause, raised))
    return results
