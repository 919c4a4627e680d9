"""Sphinx additions for the course's book (loaded through ``sphinx: local_extensions`` in _config.yml).

- One citation style throughout: author and year, in the text as "(Vaswani et al., 2017)" or
  "Vaswani et al. (2017)", and as the label of each entry of the bibliography.
- Alt text for every figure that a cell draws: a code cell's metadata ``alt`` holds one text, or a list
  with one text per image the cell outputs, in order (myst-nb's own ``mystnb: image: alt:`` gives all
  the images of a cell the same text, which does not describe a figure of several panels).
- Figures at twice their pixels: the chapters draw in matplotlib's "retina" format, whose output gives
  the figure's size in CSS pixels (half its pixels). Only the width is kept: with a fixed height too, a
  figure squeezed into a phone's column would be squashed instead of scaled.
- Search snippets without TeX: Sphinx's search cuts a result's snippet from the text of the page's HTML,
  where a formula is still TeX source (MathJax typesets it only on the page itself), so "softmax" found
  "\\(\\operatorname{softmax}(QK^\\top)\\)". A small script has the search leave formulas out of the text it
  cuts snippets from, each marked by an ellipsis (Sphinx has no setting for it, only one that drops every
  snippet: ``html_show_search_summary``).
- Two editions, English and Chinese (``_ext/build_book.py``): every page links to the same page in the other
  edition, as a link at the top of the article and as ``<link rel="alternate" hreflang>`` for search engines.
  The Chinese exercise pages show the Chinese release notebooks (``exercises/<id>/zh_CN/<id>.ipynb``, whose
  markdown is translated cell by cell) in place of the English ones.
- Each inline script once per page: Sphinx 7.4 adds an inline script that an extension registers after
  the builder has started twice (once from the registry with ``filename=''``, once directly with
  ``filename=None``), so every page declared ``const THEBE_JS_URL`` twice and the browser logged
  "Identifier 'THEBE_JS_URL' has already been declared".
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import sphinxcontrib.bibtex.plugin
from docutils import nodes
from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle
from sphinx.util import logging
from sphinxcontrib.bibtex.style.referencing import BracketStyle
from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle

logger = logging.getLogger(__name__)


def _round() -> BracketStyle:
    return BracketStyle(left="(", right=")")


@dataclass
class RoundAuthorYearReferenceStyle(AuthorYearReferenceStyle):
    """Author-year citations in round brackets: "(Vaswani et al., 2017)", "Vaswani et al. (2017)"."""

    bracket_parenthetical: BracketStyle = field(default_factory=_round)
    bracket_textual: BracketStyle = field(default_factory=_round)
    bracket_author: BracketStyle = field(default_factory=_round)
    bracket_label: BracketStyle = field(default_factory=_round)
    bracket_year: BracketStyle = field(default_factory=_round)


class AuthorYearLabelStyle(BaseLabelStyle):
    """Bibliography labels that read like the citations in the text: "Vaswani et al., 2017"."""

    def format_labels(self, sorted_entries):
        for entry in sorted_entries:
            yield self.format_label(entry)

    @staticmethod
    def format_label(entry) -> str:
        author, year = author_and_year(entry)
        return f"{author}, {year}"


def author_and_year(entry) -> tuple[str, str]:
    """("Vaswani et al.", "2017") for a pybtex entry: the book's citations, and the chapters' notebooks."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    surnames = [Text.from_latex(" ".join(person.last_names)).render_as("text") for person in people]
    if not surnames:
        author = entry.fields.get("title", entry.key)
    elif len(surnames) == 1:
        author = surnames[0]
    elif len(surnames) == 2:
        author = f"{surnames[0]} and {surnames[1]}"
    else:
        author = f"{surnames[0]} et al."
    return author, entry.fields.get("year", "n.d.")


class AuthorYearStyle(PlainStyle):
    """pybtex's plain style (sorted by author, year, title) with author-year labels."""

    default_label_style = "course_author_year"


