"""Judging outside the learner's process: the grader's half of split mode.

Before a submission's kernel starts, :func:`make_plans` builds every behaviour's checks (visible and
hidden, with the reference) and :func:`write_inputs` writes their calls' arguments where the kernel reads
them. After the kernel stops, :func:`judge_cell` reads what a test cell recorded (:func:`read_recording`:
sealed by the grader, bounded, validated, never unpickled) and runs the judges that a test cell runs in
one process. Nothing here runs learner code.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attention_course.checks import engine
from attention_course.checks.engine import Behaviour, Check, CheckFailure, Learner, Outcome
from attention_course.grading import seals
from attention_course.grading.recorder import FORMAT, RecordingError, decode_outcome, load, write_calls
from attention_course.registry import Assignment

PARTS = ("visible", "hidden")


@dataclass(frozen=True)
class Plans:
    """Every behaviour's checks, per part, for one assignment: made once, used for every submission."""

    assignment: Assignment
    behaviours: dict[str, Behaviour]
    checks: dict[tuple[str, str], list[Check]]  # (behaviour name, part) -> checks


def reference_module(assignment: Assignment, root: Path) -> Any:
    """The reference module, from the course directory ``root`` when it holds ``solutions/``."""
    if (root / "solutions" / "__init__.py").is_file() and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(assignment.reference)


def make_plans(assignment: Assignment, reference: Any = None) -> Plans:
    """Build the checks of every behaviour of ``assignment`` (``reference``: its reference module)."""
    reference = reference or importlib.import_module(assignment.reference)
    behaviours = {behaviour.name: behaviour for behaviour in engine.behaviours(assignment)}
    checks = {}
    for name, behaviour in behaviours.items():
        for part in PARTS:
            solution = getattr(reference, behaviour.function) if part == "hidden" else None
            checks[(name, part)] = behaviour.checks(
                behaviour.part(hidden=part == "hidden", reference=solution)
            )
    return Plans(assignment, behaviours, checks)


def write_inputs(plans: Plans, folder: Path, names: set[str] | None = None) -> None:
    """Write the calls' arguments to ``folder/<behaviour>.<part>.{json,safetensors}`` (``names``: those)."""
    for (name, part), checks in plans.checks.items():
        if names is None or name in names:
            write_calls(folder, f"{name}.{part}", [call for check in checks for call in check.calls])


def read_recording(
    session: Path, key: bytes, *, cell: int, name: str, part: str
) -> tuple[Learner, list[Outcome]]:
    """The learner's function and the outcomes that test cell ``cell`` recorded for ``part``, verified.

    Raises:
        RecordingError: if the recording is missing, not sealed for this cell, too large,
            made while a check ran inside the learner's function, or does not decode.
    """
    stem = f"{cell}-{name}-{part}"
    if seals.sealed(session, stem, key) is None:
        made = (session / "recordings" / f"{stem}.json").is_file()
        raise RecordingError(
            "its seal is wrong: it was changed after the cell ran" if made else "no recording was made"
        )
    content, tensors = load(session / "recordings" / stem)
    if any(content.get(k) != v for k, v in {"format": FORMAT, "behaviour": name, "part": part}.items()):
        raise RecordingError("the recording was made for another check")
    if content.get("nested") is not False:
        raise RecordingError("a check was called from inside the learner's function while it was recorded")
    fields, outcomes = content.get("learner"), content.get("outcomes")
    if not isinstance(fields, dict) or not isinstance(outcomes, list):
        raise RecordingError("the recording has no valid learner or outcomes")
    texts = {field: str(fields.get(field, ""))[:200] for field in ("shown", "module", "name", "fingerprint")}
    is_callable, has_source = fields.get("is_callable") is True, fields.get("has_source") is not False
    learner = Learner(**texts, is_callable=is_callable, has_source=has_source)
    return learner, [decode_outcome(node, tensors) for node in outcomes]


@dataclass(frozen=True)
class Verdict:
    """Why a test cell fails: the ``part`` whose check failed (``"visible"`` or ``"hidden"``) and the failure.

    Feedback for learners shows a visible part's failure as it is, and only what is general about a hidden
    part's (:mod:`~attention_course.grading.feedback`): the part is data, never read from a message.
    """

    part: str
    failure: CheckFailure


def judge_parts(plans: Plans, name: str, session: Path, key: bytes, *, cell: int) -> Verdict | None:
    """The verdict on test cell ``cell`` from its recordings: ``None`` if it passes, else which part failed
    and how.

    The visible part is judged first, then the hidden part, as a test cell runs them.

    Everything in a recording comes from the learner's kernel, so nothing in it may stop the grader: a
    recording that does not decode (JSON nested thousands deep included) or that the judge cannot compare
    (a tensor on the ``meta`` device, which has a shape and no values) fails its cell with a message saying
    so, never the batch with a "grader error".
    """
    behaviour = plans.behaviours[name]
    for part in PARTS:
        try:
            learner, outcomes = read_recording(session, key, cell=cell, name=name, part=part)
        except RecordingError as error:
            return Verdict(part, CheckFailure(f"the {part} part of {name} could not be judged: {error}."))
        except (RecursionError, MemoryError, ValueError, TypeError, KeyError, IndexError) as error:
            why = f"the recording does not decode ({type(error).__name__})"
            return Verdict(part, CheckFailure(f"the {part} part of {name} could not be judged: {why}."))
        try:
            behaviour.judge(plans.checks[(name, part)], learner, outcomes)
        except CheckFailure as failure:
            return Verdict(part, failure)
        except Exception as error:  # the judge met a value it cannot compare
            return Verdict(part, CheckFailure(_not_comparable(name, part, outcomes, error)))
    return None


def _not_comparable(name: str, part: str, outcomes: list[Outcome], error: Exception) -> str:
    """The message of a cell whose recorded results the judge could not compare."""
    if any(_holds_meta_tensor(outcome) for outcome in outcomes):
        why = "the function returned a tensor on the meta device, which has a shape but no values"
    else:
        why = f"its results could not be compared with the reference ({type(error).__name__})"
    return f"the {part} part of {name} could not be judged: {why}."


def _holds_meta_tensor(value: Any, depth: int = 0) -> bool:
    if isinstance(value, torch.Tensor):
        return value.device.type == "meta"
    if depth > 20:
        return False
    if isinstance(value, dict):
        return any(_holds_meta_tensor(item, depth + 1) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_meta_tensor(item, depth + 1) for item in value)
    if hasattr(value, "__dataclass_fields__"):
        return any(_holds_meta_tensor(getattr(value, f), depth + 1) for f in value.__dataclass_fields__)
    return False


def judge_cell(plans: Plans, name: str, session: Path, key: bytes, *, cell: int) -> CheckFailure | None:
    """The failure of test cell ``cell`` (:func:`judge_parts` without the part): ``None`` if it passes."""
    verdict = judge_parts(plans, name, session, key, cell=cell)
    return None if verdict is None else verdict.failure
