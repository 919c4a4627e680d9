"""Executing one prepared submission in a sandboxed kernel, as nbgrader's ``Execute`` preprocessor does.

:func:`execute` runs every code cell in a kernel forked by a sandbox slot
(:mod:`attention_course.grading.sandbox`), driven by nbclient with nbgrader's settings: errors do not stop
execution, a cell that runs past its time limit is interrupted and gets an error output. The whole
submission has a time limit too: each cell's limit is cut to what is left of it.

In split mode (``session``), every kernel starts with the recorder
(:func:`attention_course.grading.recorder.start`) as its first line, before any cell: test cells then record
what the learner's functions return instead of judging it, and this process seals what each test cell
recorded when it ends (:mod:`~attention_course.grading.seals`).

Where nbgrader gives up on the whole submission, this recovers: when a cell kills its kernel (a crash,
``os._exit``) or cannot be interrupted (a loop that ignores ``SIGINT``), the cell gets an error output, a new
kernel is forked, the definitions that ran before are replayed, and execution goes on with the next cell.
After ``max_restarts`` such recoveries it stops. A cell that ends with an accelerator's error (a CUDA
device-side assert, after which every CUDA call of the process fails) keeps its own error, and the cells
after it run in a new kernel too: on a GPU, one faulty function would otherwise fail every later cell,
which it does not on a CPU. What happened comes back as a typed record, :class:`Execution`.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import zmq
from jupyter_client.utils import ensure_async, run_sync
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode

from attention_course.device import is_accelerator_fault
from attention_course.grading import seals
from attention_course.grading.sandbox import Limits, SandboxError, Slot, kernel_manager

#: what nbgrader records for a cell that times out (nbgrader.preprocessors.Execute.error_on_timeout)
TIMEOUT_ERROR = {
    "ename": "CellTimeoutError",
    "evalue": "",
    "traceback": ["\x1b[0;31mCellTimeoutError\x1b[0m: No reply from kernel before timeout"],
}
#: how often a kernel client tries to connect to a kernel that has not bound its sockets yet (milliseconds)
RECONNECT_MS = 10
#: the reason of a kernel replaced because a cell left its GPU unusable (a CUDA device-side assert)
ACCELERATOR_FAULT = "AcceleratorError"
#: errors after which a cell is not replayed into a new kernel (it would only fail the same way again)
_UNREPLAYABLE = {"KeyboardInterrupt", "CellTimeoutError", "DeadKernelError"}


@dataclass(frozen=True)
class Restart:
    """A kernel replaced after cell ``cell`` killed it (``DeadKernelError``), could not be interrupted
    (``CellTimeoutError``) or left its GPU unusable (:data:`ACCELERATOR_FAULT`)."""

    cell: int
    reason: str


@dataclass
class Execution:
    """What happened when a submission ran.

    Attributes:
        notebook: the prepared notebook with the outputs of the cells that ran.
        restarts: kernels replaced, in order.
        gave_up_after: the cell after which no new kernel was started (too many restarts), if any.
        stopped: why execution stopped before the last cell (the submission's time limit), if it did.
        sandbox_lost: the sandbox's fork server died during the run (a submission that kills its parent).
        start_failed: no kernel could be started (three tries): the machine's fault, not the submission's.
    """

    notebook: NotebookNode
    restarts: list[Restart] = field(default_factory=list)
    gave_up_after: int | None = None
    stopped: str | None = None
    sandbox_lost: bool = False
    start_failed: bool = False


def _record_reply_error(cell: NotebookNode, reply: dict[str, Any]) -> None:
    """Add the reply's error to the cell's outputs if the kernel did not print it (a timeout), as nbgrader."""
    content = reply["content"]
    if content["status"] != "error":
        return
    if any(o.output_type == "error" and o.ename == content["ename"] for o in cell.outputs):
        return
    cell.outputs.append(
        nbformat.v4.new_output(
            "error",
            ename=content["ename"],
            evalue=content["evalue"],
            traceback=content["traceback"] or ["ERROR: An error occurred while showtraceback was disabled"],
        )
    )


def is_graded(cell: NotebookNode) -> bool:
    return bool(cell.metadata.get("nbgrader", {}).get("grade"))


def _replayable(cell: NotebookNode) -> bool:
    errors = {o.get("ename") for o in cell.get("outputs", []) if o.output_type == "error"}
    return (
        cell.cell_type == "code"
        and cell.source.strip() != ""
        and not is_graded(cell)
        and not errors & _UNREPLAYABLE
        and not _faulted_accelerator(cell)
    )


def _faulted_accelerator(cell: NotebookNode) -> bool:
    """Whether the cell ended with an accelerator's error that leaves the kernel's GPU unusable."""
    return any(
        o.output_type == "error" and is_accelerator_fault(o.get("ename", ""), o.get("evalue", ""))
        for o in cell.get("outputs", [])
    )


def _recorder_arguments(session: Path | None, generation: int) -> list[str]:
    """Kernel arguments that start the recorder before any cell (split mode)."""
    if session is None:
        return []
    recorder = "__import__('attention_course.grading.recorder', fromlist=['start'])"
    return [f"--IPKernelApp.exec_lines={recorder}.start({str(session)!r}, {generation})"]


def _text_size(content: dict[str, Any]) -> int:
    if "text" in content:
        return len(content["text"])
    return sum(len(str(value)) for value in content.get("data", {}).values())


class _Client(NotebookClient):
    """nbclient with a faster start (a forked kernel is ready in tenths of a second) and a cap on output."""

    output_limit: int = 2**20
    _output_sizes: dict[int, int]

    async def async_start_new_kernel_client(self) -> Any:
        """As nbclient's, but asks the kernel whether it is ready every 20 ms instead of every 200 ms.

        The channels connect while the forked kernel is still starting, before it has bound its Unix
        sockets; ZeroMQ then tries again after ``RECONNECT_IVL``, 100 ms by default: 50 ms of waiting per
        submission on average. This client's sockets (its own ZeroMQ context) try every 10 ms.
        """
        assert self.km is not None
        self.kc = self.km.client()
        self.kc.context.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
        await ensure_async(self.kc.start_channels())
        deadline = time.monotonic() + self.startup_timeout
        while True:
            self.kc.kernel_info()
            try:
                reply = await ensure_async(self.kc.shell_channel.get_msg(timeout=0.02))
                if reply["msg_type"] == "kernel_info_reply":
                    await ensure_async(self.kc.iopub_channel.get_msg(timeout=0.02))  # IOPub connected
                    break
            except Exception:  # queue.Empty, whichever queue module raised it
                pass
            if not await ensure_async(self.km.is_alive()):
                await self._async_cleanup_kernel()
                raise DeadKernelError("the kernel died before it was ready")
            if time.monotonic() > deadline:
                await self._async_cleanup_kernel()
                raise RuntimeError(f"the kernel was not ready after {self.startup_timeout} s")
        self.kc.allow_stdin = False
        return self.kc

    start_new_kernel_client = run_sync(async_start_new_kernel_client)  # nbclient's sync name calls this one

    def output(self, outs: list[NotebookNode], msg: dict[str, Any], display_id: str | None, cell_index: int):
        """Keep a cell's first ``output_limit`` characters of output; after that, only a note (and whether it
        wrote to stderr, which nbgrader scores)."""
        sizes = self.__dict__.setdefault("_output_sizes", {})
        used = sizes.get(cell_index, 0)
        size = _text_size(msg["content"])
        sizes[cell_index] = used + size
        if used + size <= self.output_limit:
            return super().output(outs, msg, display_id, cell_index)
        stream = msg["content"].get("name") if msg["msg_type"] == "stream" else None
        if used <= self.output_limit:
            note = f"\n[attention-grade: output cut after {self.output_limit // 2**20} MiB]\n"
            outs.append(nbformat.v4.new_output("stream", name="stdout", text=note))
        if stream == "stderr" and not any(o.get("name") == "stderr" for o in outs):
            outs.append(nbformat.v4.new_output("stream", name="stderr", text=msg["content"]["text"][:200]))
        return None


def execute(
    prepared: NotebookNode,
    slot: Slot,
    limits: Limits,
    *,
    session: Path | None = None,
    key: bytes = b"",
    max_restarts: int = 3,
    deadline: float | None = None,
    preload: tuple[str, ...] = (),
) -> Execution:
    """Execute ``prepared`` in kernels forked by ``slot``, in the slot's scratch folder.

    Args:
        prepared: the sanitized submission (:func:`~attention_course.grading.notebooks.prepare`); copied.
        slot: the sandbox slot; its scratch folder holds the kernel's files (and ``session``).
        limits: time limits per cell and per submission, memory, processes.
        session: split mode: the recorder's folder in the slot's scratch; ``key`` seals the recordings.
        max_restarts: how many kernels may be replaced before execution stops.
        preload: modules the fork server imports before it forks (the assignment's
            :attr:`~attention_course.registry.Assignment.preload`).
        deadline: the ``time.monotonic()`` by which the submission must end (default: ``limits.timeout`` on).

    Returns:
        The :class:`Execution`. It raises nothing for a broken submission; a slot whose fork server dies is
        reported as ``sandbox_lost``.
    """
    run = _Run(
        copy.deepcopy(prepared), slot, limits, session, key, deadline or time.monotonic() + limits.timeout
    )
    record = run.record
    start, failed_starts = 0, 0
    while True:
        if time.monotonic() >= run.deadline:
            record.stopped = f"the submission was stopped at its time limit of {limits.timeout} s"
            break
        client = run.client(preload)
        try:
            with client.setup_kernel(cleanup_kc=True):  # stop the channels and the kernel, even on a failure
                run.check_recorder()
                run.replay(client, start)
                stopped = run.cells(client, start)
        except SandboxError:
            record.sandbox_lost = True
            record.stopped = "the sandbox's fork server died (a cell killed the grader's process)"
            break
        except (DeadKernelError, RuntimeError) as error:  # before any cell ran: the machine's fault
            failed_starts += 1
            if failed_starts <= 2 and slot.alive:
                continue  # start another kernel for the same cells
            record.stopped = f"the kernel did not start: {error}"
            record.start_failed = True
            break
        if not slot.alive:
            record.sandbox_lost = True
            record.stopped = "the sandbox's fork server died (a cell killed the grader's process)"
            break
        if record.stopped or stopped is None or stopped[0] >= len(run.notebook.cells):
            break
        start = run.restart_after(*stopped, client.timeout)
        # an accelerator's fault is not counted: each moves on by at least one cell, and it costs only a fork
        if sum(restart.reason != ACCELERATOR_FAULT for restart in record.restarts) > max_restarts:
            record.gave_up_after = stopped[0]
            break
    return record


class _Run:
    """The state of one :func:`execute`: the notebook as it runs, its :class:`Execution`, the steps."""

    def __init__(
        self,
        notebook: NotebookNode,
        slot: Slot,
        limits: Limits,
        session: Path | None,
        key: bytes,
        deadline: float,
    ) -> None:
        self.notebook, self.slot, self.limits = notebook, slot, limits
        self.session, self.key, self.deadline = session, key, deadline
        self.record = Execution(notebook)
        self.replaying = False

    def client(self, preload: tuple[str, ...]) -> _Client:
        """A client of a new kernel, forked by the slot, recording from its first line in split mode."""
        client = _Client(
            self.notebook,
            km=kernel_manager(self.slot, self.slot.scratch, self.limits, preload),
            timeout=self.limits.cell_timeout,
            startup_timeout=max(1, min(60, int(self.deadline - time.monotonic()))),
            interrupt_on_timeout=True,
            error_on_timeout=TIMEOUT_ERROR,
            allow_errors=True,
            raise_on_iopub_timeout=True,
            shutdown_kernel="immediate",
            extra_arguments=[
                "--HistoryManager.hist_file=:memory:",
                *_recorder_arguments(self.session, len(self.record.restarts)),
            ],
            resources={"metadata": {"path": str(self.slot.scratch)}},
            on_cell_start=self._cell_started,
            on_cell_executed=self._cell_executed,
        )
        client.output_limit = self.limits.output_mib * 2**20
        return client

    def _cell_started(self, cell: NotebookNode, cell_index: int) -> None:
        if self.session is not None:
            seals.clear(self.session)  # only what a test cell writes while it runs is sealed

    def _cell_executed(self, cell: NotebookNode, cell_index: int, execute_reply: dict[str, Any]) -> None:
        # the fork server answers unless a cell killed it: then no later cell counts (SandboxError)
        self.slot.request("ping")
        if self.session is not None and not self.replaying and is_graded(cell):
            seals.seal(self.session, cell_index, self.key)
        if self.replaying:
            return
        _record_reply_error(cell, execute_reply)
        self.notebook.cells[cell_index] = cell

    def check_recorder(self) -> None:
        """Raises RuntimeError if split mode's recorder did not start in the new kernel."""
        started = f"started-{len(self.record.restarts)}"
        if self.session is not None and not (self.session / started).exists():
            raise RuntimeError("the recorder did not start in the kernel: split mode is off")

    def replay(self, client: _Client, start: int) -> None:
        """In a new kernel after a recovery: the definitions run before ``start`` (their outputs kept)."""
        self.replaying = True
        try:
            for index in (i for i in range(start) if _replayable(self.notebook.cells[i])):
                original = self.notebook.cells[index]
                try:
                    client.execute_cell(copy.deepcopy(original), index)
                except (CellTimeoutError, DeadKernelError):
                    pass  # it fails the same way again: the cells that need it will say so
                self.notebook.cells[index] = original
        finally:
            self.replaying = False

    def cells(self, client: _Client, start: int) -> tuple[int, Exception | None] | None:
        """Run the cells from ``start``; the cell that stopped the kernel and why (``None``: the cell faulted
        the kernel's GPU), or None when every cell ran or the time ran out."""
        for index in range(start, len(self.notebook.cells)):
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.record.stopped = (
                    f"the submission was stopped at its time limit of {self.limits.timeout} s"
                )
                return None
            client.timeout = max(1, math.ceil(min(self.limits.cell_timeout, left)))  # never before the limit
            try:
                client.execute_cell(self.notebook.cells[index], index)
            except (CellTimeoutError, DeadKernelError) as error:
                return index, error
            if _faulted_accelerator(self.notebook.cells[index]):
                return index, None
        return None

    def restart_after(self, index: int, error: Exception | None, timeout: int) -> int:
        """Note on cell ``index`` why its kernel was replaced, count the restart; the next cell to run."""
        cell = self.notebook.cells[index]
        if error is None:  # the cell has its own error output; a new process is the only way to a working GPU
            ename, evalue = ACCELERATOR_FAULT, ""
        elif isinstance(error, DeadKernelError):
            ename = "DeadKernelError"
            evalue = "the kernel died while running this cell (memory limit or a crash)"
        else:
            ename = "CellTimeoutError"
            evalue = f"the cell ran past {timeout} s and could not be interrupted"
        if evalue and cell.cell_type == "code":
            evalue += "; a new kernel ran the cells after it"
            cell.outputs.append(nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[]))
        self.record.restarts.append(Restart(index, ename))
        return index + 1
