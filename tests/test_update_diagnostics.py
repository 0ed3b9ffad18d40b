"""What the update reports about itself (issue 14): the loss's divisor, KL of the step, grad norms."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from cosearch_cli.records import GroupInfo, RankerCall, RolloutRecord, Trajectory
from cosearch_cli.update import UpdateConfig, run_update
from cosearch_cli.update.batch import TrainSeq, batch_norms, batch_size, collate, training_sequences
from cosearch_cli.update.step import HeldoutKL, accumulate_gradients, batch_kl, local_micro_batches
from test_update_support import scored_record, tiny_llama


def _traj(sample: int, mask: list[int], advantage: float) -> Trajectory:
    ids = [3 + (7 * sample + t) % 200 for t in range(len(mask))]
    return Trajectory(sample=sample, turns=[], answer=None, n_searches=0, format_ok=True, token_ids=ids,
                      loss_mask=mask, logprobs=[-1.0 if m else 0.0 for m in mask], prompt_len=2,
                      advantage=advantage)


def _call(cid: str, n_out: int, advantage: float) -> RankerCall:
    return RankerCall(id=cid, sample=0, turn=0, query="q", ranker="llm", candidate_ids=[], candidate_scores=[],
                      candidate_has_answer=[], permutation=[], chosen_ids=[], prompt_ids=[5, 6, 7],
                      output_ids=[8] * n_out, logprobs=[-1.0] * n_out, advantage=advantage)


@pytest.fixture
def record() -> RolloutRecord:
    # agent: 3 + 2 + 4 + 1 generated tokens; two members have advantage 0 (one of them by chance in a kept group)
    trajs = [_traj(0, [0, 0, 1, 1, 1], 1.0), _traj(1, [0, 0, 1, 1], 0.0), _traj(2, [0, 0, 1, 1, 0, 1, 1], -1.0),
             _traj(3, [0, 0, 1], 0.0)]
    calls = [_call("q/s0/t0", 4, 0.5), _call("q/s1/t0", 6, -0.5), _call("q/s2/t0", 5, 0.0),  # kept cluster
             _call("q/s0/t1", 3, 0.0), _call("q/s1/t1", 3, 0.0),  # all rewards equal: in the batch, advantage 0
             _call("q/s3/t0", 9, 0.0)]  # a singleton: never in the batch
    groups = [GroupInfo("q/agent", "agent", ["0", "1", "2", "3"], True),
              GroupInfo("q/ranker/easy/c0", "ranker", ["q/s0/t0", "q/s1/t0", "q/s2/t0"], True),
              GroupInfo("q/ranker/easy/c1", "ranker", ["q/s0/t1", "q/s1/t1"], False, "all-equal-rewards"),
              GroupInfo("q/ranker/hard/c0", "ranker", ["q/s3/t0"], False, "singleton")]
    return RolloutRecord(question_id="q", question="?", answers=["a"], dataset="test", trajectories=trajs,
                         ranker_calls=calls, stage="scored", sampling={"temperature": 1.0}, groups=groups)


def test_batch_size_counts_every_member_of_the_batch(record):
    assert batch_size([record], "agent") == (3 + 2 + 4 + 1, 4)
    assert batch_size([record], "ranker") == (4 + 6 + 5 + 3 + 3, 5)  # the singleton's 9 tokens are not in it
    trained = training_sequences([record], "agent")
    assert [s.n_trained for s in trained] == [3, 4]
    norms = batch_norms(trained, batch=batch_size([record], "agent"))
    assert (norms.tokens, norms.seqs) == (10, 4)
    assert batch_norms(trained).tokens == 7  # the old divisor: trained sequences only


def test_batch_divisor_scales_the_token_mean_loss_by_trained_over_batch_tokens():
    model = tiny_llama(256, seed=0)
    record = scored_record("q1", advantages=(1.0, 0.0, -1.0, 0.0), seed=3, ranker=False)
    seqs = training_sequences([record], "agent")
    config = UpdateConfig(kl_coef=0.0, token_budget=4096)
    batches = local_micro_batches(seqs, config)
    trained = sum(s.n_trained for s in seqs)
    tokens, count = batch_size([record], "agent")
    assert tokens > trained and count == 4
    old = accumulate_gradients(model, None, batches, config, batch_norms(seqs))["loss"]
    model.zero_grad()
    new = accumulate_gradients(model, None, batches, config, batch_norms(seqs, batch=(tokens, count)))["loss"]
    model.zero_grad()
    assert new == pytest.approx(old * trained / tokens, rel=1e-6)


def test_batch_kl_is_the_r_log_r_estimate_per_token():
    model = tiny_llama(256, seed=0)
    record = scored_record("q1", seed=4, ranker=False)
    batches = local_micro_batches(training_sequences([record], "agent"), UpdateConfig(token_budget=4096))
    from cosearch_cli.update.logprobs import token_logprobs

    with torch.no_grad():
        now = [token_logprobs(model, mb)[0] for mb in batches]
    assert batch_kl(model, batches, now) == pytest.approx(0.0, abs=1e-9)
    # every token's new log-prob 0.1 above the old one: r = e^0.1, r log r - (r - 1) = 0.0053461...
    shifted = [logp - 0.1 for logp in now]
    assert batch_kl(model, batches, shifted) == pytest.approx(math.exp(0.1) * 0.1 - (math.exp(0.1) - 1), rel=1e-5)
    assert math.exp(0.1) * 0.1 - (math.exp(0.1) - 1) == pytest.approx(0.0053462, abs=1e-7)


def test_heldout_kl_equals_the_full_vocabulary_kl_computed_position_by_position():
    model = tiny_llama(256, seed=0)
    seq = TrainSeq("held/0", [3, 17, 45, 9, 120, 33, 8], [0, 0, 1, 1, 0, 1, 1], [0.0] * 7, 0.0, 1.0)
    held = HeldoutKL(model, [seq], token_budget=4096, pad_id=0)
    assert held.after(model) == pytest.approx(0.0, abs=1e-9)
    moved = copy.deepcopy(model)
    with torch.no_grad():
        moved.lm_head.weight.add_(0.05 * torch.randn_like(moved.lm_head.weight))
    ids = torch.tensor([seq.token_ids])
    with torch.no_grad():
        p_old = torch.log_softmax(model(ids).logits[0], -1)
        p_new = torch.log_softmax(moved(ids).logits[0], -1)
    expected = [float((p_new[t - 1].exp() * (p_new[t - 1] - p_old[t - 1])).sum()) for t in (2, 3, 5, 6)]
    assert held.after(moved) == pytest.approx(sum(expected) / 4, rel=1e-5)
    assert held.after(moved) > 0


def test_run_update_reports_divisor_share_norms_and_kls():
    model = tiny_llama(256, seed=0)
    record = scored_record("q1", advantages=(1.0, 0.0, -1.0, 0.5), seed=5, ranker=False)
    heldout = [TrainSeq("held/0", [3, 17, 45, 9, 120, 33, 8], [0, 0, 1, 1, 0, 1, 1], [0.0] * 7, 0.0, 1.0)]
    config = UpdateConfig(lr=1e-3, kl_coef=0.0, max_grad_norm=1e-3, token_budget=4096)
    metrics = run_update([record], role="agent", model=model, config=config, heldout=heldout).metrics
    tokens, _ = batch_size([record], "agent")
    trained = sum(s.n_trained for s in training_sequences([record], "agent"))
    assert metrics["norm_tokens"] == tokens
    assert metrics["adv_token_share"] == pytest.approx(trained / tokens)
    assert metrics["grad_norm"] > 1e-3 and metrics["grad_norm_clipped"] == pytest.approx(1e-3)
    assert metrics["lr"] == 1e-3
    assert metrics["kl_batch"] > 0 and metrics["kl_heldout"] > 0
    off = UpdateConfig(lr=1e-3, kl_coef=0.0, norm_over="trained", diagnostics=False, token_budget=4096)
    metrics = run_update([record], role="agent", model=tiny_llama(256, seed=0), config=off).metrics
    assert metrics["norm_tokens"] == trained and metrics["adv_token_share"] == 1.0
    assert metrics["kl_batch"] is None and metrics["kl_heldout"] is None




def test_diagnostic_sequences_take_every_member_whatever_its_group(record):
    from cosearch_cli.update.batch import diagnostic_sequences

    agent = diagnostic_sequences([record], "agent", limit=3)
    assert [(s.key, s.n_trained, s.advantage, s.temperature) for s in agent] == \
        [("q/s0", 3, 0.0, 1.0), ("q/s1", 2, 0.0, 1.0), ("q/s2", 4, 0.0, 1.0)]
    ranker = diagnostic_sequences([record], "ranker", limit=10)
    assert [s.n_trained for s in ranker] == [4, 6, 5, 3, 3, 9]  # the singleton's call too
    assert ranker[0].mask == [0, 0, 0, 1, 1, 1, 1]
