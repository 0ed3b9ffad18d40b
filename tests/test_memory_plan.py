"""The memory plan and `cosearch train --dry-run`: hand-computed arithmetic, refusals, no model loaded."""

import orjson
import pytest

from cosearch_cli.errors import ConfigError, ModelError
from cosearch_cli.memory_plan import (GIB, KNOWN, ModelShape, engine_plan, layer_activation_bytes, model_shape,
                                      plan_training, refusal, trainer_activation_bytes, trainer_plan)
from cosearch_cli.train import TrainConfig, load_config

# 2 layers, hidden 4, MLP 8, vocab 10, 2 heads with one KV head (kv_dim 2), tied embeddings, no bias.
TOY = ModelShape("toy", layers=2, hidden=4, intermediate=8, vocab=10, heads=2, kv_heads=1, tied=True, qkv_bias=False)


def test_parameter_counts_match_the_published_sizes():
    # per layer: attention 2*4*4 + 2*4*2 = 48, MLP 3*4*8 = 96, two norms 8 -> 152; x2 + embeddings 40 + norm 4
    assert TOY.params == 348
    # Qwen2.5-7B: 28 x 233,057,792 + 2 x 152064 x 3584 + 3584 (the model card's 7.61B)
    assert KNOWN["Qwen/Qwen2.5-7B-Instruct"].params == 7_615_616_512
    assert KNOWN["Qwen/Qwen2.5-3B-Instruct"].params == 3_085_938_688
    assert KNOWN["smollm2"].params == 134_515_008


def test_shape_from_a_folder_counts_the_real_models_parameters(tiny_lm, tmp_path):
    model, _ = tiny_lm
    model.config.save_pretrained(tmp_path)
    assert model_shape(str(tmp_path)).params == sum(p.numel() for p in model.parameters())
    with pytest.raises(ModelError, match="no config.json"):
        model_shape(str(tmp_path / "missing"))


def test_trainer_bytes_hand_computed():
    c = TrainConfig(dtype="bfloat16")
    one = trainer_plan(TOY, c, world=1, tokens=100)
    # fp32 master weights + the bf16 casts autocast keeps (tied: every weight); fp32 grads + 2 moments
    assert (one.weights, one.optimizer) == (348 * 4 + 348 * 2, 348 * 12)
    assert trainer_plan(TOY, TrainConfig(), world=1, tokens=100).weights == 348 * 4  # fp32: no working copy
    untied = ModelShape("untied", layers=2, hidden=4, intermediate=8, vocab=10, heads=2, kv_heads=1, tied=False,
                        qkv_bias=False)
    # untied: the input embedding (10 x 4) is looked up, never cast
    assert trainer_plan(untied, c, world=1, tokens=100).weights == 388 * 4 + (388 - 40) * 2
    two = trainer_plan(TOY, c, world=2, tokens=100)
    # half the fp32 state each; FSDP gathers two layers (2 x 152) and the root's 44 in bf16
    assert (two.weights, two.optimizer) == (696 + (2 * 152 + 44) * 2, 2088)
    # bf16 per token and layer: norms 2 x 2 x 4 x 4 = 64 (fp32); linear inputs 2 x (6 x 4 + 8) = 64; q, k, v,
    # k and v repeated, attention output 2 x (4 + 2 x 2 + 2 x 4 + 4) = 40; MLP 3 x 2 x 8 = 48 -> 216 bytes
    assert layer_activation_bytes(TOY, 2) == 216
    # fp32: norms 64; shared inputs 4 x (3 x 4 + 8) = 80; attention 4 x 20 = 80; MLP 3 x 4 x 8 = 96 -> 320
    assert layer_activation_bytes(TOY, 4) == 320
    # logits 10 x (2 + 8) per token
    assert trainer_activation_bytes(TOY, 100, 2, checkpointing=False) == 100 * 2 * 216 + 100 * 100
    # fp32 adds the attention probabilities: 2 heads x 50 (the longest row) x 4 bytes per token; logits 10 x 12
    assert trainer_activation_bytes(TOY, 100, 4, checkpointing=False, longest=50) == 100 * 2 * (320 + 400) + 100 * 120
    # checkpointing keeps each layer's fp32 input (4 x 4 bytes) plus one layer being recomputed
    assert trainer_activation_bytes(TOY, 100, 2, checkpointing=True) == 100 * 2 * 16 + 100 * 216 + 100 * 100
    offloaded = trainer_plan(TOY, TrainConfig(dtype="bfloat16", offload=True), world=1, tokens=100)
    assert (offloaded.weights, offloaded.optimizer, offloaded.host) == ((2 * 152 + 44) * 2, 0, 348 * 16)


def test_vllm_share_and_hf_kv_cache_hand_computed():
    shape = KNOWN["Qwen/Qwen2.5-7B-Instruct"]
    c = TrainConfig(dtype="bfloat16", backend="vllm", agent_gpu_fraction=0.3)
    agent = engine_plan("agent", shape, c, gpu_bytes=80 * GIB, context=9180, rows=512)
    assert agent.gpu == int(0.3 * 80 * GIB)
    # (24 GiB - 2 x 7,615,616,512 - 2 GiB overhead) // (2 x 28 layers x 512 x 2 bytes) tokens
    assert "KV cache for 146328 tokens, 15 sequences" in agent.note
    hf = engine_plan("agent", shape, TrainConfig(dtype="bfloat16"), gpu_bytes=80 * GIB, context=100, rows=3)
    assert (hf.weights, hf.activations) == (2 * 7_615_616_512, 3 * 100 * 57_344)
    small = engine_plan("agent", shape, c, gpu_bytes=40 * GIB, context=9180, rows=512)
    assert "cannot hold the weights" in small.problem


