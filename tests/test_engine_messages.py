"""What the engine says of a wrong value, and how it knows the course's own code from a learner's."""

from __future__ import annotations

import inspect
import linecache
import re
import textwrap

import pytest
import torch

from attention_course import transformer
from attention_course.checks import engine
from attention_course.checks.engine import CheckFailure


def failure(actual: torch.Tensor, expected: torch.Tensor) -> CheckFailure:
    with pytest.raises(CheckFailure) as raised:
        engine.assert_values(actual, expected, "the output")
    return raised.value


def test_a_value_off_in_its_ninth_digit_is_shown_with_the_digits_that_differ():
    expected = torch.tensor([0.634113123456, 0.2], dtype=torch.float64)
    actual = expected.clone()
    actual[0] += 3e-7  # beyond float64's rtol 1e-7, hidden by 6 significant digits
    message = str(failure(actual, expected))
    wrong, right = re.search(r"is (\S+) where (\S+) is expected", message).groups()
    assert wrong != right and wrong.startswith("0.634113") and right.startswith("0.634113"), message
    assert "off by 3e-07" in message


def test_where_the_answer_is_infinite_or_nan_the_same_is_expected():
    inf = float("inf")
    expected = torch.tensor([-inf, 0.5, inf, float("nan")], dtype=torch.float64)
    engine.assert_values(expected.clone(), expected, "the running maximum")  # inf = inf, NaN = NaN
    for index, wrong in ((0, 0.0), (0, inf), (2, -inf), (0, float("nan")), (3, 1.0)):
        actual = expected.clone()
        actual[index] = wrong
        message = str(failure(actual, expected))
        assert f"at index [{index}] where the right answer is {expected[index].item()}" in message, message


def test_a_function_that_calls_the_checks_own_computation_earns_no_value_points():
    from attention_course.checks import attention_family, ex02

    def softmax(x, dim=-1):  # the right values, computed by the checks' own code
        return attention_family.masked_softmax(x, None, dim)

    leaked = re.escape("calls the course's own attention_course.checks.attention_family.masked_softmax")
    with pytest.raises(CheckFailure, match=leaked):
        ex02.softmax_matches_torch(softmax)

    def written(x, dim=-1):  # the same values, written here
        shifted = (x - x.amax(dim, keepdim=True)).exp()
        return shifted / shifted.sum(dim, keepdim=True)

    ex02.softmax_matches_torch(written)


def test_what_the_garbage_collector_finalises_during_a_call_is_not_the_learner_s():
    """A half-consumed generator of the checks, left in a reference cycle by an earlier check (a failure's
    traceback holds its frame), is closed by the collector whenever an allocation passes the threshold, in
    the learner's code too: the generator resumes with the learner's frame as its caller. Once a correct
    ex11 submission was told it "calls the course's own attention_course.checks.ex10.operations" so."""
    import gc
    import weakref

    from attention_course.checks import ex10

    namespace: dict = {}
    exec("def f(query):\n    kept = [[i] for i in range(5000)]\n    return query * 2\n", namespace)

    def leave_garbage() -> weakref.ref:
        operations = ex10.operations("a0:5 a0:2")
        next(operations)
        cycle: list = [operations]
        cycle.append(cycle)
        return weakref.ref(operations)

    gc.collect()
    left = leave_garbage()
    call = engine.Call("f", {"query": torch.zeros(2, 3)})
    outcome = engine.execute(namespace["f"], call)
    assert left() is None  # the collector closed it during the call
    assert not [call for call in outcome.calls if call[0].startswith("attention_course.")], outcome.calls
    engine._judge_calls(call, outcome)


