"""Rule-based rewards for the agent and the ranker (METHOD.md, "Agent reward" and "Ranker composite reward").

Agent: reward = token F1 of the final answer against the best gold alias (EM and SubEM are recorded in
`scores` too). A trajectory that failed the format check gets reward = the format penalty (-0.2), not
F1 + penalty: METHOD gives the penalty as what a failure "gets", and a malformed trajectory's answer is not
trusted. With the optional evidence reward (R-Search), a well-formed trajectory gets
F1 + evidence_weight * evidence F1, where evidence F1 is the F1 of a verifier model's answer given only the
agent's last `<evidence>` block (0 when there is none).

Ranker, per call (fields recorded in RankerCall.reward_parts):
  r_rel   ranking quality of the K chosen passages, with binary gains from candidate_has_answer in the order
          shown: Hit@k (paper), mean of Hit@{1,3,5} (official code) or nDCG@k (ablation; the ideal DCG puts
          every answer-bearing candidate of the N first). An invalid output chose nothing itself (the agent saw
          the dense fallback), so its r_rel is 0: the fallback's quality must not reward an invalid output.
  r_main  the trajectory's answer F1 (paper) or 1 if F1 >= threshold else 0 (official code).
  branch  some candidate contains the answer: r_rel alone while r_rel <= gamma ("rel-only"), else r_rel + r_main
          ("rel+main"); the official code's boundary is strict (r_rel < gamma alone, so r_rel == gamma gets
          r_main too). No candidate contains the answer: r_main ("main-only").
  penalty an invalid output adds the invalid penalty (-0.2). In the official variant an invalid output with no
          answer-bearing candidate gets only the penalty ("penalty-only"), without r_main.
Calls set aside by grouping (no candidates retrieved, agent format failure, no trainable ranker) get no reward:
they do not train, and a call that ranked nothing is neither rewarded nor penalised.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from cosearch_cli.errors import ConfigError
from cosearch_cli.generation.base import GenerationBackend, GenerationRequest, SamplingSettings
from cosearch_cli.grouping import SET_ASIDE, chosen_indices
from cosearch_cli.metrics import answer_scores, token_f1
from cosearch_cli.records import RankerCall, RolloutRecord, Trajectory

REL_KINDS = ("hit", "mean-hit", "ndcg")
MAIN_KINDS = ("f1", "binary")
MEAN_HIT_KS = (1, 3, 5)
EVIDENCE_OPEN, EVIDENCE_CLOSE = "<evidence>", "</evidence>"


@dataclass(frozen=True)
class RewardConfig:
    format_penalty: float = -0.2  # agent reward of a trajectory that failed the format check
    gamma: float = 0.5  # r_rel threshold above which r_main is added
    gamma_strict: bool = False  # official: r_rel < gamma gets r_rel alone; paper: r_rel <= gamma
    rel: str = "hit"  # hit | mean-hit | ndcg
    rel_k: int = 5  # k of Hit@k and nDCG@k
    main: str = "f1"  # f1 | binary
    main_threshold: float = 0.8  # F1 at or above which binary r_main is 1
    invalid_penalty: float = -0.2  # added to the reward of an invalid ranker output
    invalid_penalty_only: bool = False  # official: invalid with no answer-bearing candidate gets only the penalty
    evidence_weight: float = 0.0  # weight of the R-Search evidence F1 in the agent reward (0 = off)

    def check(self) -> "RewardConfig":
        for f in fields(self):  # NaN passes every comparison below
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"--{f.name.replace('_', '-')} must be a finite number, got {value}",
                                  fix="see `cosearch reward --help` for the allowed values")
        if self.rel not in REL_KINDS:
            raise ConfigError(f"unknown --rel {self.rel!r}", fix=f"choose one of {', '.join(REL_KINDS)}")
        if self.main not in MAIN_KINDS:
            raise ConfigError(f"unknown --main {self.main!r}", fix=f"choose one of {', '.join(MAIN_KINDS)}")
        if self.rel_k < 1:
            raise ConfigError(f"--rel-k must be at least 1, got {self.rel_k}", fix="the paper uses K=5")
        if self.evidence_weight < 0:
            raise ConfigError(f"--evidence-weight must be >= 0, got {self.evidence_weight}",
                              fix="use 0 to turn the evidence reward off")
        return self


# Penalties are the official code's (the paper gives none); the paper's variant keeps r_main for an invalid
# output without an answer-bearing candidate, since only the official code is described as dropping it.
PRESETS = {
    "paper": RewardConfig(gamma=0.5, gamma_strict=False, rel="hit", rel_k=5, main="f1",
                          invalid_penalty_only=False),
    "official": RewardConfig(gamma=0.8, gamma_strict=True, rel="mean-hit", rel_k=5, main="binary",
                             main_threshold=0.8, invalid_penalty_only=True),
}


def resolve_config(preset: str, **overrides) -> RewardConfig:
    """The preset's values with every override that is not None applied."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}", fix=f"choose one of {', '.join(PRESETS)}")
    return replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None}).check()


