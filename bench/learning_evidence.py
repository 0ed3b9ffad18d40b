"""Sum up the learning-evidence runs (issues 7, 14): one table per preset, the runs' curves side by side, and
with --json the held-out figures of each run with paired bootstrap 95% CIs (cosearch_cli/gains.py): agent F1
before/after on the run's dev questions, and the ranker's Hit@1 on one shared set of fixed held-out ranker calls
(those of the first run with an LLM ranker, from its evaluation before training) for the ranker the run started
from and the one it ended with (search-r1 shows the retriever's order), against the retriever's order.
A checkpoint's re-ranking of those calls is kept in runs/.rerank-cache/ (keyed by its weights, the calls, their
passages and the settings) and reused by later runs from the same start (~7 min a ranker at 630 questions here).

    .venv/bin/python bench/learning_evidence.py --runs runs/learn-search-r1 runs/learn-fixed-ranker \
        runs/learn-cosearch --png bench/results/learning_curves.png --json bench/results/learning_evidence.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
import polars as pl

from cosearch_cli.curves import compare_curves

COLUMNS = ("iteration", "train_reward", "train_f1", "format_ok", "search_turns", "ranker_valid", "ranker_hit_at_k",
           "agent_groups_kept", "ranker_groups_kept", "dev_f1", "dev_em", "dev_search_turns", "dev_hit_at_k")


def load(run: Path) -> list[dict]:
    rows = pl.read_parquet(run / "metrics.parquet").to_dicts()
    for row in rows:
        if isinstance(row.get("seconds"), str):
            row["seconds"] = orjson.loads(row["seconds"])
    return rows


# with agent_baseline = "greedy" (study 12) also the greedy baseline's mean reward and the samples above/below it
PER_ITERATION = COLUMNS + ("questions_drawn", "agent_lr", "agent_kl_batch", "ranker_kl_batch", "agent_kl_heldout",
                           "ranker_kl_heldout", "train_greedy_reward", "samples_above_greedy", "samples_below_greedy")


def per_iteration(rows: list[dict]) -> list[dict]:
    """The training iterations' figures (the table's columns and each update's KL on its batch and on held-out
    sequences), for the json."""
    return [{c: r.get(c) for c in PER_ITERATION if r.get(c) is not None}
            for r in sorted(rows, key=lambda r: r["iteration"]) if r["iteration"] >= 0]


def embed(out: dict, extras: list[str], option: str = "--extra") -> dict:
    """`out` with each NAME=FILE of `extras` added under NAME: that JSON file's content (another script's
    figures, a manifest's counts), so one results file holds every figure its Markdown states. The file is
    what follows the last `=`, so a NAME may hold one ("greedy (T = 2)"). `option` names the command-line
    option the items came from, for the error message."""
    for item in extras:
        name, _, path = item.rpartition("=")
        if not name or not path:
            raise SystemExit(f"{option} {item!r}: write NAME=FILE")
        out[name] = orjson.loads(Path(path).read_bytes())
    return out


def run_totals(per_iter: list[dict]) -> dict:
    """Over a run's updates: groups trained per role, updates made, and the mean held-out KL of an update."""
    out = {}
    for role in ("agent", "ranker"):
        kls = [r[f"{role}_kl_heldout"] for r in per_iter if r.get(f"{role}_kl_heldout") is not None]
        out[f"{role}_groups_trained"] = sum(r.get(f"{role}_groups_kept") or 0 for r in per_iter)
        out[f"{role}_updates"] = len(kls)
        out[f"{role}_kl_heldout_mean"] = sum(kls) / len(kls) if kls else None
    return out


def table(rows: list[dict]) -> str:
    present = [c for c in COLUMNS if any(r.get(c) is not None for r in rows)]
    out = ["| " + " | ".join(present) + " | step seconds |", "|" + "---|" * (len(present) + 1)]
    for r in sorted(rows, key=lambda r: r["iteration"]):
        cells = ["" if r.get(c) is None else (f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]))
                 for c in present]
        seconds = r.get("seconds") or {}
        cells.append(f"{sum(seconds.values()):.0f}" if isinstance(seconds, dict) and seconds else "")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


