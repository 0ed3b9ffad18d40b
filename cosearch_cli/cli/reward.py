"""`cosearch reward`: agent and ranker rewards and GRPO advantages for grouped rollout records."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Literal

import typer

from cosearch_cli import advantages, grouping, rewards
from cosearch_cli.artifacts import make_manifest
from cosearch_cli.cli import app
from cosearch_cli.cli.common import Inputs, Output, Quiet, stderr
from cosearch_cli.cli.group import Summary, read_records, write_outputs
from cosearch_cli.errors import ConfigError

Preset = Annotated[Literal["paper", "official"], typer.Option(
    help="Named settings. paper: gamma 0.5 (r_rel <= gamma alone), r_rel Hit@5, r_main = F1. official: gamma "
         "0.8 (strict), r_rel mean Hit@{1,3,5}, r_main = 1 if F1 >= 0.8, invalid output without an "
         "answer-bearing candidate gets only its penalty. The options below override single values.")]


def _load_verifier(name: str):
    try:
        from cosearch_cli.rollout import load_backend
    except ImportError:  # rollout not installed in this tree yet: the transformers backend directly
        from cosearch_cli.generation.hf import HFBackend

        return HFBackend.load(name)
    return load_backend(name)


def describe_rewards(records) -> str:
    trajs = [t for r in records for t in r.trajectories]
    failed = sum(not t.format_ok for t in trajs)
    def mean(values: list[float]) -> str:
        return f"{sum(values) / len(values):.3f}" if values else "n/a"

    lines = [f"agent: {len(trajs):,} trajectories, {failed:,} format failures, mean reward "
             f"{mean([t.reward for t in trajs])}, F1 {mean([t.scores['f1'] for t in trajs])}, "
             f"EM {mean([t.scores['em'] for t in trajs])}, SubEM {mean([t.scores['subem'] for t in trajs])}"]
    if any("evidence_f1" in t.scores for t in trajs):
        lines[0] += f", evidence F1 {mean([t.scores['evidence_f1'] for t in trajs if 'evidence_f1' in t.scores])}"
    calls = [c for r in records for c in r.ranker_calls]
    scored = [c for c in calls if c.reward is not None]
    branches: dict[str, int] = {}
    for c in scored:
        branches[c.reward_parts["branch"]] = branches.get(c.reward_parts["branch"], 0) + 1
    lines.append(f"ranker: {len(calls):,} calls, {len(scored):,} scored ({sum(not c.valid for c in scored):,} "
                 f"invalid outputs), mean reward {mean([c.reward for c in scored])}, branches: "
                 + (", ".join(f"{n:,} {b}" for b, n in sorted(branches.items())) or "none"))
    return "\n".join(lines)


@app.command("reward")
def reward(
    inputs: Inputs = None,
    output: Output = "-",
    preset: Preset = "paper",
    format_penalty: Annotated[float | None, typer.Option(
        help="Agent reward of a trajectory that failed the format check (replaces its F1). Default -0.2.")] = None,
    gamma: Annotated[float | None, typer.Option(
        help="r_rel threshold: at or below it (below it with --gamma-strict) an easy call gets r_rel alone, "
             "above it r_rel + r_main. Default 0.5 (paper), 0.8 (official).")] = None,
    gamma_strict: Annotated[bool | None, typer.Option(
        "--gamma-strict/--gamma-inclusive",
        help="Strict: r_rel < gamma gets r_rel alone (official code); inclusive: r_rel <= gamma (paper).")] = None,
    rel: Annotated[Literal["hit", "mean-hit", "ndcg"] | None, typer.Option(
        help="r_rel: hit = Hit@k (paper), mean-hit = mean of Hit@{1,3,5} (official), ndcg = nDCG@k with binary "
             "gains (ablation).")] = None,
    rel_k: Annotated[int | None, typer.Option(help="k of Hit@k and nDCG@k. Default 5.")] = None,
    main: Annotated[Literal["f1", "binary"] | None, typer.Option(
        help="r_main: f1 = the trajectory's answer F1 (paper), binary = 1 if F1 >= --main-threshold (official)."
    )] = None,
    main_threshold: Annotated[float | None, typer.Option(help="F1 threshold of binary r_main. Default 0.8.")] = None,
    invalid_penalty: Annotated[float | None, typer.Option(
        help="Added to the reward of an invalid ranker output (whose r_rel is 0). Default -0.2.")] = None,
    invalid_penalty_only: Annotated[bool | None, typer.Option(
        "--invalid-penalty-only/--invalid-keeps-main",
        help="An invalid output with no answer-bearing candidate gets only the penalty (official) or "
             "r_main + penalty (paper preset).")] = None,
    evidence_weight: Annotated[float | None, typer.Option(
        help="Weight of the R-Search evidence reward in the agent reward: F1 of the --verifier's answer from the "
             "agent's <evidence> block alone. Default 0 (off).")] = None,
    verifier: Annotated[str | None, typer.Option(
        help="Model answering from the evidence (a name such as smollm2, or a local path); needed when "
             "--evidence-weight > 0.")] = None,
    verifier_max_new_tokens: Annotated[int, typer.Option(help="Longest verifier answer, in tokens.")] = 32,
    scale: Annotated[Literal["group", "batch", "none"], typer.Option(
        help="Advantage scaling: group = (r - group mean) / (group std + eps) (GRPO); batch = divide by the "
             "std of all trainable rewards of that role in the input; none = r - group mean.")] = "group",
    eps: Annotated[float, typer.Option(help="Added to the std before dividing.")] = 1e-6,
    summary: Summary = None,
    quiet: Quiet = False,
) -> None:
    """Score grouped rollouts: agent reward (answer F1; EM and SubEM recorded), composite ranker reward
    (r_rel, r_main, gamma, invalid-output penalty) and group-normalised advantages for both models.

    Groups of one member or whose rewards are all equal get advantage 0 and are marked not kept
    (reason singleton / all-equal-rewards). Writes the records at stage "scored"; prints what happened to
    stderr.
    """
    config = rewards.resolve_config(
        preset, format_penalty=format_penalty, gamma=gamma, gamma_strict=gamma_strict, rel=rel, rel_k=rel_k,
        main=main, main_threshold=main_threshold, invalid_penalty=invalid_penalty,
        invalid_penalty_only=invalid_penalty_only, evidence_weight=evidence_weight)
    if config.evidence_weight > 0 and not verifier:
        raise ConfigError("--evidence-weight needs a --verifier model", fix="pass e.g. --verifier smollm2")
    if eps < 0:
        raise ConfigError(f"--eps must be >= 0, got {eps}", fix="the default is 1e-6")
    records, reader = read_records(inputs, "grouped", grouping.check_grouped)
    evidence = None
    if config.evidence_weight > 0:
        evidence = rewards.evidence_scores(records, _load_verifier(verifier),
                                           max_new_tokens=verifier_max_new_tokens)
    for i, record in enumerate(records):
        rewards.score_record(record, config, evidence[i] if evidence is not None else None)
    advantages.assign_advantages(records, mode=scale, eps=eps)
    options = {"preset": preset, **asdict(config), "verifier": verifier, "scale": scale, "eps": eps}
    manifest = make_manifest("reward", options, inputs=reader.hashes, upstream=reader.upstream)
    groups = [(r.question_id, r.groups) for r in records]
    write_outputs(records, groups, output, summary, manifest)
    if not quiet:
        if not any(g.kept for r in records for g in r.groups):
            stderr.print("warning: no group in this input has a training signal", highlight=False, markup=False)
        stderr.print(f"reward: {len(records):,} questions, preset {preset}, scale {scale}\n"
                     f"{describe_rewards(records)}\n{grouping.describe_groups(groups)}",
                     highlight=False, markup=False, soft_wrap=True)
