"""Data safety under abuse (issue 16, items 7-13): concurrent writers, cut streams, non-finite numbers,
leftover temporaries, huge inputs, damaged indexes, closed pipes and interrupts. Each case drives the real
command (in-process, or as a subprocess where a signal or a pipe is the point) and checks the exit code and
the one-line message the README's table promises."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import orjson
import polars as pl
import pytest
from conftest import FIXTURES, ROOT, run_cli

from cosearch_cli.artifacts import Reader, Writer, dumps, make_manifest, output_lock, sweep_temporaries
from cosearch_cli.errors import ConfigError, OutputExists, RecordError
from test_update_support import scored_record


def one_line(result) -> str:
    """The one error line (progress and info lines from other features may surround it; no traceback)."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return errors[0]


def dead_pid() -> int:
    """The id of a process that has finished (what a run killed with -9 leaves in its temporaries' names)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def passages(path: Path, n: int = 6) -> Path:
    path.write_bytes(b"".join(orjson.dumps({"id": f"p{i}", "title": f"T{i}", "text": f"word{i} shared text"})
                              + b"\n" for i in range(n)))
    return path


def rollout_lines(n: int = 2) -> bytes:
    """`n` rollout-stage records (the scored fixture records, reset to stage rollout)."""
    out = []
    for i in range(n):
        data = orjson.loads(dumps(scored_record(f"q{i}", seed=i)))
        data.update(stage="rollout", groups=[])
        for t in data["trajectories"]:
            t.update(group=None, reward=None, advantage=None, scores={})
        out.append(orjson.dumps(data) + b"\n")
    return b"".join(out)


# ---------------------------------------------------------------------------------------------------------
# 7. Concurrent writers


def test_second_index_build_into_a_folder_being_built_is_refused(tmp_path):
    corpus, out = passages(tmp_path / "c.jsonl"), tmp_path / "idx"
    with output_lock(out):  # what a first `index build --out idx` holds while it runs
        result = run_cli("index", "build", "--corpus", corpus, "--out", out, "--quiet")
    assert result.exit_code == 8 and "is being written by another cosearch process" in one_line(result)
    assert not out.exists()
    assert run_cli("index", "build", "--corpus", corpus, "--out", out, "--quiet").exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "idx"]  # lock file gone with the run


def test_index_made_by_someone_else_during_the_build_is_not_replaced(tmp_path):
    from cosearch_cli.index import Corpus, build_index

    out = tmp_path / "idx"

    def meanwhile(phase: str, n: int) -> None:  # another writer (without the lock) finishes first
        out.mkdir(exist_ok=True)
        (out / "theirs.txt").write_text("finished index")

    with pytest.raises(OutputExists):
        build_index(Corpus([str(passages(tmp_path / "c.jsonl"))]), out, on_progress=meanwhile)
    assert [p.name for p in out.iterdir()] == ["theirs.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "idx"]


def test_second_train_on_a_running_run_folder_is_refused(tmp_path):
    with output_lock(tmp_path / "runs" / "demo"):
        result = run_cli("train", "--out", tmp_path / "runs", "--name", "demo")
    assert result.exit_code == 8 and "runs/demo is being written by another cosearch process" in one_line(result)


def test_second_update_into_a_checkpoint_being_written_is_refused(tmp_path):
    scored = tmp_path / "s.jsonl"
    scored.write_bytes(dumps(scored_record("q0")))
    with output_lock(tmp_path / "ckpt"):  # before any model loads
        result = run_cli("update", scored, "--model", "smollm2", "--out", tmp_path / "ckpt")
    assert result.exit_code == 8 and "ckpt is being written by another cosearch process" in one_line(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]


def test_lock_is_released_and_reusable():
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "out"
        with output_lock(target):
            assert (Path(folder) / ".out.lock").read_text() == str(os.getpid())
        with output_lock(target):
            pass
        assert list(Path(folder).iterdir()) == []


# ---------------------------------------------------------------------------------------------------------
# 8. Truncated streams


def test_cut_stream_is_refused_unless_allowed_and_then_marked_partial(tmp_path):
    stream = rollout_lines()  # no manifest line at the end: the rollout upstream died
    result = run_cli("group", "-", input=stream)
    assert result.exit_code == 3 and result.stdout == ""
    assert "<stdin>: the input stream ended without a manifest line" in one_line(result)
    whole = run_cli("group", "-", input=stream + dumps(make_manifest("rollout", {})))
    assert whole.exit_code == 0 and "partial" not in orjson.loads(whole.stdout.splitlines()[-1])
    partial = run_cli("group", "-", "--allow-partial", input=stream)
    assert partial.exit_code == 0
    manifest = orjson.loads(partial.stdout.splitlines()[-1])
    assert manifest["kind"] == "manifest" and manifest["partial"]["inputs"] == ["<stdin>"]
    assert len(partial.stdout.splitlines()) == 3  # two records and the manifest


# ---------------------------------------------------------------------------------------------------------
# 9. Non-finite numbers


@pytest.mark.parametrize("key, value", [("lr", "nan"), ("lr", "inf"), ("temperature", "nan"), ("kl_coef", "inf")])
def test_non_finite_train_config_is_refused(tmp_path, key, value):
    config = tmp_path / "train.toml"
    config.write_text(f"{key} = {value}\n")
    result = run_cli("train", "--config", config, "--out", tmp_path / "runs")
    assert result.exit_code == 4 and f"config key {key!r} must be a finite number" in one_line(result)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args", [["--lr", "nan"], ["--lr", "inf"], ["--clip-high", "nan"], ["--kl-coef", "nan"],
                                  ["--max-grad-norm", "inf"]])
def test_non_finite_update_options_are_refused(tmp_path, args):
    scored = tmp_path / "s.jsonl"
    scored.write_bytes(dumps(scored_record("q0")))
    result = run_cli("update", scored, "--model", "smollm2", "--out", tmp_path / "ckpt", *args)
    assert result.exit_code == 4 and "must be a finite number" in one_line(result)


@pytest.mark.parametrize("args", [["--gamma", "nan"], ["--format-penalty", "inf"], ["--eps", "nan"]])
def test_non_finite_reward_options_are_refused(tmp_path, args):
    grouped = tmp_path / "g.jsonl"
    grouped.write_bytes(dumps(scored_record("q0")))
    result = run_cli("reward", grouped, *args)
    assert result.exit_code == 4 and ("must be a finite number" in one_line(result) or "--eps" in one_line(result))


def test_nan_temperature_is_refused_by_rollout(tmp_path):
    result = run_cli("rollout", "--questions", FIXTURES / "dev.jsonl", "--index", tmp_path, "--temperature", "nan")
    assert result.exit_code == 4 and "temperature must be a positive finite number" in one_line(result)


def test_nan_in_jsonl_names_file_line_and_field(tmp_path):
    data = orjson.loads(dumps(scored_record("q0")))
    data["trajectories"][1]["logprobs"][5] = math.nan
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(data) + "\n")  # Python's json writes NaN, orjson does not read it
    result = run_cli("update", path, "--model", "smollm2", "--out", tmp_path / "ckpt")
    assert result.exit_code == 3
    assert f"{path}:1: field trajectories[1].logprobs[5] (nan) is not a finite number" in one_line(result)


def test_inf_advantage_in_parquet_names_file_row_and_field(tmp_path):
    records = [orjson.loads(dumps(scored_record(f"q{i}", seed=i))) for i in range(2)]
    records[1]["trajectories"][2]["advantage"] = math.inf
    path = tmp_path / "s.parquet"
    pl.DataFrame([{k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in r.items()}
                  for r in records]).write_parquet(path, metadata={"cosearch.json_columns": json.dumps(
                      [k for k, v in records[0].items() if isinstance(v, (dict, list))])})
    with pytest.raises(RecordError, match=r":2: field trajectories\[2\]\.advantage \(inf\) is not a finite"):
        list(Reader.open(path).rows())
    result = run_cli("update", path, "--model", "smollm2", "--out", tmp_path / "ckpt")
    assert result.exit_code == 3 and "trajectories[2].advantage (inf)" in one_line(result)


def test_skipped_update_writes_no_checkpoint(tmp_path):
    """A finite but huge advantage overflows the loss: the step is skipped, exit 7, nothing written."""
    from test_update_cli import metrics_of
    from test_update_support import tiny_llama

    from cosearch_cli.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    model = tmp_path / "tiny"
    tiny_llama(len(tokenizer), seed=0).save_pretrained(model)
    tokenizer.save_pretrained(model)
    scored = tmp_path / "s.jsonl"
    scored.write_bytes(dumps(scored_record("q0", advantages=(1e300, -1e300, 1e300, -1e300), vocab=49152)))
    result = run_cli("update", scored, "--model", model, "--out", tmp_path / "ckpt", "--kl-coef", "0")
    assert result.exit_code == 7, result.stderr
    assert "the update was skipped (non-finite" in result.stderr and "no checkpoint was written" in result.stderr
    assert metrics_of(result)["skipped"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl", "tiny"]


def test_trajectory_without_tokens_is_refused_not_dropped():
    from cosearch_cli.update.batch import training_sequences

    record = scored_record("q0")
    record.trajectories[2].token_ids, record.trajectories[2].loss_mask, record.trajectories[2].logprobs = [], [], []
    with pytest.raises(RecordError, match="question q0 sample 2: the sequence has no token ids"):
        training_sequences([record], "agent")


def test_non_finite_update_config_in_code():
    from cosearch_cli.update import UpdateConfig

    with pytest.raises(ConfigError, match="lr must be a finite number, got nan"):
        UpdateConfig(lr=math.nan)


# ---------------------------------------------------------------------------------------------------------
# 10. Leftovers


def test_temporaries_of_dead_processes_are_swept_live_ones_kept(tmp_path):
    dead, live = dead_pid(), os.getppid()
    (tmp_path / f".out.jsonl.tmp-{dead}").write_text("half")
    (tmp_path / f".curves.png.tmp-{dead}.png").write_text("half")
    (tmp_path / f".agent.tmp-{dead}").mkdir()
    (tmp_path / f".agent.tmp-{dead}" / "model.safetensors").write_text("335 MB once")
    (tmp_path / f".idx.old-{dead}").mkdir()
    (tmp_path / f".other.jsonl.tmp-{live}").write_text("a running writer's")
    (tmp_path / ".hidden-but-mine").write_text("not a temporary")
    with Writer(tmp_path / "out.jsonl") as writer:
        writer.write({"a": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden-but-mine", f".other.jsonl.tmp-{live}",
                                                          "out.jsonl"]
    assert sweep_temporaries(tmp_path) == []


def test_checkpoint_save_sweeps_a_killed_runs_partial_checkpoint(tmp_path, tiny_lm):
    from cosearch_cli.update import UpdateConfig, save_checkpoint

    model, tokenizer = tiny_lm
    partial = tmp_path / f".agent.tmp-{dead_pid()}"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"x" * 1000)
    save_checkpoint(tmp_path / "agent", model=model, tokenizer=tokenizer, config=UpdateConfig())
    assert [p.name for p in tmp_path.iterdir()] == ["agent"]


def test_index_build_and_plot_sweep_what_killed_runs_left(tmp_path):
    from test_evaluate import hand_run

    dead = dead_pid()
    (tmp_path / f".idx.tmp-{dead}").mkdir()
    (tmp_path / f".idx.tmp-{dead}" / "passages.jsonl").write_text("half")
    (tmp_path / f".p.png.tmp-{dead}").write_bytes(b"half a png")
    corpus = passages(tmp_path / "c.jsonl")
    assert run_cli("index", "build", "--corpus", corpus, "--out", tmp_path / "idx", "--quiet").exit_code == 0
    assert not (tmp_path / f".idx.tmp-{dead}").exists()
    run = tmp_path / "run.jsonl"
    run.write_bytes(b"".join(orjson.dumps(asdict(r)) + b"\n" for r in hand_run()))
    assert run_cli("evaluate", run, "--plot", tmp_path / "p.png", "--quiet").exit_code == 0
    assert (tmp_path / "p.png").is_file() and [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def _blocked_index_build(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """`index build --corpus -` reading a stdin that stays open: it has made its temporary folder and waits."""
    out = tmp_path / "idx"
    process = subprocess.Popen([sys.executable, "-m", "cosearch_cli", "index", "build", "--corpus", "-", "--out",
                                str(out), "--quiet"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    process.stdin.write(orjson.dumps({"id": "p0", "title": "T", "text": "x"}) + b"\n")
    process.stdin.flush()
    temporary = tmp_path / f".idx.tmp-{process.pid}"
    for _ in range(600):  # until the build has started (imports take a few seconds)
        if (temporary / "passages.jsonl").exists():
            break
        time.sleep(0.1)
    assert (temporary / "passages.jsonl").exists(), process.stderr.read1() if process.poll() is not None else ""
    return process, out


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_interrupt_removes_own_temporaries_and_says_interrupted(tmp_path, sig, code):
    process, out = _blocked_index_build(tmp_path)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code
    assert stderr.decode() == "interrupted\n"
    assert list(tmp_path.iterdir()) == []  # no temporary folder, no lock file, no index


def test_failed_train_start_leaves_no_config(tmp_path):
    config = tmp_path / "train.toml"
    config.write_text('questions = "missing.jsonl"\n')
    result = run_cli("train", "--config", config, "--out", tmp_path / "runs", "--name", "r", "--quiet")
    assert result.exit_code == 3 and "missing.jsonl: file not found" in one_line(result)
    assert not (tmp_path / "runs" / "r" / "config.toml").exists()
    config.write_text('questions = "missing.jsonl"\nseed = 1\n')  # the name is not locked by the failed start
    result = run_cli("train", "--config", config, "--out", tmp_path / "runs", "--name", "r", "--quiet")
    assert result.exit_code == 3 and "another configuration" not in result.stderr


def test_failed_oracle_start_leaves_no_settings(tmp_path):
    result = run_cli("oracle", "--questions", FIXTURES / "dev.jsonl", "--index", tmp_path / "no-index",
                     "--out", tmp_path / "study", "--quiet")
    assert result.exit_code == 6, result.stderr
    assert list((tmp_path / "study").glob("*.settings.json")) == []


# ---------------------------------------------------------------------------------------------------------
# 11. Huge inputs


def test_huge_question_is_refused_before_any_model_loads(tmp_path):
    questions = tmp_path / "q.jsonl"
    big = "why " * 1250  # 5,000 characters
    questions.write_text(json.dumps({"id": "big", "question": big, "answers": ["x"]}) + "\n")
    result = run_cli("rollout", "--questions", questions, "--index", tmp_path / "no-index")
    assert result.exit_code == 3
    assert f"{questions}:1: question 'big' has 5,000 characters, more than the 4,000 accepted" in one_line(result)


# ---------------------------------------------------------------------------------------------------------
# 12. Damaged index folders, full disk, -o naming a folder, group -o X.parquet


@pytest.fixture(scope="module")
def fixture_index(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("index") / "fixture"
    assert run_cli("index", "fixture", "--out", out, "--quiet").exit_code == 0
    return out


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage, named, retriever", [
    (lambda f: _truncate(f / "offsets.npy"), "offsets.npy", "bm25"),
    (lambda f: _truncate(f / "ids_sorted.npy"), "ids_sorted.npy", "bm25"),
    (lambda f: _truncate(f / "passages.jsonl"), "passages.jsonl", "bm25"),
    (lambda f: (f / "passages.jsonl").unlink(), "passages.jsonl", "bm25"),
    (lambda f: _truncate(f / "dense" / "flat.faiss"), "dense/flat.faiss", "dense"),
    (lambda f: (f / "bm25" / "vocab.index.json").unlink(), "vocab.index.json", "bm25"),
])
def test_damaged_index_is_one_line_exit_6_naming_the_file(tmp_path, fixture_index, damage, named, retriever):
    folder = tmp_path / "idx"
    shutil.copytree(fixture_index, folder)
    damage(folder)
    result = run_cli("search", "who wrote hamlet", "--index", folder, "--retriever", retriever)
    assert result.exit_code == 6
    line = one_line(result)
    assert named in line and "rebuild the index" in line


def test_disk_full_while_saving_bm25_is_exit_9(tmp_path, monkeypatch):
    import bm25s

    def full_disk(self, save_dir, **kwargs):  # what np.save raises when the disk fills mid-array
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        (Path(save_dir) / "data.csc.index.npy").write_bytes(b"\x93NUMPY")
        raise OSError("4096 requested and 1024 written")

    monkeypatch.setattr(bm25s.BM25, "save", full_disk)
    result = run_cli("index", "build", "--corpus", passages(tmp_path / "c.jsonl"), "--out", tmp_path / "idx", "-q")
    assert result.exit_code == 9 and "no space left on device" in one_line(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_output_naming_a_folder_is_a_usage_error(tmp_path):
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_bytes(rollout_lines())
    (tmp_path / "dir").mkdir()
    result = run_cli("group", rollouts, "-o", tmp_path / "dir")
    assert result.exit_code == 2 and "dir: is a folder; -o names the file to write" in one_line(result)
    assert list((tmp_path / "dir").iterdir()) == []


def test_summary_or_plot_naming_a_folder_is_a_usage_error(tmp_path):
    from test_evaluate import hand_run

    run = tmp_path / "run.jsonl"
    run.write_bytes(b"".join(orjson.dumps(asdict(r)) + b"\n" for r in hand_run()))
    (tmp_path / "dir").mkdir()
    for option in ("-o", "--plot"):
        result = run_cli("evaluate", run, option, tmp_path / "dir", "--quiet")
        assert result.exit_code == 2 and "is a folder; -o names the file to write" in one_line(result)


def test_group_to_parquet_round_trips(tmp_path):
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_bytes(rollout_lines())
    assert run_cli("group", rollouts, "-o", tmp_path / "g.jsonl").exit_code == 0
    result = run_cli("group", rollouts, "-o", tmp_path / "g.parquet")
    assert result.exit_code == 0, result.stderr
    assert pl.read_parquet(tmp_path / "g.parquet").height == 2
    from_jsonl = [r.data for r in Reader.open(tmp_path / "g.jsonl").rows()]
    from_parquet = [r.data for r in Reader.open(tmp_path / "g.parquet").rows()]
    assert from_parquet == from_jsonl
    scored = run_cli("reward", tmp_path / "g.parquet", "-o", tmp_path / "s.parquet")
    assert scored.exit_code == 0, scored.stderr


# ---------------------------------------------------------------------------------------------------------
# 13. Closed pipes, directories for files


def test_closed_downstream_pipe_exits_141_quietly(tmp_path):
    from test_evaluate import hand_run

    run = tmp_path / "run.jsonl"
    run.write_bytes(b"".join(orjson.dumps(asdict(r)) + b"\n" for r in hand_run()))
    process = subprocess.Popen([sys.executable, "-m", "cosearch_cli", "evaluate", str(run), "--quiet"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # `| head -0`: the reader is gone before the first byte
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 141
    assert stderr == b""


def test_a_folder_where_a_file_is_expected_says_so(tmp_path):
    result = run_cli("group", tmp_path)
    assert result.exit_code == 3 and f"{tmp_path}: is a folder, not a file" in one_line(result)
    result = run_cli("rollout", "--questions", tmp_path, "--index", tmp_path)
    assert result.exit_code == 3 and "is a folder, not a file" in one_line(result)
    result = run_cli("train", "--config", tmp_path)
    assert result.exit_code == 4 and "is a folder, not a config file" in one_line(result)
    result = run_cli("rollout", "--questions", FIXTURES / "dev.jsonl", "--index", tmp_path, "--template", tmp_path)
    assert result.exit_code == 3 and "is a folder, not a template file" in one_line(result)