_RERANKED: dict[tuple[str, bool], list] = {}
# Files of a checkpoint that decide what it writes (not its optimizer state or the manifests with timestamps).
MODEL_FILES = ("*.safetensors", "config.json", "generation_config.json", "tokenizer*.json", "special_tokens_map.json",
               "chat_template.jinja", "vocab.json", "merges.txt")
RERANK_CACHE = Path("runs/.rerank-cache")


def rerank_key(calls, docs, model: str, constrained: bool) -> str | None:
    """What re-ranking the calls with `model` depends on, hashed: the checkpoint's weights, config and tokenizer,
    the calls (questions, candidates, their passages' text), the rollout's ranker settings, the constraint and
    cosearch's version. None for a model that is no local folder (a name such as smollm2): not cached."""
    import hashlib

    from cosearch_cli.artifacts import file_sha256, package_versions

    folder = Path(model)
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    files = sorted({f for pattern in MODEL_FILES for f in folder.glob(pattern) if f.is_file()})
    for f in files:
        digest.update(f"{f.name}={file_sha256(f)}\n".encode())
    ids = list(dict.fromkeys(pid for _, call in calls.pairs for pid in call.candidate_ids))
    digest.update(orjson.dumps({
        "calls": [[r.question_id, r.question, r.answers, r.dataset, c.id, c.candidate_ids, c.candidate_has_answer]
                  for r, c in calls.pairs],
        "passages": [[p.title, p.text] for p in docs.get(ids)],
        "settings": repr(calls.config), "constrained": constrained,
        "cosearch": package_versions().get("cosearch")}))
    return digest.hexdigest()


def reranked(runner, calls, model: str, constrained: bool, cache: Path | None = RERANK_CACHE) -> list:
    """A ranker model's scores on the shared calls, computed once per model across runs and, for a checkpoint
    folder, kept in `cache` (one JSON per key of `rerank_key`) so later studies of the same start reuse them."""
    from dataclasses import asdict

    from cosearch_cli.artifacts import write_bytes_atomic
    from cosearch_cli.cli.common import progress
    from cosearch_cli.ranker_quality import CallScore, rerank

    key = (str(Path(model).resolve()) if Path(model).exists() else model, constrained)
    if key in _RERANKED:
        return _RERANKED[key]
    digest = rerank_key(calls, runner.index.docs, model, constrained) if cache is not None else None
    stored = cache / f"{digest}.json" if digest else None
    if stored is not None and stored.is_file():
        print(f"re-ranked {len(calls.pairs)} held-out calls with {model}: reused {stored}", flush=True)
        _RERANKED[key] = [CallScore(**row) for row in orjson.loads(stored.read_bytes())]
        return _RERANKED[key]
    print(f"re-ranking {len(calls.pairs)} held-out calls with {model}", flush=True)
    backend = runner.backend(model)
    with progress() as bar:
        task = bar.add(f"re-ranking with {model}", len(calls.pairs), unit="calls")
        _RERANKED[key] = rerank(calls, backend, runner.index.docs, constrained=constrained,
                                on_progress=lambda n: bar.advance(task, n))
    if stored is not None:
        stored.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(stored, orjson.dumps([asdict(s) for s in _RERANKED[key]]))
    return _RERANKED[key]


def shipped_records(run: Path, model: str, folder: Path) -> list:
    """Greedy held-out rollouts of the shipped `model` as agent and ranker, with the run's own evaluation settings
    (the run's Runner evaluates them); cached in `folder`."""
    from cosearch_cli.train import Models, Runner, eval_questions, load_config, read_questions, read_records

    config = load_config(run / "config.toml")
    dev = eval_questions(read_questions(config.dev_questions), config.eval_limit)
    print(f"evaluating the shipped {model} on {len(dev)} held-out questions -> {folder}", flush=True)
    Runner(config).evaluate(folder, Models(model, model), dev)
    return read_records(folder / "rollouts.jsonl")


