"""How much room each assertion of a chapter has: the chapter run again with other seeds and thread counts.

    python benchmarks/trained_margins.py 07_transformer_block        # seed offsets 0-9, 1 and 2 threads
    python benchmarks/trained_margins.py 06_cross_attention --seeds 3 --threads 1 --jobs 2
    python benchmarks/trained_margins.py 07_transformer_block --cells 1,2,8-11,17-20   # the tiny GPT only

A chapter that trains a model asserts properties of the trained model. Such a property should hold for any
seed and on any machine, not only for the weights one run happened to produce; this script measures how far
each assertion is from failing. It runs the chapter's code cells (read with jupytext) once per seed offset
and thread count, each run in a fresh Python process:

- every seed the chapter passes to ``torch.manual_seed`` or ``attention_course.device.seeded_generator`` is
  shifted by the offset (offset 0 is the chapter as written: its data, its initial weights, its batches),
  except the seeds named by ``--keep`` (say, the one that samples a chapter's corpus);
- ``make_reproducible`` fixes ``threads`` intra-op threads instead of the chapter's one;
- each ``assert`` is evaluated and recorded instead of raised: whether it held, and the values of both sides
  of each comparison in it.

It prints, for each assertion, how many runs it held in and the smallest and largest value of each side over
the runs; the comments beside the chapters' assertions quote these margins. It asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUNNER = r"""
import ast, json, os, sys, warnings
import matplotlib
matplotlib.use("Agg")
warnings.filterwarnings("ignore")
import jupytext, torch
import attention_course.device as device_module

offset, threads, chapter = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
chosen = {int(number) for number in sys.argv[4].split(",")} if sys.argv[4] else None
kept = {int(number) for number in sys.argv[5].split(",")} if sys.argv[5] else set()
manual_seed, seeded_generator, make_reproducible = (
    torch.manual_seed, device_module.seeded_generator, device_module.make_reproducible)
torch.manual_seed = lambda seed: manual_seed(seed if seed in kept else seed + offset)
device_module.seeded_generator = lambda seed, device="cpu": seeded_generator(
    seed if seed in kept else seed + offset, device)
device_module.make_reproducible = lambda threads_=1: make_reproducible(threads)

records = []


def plain(value):
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (list, tuple, set)) and len(value) < 8:
        return repr(value)
    return None


def record(where, text, test, sides):
    try:
        held = bool(test())
    except Exception as error:
        held = f"raised {type(error).__name__}"
    try:
        values = [[plain(value) for value in compare] for compare in sides()]
    except Exception:
        values = []
    records.append({"where": where, "assertion": text, "held": held, "sides": values})


class Asserts(ast.NodeTransformer):
    def __init__(self, cell, source):
        self.cell, self.source = cell, source

    def visit_Assert(self, node):
        compares = [part for part in ast.walk(node.test) if isinstance(part, ast.Compare)]
        sides = ast.List(
            elts=[ast.List(elts=[part.left, *part.comparators], ctx=ast.Load()) for part in compares],
            ctx=ast.Load(),
        )
        call = ast.Call(
            func=ast.Name("__record__", ast.Load()),
            args=[
                ast.Constant(f"cell {self.cell}, line {node.lineno}"),
                ast.Constant(ast.get_source_segment(self.source, node.test)),
                ast.Lambda(ast.arguments([], [], None, [], [], None, []), node.test),
                ast.Lambda(ast.arguments([], [], None, [], [], None, []), sides),
            ],
            keywords=[],
        )
        return ast.copy_location(ast.Expr(call), node)


namespace = {"__name__": "__main__", "__record__": record, "display": print}
cells = [cell for cell in jupytext.read(chapter).cells if cell.cell_type == "code"]
for index, cell in enumerate(cells, start=1):
    if chosen is not None and index not in chosen:
        continue
    source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
    tree = ast.fix_missing_locations(Asserts(index, source).visit(ast.parse(source)))
    try:
        exec(compile(tree, f"<cell {index}>", "exec"), namespace)
    except Exception as error:
        failure = f"raised {error!r}"[:300]
        records.append({"where": f"cell {index}", "assertion": "(it ran)", "held": failure, "sides": []})
        break
print("RECORDS " + json.dumps(records))
"""


def run(chapter: Path, offset: int, threads: int, cells: str, kept: str) -> list[dict]:
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(offset), str(threads), str(chapter), cells, kept],
        cwd=chapter.parent,
        env=environment,
        capture_output=True,
        text=True,
    )
    printed, records = [], None
    for line in done.stdout.splitlines():
        if line.startswith("RECORDS "):
            records = json.loads(line[len("RECORDS ") :])
        else:
            printed.append(line)
    if records is not None:
        return [*records, {"printed": printed}]
    return [{"where": "process", "assertion": "(it ran)", "held": done.stderr[-500:], "sides": []}]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapter", help="a chapter's name, e.g. 07_transformer_block")
    parser.add_argument("--seeds", type=int, default=10, help="seed offsets 0 to SEEDS - 1 (default 10)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts (default 1 2)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument(
        "--cells",
        default="",
        help="run only these code cells, e.g. 1,2,8-11 (default: all; the others' names are missing)",
    )
    parser.add_argument(
        "--keep",
        default="",
        help="seeds left unshifted, e.g. 1 for the data a chapter samples once (default: none)",
    )
    parser.add_argument("--json", type=Path, help="also write every run's records here")
    arguments = parser.parse_args(argv)
    chapter = Path(arguments.chapter)  # a chapter's name, or the path of a copy
    if not arguments.chapter.endswith(".md"):
        chapter = ROOT / "chapters" / f"{arguments.chapter}.md"
    cells = ",".join(
        str(number)
        for part in filter(None, arguments.cells.split(","))
        for number in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)
    )
    runs = [(offset, threads) for threads in arguments.threads for offset in range(arguments.seeds)]
    results: dict[tuple[int, int], list[dict]] = {}

    def one(key: tuple[int, int]) -> None:
        results[key] = run(chapter, *key, cells, arguments.keep)
        if arguments.json:  # after every run, so that an interrupted measurement keeps what it has
            arguments.json.write_text(
                json.dumps({f"{offset},{threads}": records for (offset, threads), records in results.items()})
            )

    with ThreadPoolExecutor(arguments.jobs) as pool:
        list(pool.map(one, runs))
    summary: dict[tuple[str, str], dict] = {}
    for (offset, threads), records in results.items():
        for item in records:
            if "printed" in item:
                continue
            entry = summary.setdefault(
                (item["where"], item["assertion"]), {"held": 0, "failed": [], "sides": {}}
            )
            if item["held"] is True:
                entry["held"] += 1
            else:
                entry["failed"].append(f"seed+{offset}/{threads}t: {item['held']}")
            for i, compare in enumerate(item["sides"]):
                for j, value in enumerate(compare):
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        low, high = entry["sides"].get((i, j), (value, value))
                        entry["sides"][i, j] = (min(low, value), max(high, value))
    print(
        f"{chapter.name}: {len(runs)} runs "
        f"(seed offsets 0-{arguments.seeds - 1}, threads {arguments.threads})"
    )
    for (where, assertion), entry in summary.items():
        print(f"\n{where}: assert {assertion}\n  held in {entry['held']} of {len(runs)}")
        for failure in entry["failed"][:10]:
            print(f"  FAILED {failure}")
        for (i, j), (low, high) in sorted(entry["sides"].items()):
            print(f"  comparison {i + 1}, operand {j + 1}: {low:.6g} to {high:.6g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
