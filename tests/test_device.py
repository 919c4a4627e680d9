"""The device and reproducibility helpers that chapters and checks call at their edge."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from attention_course.device import make_reproducible


@pytest.fixture
def restored():
    """Put torch's process-wide settings back after the test, for the tests that run after it."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_make_reproducible_fixes_the_threads_and_the_algorithms(restored, threads):
    torch.set_num_threads(4)
    torch.use_deterministic_algorithms(False)
    make_reproducible(threads)
    assert torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.benchmark


def test_make_reproducible_refuses_no_threads(restored):
    with pytest.raises(ValueError, match="at least 1"):
        make_reproducible(0)


def test_a_model_trained_after_make_reproducible_ignores_the_environments_threads():
    """The same seeded training gives the same weights to the last bit with ``OMP_NUM_THREADS`` 1 and 2.

    Each run is a fresh process, as a chapter's kernel is. Without ``make_reproducible`` the two differ
    (torch 2.13, CPU: the embedding's backward adds its rows in an order that depends on the threads).
    """
    script = (
        "import torch\n"
        "from attention_course.device import make_reproducible\n"
        "make_reproducible()\n"
        "torch.manual_seed(0)\n"
        "layers = torch.nn.Embedding(64, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 64)\n"
        "model = torch.nn.Sequential(*layers)\n"
        "optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)\n"
        "data = torch.Generator().manual_seed(1)\n"
        "for _ in range(10):\n"
        "    tokens = torch.randint(64, (64, 64), generator=data)\n"
        "    logits = model(tokens).flatten(0, 1)\n"
        "    loss = torch.nn.functional.cross_entropy(logits, tokens.roll(1, 1).flatten())\n"
        "    optimiser.zero_grad(); loss.backward(); optimiser.step()\n"
        "print(torch.get_num_threads(), sum(p.double().sum().item() for p in model.parameters()).hex())\n"
    )

    def trained(threads: str) -> str:
        environment = {"OMP_NUM_THREADS": threads, "PATH": "/usr/bin:/bin"}
        done = subprocess.run(
            [sys.executable, "-c", script], env=environment, capture_output=True, text=True, check=True
        )
        return done.stdout

    one, two = trained("1"), trained("2")
    assert one == two and one.startswith("1 ")
