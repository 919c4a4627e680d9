"""Split mode in the learner's kernel: call the learner's function on the grader's inputs, record outcomes.

``attention-grade`` writes, for every behaviour and part, the calls' arguments to ``inputs/<name>.<part>``
(JSON, and the tensors in safetensors) and starts the kernel with :func:`start` as its first line, before
any cell. A test cell's ``checks.sdpa_mask(fn)`` then does not judge: it reads its inputs, calls ``fn`` on
each (:func:`~attention_course.checks.engine.execute`), and writes what came back to
``recordings/incoming/``. The grader seals what a test cell wrote when the cell ends
(:mod:`~attention_course.grading.seals`: the kernel holds no secret), and the grader reads it back
(:mod:`attention_course.grading.split`): JSON and safetensors only, never a pickle, bounded, validated
field by field. The format and the kernel's side live here together, so that they cannot drift apart.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from attention_course.checks import engine
from attention_course.checks.engine import Call, Foreign, Outcome, Seeded, execute, inspect_learner
from attention_course.grading.seals import MAX_BYTES, incoming

FORMAT = 2  # 2: the tensors packed into one flat tensor per dtype (:func:`save`)
MAX_ELEMENTS = 2**22  # elements of one recorded tensor; a larger one is recorded as its shape only
MAX_TENSORS = 2**16  # tensors of one recording
MAX_ITEMS = 256  # items of a recorded tuple or list, and of the calls an outcome lists
_NAMES = "float64 float32 float16 bfloat16 bool uint8 int8 int16 int32 int64"
DTYPES = {name: getattr(torch, name) for name in _NAMES.split()}  # the dtypes a recording may hold


class RecordingError(Exception):
    """A recording or an input file is missing, was not written by the course, or does not decode."""


def encode(value: Any, tensors: dict[str, torch.Tensor], depth: int = 0) -> Any:
    """A JSON node for ``value``; its tensors go into ``tensors`` (on the CPU) under fresh names."""
    if value is None or isinstance(value, bool | int | float | str):
        return value[:4000] if isinstance(value, str) else float(value) if isinstance(value, float) else value
    if isinstance(value, torch.Tensor):
        node = {"tensor": None, "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
        node["device"] = str(value.device)
        if node["dtype"] not in DTYPES:
            return {"foreign": "Tensor", "repr": f"a {node['dtype']} tensor of shape {node['shape']}"}
        if value.device.type != "meta" and value.numel() <= MAX_ELEMENTS:
            node["tensor"] = f"t{len(tensors)}"
            tensors[node["tensor"]] = value.detach().cpu()  # copied when saved (:func:`save`)
        return node
    if isinstance(value, Seeded):
        return {"generator": value.seed}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, tuple | list) and len(value) <= MAX_ITEMS and depth < 8:
        kind = "tuple" if isinstance(value, tuple) else "list"  # named tuples and return types too
        return {kind: [encode(item, tensors, depth + 1) for item in value]}
    return {"foreign": type(value).__name__, "repr": repr(value)[:200]}


def decode(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The value of a node made by :func:`encode`; :class:`RecordingError` on anything else."""
    if node is None or isinstance(node, bool | int | float | str):
        return node
    if not isinstance(node, dict):
        raise RecordingError(f"unexpected node {str(node)[:80]}")
    if "tensor" in node:
        dtype, shape = DTYPES.get(node.get("dtype")), node.get("shape")
        if dtype is None or not isinstance(shape, list) or len(shape) > 16:
            raise RecordingError("a recorded tensor has no valid dtype or shape")
        if not all(isinstance(size, int) and size >= 0 for size in shape):
            raise RecordingError("a recorded tensor has no valid shape")
        if node["tensor"] is None:  # on the meta device, or too large to record: its shape only
            return torch.empty(shape, dtype=dtype, device="meta")
        tensor = tensors.get(node["tensor"]) if isinstance(node["tensor"], str) else None
        if tensor is None or list(tensor.shape) != shape or tensor.dtype != dtype:
            raise RecordingError("a recorded tensor does not match its description")
        return tensor.to(device(node.get("device")))
    if isinstance(node.get("generator"), int):
        return Seeded(node["generator"])
    if isinstance(node.get("device"), str):
        return device(node["device"])
    for kind, container in (("tuple", tuple), ("list", list)):
        if isinstance(node.get(kind), list) and len(node[kind]) <= MAX_ITEMS:
            return container(decode(item, tensors) for item in node[kind])
    if isinstance(node.get("foreign"), str) and isinstance(node.get("repr"), str):
        return Foreign(node["foreign"][:80], node["repr"][:200])
    raise RecordingError(f"unexpected node {str(node)[:80]}")


