"""Build the book's editions: English at the root of ``_build/html``, Chinese under ``_build/html/zh/``.

    python _ext/build_book.py [--path-output DIR] [--edition en|zh_CN ...] [--jobs N] [--gettext]

One source: the English pages. The Chinese edition is the same Sphinx project built with ``language =
zh_CN``, which reads each page's translations from ``locales/zh_CN/LC_MESSAGES/<page>.po`` (Sphinx's
gettext machinery). Code, outputs and figures are shared: the Chinese build reads the chapters' outputs
from the English build's jupyter-cache, so no chapter runs twice. The exercise pages of the Chinese
edition show the Chinese release notebooks (``exercises/<id>/zh_CN/<id>.ipynb``, see
``attention_course/grading/translation.py``), whose markdown is translated cell by cell.

The chapters are executed first, ``--jobs`` at a time (one per core by default), into the English build's
jupyter-cache, where the build finds them (:func:`execute_pages`): myst-nb would run them one after another.

Each edition is a ``jupyter-book build`` with warnings as errors (``-W -n --keep-going``): the English one
is exactly that command; the Chinese one calls the function it calls, with the language and the shared
cache as configuration overrides, into ``_build/zh/html``, then moves the pages to ``_build/html/zh``.

``--gettext`` writes the message templates instead (``_build/gettext``: one ``.pot`` per page, and one per
exercise notebook under ``notebooks/``) and updates ``locales/`` from them with ``sphinx-intl``: new
messages are added empty, changed ones are marked fuzzy, for a translator to finish (``make locales``).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import nbformat
import yaml

from attention_course.grading import translation

ROOT = Path(__file__).resolve().parent.parent
# edition: (its folder under the English edition's root, the Sphinx configuration it overrides)
EDITIONS = {
    "en": ("", {}),
    "zh_CN": ("zh", {"language": "zh_CN", "html_title": "注意力机制：推导与验证"}),
}
LOCALES = ROOT / "locales"


@functools.cache
def _config() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def _read_page(page: Path) -> nbformat.NotebookNode:
    """The notebook myst-nb makes of a MyST page, with the book's MyST extensions."""
    from myst_nb.core.read import read_myst_markdown_notebook
    from myst_parser.config.main import MdParserConfig

    extensions = _config().get("parse", {}).get("myst_enable_extensions", [])
    markdown = MdParserConfig(enable_extensions=set(extensions))
    return read_myst_markdown_notebook(page.read_text(), config=markdown, add_source_map=True, path=page)


def _execute_page(page: Path, timeout: int) -> tuple[str | None, float]:
    """Execute ``page`` as myst-nb's cache mode does (in its folder, errors stop it): the executed notebook
    as JSON (None if it failed) and the seconds."""
    from jupyter_cache.executors.utils import single_nb_execution
    from jupyter_client.manager import KernelManager

    notebook = _read_page(page)
    with tempfile.TemporaryDirectory() as sockets:
        # over Unix sockets: two kernels started at once over TCP now and then pick the same port
        kernel = KernelManager(
            kernel_name=notebook.metadata.kernelspec.name, transport="ipc", ip=str(Path(sockets) / "kernel")
        )
        result = single_nb_execution(
            notebook, cwd=str(page.parent), timeout=timeout, allow_errors=False, km=kernel
        )
    return (nbformat.writes(notebook) if result.err is None else None), result.time


def _notebook_pages() -> list[Path]:
    """The pages that are notebooks (MyST with a kernel), which the build executes: the chapters."""
    from myst_nb.core.read import is_myst_markdown_notebook

    return [
        page
        for page in sorted((ROOT / "chapters").glob("*.md"))
        if is_myst_markdown_notebook(page.read_text())
    ]


def _cache(output: Path) -> Any:
    from jupyter_cache import get_cache

    return get_cache(str(output / "_build" / ".jupyter_cache"))


def write_executed_notebooks(build_folder: Path, output: Path) -> None:
    """Write each executed page's notebook with its outputs where the build writes it: ``jupyter_execute/``
    beside the edition's HTML, and the HTML's ``_sources/`` (the page's download button).

    myst-nb writes there the notebook as it read the page; only a page it executed itself has its outputs
    in it. A page whose outputs came from the cache (each page run by :func:`execute_pages`, every page of
    a second build, and the Chinese edition's) got none.
    """
    cache = _cache(output)
    for page in _notebook_pages():
        try:
            _, executed = cache.merge_match_into_notebook(_read_page(page))
        except KeyError:
            continue  # not executed (it failed): myst-nb wrote what it had
        name, text = page.relative_to(ROOT).with_suffix(".ipynb"), nbformat.writes(executed)
        for target in (build_folder / "jupyter_execute" / name, build_folder / "html" / "_sources" / name):
            if target.is_file():
                target.write_text(text)


