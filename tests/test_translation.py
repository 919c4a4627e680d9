"""The Chinese edition: every message of the English book and exercises translated, with its markup intact.

The message templates are made from the English sources in this session (``_ext/build_book.py
--gettext``'s ``templates``, about 8 s: Sphinx's gettext builder without execution, and one message per
markdown cell of each exercise's source notebook). A catalogue that lacks a message of its template, holds it
empty or fuzzy, fails its test: a change to the English text shows up here as work to do (`make locales`
adds the new messages and marks the changed ones fuzzy).

A translation keeps what the reader must see unchanged: formulas, inline code, the targets of
cross-references, citations and links (the text a reference shows may be translated).
"""

from __future__ import annotations

import collections
import importlib.util
import re

import pytest
from babel.messages.pofile import read_po
from markdown_it import MarkdownIt

from tests.conftest import ROOT

# with the book's tests, on the worker that builds the book: in `make test` the other worker has more to do
pytestmark = pytest.mark.xdist_group("book")
LOCALES = ROOT / "locales"
LANGUAGES = ["zh_CN"]


def _build_book_module():
    spec = importlib.util.spec_from_file_location("build_book", ROOT / "_ext" / "build_book.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> dict[str, dict]:
    """{catalogue's path under LC_MESSAGES: {(context, message id): template message}}, made now."""
    folder = _build_book_module().templates(tmp_path_factory.mktemp("gettext") / "gettext")
    made = {}
    for pot in sorted(folder.rglob("*.pot")):
        with pot.open("rb") as file:
            catalogue = read_po(file)
        made[pot.relative_to(folder).with_suffix(".po").as_posix()] = {
            (message.context, message.id): message for message in catalogue if message.id
        }
    return made


def catalogues() -> list[str]:
    return sorted(
        path.relative_to(LOCALES / language / "LC_MESSAGES").as_posix()
        for language in LANGUAGES
        for path in (LOCALES / language / "LC_MESSAGES").rglob("*.po")
    )


def read(language: str, name: str):
    with (LOCALES / language / "LC_MESSAGES" / name).open("rb") as file:
        return read_po(file)


def test_every_page_and_exercise_has_a_catalogue(templates):
    for language in LANGUAGES:
        have = {
            path.relative_to(LOCALES / language / "LC_MESSAGES").as_posix()
            for path in (LOCALES / language / "LC_MESSAGES").rglob("*.po")
        }
        assert sorted(set(templates) - have) == [], (
            f"pages without a {language} catalogue: run `make locales`"
        )
        assert sorted(have - set(templates)) == [], f"{language} catalogues of pages that no longer exist"


@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("name", catalogues())
def test_catalogue_translates_every_message(templates, language, name):
    """Every message of the page's template is in the catalogue, translated and not fuzzy."""
    catalogue = read(language, name)
    translated = {
        (message.context, message.id): message
        for message in catalogue
        if message.id and message.string and not message.fuzzy
    }
    untranslated = [key[1] for key in templates.get(name, {}) if key not in translated]
    assert not untranslated, (
        f"{language}/{name}: {len(untranslated)} of {len(templates.get(name, {}))} messages have no finished "
        f"translation (run `make locales`, then translate them), the first: {untranslated[0][:300]!r}"
    )


# what a translation keeps: a role's name and target, an inline formula, inline code, a link's target
ROLE = re.compile(r"\{([a-z:-]+)\}`([^`]*)`")
MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$", re.DOTALL)
CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")
LETTERS = re.compile(r"[A-Za-z]{2,}")


def kept(text: str) -> dict[str, collections.Counter]:
    """The parts of a message that its translation must keep, each kind as a multiset."""
    roles = collections.Counter()
    for role, content in ROLE.findall(text):
        target = re.search(r"<([^<>]+)>\s*$", content)
        roles[f"{{{role}}}{target.group(1) if target and role != 'cite:p' else content}"] += 1
    rest = ROLE.sub(" ", text)
    code = collections.Counter(match.group(0) for match in CODE.finditer(rest))
    rest = CODE.sub(" ", rest)
    return {
        "references": roles,
        "inline code": code,
        "formulas": collections.Counter(m.group(0) for m in MATH.finditer(rest)),
        "link targets": collections.Counter(LINK.findall(rest)),
    }


def _rendered(text: str) -> str:
    """The text a reader sees of a message (its formulas and code left out), rendered as CommonMark."""
    return MarkdownIt("commonmark").render(CODE.sub(" ", MATH.sub(" ", ROLE.sub(" ", text))))


def markup_problems(message_id: str, translation: str) -> list[str]:
    """What a translation changed of the parts it must keep (empty: nothing)."""
    if message_id.strip().startswith("\\begin") or not LETTERS.search(MATH.sub(" ", message_id)):
        # a message that is only formulas (a display equation) is kept as it is
        return [] if translation == message_id else ["a message of formulas only is copied unchanged"]
    source, target = kept(message_id), kept(translation)
    problems = []
    for marker in ("**", "__"):
        if marker in _rendered(translation) and marker not in _rendered(message_id):
            # CommonMark takes `**注意：**后` for text: emphasis may not end in punctuation before a letter
            problems.append(f"{marker} shown as text: emphasis that begins or ends with punctuation")
    for kind in source:
        if source[kind] != target[kind]:
            lost = sorted((source[kind] - target[kind]).elements())
            added = sorted((target[kind] - source[kind]).elements())
            problems.append(f"{kind}: lost {lost}, added {added}")
    return problems


@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("name", catalogues())
def test_translations_keep_formulas_code_and_references(language, name):
    problems = [
        f"{message.id[:120]!r}: {'; '.join(found)}"
        for message in read(language, name)
        if message.id and message.string and (found := markup_problems(message.id, message.string))
    ]
    assert not problems, f"{language}/{name}:\n" + "\n".join(problems[:20])


def test_markup_check_finds_a_changed_formula_and_a_lost_reference():
    source = (
        "The weights $A = \\mathrm{softmax}(S)$ of {ref}`ch-masks` and `mask` ([PyTorch](https://x.org))."
    )
    good = "权重 $A = \\mathrm{softmax}(S)$（见{ref}`掩码一章 <ch-masks>`）与 `mask`（[PyTorch](https://x.org)）。"
    assert markup_problems(source, good) == []
    assert markup_problems(source, good.replace("softmax}(S)", "softmax}(T)"))
    assert markup_problems(source, good.replace("{ref}`掩码一章 <ch-masks>`", "掩码一章"))
    assert markup_problems(source, good.replace("`mask`", "mask"))
    assert markup_problems(source, good.replace("https://x.org", "https://y.org"))
    assert markup_problems("\n\\begin{aligned} a &= b \\end{aligned}\n", "a = b")
    assert markup_problems("Note: **two** masks.", "注意：**两个：**掩码。")
    assert not markup_problems("Note: **two** masks.", "注意：**两个**掩码。")


def test_a_chinese_course_folder_is_written_for_nbgrader(tmp_path, capsys):
    """The command of instructors/release.md writes nbgrader's configuration and the translated source:
    Chinese text cells, and every code cell (solutions, hidden tests) the English source's."""
    import nbformat

    from attention_course.grading import translation
    from attention_course.registry import ASSIGNMENTS

    assert translation.main(["zh_CN", str(tmp_path / "course"), "ex02_scaled_dot_product"]) == 0
    assignment = ASSIGNMENTS["ex02_scaled_dot_product"]
    written = nbformat.read(assignment.source(tmp_path / "course"), as_version=4)
    english = nbformat.read(assignment.source(ROOT), as_version=4)
    assert (tmp_path / "course" / "nbgrader_config.py").read_text() == (
        ROOT / "nbgrader_config.py"
    ).read_text()
    assert [cell.source for cell in written.cells if cell.cell_type == "code"] == [
        cell.source for cell in english.cells if cell.cell_type == "code"
    ]
    text = [
        cell
        for cell in written.cells
        if cell.cell_type == "markdown" and not cell.metadata.nbgrader.get("solution")
    ]
    assert text and all(re.search(r"[\u4e00-\u9fff]", cell.source) for cell in text)
    # an unknown assignment is refused by name
    with pytest.raises(SystemExit):
        translation.main(["zh_CN", str(tmp_path / "other"), "ex99_nothing"])
    assert "ex99_nothing" in capsys.readouterr().err
