"""Tampering bites when test cells run in the learner's kernel: the reason split mode exists.

The tampering bank (``tests/banks/tampering.py``) graded by ``attention-grade --mode together`` (test cells,
hidden parts included, run in the learner's kernel, as ``nbgrader autograde`` runs them), between two clean
submissions. The tampers marked ``fools_together`` earn more than their functions deserve there; what the same
functions earn without the tampering cells is computed by running the test cells in this process. That no
tamper earns more in split mode, the default, is tested with the hostile bank (``tests/test_hostile.py``).
"""

from __future__ import annotations

import nbformat
import pytest

from attention_course.grading.batch import grade
from attention_course.grading.sandbox import Limits
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
def together(tmp_path_factory):
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
    results = grade(ASSIGNMENT, paths, root=ROOT, limits=limits, jobs=2, mode="together")
    return {result.student: result for result in results}


def test_there_are_ten_tampers_or_more():
    assert len(TAMPERS) >= 10


def test_clean_submissions_around_them_keep_full_marks(together):
    for name in ("clean-first", "clean-last"):
        assert together[name].score == together[name].max_score == 15, name


@pytest.mark.parametrize("tamper", [t for t in TAMPERS if t.fools_together], ids=lambda tamper: tamper.name)
def test_judged_in_the_learners_kernel_these_tampers_do_earn_more(together, tamper):
    deserved = sum(points_by_running(EXERCISE, sources(tamper)).values())
    assert together[tamper.name].score > deserved
