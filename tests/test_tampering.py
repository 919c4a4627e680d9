"""Hostile submissions that tamper with the grading earn no more than their functions deserve.

One batch of ex02 submissions, the tampering bank (``tests/banks/tampering.py``) between two clean ones, is
graded by ``attention-grade`` in split mode (test cells judged in the grader's process) and in together mode
(test cells, hidden parts included, run in the learner's kernel, as ``nbgrader autograde`` runs them). What
a submission's functions deserve is what the same functions earn, without the tampering cells, when the
test cells run in this process. In split mode no tamper earns more; the tampers marked ``fools_together``
do earn more in together mode, which proves that they bite.
"""

from __future__ import annotations

import nbformat
import pytest

from attention_course.grading.cli import Limits, grade
from tests.banks import _bank, tampering
from tests.banks.tampering import TAMPERS, Tamper
from tests.notebook_tools import ROOT, fill_solutions, load_exercise, points_by_running, reference_sources

# the tests of one module fixture run on one xdist worker (make test runs with --dist loadgroup)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tampering")]
ASSIGNMENT = "ex02_scaled_dot_product"
EXERCISE = load_exercise(ASSIGNMENT)
VARIANTS = {candidate.id: candidate.source for candidate in _bank.wrong(EXERCISE.bank)}


def sources(tamper: Tamper) -> dict[str, str]:
    return tampering.sources(tamper, VARIANTS)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tampering")
    clean = fill_solutions(EXERCISE.release_notebook(), reference_sources(EXERCISE))
    paths = {}
    for name, submission in (
        ("clean-first", clean),
        *(
            (tamper.name, tampering.notebook(tamper, EXERCISE.release_notebook(), VARIANTS))
            for tamper in TAMPERS
        ),
        ("clean-last", clean),
    ):
        paths[name] = folder / f"{name}.ipynb"
        nbformat.write(submission, paths[name])
    limits = Limits(cell_timeout=60, timeout=300)
    return {
        mode: {
            result.student: result
            for result in grade(ASSIGNMENT, paths, root=ROOT, limits=limits, jobs=2, mode=mode)
        }
        for mode in ("split", "together")
    }


def test_there_are_ten_tampers_or_more():
    assert len(TAMPERS) >= 10


@pytest.mark.parametrize("mode", ["split", "together"])
def test_clean_submissions_around_them_keep_full_marks(graded, mode):
    for name in ("clean-first", "clean-last"):
        assert graded[mode][name].score == graded[mode][name].max_score == 15, name


@pytest.mark.parametrize("tamper", TAMPERS, ids=lambda tamper: tamper.name)
def test_judged_outside_no_tamper_earns_more_than_its_functions_deserve(graded, tamper):
    deserved = sum(points_by_running(EXERCISE, sources(tamper)).values())
    result = graded["split"][tamper.name]
    assert result.score <= deserved, {
        c.grade_id: (c.points, c.message[:120]) for c in result.cells if c.points
    }


@pytest.mark.parametrize("tamper", [t for t in TAMPERS if t.fools_together], ids=lambda tamper: tamper.name)
def test_judged_in_the_learners_kernel_these_tampers_do_earn_more(graded, tamper):
    deserved = sum(points_by_running(EXERCISE, sources(tamper)).values())
    assert graded["together"][tamper.name].score > deserved
