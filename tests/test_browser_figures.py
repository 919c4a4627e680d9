"""The figures a reader can move (attention_course/interactive.py, _ext/course_figures.py), in a real browser.

Each page that holds figures is opened once per edition, in Debian's Chromium as tests/test_browser.py drives
it, and measured at desktop then at phone width: each figure must be drawn (its cell's output marked live),
fit the column, and change when each of its controls is moved (a slider dragged, a button pressed): the data
of its Bokeh models, read through ``Bokeh.documents``, and its pixels. Nothing may be logged as an error and
no request may leave the machine. Without JavaScript, and in print, the still image of the figure shows
instead. The built pages are also read
as files: BokehJS is served from the book's ``_static`` (the installed bokeh's own files), and only to the
pages that hold a figure.
"""

# The fixtures of tests/test_browser.py (the built book, served; the browser) are imported, and then named
# as the tests' arguments, which ruff takes for redefinitions.
# ruff: noqa: F811

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import bokeh
import pytest
from playwright.sync_api import Locator, Page
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.test_browser import CHINESE, DESKTOP, PHONE, Reader, Visit, book_pages, browser, html, site  # noqa: F401

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


def move(page: Page, figure: Locator, how: str, which: object, to_end: bool = False) -> None:
    """Drag a slider's handle past one end of its track (the start, or the end), or press a button, as a
    reader does."""
    if how == "slide":
        handle = figure.locator(".noUi-handle").nth(which)
        track = figure.locator(".noUi-target").nth(which)
        handle.scroll_into_view_if_needed()
        start, end = handle.bounding_box(), track.bounding_box()
        page.mouse.move(start["x"] + start["width"] / 2, start["y"] + start["height"] / 2)
        page.mouse.down()
        x = end["x"] + end["width"] + 20 if to_end else end["x"] - 20
        page.mouse.move(x, start["y"] + start["height"] / 2, steps=8)
        page.mouse.up()
    else:
        figure.get_by_role("button", name=which, exact=True).click()


def changed_from(page: Page, name: str, before: str) -> bool:
    """Whether the figure's models leave the state ``before`` within a second (the callback runs when the
    control moves), then once the canvas has been drawn again (two animation frames later)."""
    try:
        page.wait_for_function(
            f"([name, before]) => ({STATE})(name) !== before", arg=[name, before], timeout=1_000
        )
    except PlaywrightTimeoutError:
        return False
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")
    return True


@dataclass
class Seen:
    """What one figure did at one screen size of one edition's page."""

    figure: Figure
    edition: str
    screen: str
    shown: dict = field(default_factory=dict)  # SEEN: the still and the live figure, on screen
    box: dict = field(default_factory=dict)
    width: int = 0  # of the page's viewport
    scroll_width: int = 0  # of the page, after the moves
    moved: list[tuple[str, object, bool, bool]] = field(default_factory=list)  # (how, which, data, pixels)
    printed: dict = field(default_factory=dict)  # SEEN in print (desktop only)
    visit: Visit | None = None


@pytest.fixture(scope="module")
def seen(browser, site, html) -> list[Seen]:
    """Every figure of the English pages at desktop then phone width, and of the Chinese pages at phone
    width, in one tab that opens each page once.

    At each width every control is moved once (sliders dragged to the start at desktop width, to the end at
    phone width, so that each move changes something: see ``moves``); the Chinese pages move each figure's
    first control.
    At desktop width, the page is then shown as printed.
    """
    editions = ["", CHINESE] if (html / CHINESE).is_dir() else [""]
    reader, found = Reader(browser, site), []
    try:
        for edition in editions:
            for page_path in dict.fromkeys(figure.page for figure in FIGURES):
                visit = reader.open(edition + page_path)
                page = reader.page
                on_page = [figure for figure in FIGURES if figure.page == page_path]
                for screen in SCREENS if edition == "" else ["phone"]:
                    page.set_viewport_size(SCREENS[screen])
                    for figure in on_page:
                        record = Seen(figure, edition, screen, visit=visit)
                        live = wait_until_live(page, figure.name)
                        record.shown = live.evaluate(SEEN)
                        record.box = live.bounding_box()
                        record.width = page.evaluate("document.documentElement.clientWidth")
                        for how, which in moves(figure, edition, screen):
                            state, pixels = page.evaluate(STATE, figure.name), live.screenshot()
                            move(page, live, how, which, to_end=screen == "phone")
                            changed = changed_from(page, figure.name, state)
                            record.moved.append((how, which, changed, live.screenshot() != pixels))
                        record.scroll_width = page.evaluate("document.documentElement.scrollWidth")
                        if screen == "desktop":  # (the English pages: the figures are the same)
                            live.evaluate(EAGER_STILL)
                            page.emulate_media(media="print")
                            page.wait_for_function(STILL_LOADED, arg=figure.name)
                            record.printed = live.evaluate(SEEN)
                            page.emulate_media(media="screen")
                        found.append(record)
    finally:
        reader.close()
    return found