# --- ranker ------------------------------------------------------------------------------------------------


def hit_at(gains: Sequence[bool], k: int) -> float:
    return 1.0 if any(gains[:k]) else 0.0


def ndcg_at(gains: Sequence[bool], k: int, n_relevant: int) -> float:
    dcg = sum(1.0 / math.log2(i + 2) for i, g in enumerate(gains[:k]) if g)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(k, n_relevant)))
    return dcg / ideal if ideal else 0.0


def relevance(gains: Sequence[bool], n_relevant: int, kind: str, k: int) -> float:
    """r_rel of the passages shown, in order; `n_relevant` answer-bearing candidates among all N."""
    if kind == "hit":
        return hit_at(gains, k)
    if kind == "mean-hit":
        return sum(hit_at(gains, j) for j in MEAN_HIT_KS) / len(MEAN_HIT_KS)
    return ndcg_at(gains, k, n_relevant)


def main_reward(answer_f1: float, config: RewardConfig) -> float:
    if config.main == "binary":
        return 1.0 if answer_f1 >= config.main_threshold else 0.0
    return answer_f1


def chosen_gains(call: RankerCall) -> list[bool]:
    """candidate_has_answer of the passages the agent was shown, in the order shown (ids checked on read)."""
    return [call.candidate_has_answer[i] for i in chosen_indices(call)]


def ranker_reward(gains: Sequence[bool], n_relevant: int, valid: bool, answer_f1: float,
                  config: RewardConfig) -> tuple[float, dict]:
    """The composite reward of one ranker call and its parts (see the module docstring)."""
    answer_in_candidates = n_relevant > 0
    r_rel = relevance(gains, n_relevant, config.rel, config.rel_k) if valid else 0.0
    r_main = main_reward(answer_f1, config)
    if not answer_in_candidates:
        reward, branch = r_main, "main-only"
    elif (r_rel < config.gamma) if config.gamma_strict else (r_rel <= config.gamma):
        reward, branch = r_rel, "rel-only"
    else:
        reward, branch = r_rel + r_main, "rel+main"
    penalty = 0.0
    if not valid:
        penalty = config.invalid_penalty
        if not answer_in_candidates and config.invalid_penalty_only:
            reward, branch = 0.0, "penalty-only"
        reward += penalty
    parts = {"r_rel": r_rel, "r_main": r_main, "branch": branch, "penalty": penalty,
             "answer_in_candidates": answer_in_candidates, "valid": valid}
    return reward, parts


# --- agent ---------------------------------------------------------------------------------------------------


def agent_reward(traj: Trajectory, answers: Sequence[str], config: RewardConfig,
                 evidence_f1: float | None = None) -> tuple[float, dict]:
    """(reward, scores) of one trajectory; scores holds em, subem, f1 (and evidence_f1 when used)."""
    scores = answer_scores(traj.answer, answers)
    if evidence_f1 is not None:
        scores["evidence_f1"] = evidence_f1
    if not traj.format_ok:
        return config.format_penalty, scores
    return scores["f1"] + config.evidence_weight * (evidence_f1 or 0.0), scores


