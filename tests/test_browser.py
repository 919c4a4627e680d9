"""The book as readers see it: every page of both editions opened in a real browser, Debian's Chromium.

The session's one build of the book (the fixture ``built_book``) is served on 127.0.0.1 and every page is
opened once, measured as a desktop shows it (1280 px wide), then resized and measured as a phone shows
it (390 px). That single pass collects what the tests below check, one property each, over all pages:
console errors, requests leaving the machine, raw TeX, images, links and anchors, code cut off, pages
that scroll sideways, display equations cut off at the column's edge, identifiers split mid-word, lines
of code that wrap, figures shrunk past legibility or blurred on a high-density screen, alt texts, and
answers shown before an exercise; the search page is checked for TeX in its snippets.

Playwright drives the browser that Debian packages (``executable_path``); it never downloads one. Where
that browser is missing and cannot be installed (no root, no apt-get), the tests are skipped and say so;
where it could be installed (`make chromium`), they fail. With ``BOOK_SCREENSHOTS=<folder>`` the pass
also saves a full-page screenshot of every page at both widths there.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from playwright.sync_api import Browser, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from attention_course.registry import ASSIGNMENTS
from tests.conftest import ROOT, BookBuild

# one xdist worker builds the book for every test that reads it (make test runs with --dist loadgroup)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("book")]

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
# how long a page's requests may go on after its load event, before the next page is opened; and how long
# without a request starting or ending counts as the page having settled
SETTLE_MS = 60_000
QUIET_S = 0.15
# A figure is drawn for 100 dpi with 10-point text (14 CSS px); shown at these fractions of that size or
# more, its smallest text stays at about 10 px on a desktop and 8 px on a phone. Its PNG holds twice the
# pixels (matplotlib's "retina" format) so that a screen of DEVICE_PIXEL_RATIO device pixels per CSS pixel
# (phones, most laptops) draws it without blurring: at least that many image pixels per CSS pixel.
LEGIBLE_SCALE = {"desktop": 0.72, "phone": 0.58}
DEVICE_PIXEL_RATIO = 2
# TeX as MathJax reads it: its delimiters, or a command; in a search snippet the reader sees it raw
TEX = re.compile(r"\\[()[\]]|\\(?:begin|frac|sqrt|mathrm|mathbf|operatorname|text|top|cdot|sum|mathbb)\b")
# the Chinese edition's folder (_ext/build_book.py)
CHINESE = "zh/"
SOLUTION_MARKERS = (
    "BEGIN SOLUTION",
    "END SOLUTION",
    "BEGIN HIDDEN TESTS",
    "END HIDDEN TESTS",
    "from solutions",
)


def page_function(name: str) -> str:
    """A JavaScript function from tests/browser/, without its leading comment (Playwright then calls it)."""
    source = (Path(__file__).parent / "browser" / name).read_text()
    return "".join(line for line in source.splitlines(keepends=True) if not line.startswith("//"))


# one measures a page (after waiting for the maths and the images); one finds where a chapter defines the
# functions that an exercise asks for; one waits for a page's typesetting and fonts
MEASURE = page_function("measure.js")
DEFINITIONS = page_function("definitions.js")
SETTLED = page_function("settled.js")


@dataclass
class Visit:
    """What one page showed: measured at desktop and at phone width, and what it logged and requested."""

    page: str
    desktop: dict = field(default_factory=dict)
    phone: dict = field(default_factory=dict)
    definitions: list[dict] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)


def chromium() -> Path:
    """Debian's chromium; skip where it cannot be installed, fail where it could have been."""
    if CHROMIUM.is_file():
        return CHROMIUM
    root = getattr(os, "geteuid", lambda: -1)() == 0
    if root and shutil.which("apt-get"):
        pytest.fail(f"{CHROMIUM} is missing, and this machine can install it: run `make chromium`")
    pytest.skip(
        f"Debian's chromium is not at {CHROMIUM} and cannot be installed here "
        "(installing it needs root and apt-get); set CHROMIUM to another Chromium to run these tests"
    )


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="module")
def html(built_book: BookBuild) -> Path:
    return built_book.require()


