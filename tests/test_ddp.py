"""Two processes under torchrun (gloo on this CPU) give the same update as one process on the same batch."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import torch
from safetensors.torch import load_file

from cosearch_cli.artifacts import dumps
from test_update_support import scored_record, tiny_llama


def _torchrun() -> str:
    found = Path(sys.executable).with_name("torchrun")
    return str(found) if found.is_file() else shutil.which("torchrun")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from cosearch_cli.models import load_tokenizer

    root = tmp_path_factory.mktemp("ddp")
    tokenizer = load_tokenizer("smollm2")
    tiny_llama(len(tokenizer), seed=0).save_pretrained(root / "tiny")
    tokenizer.save_pretrained(root / "tiny")
    # 3 questions x 4 trajectories of different lengths: ranks get unequal numbers of micro-batches
    records = [scored_record(f"q{i}", seed=i, vocab=49152, lengths=(12 + i, 17, 9 + 2 * i, 30 - i)) for i in range(3)]
    (root / "scored.jsonl").write_bytes(b"".join(dumps(r) for r in records))
    return root


@pytest.mark.parametrize("parallel", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_two_gloo_processes_equal_one(cli, setup, parallel):
    root = setup
    options = ["--model", root / "tiny", "--lr", "1e-3", "--kl-coef", "0.01", "--token-budget", "40",
               "--loss-agg", "seq-mean-token-mean", "--parallel", parallel, root / "scored.jsonl"]
    single = cli("update", "--out", root / f"single-{parallel}", *options)
    assert single.exit_code == 0, single.stderr

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [_torchrun(), "--standalone", "--nproc_per_node", "2", "-m", "cosearch_cli", "update",
               "--out", str(root / parallel), *map(str, options)]
    # own session, so a hung run's workers are killed with torchrun rather than left behind
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, stderr[-3000:]

    one = orjson.loads(single.stdout.splitlines()[0])
    two = orjson.loads(stdout.splitlines()[0])
    assert two["world_size"] == 2 and one["world_size"] == 1
    for key in ("loss", "kl", "clip_frac", "entropy", "grad_norm"):
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-8), key
    assert two["tokens"] == one["tokens"] and two["sequences"] == one["sequences"]

    a = load_file(root / f"single-{parallel}" / "model.safetensors")
    b = load_file(root / parallel / "model.safetensors")
    base = load_file(root / "tiny" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert not torch.equal(a[name], base[name]) or name.endswith("norm.weight"), f"{name} did not move"
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=2e-6, msg=name)
