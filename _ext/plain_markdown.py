"""The chapters' notebooks in plain Markdown, as Jupyter and Colab render it (run by `make notebooks`).

jupytext copies a chapter's MyST Markdown into its notebook as it is, and Jupyter and Colab would show
every citation, cross-reference and directive as raw markup. After jupytext, this script rewrites the
markdown cells of the chapters' notebooks:

- citations: ``{cite:p}`vaswani2017attention` `` becomes "(Vaswani et al., 2017)" and ``{cite:t}``
  "Vaswani et al. (2017)", each linked to the paper (its ``url`` or ``doi`` in references.bib);
- cross-references (``{ref}``, ``{numref}``, ``{doc}``, ``{term}``): a link to the book's page on the
  published site (``html.baseurl`` in _config.yml), named by the reference's text or the section's title;
- directives: an admonition becomes a block quote under its title in bold, a dropdown a folded
  ``<details>`` block, a ``{literalinclude}`` the code it includes (read by Sphinx's own reader), ``{math}``
  a ``$$`` block, a code directive a fenced block;
- targets ``(label)=``, comments ``% ...`` and equation labels go; ``{math}`x` `` becomes ``$x$``.

Usage, from the book's root: python _ext/plain_markdown.py chapters/*.ipynb (rewrites their markdown cells)
"""

from __future__ import annotations

import posixpath
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import nbformat
import yaml
from course_book import author_and_year
from docutils.nodes import make_id
from pybtex.database import parse_file
from sphinx.directives.code import LiteralInclude, LiteralIncludeReader

ROOT = Path(__file__).resolve().parents[1]