@pytest.fixture(scope="module")
def site(html: Path) -> Iterator[str]:
    """The built book served over HTTP on 127.0.0.1 (a free port), as a reader's browser gets it."""
    handler = functools.partial(_QuietHandler, directory=str(html))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{server.server_address[1]}/"
        server.shutdown()
        thread.join()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = chromium()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(executable),
            args=[
                "--no-sandbox",  # CI runs as root
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield launched
        launched.close()


def book_pages(html: Path) -> list[str]:
    """Every page of the book, both editions (the Chinese one under ``zh/``), as paths relative to its root;
    not the theme's or Sphinx's own files, nor an edition's index.html, which only redirects to its first
    page (see test_the_front_page_leads_to_the_introduction).
    """
    return sorted(
        path.relative_to(html).as_posix()
        for path in html.rglob("*.html")
        if not any(part.startswith("_") for part in path.relative_to(html).parts)
        and path.relative_to(html).as_posix() not in ("index.html", f"{CHINESE}index.html")
    )


def english(path: str) -> str:
    """The page's path in the English edition (``zh/chapters/03_masks.html`` → ``chapters/03_masks.html``)."""
    return path.removeprefix(CHINESE)


class Reader:
    """One browser tab that opens pages one after another and records, for the page it is on, the console
    errors, the requests that failed and the requests that tried to leave the machine (they are blocked).
    """

    def __init__(self, browser: Browser, site: str):
        self.site, self.visit = site, Visit("")
        self.context = browser.new_context(viewport=DESKTOP)
        self.context.set_default_timeout(120_000)  # a loaded CI machine: pages settle slowly, not never
        # every page as a first-time reader sees it: nothing remembered from the pages before
        self.context.add_init_script("try { localStorage.clear(); sessionStorage.clear(); } catch (e) {}")
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.visit.console_errors.append(f"uncaught: {error}"))
        self.page.on("requestfailed", self._request_failed)
        self.page.on("response", self._response)
        self.loading: dict[object, str] = {}  # requests not yet finished or failed
        self.abandoned: set[object] = set()  # requests reported as never ending, which the next page aborts
        self.last_request = time.monotonic()  # when a request of the page last started or ended
        self.page.on("request", lambda request: self._loading(request, True))
        self.page.on("requestfinished", lambda request: self._loading(request, False))
        self.page.on("requestfailed", lambda request: self._loading(request, False))

    def _loading(self, request, started: bool) -> None:
        self.last_request = time.monotonic()
        if started:
            self.loading[request] = request.url
        else:
            self.loading.pop(request, None)

    def _route(self, route) -> None:
        url = route.request.url
        if url.startswith(self.site) or url.startswith(("data:", "blob:")):
            route.continue_()
        else:  # nothing may leave the machine
            self.visit.external_requests.append(url)
            route.abort()

    def _console(self, message) -> None:
        if message.type == "error":
            self.visit.console_errors.append(message.text)

    def _request_failed(self, request) -> None:
        if request in self.abandoned:  # counted by the page that made it
            self.abandoned.discard(request)
            return
        self.visit.failed_requests.append(f"{request.url} ({request.failure})")

    def _response(self, response) -> None:
        if response.status >= 400:
            self.visit.failed_requests.append(f"{response.url} (HTTP {response.status})")

    def open(self, path: str) -> Visit:
        """Load a page at desktop size; what it logs and requests from now on goes to the returned Visit."""
        if self.visit.page:  # let the last page's requests end there, not be aborted and counted here
            try:  # MathJax asks for its fonts when it typesets, which can be long after the last request
                self.page.evaluate(SETTLED)
            except PlaywrightError:  # the page is going somewhere else (a redirect): nothing to wait for
                pass
            # (Playwright's "networkidle" waits 500 ms of silence after every page: 45 s over the book)
            deadline = time.monotonic() + SETTLE_MS / 1000
            while time.monotonic() < deadline and (
                self.loading or time.monotonic() - self.last_request < QUIET_S
            ):
                self.page.wait_for_timeout(25)
            if self.loading:
                # a request that never ends fails the page that made it (test_every_resource_loads names it),
                # not every page opened after it in this tab
                self.visit.failed_requests += [
                    f"{url} (still loading {SETTLE_MS // 1000} s after the page loaded)"
                    for url in self.loading.values()
                ]
                self.abandoned.update(self.loading)
                self.loading.clear()
        self.visit = Visit(path)
        self.page.set_viewport_size(DESKTOP)
        self.page.goto(self.site + path, wait_until="load")
        return self.visit

    def close(self) -> None:
        self.context.close()


