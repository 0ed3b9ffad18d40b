"""GRPO groups for the agent and for the ranker (METHOD.md, "Ranker GRPO: semantic grouping").

Agent: one group per question, its G trajectories, id "<question_id>/agent", members are sample numbers.

Ranker: the ranker's inputs differ across trajectories, so groups are formed from similar calls:
  1. every ranker call of one question, taken in (sample, turn) order so the result does not depend on how
     the rollout wrote them;
  2. calls that retrieved no candidates (nothing was ranked), calls whose trajectory failed the agent's format
     check, and calls not made by a trainable ranker model (ranker "none" or "oracle") are set aside *before*
     clustering so they cannot change group sizes or their peers' advantages; they go to a pseudo-group
     "<question_id>/ranker/excluded/<why>" that is never kept and get no reward;
  3. the rest split into "easy" (some candidate contains a gold answer) and "hard";
  4. within each split, greedy clustering of normalised sub-queries: a call joins the first cluster whose
     representative (its first member) has unigram F1 >= tau with it, else starts a new cluster;
     identical normalised sub-queries always share a cluster (even empty ones, where F1 is undefined);
  5. a cluster trains if it has at least k_min members (paper) or more than k_min members (official code,
     `kmin_strict`); a cluster of one never trains.
Ranker group ids are "<question_id>/ranker/<easy|hard>/c<n>", n counting clusters from 0 in creation order.

Dropping clusters whose rewards are all equal needs the rewards, so it happens in the reward stage (see
advantages.py), which turns such groups to kept=False with reason "all-equal-rewards".

Reasons a group is not kept (GroupInfo.reason), stable strings for counting:
  singleton             one member: no comparison is possible
  below-kmin            fewer members than k_min asks
  no-candidates         pseudo-group of ranker calls whose sub-query retrieved nothing
  agent-format-failure  pseudo-group of ranker calls from trajectories that failed the format check
  not-trained-ranker    pseudo-group of calls made without a trainable ranker (ranker "none"/"oracle")
  all-equal-rewards     (set by the reward stage) every member got the same reward
  equal-to-baseline     (set by the reward stage) every member got the group's baseline reward (the greedy
                        trajectory's, with agent_baseline = "greedy")
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

from cosearch_cli.errors import ConfigError, RecordError
from cosearch_cli.records import GroupInfo, RankerCall, RolloutRecord

AGENT, RANKER = "agent", "ranker"
SINGLETON, BELOW_KMIN = "singleton", "below-kmin"
FORMAT_FAILURE, NOT_TRAINED = "agent-format-failure", "not-trained-ranker"
NO_CANDIDATES = "no-candidates"
SET_ASIDE = (NO_CANDIDATES, FORMAT_FAILURE, NOT_TRAINED)  # reasons of the pseudo-groups made before clustering
TRAINED_RANKER = "llm"


@dataclass(frozen=True)
class GroupConfig:
    tau: float = 0.8  # unigram F1 a sub-query needs with a cluster's representative to join it
    kmin: int = 3  # smallest cluster that trains (with kmin_strict: the largest that does not)
    kmin_strict: bool = False  # official code: keep size > kmin; paper: size >= kmin

    def check(self) -> "GroupConfig":
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"--tau must be in (0, 1], got {self.tau}", fix="the paper uses 0.8")
        if self.kmin < 1:
            raise ConfigError(f"--kmin must be at least 1, got {self.kmin}", fix="the paper uses 3")
        return self

    def keeps(self, size: int) -> bool:
        return size > self.kmin if self.kmin_strict else size >= self.kmin


# The official code states tau 0.8; the paper gives no other value, so both presets use it.
PRESETS = {
    "paper": GroupConfig(tau=0.8, kmin=3, kmin_strict=False),
    "official": GroupConfig(tau=0.8, kmin=3, kmin_strict=True),
}


def resolve_config(preset: str, **overrides) -> GroupConfig:
    """The preset's values with every override that is not None applied."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}", fix=f"choose one of {', '.join(PRESETS)}")
    return replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None}).check()


# --- sub-query similarity --------------------------------------------------------------------------------

_NON_WORD = re.compile(r"\W+")
_ARTICLE = re.compile(r"\b(?:a|an|the)\b")


def normalize_query(text: str) -> str:
    """Lowercase, drop articles, non-word characters to spaces, collapse spaces (METHOD.md step 3)."""
    text = _ARTICLE.sub(" ", text.lower())
    return " ".join(_NON_WORD.sub(" ", text).split())


def unigram_f1(a: Counter, a_len: int, b: Counter, b_len: int) -> float:
    """Token F1 of two bags of words. The same arithmetic as metrics.token_f1, but on pre-normalised,
    pre-counted sub-queries: clustering compares each call with many representatives, and the query
    normalisation differs from the SQuAD answer normalisation metrics applies."""
    if len(a) > len(b):
        a, b = b, a
    overlap = 0
    for token, count in a.items():
        other = b.get(token)
        if other:
            overlap += count if count < other else other
    if overlap == 0:
        return 0.0
    precision, recall = overlap / a_len, overlap / b_len
    return 2 * precision * recall / (precision + recall)