def test_a_function_is_seen_when_the_learner_calls_it_whatever_ran_it_before(tmp_path, monkeypatch):
    """The profiler notes each function once per call (it runs on every event, so it skips what it has
    noted): a built-in and a function that an import ran first (not the learner's calls) are still seen when
    the learner calls them afterwards, and one code object run with two modules' globals is seen in each."""
    (tmp_path / "learners_helpers.py").write_text(
        "import torch\n\n\ndef helper(x):\n    return x\n\n\n"
        "helper(torch.special.expit(torch.zeros(1)))  # at import: not the learner's call\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    namespace: dict = {"torch": torch}
    exec(
        "import types\n"
        "def f(query):\n"
        "    import learners_helpers\n"
        "    query = learners_helpers.helper(torch.special.expit(query))\n"
        "    elsewhere = types.FunctionType(learners_helpers.helper.__code__, {'__name__': 'elsewhere'})\n"
        "    return elsewhere(query)\n",
        namespace,
    )
    outcome = engine.execute(namespace["f"], engine.Call("f", {"query": torch.zeros(2, 3)}))
    assert outcome.observed and not outcome.raised, outcome
    assert {("learners_helpers", "helper"), ("elsewhere", "helper")} <= set(outcome.calls), outcome.calls
    assert any(name == "special_expit" for _, name in outcome.calls), outcome.calls


def test_a_float64_result_computed_in_float32_gets_the_precision_hint():
    scores = torch.randn(4, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    expected = torch.softmax(scores, -1)
    lost = failure(torch.softmax(scores.float(), -1).double(), expected)
    assert "float32's precision" in lost.cause and "some step computes in float32" in lost.cause
    wrong = expected.clone()
    wrong[0, 0] += 0.1  # a mistake, not a precision loss
    assert failure(wrong, expected).cause == ""
    halved = torch.softmax(scores.float(), -1)  # a float32 result is judged at float32's tolerance
    assert failure(halved / 2, expected.float()).cause == ""


def test_a_decorated_learner_function_is_not_the_course_s():
    @torch.no_grad()
    def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        """Mine."""
        return prompt

    course = transformer.generate  # decorated with @torch.no_grad() too
    assert engine.object_fingerprint(generate) != engine.object_fingerprint(course)
    assert engine.answer_fingerprints().get(engine.object_fingerprint(generate)) is None
    engine.judge_learner(engine.inspect_learner(generate), "generate")  # does not fail


def test_the_course_s_decorated_function_loaded_with_exec_is_still_recognised():
    namespace: dict = {}
    exec(textwrap.dedent(inspect.getsource(transformer)), namespace)  # the course's own module
    copied = namespace["generate"]
    assert engine.answer_fingerprints()[engine.object_fingerprint(copied)].endswith(".generate")
    with pytest.raises(CheckFailure, match="loaded with exec"):
        engine.judge_learner(engine.inspect_learner(copied), "generate")


def raising(source: str) -> CheckFailure:
    """The failure of a function defined by ``source`` (known to linecache, as a notebook cell is)."""
    filename = f"<cell {abs(hash(source))}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)
    call = engine.Call("f", {"query": torch.zeros(2, 3)})
    with pytest.raises(CheckFailure) as raised:
        engine._value(call, engine.execute(namespace["f"], call), ())
    return raised.value


@pytest.mark.parametrize(
    ("body", "cause"),
    [
        ("return query.sum(dim=2)", "count axes from the end"),
        ("return query[5]", "past the end of a tensor's axis"),
        ("return query * [1, 2][5]", "past the end of a list or tuple"),
        ("return query * query.shape[2]", "past the end of a list or tuple"),
    ],
)
def test_an_index_error_is_explained_by_what_was_indexed_and_where(body, cause):
    failure = raising(f"def f(query):\n    {body}\n")
    assert cause in failure.cause and f"at `{body}`" in failure.message, str(failure)


def test_a_pattern_with_fragments_needs_each_of_them_in_the_message_or_the_line():
    hints = engine.hint_table("too many indices & mask: the mask has fewer axes than the scores")
    assert engine.hint_for("IndexError: too many indices for tensor", hints, "s = mask[:, None, :, :]")
    assert not engine.hint_for("IndexError: too many indices for tensor", hints, "s = scores[0, 0, 0]")


def test_a_not_implemented_error_from_torch_is_reported_not_taken_for_the_blank_stub():
    stub = raising("def f(query):\n    raise NotImplementedError()\n")
    assert "is not implemented yet" in stub.message
    torch_s = raising("def f(query):\n    return query.bool() & query\n")  # "bitwise_and_cpu" not implemented
    assert "is not implemented yet" not in torch_s.message, str(torch_s)
    assert "NotImplementedError" in torch_s.message and "query.bool() & query" in torch_s.message