@pytest.fixture(scope="module")
def reader(browser: Browser, site: str) -> Iterator[Reader]:
    opened = Reader(browser, site)
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def visits(reader: Reader, html: Path) -> dict[str, Visit]:
    """Every page, measured at desktop width, then at phone width (the same page, resized); on the
    chapters, also where they define the functions that their exercise asks for."""
    measured, shots = {}, os.environ.get("BOOK_SCREENSHOTS")  # a folder: keep a screenshot of each page
    for path in book_pages(html):
        visit = reader.open(path)
        visit.desktop = reader.page.evaluate(MEASURE, False)
        shot = Path(shots or ".", path.replace("/", "-").removesuffix(".html"))
        if shots:
            reader.page.screenshot(path=f"{shot}-desktop.png", full_page=True)
        if english(path).startswith("chapters/"):
            visit.definitions = reader.page.evaluate(DEFINITIONS, exercise_functions(Path(path).name[:2]))
        reader.page.set_viewport_size(PHONE)
        reader.page.wait_for_timeout(50)  # let the layout settle
        visit.phone = reader.page.evaluate(MEASURE, True)
        if shots:
            reader.page.screenshot(path=f"{shot}-phone.png", full_page=True)
        measured[path] = visit
    return measured


def failures(visits: dict[str, Visit], check) -> dict[str, object]:
    """The pages for which ``check(visit)`` found something, with what it found."""
    found = {path: check(visit) for path, visit in visits.items()}
    return {path: what for path, what in found.items() if what}


def test_every_page_of_the_book_is_visited(visits):
    pages = set(visits)
    for expected in (
        "intro.html",
        "how_to_use.html",
        "chapters/02_scaled_dot_product.html",
        "exercises/ex03_masks/ex03_masks.html",
        "instructors/index.html",
        "glossary.html",
        "search.html",
    ):
        assert expected in pages
        assert CHINESE + expected in pages
    assert len(pages) % 2 == 0 and {english(page) for page in pages} == {p for p in pages if p == english(p)}


@pytest.mark.parametrize("edition", ["", CHINESE])
def test_the_front_page_leads_to_the_introduction(reader, edition):
    visit = reader.open(edition)
    reader.page.wait_for_url(f"**/{edition}intro.html")
    assert visit.console_errors == [] and visit.external_requests == [] and visit.failed_requests == []


def test_no_console_error(visits):
    assert failures(visits, lambda visit: visit.console_errors) == {}


def test_no_request_leaves_the_machine(visits):
    assert failures(visits, lambda visit: visit.external_requests) == {}


def test_every_resource_loads(visits):
    assert failures(visits, lambda visit: visit.failed_requests) == {}


def test_no_raw_tex_or_myst_left(visits):
    assert failures(visits, lambda visit: visit.desktop["rawTex"]) == {}


def test_every_image_loads(visits):
    broken = failures(
        visits, lambda visit: [img["src"] for img in visit.desktop["images"] if not img["loaded"]]
    )
    assert broken == {}


def test_figures_have_alt_text(visits):
    def unhelpful(visit):
        return [
            figure["src"]
            for figure in visit.desktop["figures"]
            if len(figure["alt"]) < 20 or re.search(r"\.(png|svg|jpe?g)$|_images/", figure["alt"])
        ]

    assert failures(visits, unhelpful) == {}


def test_every_internal_link_and_anchor_resolves(visits, site, html):
    ids = {path: set(visit.desktop["ids"]) for path, visit in visits.items()}
    broken = {}
    for path, visit in visits.items():
        for link in visit.desktop["links"]:
            if not link.startswith(site):
                continue  # external: the launch-button test checks those that matter
            target, _, fragment = link[len(site) :].partition("#")
            target = unquote(urlsplit(target).path) or "index.html"
            if target.endswith("/"):
                target += "index.html"
            if not (html / target).is_file():
                broken.setdefault(path, []).append(link)
            elif fragment and target in ids and unquote(fragment) not in ids[target]:
                broken.setdefault(path, []).append(link)
    assert broken == {}


