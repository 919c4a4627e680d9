"""Execute one prepared submission, in a process of its own, as nbgrader's ``Execute`` preprocessor does.

``python -m attention_course.grading.worker PREPARED OUTPUT --cell-timeout 30`` runs every code cell of
``PREPARED`` in a fresh kernel with nbclient, and rewrites ``OUTPUT`` after each cell, so that whatever
ran before a crash or a time limit can still be graded. The settings are nbgrader's: errors do not stop
execution, a cell that runs past its time limit is interrupted and gets a ``CellTimeoutError`` output.

The parent (``attention_course.grading.cli``) starts this process with memory limits and kills it, with
its kernel, when the submission's time is up. Exit status: 0 when every cell ran, 3 when the kernel died.
"""

from __future__ import annotations

import argparse
import os
import resource
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError
from nbformat import NotebookNode

#: what nbgrader records for a cell that times out (nbgrader.preprocessors.Execute.error_on_timeout)
TIMEOUT_ERROR = {
    "ename": "CellTimeoutError",
    "evalue": "",
    "traceback": ["\x1b[0;31mCellTimeoutError\x1b[0m: No reply from kernel before timeout"],
}
KERNEL_DIED_EXIT = 3


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


def execute(prepared: Path, output: Path, cell_timeout: int) -> int:
    """Execute ``prepared`` in its own folder, writing progress to ``output``; return the exit status."""
    notebook = nbformat.read(prepared, as_version=4)
    completed = [-1]  # index of the last cell that finished

    def on_cell_executed(cell: NotebookNode, cell_index: int, execute_reply: dict[str, Any]) -> None:
        _record_reply_error(cell, execute_reply)
        notebook.cells[cell_index] = cell
        completed[0] = cell_index
        _write(notebook, output)

    client = NotebookClient(
        notebook,
        timeout=cell_timeout,
        interrupt_on_timeout=True,
        error_on_timeout=TIMEOUT_ERROR,
        allow_errors=True,
        raise_on_iopub_timeout=True,
        kernel_name=notebook.metadata.get("kernelspec", {}).get("name", "python3"),
        extra_arguments=["--HistoryManager.hist_file=:memory:"],
        resources={"metadata": {"path": str(prepared.parent)}},
        on_cell_executed=on_cell_executed,
    )
    _write(notebook, output)
    try:
        client.execute()
    except DeadKernelError:
        notebook.metadata["attention_grade"] = {"kernel_died_after_cell": completed[0]}
        _write(notebook, output)
        return KERNEL_DIED_EXIT
    _write(notebook, output)
    return 0


def main() -> int:
    """Command line of the worker (the grader starts it; people rarely need to)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prepared", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--cell-timeout", type=int, default=30)
    parser.add_argument(
        "--memory", type=int, default=0, help="MiB of data memory for this process and its kernel"
    )
    arguments = parser.parse_args()
    if arguments.memory > 0:  # RLIMIT_DATA: allocations beyond it fail (MemoryError) instead of swapping;
        limit = arguments.memory * 2**20  # the kernel inherits it. Address-space reservations do not count.
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return execute(arguments.prepared.resolve(), arguments.output.resolve(), arguments.cell_timeout)


if __name__ == "__main__":
    raise SystemExit(main())
