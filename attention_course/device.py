"""Where code runs: the device is chosen once, at the edge (chapter, check runner, CLI).

Library and reference code never choose a device: their outputs follow their inputs.
"""

from __future__ import annotations

import os

import torch

DEVICE_VARIABLE = "ATTENTION_COURSE_DEVICE"


def default_device() -> torch.device:
    """The device that chapters and checks use: CUDA when available, else the CPU.

    Set the environment variable ``ATTENTION_COURSE_DEVICE`` (for example to ``cpu``) to choose
    another one, say to grade on the CPU of a machine that has a GPU.

    Returns:
        A ``torch.device``.

    Raises:
        RuntimeError: if ``ATTENTION_COURSE_DEVICE`` names a device that torch does not know.
    """
    name = os.environ.get(DEVICE_VARIABLE, "").strip()
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


#: what CUDA's sticky errors say when an older torch raises them as a plain ``RuntimeError`` (newer ones raise
#: ``torch.AcceleratorError``): after one, every later CUDA call of the process fails
_STICKY_ERRORS = ("CUDA error", "device-side assert triggered", "illegal memory access")


def is_accelerator_fault(name: str, message: str) -> bool:
    """Whether an exception (its type's ``name`` and its ``message``) is an accelerator's error that can leave
    the process's device context unusable, like a CUDA device-side assert (an index out of range in a kernel).

    PyTorch reports these as ``torch.AcceleratorError`` (a ``RuntimeError``), older releases as a
    ``RuntimeError`` whose message starts with "CUDA error"; see "CUDA semantics: asynchronous execution" in
    PyTorch's documentation. Only a new process gets a working device again: the grader replaces the kernel.
    """
    if name == "AcceleratorError":
        return True
    return name == "RuntimeError" and any(text in message for text in _STICKY_ERRORS)


def seeded_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed``, so that draws do not touch global state."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator
