"""Turning scored rollout records into training sequences and padded micro-batches.

A training sequence is the recorded token ids with a mask of the tokens the trained model generated and the
log-probs it sampled them with. Nothing is re-tokenised: text never enters this stage. Micro-batches hold
runs of length-sorted sequences under a token budget (rows x longest row), split where that saves the most
padding, so padding stays small without packing several sequences into one row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from cosearch_cli.advantages import ALL_EQUAL, EQUAL_TO_BASELINE
from cosearch_cli.errors import ModelError, RecordError
from cosearch_cli.records import RolloutRecord


@dataclass
class TrainSeq:
    key: str  # "<question_id>/s<sample>" for a trajectory, the call id for a ranker call
    token_ids: list[int]
    mask: list[int]  # 1 on tokens the trained model generated
    old_logprobs: list[float]  # sampling log-probs, aligned to token_ids
    advantage: float
    temperature: float

    @property
    def n_trained(self) -> int:
        return sum(self.mask)


def _temperature(record: RolloutRecord) -> float:
    if record.sampling.get("greedy"):
        return 1.0  # greedy decoding records log-probs at temperature 1 (generation/base.py)
    return float(record.sampling.get("temperature", 1.0) or 1.0)


def _trained(advantage: float | None) -> bool:
    # NaN stays in: the step guard must see it and skip the step rather than silently drop it
    return advantage is not None and (advantage != 0 or math.isnan(advantage))


def _check(seq: TrainSeq, where: str) -> TrainSeq:
    n = len(seq.token_ids)
    if not n:
        raise RecordError(f"{where}: the sequence has no token ids, so it cannot be trained",
                          fix="regenerate this rollout; every trajectory and ranker call records its tokens")
    if len(seq.mask) != n or len(seq.old_logprobs) != n:
        raise RecordError(f"{where}: token_ids, loss mask and logprobs have lengths {n}, {len(seq.mask)}, "
                          f"{len(seq.old_logprobs)}", fix="regenerate this rollout; the three must align")
    if n and seq.mask[0]:
        raise RecordError(f"{where}: the first token is marked as generated, but nothing predicts it",
                          fix="the loss mask must be 0 on the prompt")
    return seq


def agent_sequences(record: RolloutRecord) -> list[TrainSeq]:
    members = {m for g in record.groups if g.role == "agent" and g.kept for m in g.members}
    temperature = _temperature(record)
    out = []
    for traj in record.trajectories:
        if str(traj.sample) not in members or not _trained(traj.advantage):
            continue
        seq = trajectory_seq(record, traj, float(traj.advantage), temperature)
        out.append(_check(seq, f"question {record.question_id} sample {traj.sample}"))
    return out


def ranker_sequences(record: RolloutRecord) -> list[TrainSeq]:
    members = {m for g in record.groups if g.role == "ranker" and g.kept for m in g.members}
    temperature = float(record.sampling.get("ranker_temperature", _temperature(record)))
    out = []
    for call in record.ranker_calls:
        if call.id not in members or not _trained(call.advantage):
            continue
        if len(call.logprobs) != len(call.output_ids):
            raise RecordError(f"ranker call {call.id}: {len(call.output_ids)} output ids but "
                              f"{len(call.logprobs)} logprobs", fix="regenerate this rollout")
        if not call.prompt_ids:
            raise RecordError(f"ranker call {call.id} has no prompt_ids",
                              fix="only LLM ranker calls recorded with their token ids can be trained")
        out.append(_check(call_seq(call, float(call.advantage), temperature), f"ranker call {call.id}"))
    return out


def trajectory_seq(record: RolloutRecord, traj, advantage: float, temperature: float) -> TrainSeq:
    """A trajectory's whole token sequence; the loss mask marks what the agent generated."""
    return TrainSeq(f"{record.question_id}/s{traj.sample}", traj.token_ids, traj.loss_mask, traj.logprobs,
                    advantage, temperature)