def moves(figure: Figure, edition: str, screen: str) -> tuple[tuple[str, object], ...]:
    """The moves made on a figure: all of them at desktop width, then again in the reverse order at phone
    width (a button pressed again before the sliders it enables are dragged the other way); the Chinese
    pages' first move only."""
    if edition:
        return figure.moves[:1]
    return figure.moves if screen == "desktop" else figure.moves[::-1]


EAGER_STILL = "(figure) => figure.closest('.cell_output').querySelector('img').loading = 'eager'"
STILL_LOADED = (
    "(name) => document.querySelector(`[data-course-figure='${name}']`)"
    ".closest('.cell_output').querySelector('img').complete"
)


def test_every_figure_is_seen_on_both_editions(seen, html):
    chinese = 1 if (html / CHINESE).is_dir() else 0
    assert len(seen) == len(FIGURES) * (len(SCREENS) + chinese)
    assert {record.figure.name for record in seen} == set(FIGURE_IDS)


def test_on_screen_the_live_figure_shows_not_its_still(seen):
    assert [
        (r.figure.name, r.edition, r.screen, r.shown) for r in seen if not r.shown["live"] or r.shown["still"]
    ] == []


def test_each_figure_fits_the_column_at_a_readable_size(seen):
    def misfit(record: Seen) -> bool:
        box = record.box
        return (
            box["x"] < 0
            or box["x"] + box["width"] > record.width
            or record.scroll_width > record.width
            or box["height"] <= 200
        )

    assert [(r.figure.name, r.edition, r.screen, r.box, r.width) for r in seen if misfit(r)] == []


def test_each_control_changes_the_figure(seen):
    """Moving a control changes the data of the figure's models and its pixels, at both widths; on the
    Chinese pages, each figure's first control."""
    unchanged = [
        (r.figure.name, r.edition, r.screen, how, which, "data" if not data else "pixels")
        for r in seen
        for how, which, data, pixels in r.moved
        if not (data and pixels)
    ]
    assert unchanged == []
    assert all(len(r.moved) == (len(r.figure.moves) if r.edition == "" else 1) for r in seen)


def test_print_shows_the_still_image_not_the_live_figure(seen):
    printed = [r for r in seen if r.screen == "desktop"]
    assert (
        printed
        and [
            (r.figure.name, r.edition, r.printed)
            for r in printed
            if not r.printed["still"] or r.printed["live"]
        ]
        == []
    )


def test_figure_pages_log_no_error_and_request_nothing_outside(seen):
    visits = {id(r.visit): r.visit for r in seen}.values()
    assert [
        (v.page, v.console_errors, v.external_requests, v.failed_requests)
        for v in visits
        if v.console_errors or v.external_requests or v.failed_requests
    ] == []


@pytest.mark.parametrize("page_path", dict.fromkeys(figure.page for figure in FIGURES))
def test_without_javascript_the_still_images_show(browser, site, page_path: str):
    context = browser.new_context(viewport=PHONE, java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(site + page_path, wait_until="load")
        for figure in FIGURES:
            if figure.page != page_path:
                continue
            found = figure_on(page, figure.name)
            found.evaluate(EAGER_STILL)
            page.wait_for_function(STILL_LOADED, arg=figure.name)
            shown = found.evaluate(SEEN)
            assert shown["still"] and not shown["live"], (figure.name, shown)
            assert len(shown["alt"]) >= 20, shown["alt"]
            assert found.bounding_box()["height"] < 5  # the live figure's place takes no room
    finally:
        context.close()


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
