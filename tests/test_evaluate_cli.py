"""`cosearch evaluate` driven like a user: outputs, manifests, comparison, and every bad-input message."""

from __future__ import annotations

import json
from dataclasses import asdict

import orjson
import polars as pl
import pytest
from conftest import run_cli

from cosearch_cli.artifacts import make_manifest
from test_evaluate import hand_run, make_record


def write_run(path, records, manifest: dict | None = None):
    path.write_bytes(b"".join(orjson.dumps(asdict(r)) + b"\n" for r in records))
    if manifest is not None:
        path.with_name(path.name.replace(".jsonl", ".manifest.json")).write_text(json.dumps(manifest))
    return path


def test_one_run_writes_summary_tables_and_figure(tmp_path):
    run = write_run(tmp_path / "run.jsonl", hand_run(), {"kind": "manifest", "stage": "rollout", "seed": 5})
    result = run_cli("evaluate", run, "--per-question", tmp_path / "q.parquet", "--per-dataset",
                     tmp_path / "d.parquet", "--plot", tmp_path / "f1.png")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    groups = {g["dataset"]: g for g in summary["groups"]}
    nq_f1 = (1 + (2 / 3 + 0.8) / 2) / 2
    assert groups["average"]["f1"] == pytest.approx((nq_f1 + 0.5) / 3)
    assert summary["variant_name"].startswith("token F1 (yes/no rule off)")
    assert summary["manifest"]["upstream"][0]["stage"] == "rollout"  # the rollout's manifest travels on
    assert "Evaluation" in result.stderr and "average" in result.stderr  # the table is on stderr

    questions = pl.read_parquet(tmp_path / "q.parquet")
    assert questions.height == 4 and questions["f1"].to_list()[0] == 1.0
    datasets = pl.read_parquet(tmp_path / "d.parquet")
    assert datasets["dataset"].to_list() == ["nq", "hotpotqa", "bamboogle", "single-hop", "multi-hop", "average"]
    assert (tmp_path / "f1.png").read_bytes()[:4] == b"\x89PNG"
    for name in ("q.manifest.json", "d.manifest.json", "f1.png.manifest.json"):
        manifest = json.loads((tmp_path / name).read_text())
        assert manifest["stage"] == "evaluate" and manifest["upstream"][0]["seed"] == 5


def test_summary_to_a_file_and_yes_no_rule(tmp_path):
    run = write_run(tmp_path / "run.jsonl", hand_run())
    result = run_cli("evaluate", run, "--yes-no-rule", "-o", tmp_path / "s.json", "--quiet")
    assert result.exit_code == 0 and result.stdout == "" and result.stderr == ""
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["variant"]["yes_no_rule"] is True
    assert {d["dataset"]: d["f1"] for d in summary["datasets"]}["hotpotqa"] == 0.0


def test_stdin_run(tmp_path):
    data = b"".join(orjson.dumps(asdict(r)) + b"\n" for r in hand_run())
    manifest = orjson.dumps(make_manifest("rollout", {})) + b"\n"  # a finished stage's stream ends with it
    result = run_cli("evaluate", "-", "--quiet", input=data + manifest)
    assert result.exit_code == 0 and json.loads(result.stdout)["kind"] == "evaluation"


def test_stdin_run_cut_short_is_refused_or_marked_partial(tmp_path):
    """A pipe whose upstream died has no manifest line: refused (3), or accepted with --allow-partial and
    marked partial in the output's manifest."""
    data = b"".join(orjson.dumps(asdict(r)) + b"\n" for r in hand_run())
    result = run_cli("evaluate", "-", "--quiet", input=data)
    assert result.exit_code == 3 and "ended without a manifest line" in result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""
    result = run_cli("evaluate", "-", "--quiet", "--allow-partial", input=data)
    assert result.exit_code == 0
    assert json.loads(result.stdout)["manifest"]["partial"]["inputs"] == ["<stdin>"]


