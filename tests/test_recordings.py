"""Recordings on disk (:mod:`attention_course.grading.recorder`): what the kernel saves is what the grader
loads, and a recording whose tensor index was forged is refused with a ``RecordingError``, never a crash."""

from __future__ import annotations

import hashlib
import json

import pytest
import safetensors.torch
import torch

from attention_course.grading import recorder
from attention_course.grading.recorder import RecordingError


def _tensors() -> dict[str, torch.Tensor]:
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    return {
        "matrix": base,
        "transposed": base.T,  # not contiguous
        "again": base,  # the same tensor under two names
        "scalar": torch.tensor(2.5, dtype=torch.float32),
        "empty": torch.zeros(0, 5),
        "mask": torch.tensor([[True, False], [False, True]]),
        "half": torch.linspace(-1, 1, 6, dtype=torch.bfloat16).reshape(2, 3),
        "index": torch.tensor([3, 1, 2]),
    }


def test_what_is_saved_is_loaded(tmp_path):
    tensors = _tensors()
    recorder.save(tmp_path / "r", {"behaviour": "b"}, tensors)
    content, loaded = recorder.load(tmp_path / "r")
    assert content["behaviour"] == "b"
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and loaded[name].shape == tensor.shape, name
        assert torch.equal(loaded[name], tensor), name


def test_a_recording_is_never_overwritten(tmp_path):
    recorder.save(tmp_path / "r", {}, {"x": torch.ones(2)})
    with pytest.raises(FileExistsError):
        recorder.save(tmp_path / "r", {}, {"x": torch.zeros(2)})


def _forge(tmp_path, index, flats=None):
    """A recording with a consistent digest but the tensor index ``index``."""
    blob = safetensors.torch.save(
        flats if flats is not None else {"float64": torch.zeros(6, dtype=torch.float64)}
    )
    body = {"tensors": index, "tensors_sha256": hashlib.sha256(blob).hexdigest()}
    (tmp_path / "r.safetensors").write_bytes(blob)
    (tmp_path / "r.json").write_text(json.dumps(body))
    return tmp_path / "r"


@pytest.mark.parametrize(
    "index",
    [
        {"x": ["float64", 4, [2, 2]]},  # past the data
        {"x": ["float64", -1, [1]]},
        {"x": ["float64", True, [1]]},
        {"x": ["float64", 0.5, [1]]},
        {"x": ["float64", 0, [1.5]]},
        {"x": ["float64", 0, [-1]]},
        {"x": ["float64", 0, [1] * 17]},
        {"x": ["float32", 0, [2]]},  # no such data
        {"x": ["float64", 0]},
        {"x": "float64"},
        ["float64", 0, [2]],
        None,
    ],
    ids=repr,
)
def test_a_forged_tensor_index_is_refused(tmp_path, index):
    with pytest.raises(RecordingError):
        recorder.load(_forge(tmp_path, index))


def test_packed_data_that_is_not_flat_is_refused(tmp_path):
    path = _forge(tmp_path, {"x": ["float64", 0, [2]]}, {"float64": torch.zeros(2, 3, dtype=torch.float64)})
    with pytest.raises(RecordingError):
        recorder.load(path)


def test_a_changed_blob_is_refused(tmp_path):
    recorder.save(tmp_path / "r", {}, {"x": torch.ones(3)})
    forged = safetensors.torch.save({"float32": torch.zeros(3)})
    (tmp_path / "r.safetensors").write_bytes(forged)
    with pytest.raises(RecordingError, match="not the ones"):
        recorder.load(tmp_path / "r")


def _sealed_recording(session, key: bytes, stem: str, body: bytes) -> None:
    """A recording ``stem`` (``<cell>-<behaviour>-<part>``) with the JSON ``body``, sealed with ``key``."""
    from attention_course.grading import seals

    folder = session / "recordings"
    folder.mkdir(parents=True, exist_ok=True)
    blob = safetensors.torch.save({"float32": torch.zeros(1)})
    (folder / f"{stem}.safetensors").write_bytes(blob)
    (folder / f"{stem}.json").write_bytes(body)
    files = [folder / f"{stem}{suffix}" for suffix in seals.SUFFIXES]
    (folder / f"{stem}.seal").write_text(seals._seal(key, stem, files))


def test_a_recording_nested_deeper_than_python_fails_its_cell_not_the_grader(tmp_path):
    """JSON nested 50,000 deep makes ``json.loads`` raise RecursionError: the cell fails, saying so."""
    from attention_course.grading import split
    from attention_course.registry import ASSIGNMENTS

    plans = split.make_plans(ASSIGNMENTS["ex02_scaled_dot_product"])
    key = b"k" * 32
    name = "softmax_sums_to_one"
    _sealed_recording(tmp_path, key, f"3-{name}-visible", b"[" * 50_000 + b"]" * 50_000)
    verdict = split.judge_parts(plans, name, tmp_path, key, cell=3)
    assert verdict is not None and verdict.part == "visible"
    assert "does not decode (RecursionError)" in verdict.failure.message