@pytest.mark.parametrize(("edition", "word"), [("", "softmax"), (CHINESE, "softmax"), (CHINESE, "掩码")])
def test_search_finds_a_word(reader, edition, word):
    visit = reader.open(f"{edition}search.html?q={word}")
    reader.page.wait_for_selector("#search-results ul.search li", timeout=30_000)
    results = reader.page.eval_on_selector_all(
        "#search-results ul.search li a", "links => [...links].map(a => a.href)"
    )
    chapter = "chapters/02_scaled_dot_product.html" if word == "softmax" else "chapters/03_masks.html"
    assert any(f"/{edition}{chapter}" in result for result in results), results
    assert visit.console_errors == [] and visit.external_requests == []


def test_exercise_pages_hold_no_solution_and_no_hidden_test(visits):
    exercises = {path: visit for path, visit in visits.items() if english(path).startswith("exercises/")}
    assert len(exercises) == 2 * len(ASSIGNMENTS)
    for path, visit in exercises.items():
        text = visit.desktop["text"]
        assert "raise NotImplementedError()" in text, path  # the student release, not the source
        for marker in SOLUTION_MARKERS:
            assert marker not in text, (path, marker)


def test_search_snippets_show_no_tex(reader):
    """A result's snippet is cut from its page's HTML, where a formula is TeX until MathJax typesets it."""
    visit = reader.open("search.html?q=softmax")
    reader.page.wait_for_selector("#search-results ul.search li p.context", timeout=30_000)
    reader.page.wait_for_load_state("networkidle")  # every result's page fetched, its snippet cut
    snippets = reader.page.eval_on_selector_all(
        "#search-results ul.search li p.context", "snippets => snippets.map(p => p.textContent)"
    )
    assert len(snippets) >= 10, snippets  # softmax is on most pages of the book
    assert [snippet for snippet in snippets if TEX.search(snippet)] == []
    assert visit.console_errors == [] and visit.external_requests == []


def test_no_page_scrolls_sideways_on_a_phone(visits):
    def sideways(visit):
        phone = visit.phone
        return phone["sticking"] or (phone["scrollWidth"] > phone["viewport"] and phone["scrollWidth"])

    assert failures(visits, sideways) == {}


def test_no_code_is_cut_off_on_a_desktop(visits):
    assert failures(visits, lambda visit: visit.desktop["cutCode"]) == {}


@pytest.mark.parametrize("screen", ["desktop", "phone"])
def test_display_equations_fit_the_column(visits, screen):
    """MathJax 3 does not break a display equation: one wider than the column is cut at its edge (it scrolls,
    with nothing to say so), so a long one is broken over lines in its source (`aligned`, `split`)."""
    assert failures(visits, lambda visit: getattr(visit, screen)["wideEquations"]) == {}


@pytest.mark.parametrize("screen", ["desktop", "phone"])
def test_no_identifier_is_split_mid_word(visits, screen):
    """Inline code breaks between words only, unless a word is wider than a line: in a table the cell grows
    (and the table scrolls) instead of splitting `F.scaled_dot_product_attention` over three lines."""
    assert failures(visits, lambda visit: getattr(visit, screen)["splitWords"]) == {}


def wrapped_code_lines(visits: dict[str, Visit], screen: str = "desktop") -> dict[str, int]:
    """How many lines of each chapter's code (its cells and included sources) wrap onto a second line."""
    return {
        path: len(getattr(visit, screen)["wrappedCode"])
        for path, visit in visits.items()
        if english(path).startswith("chapters/") and getattr(visit, screen)["wrappedCode"]
    }


def test_chapter_code_fits_the_column_on_a_desktop(visits):
    """The chapters' code is formatted at 76 characters (chapters/ruff.toml, attention_course/ruff.toml; `make
    lint`), the width of the text column at 1280 px: no line wraps back to the left edge."""
    wrapped = wrapped_code_lines(visits)
    assert wrapped == {}, f"{sum(wrapped.values())} lines wrap: {wrapped}"


@pytest.mark.parametrize("screen", ["desktop", "phone"])
def test_figures_are_shown_at_a_legible_size(visits, screen):
    def shrunk(visit):
        figures = getattr(visit, screen)["figures"]
        return [f"{f['src']}: {f['scale']:.2f}" for f in figures if f["scale"] < LEGIBLE_SCALE[screen]]

    assert failures(visits, shrunk) == {}


