"""Judging outside the learner's process: the grader's half of split mode.

Before a submission's kernel starts, :func:`make_plans` builds every behaviour's checks (visible and
hidden, with the reference) and :func:`write_inputs` writes their calls' arguments where the kernel reads
them. After the kernel stops, :func:`judge_cell` reads what a test cell recorded (:func:`read_recording`:
signed, bounded, validated, never unpickled) and runs the judges that a test cell runs in one process.
Nothing here runs learner code.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attention_course.checks.engine import Behaviour, Check, CheckFailure, Learner, Outcome
from attention_course.grading.recorder import FORMAT, RecordingError, decode_outcome, load, write_calls
from attention_course.registry import Assignment

PARTS = ("visible", "hidden")


@dataclass(frozen=True)
class Plans:
    """Every behaviour's checks, per part, for one assignment: made once, used for every submission."""

    assignment: Assignment
    behaviours: dict[str, Behaviour]
    checks: dict[tuple[str, str], list[Check]]  # (behaviour name, part) -> checks


def make_plans(assignment: Assignment, reference: Any = None) -> Plans:
    """Build the checks of every behaviour of ``assignment`` (``reference``: its reference module)."""
    reference = reference or importlib.import_module(assignment.reference)
    behaviours = {behaviour.name: behaviour for behaviour in assignment.behaviours()}
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
    session: Path, key: bytes, *, generation: int, execution_count: int, name: str, part: str
) -> tuple[Learner, list[Outcome]]:
    """The learner's function and the outcomes that one test cell recorded for ``part``, verified.

    Raises:
        RecordingError: if the recording is missing, too large, not signed with ``key``, made by another
            cell or kernel, made while a check ran inside the learner's function, or does not decode.
    """
    stem = f"g{generation}-n{execution_count}-{name}-{part}"
    content, tensors = load(session / "recordings" / stem, key)
    expected = {"format": FORMAT, "behaviour": name, "part": part, "generation": generation}
    if (
        any(content.get(k) != v for k, v in expected.items())
        or content.get("execution_count") != execution_count
    ):
        raise RecordingError("the recording was made for another cell")
    if content.get("nested") is not False:
        raise RecordingError("a check was called from inside the learner's function while it was recorded")
    fields, outcomes = content.get("learner"), content.get("outcomes")
    if not isinstance(fields, dict) or not isinstance(outcomes, list):
        raise RecordingError("the recording has no valid learner or outcomes")
    texts = {name: str(fields.get(name, ""))[:200] for name in ("shown", "module", "name", "fingerprint")}
    learner = Learner(
        **texts,
        is_callable=fields.get("is_callable") is True,
        has_source=fields.get("has_source") is not False,
    )
    return learner, [decode_outcome(node, tensors) for node in outcomes]


def judge_cell(
    plans: Plans, name: str, session: Path, key: bytes, *, generation: int, execution_count: int
) -> CheckFailure | None:
    """The verdict on one test cell from its recordings: ``None`` if it passes, else the failure.

    The visible part is judged first, then the hidden part, as a test cell runs them.
    """
    behaviour = plans.behaviours[name]
    for part in PARTS:
        try:
            learner, outcomes = read_recording(
                session, key, generation=generation, execution_count=execution_count, name=name, part=part
            )
        except RecordingError as error:
            return CheckFailure(f"the {part} part of {name} could not be judged: {error}.")
        try:
            behaviour.judge(plans.checks[(name, part)], learner, outcomes)
        except CheckFailure as failure:
            return failure
    return None
