"""The fork server: a process that imports torch, the course and the kernel machinery once, then forks a
fresh kernel for each submission.

A new Python that imports torch and starts an IPython kernel costs seconds; ``nbgrader autograde`` pays them
for every submission. This server pays them once: it imports everything a graded notebook imports, warms up
what PyTorch loads lazily, and then, on request, forks a child that becomes an IPython kernel
(:class:`ipykernel.kernelapp.IPKernelApp`) with the submission's folder, environment and limits. The child
starts from the server's memory, copy on write: nothing a submission does reaches the server or the next
submission's child, which is forked from the server again. CUDA is never initialised here (forking a process
that holds a CUDA context is not supported); a child initialises it when a notebook uses the GPU.

The server runs inside the sandbox (:mod:`attention_course.grading.sandbox` starts it under bubblewrap when
it can): it sees no solutions, no gradebook and no other submission, and has no network. It never runs
learner code itself; it is not dumpable, so a child cannot trace it or read its memory. It answers one JSON
request per line on its standard input, on its standard output:

- ``{"op": "spawn", "argv": [...], "cwd": ..., "env": {...}, "limits": {...}, "preload": [...]}`` imports
  the ``preload`` modules it has not imported yet, forks a kernel and answers its ``pid``;
- ``{"op": "poll", "pid": ...}`` answers its ``returncode`` (``null`` while it runs; ``-N`` for a signal);
- ``{"op": "signal", "pid": ..., "signum": ...}`` signals the kernel's process group;
- ``{"op": "sweep"}`` kills every other process of its PID namespace, of which it is the init (every process
  the submission started, orphans, daemons and processes without a main thread included), empties the
  sandbox's private ``/tmp`` and ``/dev/shm`` and removes its System V IPC objects, and answers how many
  processes there were.

Run by the sandbox as ``python -I -m attention_course.grading.zygote [--preload MODULE]...``; people never
need to.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, BinaryIO

#: the seed of torch's CPU generator in every kernel: the seed of a new ``torch.Generator()``
#: (torch/csrc: default_rng_seed_val). A new process's default generator has it in older releases; torch 2.13
#: seeds it from entropy instead, and the grader keeps it fixed, so that a notebook that draws without
#: seeding draws the same numbers each time it is graded.
TORCH_DEFAULT_SEED = 67280421310721
PR_SET_DUMPABLE = 4
#: what a kernel's start imports (IPKernelApp.initialize): imported once here, no kernel imports them again
KERNEL_MODULES = (
    "ipykernel.debugger",
    "ipykernel.ipkernel",
    "ipykernel.kernelapp",
    "ipykernel.zmqshell",
    "IPython",
    "IPython.core.completer",
    "IPython.core.completerlib",
    "IPython.core.debugger",
    "IPython.core.history",
    "IPython.extensions.storemagic",
    "numpy",
    "sqlite3",
    "tornado.platform.asyncio",
)


def preload(modules: Sequence[str] = ()) -> None:
    """Import what graded notebooks import, and run once what PyTorch and IPython load on first use; then
    ``modules``, the graded assignments' own (:attr:`~attention_course.registry.Assignment.kernel_modules`:
    importing every exercise's checks here cost a second and more, ex03's and ex08's ``torch._dynamo``).

    The kernel's own modules come first: ipykernel's debugger (debugpy) alone is a third of a kernel's
    start. matplotlib is left out: no exercise imports it, and a notebook that does finds its font list
    prebuilt (:func:`attention_course.grading.sandbox.matplotlib_cache`).
    """
    for name in KERNEL_MODULES:
        importlib.import_module(name)
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    from attention_course.checks import engine  # noqa: F401
    from attention_course.grading import recorder  # noqa: F401

    # kernels and dispatch paths that load on first use: a tiny attention in each common dtype (an assignment
    # that needs more names it in its Assignment.preload, which the first spawn imports)
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        x = torch.ones(1, 2, 3, dtype=dtype)
        F.scaled_dot_product_attention(x, x, x)
        torch.softmax(x @ x.transpose(-2, -1), dim=-1).masked_fill(x[..., :2] > 0, 0.0).sum().item()
    _fresh_random_state()  # once here: numpy imports numpy.random, secrets and hashlib on its first seeding
    for name in modules:
        importlib.import_module(name)


def _kernel(request: dict[str, Any], protocol: list[int]) -> None:
    """In the forked child: become the submission's IPython kernel (never returns)."""
    try:
        for fd in protocol:
            os.close(fd)
        os.setsid()  # its own session and process group, which signals and the sweep address
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.chdir(request["cwd"])
        sys.path[:0] = request.get("path", [])
        os.environ.clear()
        os.environ.update(request["env"])
        limits = request["limits"]
        # memory (allocations past it fail with MemoryError), processes and threads of this user in the
        # sandbox (a fork bomb fails with EAGAIN), one file's size, no core files
        if limits.get("memory_mib"):
            memory = limits["memory_mib"] * 2**20 + _data_size()
            resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
        if limits.get("processes"):
            processes = limits["processes"] + _tasks_of_this_user()
            resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
        if limits.get("file_mib"):
            size = limits["file_mib"] * 2**20
            resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # the kernel itself may be debugged
        _fresh_random_state()
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)
        sys.stderr = sys.__stderr__ = open(2, "w", closefd=False)
        from ipykernel.kernelapp import IPKernelApp

        app = IPKernelApp.instance()
        app.initialize(request["argv"])
        app.start()
    except BaseException as error:  # whatever happens, the child must not return into the server
        try:
            print(f"the kernel could not start: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        finally:
            os._exit(70)
    os._exit(0)


def _tasks_of_this_user() -> int:
    """Processes and threads of this user now (RLIMIT_NPROC counts both), from /proc."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == os.getuid():
                    count += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                pass
    return count


def _data_size() -> int:
    """Bytes of this process's data segment now (what RLIMIT_DATA counts), from /proc."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _fresh_random_state() -> None:
    """Random generators that owe nothing to what ran in the server or in an earlier kernel: Python's and
    numpy's seeded from entropy, as in a new process, and torch's CPU generator at
    :data:`TORCH_DEFAULT_SEED`.

    Only torch's CPU generator is reset: the server never initialises CUDA (or another accelerator), so a
    kernel's accelerator generators start fresh anyway (``torch.manual_seed`` would queue a seed for each).
    """
    import random

    import numpy
    import torch

    random.seed()
    numpy.random.seed()  # noqa: NPY002 - the legacy global generator, which notebooks may use
    torch.default_generator.manual_seed(TORCH_DEFAULT_SEED)


def _sweep_namespace() -> int:
    """Kill every process of this PID namespace but this server, its init, and reap them; return how many
    there were.

    ``kill(-1, SIGKILL)`` signals every process the caller may signal but itself; in a PID namespace of its
    own that is every other process of the namespace, whatever it did to look gone (a new session, a main
    thread that exited while other threads run on, a pid that changes with every fork): the kernel walks its
    own list of tasks, with forks held off, and nothing is read from ``/proc`` to decide. Orphans have this
    server as their parent, so it reaps them all; it repeats until ``/proc`` lists no other process.
    """
    me = os.getpid()
    seen: set[int] = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        others = {int(name) for name in os.listdir("/proc") if name.isdigit()} - {me}
        if not others:
            break
        seen |= others
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:  # none left to signal: only zombies, reaped below
            pass
        _reap()
        time.sleep(0.001)
    return len(seen)


def _sweep_sessions(sessions: set[int]) -> int:
    """Without a PID namespace of its own: kill every process of the kernels' ``sessions`` (which a process
    that starts a session of its own escapes), until none is left; return how many there were. A process is
    alive while any of its threads is (its main thread may have exited)."""
    killed: set[int] = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        others = [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != os.getpid()]
        alive = [pid for pid in others if _session(pid) in sessions and not _is_dead(pid)]
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        _reap()
        if not alive:
            break
        time.sleep(0.005)
    return len(killed)


def _wipe_private_places() -> None:
    """Empty the places a kernel could leave something in for the next submission of this slot: the
    sandbox's private /tmp and /dev/shm, and its System V IPC objects (``ipcrm --all``)."""
    with open("/proc/self/mountinfo") as mountinfo:  # the slot's scratch folder is mounted in one of them
        mounts = {line.split()[4] for line in mountinfo}
    for folder in ("/tmp", "/dev/shm"):
        _empty(folder, set(), mounts)
    if shutil.which("ipcrm"):
        subprocess.run(["ipcrm", "--all"], capture_output=True, check=False)


def _empty(folder: str, kept: set[str], mounts: set[str]) -> None:
    """Delete what ``folder`` holds but the names ``kept`` and the mounts: a folder on the way to a mount (the
    scratch folder's parents) is emptied around it, never deleted through it (the grader empties the scratch
    folder itself)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for name in entries:
        path = os.path.join(folder, name)
        if name in kept or path in mounts:
            continue
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                if any(mount.startswith(path + "/") for mount in mounts):
                    _empty(path, set(), mounts)
                else:
                    shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _is_dead(pid: int) -> bool:
    """Whether every thread of ``pid`` is a zombie (or gone)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return False
        except (OSError, IndexError):
            continue
    return True


EXITED: dict[int, int] = {}  # pid -> return code of reaped children


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        EXITED[pid] = os.waitstatus_to_exitcode(status)


def serve(requests: BinaryIO, answers: BinaryIO, protocol: list[int], own_namespace: bool) -> None:
    """Answer requests until the standard input closes.

    In its own PID namespace (``own_namespace``, where this server is the init) the sweep kills every other
    process; elsewhere only the processes of the kernels' sessions, which a process that starts a session of
    its own escapes.
    """
    sessions: set[int] = set()

    def answer(message: dict[str, Any]) -> None:
        answers.write(json.dumps(message).encode() + b"\n")
        answers.flush()

    for line in requests:
        try:
            request = json.loads(line)
            op = request["op"]
            if op == "spawn":
                missing = [name for name in request.get("preload", []) if name not in sys.modules]
                for name in missing:  # what this assignment's notebooks load on first use, imported once
                    importlib.import_module(name)
                if missing:
                    gc.collect()
                    gc.freeze()
                pid = os.fork()
                if pid == 0:
                    _kernel(request, protocol)
                sessions.add(pid)
                answer({"ok": True, "pid": pid})
            elif op == "poll":
                _reap()
                answer({"ok": True, "returncode": EXITED.get(request["pid"])})
            elif op == "signal":
                try:
                    os.killpg(request["pid"], request["signum"])
                except ProcessLookupError:
                    pass
                answer({"ok": True})
            elif op == "sweep":
                killed = _sweep_namespace() if own_namespace else _sweep_sessions(sessions)
                if own_namespace:  # /tmp and /dev/shm are the slot's own only in its own namespaces
                    _wipe_private_places()
                answer({"ok": True, "killed": killed})
                EXITED.clear()
                sessions.clear()
            elif op == "ping":
                answer({"ok": True})
            else:
                answer({"ok": False, "error": f"unknown request {op!r}"})
        except Exception as error:  # a bad request is answered, not fatal
            answer({"ok": False, "error": f"{type(error).__name__}: {error}"})


def main(argv: list[str] | None = None) -> int:
    """Preload, then serve the sandbox's requests on the standard input and output."""
    argv = sys.argv[1:] if argv is None else argv
    own_namespace = "--own-pid-namespace" in argv
    if own_namespace and os.getpid() != 1:  # kill(-1) must never reach beyond the sandbox's own namespace
        print(f"not the init of a PID namespace of its own (pid {os.getpid()})", file=sys.stderr)
        return 2
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever an import prints goes to the log, never into the answers
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is for a kernel, never for the server
    started = time.monotonic()
    preload([argv[i + 1] for i, argument in enumerate(argv[:-1]) if argument == "--preload"])
    # the children start from this process's memory, copy on write: a garbage collection in a child would
    # touch every object and copy most pages; frozen objects are never collected (Python's gc.freeze)
    gc.collect()
    gc.freeze()
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    answers.write(
        json.dumps({"ready": True, "seconds": round(time.monotonic() - started, 2)}).encode() + b"\n"
    )
    answers.flush()
    serve(requests, answers, [requests.fileno(), answers.fileno()], own_namespace)
    # the grader closed the requests: end now, without the interpreter's teardown of torch's modules (a
    # third of a second, which the grader would wait for); the answers are flushed, nothing else is open
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
