"""Build the book's editions: English at the root of ``_build/html``, Chinese under ``_build/html/zh/``.

    python _ext/build_book.py [--path-output DIR] [--edition en|zh_CN ...] [--gettext]

One source: the English pages. The Chinese edition is the same Sphinx project built with ``language =
zh_CN``, which reads each page's translations from ``locales/zh_CN/LC_MESSAGES/<page>.po`` (Sphinx's
gettext machinery). Code, outputs and figures are shared: the Chinese build reads the chapters' outputs
from the English build's jupyter-cache, so no chapter runs twice. The exercise pages of the Chinese
edition show the Chinese release notebooks (``exercises/<id>/zh_CN/<id>.ipynb``, see
``attention_course/grading/translation.py``), whose markdown is translated cell by cell.

Each edition is a ``jupyter-book build`` with warnings as errors (``-W -n --keep-going``): the English one
is exactly that command; the Chinese one calls the function it calls, with the language and the shared
cache as configuration overrides, into ``_build/zh/html``, then moves the pages to ``_build/html/zh``.

``--gettext`` writes the message templates instead (``_build/gettext``: one ``.pot`` per page, and one per
exercise notebook under ``notebooks/``) and updates ``locales/`` from them with ``sphinx-intl``: new
messages are added empty, changed ones are marked fuzzy, for a translator to finish (``make locales``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from attention_course.grading import translation

ROOT = Path(__file__).resolve().parent.parent
# edition: (its folder under the English edition's root, the Sphinx configuration it overrides)
EDITIONS = {
    "en": ("", {}),
    "zh_CN": ("zh", {"language": "zh_CN", "html_title": "注意力机制：推导与验证"}),
}
LOCALES = ROOT / "locales"


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
        return subprocess.run(command, env=_environment(), check=False).returncode
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
