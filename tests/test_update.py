"""The update step on a tiny random Llama against an independent plain per-token loop."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch

from cosearch_cli.errors import ConfigError, ModelError, NothingToDo
from cosearch_cli.update import UpdateConfig, load_optimizer_state, run_update, save_checkpoint
from cosearch_cli.update.batch import batch_norms, training_sequences
from cosearch_cli.update.step import accumulate_gradients, local_micro_batches
from test_update_support import scored_record, tiny_llama

VOCAB = 256


def with_model_logprobs(record, model, noise: float, seed: int):
    """Replace recorded log-probs by the model's own plus noise, so some ratios clip and some do not."""
    rng = random.Random(seed)
    temperature = record.sampling.get("temperature", 1.0)
    with torch.no_grad():
        for traj in record.trajectories:
            logits = model(torch.tensor([traj.token_ids])).logits[0] / temperature
            logp = torch.log_softmax(logits, -1)
            traj.logprobs = [float(logp[t - 1, traj.token_ids[t]]) + rng.uniform(-noise, noise) if m else 0.0
                             for t, m in enumerate(traj.loss_mask)]
    return record


def plain_loop_loss(records, model, ref, *, mode, clip_low, clip_high, kl_coef, horizon=None):
    """GRPO written token by token with Python numbers for everything but the model call."""
    per_seq = []  # (list of per-token loss tensors, n tokens)
    for record in records:
        kept = {m for g in record.groups if g.role == "agent" and g.kept for m in g.members}
        temperature = record.sampling.get("temperature", 1.0)
        for traj in record.trajectories:
            if str(traj.sample) not in kept or not traj.advantage:
                continue
            ids = torch.tensor([traj.token_ids])
            logits = model(ids).logits[0]
            with torch.no_grad():
                ref_logits = ref(ids).logits[0]
            losses = []
            for t in range(1, len(traj.token_ids)):
                if traj.loss_mask[t] != 1:
                    continue
                logp = torch.log_softmax(logits[t - 1] / temperature, -1)[traj.token_ids[t]]
                ref_logp = torch.log_softmax(ref_logits[t - 1] / temperature, -1)[traj.token_ids[t]]
                ratio = torch.exp(logp - traj.logprobs[t])
                a = traj.advantage
                pg = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - clip_low, 1 + clip_high))
                kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
                losses.append(pg + kl_coef * kl)
            per_seq.append(losses)
    if mode == "token-mean":
        return sum(sum(ls) for ls in per_seq) / sum(len(ls) for ls in per_seq)
    if mode == "seq-mean-token-mean":
        return sum(sum(ls) / len(ls) for ls in per_seq) / len(per_seq)
    horizon = horizon or max(len(ls) for ls in per_seq)
    return sum(sum(ls) / horizon for ls in per_seq) / len(per_seq)


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def setup():
    model = tiny_llama(VOCAB, seed=0)
    ref = tiny_llama(VOCAB, seed=1)
    records = [with_model_logprobs(scored_record("q1", seed=1, ranker=False), model, 0.5, 1),
               with_model_logprobs(scored_record("q2", seed=2, temperature=0.7, lengths=(20, 6, 11, 15),
                                                 advantages=(0.5, 0.0, -1.5, 2.0), ranker=False), model, 0.5, 2)]
    return model, ref, records


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_loss_and_gradients_equal_plain_loop(setup, mode):
    model, ref, records = setup
    config = UpdateConfig(loss_agg=mode, clip_low=0.2, clip_high=0.28, kl_coef=0.05, token_budget=48)
    seqs = training_sequences(records, "agent")
    batches = local_micro_batches(seqs, config)
    assert len(batches) > 1, "the test must exercise gradient accumulation over micro-batches"
    assert any((mb.attention_mask == 0).any() for mb in batches), "and padding"

    model.zero_grad()
    sums = accumulate_gradients(model, ref, batches, config, batch_norms(seqs))
    ours = grads(model)
    assert 0 < sums["clipped"] < sums["tokens"], "some tokens must clip and some not"

    model.zero_grad()
    expected = plain_loop_loss(records, model, ref, mode=mode, clip_low=0.2, clip_high=0.28, kl_coef=0.05)
    expected.backward()
    theirs = grads(model)
    model.zero_grad()

    assert sums["loss"] == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-4, atol=1e-7, msg=name)


