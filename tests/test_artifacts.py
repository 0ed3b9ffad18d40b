"""Artifacts: JSONL/Parquet by suffix, stdin/stdout, atomic writes, manifests, line-numbered errors."""

import io
import sys

import orjson
import polars as pl
import pytest

from cosearch_cli.artifacts import Reader, Writer, make_manifest, manifest_path
from cosearch_cli.errors import InputError, RecordError
from cosearch_cli.records import Passage, from_dict, read_question, read_rollout


def test_jsonl_roundtrip_with_manifest(tmp_path):
    out = tmp_path / "passages.jsonl"
    with Writer(out) as w:
        w.write(Passage("p1", "T", "x"))
        w.write({"id": "p2", "title": "U", "text": "y"})
        w.manifest = make_manifest("test", {"a": 1}, seed=3)
    reader = Reader.open(out)
    rows = [from_dict(Passage, r.data, path=r.path, line=r.line) for r in reader.rows()]
    assert rows == [Passage("p1", "T", "x"), Passage("p2", "U", "y")]
    manifest = orjson.loads(manifest_path(out).read_bytes())
    assert manifest["stage"] == "test" and manifest["seed"] == 3 and "polars" in manifest["packages"]
    assert list(reader.hashes) == [str(out)] and len(reader.hashes[str(out)]) == 64
    assert [m["stage"] for m in reader.upstream] == ["test"]  # the sidecar is the file's provenance


def test_parquet_roundtrip_opens_in_polars(tmp_path):
    out = tmp_path / "summary.parquet"
    with Writer(out) as w:
        w.write({"group": "q1/agent", "size": 8, "kept": True})
        w.manifest = make_manifest("test", {})
    frame = pl.read_parquet(out)
    assert frame.to_dicts() == [{"group": "q1/agent", "size": 8, "kept": True}]
    assert [r.data["size"] for r in Reader.open(out).rows()] == [8]


def test_failed_write_leaves_previous_file(tmp_path):
    out = tmp_path / "a.jsonl"
    out.write_text('{"old": 1}\n')
    with pytest.raises(RuntimeError):
        with Writer(out) as w:
            w.write({"new": 1})
            raise RuntimeError("stage failed")
    assert out.read_text() == '{"old": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["a.jsonl"]


def test_bad_json_names_file_and_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a"}\n{not json\n')
    with pytest.raises(RecordError) as err:
        list(Reader.open(path).rows())
    assert str(err.value).startswith(f"{path}:2: not valid JSON")
    assert "JSONL" in str(err.value)


def test_missing_file_and_empty_glob(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        Reader.open(tmp_path / "nope.jsonl")
    with pytest.raises(InputError, match="no file matches"):
        Reader.open(str(tmp_path / "*.jsonl"))


def test_stdin_stdout_and_manifest_lines(monkeypatch, capsysbinary):
    manifest = make_manifest("up", {})
    stream = orjson.dumps({"id": "p", "title": "t", "text": "x"}) + b"\n" + orjson.dumps(manifest) + b"\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stream)))
    reader = Reader.open("-")
    assert [r.data["id"] for r in reader.rows()] == ["p"]
    assert reader.upstream[0]["stage"] == "up" and "<stdin>" in reader.hashes
    with Writer("-") as w:
        w.write({"x": 1})
        w.manifest = make_manifest("down", {}, upstream=reader.upstream)
    lines = capsysbinary.readouterr().out.splitlines()
    assert orjson.loads(lines[0]) == {"x": 1}
    assert orjson.loads(lines[1])["upstream"][0]["stage"] == "up"


def test_record_type_errors_name_field():
    with pytest.raises(RecordError, match="field 'title' should be str, got int"):
        from_dict(Passage, {"id": "a", "title": 3, "text": "x"}, path="c.jsonl", line=7)
    with pytest.raises(RecordError, match="c.jsonl:7: missing field 'text'"):
        from_dict(Passage, {"id": "a", "title": "t"}, path="c.jsonl", line=7)


def test_question_keeps_extra_fields_and_needs_answers():
    q = read_question({"id": "q", "question": "?", "answers": ["a"], "dataset": "nq", "level": "hard"}, "f", 1)
    assert q.extra == {"level": "hard"}
    with pytest.raises(RecordError, match="has no gold answers"):
        read_question({"id": "q", "question": "?", "answers": []}, "f", 2)


def test_rollout_schema_and_stage_checks():
    base = {"kind": "rollout", "schema": 1, "question_id": "q", "question": "?", "answers": ["a"],
            "dataset": "nq", "trajectories": []}
    assert read_rollout(base, "r.jsonl", 1).stage == "rollout"
    with pytest.raises(RecordError, match="schema version 0"):
        read_rollout({**base, "schema": 0}, "r.jsonl", 2)
    with pytest.raises(RecordError, match="cosearch group"):
        read_rollout(base, "r.jsonl", 3, min_stage="grouped")
    with pytest.raises(RecordError, match="expected a rollout record"):
        read_rollout({"kind": "other"}, "r.jsonl", 4)
