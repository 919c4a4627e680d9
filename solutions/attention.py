"""Reference solutions of exercise ex02 (scaled dot-product attention).

``softmax`` and ``scaled_dot_product_attention`` are the library's (chapter 3 and later build on them);
``dot_product_variance`` exists only as an exercise.
"""

from __future__ import annotations

import math

import torch

from attention_course.attention import scaled_dot_product_attention, softmax

__all__ = [
    "dot_product_variance",
    "scaled_dot_product_attention",
    "softmax",
]


def dot_product_variance(
    d_k: int,
    n_samples: int,
    scaled: bool = False,
    generator: torch.Generator | None = None,
) -> float:
    """Monte-Carlo estimate of ``Var(q . k)``, or of ``Var(q . k / sqrt(d_k))`` when ``scaled``.

    ``q`` and ``k`` are independent draws from ``N(0, I_{d_k})``. Theory: ``E[q . k] = 0`` and
    ``Var(q . k) = d_k``, so the scaled product has variance 1. The estimate has a relative standard
    error of about ``sqrt((2 + 6 / d_k) / n_samples)``.

    Args:
        d_k: dimension of the query and key vectors, at least 1.
        n_samples: number of independent ``(q, k)`` pairs, at least 2.
        scaled: divide each dot product by ``sqrt(d_k)`` before taking the variance.
        generator: the source of randomness (samples are drawn on its device); ``None`` uses torch's
            global generator on the CPU.

    Returns:
        The sample variance, a Python ``float``.

    Raises:
        ValueError: if ``d_k < 1`` or ``n_samples < 2``.

    Source: Vaswani et al. 2017, footnote 4.
    """
    if d_k < 1 or n_samples < 2:
        raise ValueError(
            f"need d_k >= 1 and n_samples >= 2, got d_k={d_k}, n_samples={n_samples}"
        )
    device = generator.device if generator is not None else None
    query = torch.randn(
        n_samples,
        d_k,
        generator=generator,
        device=device,
        dtype=torch.float64,
    )
    key = torch.randn(
        n_samples,
        d_k,
        generator=generator,
        device=device,
        dtype=torch.float64,
    )
    dots = (query * key).sum(
        dim=-1
    )  # [n_samples]: one dot product per pair
    if scaled:
        dots = dots / math.sqrt(d_k)
    return dots.var().item()