def _figure_alt_texts(app, doctree) -> None:
    """Give the images of each code cell's outputs the alt texts of the cell's ``alt`` metadata."""
    for cell in doctree.findall(nodes.container):
        if cell.get("nb_element") != "cell_code" or "alt" not in cell.get("cell_metadata", {}):
            continue
        alt = cell["cell_metadata"]["alt"]
        images = list(cell.findall(nodes.image))
        texts = [alt] * len(images) if isinstance(alt, str) else list(alt)
        if len(texts) != len(images):
            logger.warning(
                f"cell {cell.get('cell_index')}: {len(texts)} alt texts for {len(images)} images",
                location=cell,
            )
            continue
        for image, text in zip(images, texts, strict=True):
            image["alt"] = text


# Runs before searchtools.js (the theme loads it after the page's scripts), so it waits for the page to be
# parsed; searchtools starts searching on the same event, after it (its listener is added later).
SEARCH_WITHOUT_TEX = """
document.addEventListener("DOMContentLoaded", () => {
  if (typeof Search === "undefined" || !Search.htmlToText) return;
  const htmlToText = Search.htmlToText;
  Search.htmlToText = (html, anchor) => {
    const page = new DOMParser().parseFromString(html, "text/html");
    page.querySelectorAll(".math").forEach((math) => math.replaceWith("\u2026"));
    return htmlToText(page.documentElement.outerHTML, anchor);
  };
});
"""


def _figure_width_only(app, doctree) -> None:
    """Drop the height of the images that code cells output (see the module docstring)."""
    for cell in doctree.findall(nodes.container):
        if cell.get("nb_element") == "cell_code":
            for image in cell.findall(nodes.image):
                image.attributes.pop("height", None)


def _unique_scripts(app, pagename, templatename, context, doctree) -> None:
    """Drop the second copy of an inline script (see the module docstring)."""
    seen, unique = set(), []
    for script in context.get("script_files", []):
        key = (script.filename or "", tuple(sorted(script.attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


# language: (the edition's folder under the English edition's root, its name as its readers write it,
# its language tag)
EDITIONS = {"en": ("", "English", "en"), "zh_CN": ("zh/", "中文", "zh-CN")}


def _edition(app) -> str:
    return app.config.language if app.config.language in EDITIONS else "en"


def _other_editions(app, pagename, templatename, context, doctree) -> None:
    """Link the page to the same page in the other editions (see the module docstring)."""
    here = _edition(app)
    root = "../" * (pagename.count("/") + EDITIONS[here][0].count("/"))
    links, alternates = [], []
    for language, (folder, name, tag) in EDITIONS.items():
        if language == here:
            continue
        href = html.escape(f"{root}{folder}{pagename}.html")
        links.append(f'<a class="course-edition" href="{href}" hreflang="{tag}" lang="{tag}">{name}</a>')
        alternates.append(f'<link rel="alternate" hreflang="{tag}" href="{href}" />')
    context["metatags"] = context.get("metatags", "") + "\n".join(alternates)
    if doctree is not None and "body" in context:
        context["body"] = f'<p class="course-editions">{" ".join(links)}</p>\n' + context["body"]


def _translated_exercise(app, docname, source) -> None:
    """In a translated edition, read an exercise page from its release in that language."""
    here = _edition(app)
    parts = docname.split("/")
    if here == "en" or len(parts) != 3 or parts[0] != "exercises":
        return
    translated = Path(app.srcdir, "exercises", parts[1], here, f"{parts[2]}.ipynb")
    if translated.is_file():
        source[0] = translated.read_text(encoding="utf-8")
    else:
        logger.warning(f"{docname} has no {here} release ({translated}): run `make release`")


def setup(app):
    register_plugin("pybtex.style.labels", "course_author_year", AuthorYearLabelStyle)
    register_plugin("pybtex.style.formatting", "course_author_year", AuthorYearStyle)
    sphinxcontrib.bibtex.plugin.register_plugin(
        "sphinxcontrib.bibtex.style.referencing", "course_author_year", RoundAuthorYearReferenceStyle
    )
    app.connect("doctree-read", _figure_alt_texts)
    app.connect("doctree-read", _figure_width_only)
    app.add_js_file(None, body=SEARCH_WITHOUT_TEX)
    app.connect("html-page-context", _unique_scripts, priority=900)
    app.connect("html-page-context", _other_editions)
    app.connect("source-read", _translated_exercise)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
