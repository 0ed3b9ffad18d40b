"""The demo: the whole CoSearch loop on the embedded default, then the oracle study, in one call."""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict
from pathlib import Path

import orjson

from cosearch_cli import oracle
from cosearch_cli.artifacts import write_json_atomic
from cosearch_cli.ranker_quality import quality
from cosearch_cli.train import (Runner, TrainConfig, current_models, eval_questions, given_models, read_questions,
                                read_records)

# The demo's measured wall time, stated once: `cosearch demo --help`, the demo's first line and the README all
# show this string (tests/test_docs.py checks the README). Re-measure with `/usr/bin/time -v .venv/bin/cosearch
# demo` from a clean clone and change it here and in the README together.
DEMO_TIME = ("10.4 to 19.0 min (11.3 to 20.8 min with the install) from a clean clone on a 2-core x86-64 CPU "
             "without GPU, nothing else running (load 0.05-1.2 before), peak RSS 8.5 GB (2026-12-03 to 2026-12-07)")


def run_demo(config: TrainConfig, runner: Runner) -> dict:
    """Train (with evaluations before and after), then compare the trained ranker with the oracle ranker."""
    root = runner.run()
    dev = eval_questions(read_questions(config.dev_questions), config.eval_limit)
    models = current_models(runner.paths, config, config.iterations)
    folder = _oracle_folder(root / "oracle", models, runner.log)

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

    standard = next(r for r in study.table if r["ranker"] == config.ranker)
    oracle_row = next(r for r in study.table if r["ranker"] == oracle.ORACLE)
    learning = learning_summary(config, runner)
    lines = learning.pop("lines") + [
        f"oracle study: {config.ranker} ranker {_fmt(standard['average'])} vs oracle {_fmt(oracle_row['average'])} "
        f"(relative gap {_fmt(standard['gap average'], pct=True)}; paper 7B +14.7%, 3B +26.8%)",
        f"artifacts: {root}/ (metrics.parquet, curves.png, iter-*/, eval-init/, learning.json, ranker-heldout.json, "
        "oracle/report.md)",
    ]
    return {"run": str(root), **learning, "oracle_table": study.table, "lines": lines}


def _oracle_folder(path: Path, models, log) -> oracle.StudyFolder:
    """The study folder of these models. A folder made with other models (the run was continued to more
    iterations since) is deleted, so its halves are redone rather than reported for the new models."""
    made_with = _oracle_models(path)
    if made_with is not None and made_with != asdict(models):
        log(f"the oracle study in {path} was made with {made_with['agent']}; redoing it with {models.agent}")
        shutil.rmtree(path)
    folder = oracle.StudyFolder(path)
    write_json_atomic(path / "models.json", asdict(models))
    return folder


def _oracle_models(path: Path) -> dict | None:
    """The models an oracle folder's halves were made with: models.json, or in folders made before it was
    written, a finished half's manifest; None when nothing says (no folder, or only partial halves)."""
    if (path / "models.json").is_file():
        return orjson.loads((path / "models.json").read_bytes())
    manifests = sorted(path.glob("*.manifest.json"))
    return orjson.loads(manifests[0].read_bytes())["options"]["models"] if manifests else None