def device(name: Any) -> torch.device:
    """The device ``name`` (``cpu``, ``cuda:0``, ``meta``), if it exists here."""
    try:
        found = torch.device(str(name))
        torch.empty(0, device=found)
    except (RuntimeError, AssertionError) as error:
        raise RecordingError(f"a recorded tensor is on an unknown device {str(name)[:40]!r}") from error
    return found


def _pack(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, list]]:
    """The tensors as one flat tensor per dtype, and where each lies in it: ``{name: [dtype, offset,
    shape]}``. safetensors pays tens of microseconds per tensor; a recording holds dozens of small ones."""
    flats: dict[str, list[torch.Tensor]] = {}
    sizes: dict[str, int] = {}
    index: dict[str, list] = {}
    for name, tensor in tensors.items():
        dtype = str(tensor.dtype).removeprefix("torch.")
        flats.setdefault(dtype, []).append(tensor.reshape(-1))
        index[name] = [dtype, sizes.get(dtype, 0), list(tensor.shape)]
        sizes[dtype] = sizes.get(dtype, 0) + tensor.numel()
    return {dtype: torch.cat(parts) for dtype, parts in flats.items()}, index


def _unpack(flats: dict[str, torch.Tensor], index: Any) -> dict[str, torch.Tensor]:
    """The tensors that :func:`_pack` packed; :class:`RecordingError` if the index does not fit the data."""
    if not isinstance(index, dict) or len(index) > MAX_TENSORS:
        raise RecordingError("the recording's tensor index is not valid")
    tensors = {}
    for name, entry in index.items():
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], list)):
            raise RecordingError("the recording's tensor index is not valid")
        dtype, offset, shape = entry
        flat = flats.get(dtype) if isinstance(dtype, str) else None
        valid = all(isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in shape)
        valid = valid and len(shape) <= 16 and isinstance(offset, int) and not isinstance(offset, bool)
        if flat is None or flat.dim() != 1 or not valid or offset < 0:
            raise RecordingError("the recording's tensor index is not valid")
        count = math.prod(shape)
        if offset + count > flat.numel():
            raise RecordingError("the recording's tensor index points past its data")
        tensors[name] = flat[offset : offset + count].reshape(shape)
    return tensors


