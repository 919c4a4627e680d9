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
_STICKY_ERRORS = (
    "CUDA error",
    "device-side assert triggered",
    "illegal memory access",
)


def is_accelerator_fault(name: str, message: str) -> bool:
    """Whether an exception (its type's ``name`` and its ``message``) is an accelerator's error that can leave
    the process's device context unusable, like a CUDA device-side assert (an index out of range in a kernel).

    PyTorch reports these as ``torch.AcceleratorError`` (a ``RuntimeError``), older releases as a
    ``RuntimeError`` whose message starts with "CUDA error"; see "CUDA semantics: asynchronous execution" in
    PyTorch's documentation. Only a new process gets a working device again: the grader replaces the kernel.
    """
    if name == "AcceleratorError":
        return True
    return name == "RuntimeError" and any(
        text in message for text in _STICKY_ERRORS
    )


def make_reproducible(threads: int = 1) -> None:
    """Make the numbers of a chapter that trains or times models the same on every machine and under any load.

    What changes a trained model's weights between two runs of the same seeded code is the order in which
    floating-point sums are added up, and that order depends on how many threads split each product and on
    which algorithm a kernel picks. This fixes both, once, at the top of a chapter:

    - torch's intra-op thread count (``torch.set_num_threads``), whatever ``OMP_NUM_THREADS`` and the number
      of cores are: the course's models are small, and one thread is about as fast as several on them, and
      steadier on a busy machine;
    - deterministic algorithms (``torch.use_deterministic_algorithms``), with cuBLAS's workspace set as
      PyTorch's "Reproducibility" notes require on CUDA, and cuDNN's benchmark mode off.

    Seeds are not set here: each chapter seeds its own generators where it draws, so that a reader sees which
    draws a result depends on. Results can still differ across processor families (a vectorised kernel adds in
    another order), so assertions about trained models keep a measured margin.

    Args:
        threads: the number of intra-op threads, at least 1.

    Raises:
        ValueError: if ``threads`` is less than 1.
    """
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    # read when cuBLAS is first initialised: set before any
    # CUDA work of the process
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def seeded_generator(
    seed: int, device: torch.device | str = "cpu"
) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed``, so that draws do not touch global state."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator
