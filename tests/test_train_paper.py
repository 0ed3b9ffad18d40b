"""The paper presets of `cosearch train`: every rollout budget and update setting they hand the stages."""

from dataclasses import fields

import pytest

from cosearch_cli import rollout
from cosearch_cli.train import Runner, TrainConfig, load_config, update_settings
from test_train import tiny_model_dir  # noqa: F401  (fixture)


def test_paper_presets_hand_the_rollout_exactly_the_rollout_paper_preset():
    for name in ("paper-7b", "paper-3b"):
        handed = Runner(load_config(preset=name))._rollout_config(None, None, greedy=False, seed=5)
        expected = rollout.preset("paper", seed=5)
        assert handed.sampling() == expected.sampling(), name
        assert (handed.ranker_max_new_tokens, handed.passage_tokens, handed.ranker_passage_tokens,
                handed.question_chunk, handed.n, handed.k, handed.top_n, handed.max_turns,
                handed.max_new_tokens) == (256, 160, 128, 64, 8, 5, 50, 6, 500)


def test_paper_presets_update_with_the_settings_of_method_md():
    for name in ("paper-7b", "paper-3b"):
        settings = update_settings(load_config(preset=name), iteration=0)
        assert (settings.lr, settings.clip_low, settings.clip_high, settings.kl_coef, settings.loss_agg,
                settings.max_grad_norm) == (1e-6, 0.2, 0.2, 0.001, "token-mean", 1.0), name
    assert load_config(preset="paper-7b").temperature == 1.0


def test_cpu_defaults_keep_the_rollout_stage_defaults():
    runner = Runner(TrainConfig(constrain="none"))
    sampled = runner._rollout_config(None, None, greedy=False, seed=0)
    default = rollout.RolloutConfig()
    shared = ("ranker_max_new_tokens", "passage_tokens", "ranker_passage_tokens", "question_chunk")
    assert {f: getattr(sampled, f) for f in shared} == {f: getattr(default, f) for f in shared}
    assert {f.name for f in fields(TrainConfig)} >= set(shared)
    greedy = runner._rollout_config(None, None, greedy=True, seed=0)
    # a greedy evaluation rolls out one trajectory per question, 4 x 8 questions at once: the same 32 rows
    assert (greedy.n, greedy.question_chunk, sampled.n * sampled.question_chunk) == (1, 32, 32)


def test_update_settings_follow_the_engine_and_precision():
    cpu = update_settings(TrainConfig(), 0, "cpu")
    assert (cpu.dtype, cpu.recompute_old, cpu.parallel, cpu.offload) == ("float32", False, "ddp", False)
    bf16 = update_settings(TrainConfig(dtype="bfloat16"), 0, "cpu")
    assert bf16.dtype == "bfloat16" and bf16.recompute_old  # a bf16 engine is not the trainer's numerics
    paper = update_settings(load_config(preset="paper-7b"), 0, "cuda")
    assert (paper.recompute_old, paper.parallel, paper.offload, paper.grad_checkpointing) == (True, "fsdp", True,
                                                                                              True)
    forced = update_settings(TrainConfig(recompute_logprobs="on", tis_cap=2.0), 0, "cpu")
    assert forced.recompute_old and forced.tis_cap == 2.0
    assert not update_settings(load_config(preset="paper-7b", recompute_logprobs="off"), 0, "cuda").recompute_old


def test_bf16_update_in_the_loop_recomputes_old_logprobs_and_logs_the_gap(tmp_path, tiny_model_dir):
    from test_train import _config
    from test_update_support import scored_record

    records = [scored_record("q1", seed=1, vocab=49152, ranker=False)]
    bf16 = Runner(_config(tmp_path / "a", tiny_model_dir, dtype="bfloat16", kl_coef=0.0))
    metrics = bf16.update("agent", records, str(tiny_model_dir), tmp_path / "a" / "agent", 0)
    assert metrics["dtype"] == "bfloat16" and metrics["logprob_gap_abs"] > 0 and metrics["logprob_gap_kl"] >= 0
    assert metrics["ratio"] == pytest.approx(1.0, abs=1e-6)  # old log-probs are the trainer's own
    fp32 = Runner(_config(tmp_path / "b", tiny_model_dir, kl_coef=0.0))
    metrics = fp32.update("agent", records, str(tiny_model_dir), tmp_path / "b" / "agent", 0)
    assert metrics["dtype"] == "float32" and "logprob_gap_abs" not in metrics  # the CPU default, unchanged
