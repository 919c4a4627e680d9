"""Time and peak memory of attention in three forms, for several sequence lengths: plain, tiled, PyTorch's.

    python benchmarks/tiled_attention.py                         # CPU, and CUDA when there is a GPU
    python benchmarks/tiled_attention.py --device cpu --lengths 512 1024 2048 --threads 1
    python benchmarks/tiled_attention.py --device cuda --dtype float16 --lengths 1024 4096 16384

The forms, on one head's query, key and value ``[batch, 1, n, d_head]`` (N(0, 1)):

- **plain**: chapter 3's ``masked_attention`` (no mask), which forms the scores and the weights ``[n, n]``;
- **tiled**: chapter 11's ``tiled_attention`` over blocks of ``--block`` keys, in Python and PyTorch ops;
- **sdpa**: ``torch.nn.functional.scaled_dot_product_attention``, PyTorch's fused kernels.

Time is the fastest of ``--repeat`` calls after one warm-up call (``torch.cuda.synchronize`` around each on
a GPU): on a shared machine other processes only ever slow a call down, so the minimum is the steadiest
figure. Peak memory is what a call allocates beyond its inputs: on CUDA ``torch.cuda.max_memory_allocated``
(every byte, kernels' workspaces included); on the CPU the peak of the tensors PyTorch's operators return,
tracked by ``attention_course.memory.AllocationTracker`` (a fused kernel's internal buffers, such as SDPA's
on the CPU, are not seen). The largest tensor a call creates is tracked on both. The script prints tables;
it asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attention_course.masks import masked_attention
from attention_course.memory import AllocationTracker, peak_memory
from attention_course.tiled import tiled_attention


def forms(block: int) -> dict[str, Callable[..., torch.Tensor]]:
    return {
        "plain": lambda q, k, v: masked_attention(q, k, v, None)[0],
        "tiled": lambda q, k, v: tiled_attention(q, k, v, block),
        "sdpa": F.scaled_dot_product_attention,
    }


def seconds(fn: Callable[[], object], repeat: int, device: torch.device) -> float:
    """The shortest time of ``repeat`` calls of ``fn`` after a warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)


def largest(fn: Callable[[], object]) -> int:
    """The bytes of the largest tensor that ``fn``'s operators create."""
    with AllocationTracker() as tracker:
        fn()
    return tracker.largest.bytes if tracker.largest is not None else 0


def mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def run(device: torch.device, arguments: argparse.Namespace, console: Console) -> None:
    dtype = getattr(torch, arguments.dtype)
    if device.type == "cpu" and dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32  # half precision on the CPU measures emulation, not attention
    how = (
        "torch.cuda.max_memory_allocated" if device.type == "cuda" else "operator outputs (AllocationTracker)"
    )
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU, {torch.get_num_threads()} threads"
    )
    title = (
        f"{where}, torch {torch.__version__}, {date.today()}: batch {arguments.batch}, d_head "
        f"{arguments.d_head}, {str(dtype).removeprefix('torch.')}, block {arguments.block}; "
        f"peak memory by {how}"
    )
    table = Table(title=title, title_justify="left")
    columns = ["n", *(f"{f} ms" for f in forms(1)), *(f"{f} peak MiB" for f in forms(1))]
    columns += ["plain / tiled peak", "tiled / sdpa time", "largest plain MiB", "largest tiled MiB"]
    for column in columns:
        table.add_column(column, justify="right")
    generator = torch.Generator().manual_seed(0)
    for n in arguments.lengths:
        shape = (arguments.batch, 1, n, arguments.d_head)
        inputs = [torch.randn(shape, generator=generator).to(device, dtype) for _ in range(3)]
        times, peaks, sizes = {}, {}, {}
        for name, fn in forms(arguments.block).items():
            call = functools.partial(fn, *inputs)
            times[name] = seconds(call, arguments.repeat, device)
            peaks[name] = peak_memory(fn, *inputs)[1]
            sizes[name] = largest(call)
        row = [str(n), *(f"{1000 * times[f]:.2f}" for f in times), *(mib(peaks[f]) for f in peaks)]
        row += [f"{peaks['plain'] / peaks['tiled']:.1f}", f"{times['tiled'] / times['sdpa']:.1f}"]
        row += [mib(sizes["plain"]), mib(sizes["tiled"])]
        table.add_row(*row)
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda", "both"), default="both")
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="sequence lengths n")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--block", type=int, default=128, help="keys per block of the tiled form")
    parser.add_argument("--dtype", default="float32", help="float32, or float16/bfloat16 (CUDA only)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    arguments = parser.parse_args()
    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    devices = ["cpu", "cuda"] if arguments.device == "both" else [arguments.device]
    console = Console(width=200)
    for name in devices:
        if name == "cuda" and not torch.cuda.is_available():
            console.print("no CUDA device: the GPU table is left out")
            continue
        if arguments.lengths is None:
            arguments.lengths = [512, 1024, 2048, 4096] if name == "cpu" else [1024, 2048, 4096, 8192, 16384]
            run(torch.device(name), arguments, console)
            arguments.lengths = None
        else:
            run(torch.device(name), arguments, console)


if __name__ == "__main__":
    main()
