"""Feedback for learners: one page per submission, in HTML (to read or e-mail) and Markdown (for platforms).

A page shows each test cell's points, what it checks (its description, the first line of the test cell that
the learner has), and for a failing cell what the learner may know about the failure:

- a failing **visible** check: its message and likely cause, as the learner's own notebook shows them;
- a failing **hidden** check: which behaviour failed and why in general terms (the learner's function raised
  an exception, or returned something else than the task asks for), never the hidden inputs or the expected
  values, which the check's message names;
- a cell that did not run, timed out or wrote to stderr: the grader's reason.

Which part of a check failed is data (:attr:`CellResult.part`, set by the grader's judge in split mode),
never read from a message. In together mode (``--mode together``) the test cells were judged in the learner's
kernel, where the part is not known: a failing cell's message is then withheld, since it may describe
hidden inputs.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2
import markupsafe

from attention_course.checks import engine
from attention_course.grading.cli import file_stem
from attention_course.grading.notebooks import CellResult
from attention_course.grading.options import Mode
from attention_course.grading.submission import STATUSES, SubmissionResult
from attention_course.registry import ASSIGNMENTS

WITHHELD_TOGETHER = (
    "This cell was judged in your notebook's kernel, where its visible and hidden checks run together, so "
    "its message is not shown (it may describe hidden inputs). Run the cell's visible check in your "
    "notebook to see what it says; if it passes there, the hidden check failed: the same behaviour, tested "
    "on more inputs."
)


@dataclass(frozen=True)
class Described:
    """What a grade cell checks, in the words the learner's notebook uses."""

    description: str
    function: str  # the function or class it calls ("" for a written answer)


@functools.cache
def descriptions(assignment_id: str) -> dict[str, Described]:
    """``{grade_id: Described}`` for the test cells of an assignment (its checks module's behaviours)."""
    behaviours = engine.behaviours(ASSIGNMENTS[assignment_id])
    return {b.name: Described(b.description, b.function) for b in behaviours}


def hidden_failure(described: Described, raised: bool) -> str:
    """What a learner is told when the hidden part of a check fails: the behaviour and, in general terms,
    how it failed; nothing of the hidden inputs or of the expected values."""
    function = f"`{described.function}`" if described.function else "your code"
    how = (
        "raised an exception"
        if raised
        else "returned something else than the task asks for (other values, shape, dtype or device)"
    )
    behaviour = f", \u201c{described.description.rstrip('.')}\u201d," if described.description else ""
    return (
        f"The visible check passed, but the hidden check failed. It tests the same behaviour{behaviour} on "
        "more inputs than the visible check: other sizes, dtypes or values, which are not shown. On at least "
        f"one of them, {function} {how}. Make sure it works for every input that the task's docstring "
        "allows, not only for the examples."
    )


@dataclass(frozen=True)
class CellFeedback:
    """One grade cell as its learner sees it.

    Attributes:
        part: the part of the check that failed, ``"visible"`` or ``"hidden"`` (``""``: none, or not known).
        text: what the learner may read about the cell's result ("" when it passed).
        withheld: whether the failure's own message was replaced by :attr:`text` (a hidden check's, or any
            failing cell's in together mode).
    """

    grade_id: str
    description: str
    kind: str
    points: float | None
    max_points: float
    status: str
    part: str
    text: str
    withheld: bool

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def points_text(self) -> str:
        points = "?" if self.points is None else f"{self.points:g}"
        return f"{points} / {self.max_points:g}"


def for_learner(cell: CellResult, mode: Mode, described: Described | None) -> CellFeedback:
    """The feedback on ``cell`` of a submission judged in ``mode``."""
    described = described or Described("", "")
    description = described.description or ("a written answer" if cell.kind == "manual" else "")
    withheld = False
    if cell.status == "passed":
        text = ""
    elif cell.kind == "manual":
        text = "Graded by hand." if cell.status == "manual" else "The answer was left blank."
    elif cell.status == "failed" and cell.part == "hidden":
        text, withheld = hidden_failure(described, cell.raised), True
    elif cell.status == "failed" and not mode.judged_here:
        text, withheld = WITHHELD_TOGETHER, True
    else:  # a visible check's failure, or the grader's own reason (not run, timeout, stderr)
        text = cell.message
    return CellFeedback(
        cell.grade_id,
        description,
        cell.kind,
        cell.points,
        cell.max_points,
        cell.status,
        cell.part,
        text,
        withheld,
    )


