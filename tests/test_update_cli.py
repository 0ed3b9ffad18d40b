"""`cosearch update` driven like a user: checkpoint layout, metrics on stdout, resume, LoRA, bad input."""

from __future__ import annotations

import json

import orjson
import pytest
import torch

from cosearch_cli.artifacts import dumps
from test_update_support import scored_record, tiny_llama


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from cosearch_cli.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    folder = tmp_path_factory.mktemp("models") / "tiny"
    tiny_llama(len(tokenizer), seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "scored.jsonl"
    path.write_bytes(b"".join(dumps(scored_record(f"q{i}", seed=i, vocab=49152)) for i in range(2)))
    return path


def metrics_of(result) -> dict:
    lines = [orjson.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert lines[-1]["kind"] == "manifest" and lines[-1]["stage"] == "update"
    return lines[0]


def test_agent_update_writes_a_plain_checkpoint(cli, tiny_folder, scored, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "step1"
    result = cli("update", "--role", "agent", "--model", tiny_folder, "--out", out, "--lr", "1e-3", scored)
    assert result.exit_code == 0, result.stderr
    metrics = metrics_of(result)
    assert metrics["kind"] == "update_metrics" and metrics["step"] == 1 and not metrics["skipped"]
    for key in ("loss", "kl", "clip_frac", "entropy", "grad_norm", "tokens", "seconds"):
        assert isinstance(metrics[key], (int, float)), key
    assert metrics["sequences"] == 8  # two questions x four trajectories, all in kept groups
    files = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "cosearch_update.json", "optimizer.pt",
            "metrics.json", "manifest.json"} <= files
    info = json.loads((out / "cosearch_update.json").read_text())
    assert info["config"]["lr"] == 1e-3 and info["config"]["kl_coef"] == 0.001 and info["role"] == "agent"
    assert info["ref"] == str(tiny_folder)
    model = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(tiny_folder)
    assert not torch.equal(model.lm_head.weight, base.lm_head.weight)
    assert AutoTokenizer.from_pretrained(out).vocab_size == AutoTokenizer.from_pretrained(tiny_folder).vocab_size

    resumed = cli("update", "--resume", out, "--out", tmp_path / "step2", "--lr", "1e-3", scored)
    assert resumed.exit_code == 0, resumed.stderr
    assert metrics_of(resumed)["step"] == 2
    assert json.loads((tmp_path / "step2" / "cosearch_update.json").read_text())["ref"] == str(tiny_folder)


def test_ranker_update_and_kl_off(cli, tiny_folder, scored, tmp_path):
    result = cli("update", "--role", "ranker", "--model", tiny_folder, "--kl-coef", "0", "--out", tmp_path / "r",
                 "--loss-agg", "seq-mean-token-mean", scored)
    assert result.exit_code == 0, result.stderr
    metrics = metrics_of(result)
    assert metrics["role"] == "ranker" and metrics["kl"] is None and metrics["sequences"] == 6


def test_lora_merged_and_adapter(cli, tiny_folder, scored, tmp_path):
    from transformers import AutoModelForCausalLM

    merged = cli("update", "--model", tiny_folder, "--lora", "4", "--merge-lora", "--lr", "1e-2",
                 "--out", tmp_path / "merged", scored)
    assert merged.exit_code == 0, merged.stderr
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    base = AutoModelForCausalLM.from_pretrained(tiny_folder)
    assert not any("lora" in name for name in model.state_dict())
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(model.state_dict()[q], base.state_dict()[q])

    adapter = cli("update", "--model", tiny_folder, "--lora", "4", "--out", tmp_path / "adapter", scored)
    assert adapter.exit_code == 0, adapter.stderr
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    again = cli("update", "--resume", tmp_path / "adapter", "--out", tmp_path / "adapter2", scored)
    assert again.exit_code == 0, again.stderr


def test_no_trainable_groups_writes_nothing(cli, tiny_folder, tmp_path):
    path = tmp_path / "dropped.jsonl"
    path.write_bytes(dumps(scored_record("q1", seed=1, vocab=49152, kept=False)))
    result = cli("update", "--model", tiny_folder, "--out", tmp_path / "out", path)
    assert result.exit_code == 7
    assert "no trainable agent sequences" in result.stderr
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_overwrite(cli, tiny_folder, scored, tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    result = cli("update", "--model", tiny_folder, "--out", out, scored)
    assert result.exit_code == 8 and "--overwrite" in result.stderr
    assert (out / "keep.txt").is_file()
    result = cli("update", "--model", tiny_folder, "--out", out, "--overwrite", "--kl-coef", "0", scored)
    assert result.exit_code == 0, result.stderr
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()


def test_vocab_mismatch_is_a_model_error(cli, tiny_folder, tmp_path):
    record = scored_record("q1", seed=1, vocab=49152)
    record.trajectories[0].token_ids[2] = 60_000
    path = tmp_path / "big.jsonl"
    path.write_bytes(dumps(record))
    result = cli("update", "--model", tiny_folder, "--out", tmp_path / "out", path)
    assert result.exit_code == 5 and "60000" in result.stderr and "vocabulary" in result.stderr
    assert not (tmp_path / "out").exists()


def test_unscored_records_and_bad_options(cli, tiny_folder, tmp_path):
    record = scored_record("q1", seed=1, vocab=49152)
    record.stage = "grouped"
    path = tmp_path / "grouped.jsonl"
    path.write_bytes(dumps(record))
    result = cli("update", "--model", tiny_folder, "--out", tmp_path / "out", path)
    assert result.exit_code == 3 and "cosearch reward" in result.stderr
    bad = cli("update", "--model", tiny_folder, "--out", tmp_path / "out", "--loss-agg", "sum", path)
    assert bad.exit_code == 4 and "token-mean" in bad.stderr


def test_an_empty_output_folder_is_used(cli, tiny_folder, scored, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    result = cli("update", "--model", tiny_folder, "--kl-coef", "0", "--out", out, scored)
    assert result.exit_code == 0, result.stderr
    assert (out / "model.safetensors").is_file()


@pytest.fixture(scope="module")
def embedded_like_folder(tmp_path_factory):
    """The tiny model marked as load_causal_lm marks the embedded SmolLM2 (mark_base with name "smollm2")."""
    from cosearch_cli.models import load_tokenizer, mark_base

    tokenizer = load_tokenizer("smollm2")
    model = tiny_llama(len(tokenizer), seed=0)
    mark_base(model, "smollm2")
    folder = tmp_path_factory.mktemp("models") / "tiny-smollm2"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_constrain_auto_follows_checkpoints_of_the_embedded_model(cli, embedded_like_folder, tiny_folder, scored,
                                                                   tmp_path):
    from cosearch_cli.generation.hf import HFBackend
    from cosearch_cli.models import load_causal_lm, lm_base
    from cosearch_cli.rollout import constraint_factories

    assert json.loads((embedded_like_folder / "config.json").read_text())["cosearch_base"] == "smollm2"
    first = cli("update", "--model", embedded_like_folder, "--kl-coef", "0", "--out", tmp_path / "g1", scored)
    assert first.exit_code == 0, first.stderr
    second = cli("update", "--resume", tmp_path / "g1", "--out", tmp_path / "g2", scored)
    assert second.exit_code == 0, second.stderr
    adapter = cli("update", "--model", tmp_path / "g2", "--lora", "4", "--kl-coef", "0", "--out",
                  tmp_path / "lora", scored)
    assert adapter.exit_code == 0, adapter.stderr
    other = cli("update", "--model", tiny_folder, "--kl-coef", "0", "--out", tmp_path / "other", scored)
    assert other.exit_code == 0, other.stderr
    for generation in ("g1", "g2", "lora"):  # a checkpoint of a checkpoint, and an adapter through its base
        assert lm_base(str(tmp_path / generation)) == "smollm2", generation
    assert lm_base(str(tiny_folder)) is None and lm_base(str(tmp_path / "other")) is None

    backend = HFBackend(*load_causal_lm(str(tmp_path / "g2")))
    agent_c, ranker_c = constraint_factories("auto", str(tmp_path / "g2"), backend, backend)
    assert agent_c is not None and ranker_c is not None  # before: on only for the name "smollm2"
    assert constraint_factories("auto", str(tmp_path / "other"), backend, backend) == (None, None)
    # agent and ranker are judged by their own models
    agent_c, ranker_c = constraint_factories("auto", str(tmp_path / "other"), backend, backend, str(tmp_path / "g2"))
    assert agent_c is None and ranker_c is not None
    assert constraint_factories("none", str(tmp_path / "g2"), backend, backend) == (None, None)


def test_loading_the_embedded_model_marks_it(tmp_path, monkeypatch):
    """`smollm2` resolves to its cached conversion; a tiny model stands in for it there (nothing converted)."""
    from cosearch_cli.models import load_causal_lm, load_tokenizer, lm_base

    tokenizer = load_tokenizer("smollm2")
    monkeypatch.setenv("COSEARCH_CACHE", str(tmp_path))
    cached = tmp_path / "smollm2-135m-instruct"
    tiny_llama(len(tokenizer), seed=0).save_pretrained(cached)
    tokenizer.save_pretrained(cached)
    assert "cosearch_base" not in json.loads((cached / "config.json").read_text())
    assert lm_base(str(cached)) == "smollm2"  # the cache itself is the embedded model
    model, _ = load_causal_lm("smollm2")
    assert model.config.cosearch_base == "smollm2"
    model.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["cosearch_base"] == "smollm2"