ROLE = re.compile(r"\{(?P<name>[a-z][\w:-]*)\}`(?P<content>[^`]*)`")
# one cited key with its optional notes, "{see}vaswani2017attention{section 3.2}", in a list split by commas
CITED = re.compile(r"(?:\{(?P<pre>[^{}]*)\})?(?P<key>[^{},\s]+)(?:\{(?P<post>[^{}]*)\})?")
EXPLICIT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.DOTALL)  # "text <target>"
FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,}|:{3,})\s*(?P<info>.*)$")
DIRECTIVE = re.compile(r"^\{(?P<name>[\w:-]+)\}\s*(?P<argument>.*)$")
OPTION = re.compile(r"^:(?P<name>[\w-]+):(?:\s+(?P<value>.*))?$")
TARGET = re.compile(r"^\s*\((?P<label>[^()\s]+)\)=\s*$")
COMMENT = re.compile(r"^\s*%")
EQUATION_LABEL = re.compile(r"(\$\$)\s*\([^()\s]+\)\s*$", re.MULTILINE)
HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*$")
CODE = {"code", "code-block", "sourcecode"}
# what Jupyter would show as written: roles, directive fences and options, targets, comments, labels
MARKER = re.compile(
    r"\{[a-z][\w:-]*\}`|^ {0,3}(?:`{3,}|~{3,}|:{3,})\s*\{|^ {0,3}:{3,}\s*$|^\s*\([^()\s]+\)=\s*$|^\s*%"
    r"|^:[\w-]+:(?:\s|$)|\$\$\s*\([^()\s]+\)\s*$",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Citation:
    author: str  # "Vaswani et al."
    year: str
    url: str  # the paper, or the book's bibliography where references.bib gives no address


@dataclass(frozen=True)
class Book:
    """What the cross-references and citations of a chapter point to."""

    root: Path  # the repository's working tree
    site: str  # the published book, ending in "/"
    titles: dict[str, str]  # page ("chapters/04_multi_head") -> its title
    labels: dict[str, tuple[str, str]]  # label -> (page, title of the section it labels)
    citations: dict[str, Citation]  # bibliography key -> citation

    @classmethod
    def load(cls, root: Path = ROOT) -> Book:
        config = yaml.safe_load((root / "_config.yml").read_text())
        site = config["html"]["baseurl"].rstrip("/") + "/"
        titles, labels = {}, {}
        patterns = ("*.md", "chapters/*.md", "instructors/*.md", "exercises/*/*.ipynb")
        for path in (path for pattern in patterns for path in root.glob(pattern)):
            if path.name == "README.md":
                continue
            page = path.relative_to(root).with_suffix("").as_posix()
            lines = list(_prose_lines(_markdown_of(path)))
            headings = [HEADING.match(line) for line in lines]
            titles[page] = next((h["title"] for h in headings if h and h.group().startswith("# ")), page)
            for i, line in enumerate(lines):
                if target := TARGET.match(line):
                    following = next((h for h in headings[i + 1 :] if h), None)
                    labels[target["label"].lower()] = (page, following["title"] if following else page)
        citations = {}
        for key, entry in parse_file(root / "references.bib").entries.items():
            author, year = author_and_year(entry)
            if "url" in entry.fields:
                url = entry.fields["url"]
            elif "doi" in entry.fields:
                url = f"https://doi.org/{entry.fields['doi']}"
            else:
                url = f"{site}bibliography.html"
            citations[key.lower()] = Citation(author, year, url)
        return cls(root, site, titles, labels, citations)


def _markdown_of(path: Path) -> str:
    """A page's Markdown: a .md file after its front matter, or a notebook's markdown cells."""
    if path.suffix == ".ipynb":
        cells = nbformat.read(path, as_version=4).cells
        return "\n\n".join(cell.source for cell in cells if cell.cell_type == "markdown")
    text = path.read_text()
    if text.startswith("---\n"):
        text = text.split("\n---\n", 1)[-1]
    return text


def _closing(lines: list[str], start: int, fence: str) -> int:
    """The index of the line that closes the fence opened at ``start`` (len(lines) if none does)."""
    for end in range(start + 1, len(lines)):
        stripped = lines[end].strip()
        if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
            return end
    return len(lines)


def _prose_lines(markdown: str) -> Iterator[str]:
    """The lines of Markdown outside code: of a code or maths directive, only its first line."""
    lines = markdown.split("\n")
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        directive = DIRECTIVE.match(fence["info"]) if fence else None
        if fence and (not directive or directive["name"] in CODE | {"code-cell", "math"}):
            if directive:
                yield lines[i]
            i = _closing(lines, i, fence["fence"]) + 1
            continue
        yield lines[i]
        i += 1


def myst_markers(markdown: str) -> list[str]:
    """The MyST-only markup in a markdown cell, outside fenced code: one line of text for each."""
    return [match.group().strip() for match in MARKER.finditer("\n".join(_prose_lines(markdown)))]


def plain_markdown(source: str, book: Book, page: str) -> str:
    """A markdown cell of the page ``page`` (say "chapters/04_multi_head") in plain Markdown."""
    return "\n".join(_blocks(source.split("\n"), book, page)).strip("\n")


def _blocks(lines: list[str], book: Book, page: str) -> Iterator[str]:
    paragraph: list[str] = []  # roles may wrap over lines: rewrite them a paragraph at a time
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence or TARGET.match(line) or COMMENT.match(line):
            if paragraph:
                yield from _inline("\n".join(paragraph), book, page).split("\n")
                paragraph = []
        if fence:
            end = _closing(lines, i, fence["fence"])
            body = lines[i + 1 : end]
            if directive := DIRECTIVE.match(fence["info"]):
                yield from _directive(directive["name"], directive["argument"].strip(), body, book, page)
            else:
                yield from lines[i : end + 1]
            i = end + 1
            continue
        if not (TARGET.match(line) or COMMENT.match(line)):
            paragraph.append(line)
        i += 1
    if paragraph:
        yield from _inline("\n".join(paragraph), book, page).split("\n")


def _directive(name: str, argument: str, body: list[str], book: Book, page: str) -> Iterator[str]:
    options = {}
    if body and body[0].strip() == "---":  # options as a YAML block
        end = body.index("---", 1) if "---" in body[1:] else 0
        options, body = yaml.safe_load("\n".join(body[1:end])) or {}, body[end + 1 :]
    while body and (option := OPTION.match(body[0])):
        options[option["name"]] = yaml.safe_load(option["value"]) if option["value"] else None
        body = body[1:]
    body = body[1:] if body and not body[0].strip() else body
    if name in CODE:
        yield f"```{argument}"
        yield from body
        yield "```"
    elif name == "math":
        yield "$$"
        yield from body
        yield "$$"
    elif name == "literalinclude":  # the lines the book shows, read as Sphinx reads them
        spec = LiteralInclude.option_spec
        options = {key: spec[key](None if value is None else str(value)) for key, value in options.items()}
        path = book.root / posixpath.dirname(page) / argument
        text, _ = LiteralIncludeReader(str(path), options, SimpleNamespace(source_encoding="utf-8")).read()
        yield f"```{options.get('language', '')}"
        yield from text.rstrip("\n").split("\n")
        yield "```"
    elif name == "dropdown" or re.search(r"\bdropdown\b", str(options.get("class", ""))):
        yield "<details>"  # folded, as in the book: Jupyter and Colab open it on a click
        yield f"<summary><b>{argument or name.capitalize()}</b></summary>"
        yield ""
        yield from _blocks(body, book, page)
        yield ""
        yield "</details>"
    else:  # an admonition, any other directive: a block quote under its title
        yield f"> **{_inline(argument or name.capitalize(), book, page)}**"
        yield ">"
        yield from (f"> {line}".rstrip() for line in _blocks(body, book, page))


def _inline(text: str, book: Book, page: str) -> str:
    """Rewrite the roles in a paragraph of text."""

    def explicit(content: str) -> tuple[str, str]:
        match = EXPLICIT.match(content)
        return (match["text"], match["target"]) if match else ("", content)

    def role(match: re.Match) -> str:
        name, content = match["name"], match["content"]
        if name.startswith("cite"):
            return _citation(name.partition(":")[2].startswith("t"), content, book)
        text, target = explicit(content)
        if name in ("ref", "numref"):
            labelled, title = book.labels[target.lower()]
            return f"[{text or title}]({book.site}{labelled}.html#{make_id(target)})"
        if name == "doc":
            target = target.removesuffix(".md").removesuffix(".ipynb")
            linked = target[1:] if target.startswith("/") else posixpath.dirname(page) + "/" + target
            linked = posixpath.normpath(linked)
            return f"[{text or book.titles[linked]}]({book.site}{linked}.html)"
        if name == "term":
            return f"[{text or target}]({book.site}glossary.html)"
        if name == "math":
            return f"${content}$"
        return text or target

    return ROLE.sub(role, EQUATION_LABEL.sub(r"\1", text))


def _citation(textual: bool, content: str, book: Book) -> str:
    """ "(Vaswani et al., 2017, section 3.2)" or, textual, "Vaswani et al. (2017, section 3.2)"."""
    texts = []
    for cited in CITED.finditer(content):
        citation = book.citations[cited["key"].lower()]
        pre = f"{cited['pre']} " if cited["pre"] else ""
        post = f", {cited['post']}" if cited["post"] else ""
        if textual:
            texts.append(f"{pre}[{citation.author} ({citation.year}{post})]({citation.url})")
        else:
            texts.append(f"{pre}[{citation.author}, {citation.year}{post}]({citation.url})")
    return ", ".join(texts) if textual else "(" + "; ".join(texts) + ")"


def plain_notebook(notebook: nbformat.NotebookNode, book: Book, page: str) -> nbformat.NotebookNode:
    """The notebook with its markdown cells rewritten in plain Markdown (in place)."""
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell.source = plain_markdown(cell.source, book, page)
    return notebook


def main(paths: list[str]) -> None:
    book = Book.load()
    for name in paths:  # relative to the book's root: chapters/04_multi_head.ipynb is that page's notebook
        notebook = nbformat.read(name, as_version=4)
        markdown = [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]
        before = sum(len(myst_markers(source)) for source in markdown)
        plain_notebook(notebook, book, Path(name).with_suffix("").as_posix())
        nbformat.write(notebook, name)
        print(f"{name}: {before} MyST markers rewritten in plain Markdown")


if __name__ == "__main__":
    main(sys.argv[1:])