def cells_for_learner(result: SubmissionResult) -> list[CellFeedback]:
    known = descriptions(result.assignment) if result.assignment in ASSIGNMENTS else {}
    return [for_learner(cell, result.mode, known.get(cell.grade_id)) for cell in result.cells]


def _summary(result: SubmissionResult) -> dict:
    assignment = ASSIGNMENTS.get(result.assignment)
    manual = sum(cell.max_points for cell in result.cells if cell.kind == "manual")
    note = "" if result.status in ("graded", "graded after restarts") else STATUSES.get(result.status, "")
    return {
        "assignment": result.assignment,
        "title": assignment.title if assignment else result.assignment,
        "student": result.student,
        "score": f"{result.score:g}",
        "max_score": f"{result.max_score:g}",
        "manual": f"{manual:g}" if manual else "",
        "status": result.status,
        "note": " ".join(part for part in (note, result.message) if part),
        "warnings": result.warnings,
    }


def _code_spans(text: str) -> markupsafe.Markup:
    """``text`` escaped for HTML, its Markdown code spans (`name`) as ``<code>``."""
    escaped = str(markupsafe.escape(text))
    return markupsafe.Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped))


_ENVIRONMENT = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
_ENVIRONMENT.filters["code_spans"] = _code_spans
_HTML = _ENVIRONMENT.from_string("""\
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Feedback: {{ s.title }} ({{ s.student }})</title>
<style>
  body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 60rem;
         padding: 0 1rem; color: #1f2328; line-height: 1.45; }
  h1 { font-size: 1.5rem; margin-bottom: .2rem; }
  .sub { color: #59636e; margin-top: 0; }
  .score { font-size: 1.25rem; margin: 1rem 0; }
  .note { background: #fff8c5; border: 1px solid #d4a72c; padding: .5rem .8rem; border-radius: 6px; }
  .table { overflow-x: auto; margin: 1rem 0; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: .45rem .6rem; border-bottom: 1px solid #d1d9e0; vertical-align: top; }
  th { background: #f6f8fa; }
  td.points { white-space: nowrap; text-align: right; }
  code { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: .9em; }
  h3 code { overflow-wrap: anywhere; }
  @media (max-width: 640px) { .what { display: none; } }  /* a phone: the cell, its points, its result */
  .badge { display: inline-block; padding: .05rem .5rem; border-radius: 1rem; font-size: .85em;
           white-space: nowrap; }
  .passed { background: #dafbe1; color: #116329; }
  .failed, .timeout, .stderr, .not-run, .no-response { background: #ffebe9; color: #a40e26; }
  .manual { background: #ddf4ff; color: #0550ae; }
  section.cell { border: 1px solid #d1d9e0; border-radius: 6px; padding: .2rem 1rem .8rem; margin: 1rem 0; }
  pre { white-space: pre-wrap; background: #f6f8fa; padding: .7rem; border-radius: 6px; overflow-x: auto; }
  .withheld { font-style: italic; }
</style>
</head>
<body>
<h1>{{ s.title }}</h1>
<p class="sub">Feedback for <strong>{{ s.student }}</strong> &middot; <code>{{ s.assignment }}</code></p>
<p class="score"><strong>{{ s.score }} / {{ s.max_score }}</strong> automatic points
{%- if s.manual %}; {{ s.manual }} more for written answers, graded by hand{% endif %}.</p>
{% if s.note %}<p class="note">{{ s.note }}</p>{% endif %}
{% for warning in s.warnings %}<p class="note">{{ warning }}</p>{% endfor %}
<div class="table"><table>
<thead><tr><th>test cell</th><th class="what">what it checks</th><th>points</th><th>result</th></tr></thead>
<tbody>
{% for cell in cells %}<tr>
<td><code>{{ cell.grade_id }}</code></td><td class="what">{{ cell.description }}</td>
<td class="points">{{ cell.points_text }}</td>
<td><span class="badge {{ cell.status | replace(' ', '-') }}">{{ cell.status }}</span></td>
</tr>
{% endfor %}</tbody>
</table></div>
{% set failing = cells | rejectattr("passed") | rejectattr("kind", "equalto", "manual") | list %}
{% if failing %}<h2>What to look at</h2>
{% for cell in failing %}<section class="cell" id="{{ cell.grade_id }}">
<h3><code>{{ cell.grade_id }}</code> ({{ cell.points_text }})</h3>
{% if cell.withheld %}<p class="withheld">{{ cell.text | code_spans }}</p>
{% else %}<pre>{{ cell.text }}</pre>{% endif %}
</section>
{% endfor %}{% endif %}
</body>
</html>
""")


