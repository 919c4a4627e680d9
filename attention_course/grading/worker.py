"""Execute one prepared submission, in a process of its own, as nbgrader's ``Execute`` preprocessor does.

``python -m attention_course.grading.worker PREPARED OUTPUT --cell-timeout 30`` runs every code cell of
``PREPARED`` in a fresh kernel with nbclient and rewrites ``OUTPUT`` after each cell, so that whatever ran
before a crash or a time limit can still be graded. The settings are nbgrader's: errors do not stop
execution, and a cell that runs past its time limit is interrupted and gets an error output.

With ``--session FOLDER`` (split mode), the worker starts each kernel with the recorder
(:func:`attention_course.grading.recorder.start`) as its first line, before any cell: test cells then record
what the learner's functions return instead of judging it. The worker reads a key from its standard input
(never the command line) and seals what each test cell recorded when it ends
(:mod:`~attention_course.grading.seals`); the grader checks the seals and judges the recordings.

Where nbgrader would give up on the whole submission, this worker recovers: when a cell kills its kernel
(a crash, ``os._exit``) or cannot be interrupted (a loop that swallows ``KeyboardInterrupt``), the cell
gets an error output, the kernel is replaced, the definitions that ran before are replayed, and execution
goes on with the next cell. After ``--max-restarts`` such recoveries it stops. The parent
(``attention_course.grading.cli``) applies the memory limit and kills the whole process tree when the
submission's own time limit is up.
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import sys
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from traitlets.config import Config

from attention_course.grading import seals

#: what nbgrader records for a cell that times out (nbgrader.preprocessors.Execute.error_on_timeout)
TIMEOUT_ERROR = {
    "ename": "CellTimeoutError",
    "evalue": "",
    "traceback": ["\x1b[0;31mCellTimeoutError\x1b[0m: No reply from kernel before timeout"],
}
GAVE_UP_EXIT = 3
#: errors after which a cell is not replayed into a new kernel (it would only fail the same way again)
_UNREPLAYABLE = {"KeyboardInterrupt", "CellTimeoutError", "DeadKernelError"}


def _write(notebook: NotebookNode, path: Path) -> None:
    partial = path.with_suffix(".partial")
    nbformat.write(notebook, partial)
    os.replace(partial, path)  # atomic: the parent never reads half a file


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


def _is_graded(cell: NotebookNode) -> bool:
    return bool(cell.metadata.get("nbgrader", {}).get("grade"))


def _replayable(cell: NotebookNode) -> bool:
    errors = {o.get("ename") for o in cell.get("outputs", []) if o.output_type == "error"}
    return (
        cell.cell_type == "code"
        and cell.source.strip() != ""
        and not _is_graded(cell)
        and not errors & _UNREPLAYABLE
    )


def _recorder_arguments(session: Path | None, generation: int) -> list[str]:
    """Kernel arguments that start the recorder before any cell (split mode)."""
    if session is None:
        return []
    recorder = "__import__('attention_course.grading.recorder', fromlist=['start'])"
    return [f"--IPKernelApp.exec_lines={recorder}.start({str(session)!r}, {generation})"]


def _kernel_config(folder: Path) -> Config:
    """Connect to the kernel over Unix sockets in ``folder`` where possible, else over TCP on 127.0.0.1.

    Over TCP, jupyter_client picks five free ports and closes them before the kernel binds them, so two
    kernels started at once on a busy machine now and then pick the same port and one dies at start
    ("Address already in use"). A socket file in the submission's own folder cannot collide. A Unix socket
    path has at most 107 bytes, hence the fallback.
    """
    base = folder.resolve() / "kernel"
    if os.name != "posix" or len(str(base)) > 90:
        return Config()
    return Config({"KernelManager": {"transport": "ipc", "ip": str(base)}})


def execute(
    prepared: Path,
    output: Path,
    cell_timeout: int,
    max_restarts: int = 3,
    session: Path | None = None,
    key: bytes = b"",
) -> int:
    """Execute ``prepared`` in its own folder, writing progress to ``output``; return the exit status.

    With ``session``, every kernel records for the grader (split mode), and ``key`` seals the recordings.
    """
    notebook = nbformat.read(prepared, as_version=4)
    replaying = [False]

    def on_cell_start(cell: NotebookNode, cell_index: int) -> None:
        if session is not None:
            seals.clear(session)  # only what a test cell writes while it runs is sealed

    def on_cell_executed(cell: NotebookNode, cell_index: int, execute_reply: dict[str, Any]) -> None:
        if session is not None and not replaying[0] and _is_graded(cell):
            seals.seal(session, cell_index, key)
        if replaying[0]:
            return
        _record_reply_error(cell, execute_reply)
        notebook.cells[cell_index] = cell
        _write(notebook, output)

    restarts: list[dict[str, Any]] = []
    start = 0
    _write(notebook, output)
    while True:
        client = NotebookClient(
            notebook,
            timeout=cell_timeout,
            interrupt_on_timeout=True,
            error_on_timeout=TIMEOUT_ERROR,
            allow_errors=True,
            raise_on_iopub_timeout=True,
            shutdown_kernel="immediate",
            kernel_name=notebook.metadata.get("kernelspec", {}).get("name", "python3"),
            extra_arguments=[
                "--HistoryManager.hist_file=:memory:",
                *_recorder_arguments(session, len(restarts)),
            ],
            resources={"metadata": {"path": str(prepared.parent)}},
            config=_kernel_config(prepared.parent),
            on_cell_start=on_cell_start,
            on_cell_executed=on_cell_executed,
        )
        stopped: tuple[int, Exception] | None = None
        with client.setup_kernel():
            assert client.kc is not None
            client.wait_for_reply(client.kc.kernel_info())
            if session is not None and not (session / f"started-{len(restarts)}").exists():
                raise RuntimeError("the recorder did not start in the kernel: split mode is off")
            # a new kernel after a recovery: replay the definitions that ran before, keeping their outputs
            replaying[0] = True
            for index in (i for i in range(start) if _replayable(notebook.cells[i])):
                original = notebook.cells[index]
                try:
                    client.execute_cell(copy.deepcopy(original), index)
                except (CellTimeoutError, DeadKernelError):
                    pass  # it fails the same way again: the cells that need it will say so
                notebook.cells[index] = original
            replaying[0] = False
            for index in range(start, len(notebook.cells)):
                try:
                    client.execute_cell(notebook.cells[index], index)
                except (CellTimeoutError, DeadKernelError) as error:
                    stopped = (index, error)
                    break
        if stopped is None:
            break
        index, error = stopped
        cell = notebook.cells[index]
        if isinstance(error, DeadKernelError):
            ename, evalue = (
                "DeadKernelError",
                "the kernel died while running this cell (memory limit or a crash)",
            )
        else:
            ename, evalue = (
                "CellTimeoutError",
                f"the cell ran past {cell_timeout} s and could not be interrupted",
            )
        evalue += "; a new kernel ran the cells after it"
        cell.outputs.append(nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[]))
        restarts.append({"cell": index, "reason": ename})
        notebook.metadata["attention_grade"] = {"restarts": restarts}
        start = index + 1
        if len(restarts) > max_restarts:
            notebook.metadata["attention_grade"]["gave_up_after_cell"] = index
            _write(notebook, output)
            return GAVE_UP_EXIT
        _write(notebook, output)
    _write(notebook, output)
    return 0


def main() -> int:
    """Command line of the worker (the grader starts it; people rarely need to)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prepared", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--cell-timeout", type=int, default=30)
    parser.add_argument("--max-restarts", type=int, default=3)
    parser.add_argument(
        "--memory", type=int, default=0, help="MiB of data memory for this process and its kernel"
    )
    parser.add_argument("--session", type=Path, default=None, help="split mode: the recorder's folder")
    arguments = parser.parse_args()
    if arguments.memory > 0:  # RLIMIT_DATA: allocations beyond it fail (MemoryError) instead of swapping;
        limit = arguments.memory * 2**20  # the kernel inherits it. Address-space reservations do not count.
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    prepared, output = arguments.prepared.resolve(), arguments.output.resolve()
    session = arguments.session.resolve() if arguments.session else None
    key = bytes.fromhex(sys.stdin.readline().strip()) if session else b""  # never on the command line
    return execute(prepared, output, arguments.cell_timeout, arguments.max_restarts, session, key)


if __name__ == "__main__":
    raise SystemExit(main())