def test_masked_positions_get_exactly_zero_gradient(setup):
    model, ref, records = setup
    seqs = training_sequences(records[:1], "agent")
    config = UpdateConfig(kl_coef=0.05, token_budget=10_000)
    (mb,) = local_micro_batches(seqs, config)
    captured = {}

    def keep_grad(module, args, output):
        output.retain_grad()
        captured["hidden"] = output

    handle = model.model.norm.register_forward_hook(keep_grad)
    try:
        accumulate_gradients(model, ref, [mb], config, batch_norms(seqs))
    finally:
        handle.remove()
        model.zero_grad()
    grad = captured["hidden"].grad  # [B, T, H]: the last hidden state feeds only its own position's logits
    for b in range(mb.input_ids.shape[0]):
        seq = next(s for s in seqs if s.token_ids == mb.input_ids[b, :len(s.token_ids)].tolist())
        for p in range(grad.shape[1]):
            predicts_trained = p + 1 < len(seq.token_ids) and seq.mask[p + 1] == 1
            norm = grad[b, p].abs().sum().item()
            if predicts_trained:
                assert norm > 0, (b, p)
            else:
                assert norm == 0.0, f"row {b} position {p} predicts an untrained token but has gradient"


def test_masked_logprobs_and_untrained_sequences_change_nothing(setup):
    model, ref, records = setup
    config = UpdateConfig(kl_coef=0.05, token_budget=48)
    mangled = copy.deepcopy(records)
    for record in mangled:
        for traj in record.trajectories:
            traj.logprobs = [lp if m else -123.0 for lp, m in zip(traj.logprobs, traj.loss_mask)]
        record.trajectories.append(copy.deepcopy(record.trajectories[0]))
        record.trajectories[-1].sample = 99  # in no kept group
        record.trajectories[-1].advantage = 5.0
    out = []
    for batch in (records, mangled):
        seqs = training_sequences(batch, "agent")
        model.zero_grad()
        sums = accumulate_gradients(model, ref, local_micro_batches(seqs, config), config, batch_norms(seqs))
        out.append((sums["loss"], grads(model)))
    model.zero_grad()
    assert out[0][0] == out[1][0]
    for name, g in out[0][1].items():
        assert torch.equal(g, out[1][1][name]), name


def test_kl_is_zero_when_model_equals_reference(setup):
    model, _, records = setup
    policy = copy.deepcopy(model)
    result = run_update(records, role="agent", model=policy, ref_model=copy.deepcopy(model),
                        config=UpdateConfig(kl_coef=0.1))
    assert result.metrics["kl"] == 0.0
    other = run_update(records, role="agent", model=copy.deepcopy(model), ref_model=tiny_llama(VOCAB, seed=5),
                       config=UpdateConfig(kl_coef=0.1))
    assert other.metrics["kl"] > 0


def test_kl_coef_zero_never_calls_the_reference(setup):
    model, _, records = setup

    class Exploding:
        def __call__(self, *args, **kwargs):
            raise AssertionError("reference model was called")

    result = run_update(records, role="agent", model=copy.deepcopy(model), ref_model=Exploding(),
                        config=UpdateConfig(kl_coef=0.0))
    assert result.metrics["kl"] is None and not result.skipped


def test_first_step_ratio_is_one_when_logprobs_come_from_the_model(setup):
    model, _, records = setup
    exact = [with_model_logprobs(copy.deepcopy(r), model, 0.0, 0) for r in records]
    result = run_update(exact, role="agent", model=copy.deepcopy(model), config=UpdateConfig(kl_coef=0.0))
    assert result.metrics["ratio"] == pytest.approx(1.0, abs=1e-5)
    assert result.metrics["clip_frac"] == 0.0


@pytest.mark.parametrize("where", ["advantage", "logprob"])
def test_non_finite_step_is_skipped_and_weights_untouched(setup, where):
    model, _, records = setup
    bad = copy.deepcopy(records)
    if where == "advantage":
        bad[0].trajectories[0].advantage = math.nan
    else:
        traj = bad[0].trajectories[1]
        traj.logprobs[traj.loss_mask.index(1)] = math.nan
    policy = copy.deepcopy(model)
    before = {n: p.clone() for n, p in policy.state_dict().items()}
    result = run_update(bad, role="agent", model=policy, config=UpdateConfig(kl_coef=0.0, lr=1e-2))
    assert result.skipped and result.metrics["skipped"] and result.metrics["skip_reason"]
    assert result.optimizer.state_dict()["state"] == {}
    for name, tensor in policy.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    good = run_update(records, role="agent", model=policy, config=UpdateConfig(kl_coef=0.0, lr=1e-2),
                      optimizer=result.optimizer)
    assert not good.skipped and not torch.equal(policy.state_dict()["lm_head.weight"], before["lm_head.weight"])


def test_ranker_role_trains_on_ranker_calls_only(setup):
    model, _, _ = setup
    record = scored_record("q9", seed=9)
    seqs = training_sequences([record], "ranker")
    assert [s.key for s in seqs] == [c.id for c in record.ranker_calls]
    call = record.ranker_calls[1]
    seq = seqs[1]
    assert seq.token_ids == call.prompt_ids + call.output_ids
    assert seq.mask == [0] * len(call.prompt_ids) + [1] * len(call.output_ids)
    assert seq.old_logprobs[len(call.prompt_ids):] == call.logprobs and seq.advantage == call.advantage
    result = run_update([record], role="ranker", model=copy.deepcopy(model), config=UpdateConfig(kl_coef=0.0))
    assert result.metrics["tokens"] == sum(len(c.output_ids) for c in record.ranker_calls)


