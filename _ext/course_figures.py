"""Figures a reader can move, drawn with BokehJS that the book serves itself (``_config.yml`` loads this).

A chapter cell draws such a figure with ``attention_course.interactive.show``: its output is a
``<div class="course-figure">`` holding a Bokeh layout as JSON (every number it can show computed in the
cell; the controls only select among them), followed by a still image of the figure's default state. To
draw the div, a page needs BokehJS. This extension:

- copies the minified BokehJS that the installed ``bokeh`` package ships (the core and the widgets, the
  same version that wrote the JSON, which BokehJS checks) into the build's ``_static/bokeh/``, so that the
  book works offline and loads nothing from a CDN: no page makes a request that leaves the book;
- adds the ``<script>`` tags for them, and for ``_static/course_figures.js`` (which draws each figure and
  marks it live) and the stylesheet ``_static/course_figures.css`` (which hides the still image on screen
  once the figure is live, and the live figure in print), to the pages that hold a figure, and to no other:
  BokehJS is 1.65 MB (0.45 MB compressed), more than the rest of a chapter's page. Sphinx adds a file to
  one page when ``app.add_js_file`` is called during that page's ``html-page-context`` event.

Jupyter Book adds every ``.css`` and ``.js`` file of the book's ``_static`` folder to every page
(``html_css_files``, ``html_js_files``); this extension takes its own two back out of those lists, so that
they reach only the pages with a figure.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import bokeh
from bokeh.util.paths import bokehjs_path

# what every figure page loads, in this order: BokehJS's core, its widgets (sliders, toggles), then the
# script that draws the figures; other Bokeh bundles (tables, WebGL, MathJax) are not used
BOKEH_BUNDLES = ("bokeh", "bokeh-widgets")
SCRIPT, STYLESHEET = "course_figures.js", "course_figures.css"
# what attention_course.interactive writes around each figure
MARKER = 'class="course-figure"'


def bokeh_files() -> dict[str, Path]:
    """{path under the build's ``_static``: the installed file} for the BokehJS bundles the pages load."""
    version = bokeh.__version__
    return {
        f"bokeh/{name}-{version}.min.js": bokehjs_path() / "js" / f"{name}.min.js" for name in BOKEH_BUNDLES
    }


def _own_files_on_figure_pages_only(app, config) -> None:
    """Take this extension's files out of the lists that Jupyter Book fills with all of ``_static``."""

    def ours(entry) -> bool:
        name = entry if isinstance(entry, str) else entry[0]
        return name in (SCRIPT, STYLESHEET)

    config.html_css_files = [entry for entry in config.html_css_files if not ours(entry)]
    config.html_js_files = [entry for entry in config.html_js_files if not ours(entry)]


def _copy_bokehjs(app) -> None:
    """Copy BokehJS into the build's ``_static`` (before the pages are written, so that their script tags
    carry the files' checksums)."""
    if app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    for target, source in bokeh_files().items():
        destination = static / target
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, destination)


def _scripts_on_figure_pages(app, pagename, templatename, context, doctree) -> None:
    """Add BokehJS, the drawing script and the stylesheet to a page that holds a figure."""
    if MARKER not in context.get("body", ""):
        return
    for target in bokeh_files():
        app.add_js_file(target, loading_method="defer")
    app.add_js_file(SCRIPT, loading_method="defer")
    app.add_css_file(STYLESHEET)


def setup(app):
    # before Sphinx reads html_css_files and html_js_files (its own handler runs at priority 800)
    app.connect("config-inited", _own_files_on_figure_pages_only, priority=400)
    app.connect("builder-inited", _copy_bokehjs)
    # before course_book's _unique_scripts (priority 900), which copies the page's list of scripts
    app.connect("html-page-context", _scripts_on_figure_pages, priority=500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