@pytest.mark.parametrize("screen", ["desktop", "phone"])
def test_figures_are_sharp_on_high_density_screens(visits, screen):
    def blurred(visit):
        figures = getattr(visit, screen)["figures"]
        return [f"{f['src']}: {f['density']:.2f}" for f in figures if f["density"] < DEVICE_PIXEL_RATIO]

    assert failures(visits, blurred) == {}


def exercise_functions(number: str) -> list[str]:
    """The functions and classes that exercise ``number`` asks for: those its solution cells define."""
    (release,) = ROOT.glob(f"exercises/ex{number}_*/ex{number}_*.ipynb")
    cells = json.loads(release.read_text())["cells"]
    sources = [
        "".join(cell["source"]) for cell in cells if cell["metadata"].get("nbgrader", {}).get("solution")
    ]
    found = (re.findall(r"^(?:def|class) (\w+)\b", source, re.MULTILINE) for source in sources)
    return sorted({name for names in found for name in names})


@pytest.mark.parametrize(
    "chapter",
    [
        "01_soft_lookup",
        "02_scaled_dot_product",
        "03_masks",
        "04_multi_head",
        "05_grouped_query",
        "06_cross_attention",
        "07_transformer_block",
        "08_positions",
        "09_conv_heads",
        "10_kv_cache",
        "11_tiled_attention",
    ],
)
def test_chapters_fold_the_functions_an_exercise_asks_for(visits, chapter):
    """A chapter shows the key lines of what its exercise asks for; a whole function appears only folded
    away (hidden until the reader opens it), after a link to the exercise."""
    assert exercise_functions(chapter[:2]), f"exercise {chapter[:2]} asks for no function?"
    for edition in ("", CHINESE):
        definitions = visits[f"{edition}chapters/{chapter}.html"].definitions
        assert definitions, "the chapter shows none of the functions: where did the folded versions go?"
        for definition in definitions:
            assert not definition["shown"], definition  # not visible before the reader opens it
            assert definition["folded"] and definition["afterExerciseLink"], definition


def test_a_request_that_never_ends_fails_its_own_page_only(browser, tmp_path, monkeypatch):
    """A page whose request hangs is reported with that request, and the pages after it open as usual."""
    monkeypatch.setattr(sys.modules[__name__], "SETTLE_MS", 2_000)
    (tmp_path / "hangs.html").write_text(
        '<html><body><script>addEventListener("load", () => fetch("/never"));</script></body></html>'
    )
    (tmp_path / "next.html").write_text("<html><body>next</body></html>")
    answered = threading.Event()

    class Hanging(_QuietHandler):
        def do_GET(self):
            if self.path != "/never":
                return super().do_GET()
            answered.wait(30)  # answered when the test ends

    handler = functools.partial(Hanging, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        reader = Reader(browser, f"http://127.0.0.1:{server.server_address[1]}/")
        try:
            hangs = reader.open("hangs.html")
            reader.page.wait_for_timeout(300)  # the fetch starts after the load event
            after = reader.open("next.html")
            assert reader.page.inner_text("body") == "next"
        finally:
            reader.close()
            answered.set()
            server.shutdown()
    assert len(hangs.failed_requests) == 1 and "/never (still loading 2 s" in hangs.failed_requests[0]
    assert after.failed_requests == []


def test_the_next_page_opens_once_the_last_one_has_typeset(browser, tmp_path):
    """MathJax typesets after the load event and only then asks for its fonts: a page that takes a second
    to typeset is left once its typesetting is done, so that its requests are not aborted by the next
    page (the font it asked for would have been counted as a failure of that page)."""
    (tmp_path / "typesets.html").write_text(
        "<html><head><script>window.MathJax = {startup: {promise: new Promise((done) => setTimeout("
        '() => fetch("/font").then((r) => r.text()).then(done), 1000))}};</script></head><body>x</body>'
    )
    (tmp_path / "next.html").write_text("<html><body>next</body></html>")
    served = []

    class Fonts(_QuietHandler):
        def do_GET(self):
            if self.path != "/font":
                return super().do_GET()
            served.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"font")

    handler = functools.partial(Fonts, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        reader = Reader(browser, f"http://127.0.0.1:{server.server_address[1]}/")
        try:
            typesets = reader.open("typesets.html")
            after = reader.open("next.html")
        finally:
            reader.close()
            server.shutdown()
    assert served == ["/font"]
    assert typesets.failed_requests == [] and after.failed_requests == []
