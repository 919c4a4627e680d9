"""Seconds per submission: ``attention-grade`` on local threads against a Dask ``LocalCluster``.

    python benchmarks/grading_cluster.py                  # 12 ex02 submissions, 2 jobs / 2 workers
    python benchmarks/grading_cluster.py --copies 4 --workers 2

The six submissions of ``tests/grading_course.py`` (solved, blank, four with one wrong function), ``--copies``
times each, graded by the command an instructor types, start-up included: ``attention-grade`` with
``--jobs N`` (threads, one sandbox) and with ``--scheduler local:N`` (a LocalCluster of N worker processes,
each with its own sandbox; the cluster's start is in the time). It prints wall-clock seconds per submission
and checks nothing but that both gave the same points (the tests do the rest).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.grading_course import ASSIGNMENT, ENVIRONMENT, make_course  # noqa: E402


def grade(course: Path, out: Path, *options: str) -> tuple[float, dict]:
    command = [sys.executable, "-m", "attention_course.grading.cli", ASSIGNMENT, str(course / "submitted")]
    command += ["--course", str(course), "--out", str(out), *options]
    start = time.monotonic()
    subprocess.run(command, env={**ENVIRONMENT, "OMP_NUM_THREADS": "1"}, check=True, capture_output=True)
    seconds = time.monotonic() - start
    report = json.loads((out / "report.json").read_text())
    points = {s["student"]: [c["points"] for c in s["cells"]] for s in report["submissions"]}
    return seconds, points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=2, help="copies of each of the six submissions")
    parser.add_argument("--workers", type=int, default=2, help="threads locally, Dask workers on the cluster")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        course = Path(scratch) / "course"
        paths = make_course(course)
        for copy in range(1, arguments.copies):
            for student, path in paths.items():
                target = course / "submitted" / f"{student}-{copy}" / ASSIGNMENT / path.name
                target.parent.mkdir(parents=True)
                target.write_bytes(path.read_bytes())
        count = len(paths) * arguments.copies
        workers = str(arguments.workers)
        local, local_points = grade(course, Path(scratch) / "local", "--jobs", workers)
        dask, dask_points = grade(course, Path(scratch) / "dask", "--scheduler", f"local:{workers}")
    assert local_points == dask_points, "the two runs gave different points"
    print(f"{count} submissions of {ASSIGNMENT}, {os.cpu_count()} CPU cores, start-up included:")
    for label, seconds in ((f"--jobs {workers}", local), (f"--scheduler local:{workers}", dask)):
        print(f"  attention-grade {label:22} {seconds:6.1f} s, {seconds / count:.2f} s per submission")


if __name__ == "__main__":
    main()