def cluster_queries(queries: Iterable[str], tau: float) -> list[int]:
    """Greedy clustering: cluster index (in creation order) for each query, in input order."""
    reps: list[tuple[str, Counter, int]] = []
    assignment: list[int] = []
    for query in queries:
        norm = normalize_query(query)
        tokens = norm.split()
        counts = Counter(tokens)
        for index, (rep_norm, rep_counts, rep_len) in enumerate(reps):
            if norm == rep_norm or unigram_f1(counts, len(tokens), rep_counts, rep_len) >= tau:
                assignment.append(index)
                break
        else:
            assignment.append(len(reps))
            reps.append((norm, counts, len(tokens)))
    return assignment


# --- grouping one record ----------------------------------------------------------------------------------


def agent_group_id(question_id: str) -> str:
    return f"{question_id}/{AGENT}"


def ranker_group_id(question_id: str, split: str, cluster: int) -> str:
    return f"{question_id}/{RANKER}/{split}/c{cluster}"


def _clear_downstream(record: RolloutRecord) -> None:
    """Regrouping a grouped or scored record must not leave stale rewards behind."""
    for traj in record.trajectories:
        traj.group, traj.scores, traj.reward, traj.advantage = None, {}, None, None
    for call in record.ranker_calls:
        call.group, call.reward, call.reward_parts, call.advantage = None, None, {}, None


def group_record(record: RolloutRecord, config: GroupConfig) -> RolloutRecord:
    """Fill `groups`, Trajectory.group and RankerCall.group; returns the record at stage "grouped"."""
    _clear_downstream(record)
    record.groups = [_agent_group(record), *_ranker_groups(record, config)]
    record.stage = "grouped"
    return record


def _agent_group(record: RolloutRecord) -> GroupInfo:
    group_id = agent_group_id(record.question_id)
    for traj in record.trajectories:
        traj.group = group_id
    size = len(record.trajectories)
    return GroupInfo(group_id, AGENT, [str(t.sample) for t in record.trajectories], kept=size > 1,
                     reason="" if size > 1 else SINGLETON)


def _ranker_groups(record: RolloutRecord, config: GroupConfig) -> list[GroupInfo]:
    qid = record.question_id
    format_ok = {t.sample: t.format_ok for t in record.trajectories}
    excluded: dict[str, list[RankerCall]] = {why: [] for why in SET_ASIDE}
    splits: dict[str, list[RankerCall]] = {"easy": [], "hard": []}
    for call in sorted(record.ranker_calls, key=lambda c: (c.sample, c.turn)):
        if call.no_candidates:
            excluded[NO_CANDIDATES].append(call)
        elif not format_ok[call.sample]:
            excluded[FORMAT_FAILURE].append(call)
        elif call.ranker != TRAINED_RANKER:
            excluded[NOT_TRAINED].append(call)
        else:
            splits["easy" if call.any_has_answer else "hard"].append(call)

    groups = []
    for split, split_calls in splits.items():
        assignment = cluster_queries((c.query for c in split_calls), config.tau)
        clusters: list[list[RankerCall]] = [[] for _ in range(max(assignment, default=-1) + 1)]
        for call, cluster in zip(split_calls, assignment):
            clusters[cluster].append(call)
        for number, cluster_calls in enumerate(clusters):
            size = len(cluster_calls)
            reason = SINGLETON if size == 1 else ("" if config.keeps(size) else BELOW_KMIN)
            groups.append(_assign(ranker_group_id(qid, split, number), cluster_calls, reason))
    for why, excluded_calls in excluded.items():
        if excluded_calls:
            groups.append(_assign(f"{qid}/{RANKER}/excluded/{why}", excluded_calls, why))
    return groups


def _assign(group_id: str, calls: list[RankerCall], reason: str) -> GroupInfo:
    for call in calls:
        call.group = group_id
    return GroupInfo(group_id, RANKER, [c.id for c in calls], kept=not reason, reason=reason)


def chosen_indices(call: RankerCall) -> list[int] | None:
    """Candidate index of each passage shown, in order; None if one is not among the candidates."""
    ids = call.candidate_ids
    perm = call.permutation
    if len(perm) == len(call.chosen_ids) and all(0 <= i < len(ids) for i in perm) \
            and [ids[i] for i in perm] == call.chosen_ids:
        return perm  # the usual case, without building an index of all N candidates
    index = {cid: i for i, cid in enumerate(ids)}
    try:
        return [index[cid] for cid in call.chosen_ids]
    except KeyError:
        return None