def run_figures(run: Path, calls, untrained: str | None = None, shipped: list | None = None) -> dict:
    """One run's before/after figures; the ranker is judged on the shared `calls`, and with `untrained` also
    against that model (e.g. the shipped 'smollm2') as a ranker on the same calls."""
    from cosearch_cli.gains import compare_runs
    from cosearch_cli.ranker_quality import paired_difference, quality, retriever_scores
    from cosearch_cli.train import Runner, current_models, load_config, read_records

    config = load_config(run / "config.toml")
    runner = Runner(config)
    last = run / f"iter-{config.iterations - 1:04d}" / "eval" / "rollouts.jsonl"
    before, after = read_records(run / "eval-init" / "rollouts.jsonl"), read_records(last)
    ranker_before = ranker_after = None  # None: the retriever's own order
    if config.ranker == "llm":
        start, end = current_models(runner.paths, config, 0).ranker, current_models(runner.paths, config,
                                                                                      config.iterations).ranker
        constrained = "ranker" in runner.constraint_roles()
        ranker_before = reranked(runner, calls, start, constrained)
        ranker_after = reranked(runner, calls, end, constrained)
    figures = compare_runs(before, after, calls=calls, ranker_before=ranker_before, ranker_after=ranker_after)
    extra = {}
    if untrained and calls is not None:
        scores = reranked(runner, calls, untrained, True)
        stats = paired_difference(scores, ranker_after or retriever_scores(calls), "hit1").get("average", {})
        extra = {"ranker_hit1_untrained": quality(scores)["hit1"], "untrained_ranker": untrained,
                 "ranker_vs_untrained": stats.get("diff"),
                 "ranker_vs_untrained_ci": [stats["ci_low"], stats["ci_high"]] if stats else None}
    if shipped is not None:
        versus = compare_runs(shipped, after)
        extra |= {"agent_f1_shipped": versus["agent_f1_before"], "agent_f1_vs_shipped": versus["agent_f1_gain"],
                  "agent_f1_vs_shipped_ci": versus["agent_f1_gain_ci"]}
    seconds = [sum(r["seconds"].values()) for r in load(run) if isinstance(r.get("seconds"), dict)]
    return {"preset": run.name, **{k: v for k, v in figures.items() if k != "bootstrap"}, **extra,
            "hours": round(sum(seconds) / 3600, 2), "bootstrap": figures["bootstrap"]}


def summary(figures: list[dict]) -> str:
    """The Markdown table of the held-out figures (what learning_evidence.md states)."""
    def ci(pair) -> str:
        return "" if pair is None else f"[{pair[0]:+.3f}, {pair[1]:+.3f}]"

    def num(value) -> str:
        return "" if value is None else f"{value:.3f}"

    head = ("| run | questions | agent F1 start -> end | gain [95% CI] | ranker Hit@1 start -> end | gain [95% CI] "
            "| retriever Hit@1 | end - retriever [95% CI] | untrained Hit@1 | end - untrained [95% CI] "
            "| shipped agent F1 | end - shipped [95% CI] | hours |")
    rows = [head, "|" + "---|" * 13]
    for f in figures:
        rows.append(f"| {f['preset']} | {f['questions']} | {num(f['agent_f1_before'])} -> {num(f['agent_f1_after'])} "
                    f"| {f['agent_f1_gain']:+.3f} {ci(f['agent_f1_gain_ci'])} "
                    f"| {num(f['ranker_hit1_before'])} -> {num(f['ranker_hit1_after'])} "
                    f"| {ci(f['ranker_hit1_gain_ci'])} | {num(f['retriever_hit1'])} "
                    f"| {ci(f['ranker_vs_retriever_ci'])} | {num(f.get('ranker_hit1_untrained'))} "
                    f"| {ci(f.get('ranker_vs_untrained_ci'))} | {num(f.get('agent_f1_shipped'))} "
                    f"| {ci(f.get('agent_f1_vs_shipped_ci'))} | {f['hours']} |")
    return "\n".join(rows)


