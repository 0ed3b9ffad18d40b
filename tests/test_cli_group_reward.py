"""`cosearch group` and `cosearch reward` driven like a user: pipes, files, summaries, presets, bad input."""

from __future__ import annotations

import orjson
import polars as pl
import pytest
import typer.main
from conftest import run_cli
from test_grouping import make_call, make_record, make_traj

from cosearch_cli.cli import app


def rollout_lines() -> list[bytes]:
    q1 = make_record("q1", ["Paris"],
                     [make_traj(0, "Paris"), make_traj(1, "Lyon"), make_traj(2, "Paris France"),
                      make_traj(3, "Paris", format_ok=False)],
                     [make_call("q1", s, 0, "capital of France", has=(1,) if s != 1 else (5,)) for s in range(4)]
                     + [make_call("q1", 0, 1, "population of paris", valid=False)])
    q2 = make_record("q2", ["Hamlet"], [make_traj(0, "Hamlet"), make_traj(1, "Hamlet")],
                     [make_call("q2", s, 0, "who wrote hamlet") for s in range(2)])
    return [orjson.dumps(r) + b"\n" for r in (q1, q2)]


def write(path, lines) -> str:
    path.write_bytes(b"".join(lines))
    return str(path)


def parse(stdout: str) -> tuple[list[dict], dict]:
    rows = [orjson.loads(line) for line in stdout.splitlines() if line.strip()]
    assert rows[-1]["kind"] == "manifest"
    return rows[:-1], rows[-1]


def test_group_then_reward_through_a_pipe(tmp_path):
    grouped = run_cli("group", write(tmp_path / "r.jsonl", rollout_lines()), "--kmin", "2")
    assert grouped.exit_code == 0, grouped.stderr
    records, manifest = parse(grouped.stdout)
    assert manifest["stage"] == "group" and manifest["options"]["kmin"] == 2
    assert [r["stage"] for r in records] == ["grouped", "grouped"]
    q1 = {g["id"]: g for g in records[0]["groups"]}
    # s1's answer-bearing candidate was not shown, yet the call is easy: the split looks at all N candidates
    assert q1["q1/ranker/easy/c0"]["members"] == ["q1/s0/t0", "q1/s1/t0", "q1/s2/t0"]
    assert q1["q1/ranker/hard/c0"]["members"] == ["q1/s0/t1"] and q1["q1/ranker/hard/c0"]["reason"] == "singleton"
    assert "ranker calls left out before clustering: 1 agent-format-failure" in grouped.stderr

    scored = run_cli("reward", "-", input=grouped.stdout)
    assert scored.exit_code == 0, scored.stderr
    records, manifest = parse(scored.stdout)
    assert manifest["stage"] == "reward" and manifest["upstream"][0]["stage"] == "group"
    q1, q2 = records
    assert q1["stage"] == "scored"
    assert [t["reward"] for t in q1["trajectories"]] == pytest.approx([1.0, 0.0, 2 / 3, -0.2])
    calls = {c["id"]: c for c in q1["ranker_calls"]}
    assert calls["q1/s0/t0"]["reward"] == 2.0 and calls["q1/s2/t0"]["reward"] == pytest.approx(1 + 2 / 3)
    assert calls["q1/s1/t0"]["reward"] == 0.0 and calls["q1/s1/t0"]["reward_parts"]["branch"] == "rel-only"
    # easy group [2, 0, 5/3]: mean 11/9, sample std sqrt(((7/9)^2 + (11/9)^2 + (4/9)^2) / 2) = sqrt(31/27)
    std = (31 / 27) ** 0.5
    assert calls["q1/s0/t0"]["advantage"] == pytest.approx((7 / 9) / (std + 1e-6))
    assert calls["q1/s0/t1"]["reward_parts"]["branch"] == "main-only"  # invalid, hard, paper: F1 1 - 0.2
    assert calls["q1/s0/t1"]["reward"] == pytest.approx(0.8)
    assert calls["q1/s3/t0"]["reward"] is None and calls["q1/s3/t0"]["advantage"] == 0.0
    # q2: both trajectories right -> all-equal agent group, dropped with advantage 0
    agent = {g["id"]: g for g in q2["groups"]}["q2/agent"]
    assert not agent["kept"] and agent["reason"] == "all-equal-rewards"
    assert [t["advantage"] for t in q2["trajectories"]] == [0.0, 0.0]
    assert "agent groups: 2 formed, 1 kept (4 trajectories), dropped: 1 all-equal-rewards" in scored.stderr