def test_nothing_to_do_and_vocab_mismatch(setup):
    model, _, records = setup
    dropped = scored_record("q3", seed=3, kept=False)
    with pytest.raises(NothingToDo):
        run_update([dropped], role="agent", model=model, config=UpdateConfig(kl_coef=0.0))
    big = scored_record("q4", seed=4, vocab=VOCAB + 50)
    big.trajectories[0].token_ids[3] = VOCAB + 7
    with pytest.raises(ModelError, match="vocabulary"):
        run_update([big], role="agent", model=model, config=UpdateConfig(kl_coef=0.0))
    with pytest.raises(ConfigError):
        run_update(records, role="agent", model=model, config=UpdateConfig(kl_coef=0.1))
    with pytest.raises(ConfigError):
        UpdateConfig(loss_agg="sum")


def test_checkpoint_reloads_with_identical_outputs(setup, tmp_path):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    model, _, records = setup
    policy = copy.deepcopy(model)
    result = run_update(records, role="agent", model=policy, config=UpdateConfig(kl_coef=0.0, lr=1e-3))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=_word_tokenizer())
    out = save_checkpoint(tmp_path / "ckpt", model=policy, tokenizer=tokenizer, config=UpdateConfig(kl_coef=0.0),
                          optimizer=result.optimizer, metrics=result.metrics)
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([records[0].trajectories[0].token_ids])
    with torch.no_grad():
        assert torch.equal(policy(ids).logits, reloaded(ids).logits)
    assert (out / "model.safetensors").is_file() and (out / "optimizer.pt").is_file()


def test_resume_gives_the_same_weights_as_an_uninterrupted_run(setup, tmp_path):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    model, ref, records = setup
    config = UpdateConfig(kl_coef=0.05, lr=1e-3, token_budget=64)
    second = [scored_record("q5", seed=5), scored_record("q6", seed=6)]

    straight = copy.deepcopy(model)
    first = run_update(records, role="agent", model=straight, ref_model=ref, config=config)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=_word_tokenizer())
    ckpt = save_checkpoint(tmp_path / "step1", model=straight, tokenizer=tokenizer, config=config,
                           optimizer=first.optimizer)
    run_update(second, role="agent", model=straight, ref_model=ref, config=config, optimizer=first.optimizer)

    resumed = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    run_update(second, role="agent", model=resumed, ref_model=ref, config=config,
               optimizer_state=load_optimizer_state(ckpt))
    for name, tensor in straight.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name


def _word_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    return Tokenizer(WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))


def test_micro_batch_plan_minimises_padding_within_the_budget():
    from cosearch_cli.update.batch import TrainSeq, plan_micro_batches

    def seqs(*lengths):
        return [TrainSeq(f"s{i}", [5] * n, [0] * n, [0.0] * n, 1.0, 1.0) for i, n in enumerate(lengths)]

    def lengths(plans):
        return [[len(s.token_ids) for s in plan] for plan in plans]

    # overhead 2: [10, 9] + [3, 2] costs 20 + 6 + 2 x 2 = 30; one batch 40 + 2; four singletons 24 + 8 = 32
    assert lengths(plan_micro_batches(seqs(3, 10, 2, 9), 100, overhead=2)) == [[10, 9], [3, 2]]
    # a large per-batch overhead makes one batch cheaper
    assert lengths(plan_micro_batches(seqs(3, 10, 2, 9), 100, overhead=128)) == [[10, 9, 3, 2]]
    # the budget bounds rows x longest row; a sequence longer than the budget goes alone
    assert lengths(plan_micro_batches(seqs(10, 9, 10, 50), 20, overhead=2)) == [[50], [10, 10], [9]]


def test_gradient_checkpointing_gives_the_same_update(setup):
    model, ref, records = setup
    plain, checkpointed = copy.deepcopy(model), copy.deepcopy(model)
    a = run_update(records, role="agent", model=plain, ref_model=ref, config=UpdateConfig(lr=1e-3))
    b = run_update(records, role="agent", model=checkpointed, ref_model=ref,
                   config=UpdateConfig(lr=1e-3, grad_checkpointing=True))
    assert b.metrics["grad_norm"] == pytest.approx(a.metrics["grad_norm"], rel=1e-5)
    for name, tensor in plain.state_dict().items():
        torch.testing.assert_close(checkpointed.state_dict()[name], tensor, rtol=0, atol=1e-6)
