"""Training curves of a run (training reward, ranker Hit@K, search turns, dev F1; the demo adds its rankers' held-out
Hit@1) as one PNG."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from cosearch_cli.artifacts import temporary_path

PANELS = (
    ("train_reward", "training reward (agent)"),
    ("ranker_hit_at_k", "ranker Hit@K of observations"),
    ("search_turns", "search turns per trajectory"),
    ("dev_f1", "dev F1 (greedy)"),
)
# Panels drawn only when a run has their metric: the demo's Hit@1 of each ranker (given, starting, trained) on
# the same held-out calls (demo.write_heldout_ranker).
OPTIONAL = (("heldout_ranker_hit1", "held-out ranker Hit@1 (same calls)"),)


# Drawn dashed beside a panel's metric when a run has it, with the label's suffix: with agent_baseline =
# "greedy", the mean reward of the greedy trajectories the samples' advantages are measured from; beside the
# held-out rankers, the retriever's own order on the same calls.
BESIDE = {"train_reward": ("train_greedy_reward", "greedy"), "heldout_ranker_hit1": ("heldout_retriever_hit1",
                                                                                     "retriever order")}


# x positions of the evaluations before RL: the given models (before a warm-up) and the models RL starts from.
BEFORE = {-2: "given", -1: "init"}


def training_curves(rows: Sequence[dict], path: str | Path, *, title: str = "") -> Path:
    """Draw each metric of one run against the iteration (-1 = before training, -2 = before the warm-up)."""
    return compare_curves({title or "run": rows}, path, title=title)


def compare_curves(runs: dict[str, Sequence[dict]], path: str | Path, *, title: str = "") -> Path:
    """Several runs' curves on shared axes (the preset comparison); missing values are skipped."""
    import matplotlib.pyplot as plt

    fig = curves_figure(runs, title=title)
    path = Path(path)
    tmp = temporary_path(path, ".png")
    try:
        fig.savefig(tmp, dpi=100)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path


def curves_figure(runs: dict[str, Sequence[dict]], *, title: str = ""):
    """The figure of compare_curves: whole-number iteration ticks, the evaluation before training at "init" (and
    before a warm-up at "given"); a metric with `<key>_ci_low/high` gets its 95% CI as a bar at each point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    panels = PANELS + tuple(p for p in OPTIONAL if any(r.get(p[0]) is not None for rows in runs.values() for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2))
    ci_drawn = False
    companions = set()
    for ax, (key, label) in zip(axes, panels):
        beside, suffix = BESIDE.get(key, (None, None))
        for name, rows in runs.items():
            points = [(r["iteration"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                xs, ys = zip(*sorted(points))
                (line,) = ax.plot(xs, ys, marker="o", label=name)
                bars = sorted((r["iteration"], r[key], r[f"{key}_ci_low"], r[f"{key}_ci_high"]) for r in rows
                              if r.get(key) is not None and r.get(f"{key}_ci_low") is not None)
                if bars:
                    bx, by, low, high = zip(*bars)
                    ax.errorbar(bx, by, yerr=[[y - lo for y, lo in zip(by, low)], [hi - y for y, hi in zip(by, high)]],
                                fmt="none", ecolor=line.get_color(), alpha=0.5, capsize=3)
                    ci_drawn = True
                companion = [(r["iteration"], r[beside]) for r in rows if beside and r.get(beside) is not None]
                if companion:  # e.g. the greedy trajectories' reward, dashed in the same colour
                    xs, ys = zip(*sorted(companion))
                    ax.plot(xs, ys, linestyle="--", marker=".", color=line.get_color(), label=f"{name}: {suffix}")
                    companions.add(ax)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: BEFORE.get(round(x), f"{x:.0f}")))
        ax.grid(alpha=0.3)
    for ax in axes:  # the runs' names on the first panel; a panel with a dashed companion line says what it is
        if len(runs) > 1 and ax is axes[0] or ax in companions:
            ax.legend(fontsize=8)
    if title or ci_drawn:
        fig.suptitle(title + ("  (bars: 95% bootstrap CI over questions)" if ci_drawn else ""))
    fig.tight_layout()
    return fig
