"""Figures that several chapters draw: attention weights as a heat map."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch


def heatmap(
    weights: torch.Tensor,
    ax: plt.Axes | None = None,
    *,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    x_title: str = "key",
    y_title: str = "query",
    title: str | None = None,
    annotate: bool = False,
    vmax: float | None = None,
) -> plt.Axes:
    """Draw a ``[q_len, k_len]`` matrix of attention weights, queries as rows and keys as columns.

    Args:
        weights: ``[q_len, k_len]``, any real dtype and device (it is copied to the CPU as float64).
        ax: the axes to draw on; a new figure when ``None``.
        x_labels, y_labels: tick labels for the keys and the queries (for example tokens).
        x_title, y_title, title: axis titles and the plot title.
        annotate: write each weight in its cell (for small matrices).
        vmax: top of the colour scale; the largest weight when ``None`` (weights start at 0).

    Returns:
        The axes.

    Raises:
        ValueError: if ``weights`` is not two-dimensional.
    """
    if weights.dim() != 2:
        raise ValueError(
            "weights must be [q_len, k_len], got shape "
            f"{list(weights.shape)}"
        )
    values = weights.detach().to("cpu", torch.float64).numpy()
    if ax is None:
        _, ax = plt.subplots(
            figsize=(
                0.45 * values.shape[1] + 2.5,
                0.45 * values.shape[0] + 1.5,
            )
        )
    image = ax.imshow(
        values, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto"
    )
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if x_labels is not None:
        ax.set_xticks(
            range(len(x_labels)), x_labels, rotation=45, ha="right"
        )
    if y_labels is not None:
        ax.set_yticks(range(len(y_labels)), y_labels)
    ax.set_xlabel(x_title)
    ax.set_ylabel(y_title)
    if title:
        ax.set_title(title)
    if annotate:
        top = values.max() if vmax is None else vmax
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                colour = "black" if values[i, j] > 0.6 * top else "white"
                ax.text(
                    j,
                    i,
                    f"{values[i, j]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color=colour,
                )
    return ax
