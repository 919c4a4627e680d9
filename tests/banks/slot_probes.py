"""Probes of one sandbox slot: code that tries to outlive its submission, to reach the slot's fork server, or
to leave something for the next submission graded in the same slot.

Each probe is the source of one code cell. A probe that can tell whether its attack worked asserts that it
did not (an error in its output means the sandbox let it through); a probe that plants a survivor cannot, and
the submission graded next in the same slot shows whether the survivor did harm (it must keep full marks).
Used by ``tests/test_slot_isolation.py``.
"""

from __future__ import annotations

import textwrap


def _code(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


# A child in a session of its own whose main thread exits with a raw exit(2) (not exit_group): the process
# shows as a zombie in /proc while its second thread runs on, emptying every file it finds in the slot's
# scratch folder (where the next submission's check inputs and recordings go) for ten minutes.
SURVIVOR_WITHOUT_MAIN_THREAD = _code(
    """
    import ctypes, os, platform, threading, time

    SYS_EXIT = {"x86_64": 60, "aarch64": 93}[platform.machine()]
    scratch = os.path.dirname(os.getcwd())

    def clobber():
        end = time.monotonic() + 600
        while time.monotonic() < end:
            for folder, _, files in os.walk(scratch):
                for name in files:
                    try:
                        open(os.path.join(folder, name), "w").close()
                    except OSError:
                        pass
            time.sleep(0.005)

    if os.fork() == 0:
        os.setsid()
        threading.Thread(target=clobber).start()
        ctypes.CDLL(None).syscall(SYS_EXIT, 0)  # this thread only
    time.sleep(0.5)
    """
)

# A process that forks a copy of itself and exits, again and again: its pid changes every few milliseconds,
# so a sweep that lists processes and then kills them finds each pid already gone.
SURVIVOR_CHANGING_PID = _code(
    """
    import os, time

    if os.fork() == 0:
        os.setsid()
        end = time.monotonic() + 600
        while time.monotonic() < end:
            if os.fork() != 0:
                os._exit(0)
            for folder, _, files in os.walk(os.path.dirname(os.getcwd())):
                for name in files:
                    try:
                        open(os.path.join(folder, name), "w").close()
                    except OSError:
                        pass
    time.sleep(0.5)
    """
)

# The slot's PID 1 (the fork server): traced, its memory and environment read, its descriptors (the grader's
# protocol pipes and the slot's log) opened and written to, killed. Every attempt must fail. (Listing the
# numbers of its descriptors is not refused where the grader runs as root; opening them is.)
REACH_PID_1 = _code(
    """
    import ctypes, os, signal

    libc = ctypes.CDLL(None, use_errno=True)
    PTRACE_ATTACH, PTRACE_DETACH = 16, 17
    reached = []
    if libc.ptrace(PTRACE_ATTACH, 1, None, None) == 0:
        reached.append("ptrace")
        libc.ptrace(PTRACE_DETACH, 1, None, None)
    for path, mode in (("/proc/1/mem", "rb"), ("/proc/1/fd/0", "wb"), ("/proc/1/fd/1", "wb"),
                       ("/proc/1/fd/2", "ab"), ("/proc/1/environ", "rb")):
        try:
            with open(path, mode) as handle:
                if "w" in mode or "a" in mode:
                    handle.write(b'{"op": "sweep"}\\n')
        except OSError:
            continue
        reached.append(path)
    os.kill(1, signal.SIGKILL)  # ignored by a namespace's init when it comes from inside
    assert not reached, f"PID 1 reached through {reached}"
    """
)

# process_vm_readv on PID 1 and on the parent: reading another process's memory without ptrace's attach.
READ_OTHER_MEMORY = _code(
    """
    import ctypes, os

    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]

    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(64)
    local = iovec(ctypes.cast(buffer, ctypes.c_void_p), 64)
    read = {}
    for pid in {1, os.getppid()}:
        remote = iovec(0x400000, 64)
        if libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) > 0:
            read[pid] = buffer.raw
    assert not read, f"read the memory of {sorted(read)}"
    """
)

# Tracing itself: allowed to any process, unless the sandbox's seccomp filter refuses ptrace.
TRACE_ITSELF = _code(
    """
    import ctypes, errno

    libc = ctypes.CDLL(None, use_errno=True)
    PTRACE_TRACEME = 0
    assert libc.ptrace(PTRACE_TRACEME, 0, None, None) == -1, "ptrace is allowed"
    assert ctypes.get_errno() == errno.EPERM, errno.errorcode[ctypes.get_errno()]
    """
)

# Memory in files: the private /tmp and /dev/shm are tmpfs, whose pages RLIMIT_DATA does not count. Writes
# 64 MiB files (under the file-size limit) until one fails, up to 1.5 GiB in each; they must stop at the
# folder's size, the memory limit (``{memory_mib}``, which the test replaces).
FILL_TMPFS = _code(
    """
    import os

    chunk = b"x" * 2**26
    written = {}
    for folder in ("/tmp", "/dev/shm"):
        written[folder] = 0
        try:
            for index in range(24):
                with open(os.path.join(folder, f"fill-{index}"), "wb") as handle:
                    handle.write(chunk)
                written[folder] += len(chunk) >> 20
        except OSError:
            pass
        for name in os.listdir(folder):
            if name.startswith("fill-"):
                os.unlink(os.path.join(folder, name))
    assert all(mib <= {memory_mib} for mib in written.values()), written
    """
)

PROBES = {
    "survivor-without-main-thread": SURVIVOR_WITHOUT_MAIN_THREAD,
    "survivor-changing-pid": SURVIVOR_CHANGING_PID,
    "reaches-pid-1": REACH_PID_1,
    "reads-other-memory": READ_OTHER_MEMORY,
    "traces-itself": TRACE_ITSELF,
    "fills-tmpfs": FILL_TMPFS,
}