def greedy_rewards(records: Sequence[RolloutRecord], config: RewardConfig) -> dict[str, float]:
    """Question id -> the agent reward of its (first) greedy trajectory: ReMax's baseline of the agent's
    advantages (advantages.set_baselines)."""
    return {r.question_id: agent_reward(r.trajectories[0], r.answers, config)[0] for r in records}


def score_record(record: RolloutRecord, config: RewardConfig,
                 evidence_f1: dict[int, float] | None = None) -> RolloutRecord:
    """Fill scores and rewards of a grouped record; `evidence_f1` maps sample -> verifier F1 when used."""
    answer_f1: dict[int, float] = {}
    for traj in record.trajectories:
        ev = evidence_f1.get(traj.sample) if evidence_f1 is not None else None
        traj.reward, traj.scores = agent_reward(traj, record.answers, config, ev)
        answer_f1[traj.sample] = traj.scores["f1"]
    excluded = {m for g in record.groups if g.reason in SET_ASIDE for m in g.members}
    for call in record.ranker_calls:
        if call.id in excluded:
            call.reward, call.reward_parts = None, {}
            continue
        gains = chosen_gains(call) if call.valid else []
        n_relevant = sum(call.candidate_has_answer)
        call.reward, call.reward_parts = ranker_reward(gains, n_relevant, call.valid, answer_f1[call.sample],
                                                       config)
    record.stage = "scored"
    return record


# --- R-Search evidence reward ------------------------------------------------------------------------------

VERIFIER_PROMPT = ("Answer the question using only the evidence below, in a few words, with no explanation.\n\n"
                   "Evidence: {evidence}\n\nQuestion: {question}")


def extract_evidence(traj: Trajectory) -> str | None:
    """The agent's last <evidence> block, from generated turns only (never from the prompt)."""
    for turn in reversed(traj.turns):
        end = turn.text.rfind(EVIDENCE_CLOSE)
        start = turn.text.rfind(EVIDENCE_OPEN, 0, end if end >= 0 else None)
        if start >= 0 and end > start:
            return turn.text[start + len(EVIDENCE_OPEN):end].strip()
    return None


def _prompt_ids(tokenizer, text: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
        return tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode(text + "\nAnswer:")


def clean_verifier_answer(text: str) -> str:
    """The verifier's short answer: inside <answer> tags if it used them, else its first non-empty line."""
    start, end = text.find("<answer>"), text.find("</answer>")
    if start >= 0 and end > start:
        return text[start + len("<answer>"):end].strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else ""


def evidence_scores(records: Sequence[RolloutRecord], backend: GenerationBackend, *, max_new_tokens: int = 32,
                    batch_size: int = 16) -> list[dict[int, float]]:
    """Per record, sample -> F1 of the verifier's answer from the trajectory's evidence alone (greedy).

    Trajectories without an evidence block score 0 without a verifier call; those that failed the format
    check are skipped (their reward is the format penalty whatever the evidence).
    """
    jobs: list[tuple[int, int, str, list[int]]] = []
    out: list[dict[int, float]] = [{} for _ in records]
    for r_index, record in enumerate(records):
        for traj in record.trajectories:
            if not traj.format_ok:
                continue
            evidence = extract_evidence(traj)
            out[r_index][traj.sample] = 0.0
            if evidence:
                prompt = VERIFIER_PROMPT.format(evidence=evidence, question=record.question)
                jobs.append((r_index, traj.sample, prompt, _prompt_ids(backend.tokenizer, prompt)))
    settings = SamplingSettings(max_new_tokens=max_new_tokens, greedy=True, temperature=1.0)
    for start in range(0, len(jobs), batch_size):
        batch = jobs[start:start + batch_size]
        generations = backend.generate([GenerationRequest(prompt_ids=ids) for *_, ids in batch], settings)
        for (r_index, sample, _, _), gen in zip(batch, generations):
            out[r_index][sample] = token_f1(clean_verifier_answer(gen.text), records[r_index].answers)
    return out
