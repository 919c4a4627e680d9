"""What a learner reads about each cell, from results made here (no grading): a visible failure as it is, a
hidden failure in general terms only, any failure withheld in together mode; the same in HTML, Markdown,
Gradescope's and GitHub Classroom's formats and the autograded notebook of nbgrader's gradebook."""

from __future__ import annotations

import json

import nbformat

from attention_course.grading import formats
from attention_course.grading.feedback import (
    cells_for_learner,
    descriptions,
    file_stem,
    html_page,
    markdown_page,
    write_feedback,
)
from attention_course.grading.gradebook import autograded_notebook, with_driver
from attention_course.grading.notebooks import CellResult
from attention_course.grading.submission import SubmissionResult

ASSIGNMENT = "ex02_scaled_dot_product"
HIDDEN_MESSAGE = "CheckFailure: softmax(x: float16 [3, 9]) returned 0.25 where 0.3141 is expected"
VISIBLE_MESSAGE = "CheckFailure: softmax(x: float64 [2, 5]) sums to 2 | not 1\n  Likely cause: no division."


def result(mode: str = "split") -> SubmissionResult:
    cells = [
        CellResult(
            "softmax_sums_to_one", "auto", 0.0, 1.0, "failed", VISIBLE_MESSAGE, "visible", "no division"
        ),
        CellResult("softmax_matches_torch", "auto", 0.0, 2.0, "failed", HIDDEN_MESSAGE, "hidden", "x", True),
        CellResult("softmax_is_stable", "auto", 1.0, 1.0, "passed"),
        CellResult(
            "sdpa_shapes", "auto", 0.0, 1.0, "not run", "the submission was stopped at its time limit"
        ),
        CellResult("why_sqrt_dk", "manual", None, 2.0, "manual", "to be graded by hand"),
    ]
    if mode == "together":  # the kernel judged: which part failed is not known
        cells[0] = CellResult("softmax_sums_to_one", "auto", 0.0, 1.0, "failed", HIDDEN_MESSAGE)
    return SubmissionResult(
        "ada <lovelace>", "ada.ipynb", "timeout", 3.0, cells, assignment=ASSIGNMENT, mode=mode
    )


def test_a_visible_failure_is_shown_and_a_hidden_one_only_in_general_terms():
    shown = {cell.grade_id: cell for cell in cells_for_learner(result())}
    assert shown["softmax_sums_to_one"].text == VISIBLE_MESSAGE and not shown["softmax_sums_to_one"].withheld
    hidden = shown["softmax_matches_torch"]
    assert hidden.withheld and "float16 [3, 9]" not in hidden.text and "0.3141" not in hidden.text
    assert descriptions(ASSIGNMENT)["softmax_matches_torch"].description.rstrip(".") in hidden.text
    assert "`softmax` raised an exception" in hidden.text
    assert shown["sdpa_shapes"].text == "the submission was stopped at its time limit"
    assert shown["softmax_is_stable"].text == "" and shown["why_sqrt_dk"].text == "Graded by hand."


def test_in_together_mode_a_failing_cells_message_is_withheld():
    shown = {cell.grade_id: cell for cell in cells_for_learner(result("together"))}
    assert shown["softmax_sums_to_one"].withheld and HIDDEN_MESSAGE not in shown["softmax_sums_to_one"].text
    gradescope = formats.gradescope(result("together"))
    assert not [test for test in gradescope["tests"] if test["name"] == "softmax_sums_to_one: visible check"]


def test_every_learner_facing_format_hides_the_hidden_message():
    made = result()
    notebook = nbformat.v4.new_notebook()
    for cell in made.cells:
        code = nbformat.v4.new_code_cell("checks.x(f)", metadata={"nbgrader": {"grade_id": cell.grade_id}})
        notebook.cells.append(code)
    notebook.cells[1].outputs = [
        nbformat.v4.new_output("error", ename="E", evalue=HIDDEN_MESSAGE, traceback=[])
    ]
    made.notebook = notebook
    texts = {
        "html": html_page(made),
        "markdown": markdown_page(made),
        "gradescope": json.dumps(formats.gradescope(made)),
        "github": json.dumps(formats.github_classroom(made)),
        "autograded": nbformat.writes(autograded_notebook(made)),
    }
    for name, text in texts.items():
        assert "0.3141" not in text and "float16 [3, 9]" not in text, name
        assert "the hidden check failed" in text, name
    assert "sums to 2" in texts["html"] and "Likely cause: no division." in texts["markdown"]
    assert "&lt;lovelace&gt;" in texts["html"] and "<lovelace>" not in texts["html"]
    assert "sums to 2 \\| not 1" not in texts["markdown"]  # a message is a fenced block, not a table cell
    errors = [
        o for c in autograded_notebook(made).cells for o in c.get("outputs", []) if o.output_type == "error"
    ]
    assert {e.ename for e in errors} == {"CheckFailure", "NotRun"}  # every failing test cell says why


def test_pages_are_written_per_student(tmp_path):
    pages = write_feedback([result()], tmp_path)
    assert pages == [tmp_path / "ada__lovelace_.html"] and (tmp_path / "ada__lovelace_.md").is_file()
    assert file_stem("../x") == "_x" and file_stem("...") == "_"


def test_a_postgresql_url_gets_the_driver_the_grading_extra_installs():
    assert with_driver("postgresql://grader@db/attention") == "postgresql+psycopg://grader@db/attention"
    assert with_driver("sqlite:///gradebook.db") == "sqlite:///gradebook.db"


def test_learner_text_is_cleaned_once_for_every_output():
    """Escape sequences (a colour, an OSC 52 clipboard write, a screen clear), control characters, bidi
    overrides and lone surrogates in what a learner's code raised never reach a console, a report or a
    page: the results clean them where they are made."""
    raised = "Error\x1b]52;c;cm0gLXJmIH4=\x07 at \x1b[2J\x1b[31mred\x1b[0m \u202eevil\x00 \udcff\ttab\nline"
    cell = CellResult("softmax_sums_to_one", "auto", 0.0, 1.0, "failed", raised, "visible", raised)
    submission = SubmissionResult("ada", "a.ipynb", "graded", 1.0, [cell], raised, [raised], ASSIGNMENT)
    for text in (cell.message, cell.cause, submission.message, *submission.warnings):
        assert text == "Error at red evil \ufffd\ttab\nline", repr(text)
        text.encode("utf-8")  # no surrogate left


def test_markdown_feedback_keeps_learner_text_inert():
    """A message holding fences of both kinds stays inside its code block, and links or images in a note
    or a student's name are shown as text (parsed with markdown-it, CommonMark's reference behaviour)."""
    from markdown_it import MarkdownIt

    breakout = "```\n~~~\n[click](http://evil.example) ![img](http://evil.example/x.png)\n````\n# heading"
    cells = [CellResult("softmax_sums_to_one", "auto", 0.0, 1.0, "failed", breakout, "visible")]
    note = "see [this](http://evil.example) and ![that](http://evil.example/y.png)"
    submission = SubmissionResult(
        "[ada](http://evil.example)", "a.ipynb", "graded", 1.0, cells, "", [note], ASSIGNMENT
    )
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown_page(submission))
    fences = [token for token in tokens if token.type == "fence"]
    assert [fence.content.rstrip("\n") for fence in fences] == [cells[0].message]
    inline = [child for token in tokens if token.children for child in token.children]
    assert not [child for child in inline if child.type in ("link_open", "image")]
    assert not [token for token in tokens if token.type == "heading_open" and token.markup == "#"][1:]