def test_paper_7b_fits_one_80_gib_gpu_and_float32_is_refused_with_numbers_and_a_fix():
    plan = plan_training(load_config(preset="paper-7b"), gpus=1, gpu_bytes=80 * GIB)
    assert [r.role for r in plan.roles] == ["agent", "ranker", "ref", "trainer"]
    assert plan.fits and plan.total < 80 * GIB
    config = load_config(preset="paper-7b", offload=False)
    plan = plan_training(config, gpus=1, gpu_bytes=80 * GIB)
    assert not plan.fits
    error = refusal(plan, config)
    assert "on cuda:0" in error.message and "80.0 GiB" in error.message
    assert "offload = true" in error.fix and "torchrun FSDP over" in error.fix


def test_dry_run_prints_every_stage_and_the_plan_without_loading_a_model(cli, tmp_path):
    result = cli("train", "--preset", "paper-7b", "--dry-run", "--out", str(tmp_path / "runs"))
    assert result.exit_code == 0, result.stderr
    out = orjson.loads(result.stdout)
    assert out["stages"]["rollout"]["ranker_max_new_tokens"] == 256
    assert out["stages"]["rollout"]["question_chunk"] == 64 and out["stages"]["evaluate"]["n"] == 1
    assert out["stages"]["update"]["lr"] == 1e-6 and out["stages"]["group"]["kmin"] == 3
    assert out["memory"]["fits"] and [r["role"] for r in out["memory"]["roles"]][-1] == "trainer"
    assert not (tmp_path / "runs").exists()
    small = tmp_path / "small.toml"
    small.write_text("gpu_memory_gib = 40.0\n")
    refused = cli("train", "--preset", "paper-7b", "--config", str(small), "--dry-run")
    assert refused.exit_code == 4
    assert "40.0 GiB" in refused.stderr and "DOES NOT FIT" in refused.stderr


def test_cpu_run_has_no_plan_and_a_missing_gpu_is_refused():
    from cosearch_cli.dry_run import check_memory

    assert check_memory(TrainConfig(device="cpu")) is None
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="sees no GPU"):
            check_memory(TrainConfig(device="cuda"))


def test_split_placement_puts_engines_and_trainer_on_two_gpus():
    shared = plan_training(load_config(preset="paper-7b"), gpus=2, gpu_bytes=80 * GIB)
    split = plan_training(load_config(preset="paper-7b", placement="split"), gpus=2, gpu_bytes=80 * GIB)
    assert {r.gpu_index for r in shared.roles} == {0}
    assert [(r.role, r.gpu_index) for r in split.roles] == [("agent", 0), ("ranker", 0), ("ref", 1), ("trainer", 1)]
    # the busiest GPU of the split plan holds the two engines only: 2 x int(0.3 x 80 GiB)
    assert split.total == 2 * int(0.3 * 80 * GIB) and split.used(1) == shared.total - split.total
    assert split.to_dict()["per_gpu_gib"] == {"0": 48.0, "1": round(split.used(1) / GIB, 2)}
    one_gpu = plan_training(load_config(preset="paper-7b", placement="split"), gpus=1, gpu_bytes=80 * GIB)
    assert not one_gpu.fits and "needs 2 GPUs" in refusal(one_gpu, load_config(preset="paper-7b")).message


def test_split_placement_sends_reference_and_trainer_to_the_second_gpu():
    from cosearch_cli.train import Runner

    runner = Runner(TrainConfig(device="cuda", placement="split"))
    assert (runner.engine_device, runner.trainer_device) == ("cuda:0", "cuda:1")
    shared = Runner(TrainConfig(device="cpu"))
    assert (shared.engine_device, shared.trainer_device) == ("cpu", "cpu")


def test_update_plan_hand_computed_and_refused_with_fixes():
    from cosearch_cli.memory_plan import UpdateSettings, plan_update, update_refusal

    u = UpdateSettings(dtype="bfloat16", token_budget=100, kl_coef=0.001)
    plan = plan_update(TOY, u, gpu_bytes=GIB, world=2, longest=150, trained=0.5)
    ref, trainer = plan.roles
    assert (ref.role, ref.weights) == ("ref", 348 * 2)  # frozen bf16 copy
    # half of 348 x 16 bytes on each of 2 ranks, plus the gathered bf16 layers and root
    assert (trainer.weights, trainer.optimizer) == (696 + 696, 2088)
    # the longest sequence (150 tokens) is its own micro-batch: 150 x 2 layers x 216 bytes + 75 logit rows x 100
    assert trainer.activations == 150 * 2 * 216 + 75 * 100
    assert plan.total == 696 + 1392 + 2088 + 64800 + 7500 and plan.fits
    assert "longest sequence has 150 tokens" in plan.notes[0]
    small = plan_update(TOY, u, gpu_bytes=40_000, world=1, longest=150, trained=0.5)
    assert not small.fits
    error = update_refusal(small, u, world=1)
    assert "needs" in str(error) and "--offload" in error.fix and "--grad-checkpointing" in error.fix
