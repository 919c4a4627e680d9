"""The grading options that ``attention-grade`` and ``pytest --grade`` share, declared once.

:class:`Mode` says how test cells are judged; every field of :class:`Limits` (a submission's resources) is
an option by its name (its ``flag`` metadata), with its default and help: ``--cell-timeout`` on the command
line, ``--grade-cell-timeout`` in pytest. Both front ends add the options with :func:`add_options` and read
them back with :func:`mode_of` and :func:`limits_of`, so that a new limit is an option everywhere at once.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Mode(enum.StrEnum):
    """How a submission's test cells are judged (the value is what reports and result files say)."""

    SPLIT = "split"  # the kernel records the learner's calls; this process judges the recordings
    TOGETHER = "together"  # the kernel judges, as nbgrader does: its hidden tests import the solutions

    @property
    def judged_here(self) -> bool:
        """Whether the grader's own process judges the test cells (and reviews the code it cannot observe)."""
        return self is Mode.SPLIT

    @property
    def shows_solutions(self) -> bool:
        """Whether kernels may import the reference solutions (read-only): hidden tests run in them."""
        return self is Mode.TOGETHER


@dataclass(frozen=True)
class Limits:
    """Resource limits of one submission.

    Attributes:
        cell_timeout: seconds one cell may run before it is interrupted (nbgrader's ``Execute.timeout``).
        timeout: seconds the whole submission may take, kernel start included.
        memory_mib: memory the kernel may allocate beyond what it starts with (``RLIMIT_DATA``), in MiB;
            0 for no limit.
        processes: processes and threads the kernel may have at once beyond its own (``RLIMIT_NPROC`` in
            the slot's user namespace): a fork bomb fails with ``BlockingIOError``.
        file_mib: the largest file the kernel may write, in MiB (``RLIMIT_FSIZE``).
        output_mib: text a cell may print before the rest is cut (the notebook stays small).
    """

    # each field is a command-line option of attention-grade (--<flag>) and of pytest --grade (--grade-<flag>)
    cell_timeout: int = field(
        default=30, metadata={"flag": "cell-timeout", "unit": "SECONDS", "help": "seconds per cell"}
    )
    timeout: int = field(
        default=300, metadata={"flag": "timeout", "unit": "SECONDS", "help": "seconds per submission"}
    )
    memory_mib: int = field(
        default=4096, metadata={"flag": "memory", "unit": "MIB", "help": "MiB per submission (0: no limit)"}
    )
    processes: int = field(
        default=64,
        metadata={"flag": "processes", "unit": "N", "help": "processes and threads per submission"},
    )
    file_mib: int = field(
        default=256,
        metadata={"flag": "file-size", "unit": "MIB", "help": "the largest file a submission may write"},
    )
    output_mib: int = field(
        default=1,
        metadata={"flag": "output-size", "unit": "MIB", "help": "text a cell may print before it is cut"},
    )


MODE_HELP = "split (default): test cells judged in this process; together: in the kernel, as nbgrader"


def add_options(add: Callable[..., Any], prefix: str = "") -> None:
    """Add ``--<prefix>mode`` and one ``--<prefix><flag>`` per limit with ``add`` (``argparse``'s
    ``add_argument`` or pytest's ``addoption``)."""
    add(f"--{prefix}mode", choices=[mode.value for mode in Mode], default=Mode.SPLIT.value, help=MODE_HELP)
    for limit in dataclasses.fields(Limits):
        add(
            f"--{prefix}{limit.metadata['flag']}",
            type=int,
            default=limit.default,
            metavar=limit.metadata["unit"],
            dest=_dest(prefix, limit),
            help=limit.metadata["help"],
        )


def mode_of(get: Callable[[str], Any], prefix: str = "") -> Mode:
    """The mode that ``get`` (a name → value lookup of the parsed options) holds."""
    return Mode(get(f"{prefix}mode".replace("-", "_")))


def limits_of(get: Callable[[str], Any], prefix: str = "") -> Limits:
    """The limits that ``get`` holds, each field by its name."""
    return Limits(**{limit.name: get(_dest(prefix, limit)) for limit in dataclasses.fields(Limits)})


def _dest(prefix: str, limit: dataclasses.Field) -> str:
    return f"{prefix}{limit.metadata['flag']}".replace("-", "_")
