"""``attention-grade`` where instructors already work: nbgrader's gradebook, Dask, Gradescope, GitHub
Classroom, feedback pages, and its pytest plugin.

Six ex02 submissions (``tests/grading_course.py``) in a scratch nbgrader course, set up by ``nbgrader
generate_assignment``, then graded twice from the same state: by ``nbgrader autograde`` into its gradebook,
and by ``attention-grade --gradebook`` into a copy's. The copy's gradebook holds the same scores, and
``nbgrader generate_feedback``, ``nbgrader export`` and the formgrader's API work on it unmodified. The same
six graded on a Dask ``LocalCluster`` of two workers get the same points; the pytest plugin reports them as
JUnit properties. Learner-facing outputs never show what a hidden check's message names.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import jsonschema
import nbformat
import pytest

from attention_course.grading.cli import main
from tests.grading_course import ASSIGNMENT, ENVIRONMENT, TIMESTAMP, make_course, nbgrader, start_nbgrader
from tests.notebook_tools import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("platforms")]

# Gradescope's results.json, field by field (https://gradescope-autograders.readthedocs.io/en/latest/specs/)
VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
GRADESCOPE = {
    "type": "object",
    "required": ["tests"],
    "additionalProperties": False,
    "properties": {
        "score": {"type": "number"},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "test_output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "test_name_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "visibility": VISIBILITY,
        "stdout_visibility": VISIBILITY,
        "extra_data": {"type": "object"},
        "tests": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {
                    "score": {"type": "number"},
                    "max_score": {"type": "number"},
                    "status": {"enum": ["passed", "failed"]},
                    "name": {"type": "string"},
                    "name_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
                    "number": {"type": "string"},
                    "output": {"type": "string"},
                    "output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "visibility": VISIBILITY,
                    "extra_data": {"type": "object"},
                },
            },
        },
        "leaderboard": {"type": "array"},
    },
}


def _grades(database: Path) -> dict:
    """``{student: ({cell: (auto score, max, needs manual)}, {cell: auto comment}, timestamp)}``."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{database}") as gradebook:
        found = {}
        for submission in gradebook.assignment_submissions(ASSIGNMENT):
            (notebook,) = submission.notebooks
            grades = {g.name: (g.auto_score, g.max_score, g.needs_manual_grade) for g in notebook.grades}
            comments = {c.name: c.auto_comment for c in notebook.comments}
            found[submission.student_id] = (grades, comments, submission.timestamp)
        return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("platforms")
    course, ours = base / "nbgrader", base / "ours"
    paths = make_course(course)
    generated = nbgrader("generate_assignment", ASSIGNMENT, "--force", cwd=course)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    shutil.copytree(course, ours)  # the same gradebook and submissions, before any grading
    autograding = start_nbgrader("autograde", ASSIGNMENT, "--force", cwd=course)  # in its own copy
    report = base / "report"
    arguments = [
        ASSIGNMENT,
        str(ours / "submitted"),
        "--course",
        str(ours),
        "--out",
        str(report),
        "--jobs",
        "2",
    ]
    formats = ["--format", "gradescope", "--format", "github-classroom"]
    on_dask = base / "dask"
    try:
        assert main([*arguments, "--gradebook", *formats]) == 0  # the course's gradebook: ours/gradebook.db
        assert main([*arguments[:4], "--out", str(on_dask), "--scheduler", "local:2"]) == 0
    finally:
        log, _ = autograding.communicate()
    assert autograding.returncode == 0, log
    return {
        "nbgrader": course,
        "ours": ours,
        "paths": paths,
        "report": json.loads((report / "report.json").read_text()),
        "out": report,
        "dask": json.loads((on_dask / "report.json").read_text()),
    }


def _points(report: dict) -> dict:
    return {s["student"]: {c["grade_id"]: c["points"] for c in s["cells"]} for s in report["submissions"]}


def _by_student(report: dict) -> dict:
    return {s["student"]: s for s in report["submissions"]}


