"""The demo: the whole CoSearch loop on the embedded default, then the oracle study, in one call."""

from __future__ import annotations

import time

from cosearch_cli import oracle

# The demo's measured wall time, stated once: `cosearch demo --help`, the demo's first line and the README all
# show this string (tests/test_docs.py checks the README). Re-measure with `/usr/bin/time -v .venv/bin/cosearch
# demo` from a clean clone and change it here and in the README together.
DEMO_TIME = "4 min 02 s from a clean clone on a 2-core x86-64 CPU without GPU, peak RSS 5.0 GB (2026-12-03, load not recorded)"
from cosearch_cli.train import (Runner, TrainConfig, current_models, eval_questions, read_questions,
                                read_records)


def run_demo(config: TrainConfig, runner: Runner) -> dict:
    """Train (with evaluations before and after), then compare the trained ranker with the oracle ranker."""
    root = runner.run()
    dev = eval_questions(read_questions(config.dev_questions), config.eval_limit)
    models = current_models(runner.paths, config, config.iterations)
    folder = oracle.StudyFolder(root / "oracle")

    def rollouts(half: str, questions):
        return runner.rollouts_with(half, questions, models)

    halves = oracle.study_halves([config.ranker])
    final_eval = runner.paths.iteration(config.iterations - 1) / "eval" / "rollouts.jsonl"
    if final_eval.is_file() and not folder.final(config.ranker).is_file():
        # The last evaluation ran exactly this half (trained models, greedy, same seed): reuse it.
        folder.finish(config.ranker, read_records(final_eval), runner.manifest("oracle", half=config.ranker,
                                                                              models=models))
    runner.log(f"oracle study on {len(dev)} dev questions: {config.ranker} ranker vs oracle")
    records = oracle.run_study(dev, halves, folder, rollouts,
                               manifests=lambda half: runner.manifest("oracle", half=half, models=models),
                               clock=time.perf_counter)
    study = oracle.summarize(records)
    (root / "oracle" / "report.md").write_text(oracle.table1_markdown(study.table))

    init = _dev_f1(root / "eval-init" / "metrics.json")
    final = _dev_f1(runner.paths.iteration(config.iterations - 1) / "metrics.json")
    standard = next(r for r in study.table if r["ranker"] == config.ranker)
    oracle_row = next(r for r in study.table if r["ranker"] == oracle.ORACLE)
    lines = [
        f"dev F1 (average over datasets, greedy): untrained {_fmt(init)} -> trained {_fmt(final)}",
        f"oracle study: {config.ranker} ranker {_fmt(standard['average'])} vs oracle {_fmt(oracle_row['average'])} "
        f"(relative gap {_fmt(standard['gap average'], pct=True)}; paper 7B +14.7%, 3B +26.8%)",
        _updates_line(root, config),
        f"artifacts: {root}/ (metrics.parquet, curves.png, iter-*/, eval-init/, oracle/report.md)",
    ]
    return {"run": str(root), "dev_f1_init": init, "dev_f1_trained": final,
            "oracle_table": study.table, "lines": lines}


def _updates_line(root, config: TrainConfig) -> str:
    """Which models the run updated, in which iterations, with how many kept groups (most groups of a small
    model have all-equal rewards and train nothing)."""
    import orjson

    rows = [orjson.loads(p.read_bytes()) for p in sorted(root.glob("iter-*/metrics.json"))]
    parts = []
    for role, trained in (("agent", config.train_agent), ("ranker", config.train_ranker)):
        if not trained:
            parts.append(f"{role} frozen")
            continue
        steps = [f"iteration {r['iteration']}: {r.get(f'{role}_groups_kept', 0)} groups" for r in rows
                 if r.get(f"{role}_skipped") is False]
        detail = f" ({'; '.join(steps)})" if steps else " (no kept group with unequal rewards)"
        parts.append(f"{role} updated in {len(steps)} of {len(rows)} iterations{detail}")
    return "updates: " + ", ".join(parts)


def _dev_f1(path) -> float | None:
    import orjson

    return orjson.loads(path.read_bytes()).get("dev_f1") if path.is_file() else None


def _fmt(value: float | None, pct: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.1%}" if pct else f"{value:.3f}"