def call_seq(call, advantage: float, temperature: float) -> TrainSeq:
    """A ranker call as prompt + output, trained on the output only."""
    n_prompt = len(call.prompt_ids)
    return TrainSeq(call.id, call.prompt_ids + call.output_ids, [0] * n_prompt + [1] * len(call.output_ids),
                    [0.0] * n_prompt + list(call.logprobs), advantage, temperature)


def diagnostic_sequences(records: Iterable[RolloutRecord], role: str, limit: int) -> list[TrainSeq]:
    """The first `limit` of `role`'s sequences with generated tokens, whatever their group (advantage 0,
    temperature 1 as greedy records are scored): where an update's held-out KL is measured."""
    seqs: list[TrainSeq] = []
    for record in records:
        if role == "agent":
            seqs += [trajectory_seq(record, t, 0.0, 1.0) for t in record.trajectories]
        else:
            seqs += [call_seq(c, 0.0, 1.0) for c in record.ranker_calls
                     if c.prompt_ids and c.output_ids and len(c.logprobs) == len(c.output_ids)]
    return [s for s in seqs if s.n_trained][:limit]


SEQUENCES = {"agent": agent_sequences, "ranker": ranker_sequences}


def training_sequences(records: Iterable[RolloutRecord], role: str) -> list[TrainSeq]:
    """Every sequence of `role` in a kept group with a non-zero advantage and at least one trained token."""
    pick = SEQUENCES[role]
    return [seq for record in records for seq in pick(record) if seq.n_trained > 0]


# Groups that passed grouping belong to the batch even when all their rewards are equal (or equal to their
# baseline: advantage 0); singletons and clusters under k_min never do.
_IN_BATCH = ("", ALL_EQUAL, EQUAL_TO_BASELINE)


def batch_size(records: Iterable[RolloutRecord], role: str) -> tuple[int, int]:
    """(response tokens, sequences) of every member of `role`'s groups in the batch, advantage 0 or not.

    This is what verl and Search-R1 divide a token-mean loss by: every response token of the batch. Dividing
    by the tokens of non-zero-advantage sequences only makes the step grow as fewer groups carry signal.
    """
    tokens = seqs = 0
    for record in records:
        members = {m for g in record.groups if g.role == role and g.reason in _IN_BATCH for m in g.members}
        if role == "agent":
            counts = [sum(t.loss_mask) for t in record.trajectories if str(t.sample) in members]
        else:
            counts = [len(c.output_ids) for c in record.ranker_calls if c.id in members and c.prompt_ids]
        tokens += sum(counts)
        seqs += sum(1 for n in counts if n)
    return tokens, seqs


def check_vocab(seqs: list[TrainSeq], vocab_size: int, model_name: str = "the model") -> None:
    top = max((max(s.token_ids) for s in seqs if s.token_ids), default=-1)
    low = min((min(s.token_ids) for s in seqs if s.token_ids), default=0)
    if top >= vocab_size or low < 0:
        bad = top if top >= vocab_size else low
        raise ModelError(f"token id {bad} is outside {model_name}'s vocabulary of {vocab_size}",
                         fix="update the model the rollout was sampled from (same tokenizer)")


# ---------------------------------------------------------------------------------------------------------
# Micro-batches


@dataclass
class Norms:
    """Batch-wide divisors, identical on every process, so micro-batches and ranks sum to one loss."""

    tokens: int  # trained tokens in the whole batch
    seqs: int  # trained sequences in the whole batch
    horizon: int  # divisor of seq-mean-token-sum-norm


def batch_norms(seqs: list[TrainSeq], norm_tokens: int | None = None,
                batch: tuple[int, int] | None = None) -> Norms:
    """Divisors over the trained sequences, or over the whole batch (`batch_size`) when it is given."""
    tokens, count = batch if batch is not None else (sum(s.n_trained for s in seqs), len(seqs))
    assert tokens >= sum(s.n_trained for s in seqs), "the batch must include every trained sequence"
    return Norms(tokens=tokens, seqs=count, horizon=norm_tokens or max(s.n_trained for s in seqs))


