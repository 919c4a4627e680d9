"""Seals on recordings: the grader vouches for what a test cell recorded, and checks it when it judges.

The learner's kernel writes a test cell's recordings to ``recordings/incoming/``; it holds no secret. The
grader, which drives the kernel and runs no learner code, clears that folder when any cell starts and, when a
test cell ends, moves what the cell wrote to ``recordings/<cell index>-<name>`` with a ``.seal``: an
HMAC-SHA256, under a key that only the grader knows, of the new name and the files' digests. So a recording
that the learner's code writes at any other time, or edits later, is rejected, and a recording made by one
cell cannot pass for another's. After the last cell every process of the sandbox is killed and the
recordings are moved out of its reach before they are judged. This module imports nothing heavy (no torch).

What a seal cannot tell apart is a recording that code running *during* the test cell replaces before the
cell ends (a background thread racing the recorder); the sandbox confines such code to the submission's own
slot.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

SUFFIXES = (".json", ".safetensors")
MAX_BYTES = 64 * 2**20  # of one recording's files; a larger one is not sealed (the cell then fails)


def incoming(session: Path) -> Path:
    """Where the kernel's recorder writes while a cell runs."""
    return session / "recordings" / "incoming"


def clear(session: Path) -> None:
    """Delete whatever is waiting in the incoming folder (written outside a test cell)."""
    for file in incoming(session).glob("*"):
        file.unlink(missing_ok=True)


def _seal(key: bytes, name: str, files: list[Path]) -> str:
    digests = b"".join(hashlib.sha256(file.read_bytes()).digest() for file in files)
    return hmac.new(key, name.encode() + b"\n" + digests, hashlib.sha256).hexdigest()


def seal(session: Path, cell: int, key: bytes) -> None:
    """Move the recordings that test cell ``cell`` wrote to their sealed names, with their seals."""
    for json_file in sorted(incoming(session).glob("*.json")):
        files = [json_file.with_suffix(suffix) for suffix in SUFFIXES]
        if not all(f.is_file() for f in files) or sum(f.stat().st_size for f in files) > MAX_BYTES:
            continue
        name = f"{cell}-{json_file.stem}"
        sealed = [session / "recordings" / f"{name}{suffix}" for suffix in SUFFIXES]
        for source, target in zip(files, sealed, strict=True):
            os.replace(source, target)
        (session / "recordings" / f"{name}.seal").write_text(_seal(key, name, sealed))
    clear(session)


def sealed(session: Path, name: str, key: bytes) -> list[Path] | None:
    """The files of recording ``name`` (``<cell>-<behaviour>-<part>``) if its seal holds, else None."""
    files = [session / "recordings" / f"{name}{suffix}" for suffix in SUFFIXES]
    seal_file = session / "recordings" / f"{name}.seal"
    if not seal_file.is_file() or not all(f.is_file() for f in files):
        return None
    if sum(f.stat().st_size for f in files) > MAX_BYTES:
        return None
    return files if hmac.compare_digest(seal_file.read_text().strip(), _seal(key, name, files)) else None
