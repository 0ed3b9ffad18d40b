"""Figures people read: the oracle study's bars and a run's training curves."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import numpy as np

from cosearch_cli.curves import curves_figure
from cosearch_cli.evaluate import DATASETS
from cosearch_cli.plots import oracle_axes

NAMES = list(DATASETS) + ["single-hop", "multi-hop", "average"]


def _overlaps(a, b, gap: float = 2.0) -> bool:
    """Boxes closer than `gap` pixels (touching labels read as one number)."""
    return a.x0 < b.x1 + gap and b.x0 < a.x1 + gap and a.y0 < b.y1 + gap and b.y0 < a.y1 + gap


def test_oracle_figure_value_labels_do_not_overlap_each_other_or_the_legend():
    # Three halves (none, llm, oracle) of nearly equal F1, as a small model gives: labels side by side.
    rows = {half: [{"dataset": name, "f1": 0.23} for name in NAMES] for half in ("none", "llm", "oracle")}
    ax = oracle_axes(rows, "F1")
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    labels = [text.get_window_extent(renderer) for text in ax.texts]
    assert len(labels) == 3 * len(NAMES)
    clashes = [(i, j) for (i, a), (j, b) in itertools.combinations(enumerate(labels), 2) if _overlaps(a, b)]
    # (before: horizontal labels "0.23" side by side with under 2 px between them)
    assert not clashes, f"{len(clashes)} value labels overlap"
    legend = ax.get_legend().get_window_extent(renderer)
    assert not any(_overlaps(legend, label) for label in labels)
    assert all(label.y1 <= ax.get_window_extent(renderer).y1 for label in labels)  # inside the axes
    plt.close(fig)


def test_training_curves_have_whole_iterations_and_init_for_the_evaluation_before_training():
    rows = [{"iteration": -1, "dev_f1": 0.16}, {"iteration": 0, "train_reward": 0.1, "search_turns": 1.0},
            {"iteration": 1, "train_reward": 0.2, "search_turns": 0.5},
            {"iteration": 2, "train_reward": 0.3, "search_turns": 0.4, "dev_f1": 0.04}]
    fig = curves_figure({"demo": rows})
    fig.canvas.draw()
    for ax in fig.axes:
        shown = [t.get_text() for t, x in zip(ax.get_xticklabels(), ax.get_xticks())
                 if ax.get_xlim()[0] <= x <= ax.get_xlim()[1]]
        assert all(label == "init" or label.lstrip("-").isdigit() for label in shown), shown
        assert "-1" not in shown and "0.5" not in shown
    dev = fig.axes[3]
    assert "init" in [t.get_text() for t in dev.get_xticklabels()]
    plt.close(fig)


def test_a_greedy_baseline_run_draws_the_greedy_reward_beside_the_training_reward():
    rows = [{"iteration": 0, "train_reward": 0.1, "train_greedy_reward": 0.2},
            {"iteration": 1, "train_reward": 0.3, "train_greedy_reward": 0.25}]
    fig = curves_figure({"s12": rows})
    reward = fig.axes[0]
    lines = {line.get_label(): line for line in reward.get_lines()}
    assert list(lines["s12: greedy"].get_ydata()) == [0.2, 0.25]
    assert lines["s12: greedy"].get_linestyle() == "--" and lines["s12"].get_color() == lines["s12: greedy"].get_color()
    assert reward.get_legend() is not None
    assert len(curves_figure({"demo": [{"iteration": 0, "train_reward": 0.1}]}).axes[0].get_lines()) == 1
    plt.close("all")


def test_curves_draw_each_points_ci_and_the_given_models_before_the_warm_up():
    rows = [{"iteration": -2, "dev_f1": 0.08, "dev_f1_ci_low": 0.02, "dev_f1_ci_high": 0.15},
            {"iteration": -1, "dev_f1": 0.31, "dev_f1_ci_low": 0.20, "dev_f1_ci_high": 0.43},
            {"iteration": 0, "train_reward": 0.12, "train_reward_ci_low": 0.05, "train_reward_ci_high": 0.2},
            {"iteration": 1, "train_reward": 0.07, "dev_f1": 0.29, "dev_f1_ci_low": 0.18, "dev_f1_ci_high": 0.40}]
    fig = curves_figure({"demo": rows}, title="demo")
    fig.canvas.draw()
    reward, hits, _, dev = fig.axes
    assert [t.get_text() for t in dev.get_xticklabels() if t.get_text() in ("given", "init")] == ["given", "init"]
    (bars,) = dev.collections  # one vertical segment per point with a CI, from low to high
    assert np.allclose([segment[:, 1] for segment in bars.get_segments()], [[0.02, 0.15], [0.20, 0.43], [0.18, 0.40]])
    (bars,) = reward.collections  # iteration 1 has no CI: one bar only
    assert np.allclose([segment[:, 1] for segment in bars.get_segments()], [[0.05, 0.2]])
    assert not hits.collections
    assert "95% bootstrap CI" in fig._suptitle.get_text()
    plt.close(fig)
    # Without CI columns (runs made before they were kept) the figure has no bars and says nothing of them.
    fig = curves_figure({"old": [{"iteration": 0, "train_reward": 0.1}]})
    assert not fig.axes[0].collections and fig._suptitle is None
    plt.close(fig)


def test_the_demos_held_out_ranker_panel_shows_each_ranker_with_its_ci_beside_the_retriever():
    rows = [{"iteration": -2, "dev_f1": 0.08, "heldout_ranker_hit1": 0.36, "heldout_ranker_hit1_ci_low": 0.18,
             "heldout_ranker_hit1_ci_high": 0.56, "heldout_retriever_hit1": 0.49},
            {"iteration": -1, "dev_f1": 0.31, "heldout_ranker_hit1": 0.49, "heldout_ranker_hit1_ci_low": 0.31,
             "heldout_ranker_hit1_ci_high": 0.67, "heldout_retriever_hit1": 0.49},
            {"iteration": 0, "train_reward": 0.12},
            {"iteration": 1, "train_reward": 0.07, "dev_f1": 0.29, "heldout_ranker_hit1": 0.49,
             "heldout_ranker_hit1_ci_low": 0.31, "heldout_ranker_hit1_ci_high": 0.67, "heldout_retriever_hit1": 0.49}]
    fig = curves_figure({"demo": rows})
    fig.canvas.draw()
    assert len(fig.axes) == 5
    panel = fig.axes[4]
    assert panel.get_title() == "held-out ranker Hit@1 (same calls)"
    lines = {line.get_label(): line for line in panel.get_lines()}
    assert list(lines["demo"].get_xdata()) == [-2, -1, 1] and list(lines["demo"].get_ydata()) == [0.36, 0.49, 0.49]
    retriever = lines["demo: retriever order"]
    assert list(retriever.get_ydata()) == [0.49] * 3 and retriever.get_linestyle() == "--"
    (bars,) = panel.collections
    assert np.allclose([segment[:, 1] for segment in bars.get_segments()], [[0.18, 0.56], [0.31, 0.67], [0.31, 0.67]])
    assert panel.get_legend() is not None and fig.axes[0].get_legend() is None  # one run: no legend elsewhere
    assert [t.get_text() for t in panel.get_xticklabels() if t.get_text() in ("given", "init")] == ["given", "init"]
    plt.close(fig)
    # A `cosearch train` run has no such points: the four panels only.
    fig = curves_figure({"run": rows[2:3]})
    assert len(fig.axes) == 4
    plt.close(fig)
