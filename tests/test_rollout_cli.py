"""`cosearch rollout` end to end: streaming output, manifest, seeds, shards, and every bad-input error."""

from __future__ import annotations

import json
import re

import orjson
import pytest
from conftest import FIXTURES

from cosearch_cli.records import read_rollout


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, fixtures_dir):
    """A real BM25 + dense (shipped MiniLM vectors) index over the fixture corpus."""
    from conftest import run_cli

    folder = tmp_path_factory.mktemp("idx") / "fixture"
    result = run_cli("index", "fixture", "--out", folder, "--quiet")
    assert result.exit_code == 0, result.stderr
    return folder


@pytest.fixture(scope="module")
def questions_file(tmp_path_factory, fixtures_dir):
    path = tmp_path_factory.mktemp("q") / "q.jsonl"
    path.write_text("".join((fixtures_dir / "dev.jsonl").read_text().splitlines(keepends=True)[:4]))
    return path


def _lines(stdout: str) -> list[dict]:
    return [orjson.loads(line) for line in stdout.splitlines()]


def test_streams_records_then_manifest_and_repeats_with_the_same_seed(cli, index_dir, tiny_dir, questions_file):
    args = ("rollout", "--questions", questions_file, "--index", index_dir, "--agent", tiny_dir, "--n", "2",
            "--max-new-tokens", "6", "--limit", "2", "--constrain", "none", "--seed", "3", "--quiet")
    first = cli(*args)
    assert first.exit_code == 0, first.stderr
    rows = _lines(first.stdout)
    assert [r["kind"] for r in rows] == ["rollout", "rollout", "manifest"]
    ids = [json.loads(line)["id"] for line in questions_file.read_text().splitlines()]
    assert [r["question_id"] for r in rows[:2]] == ids[:2]
    record = read_rollout(rows[0], "<stdout>", 1)
    assert len(record.trajectories) == 2 and record.sampling["n"] == 2 and record.sampling["seed"] == 3
    for traj in record.trajectories:
        assert sum(traj.loss_mask) == sum(len(t.token_ids) for t in traj.turns) > 0
    manifest = rows[-1]
    assert manifest["stage"] == "rollout" and manifest["seed"] == 3
    assert manifest["options"]["agent"] == str(tiny_dir) and manifest["options"]["ranker"] == "llm"
    assert manifest["upstream"][-1]["stage"] == "index"
    again = cli(*args)
    assert again.stdout.splitlines()[:2] == first.stdout.splitlines()[:2]
    other = cli(*args[:-3], "4", "--quiet")
    assert other.stdout.splitlines()[:2] != first.stdout.splitlines()[:2]


def test_shard_limit_and_file_output(cli, index_dir, tiny_dir, questions_file, tmp_path):
    out = tmp_path / "shard1.jsonl"
    result = cli("rollout", "--questions", questions_file, "--index", index_dir, "--agent", tiny_dir, "--n", "1",
                 "--ranker", "oracle", "--max-new-tokens", "4", "--shard", "1/2", "--constrain", "none", "-o", out)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "" and "trajectories" in result.stderr  # summary on stderr, data in the file
    ids = [json.loads(line)["id"] for line in questions_file.read_text().splitlines()]
    assert [r["question_id"] for r in _lines(out.read_text())] == [ids[1], ids[3]]
    manifest = json.loads((tmp_path / "shard1.manifest.json").read_text())
    assert manifest["options"]["shard"] == "1/2" and manifest["options"]["ranker"] == "oracle"


def _error(result, code: int, text: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and text in lines[-1], lines
    assert result.stdout == ""


def test_unknown_model_path(cli, index_dir, questions_file, tmp_path):
    out = tmp_path / "r.jsonl"
    result = cli("rollout", "--questions", questions_file, "--index", index_dir, "--agent", tmp_path / "nope",
                 "-o", out)
    _error(result, 5, "not found (not a folder, not in the Hugging Face cache)")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_question_without_answers(cli, index_dir, tiny_dir, tmp_path):
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"id": "a", "question": "q?", "answers": ["x"]}\n{"id": "b", "question": "q?", "answers": []}\n')
    out = tmp_path / "r.jsonl"
    result = cli("rollout", "--questions", bad, "--index", index_dir, "--agent", tiny_dir, "-o", out)
    _error(result, 3, f"{bad}:2: question 'b' has no gold answers")
    assert not out.exists()


def test_question_file_that_is_not_jsonl(cli, index_dir, tiny_dir, tmp_path):
    bad = tmp_path / "q.csv"
    bad.write_text("id,question,answers\nq1,who?,x\n")
    result = cli("rollout", "--questions", bad, "--index", index_dir, "--agent", tiny_dir)
    _error(result, 3, f"{bad}:1: not valid JSON")


def test_index_built_with_another_encoder(cli, index_dir, tiny_dir, questions_file):
    result = cli("rollout", "--questions", questions_file, "--index", index_dir, "--agent", tiny_dir,
                 "--retriever", "dense", "--encoder", tiny_dir)
    _error(result, 6, "index was built with encoder 'minilm'")


def test_missing_index_and_bad_options(cli, tiny_dir, questions_file, tmp_path):
    _error(cli("rollout", "--questions", questions_file, "--index", tmp_path / "none", "--agent", tiny_dir), 6,
           "no index folder here")
    _error(cli("rollout", "--questions", questions_file, "--index", tmp_path, "--shard", "2/2"), 4,
           "--shard '2/2' is not i/N")
    _error(cli("rollout", "--questions", questions_file, "--index", tmp_path, "--k", "20"), 4,
           "top_n (10) must be at least k (20)")


