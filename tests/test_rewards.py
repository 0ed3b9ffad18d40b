"""Every branch of the composite ranker reward, the agent reward and the evidence reward, by hand."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from test_grouping import make_call, make_record, make_traj

from cosearch_cli import grouping, rewards
from cosearch_cli.errors import ConfigError
from cosearch_cli.generation.base import Generation
from cosearch_cli.records import Turn

PAPER = rewards.PRESETS["paper"]
OFFICIAL = rewards.PRESETS["official"]


# --- r_rel ---------------------------------------------------------------------------------------------------

GAINS = [False, True, False, False, True]  # answer in the 2nd and 5th passage shown


def test_hit_mean_hit_and_ndcg_by_hand():
    assert rewards.relevance(GAINS, 2, "hit", 5) == 1.0
    assert rewards.relevance(GAINS, 2, "hit", 1) == 0.0
    assert rewards.relevance(GAINS, 2, "mean-hit", 5) == pytest.approx((0 + 1 + 1) / 3)
    dcg = 1 / math.log2(3) + 1 / math.log2(6)
    ideal = 1 + 1 / math.log2(3)  # two answer-bearing candidates among the N
    assert rewards.relevance(GAINS, 2, "ndcg", 5) == pytest.approx(dcg / ideal)
    # a third answer-bearing candidate that was not shown raises the ideal, lowering nDCG
    assert rewards.relevance(GAINS, 3, "ndcg", 5) == pytest.approx(dcg / (ideal + 0.5))
    assert rewards.relevance(GAINS, 2, "ndcg", 3) == pytest.approx((1 / math.log2(3)) / ideal)
    assert rewards.relevance([True] * 5, 5, "ndcg", 5) == pytest.approx(1.0)
    assert rewards.relevance([False] * 5, 0, "ndcg", 5) == 0.0


def test_chosen_gains_follow_the_order_shown():
    call = make_call("q", 0, 0, "x", has=(3,), perm=(3, 0, 1, 2, 4))
    assert rewards.chosen_gains(call) == [True, False, False, False, False]
    call = make_call("q", 0, 0, "x", has=(3,), perm=(5, 0, 1, 2, 4))  # the answer-bearing one not shown
    assert rewards.chosen_gains(call) == [False] * 5
    call = make_call("q", 0, 0, "x", has=(3,), perm=(3, 0, 1, 2, 4))
    call.permutation = []  # without a usable permutation the chosen ids are looked up
    assert rewards.chosen_gains(call) == [True, False, False, False, False]


# --- composite reward: every branch -----------------------------------------------------------------------


def test_main_reward_f1_or_binary_at_threshold():
    assert rewards.main_reward(0.6, PAPER) == 0.6
    assert rewards.main_reward(0.8, OFFICIAL) == 1.0  # at the threshold counts
    assert rewards.main_reward(0.79, OFFICIAL) == 0.0


def test_easy_call_low_rel_gets_rel_alone():
    reward, parts = rewards.ranker_reward([False] * 5, 1, True, 0.9, PAPER)
    assert reward == 0.0 and parts["branch"] == "rel-only" and parts["r_main"] == 0.9


def test_easy_call_high_rel_adds_main():
    reward, parts = rewards.ranker_reward(GAINS, 2, True, 0.5, PAPER)
    assert reward == pytest.approx(1.5) and parts["branch"] == "rel+main"


def test_hard_call_gets_main_alone():
    reward, parts = rewards.ranker_reward([False] * 5, 0, True, 0.4, PAPER)
    assert reward == 0.4 and parts["branch"] == "main-only" and not parts["answer_in_candidates"]


@pytest.mark.parametrize("strict, expected, branch", [(False, 1.0, "rel-only"), (True, 1.6, "rel+main")])
def test_gamma_boundary_inclusive_vs_strict(strict, expected, branch):
    config = replace(PAPER, gamma=1.0, gamma_strict=strict)  # Hit@5 = 1.0 sits exactly on gamma
    reward, parts = rewards.ranker_reward(GAINS, 2, True, 0.6, config)
    assert reward == pytest.approx(expected) and parts["branch"] == branch


def test_official_preset_mean_hit_below_and_above_gamma():
    # mean Hit@{1,3,5} = 2/3 < 0.8: rel alone; binary r_main is ignored
    reward, parts = rewards.ranker_reward(GAINS, 2, True, 1.0, OFFICIAL)
    assert reward == pytest.approx(2 / 3) and parts["branch"] == "rel-only"
    # answer first: mean hit 1 >= 0.8; F1 0.85 binarises to 1
    reward, parts = rewards.ranker_reward([True, False, False, False, False], 1, True, 0.85, OFFICIAL)
    assert reward == 2.0 and parts["r_main"] == 1.0


def test_ndcg_variant_through_the_composite():
    config = replace(PAPER, rel="ndcg")
    expected_rel = (1 / math.log2(3) + 1 / math.log2(6)) / (1 + 1 / math.log2(3))  # 0.6199 > 0.5
    reward, parts = rewards.ranker_reward(GAINS, 2, True, 0.5, config)
    assert parts["r_rel"] == pytest.approx(expected_rel) and reward == pytest.approx(expected_rel + 0.5)


def test_invalid_output_easy_gets_penalty_only_since_its_rel_is_zero():
    for config in (PAPER, OFFICIAL):
        reward, parts = rewards.ranker_reward(GAINS, 2, False, 1.0, config)
        assert reward == pytest.approx(-0.2) and parts["r_rel"] == 0.0 and parts["penalty"] == -0.2


def test_invalid_output_hard_paper_keeps_main_official_gets_only_penalty():
    reward, parts = rewards.ranker_reward([], 0, False, 0.7, PAPER)
    assert reward == pytest.approx(0.5) and parts["branch"] == "main-only"
    reward, parts = rewards.ranker_reward([], 0, False, 1.0, OFFICIAL)
    assert reward == pytest.approx(-0.2) and parts["branch"] == "penalty-only"
    reward, _ = rewards.ranker_reward([], 0, False, 1.0, replace(OFFICIAL, invalid_penalty=-1.0))
    assert reward == -1.0


# --- agent reward ------------------------------------------------------------------------------------------


def test_agent_reward_is_f1_with_em_and_subem_recorded():
    reward, scores = rewards.agent_reward(make_traj(0, "Paris, France"), ["Paris"], PAPER)
    # tokens [paris, france] vs [paris]: P=1/2, R=1 -> F1 2/3; gold is a substring -> SubEM 1
    assert reward == pytest.approx(2 / 3)
    assert scores == {"em": 0.0, "subem": 1.0, "f1": pytest.approx(2 / 3)}


def test_format_failure_gets_the_penalty_not_f1_plus_penalty():
    reward, scores = rewards.agent_reward(make_traj(0, "Paris", format_ok=False), ["Paris"], PAPER)
    assert reward == -0.2 and scores["f1"] == 1.0
    reward, _ = rewards.agent_reward(make_traj(0, None, format_ok=False), ["Paris"], replace(PAPER,
                                                                                           format_penalty=-1.0))
    assert reward == -1.0


def test_score_record_uses_answer_f1_as_r_main_and_skips_excluded_calls():
    trajs = [make_traj(0, "Paris"), make_traj(1, "Paris France"), make_traj(2, "Paris", format_ok=False)]
    calls = [make_call("q", 0, 0, "capital", has=(0,)),            # easy, hit: 1 + F1 1.0
             make_call("q", 1, 0, "capital", has=(5,)),            # easy, miss: 0
             make_call("q", 1, 1, "paris"),                        # hard: F1 2/3
             make_call("q", 2, 0, "capital", has=(0,))]            # format failure: excluded
    record = grouping.group_record(make_record("q", ["Paris"], trajs, calls), grouping.GroupConfig(kmin=2))
    rewards.score_record(record, PAPER)
    assert record.stage == "scored"
    assert [t.reward for t in record.trajectories] == pytest.approx([1.0, 2 / 3, -0.2])
    by_id = {c.id: c for c in record.ranker_calls}
    assert by_id["q/s0/t0"].reward == 2.0
    assert by_id["q/s1/t0"].reward == 0.0
    assert by_id["q/s1/t1"].reward == pytest.approx(2 / 3)
    assert by_id["q/s2/t0"].reward is None and by_id["q/s2/t0"].reward_parts == {}


def test_presets_and_overrides():
    assert (PAPER.gamma, PAPER.gamma_strict, PAPER.rel, PAPER.main, PAPER.invalid_penalty_only) == \
        (0.5, False, "hit", "f1", False)
    assert (OFFICIAL.gamma, OFFICIAL.gamma_strict, OFFICIAL.rel, OFFICIAL.main, OFFICIAL.main_threshold,
            OFFICIAL.invalid_penalty_only) == (0.8, True, "mean-hit", "binary", 0.8, True)
    assert PAPER.format_penalty == OFFICIAL.format_penalty == PAPER.invalid_penalty == -0.2
    config = rewards.resolve_config("official", gamma=0.3, rel=None)
    assert (config.gamma, config.rel, config.gamma_strict) == (0.3, "mean-hit", True)
    with pytest.raises(ConfigError, match="--rel-k"):
        rewards.resolve_config("paper", rel_k=0)
    with pytest.raises(ConfigError, match="unknown preset"):
        rewards.resolve_config("r1")


# --- evidence reward ---------------------------------------------------------------------------------------


class CharTokenizer:
    """Characters as token ids: enough tokenizer for a backend that needs no model."""

    chat_template = None

    def encode(self, text, add_special_tokens=True):
        return [ord(ch) for ch in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class EvidenceEchoBackend:
    """A GenerationBackend that 'answers' with the evidence it was given (rank_llm's identity idea)."""

    name = "echo"

    def __init__(self):
        self.tokenizer = CharTokenizer()
        self.prompts = []

    def generate(self, requests, settings):
        out = []
        for request in requests:
            prompt = self.tokenizer.decode(request.prompt_ids)
            self.prompts.append(prompt)
            evidence = prompt.split("Evidence: ", 1)[1].split("\n\nQuestion:", 1)[0]
            out.append(Generation(token_ids=[1], text=f"{evidence}\nmore text", logprobs=[0.0]))
        return out


def turn(text: str) -> Turn:
    return Turn(text=text, token_ids=[], logprobs=[], action="answer")


def test_extract_evidence_takes_the_last_block_of_generated_turns():
    traj = make_traj(0, "x", turns=[turn("<evidence> old </evidence>"), turn("<think/> <evidence> Paris is big "
                                                                           "</evidence> <answer>x</answer>")])
    assert rewards.extract_evidence(traj) == "Paris is big"
    assert rewards.extract_evidence(make_traj(0, "x", turns=[turn("<evidence> unclosed")])) is None


def test_evidence_reward_arithmetic_with_a_fake_verifier():
    trajs = [make_traj(0, "Paris", turns=[turn("<evidence>Paris France</evidence><answer>Paris</answer>")]),
             make_traj(1, "Paris", turns=[turn("<answer>Paris</answer>")]),  # no evidence: 0, no call
             make_traj(2, "Lyon", turns=[turn("<evidence>Paris</evidence>")], format_ok=False)]
    record = make_record("q", ["Paris"], trajs, [])
    backend = EvidenceEchoBackend()
    (scores,) = rewards.evidence_scores([record], backend)
    assert scores == {0: pytest.approx(2 / 3), 1: 0.0}  # the format failure is not verified
    assert len(backend.prompts) == 1 and "Question: question q?" in backend.prompts[0]
    grouping.group_record(record, grouping.GroupConfig())
    rewards.score_record(record, replace(PAPER, evidence_weight=0.5), scores)
    # answer F1 1.0 + 0.5 * 2/3; answer F1 1.0 + 0; format failure: the penalty alone
    assert [t.reward for t in record.trajectories] == pytest.approx([1 + 1 / 3, 1.0, -0.2])
    assert record.trajectories[0].scores["evidence_f1"] == pytest.approx(2 / 3)
    assert "evidence_f1" not in record.trajectories[2].scores


def test_clean_verifier_answer():
    assert rewards.clean_verifier_answer("<answer> Paris </answer> because") == "Paris"
    assert rewards.clean_verifier_answer("\n  Paris\nIt is the capital.") == "Paris"
    assert rewards.clean_verifier_answer("") == ""


def test_evidence_scores_through_the_real_transformers_backend(tiny_lm):
    """Plumbing with a real (tiny, random) verifier: chat prompt, greedy answer, F1 of the cleaned answer."""
    import torch

    from cosearch_cli.generation.hf import HFBackend
    from cosearch_cli.metrics import token_f1

    model, tokenizer = tiny_lm
    traj = make_traj(0, "Paris", turns=[turn("<evidence>Paris is the capital of France</evidence>")])
    record = make_record("q", ["Paris"], [traj], [])
    (scores,) = rewards.evidence_scores([record], HFBackend(model, tokenizer), max_new_tokens=6)
    prompt = rewards.VERIFIER_PROMPT.format(evidence="Paris is the capital of France", question=record.question)
    prompt_ids = rewards._prompt_ids(tokenizer, prompt)
    assert "<|im_start|>user" in tokenizer.decode(prompt_ids)  # SmolLM2's chat template was applied
    reference = model.generate(torch.tensor([prompt_ids]), max_new_tokens=6, do_sample=False, eos_token_id=None,
                               pad_token_id=tokenizer.pad_token_id)[0, len(prompt_ids):]
    answer = rewards.clean_verifier_answer(tokenizer.decode(reference.tolist()))
    assert scores == {0: pytest.approx(token_f1(answer, ["Paris"]))}
