"""GRPO advantages from group rewards, for both models.

advantage = (r - mean_group) / (scale + eps), where scale is
  group  the group's standard deviation (GRPO as in DeepSeekMath, Search-R1 and CoSearch);
  batch  the standard deviation of all rewards in the batch's trainable groups of the same role (mean still
         per group): groups with a small spread are not blown up to unit scale;
  none   no scaling: plain r - mean_group (as Dr. GRPO proposes); eps is unused.
Standard deviations are sample deviations (ddof=1), as verl and TRL compute them.

A group of one, or whose rewards are all equal (within 1e-9), carries no signal: every member gets
advantage 0, and the group is marked kept=False with reason "singleton" or "all-equal-rewards" so the update
stage skips it and the summary counts it. This is where METHOD's "drop clusters whose rewards are all equal"
happens, since grouping runs before rewards exist.

A group with a `baseline` (the reward of the same models' greedy trajectory for the question, ReMax's
baseline; `cosearch train` with agent_baseline = "greedy") instead gets advantage = r - baseline, unscaled
(the mode does not apply): a sample that only repeats what greedy decoding scores gets 0, and a group whose
members all score the baseline carries no signal (reason "equal-to-baseline"), while a group of equal members
that differ from the baseline trains.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cosearch_cli.errors import ConfigError, RecordError
from cosearch_cli.grouping import AGENT, RANKER, SINGLETON
from cosearch_cli.records import RolloutRecord

MODES = ("group", "batch", "none")
ALL_EQUAL = "all-equal-rewards"
EQUAL_TO_BASELINE = "equal-to-baseline"
EQUAL_TOLERANCE = 1e-9


def sample_std(values: Sequence[float]) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def no_signal(rewards: Sequence[float]) -> str:
    """Why a group cannot train ("" when it can)."""
    if len(rewards) < 2:
        return SINGLETON
    if max(rewards) - min(rewards) <= EQUAL_TOLERANCE:
        return ALL_EQUAL
    return ""


def no_signal_from(rewards: Sequence[float], baseline: float | None) -> str:
    """Why a group cannot train against `baseline` ("" when it can); GRPO's rule when `baseline` is None."""
    if baseline is None:
        return no_signal(rewards)
    if all(abs(r - baseline) <= EQUAL_TOLERANCE for r in rewards):
        return EQUAL_TO_BASELINE
    return ""


def group_advantages(rewards: Sequence[float], *, mode: str = "group", eps: float = 1e-6,
                     batch_std: float | None = None) -> list[float]:
    """Advantages of one group's members, in order; all 0 for a singleton or all-equal group."""
    if mode not in MODES:
        raise ConfigError(f"unknown advantage scaling {mode!r}", fix=f"choose one of {', '.join(MODES)}")
    if no_signal(rewards):
        return [0.0] * len(rewards)
    mean = sum(rewards) / len(rewards)
    if mode == "group":
        scale = sample_std(rewards) + eps
    elif mode == "batch":
        assert batch_std is not None, "batch scaling needs the batch's reward std"
        scale = batch_std + eps
    else:
        scale = 1.0
    return [(r - mean) / scale for r in rewards]


def set_baselines(records: Sequence[RolloutRecord], baselines: dict[str, float] | None, source: str = "") -> None:
    """Give each record's agent group its question's greedy reward (`baselines`) as the baseline of its
    advantages; None leaves GRPO's group mean."""
    if baselines is None:
        return
    for record in records:
        if record.question_id not in baselines:
            raise RecordError(f"no greedy baseline for question {record.question_id!r}", path=source or "<baseline>",
                              fix="roll out every question of the input greedily (cosearch rollout --greedy --n 1)")
        for group in record.groups:
            if group.role == AGENT:
                group.baseline = baselines[record.question_id]


def assign_advantages(records: Sequence[RolloutRecord], *, mode: str = "group", eps: float = 1e-6) -> None:
    """Set the advantage of every trajectory and ranker call in scored records, dropping no-signal groups.

    Members of groups that do not train (dropped here or by grouping) get advantage 0.
    """
    trainable: list[tuple[list, list[float], str]] = []  # (member objects, their rewards, role)
    pooled = {AGENT: [], RANKER: []}
    for record in records:
        trajs = {str(t.sample): t for t in record.trajectories}
        calls = {c.id: c for c in record.ranker_calls}
        for group in record.groups:
            members = [(trajs if group.role == AGENT else calls)[m] for m in group.members]
            for member in members:
                member.advantage = 0.0
            if group.reason in (ALL_EQUAL, EQUAL_TO_BASELINE):  # rescoring: judge the group on the new rewards
                group.kept, group.reason = True, ""
            if not group.kept:
                continue
            rewards = [m.reward for m in members]
            reason = no_signal_from(rewards, group.baseline)
            if reason:
                group.kept, group.reason = False, reason
                continue
            if group.baseline is not None:
                for member, reward in zip(members, rewards):
                    member.advantage = reward - group.baseline
                continue
            trainable.append((members, rewards, group.role))
            pooled[group.role].extend(rewards)
    batch_std = {role: sample_std(values) for role, values in pooled.items()}
    for members, rewards, role in trainable:
        for member, adv in zip(members, group_advantages(rewards, mode=mode, eps=eps, batch_std=batch_std[role])):
            member.advantage = adv
