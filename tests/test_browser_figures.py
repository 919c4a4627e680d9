"""The figures a reader can move (attention_course/interactive.py, _ext/course_figures.py), in a real browser.

Each figure is opened on its page at desktop and at phone width, in Debian's Chromium as tests/test_browser.py
drives it: it must be drawn (its cell's output marked live), fit the column, and change when each of its
controls is moved (a slider dragged, a button pressed): the data of its Bokeh models, read through
``Bokeh.documents``, and its pixels. Nothing may be logged as an error and no request may leave the machine.
Without JavaScript, and in print, the still image of the figure shows instead. The built pages are also read
as files: BokehJS is served from the book's ``_static`` (the installed bokeh's own files), and only to the
pages that hold a figure.
"""

# The fixtures of tests/test_browser.py (the built book, served; the browser) are imported, and then named
# as the tests' arguments, which ruff takes for redefinitions.
# ruff: noqa: F811

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import bokeh
import pytest
from playwright.sync_api import Browser, Locator, Page

from tests.test_browser import CHINESE, DESKTOP, PHONE, Reader, book_pages, browser, html, site  # noqa: F401

# one xdist worker builds the book for every test that reads it (make test runs with --dist loadgroup)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("book")]

SCREENS = {"desktop": DESKTOP, "phone": PHONE}
BOKEH_FILES = [f"_static/bokeh/{name}-{bokeh.__version__}.min.js" for name in ("bokeh", "bokeh-widgets")]


@dataclass(frozen=True)
class Figure:
    """A figure of the book: its page, its name (``data-course-figure``), and how to move each control:
    ``("slide", k)`` drags the k-th slider's handle to its start, ``("press", label)`` presses a button."""

    page: str
    name: str
    moves: tuple[tuple[str, object], ...]


FIGURES = [
    Figure("chapters/02_scaled_dot_product.html", "softmax-temperature", (("slide", 0),)),
    Figure(
        "chapters/02_scaled_dot_product.html",
        "dot-product-spread",
        (("slide", 0), ("press", "divide by √d_k")),
    ),
    Figure(
        "chapters/03_masks.html",
        "mask-builder",
        (("press", "window"), ("slide", 0), ("slide", 1), ("slide", 2), ("press", "padding")),
    ),
    Figure("chapters/08_positions.html", "rope-rotation", (("slide", 0), ("slide", 1))),
    Figure("chapters/11_tiled_attention.html", "online-softmax", (("slide", 0),)),
]
FIGURE_IDS = [figure.name for figure in FIGURES]

# Everything the figure's models show: the data of every data source, and every text, location and range
# end, read from the Bokeh document whose root is the figure's layout (named after the figure).
STATE = """
(name) => {
  const document = Bokeh.documents.find((d) => d.roots().some((root) => root.name === name));
  const shown = [];
  for (const model of document.all_models) {
    const values = {};
    for (const key of ["data", "text", "location", "start", "end"]) {
      const value = model.properties[key] ? model[key] : undefined;
      if (value === undefined || value === null) continue;
      if (key === "data") {
        values.data = Object.fromEntries(Object.entries(value).map(([k, v]) => [k, Array.from(v)]));
      } else if (typeof value === "number" || typeof value === "string") {
        values[key] = value;  // not an arrow's head, which is a model
      }
    }
    if (Object.keys(values).length) shown.push([model.type, values]);
  }
  return JSON.stringify(shown.sort());
}
"""

# The still image in the figure's cell output, and whether the reader sees it and the live figure.
SEEN = """
(figure) => {
  const still = figure.closest(".cell_output").querySelector("img");
  const seen = (el) => el.offsetWidth > 0 && el.offsetHeight > 0
    && el.checkVisibility({visibilityProperty: true});
  return {
    still: still !== null && seen(still) && still.complete && still.naturalWidth > 0,
    alt: still ? still.getAttribute("alt") || "" : "",
    live: seen(figure) && figure.querySelector(".course-figure-root").childElementCount > 0,
  };
}
"""


def figure_on(page: Page, name: str) -> Locator:
    return page.locator(f'.course-figure[data-course-figure="{name}"]')


def wait_until_live(page: Page, name: str) -> Locator:
    """The figure, once the book's script has drawn it (its cell's output is then marked live)."""
    page.wait_for_selector(f'.cell_output.course-figure-live .course-figure[data-course-figure="{name}"]')
    figure = figure_on(page, name)
    figure.scroll_into_view_if_needed()
    page.wait_for_timeout(200)  # the layout settles
    return figure


def move(page: Page, figure: Locator, how: str, which: object) -> None:
    """Drag a slider's handle past the left end of its track, or press a button, as a reader does."""
    if how == "slide":
        handle = figure.locator(".noUi-handle").nth(which)
        track = figure.locator(".noUi-target").nth(which)
        handle.scroll_into_view_if_needed()
        start, end = handle.bounding_box(), track.bounding_box()
        page.mouse.move(start["x"] + start["width"] / 2, start["y"] + start["height"] / 2)
        page.mouse.down()
        page.mouse.move(end["x"] - 20, start["y"] + start["height"] / 2, steps=8)
        page.mouse.up()
    else:
        figure.get_by_role("button", name=which, exact=True).click()
    page.wait_for_timeout(300)  # the callback runs, the canvas is drawn again


def open_reader(browser: Browser, site: str, path: str, screen: str) -> tuple[Reader, object]:
    """A tab on ``path`` at the screen's size that records console errors and requests (test_browser.py)."""
    reader = Reader(browser, site)
    visit = reader.open(path)
    if screen == "phone":
        reader.page.set_viewport_size(PHONE)
        reader.page.reload(wait_until="load")
    return reader, visit