def execute_pages(output: Path, jobs: int) -> None:
    """Execute the pages that the English build's jupyter-cache lacks, ``jobs`` at a time, into that cache.

    myst-nb's cache mode (``execute_notebooks: cache``) executes each page that it finds no cached outputs
    for while it reads the pages, one after another; a chapter that trains a model takes about a minute. Here
    they run side by side first, and the build then finds every page's outputs in the cache: a page is
    matched by its code cells and kernel, as jupyter-cache hashes it. A page that fails is not cached: the
    build executes it again and reports its failure as before (``reports/<page>.err.log``).
    """
    from jupyter_cache.base import CacheBundleIn

    timeout = int(_config().get("execute", {}).get("timeout", 30))
    cache = _cache(output)
    pending = []
    for page in _notebook_pages():
        try:
            cache.match_cache_notebook(_read_page(page))
        except KeyError:
            pending.append(page)
    # the pages that train models take longest: they start first
    pending.sort(key=lambda page: "torch.optim." not in page.read_text())
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        running = {pool.submit(_execute_page, page, timeout): page for page in pending}
        for done in as_completed(running):
            page = running[done]
            executed, seconds = done.result()
            if executed is None:
                print(f"{page.name} failed to execute ({seconds:.1f} s); the build runs it again", flush=True)
                continue
            bundle = CacheBundleIn(
                nbformat.reads(executed, as_version=4), str(page), data={"execution_seconds": seconds}
            )
            cache.cache_notebook_bundle(bundle, check_validity=False, overwrite=True)
            print(f"{page.name} executed in {seconds:.1f} s", flush=True)
    if pending:
        print(
            f"{len(pending)} page(s) executed, {jobs} at a time, in {time.monotonic() - start:.1f} s",
            flush=True,
        )


def build(edition: str, output: Path) -> int:
    """Build one edition into ``output/_build/html`` (English) or ``output/_build/html/<folder>``."""
    if edition == "en":
        command = [
            "jupyter-book",
            "build",
            str(ROOT),
            "-W",
            "-n",
            "--keep-going",
            "--path-output",
            str(output),
        ]
        returncode = subprocess.run(command, env=_environment(), check=False).returncode
        write_executed_notebooks(output / "_build", output)
        return returncode
    folder, overrides = EDITIONS[edition]
    build_folder = output / "_build" / folder
    code = (
        "import sys; from pathlib import Path; from jupyter_book.sphinx import build_sphinx\n"
        "sys.exit(build_sphinx(Path(sys.argv[1]), Path(sys.argv[2]), noconfig=True,"
        " path_config=Path(sys.argv[1]) / '_config.yml', confoverrides=eval(sys.argv[3]),"
        " builder='html', warningiserror=True, keep_going=True))"
    )
    overrides = {
        **overrides,
        "nitpicky": True,
        "latex_individualpages": False,
        # the English build's cache: the chapters' outputs, so that nothing is executed again
        "nb_execution_cache_path": str(output / "_build" / ".jupyter_cache"),
    }
    result = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), str(build_folder / "html"), repr(overrides)],
        env=_environment(),
        check=False,
    )
    write_executed_notebooks(build_folder, output)
    if result.returncode == 0:
        target = output / "_build" / "html" / folder
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(build_folder / "html", target)
    return result.returncode


def templates(output: Path) -> Path:
    """Write the message templates of the pages and the exercise notebooks into ``output``; return it."""
    shutil.rmtree(output, ignore_errors=True)
    code = (
        "import sys; from pathlib import Path; from jupyter_book.sphinx import build_sphinx\n"
        "sys.exit(build_sphinx(Path(sys.argv[1]), Path(sys.argv[2]), noconfig=True,"
        " path_config=Path(sys.argv[1]) / '_config.yml',"
        " confoverrides={'nb_execution_mode': 'off', 'latex_individualpages': False},"
        " builder='gettext', really_quiet=True))"
    )
    subprocess.run([sys.executable, "-c", code, str(ROOT), str(output)], env=_environment(), check=True)
    # the exercise pages are translated notebook by notebook (their catalogues are under notebooks/)
    shutil.rmtree(output / "exercises", ignore_errors=True)
    shutil.rmtree(output / ".doctrees", ignore_errors=True)
    translation.write_templates(ROOT, output / "notebooks")
    return output


def _environment() -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path-output", type=Path, default=ROOT, help="where _build goes (default: here)")
    parser.add_argument("--edition", action="append", choices=sorted(EDITIONS), help="default: all")
    parser.add_argument("--gettext", action="store_true", help="update locales/ instead of building")
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="pages executed at a time (default: one per core)",
    )
    arguments = parser.parse_args(argv)
    if arguments.gettext:
        pot = templates(arguments.path_output / "_build" / "gettext")
        languages = [name for name in EDITIONS if name != "en"]
        command = ["sphinx-intl", "update", "-p", str(pot), "-d", str(LOCALES), "-w", "0"]
        for language in languages:
            command += ["-l", language]
        updated = subprocess.run(command, env=_environment(), check=False).returncode
        # a notebook's cell that is gone leaves no trace (it may have been a model answer)
        for language in languages:
            translation.forget_obsolete(ROOT, language)
        return updated
    failed = []
    if "en" in (arguments.edition or EDITIONS):
        execute_pages(arguments.path_output, arguments.jobs)
    for edition in arguments.edition or EDITIONS:
        if build(edition, arguments.path_output) != 0:
            failed.append(edition)
            if edition == "en":
                break  # the others would execute the chapters again, to fail the same way
    if failed:
        print(f"the book's edition(s) {', '.join(failed)} did not build", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
