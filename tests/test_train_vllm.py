"""`cosearch train --backend vllm`: engines loaded again from every new checkpoint (runs only where vLLM is)."""

from __future__ import annotations

import pytest

from cosearch_cli.generation.vllm import vllm_available
from test_train import _config, tiny_model_dir  # noqa: F401  (fixture)

REASON = vllm_available()


@pytest.mark.skipif(REASON is None, reason="vLLM is installed here")
def test_a_vllm_run_without_vllm_is_refused_before_any_work(cli, tmp_path):
    result = cli("train", "--preset", "demo", "--backend", "vllm", "--out", tmp_path / "runs", "--quiet")
    assert result.exit_code == 5 and "vllm is not importable" in result.stderr
    assert not (tmp_path / "runs" / "demo" / "config.toml").exists()  # no run was started (a lock may be)


@pytest.mark.slow
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_train_with_vllm_reloads_the_engine_from_each_checkpoint(tmp_path, tiny_model_dir):  # noqa: F811
    from cosearch_cli.train import Runner, current_models

    config = _config(tmp_path, tiny_model_dir, backend="vllm", constrain="none", iterations=2, kl_coef=0.0,
                     eval_init=False, agent_gpu_fraction=0.2, ranker_gpu_fraction=0.2)
    runner = Runner(config)
    root = runner.run()
    assert (root / "iter-0001" / "metrics.json").is_file()
    latest = current_models(runner.paths, config, config.iterations)
    # the engines in memory are those of the newest checkpoints (or the initial model when nothing trained)
    assert set(runner._loaded) == {latest.agent, latest.ranker}
    assert all(type(engine).__name__ == "VLLMBackend" for engine in runner._loaded.values())


def test_rollout_gpu_fraction_is_checked_before_anything_loads(cli, tmp_path):
    result = cli("rollout", "--questions", "fixtures/train.jsonl", "--index", tmp_path / "none", "--backend",
                 "vllm", "--gpu-fraction", "1.5")
    assert result.exit_code == 4 and "--gpu-fraction 1.5" in result.stderr