def test_the_gradebook_holds_the_scores_of_nbgrader_autograde(graded):
    theirs = _grades(graded["nbgrader"] / "gradebook.db")
    ours = _grades(graded["ours"] / "gradebook.db")
    assert set(ours) == set(theirs) == set(graded["paths"])
    for student, (grades, comments, timestamp) in theirs.items():
        our_grades, our_comments, our_timestamp = ours[student]
        assert our_grades == grades, student
        assert our_timestamp == timestamp, student
        for cell, comment in comments.items():  # nbgrader's own comments, and ours where it has none
            assert our_comments[cell] == comment or (comment is None and our_comments[cell]), (student, cell)
    assert theirs["few-samples"][2] is not None  # the timestamp of nbgrader's collect was read
    assert theirs["solved"][0]["why_sqrt_dk"] == (None, 2.0, True)  # a written answer waits for a grader
    assert set(theirs["blank"][1].values()) == set(ours["blank"][1].values()) == {"No response."}


def test_the_check_messages_become_the_solution_cells_comments(graded):
    _, comments, _ = _grades(graded["ours"] / "gradebook.db")["no-scale"]
    tested = [comment for comment in comments.values() if comment and "sdpa_matches_builtin" in comment]
    assert len(tested) == 1 and "Likely cause: the scores are not scaled" in tested[0]


def test_nbgrader_generate_feedback_export_and_formgrader_work_on_our_grades(graded):
    ours = graded["ours"]
    feedback = nbgrader("generate_feedback", ASSIGNMENT, "--force", cwd=ours)
    assert feedback.returncode == 0, feedback.stdout + feedback.stderr
    scores = {s["student"]: s["score"] for s in graded["report"]["submissions"]}
    for student, score in scores.items():
        page = (ours / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
        assert f"Score: {score:.1f} / 17.0" in page, student
    exported = nbgrader("export", "--to", str(ours / "grades.csv"), cwd=ours)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    with open(ours / "grades.csv") as handle:
        rows = {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(handle)}
    assert rows == scores  # the automatic points (written answers are not graded yet)
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    api = NbGraderAPI(coursedir=CourseDirectory(root=str(ours)))
    listed = {s["student"]: s for s in api.get_submissions(ASSIGNMENT)}
    assert {s: listed[s]["autograded"] for s in scores} == dict.fromkeys(scores, True)
    assert listed["solved"]["needs_manual_grade"] and listed["solved"]["score"] == scores["solved"]
    assert len(api.get_notebook_submissions(ASSIGNMENT, ASSIGNMENT)) == len(scores)


def test_the_report_agrees_with_nbgrader(graded):
    theirs = _grades(graded["nbgrader"] / "gradebook.db")
    for student, cells in _points(graded["report"]).items():
        assert cells == {cell: auto for cell, (auto, _, _) in theirs[student][0].items()}, student


def test_a_dask_local_cluster_of_two_workers_gives_the_same_points(graded):
    assert graded["dask"]["scheduler"] == "local:2" and graded["dask"]["workers"] == 2
    assert _points(graded["dask"]) == _points(graded["report"])
    assert "bubblewrap" in graded["dask"]["isolation"] or "no namespaces" in graded["dask"]["isolation"]


def _hidden_calls(report: dict, student: str) -> list[str]:
    """The calls that a student's failing hidden checks name (inputs of the hidden part), from the report."""
    cells = [c for c in _by_student(report)[student]["cells"] if c["part"] == "hidden"]
    assert cells, f"{student} has no failing hidden check"
    return [re.search(r"\w+\([^)]*\)", cell["message"]).group(0) for cell in cells]


def test_hidden_failures_reveal_no_hidden_input_to_learners(graded):
    calls = _hidden_calls(graded["report"], "few-samples")
    assert any("n_samples" in call for call in calls)
    out, ours = graded["out"], graded["ours"]
    learner_facing = [
        out / "feedback" / "few-samples.html",
        out / "feedback" / "few-samples.md",
        out / "few-samples" / "results.json",
        out / "few-samples" / "github-classroom.json",
        ours / "autograded" / "few-samples" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb",
    ]
    for path in learner_facing:
        text = path.read_text()
        assert not [call for call in calls if call in text], path
        assert "the hidden check failed" in text, path
    report_text = json.dumps(graded["report"])
    assert all(call in report_text for call in calls)  # the instructor's report has them


def test_a_visible_failure_shows_its_message_and_likely_cause(graded):
    page = (graded["out"] / "feedback" / "no-scale.html").read_text()
    assert "sdpa_matches_builtin" in page and "Likely cause: the scores are not scaled" in page
    markdown = (graded["out"] / "feedback" / "no-scale.md").read_text()
    assert "| `sdpa_matches_builtin` |" in markdown and "0 / 2" in markdown
    assert "Likely cause: the scores are not scaled" in markdown


def test_gradescope_results_follow_the_format(graded):
    report = _by_student(graded["report"])
    for student in graded["paths"]:
        results = json.loads((graded["out"] / student / "results.json").read_text())
        jsonschema.validate(results, GRADESCOPE)
        scored = [test for test in results["tests"] if "max_score" in test]
        assert sum(test["score"] for test in scored) == results["score"] == report[student]["score"]
        assert sum(test["max_score"] for test in scored) == report[student]["max_score"] == 15
        assert {test["visibility"] for test in scored} == {"after_published"}
        assert {t["visibility"] for t in results["tests"] if "max_score" not in t} == {"visible"}
    few = json.loads((graded["out"] / "few-samples" / "results.json").read_text())
    visible = {t["name"]: t["status"] for t in few["tests"] if "max_score" not in t}
    assert visible["variance_unscaled: visible check"] == "passed"  # only its hidden check failed


def test_github_classroom_result_carries_every_cells_points(graded):
    report = _by_student(graded["report"])
    for student in graded["paths"]:
        result = json.loads((graded["out"] / student / "github-classroom.json").read_text())
        assert (
            result["max_score"] == 15 and sum(t["score"] for t in result["tests"]) == report[student]["score"]
        )
        assert result["status"] == ("pass" if report[student]["score"] == 15 else "fail")
        assert {t["status"] for t in result["tests"]} <= {"pass", "fail"}


def test_the_pytest_plugin_reports_points_as_junit_properties(graded, tmp_path):
    ours = graded["ours"]
    chosen = [ours / "submitted" / student for student in ("solved", "few-samples", "no-scale")]
    junit = tmp_path / "junit.xml"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--grade",
        ASSIGNMENT,
        *map(str, chosen),
        "--grade-course",
        str(ours),
    ]
    command += ["--grade-jobs", "2", f"--junitxml={junit}", "-p", "no:cacheprovider", "-q"]
    done = subprocess.run(command, cwd=tmp_path, env=ENVIRONMENT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]  # failed cells are grades
    cases = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        cases[f"{case.get('classname')}::{case.get('name')}"] = properties
    expected = _points(graded["report"])
    for student in ("solved", "few-samples", "no-scale"):
        for cell, points in expected[student].items():
            shown = cases[f"{student}::{cell}"]["points"]
            assert shown == ("" if points is None else f"{points:g}"), (student, cell)
    assert "failed" in done.stdout and "few-samples::variance_unscaled" in done.stdout


