"""The check engine: what a test cell checks, how a learner's function is called, and where it is judged.

A **behaviour** is one test cell's check (its name is the cell's ``grade_id``): a *plan* yields the
:class:`Check` s of its visible or hidden part, each one or more :class:`Call` s of the learner's function and
a *judge* that raises :class:`CheckFailure` (the call, what was expected, what came back, the likely cause).
A test cell runs ``checks.sdpa_mask(fn)`` and, hidden, ``checks.sdpa_mask.hidden(fn)``. The same plan and
judges run **together** (one process: a learner's visible check, ``nbgrader autograde``) or **split**, under
``attention-grade``: the learner's kernel only calls and records (:mod:`attention_course.grading.recorder`),
and the grader's own process judges (:mod:`attention_course.grading.split`), never running learner code.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import gc
import hashlib
import importlib
import inspect
import linecache
import math
import sys
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn, Protocol

import torch

from attention_course import registry
from attention_course.device import default_device, is_accelerator_fault, seeded_generator

# the profiler's switches, taken when the checks are imported (before a learner's cell can replace them)
_SETPROFILE, _GETPROFILE = sys.setprofile, sys.getprofile
_FIND_AND_LOAD = importlib._bootstrap._find_and_load.__code__  # every import goes through it
ACCELERATOR_NOTE = (
    "{function} caused an accelerator error (on CUDA, often an index out of range): this process cannot use "
    "the GPU any more. Fix the cause, then restart the kernel."
)


class CheckFailure(AssertionError):
    """A behaviour does not hold: the ``call``, what was ``expected``, what was ``got``, the likely ``cause``.

    ``str()`` is ``message``, ``Likely cause: ...`` and ``notes``; reports use the fields, nothing parses it.
    """

    def __init__(
        self, message: str, *, call="", expected="", got="", cause="", notes=(), raised=False
    ) -> None:
        super().__init__(message)
        self.message, self.call, self.expected, self.got, self.cause = message, call, expected, got, cause
        self.notes, self.raised = tuple(notes), raised  # raised: the learner's function raised an exception

    def __str__(self) -> str:
        text = self.message + (f"\n  Likely cause: {self.cause}." if self.cause else "")
        return text + "".join(f"\n  {note}" for note in self.notes)

    def amended(self, *, before: str = "", note: str = "", call: str = "") -> CheckFailure:
        """The same failure with ``before`` put in front, ``note`` after, and ``call`` if it had none."""
        failure = copy.copy(self)
        failure.message, failure.call = before + self.message, self.call or call
        failure.notes = (*self.notes, note) if note else self.notes
        return failure

    def fields(self) -> dict[str, str]:
        """The parts of the failure, for reports."""
        return {"call": self.call, "expected": self.expected, "got": self.got, "cause": self.cause}


def fail(message: str, cause: str = "", **fields: Any) -> NoReturn:
    """Raise :class:`CheckFailure` (``fields``: ``call``, ``expected``, ``got``, ``notes``)."""
    raise CheckFailure(message, cause=cause, **fields)


def hide_engine_frames(method: Callable[..., Any]) -> Callable[..., Any]:
    """Make an entry point raise :class:`CheckFailure` without the engine's frames in the traceback."""

    @functools.wraps(method)
    def entry_point(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # IPython and pytest hide this frame too
        try:
            return method(*args, **kwargs)
        except CheckFailure as failure:
            raise failure.with_traceback(None) from None

    return entry_point


# --- values and calls


@dataclass(frozen=True)
class Foreign:
    """A returned object that is neither a tensor nor a plain Python value, as a recording describes it."""

    type_name: str
    text: str  # its repr, shortened

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Seeded:
    """A ``torch.Generator`` argument seeded with ``seed``: each call gets a fresh one, on the CPU."""

    seed: int

    def __repr__(self) -> str:
        return f"torch.Generator(seed={self.seed})"


def type_name(value: Any) -> str:
    """The type of ``value`` as the learner's code made it (also for a :class:`Foreign` of a recording)."""
    return value.type_name if isinstance(value, Foreign) else type(value).__name__


def describe(value: Any) -> str:
    """``float32 [2, 3, 5, 4] on cuda:0`` for a tensor; a short repr for anything else."""
    if isinstance(value, torch.Tensor):
        where = "" if value.device.type == "cpu" else f" on {value.device}"
        return f"{dtype_name(value.dtype)} {list(value.shape)}{where}"
    text = repr(value)
    return text if len(text) <= 40 else f"{type_name(value)} ({text[:37]}...)"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")  # float32


@dataclass(frozen=True, eq=False)
class Call:
    """One call of the learner's function, its arguments by keyword unless ``positional`` (``*args``)."""

    function: str
    arguments: dict[str, Any]
    positional: bool = False
    label: str = ""  # said after the call in messages: " with the positions of x permuted"

    def __str__(self) -> str:
        shown = ", ".join(f"{name}: {describe(value)}" for name, value in self.arguments.items())
        return f"{self.function}({shown}){self.label}"

    def copies(self) -> tuple[list[Any], dict[str, Any]]:
        """Fresh copies of the arguments (tensors cloned, generators made), as ``(args, kwargs)``."""
        values = dict(self.arguments)
        for name, value in values.items():
            if isinstance(value, torch.Tensor | Seeded):
                values[name] = (
                    value.clone() if isinstance(value, torch.Tensor) else seeded_generator(value.seed)
                )
        return (list(values.values()), {}) if self.positional else ([], values)


@dataclass(frozen=True)
class Outcome:
    """What one call of the learner's function did."""

    value: Any = None
    raised: str = ""  # the type of the exception it raised, if it raised one
    message: str = ""  # and its message
    not_implemented: bool = False  # it raised NotImplementedError itself (the blank stub), not from torch
    after: dict[str, Any] = field(default_factory=dict)  # tensor arguments as the function left them
    calls: tuple[tuple[str, str], ...] = ()  # (module, name) of what it called outside its notebook
    warnings: tuple[str, ...] = ()
    observed: bool = True  # False: the profiler was switched off or replaced, its calls are unknown
    line: str = ""  # the line of the learner's code where the exception was raised, if Python knows it


@dataclass(frozen=True)
class Learner:
    """What is known of the learner's function before it is called."""

    shown: str  # describe(fn)
    is_callable: bool
    module: str = ""
    name: str = ""
    fingerprint: str = ""  # of its code, to recognise the course's own code loaded with exec()
    has_source: bool = True  # Python knows its source (False: made by exec() from a string)


def inspect_learner(fn: Any) -> Learner:
    """Describe the learner's function or class ``fn`` (in the learner's process)."""
    # a class's source is found through its module's file, which a notebook's cells do not have: its methods'
    sources = (
        [f for f in vars(fn).values() if isinstance(f, types.FunctionType)] if inspect.isclass(fn) else [fn]
    )
    has_source = bool(sources) and all(_has_source(f) for f in sources)
    return Learner(
        describe(fn),
        callable(fn),
        str(getattr(fn, "__module__", "") or ""),
        str(getattr(fn, "__name__", "") or ""),
        object_fingerprint(fn),
        has_source,
    )


def _has_source(function: types.FunctionType) -> bool:
    """Whether Python knows the source of ``function`` (the one it wraps, if decorated): its file's lines (a
    notebook cell's, which IPython registers) reach its first line. That is what :func:`inspect.getsource`
    needs, without tokenizing the definition (a class's methods took milliseconds in each test cell); code
    run by ``exec`` of a string has no lines."""
    try:
        function = inspect.unwrap(function)  # a decorated function's own source (as inspect.getsource)
        code, namespace = function.__code__, function.__globals__
        lines = linecache.getlines(code.co_filename, namespace)
    except Exception:  # a cycle of __wrapped__, something else than a function, a loader that fails
        return False
    return 0 < code.co_firstlineno <= len(lines)


def object_fingerprint(fn: Any) -> str:
    """The :func:`fingerprint` of a function, or of a class's methods (sorted by name); "" for others.

    A decorated function is known by the function it wraps (``__wrapped__``, which :func:`functools.wraps`
    sets), not by the decorator's wrapper, which every function decorated alike shares
    (``@torch.no_grad()``'s, for one)."""
    try:
        fn = inspect.unwrap(fn)
    except (ValueError, TypeError):  # a cycle of __wrapped__, or an object that refuses the lookup
        return ""
    code = getattr(fn, "__code__", None)
    if isinstance(code, types.CodeType):
        return fingerprint(code)
    if not inspect.isclass(fn):
        return ""
    methods = sorted((name, f) for name, f in vars(fn).items() if isinstance(f, types.FunctionType))
    if not methods:
        return ""
    return hashlib.sha256("".join(name + fingerprint(f.__code__) for name, f in methods).encode()).hexdigest()


def _namespace(fn: Any) -> dict[str, Any] | None:
    """The globals of the learner's code: a function's, or those of a class's methods."""
    if hasattr(fn, "__globals__"):
        return fn.__globals__
    found = (f for f in vars(fn).values() if isinstance(f, types.FunctionType)) if inspect.isclass(fn) else ()
    return next((f.__globals__ for f in found), None)


@dataclass(frozen=True)
class Driver:
    """How a behaviour calls a learner's class, or a function that takes objects which are not data.

    ``prepare(**arguments)`` turns a call's arguments into the keyword arguments of ``run`` (it may build a
    module from recorded weights) and is not observed; ``run(fn, **prepared)`` then calls the learner's ``fn``
    (construct, load, forward) and is observed, its own frames left out. Both are course code, defined in a
    checks module, and run in the learner's process (the kernel, under ``attention-grade``).
    """

    run: Callable[..., Any]
    prepare: Callable[..., dict[str, Any]] | None = None


def fingerprint(code: types.CodeType) -> str:
    """A digest of a code object's names, constants (its docstring among them) and arguments.

    It leaves out where the code was defined and its bytecode, which depends on how the source was compiled
    (``from __future__`` flags): ``exec()`` of a function's source gives the function's fingerprint.
    """
    digest = hashlib.sha256()
    for part in (code.co_names, code.co_varnames, code.co_argcount, code.co_kwonlyargcount):
        digest.update(repr(part).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            digest.update(fingerprint(const).encode())
        else:  # a frozenset's repr follows the process's hash seed: sort it
            digest.update(repr(sorted(map(repr, const)) if isinstance(const, frozenset) else const).encode())
    return digest.hexdigest()


def seed_generators(seed: int) -> None:
    """Seed torch's global generators with ``seed``, as :func:`torch.manual_seed` does.

    Where no accelerator is available, only the CPU generator is seeded: there :func:`torch.manual_seed`
    would also queue a seed for CUDA, XPU and MTIA in case they start later, and each queued call formats the
    whole Python stack for torch's lazy-initialisation bookkeeping (``torch.cuda._lazy_call``), which in a
    notebook's kernel, with IPython's frames beneath, costs milliseconds per check call and was half of a
    test cell's time.
    """
    if torch.accelerator.is_available():
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


def _called_by_learner(frame: types.FrameType, owner: dict[str, Any] | None) -> bool:
    """Whether ``frame``, of a checks module, is one of its module-level functions called straight from the
    learner's code (``attention_course.checks.ex05.forward(...)``): not a method of an object the checks hand
    the learner (a model's ``forward``), nor the checks' own frames around the learner's call."""
    caller, name = frame.f_back, frame.f_code.co_qualname
    return caller is not None and caller.f_globals is owner and "." not in name and not name.startswith("<")


def _is_checks_code(namespace: dict[str, Any]) -> bool:
    """Whether ``namespace`` is the globals of one of the course's checks modules (the engine, the families,
    each exercise's): the module of its name must hold that very dict, so that code run with a forged
    ``__name__`` is not taken for theirs."""
    name = namespace.get("__name__")
    if not isinstance(name, str) or not name.startswith("attention_course.checks."):
        return False
    return getattr(sys.modules.get(name), "__dict__", None) is namespace


def execute(fn: Callable[..., Any], call: Call, seed: int = 0, driver: Driver | None = None) -> Outcome:
    """Call ``fn`` on copies of ``call``'s arguments and note what happened (in the learner's process).

    With a ``driver``, ``driver.run(fn, **driver.prepare(**arguments))`` is called instead (see
    :class:`Driver`).

    :func:`sys.setprofile` sees Python functions on entry and C functions (``torch.softmax``, SDPA) when
    called, so that neither an alias nor a helper hides a built-in; the learner's own functions (its globals)
    and imports are left out, and so is what the garbage collector runs meanwhile (finalisers of objects that
    earlier code left behind), and a canary proves that the profiler works (else not ``observed``). Torch's
    global generators are seeded with ``seed`` and restored, so that the outcome never depends on what ran
    before. ``BaseException`` s (a time limit's ``KeyboardInterrupt``) are not caught, and an accelerator's
    error (:func:`~attention_course.device.is_accelerator_fault`, such as a CUDA device-side assert) is raised
    again with a note: it leaves the process's GPU unusable, so it is the cell's error, not an outcome.
    """
    owner = _namespace(fn)
    args, kwargs = call.copies()
    passed = dict(zip(call.arguments, args, strict=True)) if call.positional else kwargs
    seen: dict[tuple[str, str], None] = {}
    # why no call counts now, as a count: 1 while the engine's own calls run (before the learner's and after
    # them), 1 per import under way (an import runs module code: class bodies, registrations, not the
    # learner's), 1 while the cyclic garbage collector runs (it runs whenever an allocation passes its
    # threshold, in the learner's code too, and finalises what earlier code left behind: a half-consumed
    # generator of the checks resumes to close, with the learner's frame as its caller)
    quiet, collecting = [0], [False]
    recorded: dict[types.CodeType, dict[str, Any]] = {}  # code: the globals it ran with, already in seen
    functions: dict[Any, None] = {}  # built-in functions of a module (torch.softmax) already in seen

    def collector(phase: str, info: dict[str, int]) -> None:
        if (phase == "start") is not collecting[0]:
            collecting[0] = not collecting[0]
            quiet[0] += 1 if collecting[0] else -1

    # a profiler runs on every call and return of the learner's code: the common events leave first
    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "c_call":
            if quiet[0] or arg in functions:
                return
            module, name = str(getattr(arg, "__module__", "") or ""), str(getattr(arg, "__name__", ""))
            if not name and module.startswith("torch._ops"):  # an overload, torch.ops.aten.softmax.int
                name = repr(frame.f_locals.get("self"))[:80]
            seen[(module, name)] = None
            if isinstance(getattr(arg, "__self__", None), types.ModuleType):  # not a method of a tensor
                functions[arg] = None
        elif event == "c_return":
            return
        elif event == "call":
            code, namespace = frame.f_code, frame.f_globals
            if code is _FIND_AND_LOAD:
                quiet[0] += 1
            elif quiet[0] or namespace is owner or recorded.get(code) is namespace:
                return
            elif not _is_checks_code(namespace):
                seen[(str(namespace.get("__name__", "")), code.co_name)] = None
                recorded[code] = namespace
            elif _called_by_learner(frame, owner):
                # the checks' own frames are left out, unless the learner called one: they compute answers too
                seen[(str(namespace.get("__name__", "")), code.co_name)] = None
        elif event == "return" and frame.f_code is _FIND_AND_LOAD:
            quiet[0] -= 1

    value, error, canary = None, None, False
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    with warnings.catch_warnings(record=True) as caught, torch.random.fork_rng(devices=devices):
        warnings.simplefilter("always")
        seed_generators(seed)
        if driver is not None:
            prepared = driver.prepare(**kwargs) if driver.prepare else kwargs
            target = functools.partial(driver.run, fn, **prepared)
        else:
            target = functools.partial(fn, *args, **kwargs)
        previous = _GETPROFILE()
        gc.callbacks.append(collector)
        _SETPROFILE(profile)
        try:
            len(())  # the canary
            canary = ("builtins", "len") in seen
            seen.clear()
            value = target()
        except Exception as exception:  # the learner's code may raise anything
            error = exception
        finally:
            quiet[0] += 1
            intact = _GETPROFILE() is profile
            _SETPROFILE(previous)
            if collector in gc.callbacks:  # (the learner's code may have emptied the list)
                gc.callbacks.remove(collector)
    if error is not None and is_accelerator_fault(type(error).__name__, str(error)):
        # the device is unusable in this process from now on, so every later call would fail for this one's
        # fault: raised, not recorded (the grader starts a new kernel for the cells after this one)
        if hasattr(error, "add_note"):
            error.add_note(ACCELERATOR_NOTE.format(function=call.function))
        raise error
    messages = tuple(dict.fromkeys(str(w.message) for w in caught))
    for message in messages:
        print(f"note: {call.function} emitted a warning: {message}")  # stdout: a warning is not a failure
    line = raised_at(error, owner) if error is not None else ""
    # the blank stub raises NotImplementedError itself; torch raises it too (an operation a dtype or a device
    # lacks, from a line of the learner's that calls torch), and that is an error to report, not a stub
    stub = isinstance(error, NotImplementedError) and (
        not line or "NotImplementedError" in line or not str(error)
    )
    return Outcome(
        value,
        type(error).__name__ if error is not None else "",
        str(error) if error is not None else "",
        stub,
        {name: v for name, v in passed.items() if isinstance(v, torch.Tensor)},
        tuple(seen),
        messages,
        canary and intact,
        line,
    )


@functools.cache
def meta_ready() -> None:
    """Load what tensors on ``meta`` need, once, before the learner's calls: their Python references (of
    torch.arange, among others) import torch._dynamo, about 1 s on a CPU, and twice that under the profiler
    that observes a call. The checks modules with ``meta`` calls run this when they are imported (the
    notebook's set-up cell), so that no test cell waits for it; ``attention-grade``'s fork servers import it
    before forking (the assignment's ``preload``, attention_course.registry)."""
    importlib.import_module("torch._dynamo")


def meta_ready_in_a_notebook() -> None:
    """:func:`meta_ready`, when the checks are imported in a notebook's kernel (IPython is loaded): where a
    learner's set-up cell imports them. Not in ``attention-grade``'s own process, which imports every checks
    module for its review rules and makes no ``meta`` call (it cost each run about 1 s)."""
    if "IPython" in sys.modules:
        meta_ready()


def raised_at(error: BaseException, owner: dict[str, Any] | None) -> str:
    """The source line, in the learner's code (globals ``owner``), of the innermost frame that ``error``
    went through: where that code raised it, or called what raised it ("" if Python knows no source)."""
    line, trace = "", error.__traceback__
    while trace is not None:
        frame = trace.tb_frame
        if owner is not None and frame.f_globals is owner:
            line = linecache.getline(frame.f_code.co_filename, trace.tb_lineno).strip() or line
        trace = trace.tb_next
    return line[:200]


# --- the course's own answers, and what a function may not call


@functools.lru_cache(maxsize=4096)  # asked for each function that each call observed: a few hundred names
def is_answer_module(module: str) -> bool:
    """Whether ``module`` holds answers: the reference solutions, a library module they re-export, or the
    checks (whose rows compute the right answers)."""
    return any(module == answer or module.startswith(answer + ".") for answer in _answer_modules())


@functools.cache
def _answer_modules() -> tuple[str, ...]:
    # asked once per observed call: derive it once; the checks compute right answers too (their rows)
    return (*registry.answer_modules(), "attention_course.checks")


@functools.cache
def answer_fingerprints() -> dict[str, str]:
    """``{fingerprint: "module.function"}`` for every function of every importable answer module."""
    found = {}
    for name in (*registry.answer_modules(), *registry.reference_modules()):
        try:
            module = importlib.import_module(name)
        except ImportError:  # the reference solutions are only where grading happens
            continue
        for function in vars(module).values():
            if (inspect.isfunction(function) or inspect.isclass(function)) and function.__module__ == name:
                if code := object_fingerprint(function):
                    found[code] = f"{name}.{function.__name__}"
    return found


def judge_learner(learner: Learner, name: str) -> None:
    """Fail if the learner's function is not a function, or is the course's own answer."""
    if not learner.is_callable:
        fail(f"{name} is not a function or a class (got {learner.shown}): run the cell that defines it.")
    if is_answer_module(learner.module):
        fail(
            f"{name} is the course's own {learner.module}.{learner.name or name}, imported rather than "
            "written: the exercise is to write it yourself."
        )
    copied = answer_fingerprints().get(learner.fingerprint) if learner.fingerprint else None
    if copied and not learner.has_source:
        fail(
            f"{name} is the course's own {copied}, loaded with exec() rather than written in the notebook: "
            "the exercise is to write it yourself."
        )


# what hides a function's calls from the profiler: switching it, or starting a thread or a process
_HIDING = {
    tuple(name.rsplit(".", 1))
    for name in "sys.setprofile sys.settrace threading.setprofile threading.start "
    "_thread.start_new_thread _thread.start_joinable_thread multiprocessing.process.start".split()
}


def _judge_calls(call: Call, outcome: Outcome) -> None:
    """Fail if the call could not be observed, or called one of the course's own answers."""
    hidden = [f"{m}.{n}" for m, n in outcome.calls if (m, n) in _HIDING]
    if not outcome.observed or hidden:
        which = f" ({', '.join(hidden)})" if hidden else ""
        fail(
            f"{call} could not be observed: it switched off or replaced Python's profiler (sys.setprofile), "
            f"or ran code in another thread{which}, so the checks cannot see which functions it calls."
        )
    answers = sorted({f"{m}.{n}" for m, n in outcome.calls if is_answer_module(m)})
    if answers:
        fail(
            f"{call} calls the course's own {', '.join(answers)}: the exercise is to write it yourself, "
            "without the reference solutions or the course library's answers."
        )


@dataclass(frozen=True)
class FromScratch:
    """A "from scratch" rule: no function whose name contains one of ``words`` (case-insensitive)."""

    what: str  # what the task asks to write ("softmax", "scaled dot-product attention")
    words: tuple[str, ...]

    def check(self, calls: Sequence[Call]) -> Check:
        """A check that no call of ``calls`` uses a function this rule forbids, whatever it returns."""

        def judge(*outcomes: Outcome) -> None:
            for call, outcome in zip(calls, outcomes, strict=True):
                found = dict.fromkeys(f"{m}.{n}" if m else n for m, n in outcome.calls if self.forbids(n))
                if found:
                    fail(
                        f"{call} calls {', '.join(found)}: the task is to write {self.what} from scratch, so "
                        "a built-in that computes it (or the course's reference) cannot be used here."
                    )

        return Check(tuple(calls), judge, raw=True)

    def forbids(self, name: str) -> bool:
        return any(word in name.lower() for word in self.words)


# --- tables of what learners read; the likely cause of an exception

Hints = Sequence[tuple[str, str]]  # ("pattern | pattern", hint): the hint of an exception with a pattern


def table(text: str) -> dict[str, str]:
    """``{key: text}`` from lines ``key: text`` (the key ends at ``": "``), continued on indented lines."""
    rows: dict[str, str] = {}
    for line in text.strip("\n").splitlines():
        if line.startswith(" ") and rows:
            key = next(reversed(rows))
            rows[key] = f"{rows[key]} {line.strip()}"
        elif line.strip():
            key, _, value = line.partition(": ")
            rows[key.strip()] = value.strip()
    return rows


def hint_table(text: str) -> Hints:
    """Hints for exceptions, from a :func:`table` whose keys are fragments of messages separated by ``|``."""
    return tuple(table(text).items())


def shapes(
    rows: dict[str, str], kind: str, lead: Sequence[int] = (), **sizes: int
) -> dict[tuple[int, ...], str]:
    """``{shape: hint}``, likely causes of wrong shapes, from the rows ``<kind> <axes>`` of a :func:`table`.

    An axis is a name, sized by ``sizes`` (a row naming another is left out), or a number.
    """
    found = {}
    for key, hint in rows.items():
        head, *axes = key.split()
        if head == kind and all(axis in sizes or axis.isdigit() for axis in axes):
            found[(*lead, *(sizes[a] if a in sizes else int(a) for a in axes))] = hint
    return found


GENERAL_HINTS = hint_table("""
cannot be converted to type | without overflow: a fill value such as -1e9 does not fit in float16 (its
    largest value is 65504): fill masked scores with float('-inf') or torch.finfo(scores.dtype).min
bitwise_and | bitwise_or: masks are combined with & only when both are boolean: build them with
    dtype=torch.bool (torch.ones(..., dtype=torch.bool)) or call .bool()
with a bool tensor is not supported: a boolean mask is negated with ~mask (logical not), not with 1 - mask
only supports boolean masks: masked_fill takes a boolean mask (True where it fills): build it with
    dtype=torch.bool, or compare (mask == 0) to get one
return_types.max | return_types.min: x.max(dim) returns a pair (values, indices): use
    x.amax(dim=dim, keepdim=True), or x.max(dim=dim, keepdim=True).values
must be a 3D tensor: torch.bmm takes 3-D tensors [batch, n, m] only: with several leading axes (batch,
    heads) use @ (torch.matmul), which broadcasts over them
same device: create new tensors on the device of the inputs (device=x.device), never on a fixed device
expected scalar type | same dtype | expected m1 and m2 to have the same dtype | dtype mismatch: create new
    tensors with the dtype of the inputs (dtype=x.dtype) so that every dtype works
Dimension out of range: an axis index is out of range: with leading (batch, head) axes, count axes from the
    end (-1 for the last, -2 for the one before)
is out of bounds for dimension | index out of range in self: an index is past the end of a tensor's axis:
    check the bounds of what you index (a loop's last block ends at min(start + size, length), positions
    run from 0 to length - 1)
list index out of range | tuple index out of range: an index is past the end of a list or tuple: check its
    length where you index it (a shape has as many entries as the tensor has axes)
size of tensor | shape | Expected size | expand | broadcast: shapes do not fit: check which axes you
    transpose, sum and broadcast over; with leading (batch, head) axes use key.transpose(-2, -1), not key.T or
    key.transpose(0, 1)
unexpected keyword argument | missing 1 required positional argument | positional arguments: keep the
    signature given in the task, argument names and defaults included
is not defined: a name your function uses is not defined: run the cell that defines or imports it first
""")


def hint_for(text: str, extra: Hints = (), line: str = "") -> str:
    """The likely cause of an exception whose ``type: message`` is ``text``, raised at the learner's source
    ``line``; ``extra`` hints come first.

    A hint's key lists patterns separated by ``|``, any of which selects it; a pattern ``A & B`` needs each
    of its fragments, in the exception's text or in the line (``too many indices & mask``: an index error
    raised where a mask is indexed).
    """
    for patterns, hint in (*extra, *GENERAL_HINTS):
        for pattern in patterns.split(" | "):
            fragments = pattern.split(" & ")
            where = text if len(fragments) == 1 else f"{text}\n{line}"
            if all(fragment in where for fragment in fragments):
                return hint
    return ""


# --- checks, parts and behaviours


@dataclass(frozen=True)
class Check:
    """One or more calls and the judge that decides, from what they returned, whether the behaviour holds.

    ``judge(*values)`` gets what each call returned, once the engine has failed exceptions, unobservable
    calls and calls of the course's answers; with ``raw`` it gets the :class:`Outcome` s. ``untouched``:
    the calls must leave their tensor arguments unchanged (a string is the message, with ``{call}`` and
    ``{name}``). ``prefix`` goes in front of a failure's message; ``on_raise`` after it when the function
    raised.
    """

    calls: Call | tuple[Call, ...]
    judge: Callable[..., None]
    raw: bool = False
    untouched: bool | str = False
    prefix: str = ""
    on_raise: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.calls, Call):
            object.__setattr__(self, "calls", (self.calls,))

    def verdict(self, outcomes: Sequence[Outcome], hints: Hints = ()) -> None:
        """Judge the outcomes of this check's calls; raise :class:`CheckFailure` if the behaviour fails."""
        pairs = list(zip(self.calls, outcomes, strict=True))
        try:
            if self.raw:
                for call, outcome in pairs:
                    _judge_calls(call, outcome)
                self.judge(*outcomes)
                return
            values = [_value(call, outcome, hints) for call, outcome in pairs]
            for call, outcome in pairs if self.untouched else ():
                _untouched(call, outcome, self.untouched if isinstance(self.untouched, str) else "")
            self.judge(*values)
        except CheckFailure as failure:
            note = self.on_raise if failure.raised else ""
            raise failure.amended(before=self.prefix, note=note, call=str(self.calls[0])) from None


NOT_IMPLEMENTED = "{function} is not implemented yet: replace `raise NotImplementedError()` with your code."


def raises(call: Call, error: str, condition: str, hint: str = "") -> Check:
    """A check that ``call`` raises ``error`` (the name of an exception type), as the learner's docstring
    promises it does ``condition`` ("if d_k < 1"): an error documented is part of the contract.

    ``hint`` is the likely cause when the call returned instead, or raised another type."""

    def judge(outcome: Outcome) -> None:
        if outcome.not_implemented:
            fail(NOT_IMPLEMENTED.format(function=call.function))
        if outcome.raised == error:
            return
        got = f"raised {outcome.raised}: {outcome.message}" if outcome.raised else "returned without an error"
        fail(
            f"{call} {got}; it should raise {error} {condition}, as its docstring says.",
            hint
            or f"check the arguments first and `raise {error}(...)` with a message that says what is wrong",
            expected=error,
            got=outcome.raised or describe(outcome.value),
        )

    return Check(call, judge, raw=True)


def _value(call: Call, outcome: Outcome, hints: Hints) -> Any:
    """What the call returned; fail if it raised, could not be observed, or called an answer."""
    if outcome.not_implemented:
        fail(NOT_IMPLEMENTED.format(function=call.function))
    if outcome.raised:
        text, at = f"{outcome.raised}: {outcome.message}", f" at `{outcome.line}`" if outcome.line else ""
        fail(f"{call} raised {text}{at}", hint_for(text, hints, outcome.line), got=text, raised=True)
    _judge_calls(call, outcome)
    return outcome.value


def _untouched(call: Call, outcome: Outcome, message: str) -> None:
    """Fail if the function changed a tensor argument in place."""
    for name, after in outcome.after.items():
        before = call.arguments[name]
        if after.shape == before.shape and after.dtype == before.dtype:
            if before.device.type == "meta" or torch.equal(after.cpu(), before.cpu()):
                continue
        fail(
            message.format(call=call, name=name)
            or f"{call} modified its argument `{name}` in place. Likely cause: an in-place operation such as "
            f"`{name} /= ...`, `{name} -= ...` or `{name}.masked_fill_(...)`; compute new tensors instead "
            "(`x = x / s`, `x.masked_fill(...)`), since callers reuse their inputs."
        )


def correct_first(checks: Iterator[Check], function: str) -> Iterator[Check]:
    """``checks`` whose failures say that ``function`` must be correct before it counts as from scratch."""
    before = f"{function} must be correct before it counts as written from scratch. "
    return (replace(check, prefix=before) for check in checks)


@dataclass(frozen=True)
class Part:
    """The visible or the hidden part of a behaviour, as its plan sees it.

    ``reference`` is the reference implementation of the learner's ``function`` in a hidden part (a
    visible part never uses it); ``device`` is where inputs are made.
    """

    hidden: bool
    function: str
    device: torch.device
    reference: Callable[..., Any] | None = None

    def call(self, label: str = "", /, **arguments: Any) -> Call:
        """A call of the learner's function with keyword ``arguments``."""
        return Call(self.function, arguments, label=label)


Plan = Callable[[Part], Iterator[Check]]


class Behaviour:
    """What one test cell checks: ``behaviour(fn)`` runs its visible part, ``behaviour.hidden(fn)`` the other.

    ``name`` (the grade id) and ``description`` (the test cell's first line, without its points) come from
    the plan function; ``hints`` are likely causes of the function's exceptions, tried before the general.
    """

    def __init__(
        self, plan: Plan, *, function: str, points: float, hints: Hints = (), driver: Driver | None = None
    ) -> None:
        self.plan, self.function, self.points, self.hints, self.driver = plan, function, points, hints, driver
        self.name, self.module = plan.__name__, plan.__module__
        self.description = " ".join((inspect.getdoc(plan) or "").split("\n\n")[0].split())

    def __repr__(self) -> str:
        return f"<behaviour {self.name} of {self.function}, {self.points:g} point(s)>"

    def part(self, *, hidden: bool, reference: Callable[..., Any] | None = None) -> Part:
        return Part(hidden, self.function, default_device(), reference)

    def checks(self, part: Part) -> list[Check]:
        """The plan of ``part``: its checks, in order."""
        return list(self.plan(part))

    @hide_engine_frames
    def __call__(self, fn: Callable[..., Any]) -> None:
        """Run the visible part on the learner's function ``fn`` (record it, under ``attention-grade``)."""
        self._run(fn, hidden=False)

    @hide_engine_frames
    def hidden(self, fn: Callable[..., Any], reference: Callable[..., Any] | None = None) -> None:
        """Run the hidden part: more inputs, against ``reference`` (default: the registry's reference)."""
        self._run(fn, hidden=True, reference=reference)

    def _run(
        self, fn: Callable[..., Any], *, hidden: bool, reference: Callable[..., Any] | None = None
    ) -> None:
        RUNNER.get().run(self, fn, hidden=hidden, reference=reference)

    def judge(self, checks: Sequence[Check], learner: Learner, outcomes: Sequence[Outcome]) -> None:
        """Judge recorded ``outcomes`` of the calls of ``checks`` (split mode, in the grader's process)."""
        judge_learner(learner, self.function)
        if len(outcomes) != sum(len(check.calls) for check in checks):
            fail(f"the recording of {self.name} does not match its checks: it was not made by this course.")
        start = 0
        for check in checks:
            check.verdict(outcomes[start : start + len(check.calls)], self.hints)
            start += len(check.calls)


class Runner(Protocol):
    """How a test cell runs a behaviour's part on a learner's function: :class:`Direct` (call and judge here),
    or ``attention-grade``'s recorder in a kernel (call here, judge in the grader's process)."""

    def run(
        self,
        behaviour: Behaviour,
        fn: Callable[..., Any],
        *,
        hidden: bool,
        reference: Callable[..., Any] | None = None,
    ) -> None: ...


class Direct:
    """Call ``fn`` on the part's inputs and judge the outcomes in this process, the first failure raising
    :class:`CheckFailure`: a learner's visible checks, ``nbgrader autograde``, ``--mode together``."""

    def run(
        self,
        behaviour: Behaviour,
        fn: Callable[..., Any],
        *,
        hidden: bool,
        reference: Callable[..., Any] | None = None,
    ) -> None:
        if hidden and reference is None:
            reference = registry.reference_function(behaviour.module, behaviour.function)
        judge_learner(inspect_learner(fn), behaviour.function)
        seed = 0
        for check in behaviour.checks(behaviour.part(hidden=hidden, reference=reference)):
            outcomes = [execute(fn, call, seed + i, behaviour.driver) for i, call in enumerate(check.calls)]
            seed += len(check.calls)
            check.verdict(outcomes, behaviour.hints)  # the first failure stops


DIRECT = Direct()  # it holds no state
# the runner of every test cell in this context: attention-grade's recorder sets its own in a kernel before
# any cell runs (attention_course.grading.recorder.start); a context variable: a test may set one for a block
RUNNER: contextvars.ContextVar[Runner] = contextvars.ContextVar("attention_course_runner", default=DIRECT)


def behaviours(assignment: registry.Assignment) -> tuple[Behaviour, ...]:
    """The behaviours of ``assignment``'s test cells: those its checks module defines, in the order it defines
    them, which is the notebook's order (imports the checks module)."""
    found = vars(importlib.import_module(assignment.checks)).values()
    return tuple(b for b in found if isinstance(b, Behaviour) and b.module == assignment.checks)


def behaviour(
    *, function: str, points: float, hints: Hints = (), driver: Driver | None = None
) -> Callable[[Plan], Behaviour]:
    """Decorator: the plan function ``plan(part) -> Iterator[Check]`` becomes a :class:`Behaviour`.

    ``function`` names the learner's function or class; a class, or a function that takes objects that are
    not data (modules), is called through a :class:`Driver`.
    """
    return lambda plan: Behaviour(plan, function=function, points=points, hints=hints, driver=driver)


# --- comparing

# (rtol, atol) floors per dtype, for results of size about 1 computed in that dtype
_FLOORS = {
    torch.float64: (1e-7, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 2e-3),
    torch.bfloat16: (5e-2, 1.6e-2),
}


def coarser(first: torch.dtype, second: torch.dtype) -> torch.dtype:
    """The less precise of two dtypes (a dtype that is not floating counts as exact)."""
    eps = {dtype: torch.finfo(dtype).eps if dtype.is_floating_point else 0.0 for dtype in (first, second)}
    return first if eps[first] >= eps[second] else second


def tolerance(dtype: torch.dtype, naive_error: float = 0.0) -> tuple[float, float]:
    """``(rtol, atol)`` for ``dtype``: a floor, or four times ``naive_error``, the error of a plain same-dtype
    computation against float64 (the rule of PyTorch's attention tests: a few times less exact, no more)."""
    rtol, atol = _FLOORS.get(dtype, _FLOORS[torch.float32])
    return rtol, max(atol, 4.0 * naive_error)


def close(actual: Any, expected: torch.Tensor, dtype: torch.dtype, naive_error: float = 0.0) -> bool:
    """Whether ``actual`` matches ``expected`` within ``dtype``'s tolerance, on its finite elements (at least
    half must be: a mistake explains a result that is NaN in rows that the mistake leaves empty)."""
    if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
        return False
    rtol, atol = tolerance(dtype, naive_error)
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    finite = torch.isfinite(a)
    return finite.double().mean() >= 0.5 and torch.allclose(a[finite], e[finite], rtol=rtol, atol=atol)


@dataclass(frozen=True)
class Mistake:
    """A known wrong computation, and the hint that names it."""

    hint: str
    result: torch.Tensor


def diagnose(actual: Any, mistakes: Iterator[Mistake], dtype: torch.dtype, naive_error: float = 0.0) -> str:
    """The hint of the first known mistake whose result ``actual`` reproduces, if any."""
    return next((m.hint for m in mistakes if close(actual, m.result, dtype, naive_error)), "")


def assert_shape(
    actual: Any, where: str, shape: Sequence[int], hints: dict | None = None, dtype=None
) -> None:
    """Fail unless ``actual`` (``where``: "the output of f(...)") is a tensor of ``shape``."""
    if not isinstance(actual, torch.Tensor):
        expected = f"{dtype_name(dtype)} {list(shape)}" if dtype else f"of shape {list(shape)}"
        fail(f"{where} should be a tensor ({expected}), got {describe(actual)}.", got=describe(actual))
    if tuple(actual.shape) != tuple(shape):
        got, cause = list(actual.shape), (hints or {}).get(tuple(actual.shape), "")
        fail(
            f"{where} has shape {got}, expected {list(shape)}.",
            cause,
            expected=str(list(shape)),
            got=str(got),
        )


def assert_format(
    actual: Any, where: str, shape, dtype: torch.dtype, device: torch.device, hints=None
) -> None:
    """Fail unless ``actual`` is a tensor of ``shape``, ``dtype`` and ``device``, judged in that order."""
    assert_shape(actual, where, shape, hints, dtype)
    if actual.dtype != dtype:
        fail(
            f"{where} has dtype {actual.dtype}, expected {dtype}: the dtype must follow the inputs. Likely "
            "cause: a .float()/.double() call, or a new tensor created without dtype=x.dtype.",
            expected=str(dtype),
            got=str(actual.dtype),
        )
    if actual.device != device:
        fail(
            f"{where} is on {actual.device}, expected {device}: the device must follow the inputs. Likely "
            "cause: a tensor created without device=x.device, or a .cpu()/.cuda() call.",
            expected=str(device),
            got=str(actual.device),
        )


def assert_values(
    actual: Any,
    expected: torch.Tensor,
    where: str,
    *,
    dtype: torch.dtype | None = None,
    naive_error: float = 0.0,
    mistakes: Callable[[], Iterator[Mistake]] | None = None,
    hints: dict | None = None,
    note: str = "",
) -> None:
    """Fail unless ``actual`` has ``expected``'s shape and values, compared in float64 within the tolerance of
    the coarser of ``dtype`` and ``actual``'s (cells of their own judge dtypes and devices). A mismatch names
    the worst element and, when one of ``mistakes()`` reproduces it, the likely cause."""
    dtype = dtype or expected.dtype
    assert_shape(actual, where, expected.shape, hints, dtype)
    dtype = coarser(dtype, actual.dtype)
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    cause = functools.partial(diagnose, actual, dtype=dtype, naive_error=naive_error)
    finite, bad = torch.isfinite(e), ~torch.isfinite(a) & torch.isfinite(e)
    if bad.any():
        index = tuple(torch.nonzero(bad)[0].tolist())
        fail(
            f"{where} contains NaN or inf ({int(bad.sum())} of {bad.numel()} elements, first at index "
            f"{list(index)}: {a[index].item()}) where the right answer is finite.",
            (cause(mistakes()) if mistakes else "")
            or "exp() overflowed (subtract the maximum before exponentiating), or a 0/0 from a row whose "
            "elements all became -inf or underflowed to 0",
        )
    # where the right answer is inf or NaN (a running maximum of no scores, say), the same is expected
    special = ~finite & ~((a == e) | (torch.isnan(a) & torch.isnan(e)))
    if special.any():
        index = tuple(torch.nonzero(special)[0].tolist())
        fail(
            f"{where} is {a[index].item()} at index {list(index)} where the right answer is "
            f"{e[index].item()} ({int(special.sum())} of {special.numel()} elements differ there).",
            cause(mistakes()) if mistakes else "",
            expected=f"{e[index].item()} at {list(index)}",
            got=str(a[index].item()),
        )
    rtol, atol = tolerance(dtype, naive_error)
    mismatch = ~((a - e).abs() <= atol + rtol * e.abs()) & finite
    if mismatch.any():
        error = ((a - e).abs() - rtol * e.abs()).masked_fill(~mismatch, -math.inf)
        index = tuple(torch.nonzero(error == error.max())[0].tolist())
        wrong, right = distinct_digits(a[index].item(), e[index].item())
        difference = abs(a[index].item() - e[index].item())
        # the error relative to the tensor's scale: near-zero elements do not blow it up
        largest = max(e[finite].abs().max().item(), 1e-300)
        relative = (a - e)[finite].abs().max().item() / largest
        share = mismatch.double().mean()
        fail(
            f"{where} does not match ({dtype_name(dtype)}, shape {list(a.shape)}): {int(mismatch.sum())} of "
            f"{mismatch.numel()} elements differ ({share:.0%}); the worst, at index {list(index)}, is "
            f"{wrong} where {right} is expected (off by {difference:.3g}; largest error / largest "
            f"expected magnitude {relative:.2g}; rtol {rtol:g}, atol {atol:.2g})."
            + (f" {note}" if note else ""),
            (cause(mistakes()) if mistakes else "") or precision_hint(dtype, relative),
            expected=f"{right} at {list(index)}",
            got=wrong,
        )


def distinct_digits(actual: float, expected: float) -> tuple[str, str]:
    """``actual`` and ``expected`` written with 6 significant digits, or as many more (up to 17) as it takes
    for the two to read differently: a value off in its 9th digit is not shown as the expected value."""
    for digits in range(6, 18):
        shown = f"{actual:.{digits}g}", f"{expected:.{digits}g}"
        if shown[0] != shown[1]:
            return shown
    return shown


# float32's rounding (2**-24), and the relative errors at which a float64 result was most likely computed
# through float32 (a few hundred roundings at most)
_FLOAT32_EPS = 2.0**-24


def precision_hint(dtype: torch.dtype, relative: float) -> str:
    """A hint when a float64 result is off by a relative error of float32's order: a lost precision."""
    if dtype != torch.float64 or not _FLOAT32_EPS / 4 <= relative <= 1e3 * _FLOAT32_EPS:
        return ""
    return (
        f"the values agree to about float32's precision (relative error {relative:.1g}; float32 rounds "
        f"at {_FLOAT32_EPS:.1g}) although the inputs are float64: some step computes in float32, such as a "
        "tensor made without dtype= (torch.tensor, torch.arange, torch.ones default to float32), a .float() "
        "call, or a float32 layer or buffer"
    )


def once(compute: Callable[[], Any]) -> Callable[[], Any]:
    """``compute`` called on first use only: a plan's answer, which every submission's judge needs, is
    computed once per process (plans are deterministic, and ``attention-grade`` reuses them)."""
    done: list[Any] = []

    def value() -> Any:
        if not done:
            done.append(compute())
        return done[0]

    return value


def reference_answer(reference: Callable[..., Any], arguments: dict[str, Any]) -> tuple[tuple, tuple]:
    """The answer in float64 (the reference on the arguments upcast) and the error of the reference run on the
    arguments as they are (the tolerance, :func:`tolerance`): tuples, of one for one tensor."""
    wide = {
        k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in arguments.items()
    }
    truth, naive = (reference(**values) for values in (wide, arguments))
    truth, naive = (x if isinstance(x, tuple) else (x,) for x in (truth, naive))
    errors = tuple(
        (n.double() - t).abs().max().item() if t.numel() else 0.0 for n, t in zip(naive, truth, strict=True)
    )
    return truth, errors


def randn(
    shape: Sequence[int], *, seed: int, device="cpu", dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Standard normal draws made on the CPU in float64 from ``seed``, then moved: the same on any device."""
    return torch.randn(*shape, generator=seeded_generator(seed), dtype=torch.float64).to(device, dtype)
