"""Greedy generation with and without a KV cache: total time and time per token, for several lengths.

    python benchmarks/kv_cache.py                                   # 64, 128, 256, 512 new tokens, CPU
    python benchmarks/kv_cache.py --lengths 128 1024 --threads 2 --repeat 5
    python benchmarks/kv_cache.py --device cuda

The model is chapter 10's ``CachedGPT`` (the tiny GPT of chapter 7: 2 blocks, ``d_model`` 64, 4 heads,
``d_ff`` 256) with random weights, in float32, in evaluation mode; the prompt is one token and generation
adds ``n`` tokens greedily with ``attention_course.kv_cache.generate``. Without the cache, step ``t`` runs
the whole sequence of ``t + 1`` tokens (the projections of ``n`` steps touch ``n (n + 1) / 2`` positions,
attention about ``n^3 / 3`` query-key pairs); with the cache, one token (``n`` positions, ``n (n + 1) / 2``
pairs). Each figure is the fastest of ``--repeat`` runs after one warm-up run, the run least disturbed by
other processes, as ``timeit`` reports (``torch.cuda.synchronize`` around each on a GPU). The script prints
a table; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import date
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attention_course.device import seeded_generator
from attention_course.kv_cache import CachedGPT, generate


def seconds(run, repeat: int, device: torch.device) -> float:
    """The shortest wall time of ``run()`` over ``repeat`` runs, after one warm-up run."""
    run()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (CPU)")
    parser.add_argument("--device", default="cpu")
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    device = torch.device(arguments.device)
    torch.manual_seed(0)  # the model's random weights
    model = CachedGPT(24, d_model=64, n_heads=4, n_layers=2, d_ff=256, max_len=max(arguments.lengths) + 1)
    model = model.to(device).eval()
    prompt = torch.randint(0, 24, (1, 1), generator=seeded_generator(1)).to(device)
    where = f"{device}, {arguments.threads} thread(s)" if device.type == "cpu" else str(device)
    machine = f"{where}, {os.cpu_count()} cores, torch {torch.__version__}, {date.today()}"
    table = Table(title=f"Greedy generation of n tokens, fastest of {arguments.repeat} ({machine})")
    for column in ("n", "no cache: total s", "ms/token", "cache: total s", "ms/token", "speed-up"):
        table.add_column(column, justify="right")
    for n in arguments.lengths:
        without = seconds(lambda n=n: generate(model, prompt, n, use_cache=False), arguments.repeat, device)
        with_cache = seconds(lambda n=n: generate(model, prompt, n, use_cache=True), arguments.repeat, device)
        table.add_row(
            str(n),
            f"{without:.3f}",
            f"{1000 * without / n:.2f}",
            f"{with_cache:.3f}",
            f"{1000 * with_cache / n:.2f}",
            f"{without / with_cache:.1f}x",
        )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
