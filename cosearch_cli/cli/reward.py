"""`cosearch reward`: agent and ranker rewards and GRPO advantages for grouped rollout records."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import orjson
import typer

from cosearch_cli import advantages, grouping, rewards
from cosearch_cli.artifacts import dumps, make_manifest, mark_partial
from cosearch_cli.cli import app
from cosearch_cli.cli.common import AllowPartial, Inputs, OldRules, Output, Quiet, stderr
from cosearch_cli.cli.group import Summary, iter_records, no_records, read_records, write_outputs
from cosearch_cli.errors import ConfigError
from cosearch_cli.gcpause import paused_gc

STREAM_CHUNK = 64  # questions scored together when records stream (scale group/none)

Preset = Annotated[Literal["paper", "official"], typer.Option(
    "--rules", help="Named rules. paper: gamma 0.5 (r_rel <= gamma alone), r_rel Hit@5, r_main = F1. official: gamma "
         "0.8 (strict), r_rel mean Hit@{1,3,5}, r_main = 1 if F1 >= 0.8, invalid output without an "
         "answer-bearing candidate gets only its penalty. The options below override single values.")]


def _load_verifier(name: str):
    try:
        from cosearch_cli.rollout import load_backend
    except ImportError:  # rollout not installed in this tree yet: the transformers backend directly
        from cosearch_cli.generation.hf import HFBackend

        return HFBackend.load(name)
    return load_backend(name)


@dataclass
class RewardTally:
    """Running totals for the stderr summary, so records need not be kept once written."""

    questions: int = 0
    trajectories: int = 0
    format_failures: int = 0
    agent: dict = field(default_factory=lambda: {"reward": [0.0, 0], "F1": [0.0, 0], "EM": [0.0, 0],
                                                 "SubEM": [0.0, 0], "evidence F1": [0.0, 0]})
    calls: int = 0
    no_candidates: int = 0
    invalid: int = 0
    ranker_reward: list = field(default_factory=lambda: [0.0, 0])
    branches: Counter = field(default_factory=Counter)

    def add(self, record) -> None:
        self.questions += 1
        for t in record.trajectories:
            self.trajectories += 1
            self.format_failures += not t.format_ok
            for name, value in (("reward", t.reward), ("F1", t.scores["f1"]), ("EM", t.scores["em"]),
                                ("SubEM", t.scores["subem"]), ("evidence F1", t.scores.get("evidence_f1"))):
                if value is not None:
                    self.agent[name][0] += value
                    self.agent[name][1] += 1
        for c in record.ranker_calls:
            self.calls += 1
            self.no_candidates += c.no_candidates
            if c.reward is not None:
                self.invalid += not c.valid
                self.ranker_reward[0] += c.reward
                self.ranker_reward[1] += 1
                self.branches[c.reward_parts["branch"]] += 1

    def describe(self) -> str:
        def mean(total_count: list) -> str:
            return f"{total_count[0] / total_count[1]:.3f}" if total_count[1] else "n/a"

        means = ", ".join(f"{name} {mean(tc)}" for name, tc in self.agent.items() if tc[1])
        branches = ", ".join(f"{n:,} {b}" for b, n in sorted(self.branches.items())) or "none"
        return (f"agent: {self.trajectories:,} trajectories, {self.format_failures:,} format failures, mean "
                f"{means}\nranker: {self.calls:,} calls ({self.no_candidates:,} with no candidates, not scored), "
                f"{self.ranker_reward[1]:,} scored ({self.invalid:,} invalid outputs), mean reward "
                f"{mean(self.ranker_reward)}, branches: {branches}")


def _chunks(records: Iterable, size: int) -> Iterator[list]:
    chunk = []
    for record in records:
        chunk.append(record)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@app.command("reward")
def reward(
    inputs: Inputs = None,
    output: Output = "-",
    preset: Preset = "paper",
    old_preset: OldRules = None,
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
             "r_main + penalty (paper rules).")] = None,
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
    baseline: Annotated[Path | None, typer.Option(
        help="Greedy rollouts of the same questions (`cosearch rollout --greedy --n 1`, same models): each agent "
             "advantage becomes reward - its question's greedy reward, unscaled (ReMax's baseline; --scale then "
             "applies to ranker groups only), and an agent group whose members all score the greedy reward is "
             "dropped (equal-to-baseline). Default: GRPO's group mean, as METHOD.md.")] = None,
    summary: Summary = None,
    allow_partial: AllowPartial = False,
    quiet: Quiet = False,
) -> None:
    """Score grouped rollouts: agent reward (answer F1; EM and SubEM recorded), composite ranker reward
    (r_rel, r_main, gamma, invalid-output penalty) and group-normalised advantages for both models.

    Groups of one member or whose rewards are all equal get advantage 0 and are marked not kept
    (reason singleton / all-equal-rewards). With --baseline, agent advantages are measured from the greedy
    trajectory's reward instead (ReMax). Writes the records at stage "scored"; prints what happened to
    stderr.
    """
    preset = old_preset or preset
    config = rewards.resolve_config(
        preset, format_penalty=format_penalty, gamma=gamma, gamma_strict=gamma_strict, rel=rel, rel_k=rel_k,
        main=main, main_threshold=main_threshold, invalid_penalty=invalid_penalty,
        invalid_penalty_only=invalid_penalty_only, evidence_weight=evidence_weight)
    if config.evidence_weight > 0 and not verifier:
        raise ConfigError("--evidence-weight needs a --verifier model", fix="pass e.g. --verifier smollm2")
    if not eps >= 0:  # also NaN
        raise ConfigError(f"--eps must be >= 0, got {eps}", fix="the default is 1e-6")
    verifier_backend = _load_verifier(verifier) if config.evidence_weight > 0 else None
    baselines, baseline_hashes = None, {}
    if baseline is not None:  # the stages' checked reader: refuses an empty file, a repeated question, no trajectory
        greedy, baseline_reader = read_records([str(baseline)], "rollout", grouping.check_rollout)
        baselines, baseline_hashes = rewards.greedy_rewards(greedy, config), baseline_reader.hashes
    # Batch scaling needs every reward before the first advantage, so it holds the whole input; the other
    # modes are per group, so records stream through in chunks (a chunk also batches verifier prompts) and
    # only their serialised lines are kept until everything was read and checked.
    with paused_gc():
        if scale == "batch":
            records, reader = read_records(inputs, "grouped", grouping.check_grouped, allow_partial)
            chunks = [records]
        else:
            reader, records = iter_records(inputs, "grouped", grouping.check_grouped, allow_partial)
            chunks = _chunks(records, STREAM_CHUNK)
        lines, groups, tally = [], [], RewardTally()
        for chunk in chunks:
            evidence = None
            if verifier_backend is not None:
                evidence = rewards.evidence_scores(chunk, verifier_backend, max_new_tokens=verifier_max_new_tokens)
            for i, record in enumerate(chunk):
                rewards.score_record(record, config, evidence[i] if evidence is not None else None)
            advantages.set_baselines(chunk, baselines, str(baseline))
            advantages.assign_advantages(chunk, mode=scale, eps=eps)
            for record in chunk:
                lines.append(orjson.Fragment(dumps(record)[:-1]))
                groups.append((record.question_id, record.groups))
                tally.add(record)
    if not lines:
        raise no_records(inputs)
    options = {"preset": preset, **asdict(config), "verifier": verifier, "scale": scale, "eps": eps,
               "baseline": "greedy" if baseline is not None else "group"}
    manifest = mark_partial(make_manifest("reward", options, inputs={**reader.hashes, **baseline_hashes},
                                          upstream=reader.upstream),
                            [reader])
    write_outputs(lines, groups, output, summary, manifest)
    if not quiet:
        if not any(g.kept for _, question_groups in groups for g in question_groups):
            stderr.print("warning: no group in this input has a training signal", highlight=False, markup=False)
        stderr.print(f"reward: {len(lines):,} questions, rules {preset}, scale {scale}\n{tally.describe()}\n"
                     f"{grouping.describe_groups(groups)}", highlight=False, markup=False, soft_wrap=True)