def test_summary_parquet_and_file_output(tmp_path):
    out, summary = tmp_path / "g.jsonl", tmp_path / "groups.parquet"
    result = run_cli("group", write(tmp_path / "r.jsonl", rollout_lines()), "-o", out, "--summary", summary, "-q")
    assert result.exit_code == 0 and result.stdout == "" and result.stderr == ""
    frame = pl.read_parquet(summary)
    assert frame.columns == ["question_id", "group", "role", "size", "kept", "reason"]
    rows = {row["group"]: row for row in frame.iter_rows(named=True)}
    assert [(r["role"], r["size"], r["kept"], r["reason"]) for r in rows.values()] == [
        ("agent", 4, True, ""), ("ranker", 3, True, ""), ("ranker", 1, False, "singleton"),
        ("ranker", 1, False, "agent-format-failure"), ("agent", 2, True, ""), ("ranker", 2, False, "below-kmin")]
    assert list(rows)[1] == "q1/ranker/easy/c0"
    assert (tmp_path / "g.manifest.json").is_file()


def test_presets_and_overrides_reach_the_manifest(tmp_path):
    source = write(tmp_path / "r.jsonl", rollout_lines())
    grouped = run_cli("group", source, "--rules", "official", "-o", tmp_path / "g.jsonl")
    assert grouped.exit_code == 0
    options = orjson.loads((tmp_path / "g.manifest.json").read_bytes())["options"]
    assert (options["preset"], options["kmin"], options["kmin_strict"]) == ("official", 3, True)
    scored = run_cli("reward", tmp_path / "g.jsonl", "--rules", "official", "--gamma", "0.3", "--scale", "none")
    _, manifest = parse(scored.stdout)
    options = manifest["options"]
    assert (options["gamma"], options["gamma_strict"], options["main"], options["scale"]) == \
        (0.3, True, "binary", "none")


def test_several_inputs_and_globs(tmp_path):
    first, second = rollout_lines()
    write(tmp_path / "shard0.jsonl", [first])
    write(tmp_path / "shard1.jsonl", [second])
    result = run_cli("group", str(tmp_path / "shard*.jsonl"))
    records, manifest = parse(result.stdout)
    assert [r["question_id"] for r in records] == ["q1", "q2"] and len(manifest["inputs"]) == 2


def test_a_question_twice_is_refused(tmp_path):
    first, _ = rollout_lines()
    result = run_cli("group", write(tmp_path / "a.jsonl", [first]), write(tmp_path / "b.jsonl", [first]))
    assert result.exit_code == 3 and result.stdout == ""
    assert "b.jsonl:1: question 'q1' appears twice" in result.stderr


def corrupt(line: bytes, change) -> bytes:
    data = orjson.loads(line)
    change(data)
    return orjson.dumps(data) + b"\n"