@pytest.mark.slow
def test_embedded_smollm2_end_to_end(cli, index_dir, questions_file):
    result = cli("rollout", "--questions", questions_file, "--index", index_dir, "--n", "2", "--limit", "2",
                 "--max-new-tokens", "12", "--ranker-max-new-tokens", "12", "--max-turns", "1", "--constrain",
                 "none", "--quiet")
    assert result.exit_code == 0, result.stderr
    rows = _lines(result.stdout)
    assert [r["kind"] for r in rows] == ["rollout", "rollout", "manifest"]
    from cosearch_cli.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    for row in rows[:2]:
        record = read_rollout(row, "<stdout>", 1)
        for traj in record.trajectories:
            masked_in = [tok for tok, m in zip(traj.token_ids, traj.loss_mask) if m]
            assert tokenizer.decode(masked_in) == "".join(t.text for t in traj.turns)
            assert tokenizer.decode(traj.token_ids[:traj.prompt_len]).endswith("<|im_start|>assistant\n")
            assert traj.format_ok == (traj.answer is not None)


def test_custom_template_and_a_bad_one(cli, index_dir, tiny_dir, questions_file, tmp_path):
    good = tmp_path / "t.txt"
    good.write_text("Q: {question} (use {search_open} at most {max_turns} times)")
    result = cli("rollout", "--questions", questions_file, "--index", index_dir, "--agent", tiny_dir, "--n", "1",
                 "--limit", "1", "--ranker", "none", "--max-new-tokens", "2", "--template", good, "--quiet")
    assert result.exit_code == 0, result.stderr
    from cosearch_cli.models import load_tokenizer

    record = read_rollout(_lines(result.stdout)[0], "<stdout>", 1)
    prompt = load_tokenizer(str(tiny_dir)).decode(record.trajectories[0].token_ids[:record.trajectories[0].prompt_len])
    assert f"Q: {record.question} (use <search> at most 2 times)" in prompt
    assert record.sampling["template"]["instruction"] == good.read_text()
    bad = tmp_path / "bad.txt"
    bad.write_text("Q: {questoin}")
    _error(cli("rollout", "--questions", questions_file, "--index", index_dir, "--template", bad), 3,
           "the template has an unknown placeholder ('questoin')")


def test_design_card_pipe_runs_on_the_fixture_defaults_with_progress_in_the_log(cli, index_dir, tiny_dir,
                                                                                 tmp_path, monkeypatch):
    # `cosearch rollout --n 8 | cosearch group --kmin 3` after the quick start: no --questions and no --index
    # mean the fixture's training questions and indexes/fixture, said on stderr; stderr (not a terminal
    # here) gets a plain progress line instead of a bar that prints nothing until the end.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "indexes").mkdir()
    (tmp_path / "indexes" / "fixture").symlink_to(index_dir)
    rolled = cli("rollout", "--n", "8", "--agent", tiny_dir, "--max-new-tokens", "6", "--constrain", "none",
                 "--limit", "2", "--threads", "1")
    assert rolled.exit_code == 0, rolled.stderr
    assert "--questions not given: using the fixture's " + str(FIXTURES / "train.jsonl") in rolled.stderr
    assert "--index not given: using the fixture's indexes/fixture" in rolled.stderr
    assert "torch threads: 1 (--threads)" in rolled.stderr
    assert re.search(r"\d\d:\d\d:\d\d rollout: 2/2 questions \(100%\), done, .* elapsed; 16 trajectories finished, "
                     r"\d[\d,]* tokens generated, \d[\d,]* read", rolled.stderr), rolled.stderr
    first_train_id = orjson.loads((FIXTURES / "train.jsonl").read_bytes().splitlines()[0])["id"]
    assert orjson.loads(rolled.stdout.splitlines()[0])["question_id"] == first_train_id
    grouped = cli("group", "--kmin", "3", input=rolled.stdout)
    assert grouped.exit_code == 0, grouped.stderr
    assert [orjson.loads(line)["kind"] for line in grouped.stdout.splitlines()] == ["rollout", "rollout", "manifest"]


def test_questions_repeat_and_take_globs(cli, index_dir, tiny_dir, questions_file, tmp_path):
    other = tmp_path / "more.jsonl"
    other.write_text((FIXTURES / "train.jsonl").read_text().splitlines(keepends=True)[0])
    result = cli("rollout", "--questions", str(questions_file.parent / "*.jsonl"), "--questions", other,
                 "--index", index_dir, "--agent", tiny_dir, "--n", "1", "--max-new-tokens", "4", "--constrain",
                 "none", "--quiet")
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 4 + 1 + 1  # the glob's 4 questions, the other file's 1, manifest


def test_design_card_pipe_after_a_failed_rollout_says_the_stream_was_cut(tmp_path):
    # Before: `group` answered a failed rollout with a second, misleading error ("the input holds no rollout
    # records"). The readers (issue 16) refuse a piped input that ended without its manifest line.
    import subprocess
    import sys

    python = f"{sys.executable} -m cosearch_cli"
    result = subprocess.run(f"{python} rollout --questions {tmp_path / 'missing.jsonl'} --n 8 --quiet "
                            f"| {python} group --kmin 3", shell=True, capture_output=True, text=True,
                            cwd=FIXTURES.parent)
    assert result.returncode == 3
    lines = sorted(result.stderr.strip().splitlines())  # two processes: either may write first
    assert len(lines) == 2 and lines[0] == (f"error: {tmp_path / 'missing.jsonl'}: file not found - check the "
                                            "path, or use - for stdin")
    assert lines[1].startswith("error: <stdin>: the input stream ended without a manifest line: the upstream "
                               "stage failed"), lines
    assert "no rollout records" not in result.stderr
