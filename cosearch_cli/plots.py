"""Figures for evaluation, comparisons and the oracle study (matplotlib, Agg backend: no screen needed).

Each function takes plain rows, draws one figure and returns PNG bytes; the caller decides where they go.
The metric variant is printed on every figure, so a figure is never read without it.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen before pyplot loads)

_SHORT = {"nq": "NQ", "triviaqa": "TQA", "popqa": "PopQA", "hotpotqa": "HotpotQA", "2wikimultihopqa": "2Wiki",
          "musique": "MuSiQue", "bamboogle": "Bamboogle", "single-hop": "single", "multi-hop": "multi",
          "average": "avg"}


def _label(name: str) -> str:
    return _SHORT.get(name, name)


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    # No timestamp in the file, so the same numbers give the same bytes.
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def _bars(ax, names: Sequence[str], series: dict[str, Sequence[float | None]], ylabel: str) -> None:
    width = 0.8 / max(len(series), 1)
    # With more than two bars per group a horizontal value label is wider than its bar and runs into the
    # next one's: stand the labels upright, above the bar.
    upright = len(series) > 2
    for i, (label, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(names))]
        heights = [v if v is not None else 0.0 for v in values]
        bars = ax.bar(xs, heights, width, label=label)
        for bar, v in zip(bars, values):
            if v is not None:
                ax.annotate(f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                            va="bottom", fontsize=7, rotation=90 if upright else 0, xytext=(0, 2),
                            textcoords="offset points")
    if upright:
        ax.set_ylim(top=max([v for values in series.values() for v in values if v is not None], default=0) * 1.25
                    or 1.0)
    ax.set_xticks(range(len(names)), [_label(n) for n in names], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1:  # outside the axes, where no bar or value label can be under it
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def f1_figure(rows: Sequence[dict], variant_name: str, *, title: str = "Answer F1 per dataset") -> bytes:
    """Bars of F1 for each dataset and the single/multi/average groups of one run."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    _bars(ax, [r["dataset"] for r in rows], {"F1": [r["f1"] for r in rows]}, "token F1")
    ax.set_title(f"{title}\n{variant_name}", fontsize=9)
    return _png(fig)


def comparison_figure(differences: Sequence[dict], labels: tuple[str, str], variant_name: str,
                      confidence: float) -> bytes:
    """Left: F1 of both runs per dataset. Right: B - A with its paired-bootstrap interval."""
    names = [d["dataset"] for d in differences]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 3.8))
    _bars(left, names, {labels[0]: [d["f1_a"] for d in differences],
                        labels[1]: [d["f1_b"] for d in differences]}, "token F1")
    left.set_title("F1 per dataset", fontsize=9)
    diffs = [d["f1_diff"] for d in differences]
    errors = [[d["f1_diff"] - d["f1_ci_low"] for d in differences], [d["f1_ci_high"] - d["f1_diff"] for d in differences]]
    right.errorbar(range(len(names)), diffs, yerr=errors, fmt="o", capsize=4)
    right.axhline(0.0, color="grey", lw=0.8)
    right.set_xticks(range(len(names)), [_label(n) for n in names], fontsize=8)
    right.set_ylabel(f"F1 {labels[1]} - {labels[0]}")
    right.set_title(f"paired difference, {confidence:.0%} bootstrap CI", fontsize=9)
    right.grid(axis="y", alpha=0.3)
    fig.suptitle(variant_name, fontsize=9)
    return _png(fig)


def oracle_figure(rows_by_half: dict[str, Sequence[dict]], variant_name: str) -> bytes:
    """F1 per dataset and group for each half of the oracle study (standard rankers and the oracle)."""
    return _png(oracle_axes(rows_by_half, variant_name).figure)


def oracle_axes(rows_by_half: dict[str, Sequence[dict]], variant_name: str):
    """The oracle figure's axes (before rendering, so tests can check where its labels landed)."""
    names = [r["dataset"] for r in next(iter(rows_by_half.values()))]
    series = {}
    for half, rows in rows_by_half.items():
        by_name = {r["dataset"]: r["f1"] for r in rows}
        series[half] = [by_name.get(n) for n in names]
    fig, ax = plt.subplots(figsize=(max(11.0, 0.5 * len(names) * len(series)), 3.8))
    _bars(ax, names, series, "token F1")
    ax.set_title(f"Oracle retrieval study: F1 with each ranker vs the oracle\n{variant_name}", fontsize=9)
    return ax
