"""Hostile submissions of ex02: wrong or forbidden functions, and a cell that tampers with the grading.

Each tamper names the functions it submits (a bank variant, or a source of its own) and the cells it adds
(``"top"``: before the setup cell, so before the checks are imported; ``"setup"``: right after it; ``"end"``:
after the last test cell). ``fools_together`` says that it earns more than its functions deserve when the
test cells run in the learner's kernel (``attention-grade --mode together``, as ``nbgrader autograde``).
"""

from __future__ import annotations

from dataclasses import dataclass

import nbformat


@dataclass(frozen=True)
class Tamper:
    name: str
    functions: dict[str, str]  # function -> bank variant ("softmax__not_normalised") or source
    cells: tuple[tuple[str, str], ...]  # (position, source)
    fools_together: bool = False


ANSWERS = "from attention_course import attention as answers"

FORGER = """
import dataclasses, json, math
from pathlib import Path
import torch
from attention_course.checks import engine
from attention_course.grading import recorder

def _attention(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    weights = torch.softmax(scores if mask is None else scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask), weights

def _variance(d_k, n_samples, scaled=False, generator=None):
    query, key = (torch.randn(n_samples, d_k, generator=generator) for _ in range(2))
    dots = (query * key).sum(-1)
    return (dots / math.sqrt(d_k) if scaled else dots).var().item()

HONEST = {"softmax": lambda x, dim=-1: torch.softmax(x, dim), "scaled_dot_product_attention": _attention,
          "dot_product_variance": _variance}
# forge every recording: right outputs, computed with built-ins, and no calls shown
if isinstance(engine.RUNNER.get(), recorder.Recorder):
    folder = engine.RUNNER.get().folder
    for path in sorted((folder / "recordings").glob("*.json")):
        content = json.loads(path.read_text())
        calls = recorder.read_calls(folder / "inputs", f"{content['behaviour']}.{content['part']}")
        outcomes = [engine.execute(HONEST[call.function], call, i) for i, call in enumerate(calls)]
        outcomes = [dataclasses.replace(outcome, calls=()) for outcome in outcomes]
        tensors = {}
        content["outcomes"] = [recorder.encode_outcome(outcome, tensors) for outcome in outcomes]
        content["learner"].update(is_callable=True, module="__main__")
        stem = str(path)[: -len(".json")]
        for suffix in (".json", ".safetensors"):
            Path(stem + suffix).unlink()
        recorder.save(Path(stem), content, tensors)
        Path(stem + ".seal").write_text("0" * 64)
"""

TAMPERS = (
    Tamper(
        "patches-torch-allclose",
        {"softmax": "softmax__not_normalised"},
        # earns no more than deserved since the checks of every documented edge (benchmarks/tampering.py):
        # the cells that the not-normalised softmax fails also compare its values with the engine's arithmetic
        (("setup", "torch.allclose = lambda *args, **kwargs: True"),),
    ),
    Tamper(
        "patches-assert-close",
        {"softmax": "softmax__not_normalised"},
        (("setup", "torch.testing.assert_close = lambda *args, **kwargs: None"),),
    ),
    Tamper(
        "patches-torch-equal",
        {"softmax": "softmax__in_place_shift"},
        (("setup", "torch.equal = lambda *args, **kwargs: True"),),
        fools_together=True,
    ),
    Tamper(
        "patches-tensor-eq",
        {"softmax": "softmax__returns_log_probabilities"},
        (("setup", "torch.Tensor.__eq__ = lambda self, other: torch.ones(self.shape, dtype=torch.bool)"),),
    ),
    Tamper(
        "replaces-the-checks",
        {},  # the blank functions
        (
            (
                "setup",
                "class Nothing:\n    def __call__(self, *args, **kwargs):\n        return None\n\n"
                "    def hidden(self, *args, **kwargs):\n        return None\n\n\n"
                "for name, value in list(vars(checks).items()):\n    if hasattr(value, 'hidden'):\n"
                "        setattr(checks, name, Nothing())",
            ),
        ),
        fools_together=True,
    ),
    Tamper(
        "replaces-the-engine",
        {},
        (
            (
                "setup",
                "from attention_course.checks import engine\n\n"
                "engine.Check.verdict = lambda *args, **kwargs: None",
            ),
        ),
        fools_together=True,
    ),
    Tamper(
        "replaces-assertion-error",
        {},
        (("top", "import builtins\n\nbuiltins.AssertionError = type('AssertionError', (Exception,), {})"),),
    ),
    Tamper(
        "replaces-setprofile",
        {"softmax": "softmax__torch_softmax"},
        (("top", "import sys\n\nsys.setprofile = lambda function: None"),),
    ),
    Tamper(
        "switches-off-the-profiler",
        {
            "softmax": "def softmax(x, dim=-1):\n    import sys\n\n    sys.setprofile(None)\n"
            "    return torch.softmax(x, dim)"
        },
        (),
    ),
    Tamper(
        "hides-its-errors",
        {},
        (
            (
                "setup",
                "def forget(result):\n    result.error_in_exec = None\n\n\n"
                "get_ipython().showtraceback = lambda *args, **kwargs: None\n"
                "get_ipython().events.register('post_run_cell', forget)",
            ),
        ),
        fools_together=True,  # no error output, and the kernel replies "ok"
    ),
    Tamper("forges-recordings", {}, (("end", FORGER),)),
    Tamper(
        "imports-the-solutions",
        {
            "softmax": "from solutions.attention import softmax",
            "scaled_dot_product_attention": "from solutions.attention import scaled_dot_product_attention",
            "dot_product_variance": "from solutions.attention import dot_product_variance",
        },
        (),
    ),
    Tamper(
        "execs-the-library-source",
        {
            "softmax": f"import inspect\n\n{ANSWERS}\n\nexec(inspect.getsource(answers.softmax))",
            "scaled_dot_product_attention": f"import inspect\n\n{ANSWERS}\n\n"
            "exec(inspect.getsource(answers.scaled_dot_product_attention))",
        },
        (),
    ),
)


def sources(tamper: Tamper, variants: dict[str, str]) -> dict[str, str]:
    """The solution cells' sources of ``tamper``: bank ``variants`` by name, or sources of its own."""
    return {name: variants.get(source, source) for name, source in tamper.functions.items()}


def notebook(
    tamper: Tamper, release: nbformat.NotebookNode, variants: dict[str, str]
) -> nbformat.NotebookNode:
    """The ``release`` with the tamper's functions, and its cells added where it says."""
    from tests.notebook_tools import fill_solutions

    submission = fill_solutions(release, sources(tamper, variants))
    grade_ids = [cell.metadata.get("nbgrader", {}).get("grade_id") for cell in submission.cells]
    setup = grade_ids.index("setup")
    for position, source in tamper.cells:
        index = {"top": 0, "setup": setup + 1, "end": len(submission.cells)}[position]
        submission.cells.insert(index, nbformat.v4.new_code_cell(source))
        setup += index <= setup
    return submission
