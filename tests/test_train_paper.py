"""The paper presets of `cosearch train`: every rollout budget and update setting they hand the stages."""

from dataclasses import fields

from cosearch_cli import rollout
from cosearch_cli.train import Runner, TrainConfig, load_config, update_settings


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
    handed = Runner(TrainConfig(constrain="none"))._rollout_config(None, None, greedy=True, seed=0)
    default = rollout.RolloutConfig()
    shared = ("ranker_max_new_tokens", "passage_tokens", "ranker_passage_tokens", "question_chunk")
    assert {f: getattr(handed, f) for f in shared} == {f: getattr(default, f) for f in shared}
    assert handed.n == 1  # a greedy evaluation rolls out one trajectory per question
    assert {f.name for f in fields(TrainConfig)} >= set(shared)