def check_rollout(record: RolloutRecord, path: str, line: int) -> None:
    """The invariants grouping and rewards rely on, reported with the record's file and line."""
    samples = [t.sample for t in record.trajectories]
    if not samples:
        raise RecordError(f"question {record.question_id!r} has no trajectories", path=path, line=line,
                          fix="regenerate this file with `cosearch rollout`")
    if len(set(samples)) != len(samples):
        raise RecordError(f"question {record.question_id!r} repeats a trajectory sample number", path=path,
                          line=line, fix="merge shards so each sample appears once")
    known = set(samples)
    seen_ids: set[str] = set()
    for i, call in enumerate(record.ranker_calls):
        where = f"ranker_calls[{i}] ({call.id!r})"
        if call.id in seen_ids:
            raise RecordError(f"{where} repeats a ranker call id", path=path, line=line,
                              fix="ranker call ids must be unique within a question")
        seen_ids.add(call.id)
        if call.sample not in known:
            raise RecordError(f"{where} names sample {call.sample}, which has no trajectory", path=path,
                              line=line, fix="regenerate this file with `cosearch rollout`")
        if len(call.candidate_has_answer) != len(call.candidate_ids):
            raise RecordError(f"{where} has {len(call.candidate_has_answer)} candidate_has_answer flags for "
                              f"{len(call.candidate_ids)} candidates", path=path, line=line,
                              fix="regenerate this file with `cosearch rollout`")
        if call.valid and chosen_indices(call) is None:
            raise RecordError(f"{where} chose a passage that is not among its candidates", path=path,
                              line=line, fix="regenerate this file with `cosearch rollout`")


def check_grouped(record: RolloutRecord, path: str, line: int) -> None:
    """A grouped record's groups must name existing members, and every member must point back."""
    check_rollout(record, path, line)
    if not record.groups:
        raise RecordError(f"question {record.question_id!r} has no groups", path=path, line=line,
                          fix="pipe it through `cosearch group` first")
    trajs = {str(t.sample): t for t in record.trajectories}
    calls = {c.id: c for c in record.ranker_calls}
    for group in record.groups:
        members = trajs if group.role == AGENT else calls if group.role == RANKER else None
        if members is None:
            raise RecordError(f"group {group.id!r} has unknown role {group.role!r}", path=path, line=line,
                              fix="role must be agent or ranker; regroup with `cosearch group`")
        for member in group.members:
            if member not in members or members[member].group != group.id:
                raise RecordError(f"group {group.id!r} lists member {member!r}, which is missing or belongs "
                                  f"to another group", path=path, line=line,
                                  fix="regroup with `cosearch group`")
    grouped = {m for g in record.groups for m in g.members}
    for traj in record.trajectories:
        if traj.group is None or str(traj.sample) not in grouped:
            raise RecordError(f"trajectory sample {traj.sample} is in no group", path=path, line=line,
                              fix="regroup with `cosearch group`")
    aside = {m for g in record.groups if g.reason in SET_ASIDE for m in g.members}
    for call in record.ranker_calls:
        if call.group is None or call.id not in grouped:
            raise RecordError(f"ranker call {call.id!r} is in no group", path=path, line=line,
                              fix="regroup with `cosearch group`")
        if call.no_candidates and call.id not in aside:
            raise RecordError(f"ranker call {call.id!r} retrieved no candidates but is grouped for training",
                              path=path, line=line, fix="regroup with `cosearch group` (it sets such calls aside)")


# --- reporting ----------------------------------------------------------------------------------------------


def summary_rows(groups: Iterable[tuple[str, list[GroupInfo]]]) -> list[dict]:
    """One row per group, from (question_id, groups) pairs: what the --summary Parquet holds."""
    return [{"question_id": qid, "group": g.id, "role": g.role, "size": len(g.members), "kept": g.kept,
             "reason": g.reason} for qid, question_groups in groups for g in question_groups]


def describe_groups(groups: Iterable[tuple[str, list[GroupInfo]]]) -> str:
    """A few lines for stderr from (question_id, groups) pairs: groups formed, kept and dropped per role,
    with the reasons counted."""
    formed = {AGENT: 0, RANKER: 0}
    kept = {AGENT: 0, RANKER: 0}
    members_kept = {AGENT: 0, RANKER: 0}
    reasons = {AGENT: Counter(), RANKER: Counter()}
    excluded = Counter()
    for _, question_groups in groups:
        for g in question_groups:
            if g.reason in SET_ASIDE:
                excluded[g.reason] += len(g.members)
                continue
            formed[g.role] += 1
            if g.kept:
                kept[g.role] += 1
                members_kept[g.role] += len(g.members)
            else:
                reasons[g.role][g.reason] += 1
    lines = []
    for role, unit in ((AGENT, "trajectories"), (RANKER, "calls")):
        dropped = ", ".join(f"{n:,} {why}" for why, n in sorted(reasons[role].items())) or "none"
        lines.append(f"{role} groups: {formed[role]:,} formed, {kept[role]:,} kept ({members_kept[role]:,} "
                     f"{unit}), dropped: {dropped}")
    if excluded:
        lines.append("ranker calls left out before clustering: "
                     + ", ".join(f"{n:,} {why}" for why, n in sorted(excluded.items())))
    return "\n".join(lines)