@pytest.mark.parametrize("screen", SCREENS)
@pytest.mark.parametrize("figure", FIGURES, ids=FIGURE_IDS)
def test_each_control_changes_the_figure(browser, site, figure: Figure, screen: str):
    reader, visit = open_reader(browser, site, figure.page, screen)
    try:
        page = reader.page
        live = wait_until_live(page, figure.name)
        seen = live.evaluate(SEEN)
        assert seen["live"] and not seen["still"], seen  # on screen: the live figure, not its still
        # it fits the column: nothing sticks out, and the page does not scroll sideways
        box, width = live.bounding_box(), page.evaluate("document.documentElement.clientWidth")
        assert box["x"] >= 0 and box["x"] + box["width"] <= width, (box, width)
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        assert box["height"] > 200  # drawn at a readable size
        for how, which in figure.moves:
            state, pixels = page.evaluate(STATE, figure.name), live.screenshot()
            move(page, live, how, which)
            assert page.evaluate(STATE, figure.name) != state, f"{how} {which}: the data did not change"
            assert live.screenshot() != pixels, f"{how} {which}: the figure was not drawn again"
        assert page.evaluate("document.documentElement.scrollWidth") <= width
    finally:
        reader.close()
    assert visit.console_errors == []
    assert visit.external_requests == []
    assert visit.failed_requests == []


@pytest.mark.parametrize("figure", FIGURES, ids=FIGURE_IDS)
def test_the_chinese_edition_draws_the_figures(browser, site, html, figure: Figure):
    """The Chinese pages show the same figures (their cells' outputs come from the English build)."""
    if not (html / CHINESE).is_dir():
        pytest.skip("this book was built without its Chinese edition")
    reader, visit = open_reader(browser, site, CHINESE + figure.page, "phone")
    try:
        page = reader.page
        live = wait_until_live(page, figure.name)
        how, which = figure.moves[0]
        state = page.evaluate(STATE, figure.name)
        move(page, live, how, which)
        assert page.evaluate(STATE, figure.name) != state
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    finally:
        reader.close()
    assert visit.console_errors == [] and visit.external_requests == [] and visit.failed_requests == []


@pytest.mark.parametrize("figure", FIGURES, ids=FIGURE_IDS)
def test_without_javascript_the_still_image_shows(browser, site, figure: Figure):
    context = browser.new_context(viewport=PHONE, java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(site + figure.page, wait_until="load")
        found = figure_on(page, figure.name)
        found.evaluate("(figure) => figure.closest('.cell_output').querySelector('img').loading = 'eager'")
        page.wait_for_function(
            "(name) => document.querySelector(`[data-course-figure='${name}']`)"
            ".closest('.cell_output').querySelector('img').complete",
            arg=figure.name,
        )
        seen = found.evaluate(SEEN)
        assert seen["still"] and not seen["live"], seen
        assert len(seen["alt"]) >= 20, seen["alt"]
        assert found.bounding_box()["height"] < 5  # the live figure's place takes no room
    finally:
        context.close()


@pytest.mark.parametrize("figure", FIGURES, ids=FIGURE_IDS)
def test_print_shows_the_still_image_not_the_live_figure(browser, site, figure: Figure):
    reader, visit = open_reader(browser, site, figure.page, "desktop")
    try:
        page = reader.page
        live = wait_until_live(page, figure.name)
        live.evaluate("(figure) => figure.closest('.cell_output').querySelector('img').loading = 'eager'")
        page.emulate_media(media="print")
        page.wait_for_function(
            "(name) => document.querySelector(`[data-course-figure='${name}']`)"
            ".closest('.cell_output').querySelector('img').complete",
            arg=figure.name,
        )
        seen = live.evaluate(SEEN)
        assert seen["still"] and not seen["live"], seen
    finally:
        reader.close()
    assert visit.console_errors == []


# --- the built pages, read as files


def figure_pages(html: Path) -> dict[str, str]:
    """{page: its HTML} for every page of the book."""
    return {page: (html / page).read_text() for page in book_pages(html)}


def test_bokehjs_is_the_installed_packages_own(html):
    for name in BOKEH_FILES:
        served = html / name
        installed = (
            Path(bokeh.__file__).parent
            / "server/static/js"
            / Path(name).name.replace(f"-{bokeh.__version__}", "")
        )
        assert served.read_bytes() == installed.read_bytes(), name


def test_only_pages_with_a_figure_load_bokehjs(html):
    pages = figure_pages(html)
    with_figures = {page for page, text in pages.items() if 'class="course-figure"' in text}
    editions = ["", CHINESE] if (html / CHINESE).is_dir() else [""]
    assert {edition + figure.page for figure in FIGURES for edition in editions} <= with_figures
    for page, text in pages.items():
        loads = [
            name
            for name in [*BOKEH_FILES, "_static/course_figures.js", "_static/course_figures.css"]
            if name in text
        ]
        if page in with_figures:
            assert len(loads) == 4, (page, loads)
        else:
            assert loads == [], (page, loads)


def test_figures_load_nothing_from_outside_the_book(html):
    for page, text in figure_pages(html).items():
        assert "cdn.bokeh.org" not in text, page
        for figure in re.findall(r'<div class="course-figure".*?</script></div>', text, re.DOTALL):
            assert "://" not in figure, page  # no address: the JSON holds data, not links
            assert "<script" not in figure.replace(
                '<script type="application/json" class="course-figure-item">', ""
            ), page
