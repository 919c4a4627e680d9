"""The grader's seams: the options both front ends build from ``Limits``, the ``Mode`` type, the engine's
runner chosen by a context variable, and no import circle between the engine and the registry."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import subprocess
import sys

import pytest

from attention_course.checks import engine
from attention_course.grading import cli
from attention_course.grading.options import Limits, Mode, add_options, limits_of, mode_of
from attention_course.registry import ASSIGNMENTS

# a value for each limit that is not its default
CHANGED = {limit.name: limit.default + 7 for limit in dataclasses.fields(Limits)}


def test_every_limit_is_an_option_of_attention_grade():
    flags = [f"--{limit.metadata['flag']}" for limit in dataclasses.fields(Limits)]
    assert len(set(flags)) == len(flags)
    argv = ["ex02_scaled_dot_product", "x.ipynb", "--mode", "together"]
    for flag, limit in zip(flags, dataclasses.fields(Limits), strict=True):
        argv += [flag, str(CHANGED[limit.name])]
    parsed = cli.parser().parse_args(argv)
    get = functools.partial(getattr, parsed)
    assert limits_of(get) == Limits(**CHANGED)
    assert mode_of(get) is Mode.TOGETHER
    defaults = cli.parser().parse_args(["ex02_scaled_dot_product", "x.ipynb"])
    assert limits_of(functools.partial(getattr, defaults)) == Limits()
    assert mode_of(functools.partial(getattr, defaults)) is Mode.SPLIT


def test_the_pytest_plugin_has_the_same_options_with_its_prefix():
    parser = argparse.ArgumentParser()
    add_options(parser.add_argument, prefix="grade-")  # as pytest's addoption: the same keywords
    argv = ["--grade-mode", "together"]
    for limit in dataclasses.fields(Limits):
        argv += [f"--grade-{limit.metadata['flag']}", str(CHANGED[limit.name])]
    get = functools.partial(getattr, parser.parse_args(argv))
    assert limits_of(get, prefix="grade-") == Limits(**CHANGED)
    assert mode_of(get, prefix="grade-") is Mode.TOGETHER
    shown = subprocess.run(
        [sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for limit in dataclasses.fields(Limits):
        assert f"--grade-{limit.metadata['flag']}" in shown


def test_a_mode_is_its_name_and_nothing_else():
    assert Mode("split") is Mode.SPLIT and Mode("together") is Mode.TOGETHER
    assert Mode.SPLIT.judged_here and not Mode.SPLIT.shows_solutions
    assert Mode.TOGETHER.shows_solutions and not Mode.TOGETHER.judged_here
    with pytest.raises(ValueError):
        Mode("both")


class Remembering:
    """A runner that only remembers what it was asked to run."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, bool]] = []

    def run(self, behaviour, fn, *, hidden, reference=None) -> None:
        self.runs.append((behaviour.name, hidden))


def test_a_behaviour_runs_through_the_runner_of_its_context():
    behaviour = engine.behaviours(ASSIGNMENTS["ex02_scaled_dot_product"])[0]
    assert isinstance(engine.RUNNER.get(), engine.Direct)
    runner = Remembering()
    token = engine.RUNNER.set(runner)
    try:
        behaviour(lambda *a, **k: None)  # a wrong function: the direct runner would fail it
        behaviour.hidden(lambda *a, **k: None)
    finally:
        engine.RUNNER.reset(token)
    assert runner.runs == [(behaviour.name, False), (behaviour.name, True)]
    with pytest.raises(engine.CheckFailure):  # back to the direct runner, which judges
        behaviour(lambda *a, **k: None)


def test_the_registry_does_not_import_the_engine():
    code = "import sys, attention_course.registry; print('attention_course.checks.engine' in sys.modules)"
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "False"