@pytest.mark.parametrize("command, change, message", [
    ("group", lambda d: d.update(schema=0), "record has schema version 0, this cosearch reads 1"),
    ("group", lambda d: d["trajectories"][1].pop("format_ok"), "missing field 'format_ok'"),
    ("group", lambda d: d["ranker_calls"][0].pop("candidate_has_answer"), "missing field 'candidate_has_answer'"),
    ("group", lambda d: d.update(kind="question"), "expected a rollout record"),
    ("reward", lambda d: d.update(stage="rollout"), "pipe it through `cosearch group` first"),
    ("reward", lambda d: d.pop("groups"), "has no groups"),
])
def test_bad_input_is_one_line_naming_the_line_and_nothing_is_written(tmp_path, command, change, message):
    good = rollout_lines()
    if command == "reward":
        good = [line.encode() + b"\n" for line in
                run_cli("group", write(tmp_path / "r.jsonl", good)).stdout.splitlines()[:2]]
    source = write(tmp_path / "in.jsonl", [good[0], corrupt(good[1], change)])
    out = tmp_path / "out.jsonl"
    result = run_cli(command, source, "-o", out)
    assert result.exit_code == 3
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"error: {source}:2: ")
    assert message in result.stderr
    assert not out.exists() and list(tmp_path.glob(".out.jsonl*")) == []
    piped = run_cli(command, source)
    assert piped.exit_code == 3 and piped.stdout == ""


def test_empty_input_is_bad_input_in_every_stage(tmp_path, fixture_bm25):
    """Empty input is exit 3 everywhere (it was 7 in group/reward/update, 3 in evaluate/rollout)."""
    empty = write(tmp_path / "empty.jsonl", [])
    for args in (["group", empty], ["reward", empty], ["evaluate", empty],
                 ["update", empty, "--out", tmp_path / "ckpt", "--model", "smollm2"],
                 ["rollout", "--questions", empty, "--index", tmp_path / "no-index"],
                 ["search", "--queries", empty, "--index", fixture_bm25.folder]):
        result = run_cli(*args)
        assert result.exit_code == 3, (args[0], result.stderr)
        assert any(f"no {what}" in result.stderr for what in ("rollout records", "questions", "queries"))


def test_impossible_options_are_config_errors(tmp_path):
    source = write(tmp_path / "r.jsonl", rollout_lines())
    assert run_cli("group", source, "--tau", "1.5").exit_code == 4
    result = run_cli("reward", source, "--evidence-weight", "0.5")
    assert result.exit_code == 4 and "--verifier" in result.stderr


@pytest.mark.parametrize("name", ["group", "reward"])
def test_every_option_is_documented(name):
    command = typer.main.get_command(app).commands[name]
    for param in command.params:
        assert getattr(param, "help", None), f"{name} {param.name} has no help"
    assert command.help


def test_evidence_reward_with_a_local_verifier_model(tmp_path, tiny_lm):
    from cosearch_cli.records import Turn

    model, tokenizer = tiny_lm
    model.save_pretrained(tmp_path / "verifier")
    tokenizer.save_pretrained(tmp_path / "verifier")
    with_evidence = [Turn(text="<evidence>Hamlet was written by Shakespeare</evidence><answer>Shakespeare</answer>",
                          token_ids=[], logprobs=[], action="answer")]
    record = make_record("q", ["Shakespeare"], [make_traj(0, "Shakespeare", turns=with_evidence),
                                                make_traj(1, "Marlowe")], [])
    grouped = run_cli("group", write(tmp_path / "r.jsonl", [orjson.dumps(record) + b"\n"]))
    result = run_cli("reward", "-", "--evidence-weight", "0.5", "--verifier", tmp_path / "verifier",
                     "--verifier-max-new-tokens", "4", input=grouped.stdout)
    assert result.exit_code == 0, result.stderr
    (scored,), manifest = parse(result.stdout)
    first, second = scored["trajectories"]
    # the random verifier's answer scores some F1 in [0, 1]; the reward adds half of it to the answer F1
    assert 0.0 <= first["scores"]["evidence_f1"] <= 1.0
    assert first["reward"] == pytest.approx(1.0 + 0.5 * first["scores"]["evidence_f1"])
    assert second["scores"]["evidence_f1"] == 0.0 and second["reward"] == 0.0  # no evidence block
    assert manifest["options"]["evidence_weight"] == 0.5 and "evidence F1" in result.stderr


