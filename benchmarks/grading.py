"""Seconds per submission: ``nbgrader autograde`` against ``attention-grade``, on the same submissions.

    python benchmarks/grading.py                       # every assignment, 10 submissions each
    python benchmarks/grading.py ex02_scaled_dot_product --submissions 10

For each assignment, a scratch course directory gets the source notebook, ``nbgrader generate_assignment``
and ``--submissions`` notebooks: some solved, some blank, some with only the first functions written.
Both graders run as the commands an instructor types, start-up included: ``nbgrader autograde <id>``
(one process, submissions one after another) and ``attention-grade <id> submitted/`` with its default of one
job per core, in split mode (test cells judged in the grader's process, the default); ``--together`` adds
together mode (test cells judged in the kernel, as nbgrader). The script prints wall-clock and CPU seconds
per submission (CPU: the whole machine's busy seconds while the command ran: run it on a quiet machine)
and the ratios, nbgrader's over attention-grade's, measured in the same run; it asserts nothing (the tests
compare points).

``--baseline PYTHON`` also times the attention-grade of another version of the course, on the same
submissions, run by that Python. For the grader as it was before the fork servers and the sandbox:

    git worktree add /tmp/old e333272
    python3.11 -m venv --without-pip /tmp/old-venv
    packages=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    printf '/tmp/old\n%s\n' "$packages" > /tmp/old-venv/lib/python3.11/site-packages/course.pth
    python benchmarks/grading.py ex01_attention_pooling --baseline /tmp/old-venv/bin/python
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attention_course.registry import ASSIGNMENTS  # noqa: E402
from tests.notebook_tools import fill_solutions, load_exercise, reference_sources  # noqa: E402

ENVIRONMENT = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def make_course(assignment_id: str, count: int, folder: Path) -> None:
    """A scratch course with the assignment generated and ``count`` submissions in submitted/: the i-th has
    the first ``i mod (n + 1)`` of the assignment's ``n`` answers (functions or classes) written."""
    assignment = ASSIGNMENTS[assignment_id]
    shutil.copy(ROOT / "nbgrader_config.py", folder)
    assignment.source(folder).parent.mkdir(parents=True)
    shutil.copy(assignment.source(ROOT), assignment.source(folder))
    run([sys.executable, "-m", "nbgrader", "generate_assignment", assignment_id, "--force"], folder)
    release = nbformat.read(assignment.release(folder), as_version=4)
    exercise = load_exercise(assignment_id)
    sources = reference_sources(exercise)  # the answers, found with ast: functions and classes alike
    names = list(exercise.functions)
    for i in range(count):
        solved = names[: i % (len(names) + 1)]  # 0, 1, ..., all answers written, then again
        path = folder / "submitted" / f"student{i:02d}" / assignment_id / f"{assignment_id}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(fill_solutions(release, {name: sources[name] for name in solved}), path)


def _busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (Linux's /proc/stat), else None."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(field) for field in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def run(command: list[str], cwd: Path) -> tuple[float, float]:
    """Run ``command``; return its wall-clock seconds and the CPU seconds spent meanwhile.

    CPU: on Linux, the whole machine's busy seconds while the command ran (run it on a quiet machine). A
    process's ``RUSAGE_CHILDREN`` is not used there: it misses the kernels that the sandbox's fork servers
    fork inside their PID namespaces, and undercounted attention-grade by half. Elsewhere it is the fallback.
    """
    busy = _busy_seconds()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, env=ENVIRONMENT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    if busy is not None:
        return wall, _busy_seconds() - busy
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("assignments", nargs="*", default=sorted(ASSIGNMENTS))
    parser.add_argument("--submissions", type=int, default=10)
    parser.add_argument("--together", action="store_true", help="also time attention-grade --mode together")
    parser.add_argument("--baseline", help="also time the attention-grade that this Python imports")
    arguments = parser.parse_args()
    cores = os.cpu_count() or 1
    n = arguments.submissions
    table = Table(
        title=f"Seconds per submission, {n} submissions per assignment, start-up included ({cores} cores)"
    )
    columns = ["assignment", "nbgrader autograde"]
    columns += ["baseline attention-grade"] if arguments.baseline else []
    columns += [f"attention-grade --jobs {cores}"]
    columns += [f"--mode together --jobs {cores}"] if arguments.together else []
    columns += ["ratio, wall clock", "ratio, CPU"]
    columns += ["baseline's ratio, wall clock"] if arguments.baseline else []
    for column in columns:
        table.add_column(column, justify="left" if column == "assignment" else "right")
    for assignment_id in arguments.assignments:
        with tempfile.TemporaryDirectory() as scratch:
            folder = Path(scratch)
            make_course(assignment_id, n, folder)
            grade = [
                sys.executable,
                "-m",
                "attention_course.grading.cli",
                assignment_id,
                "submitted",
                "--course",
                ".",
            ]
            nbgrader = run([sys.executable, "-m", "nbgrader", "autograde", assignment_id, "--force"], folder)
            baseline = []
            if arguments.baseline:
                old = [arguments.baseline, *grade[1:], "--jobs", str(cores), "--out", "baseline"]
                baseline = [run(old, folder)]
            ours = run([*grade, "--jobs", str(cores), "--out", "report"], folder)
            extra = []
            if arguments.together:
                extra = [
                    run([*grade, "--jobs", str(cores), "--mode", "together", "--out", "together"], folder)
                ]
        cells = [
            f"{wall / n:.2f} s wall, {cpu / n:.2f} s CPU" for wall, cpu in (nbgrader, *baseline, ours, *extra)
        ]
        ratios = [f"{nbgrader[0] / ours[0]:.1f}x", f"{nbgrader[1] / ours[1]:.1f}x"]
        ratios += [f"{nbgrader[0] / baseline[0][0]:.1f}x"] if baseline else []
        table.add_row(assignment_id, *cells, *ratios)
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