def html_page(result: SubmissionResult) -> str:
    """The HTML feedback page of ``result`` (self-contained: no script, no file or address it loads)."""
    return _HTML.render(s=_summary(result), cells=cells_for_learner(result))


def _cell(text: str) -> str:
    """The course's ``text`` (a check's description) in one cell of a Markdown table."""
    return html.escape(" ".join(text.split()), quote=False).replace("|", "\\|")


def _plain(text: str) -> str:
    """Text that may come from a learner (a name, a note quoting an error) on one line of Markdown, or in a
    table's cell: shown as it is, whatever Markdown it holds (a link, an image, emphasis, a bar), each such
    character escaped with a backslash."""
    return re.sub(r"([\\`*_\[\]()!|#~<>])", r"\\\1", " ".join(text.split()))


def _fence(text: str) -> str:
    """A code fence that ``text`` cannot close: backticks, one more than its longest run of them (CommonMark
    closes a fence only with one of the same character at least as long)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def markdown_page(result: SubmissionResult) -> str:
    """The Markdown feedback of ``result`` (GitHub's flavour: tables and fenced blocks)."""
    s, cells = _summary(result), cells_for_learner(result)
    lines = [f"# {s['title']}", "", f"Feedback for **{_plain(s['student'])}** (`{s['assignment']}`)", ""]
    manual = f"; {s['manual']} more for written answers, graded by hand" if s["manual"] else ""
    lines += [f"**{s['score']} / {s['max_score']}** automatic points{manual}.", ""]
    lines += [f"> {_plain(note)}\n" for note in [s["note"], *s["warnings"]] if note]
    lines += ["| test cell | what it checks | points | result |", "|---|---|---:|---|"]
    for cell in cells:
        lines.append(
            f"| `{cell.grade_id}` | {_cell(cell.description)} | {cell.points_text} | {cell.status} |"
        )
    failing = [cell for cell in cells if not cell.passed and cell.kind != "manual"]
    if failing:
        lines += ["", "## What to look at"]
    for cell in failing:
        lines += ["", f"### `{cell.grade_id}` ({cell.points_text})", ""]
        fence = _fence(cell.text)
        lines += [cell.text] if cell.withheld else [f"{fence}text", cell.text, fence]
    return "\n".join(lines) + "\n"


def write_feedback(
    results: Sequence[SubmissionResult], folder: Path, failed: dict[str, str] | None = None
) -> list[Path]:
    """Write ``<folder>/<student>.html`` and ``.md`` for each submission; return the HTML pages.

    ``failed``: where given, a page that cannot be written is recorded there (``{student: why}``) and the
    others are written; else the error is raised.
    """
    folder.mkdir(parents=True, exist_ok=True)
    pages = []
    for result in results:
        try:
            stem = file_stem(result.student)
            (folder / f"{stem}.md").write_text(markdown_page(result), encoding="utf-8")
            page = folder / f"{stem}.html"
            page.write_text(html_page(result), encoding="utf-8")
        except Exception as error:
            if failed is None:
                raise
            failed[result.student] = f"feedback: {type(error).__name__}: {error}"
            continue
        pages.append(page)
    return pages