def test_streamed_chunks_give_the_same_advantages_as_the_whole_batch(tmp_path):
    from cosearch_cli import advantages, grouping, rewards
    from cosearch_cli.records import RolloutRecord, from_dict

    answers = ["Paris", "Paris France", "Lyon"]
    records = [make_record(f"q{i}", ["Paris"], [make_traj(s, answers[(i + s) % 3]) for s in range(3)],
                           [make_call(f"q{i}", s, 0, "capital of france", has=(s,)) for s in range(3)])
               for i in range(70)]  # more than one chunk of 64
    grouped = run_cli("group", write(tmp_path / "r.jsonl", [orjson.dumps(r) + b"\n" for r in records]))
    streamed, _ = parse(run_cli("reward", "-", "--scale", "group", input=grouped.stdout).stdout)
    expected, _ = parse(grouped.stdout)
    expected = [from_dict(RolloutRecord, r) for r in expected]
    for record in expected:
        rewards.score_record(record, rewards.PRESETS["paper"])
    advantages.assign_advantages(expected, mode="group")
    assert [t["advantage"] for r in streamed for t in r["trajectories"]] == \
        [t.advantage for r in expected for t in r.trajectories]
    assert [c["advantage"] for r in streamed for c in r["ranker_calls"]] == \
        [c.advantage for r in expected for c in r.ranker_calls]
    assert grouping.describe_groups((r.question_id, r.groups) for r in expected) in \
        run_cli("reward", "-", input=grouped.stdout).stderr


def test_reward_with_a_greedy_baseline(tmp_path):
    grouped = run_cli("group", write(tmp_path / "r.jsonl", rollout_lines()), "--kmin", "2", "-o", tmp_path / "g.jsonl")
    assert grouped.exit_code == 0, grouped.stderr
    # greedy answered q1 "Paris France" (F1 2/3) and q2 "Hamlet" (F1 1)
    greedy = [make_record("q1", ["Paris"], [make_traj(0, "Paris France")], []),
              make_record("q2", ["Hamlet"], [make_traj(0, "Hamlet")], [])]
    source = write(tmp_path / "greedy.jsonl", [orjson.dumps(r) + b"\n" for r in greedy])
    scored = run_cli("reward", tmp_path / "g.jsonl", "--baseline", source)
    assert scored.exit_code == 0, scored.stderr
    (q1, q2), manifest = parse(scored.stdout)
    assert manifest["options"]["baseline"] == "greedy" and source in manifest["inputs"]
    # q1 rewards [1, 0, 2/3, -0.2] minus 2/3, unscaled
    assert [t["advantage"] for t in q1["trajectories"]] == pytest.approx([1 / 3, -2 / 3, 0.0, -13 / 15])
    assert {g["id"]: g for g in q1["groups"]}["q1/agent"]["baseline"] == pytest.approx(2 / 3)
    # q2: both samples score the greedy reward: no signal
    agent = {g["id"]: g for g in q2["groups"]}["q2/agent"]
    assert (agent["kept"], agent["reason"], agent["baseline"]) == (False, "equal-to-baseline", 1.0)
    # the ranker keeps GRPO's group mean: the easy group [2, 0, 5/3] as without a baseline
    calls = {c["id"]: c for c in q1["ranker_calls"]}
    assert calls["q1/s0/t0"]["advantage"] == pytest.approx((7 / 9) / ((31 / 27) ** 0.5 + 1e-6))

    missing = write(tmp_path / "short.jsonl", [orjson.dumps(greedy[0]) + b"\n"])
    refused = run_cli("reward", tmp_path / "g.jsonl", "--baseline", missing, "-o", tmp_path / "s.jsonl")
    assert refused.exit_code != 0 and "no greedy baseline for question 'q2'" in refused.stderr
    assert "short.jsonl" in refused.stderr and not (tmp_path / "s.jsonl").exists()
    twice = write(tmp_path / "twice.jsonl", [orjson.dumps(r) + b"\n" for r in (*greedy, greedy[0])])
    refused = run_cli("reward", tmp_path / "g.jsonl", "--baseline", twice, "-o", tmp_path / "s.jsonl")
    assert refused.exit_code != 0 and "question 'q1' appears twice" in refused.stderr
    assert not (tmp_path / "s.jsonl").exists()