def save(path: Path, content: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Write ``path.safetensors`` (the tensors, packed by :func:`_pack`) and ``path.json`` (``content``, where
    each tensor lies, and the tensors' digest); never overwrite a file."""
    flats, index = _pack(tensors)
    blob = safetensors.torch.save(flats)
    body = json.dumps({**content, "tensors": index, "tensors_sha256": hashlib.sha256(blob).hexdigest()})
    body = body.encode()
    for suffix, data in ((".safetensors", blob), (".json", body)):
        with open(f"{path}{suffix}", "xb") as handle:  # "x": a second recording of one part fails loudly
            handle.write(data)


def load(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read what :func:`save` wrote, checking its size and the tensors' digest (nothing is unpickled)."""
    files = [Path(f"{path}.json"), Path(f"{path}.safetensors")]
    if not all(file.is_file() for file in files):
        raise RecordingError("no recording was made")
    if sum(file.stat().st_size for file in files) > MAX_BYTES:
        raise RecordingError(f"the recording is larger than {MAX_BYTES // 2**20} MiB")
    body, blob = files[0].read_bytes(), files[1].read_bytes()
    try:
        content, flats = json.loads(body), safetensors.torch.load(blob)
    except (ValueError, safetensors.SafetensorError) as error:
        raise RecordingError(f"the recording does not decode: {error}") from error
    if not isinstance(content, dict) or content.get("tensors_sha256") != hashlib.sha256(blob).hexdigest():
        raise RecordingError("the recording's tensors are not the ones it was made with")
    return content, _unpack(flats, content.get("tensors"))


def write_calls(folder: Path, name: str, calls: Sequence[Call]) -> None:
    """Write the arguments of ``calls`` to ``folder/<name>.json`` and ``.safetensors`` (the grader)."""
    tensors: dict[str, torch.Tensor] = {}
    nodes = [
        {"arguments": encode(list(c.arguments.values()), tensors), "positional": c.positional} for c in calls
    ]
    names = [list(call.arguments) for call in calls]
    folder.mkdir(parents=True, exist_ok=True)
    save(
        folder / name,
        {"function": calls[0].function if calls else "", "calls": nodes, "names": names},
        tensors,
    )


def read_calls(folder: Path, name: str) -> list[Call]:
    """The calls written by :func:`write_calls` (the kernel; their labels, for messages, are left out)."""
    content, tensors = load(folder / name)
    return [
        Call(
            content["function"],
            dict(zip(names, decode(node["arguments"], tensors), strict=True)),
            node["positional"],
        )
        for node, names in zip(content["calls"], content["names"], strict=True)
    ]


class _NoSolutions(importlib.abc.MetaPathFinder):
    """Refuses to import the reference solutions in a kernel that records for the grader."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == "solutions" or fullname.startswith("solutions."):
            raise ImportError("the reference solutions are not available to a notebook being graded")


class Recorder:
    """The runner (:class:`~attention_course.checks.engine.Runner`) of the test cells of a kernel that
    ``attention-grade`` started: it records the calls, and the grader's process judges them."""

    def __init__(self, folder: Path, generation: int) -> None:
        self.folder, self.generation = folder, generation
        self._busy, self._nested = False, False

    def run(self, behaviour: Any, fn: Any, *, hidden: bool, reference: Any = None) -> None:
        """Call ``fn`` on the inputs of ``behaviour``'s part and write what came back to the incoming folder
        (``reference``: ignored, the grader's process holds it)."""
        part = "hidden" if hidden else "visible"
        if self._busy:  # a check called from inside the learner's function: the outer recording says so
            self._nested = True
            return
        self._busy, self._nested = True, False
        try:
            calls = read_calls(self.folder / "inputs", f"{behaviour.name}.{part}")
            learner = inspect_learner(fn)
            outcomes = (
                [execute(fn, call, seed, behaviour.driver) for seed, call in enumerate(calls)]
                if learner.is_callable
                else []
            )
        finally:
            self._busy = False
        tensors: dict[str, torch.Tensor] = {}
        content = {
            "format": FORMAT,
            "behaviour": behaviour.name,
            "part": part,
            "generation": self.generation,
            "nested": self._nested,
            "learner": vars(learner),
            "outcomes": [encode_outcome(outcome, tensors) for outcome in outcomes],
        }
        incoming(self.folder).mkdir(parents=True, exist_ok=True)
        save(incoming(self.folder) / f"{behaviour.name}-{part}", content, tensors)


def start(folder: str, generation: int = 0) -> None:
    """Make this kernel record for the grader: the first line the kernel runs, before any cell.

    Refuses imports of the reference solutions from now on, and leaves ``started-<generation>``, by which
    the grader knows that recording is on.
    """
    session = Path(folder)
    sys.meta_path.insert(0, _NoSolutions())
    for name in [name for name in sys.modules if name == "solutions" or name.startswith("solutions.")]:
        del sys.modules[name]
    engine.RUNNER.set(Recorder(session, generation))
    (session / f"started-{generation}").touch()


def encode_outcome(outcome: Outcome, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A JSON node for ``outcome`` (the kernel)."""
    return {
        **vars(outcome),
        "value": encode(outcome.value, tensors),
        "message": outcome.message[:4000],
        "after": {name: encode(value, tensors) for name, value in outcome.after.items()},
        "calls": [list(call) for call in outcome.calls[:MAX_ITEMS]],
        "warnings": list(outcome.warnings[:8]),
    }


def decode_outcome(node: Any, tensors: dict[str, torch.Tensor]) -> Outcome:
    """An outcome from a recording (the grader), every field checked."""

    def text(value: Any, limit: int) -> str:
        if not isinstance(value, str):
            raise RecordingError("a recorded text is not a string")
        return value[:limit]

    if (
        not isinstance(node, dict)
        or not isinstance(node.get("calls"), list)
        or not isinstance(node.get("after"), dict)
    ):
        raise RecordingError("a recorded outcome is not valid")
    calls = [c for c in node["calls"][:MAX_ITEMS] if isinstance(c, list) and len(c) == 2]
    return Outcome(
        decode(node.get("value"), tensors),
        text(node.get("raised"), 200),
        text(node.get("message"), 4000),
        node.get("not_implemented") is True,
        {text(k, 80): decode(v, tensors) for k, v in list(node["after"].items())[:MAX_ITEMS]},
        tuple((text(module, 200), text(name, 200)) for module, name in calls),
        tuple(text(w, 4000) for w in node.get("warnings", [])[:8]),
        node.get("observed") is True,
        text(node.get("line", ""), 200),
    )
