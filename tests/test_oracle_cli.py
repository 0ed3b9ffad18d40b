"""`cosearch oracle` driven like a user, with a fake rollout runner in place of the models (fast, exact)."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from test_evaluate_cli import one_line_error
from test_oracle import fake_rollouts

rollout = pytest.importorskip("cosearch_cli.rollout", reason="the rollout stage is not in this checkout")

QUESTION_LINES = [
    {"id": "q0", "question": "?", "answers": ["a0"], "dataset": "nq"},
    {"id": "q1", "question": "?", "answers": ["a1"], "dataset": "nq"},
    {"id": "q2", "question": "?", "answers": ["a2"], "dataset": "hotpotqa"},
    {"id": "q3", "question": "?", "answers": ["a3"], "dataset": "hotpotqa"},
    {"id": "q4", "question": "?", "answers": ["a4"], "dataset": "hotpotqa"},  # dropped by --per-dataset 2
]


@pytest.fixture
def study(tmp_path, monkeypatch):
    """A question file, and fakes for models, index and rollouts; `asked` lists (half, question id)."""
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTION_LINES))
    asked: list = []
    fake = fake_rollouts(asked)

    def run_rollouts(questions, *, agent, ranker_backend, index, config, stats=None):
        assert (ranker_backend is not None) == (config.ranker == "llm")
        assert config.greedy and config.n == 1 and config.seed == 0  # the same seeds in every half
        return fake(config.ranker, list(questions))

    class FakeIndex:
        manifest = {"kind": "manifest", "stage": "index"}

    monkeypatch.setattr(rollout, "run_rollouts", run_rollouts)
    monkeypatch.setattr(rollout, "load_backend", lambda name, **engine: object())
    monkeypatch.setattr("cosearch_cli.index.open_index", lambda folder: FakeIndex())
    args = ["oracle", "--questions", questions, "--index", tmp_path / "index", "--out", tmp_path / "study",
            "--per-dataset", "2", "--constrain", "none", "--bootstrap", "100"]
    return args, asked, tmp_path / "study"


def test_study_prints_table1_and_writes_the_report(study):
    args, asked, out = study
    result = run_cli(*args, "--ranker", "none")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    rows = {r["ranker"]: r for r in summary["table1"]}
    # none: NQ right, HotpotQA wrong -> .5 average; the oracle answers all -> 1; gap (1 - .5) / .5.
    assert rows["none"]["average"] == 0.5 and rows["oracle"]["average"] == 1.0
    assert rows["none"]["gap average"] == 1.0
    assert sorted(asked) == sorted([(h, q) for h in ("none", "oracle") for q in ("q0", "q1", "q2", "q3")])
    report = (out / "report.md").read_text()
    assert "## Table 1 shape" in report and "| none | 1.000 | 0.000 | 0.500 | +100.0%" in report
    assert "Paper Table 1: +14.7% (7B agent), +26.8% (3B agent)" in report
    assert (out / "oracle.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "none.manifest.json").read_text())["upstream"][0]["stage"] == "index"
    assert "Oracle study, F1 (Table 1 shape)" in result.stderr and "Oracle study, F1 per dataset" in result.stderr
    assert "95% CI of oracle - none: [" in result.stderr


def test_terminal_tables_fit_80_columns_with_whole_headers(study):
    # The table used to head its ranker column "dataset" and, at 80 columns, cut headers ("rel. gap (a…").
    from rich.console import Console

    from cosearch_cli.cli.oracle import _TABLE1_COLUMNS, per_dataset_table, table1
    from cosearch_cli.oracle import summarize

    fake = fake_rollouts([])
    questions = [rollout.Question(id=q["id"], question=q["question"], answers=q["answers"], dataset=q["dataset"])
                 for q in QUESTION_LINES[:4]]
    result = summarize({half: list(fake(half, questions)) for half in ("none", "llm", "oracle")}, bootstrap=50)
    console = Console(width=80, record=True, force_terminal=False)
    console.print(table1(result.table, "F1 variant"))
    console.print(per_dataset_table(result.evaluations, "F1 variant"))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    header = next(line for line in text.splitlines() if "ranker" in line)
    assert "dataset" not in header
    for _, name in _TABLE1_COLUMNS:
        assert name in header, (name, header)
    per_dataset = next(line for line in text.splitlines() if "F1 oracle" in line)
    assert all(f"F1 {h}" in per_dataset for h in ("none", "llm", "oracle")) and "dataset" in per_dataset


def test_second_ranker_reuses_the_oracle_half_and_rerun_recomputes_nothing(study):
    args, asked, out = study
    assert run_cli(*args, "--ranker", "none", "--quiet").exit_code == 0
    asked.clear()
    result = run_cli(*args, "--ranker", "llm", "--ranker", "none", "--quiet")
    assert result.exit_code == 0, result.stderr
    assert asked == [("llm", q) for q in ("q0", "q2", "q1", "q3")]  # datasets interleaved
    assert [r["ranker"] for r in json.loads(result.stdout)["table1"]] == ["llm", "none", "oracle"]
    asked.clear()
    assert run_cli(*args, "--ranker", "llm", "--quiet").exit_code == 0
    assert asked == []


def test_other_settings_in_the_same_folder_are_refused(study):
    args, asked, out = study
    assert run_cli(*args, "--ranker", "none", "--quiet").exit_code == 0
    one_line_error(run_cli(*args, "--ranker", "none", "--max-turns", "5"), 4, "other settings (max_turns)",
                   "--overwrite")
    asked.clear()
    assert run_cli(*args, "--ranker", "none", "--max-turns", "5", "--overwrite", "--quiet").exit_code == 0
    assert len(asked) == 8


def test_bad_input(study, tmp_path):
    args, _, _ = study
    one_line_error(run_cli(*args, "--ranker", "oracle"), 4, "not a standard ranker")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "question": "?", "answers": ["a"], "dataset": "squad"}) + "\n")
    one_line_error(run_cli("oracle", "--questions", bad, "--index", tmp_path), 3, "bad.jsonl:1:",
                   "unknown dataset 'squad'")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    one_line_error(run_cli("oracle", "--questions", empty, "--index", tmp_path), 3, "no questions")


def test_blocks_leave_paired_results_for_a_partial_report(study, monkeypatch):
    args, asked, out = study
    real = rollout.run_rollouts

    def dies_in_the_second_block(questions, **kwargs):
        if len(asked) >= 4:  # blocks of 2: none q0 q2, oracle q0 q2, then the study is killed
            raise KeyboardInterrupt
        return real(questions, **kwargs)

    monkeypatch.setattr(rollout, "run_rollouts", dies_in_the_second_block)
    assert run_cli(*args, "--ranker", "none", "--block", "2", "--quiet").exit_code != 0  # Ctrl-C
    assert asked == [("none", "q0"), ("none", "q2"), ("oracle", "q0"), ("oracle", "q2")]
    result = run_cli(*args, "--ranker", "none", "--report-only", "--quiet")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["title"].endswith("(PARTIAL: 2 of 4 questions finished in every half)")
    assert {r["ranker"]: r["average"] for r in summary["table1"]} == {"none": 0.5, "oracle": 1.0}
    assert "PARTIAL" in (out / "report.md").read_text()
    assert len(asked) == 4  # --report-only ran nothing


def test_report_only_before_anything_ran(study):
    args, _, _ = study
    one_line_error(run_cli(*args, "--ranker", "none", "--report-only"), 7, "no question is finished")