def test_comparison(tmp_path):
    a = write_run(tmp_path / "a.jsonl", hand_run())
    better = hand_run()
    better[3] = make_record("q4", "bamboogle", ["1797"], [("1797", 1, True)])
    b = write_run(tmp_path / "b.jsonl", better)
    result = run_cli("evaluate", a, b, "--per-question", tmp_path / "q.parquet", "--plot", tmp_path / "d.png",
                     "--bootstrap", "200")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["kind"] == "comparison" and summary["labels"] == ["a", "b"]
    diff = {r["dataset"]: r for r in summary["differences"]}
    assert diff["bamboogle"]["f1_diff"] == 1.0 and diff["nq"]["f1_diff"] == 0.0
    assert summary["bootstrap"]["seed"] == 0 and summary["bootstrap"]["samples"] == 200
    assert pl.read_parquet(tmp_path / "q.parquet")["f1_diff"].sum() == 1.0
    assert (tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"
    assert "Paired comparison" in result.stderr


def test_comparison_warns_when_scored_differently(tmp_path):
    records = [make_record("q", "nq", ["x"], [("x", 0, True)], sampling={"lenient_ranker": True})]
    a = write_run(tmp_path / "a.jsonl", records)
    b = write_run(tmp_path / "b.jsonl", [make_record("q", "nq", ["x"], [("x", 0, True)])])
    result = run_cli("evaluate", a, b, "--bootstrap", "10")
    assert result.exit_code == 0
    assert "scored differently" in result.stderr and "parse lenient" in result.stderr


def one_line_error(result, code: int, *needles: str) -> None:
    assert result.exit_code == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0]
    assert result.stdout == ""


def test_different_question_sets_are_refused(tmp_path):
    a = write_run(tmp_path / "a.jsonl", hand_run())
    b = write_run(tmp_path / "b.jsonl", hand_run()[:3])
    one_line_error(run_cli("evaluate", a, b), 3, "different questions", "1 only in A", "'q4'", "same question file")


def test_empty_file_is_refused(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    one_line_error(run_cli("evaluate", tmp_path / "empty.jsonl"), 3, "empty.jsonl", "no rollout records")


def test_unknown_dataset_is_refused_with_its_line(tmp_path):
    records = hand_run()
    records[1].dataset = "squad"
    run = write_run(tmp_path / "run.jsonl", records)
    one_line_error(run_cli("evaluate", run), 3, "run.jsonl:2:", "unknown dataset 'squad'", "must be one of nq")


def test_duplicate_question_is_refused(tmp_path):
    run = write_run(tmp_path / "run.jsonl", hand_run() + hand_run()[:1])
    one_line_error(run_cli("evaluate", run), 3, "run.jsonl:5:", "'q1' appears twice")


def test_wrong_record_kind_and_too_many_runs(tmp_path):
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"id": "a", "question": "?", "answers": ["x"]}\n')
    one_line_error(run_cli("evaluate", questions), 3, "questions.jsonl:1:", "expected a rollout record")
    run = write_run(tmp_path / "run.jsonl", hand_run())
    one_line_error(run_cli("evaluate", run, run, run), 4, "got 3 runs")
    one_line_error(run_cli("evaluate", tmp_path / "missing.jsonl"), 3, "file not found")


def test_evaluate_is_a_group_whose_default_is_score(tmp_path):
    run = write_run(tmp_path / "run.jsonl", hand_run())
    plain = run_cli("evaluate", run, "--quiet")
    named = run_cli("evaluate", "score", run, "--quiet")
    assert plain.exit_code == named.exit_code == 0
    strip = lambda out: {k: v for k, v in json.loads(out).items() if k != "manifest"}  # noqa: E731
    assert strip(plain.stdout) == strip(named.stdout)
    options_first = run_cli("evaluate", "--quiet", run)  # an option before the run goes to `score` too
    assert options_first.exit_code == 0 and strip(options_first.stdout) == strip(plain.stdout)
    listing = run_cli("evaluate", "--help")
    assert listing.exit_code == 0 and "score" in listing.stdout and "ranker" in listing.stdout