def test_the_pytest_plugin_fails_the_run_on_an_infrastructure_error(graded, tmp_path):
    broken = tmp_path / "course"  # a course whose reference solutions fail to import: the grader's fault
    shutil.copytree(graded["ours"] / "solutions", broken / "solutions")
    shutil.copy(graded["ours"] / "nbgrader_config.py", broken)
    (broken / "solutions" / "__init__.py").write_text("")
    (broken / "solutions" / "attention.py").write_text("raise RuntimeError('a broken reference module')\n")
    command = [sys.executable, "-m", "pytest", "--grade", ASSIGNMENT, str(graded["paths"]["solved"])]
    command += ["--grade-course", str(broken), "-p", "no:cacheprovider", "-q"]
    done = subprocess.run(command, cwd=tmp_path, env=ENVIRONMENT, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "infrastructure error" in done.stdout


def test_without_grade_the_plugin_collects_nothing(graded, tmp_path):
    shutil.copy(graded["paths"]["solved"], tmp_path / "notebook.ipynb")
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(tmp_path),
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    done = subprocess.run(command, cwd=tmp_path, env=ENVIRONMENT, capture_output=True, text=True)
    assert done.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, done.stdout + done.stderr


def test_the_pytest_plugin_runs_no_code_of_a_submissions_folder(graded, tmp_path):
    folder = tmp_path / "submitted" / "mallory" / ASSIGNMENT
    folder.mkdir(parents=True)
    shutil.copy(graded["paths"]["blank"], folder / f"{ASSIGNMENT}.ipynb")
    marker = tmp_path / "ran"
    for name in ("conftest.py", "__init__.py", "test_evil.py"):
        (folder / name).write_text(f"open({str(marker)!r}, 'a').write({name!r})\ndef test_x(): pass\n")
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--grade",
        ASSIGNMENT,
        str(tmp_path / "submitted"),
        "--collect-only",
    ]
    command += ["--grade-course", str(graded["ours"]), "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(command, cwd=tmp_path, env=ENVIRONMENT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not marker.exists()
    assert "mallory::softmax_sums_to_one" in done.stdout and "test_x" not in done.stdout


def test_the_timestamp_of_nbgrader_collect_is_recorded(graded):
    from nbgrader.api import Gradebook
    from nbgrader.utils import parse_utc

    with Gradebook(f"sqlite:///{graded['ours'] / 'gradebook.db'}") as gradebook:
        assert gradebook.find_submission(ASSIGNMENT, "few-samples").timestamp == parse_utc(TIMESTAMP)
    autograded = graded["ours"] / "autograded" / "few-samples" / ASSIGNMENT
    assert (autograded / "timestamp.txt").read_text() == TIMESTAMP
    nbformat.validate(nbformat.read(autograded / f"{ASSIGNMENT}.ipynb", as_version=4))


# the Chinese release: the same submissions, their text cells in Chinese, graded in a course of its own
IN_CHINESE = ("solved", "mask-ignored")


@pytest.fixture(scope="module")
def graded_in_chinese(graded, tmp_path_factory):
    """Two of the six submissions (one with full points, one with partial points), each as it would be
    written in the Chinese release (its code cells the English submission's, its text cells the Chinese
    release's), in a course whose source notebook is the translated one; graded by ``nbgrader autograde``
    and by ``attention-grade``, as the English ones."""
    from attention_course.grading import translation
    from attention_course.registry import ASSIGNMENTS
    from tests.grading_course import write_config

    base = tmp_path_factory.mktemp("platforms-zh")
    course, ours = base / "nbgrader", base / "ours"
    course.mkdir()
    write_config(course)
    translation.write_translated_sources(ROOT, course, "zh_CN", [ASSIGNMENTS[ASSIGNMENT]])
    generated = nbgrader("generate_assignment", ASSIGNMENT, "--force", cwd=course)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    release = nbformat.read(ASSIGNMENTS[ASSIGNMENT].release(course), as_version=4)
    committed = translation.release_path(ROOT, "zh_CN", ASSIGNMENTS[ASSIGNMENT])
    assert release == nbformat.read(committed, as_version=4), "the committed Chinese release is stale"
    for student in IN_CHINESE:
        notebook = nbformat.read(graded["paths"][student], as_version=4)
        assert len(notebook.cells) == len(release.cells)
        for cell, chinese in zip(notebook.cells, release.cells, strict=True):
            if cell.cell_type == "markdown" and not cell.metadata.get("nbgrader", {}).get("solution"):
                cell.source = chinese.source
            else:
                assert (
                    cell.cell_type == chinese.cell_type
                    and cell.metadata.nbgrader == chinese.metadata.nbgrader
                )
        path = course / "submitted" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(notebook, path)
    shutil.copytree(course, ours)
    autograded = nbgrader("autograde", ASSIGNMENT, "--force", cwd=course)
    assert autograded.returncode == 0, autograded.stdout + autograded.stderr
    report = base / "report"
    arguments = [ASSIGNMENT, str(ours / "submitted"), "--course", str(ours), "--out", str(report)]
    assert main([*arguments, "--jobs", "2"]) == 0
    return {"nbgrader": course, "report": json.loads((report / "report.json").read_text())}


def test_a_submission_gets_the_same_points_in_the_chinese_release(graded, graded_in_chinese):
    """The Chinese release is the English one with its text translated: nbgrader and attention-grade give
    each submission, written in either, the same points in every cell."""
    english = _grades(graded["nbgrader"] / "gradebook.db")
    chinese = _grades(graded_in_chinese["nbgrader"] / "gradebook.db")
    assert set(chinese) == set(IN_CHINESE)
    for student in IN_CHINESE:
        assert chinese[student][0] == english[student][0], student  # (auto score, max, needs manual) by cell
    ours = _points(graded_in_chinese["report"])
    assert ours == {student: _points(graded["report"])[student] for student in IN_CHINESE}
    total = {student: sum(points or 0 for points in ours[student].values()) for student in IN_CHINESE}
    assert 0 < total["mask-ignored"] < total["solved"]
    # the text the learner reads is Chinese
    from attention_course.registry import ASSIGNMENTS

    release = nbformat.read(ASSIGNMENTS[ASSIGNMENT].release(graded_in_chinese["nbgrader"]), as_version=4)
    assert re.search(r"[\u4e00-\u9fff]{4}", release.cells[0].source)