def learning_summary(config: TrainConfig, runner: Runner) -> dict:
    """What training changed, on held-out dev questions, with paired bootstrap 95% CIs (cosearch_cli/gains.py):
    agent F1 of the given models, of the models RL started from (after the warm-up, if any) and of the trained
    ones; the ranker's Hit@1 on the fixed ranker calls of the RL start's evaluation, re-ranked by the given,
    the starting and the trained ranker, against the retriever's own order; and what each update did."""
    from cosearch_cli.gains import compare_runs
    from cosearch_cli.ranker_quality import fixed_calls, recorded_scores, rerank

    paths = runner.paths
    final = read_records(paths.iteration(config.iterations - 1) / "eval" / "rollouts.jsonl")
    start = read_records(paths.root / "eval-init" / "rollouts.jsonl")
    base_path = paths.root / "eval-base" / "rollouts.jsonl"
    base = read_records(base_path) if base_path.is_file() else start
    rows = [orjson.loads((paths.iteration(i) / "metrics.json").read_bytes()) for i in range(config.iterations)]

    calls = ranker_before = ranker_start = ranker_after = None
    if config.ranker == "llm" and any(c.candidate_ids for r in start for c in r.ranker_calls):
        runner.log("ranker quality on the held-out ranker calls: given, starting and trained ranker")
        calls = fixed_calls(start)
        constrained = "ranker" in runner.constraint_roles()
        docs = runner.index.docs
        given, begin, trained = (given_models(config).ranker, current_models(paths, config, 0).ranker,
                                 current_models(paths, config, config.iterations).ranker)
        ranker_start = recorded_scores(calls)  # eval-init ran the starting ranker greedily on exactly these calls
        ranker_before = ranker_start if given == begin else rerank(calls, runner.backend(given), docs,
                                                                   constrained=constrained)
        ranker_after = ranker_start if trained == begin else rerank(calls, runner.backend(trained), docs,
                                                                    constrained=constrained)
    overall = compare_runs(base, final, calls=calls, ranker_before=ranker_before, ranker_after=ranker_after)
    if calls is not None:
        points = ([(-2, ranker_before)] if base_path.is_file() else []) + [(-1, ranker_start),
                                                                            (config.iterations - 1, ranker_after)]
        write_heldout_ranker(paths.heldout_ranker, calls, points)
        runner.write_metrics_log()  # metrics.parquet and curves.png gain the held-out ranker's points
    rl = compare_runs(start, final)
    updated = {role: sum(1 for r in rows if r.get(f"{role}_skipped") is False) for role in ("agent", "ranker")}
    figures = {
        "questions": overall["questions"],
        "dev_f1_init": overall["agent_f1_before"], "dev_f1_start": rl["agent_f1_before"],
        "dev_f1_trained": overall["agent_f1_after"],
        "dev_f1_gain_ci": overall["agent_f1_gain_ci"], "dev_f1_rl_gain": rl["agent_f1_gain"],
        "dev_f1_rl_gain_ci": rl["agent_f1_gain_ci"],
        "ranker_hit1_init": overall["ranker_hit1_before"], "ranker_hit1_trained": overall["ranker_hit1_after"],
        "ranker_hit1_gain_ci": overall["ranker_hit1_gain_ci"],
        "ranker_hit1_start": quality(ranker_start)["hit1"] if ranker_start else None,
        "retriever_hit1": overall["retriever_hit1"], "ranker_vs_retriever_ci": overall["ranker_vs_retriever_ci"],
        "ranker_calls": (overall.get("ranker_counts") or {}).get("calls_with_answer"),
        "agent_updates": updated["agent"], "ranker_updates": updated["ranker"],
        "agent_groups_kept": sum(r.get("agent_groups_kept") or 0 for r in rows),
        "ranker_groups_kept": sum(r.get("ranker_groups_kept") or 0 for r in rows),
        "kl_agent": _mean_of(rows, "agent_kl_batch"), "kl_ranker": _mean_of(rows, "ranker_kl_batch"),
        "kl_agent_heldout": _mean_of(rows, "agent_kl_heldout"),
        "kl_ranker_heldout": _mean_of(rows, "ranker_kl_heldout"),
        "train_reward": [r.get("train_reward") for r in rows],
        "train_reward_ci": [[r.get("train_reward_ci_low"), r.get("train_reward_ci_high")] for r in rows],
    }
    write_json_atomic(paths.root / "learning.json", {**figures, "overall": overall, "rl": rl})
    warm = paths.warmup.is_dir()
    n = figures["questions"]
    lines = [
        f"held-out dev F1 ({n} questions, greedy; a small sample): given models {_fmt(figures['dev_f1_init'])}"
        + (f" -> after the warm-up {_fmt(figures['dev_f1_start'])}" if warm else "")
        + f" -> trained {_fmt(figures['dev_f1_trained'])}; trained - given {_gain(overall['agent_f1_gain'], figures['dev_f1_gain_ci'])}"
        + (f", RL alone {_gain(figures['dev_f1_rl_gain'], figures['dev_f1_rl_gain_ci'])}" if warm else ""),
    ]
    if calls is not None:
        lines.append(
            f"ranker Hit@1 on {figures['ranker_calls']} held-out ranker calls with an answer-bearing candidate: given "
            f"{_fmt(figures['ranker_hit1_init'])}" + (f" -> warm-up {_fmt(figures['ranker_hit1_start'])}" if warm else "")
            + f" -> trained {_fmt(figures['ranker_hit1_trained'])} ({_gain(overall['ranker_hit1_gain'], figures['ranker_hit1_gain_ci'])}); "
            f"retriever order {_fmt(figures['retriever_hit1'])} (trained - retriever "
            f"{_gain(overall['ranker_vs_retriever'], figures['ranker_vs_retriever_ci'])})")
    lines.append(_updates_line(paths.root, config))
    lines.append(
        f"mean KL(new||old) of an update on its own batch: agent {_sci(figures['kl_agent'])}, ranker "
        f"{_sci(figures['kl_ranker'])}; on held-out dev sequences: agent {_sci(figures['kl_agent_heldout'])}, "
        f"ranker {_sci(figures['kl_ranker_heldout'])}")
    lines.append("training reward per iteration (95% CI over its questions, which differ each iteration): " + ", ".join(
        _fmt(r) + (f" [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci[0] is not None else "")
        for r, ci in zip(figures["train_reward"], figures["train_reward_ci"])))
    return {**figures, "lines": lines}


def write_heldout_ranker(path, calls, points) -> None:
    """`<run>/ranker-heldout.json` (RunPaths.heldout_ranker): the Hit@1 of each ranker the run had (given,
    starting, trained; `points` are (its row's iteration in metrics.parquet, its scores)) on the same held-out
    calls, with its 95% CI, beside the retriever's own order on them. `write_metrics_log` adds these to the rows
    of those iterations, so the curves show the ranker's quality on held-out calls, not only on training's."""
    from cosearch_cli.ranker_quality import level_ci, retriever_scores

    retriever = quality(retriever_scores(calls))
    rows = []
    for iteration, scores in points:
        low, high = level_ci(scores) or (None, None)
        rows.append({"iteration": iteration, "heldout_ranker_hit1": quality(scores)["hit1"],
                     "heldout_ranker_hit1_ci_low": low, "heldout_ranker_hit1_ci_high": high,
                     "heldout_retriever_hit1": retriever["hit1"]})
    write_json_atomic(path, {"calls": len(calls.pairs), "calls_with_answer": retriever["calls_with_answer"],
                             "questions": calls.questions(), "calls_from": "eval-init/rollouts.jsonl", "rows": rows})


def _updates_line(root, config: TrainConfig) -> str:
    """Which models the run updated, in which iterations, with how many kept groups (most groups of a small
    model have all-equal rewards and train nothing)."""
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


def _mean_of(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def _gain(value: float | None, ci: list[float] | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.3f}" + (f" [95% CI {ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")


def _sci(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1e}"


def _fmt(value: float | None, pct: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.1%}" if pct else f"{value:.3f}"