def pairwise(runs: list[Path]) -> list[dict]:
    """Every pair of runs' final agents on the same held-out questions: F1 of b - a with its paired CI."""
    from cosearch_cli.gains import compare_runs
    from cosearch_cli.train import load_config, read_records

    def final(run: Path):
        config = load_config(run / "config.toml")
        return read_records(run / f"iter-{config.iterations - 1:04d}" / "eval" / "rollouts.jsonl")

    out = []
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            figures = compare_runs(final(a), final(b))
            out.append({"a": a.name, "b": b.name, "questions": figures["questions"],
                        "agent_f1_a": figures["agent_f1_before"], "agent_f1_b": figures["agent_f1_after"],
                        "b_minus_a": figures["agent_f1_gain"], "b_minus_a_ci": figures["agent_f1_gain_ci"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", required=True, help="run folders (each with metrics.parquet)")
    ap.add_argument("--png", required=True, help="where to draw the curves of all runs")
    ap.add_argument("--json", help="write the held-out figures of every run here (issue 14's fields), with each "
                                   "run's per-iteration figures")
    ap.add_argument("--untrained", help="also score this model (e.g. smollm2, the shipped one) as a ranker on "
                                        "the shared held-out calls, against each run's final ranker")
    ap.add_argument("--shipped-eval", help="folder for the greedy held-out evaluation of the --untrained model as "
                                           "agent and ranker (the first LLM-ranker run's settings; reused when "
                                           "present): each run's end is compared with it")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=FILE",
                    help="with --json: also store this JSON file's content under NAME (repeatable)")
    ap.add_argument("--title", default="search-r1 vs fixed-ranker vs cosearch (SmolLM2-135M, equal budget)")
    args = ap.parse_args()
    runs = {Path(r).name: load(Path(r)) for r in args.runs}
    compare_curves(runs, args.png, title=args.title)
    for name, rows in runs.items():
        total = sum(sum((r.get("seconds") or {}).values()) for r in rows if isinstance(r.get("seconds"), dict))
        print(f"### {name} ({total / 60:.1f} min of steps)\n\n{table(rows)}\n")
    if args.json:
        from cosearch_cli.ranker_quality import fixed_calls
        from cosearch_cli.train import load_config, read_records

        llm = [Path(r) for r in args.runs if load_config(Path(r) / "config.toml").ranker == "llm"]
        calls = fixed_calls(read_records(llm[0] / "eval-init" / "rollouts.jsonl")) if llm else None
        out = {"calls_from": str(llm[0]) if llm else None,
               "presets": []}
        shipped = None
        if args.shipped_eval and args.untrained and llm:
            shipped = shipped_records(llm[0], args.untrained, Path(args.shipped_eval))
            out["shipped_eval"] = args.shipped_eval
        out["presets"] = [run_figures(Path(r), calls, args.untrained, shipped) for r in args.runs]
        out["pairwise_agent_f1"] = pairwise([Path(r) for r in args.runs])
        out["per_iteration"] = {name: per_iteration(rows) for name, rows in runs.items()}
        out["totals"] = {name: run_totals(rows) for name, rows in out["per_iteration"].items()}
        embed(out, args.extra)
        Path(args.json).write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
        print(summary(out["presets"]))
        for pair in out["pairwise_agent_f1"]:
            low, high = pair["b_minus_a_ci"]
            print(f"{pair['b']} - {pair['a']}: agent F1 {pair['b_minus_a']:+.3f} [{low:+.3f}, {high:+.3f}] "
                  f"({pair['questions']} questions)")


if __name__ == "__main__":
    main()
