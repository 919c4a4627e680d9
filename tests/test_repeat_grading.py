"""The grader's verdicts do not change from one run to the next (a short version of
``benchmarks/repeat_grading.py``, which grades the banks of ex01-ex03 a hundred times)."""

from __future__ import annotations

import pytest

from attention_course.grading.sandbox import Limits
from benchmarks.repeat_grading import bank_submissions, differences, repeat

# on the worker that builds the book: in `make test` the other worker has more to do
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("book")]


def test_the_same_bank_graded_three_times_gets_the_same_points_cell_by_cell(tmp_path):
    paths = bank_submissions("ex03_masks", tmp_path, every=5)
    runs = repeat("ex03_masks", paths, runs=3, jobs=2, limits=Limits(cell_timeout=60))
    assert len(runs) == 3 and all(len(results) == len(paths) >= 8 for results in runs)
    assert differences(runs) == {}
    assert any(result.score < result.max_score for result in runs[0])  # the bank's wrong ones lose points
