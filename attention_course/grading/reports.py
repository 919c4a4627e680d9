"""Reports of a graded batch: ``report.json`` (everything), ``report.csv`` (a row per submission and grade
cell, safe to open in a spreadsheet), and a summary on the console."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attention_course.grading.submission import SubmissionResult

#: what a spreadsheet reads as the start of a formula (OWASP, "CSV Injection"): a tab and a carriage return
#: too, which some programs strip before they look at the next character
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(text: str) -> str:
    """``text`` as a CSV field that a spreadsheet shows as text: one that starts like a formula gets a leading
    apostrophe, OWASP's rule (a message that begins ``=HYPERLINK(...)``, a student id ``-1+1``). Numbers are
    written as numbers and not passed here."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def write_reports(
    results: list[SubmissionResult], assignment_id: str, out: Path, settings: dict[str, Any]
) -> None:
    """Write ``out/report.json`` and ``out/report.csv``; ``settings``: how the batch was graded."""
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "assignment": assignment_id,
        "graded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **settings,
        "submissions": [result.as_dict() for result in results],
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    with open(out / "report.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "grade_id", "kind", "points", "max_points", "status", "message", "path"])
        for result in results:
            for cell in result.cells:
                points = "" if cell.points is None else cell.points
                text = [result.student, cell.grade_id, cell.kind, cell.status, cell.message, result.path]
                student, grade_id, kind, status, message, path = map(spreadsheet_safe, map(str, text))
                writer.writerow([student, grade_id, kind, points, cell.max_points, status, message, path])


def summarise(results: list[SubmissionResult], console: Console) -> None:
    """A table of scores, then the failing cells of each submission with their messages."""
    table = Table(title="Automatic scores (written answers are graded by hand)")
    for column in ("student", "score", "status", "seconds"):
        table.add_column(column, justify="right" if column in ("score", "seconds") else "left")
    for result in results:
        table.add_row(
            escape(result.student),
            f"{result.score:g} / {result.max_score:g}",
            result.status,
            f"{result.seconds:.1f}",
        )
    console.print(table)
    for result in results:
        for warning in result.warnings:
            console.print(
                f"[bold]{escape(result.student)}[/bold]: warning: {escape(warning)}", highlight=False
            )
        if result.review:  # its "from scratch" points are withheld until someone reads these lines
            console.print(f"[bold]{escape(result.student)}[/bold]: needs review:", highlight=False)
            for line in result.review:
                console.print(f"  {line}", highlight=False, markup=False)
        failing = [cell for cell in result.cells if cell.kind == "auto" and cell.status != "passed"]
        if failing:
            console.print(
                f"[bold]{escape(result.student)}[/bold]: {len(failing)} failing cell(s)", highlight=False
            )
            for cell in failing:
                first = cell.message.splitlines()[0] if cell.message else ""
                console.print(f"  {cell.grade_id} ({cell.status}): {first}", highlight=False, markup=False)