@dataclass
class MicroBatch:
    """Right-padded rows plus, flat over every trained token, where its prediction is read from.

    Token t is predicted by the logits at position t - 1, so `rows, cols` point at predicting positions and
    `targets` are the tokens they must predict. `cols_kept` is the sorted set of predicting positions, passed
    to the model as `logits_to_keep` so logits are never computed where nothing is trained.
    """

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    cols_kept: torch.Tensor  # [K]
    rows: torch.Tensor  # [N]
    cols: torch.Tensor  # [N] index into cols_kept
    targets: torch.Tensor  # [N]
    old_logprobs: torch.Tensor  # [N]
    advantages: torch.Tensor  # [N]
    temperatures: torch.Tensor  # [N]
    seq_tokens: torch.Tensor  # [N] trained tokens of the sequence this token belongs to
    weight: float = 1.0  # 0 for a placeholder batch that only keeps distributed ranks in step

    def to(self, device) -> "MicroBatch":
        moved = {name: value.to(device) if isinstance(value, torch.Tensor) else value
                 for name, value in vars(self).items()}
        return MicroBatch(**moved)

    @property
    def padded_tokens(self) -> int:
        return self.input_ids.numel()

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum())


def plan_micro_batches(seqs: list[TrainSeq], token_budget: int, overhead: int = 128) -> list[list[TrainSeq]]:
    """Split the length-sorted sequences into runs that minimise padded tokens + `overhead` per micro-batch.

    A micro-batch costs about rows x longest row (padding included) plus a fixed per-call cost; over sorted
    lengths the best split into contiguous runs is a small dynamic programme. A run must fit `token_budget`
    (a single longer sequence goes alone).
    """
    ordered = sorted(seqs, key=lambda s: (-len(s.token_ids), s.key))
    n = len(ordered)
    best = [0] * (n + 1)  # best[i]: cost of planning ordered[i:]
    cut = [n] * (n + 1)
    for i in range(n - 1, -1, -1):
        width = len(ordered[i].token_ids)
        best[i] = None
        for j in range(i + 1, n + 1):
            if (j - i) * width > token_budget and j - i > 1:
                break
            cost = (j - i) * width + overhead + best[j]
            if best[i] is None or cost < best[i]:
                best[i], cut[i] = cost, j
    plans, i = [], 0
    while i < n:
        plans.append(ordered[i:cut[i]])
        i = cut[i]
    return plans


def collate(seqs: list[TrainSeq], pad_id: int = 0, weight: float = 1.0) -> MicroBatch:
    width = max(len(s.token_ids) for s in seqs)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
    rows, positions, targets, old, adv, temp, seq_tokens = [], [], [], [], [], [], []
    for b, s in enumerate(seqs):
        n = len(s.token_ids)
        input_ids[b, :n] = torch.tensor(s.token_ids, dtype=torch.long)
        attention_mask[b, :n] = 1
        trained = [t for t in range(1, n) if s.mask[t]]
        rows += [b] * len(trained)
        positions += [t - 1 for t in trained]
        targets += [s.token_ids[t] for t in trained]
        old += [s.old_logprobs[t] for t in trained]
        adv += [s.advantage] * len(trained)
        temp += [s.temperature] * len(trained)
        seq_tokens += [s.n_trained] * len(trained)
    positions_t = torch.tensor(positions, dtype=torch.long)
    cols_kept, cols = torch.unique(positions_t, sorted=True, return_inverse=True)
    return MicroBatch(input_ids, attention_mask, cols_kept, torch.tensor(rows, dtype=torch.long), cols,
                      torch.tensor(targets, dtype=torch.long), torch.tensor(old, dtype=torch.float32),
                      torch.tensor(adv, dtype=torch.float32), torch.tensor(temp, dtype=torch.float32),
                      torch.tensor(seq_tokens, dtype=torch.float32), weight)
