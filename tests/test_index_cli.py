"""`cosearch index` and `cosearch search` from the command line, including every bad-input message."""

import re

import orjson
import pytest

from conftest import run_cli

GOOD = [{"id": "p1", "title": "Leonard Cohen", "text": "Canadian singer and poet, grandson of Lyon Cohen."},
        {"id": "p2", "contents": '"Hamlet"\nA tragedy written by William Shakespeare.'},
        {"id": "p3", "title": "Paris", "text": "Paris is the capital of France."}]


def write_lines(path, rows):
    path.write_bytes(b"".join((r if isinstance(r, bytes) else orjson.dumps(r)) + b"\n" for r in rows))
    return path


@pytest.fixture
def built(tmp_path):
    corpus = write_lines(tmp_path / "corpus.jsonl", GOOD)
    result = run_cli("index", "build", "--corpus", corpus, "--out", tmp_path / "ix", "--quiet")
    assert result.exit_code == 0, result.stderr
    return tmp_path / "ix"


@pytest.fixture(scope="module")
def fixture_index(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fixture") / "fx"
    result = run_cli("index", "fixture", "--out", folder, "--quiet")
    assert result.exit_code == 0, result.stderr
    return folder


def test_build_then_search_one_query_and_a_batch(tmp_path, built):
    manifest = orjson.loads((built / "index.manifest.json").read_bytes())
    assert manifest["corpus"]["passages"] == 3 and manifest["options"]["bm25"] is True
    one = run_cli("search", "--index", built, "who wrote hamlet", "-k", "2")
    assert one.exit_code == 0, one.stderr
    assert one.stdout.splitlines()[0].split("\t") == ["1", one.stdout.split("\t")[1], "p2", "Hamlet",
                                                      "A tragedy written by William Shakespeare."]
    questions = write_lines(tmp_path / "q.jsonl", [{"id": "q1", "question": "capital of France"},
                                                   {"id": "q2", "question": "Lyon Cohen grandson"}])
    batch = run_cli("search", "--index", built, "--queries", questions, "-o", tmp_path / "hits.jsonl", "-k", "1",
                    "--text")
    assert batch.exit_code == 0, batch.stderr
    rows = [orjson.loads(line) for line in (tmp_path / "hits.jsonl").read_bytes().splitlines()]
    assert [(r["id"], r["hits"][0]["id"], r["hits"][0]["title"]) for r in rows] == [
        ("q1", "p3", "Paris"), ("q2", "p1", "Leonard Cohen")]
    sidecar = orjson.loads((tmp_path / "hits.manifest.json").read_bytes())
    assert sidecar["stage"] == "search" and sidecar["options"]["k"] == 1


def test_index_fixture_builds_bm25_and_dense_from_shipped_vectors(fixture_index):
    manifest = orjson.loads((fixture_index / "index.manifest.json").read_bytes())
    assert manifest["corpus"]["passages"] == 1464 and manifest["dense"]["encoder"] == "minilm"
    dense = run_cli("search", "--index", fixture_index, "--retriever", "dense", "-k", "1",
                    "grandfather of the singer Leonard Cohen")
    assert dense.exit_code == 0 and dense.stdout.split("\t")[2] == "2wiki-000070", dense.stdout


@pytest.mark.parametrize("lines, message", [
    ([GOOD[0], b'{"id": "p9", "title": "x", "text": '], r"corpus.jsonl:2: not valid JSON .* - each line must be"),
    ([GOOD[0], {"id": "p9", "title": "No text"}], r"corpus.jsonl:2: missing field 'text' - each line needs"),
    ([GOOD[0], GOOD[2], {**GOOD[2], "text": "again"}],
     r"corpus.jsonl:3: duplicate passage id 'p3' \(first at .*corpus.jsonl:2\) - passage ids must be unique"),
    ([], r"corpus.jsonl: the corpus is empty - pass a JSONL file"),
])
def test_bad_corpus_is_one_line_exit_3_and_no_index(tmp_path, lines, message):
    corpus = write_lines(tmp_path / "corpus.jsonl", lines)
    result = run_cli("index", "build", "--corpus", corpus, "--out", tmp_path / "ix", "--quiet")
    assert result.exit_code == 3
    assert len(result.stderr.strip().splitlines()) == 1
    assert re.search(message, result.stderr), result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]  # no index, no temp folder


def test_wrong_encoder_path_exit_5_before_anything_is_written(tmp_path):
    corpus = write_lines(tmp_path / "corpus.jsonl", GOOD)
    result = run_cli("index", "build", "--corpus", corpus, "--out", tmp_path / "ix", "--dense", tmp_path / "nope")
    assert result.exit_code == 5
    assert "encoder" in result.stderr and "nope" in result.stderr and "pass a local folder or 'minilm'" in result.stderr
    assert not (tmp_path / "ix").exists()


def test_full_disk_is_one_line_exit_9_and_no_index(tmp_path, monkeypatch):
    import errno

    from cosearch_cli.index import docstore

    def full(self, passage):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.folder / docstore.PASSAGES))

    monkeypatch.setattr(docstore.DocStoreWriter, "add", full)
    corpus = write_lines(tmp_path / "corpus.jsonl", GOOD)
    result = run_cli("index", "build", "--corpus", corpus, "--out", tmp_path / "ix", "--quiet")
    assert result.exit_code == 9
    assert len(result.stderr.strip().splitlines()) == 1
    assert re.fullmatch(r"error: .*passages\.jsonl: No space left on device - free some space \(or pass another "
                        r"output path\), then run the command again: nothing half-written was kept", result.stderr.strip())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]  # no index, no temp folder


def test_storage_error_knows_wrapped_disk_full_and_leaves_other_errors_alone():
    import errno

    from cosearch_cli.errors import storage_error

    # what safetensors raises when a checkpoint does not fit
    wrapped = storage_error(RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                                         'message: "No space left on device" })'))
    assert wrapped is not None and wrapped.exit_code == 9 and str(wrapped).startswith("no space left on device - ")
    denied = storage_error(PermissionError(errno.EACCES, "Permission denied", "/root/x"))
    assert str(denied).startswith("/root/x: Permission denied - choose a folder you can write to")
    assert storage_error(FileNotFoundError(errno.ENOENT, "No such file", "x")) is None
    assert storage_error(ValueError("bad value")) is None


def test_missing_index_folder_exit_6(tmp_path):
    result = run_cli("search", "--index", tmp_path / "nowhere", "anything")
    assert result.exit_code == 6
    assert result.stderr.strip() == (f"error: {tmp_path / 'nowhere'}: no index folder here - build it with "
                                     "`cosearch index fixture` or `cosearch index build --corpus PATH --out DIR`")


def test_dense_search_with_another_encoder_exit_6_naming_both(tmp_path, fixture_index):
    other = tmp_path / "other-encoder"
    other.mkdir()
    (other / "config.json").write_text("{}")
    result = run_cli("search", "--index", fixture_index, "--retriever", "dense", "--encoder", other, "q")
    assert result.exit_code == 6
    assert f"built with encoder 'minilm', not '{other}'" in result.stderr and "--encoder minilm" in result.stderr


def test_queries_missing_field_and_existing_output(tmp_path, built):
    questions = write_lines(tmp_path / "q.jsonl", [{"id": "q1", "question": "paris"}, {"id": "q2", "text": "x"}])
    result = run_cli("search", "--index", built, "--queries", questions, "-o", tmp_path / "out.jsonl")
    assert result.exit_code == 3 and "q.jsonl:2: missing field 'question'" in result.stderr
    assert not (tmp_path / "out.jsonl").exists()
    corpus = write_lines(tmp_path / "corpus2.jsonl", GOOD)
    again = run_cli("index", "build", "--corpus", corpus, "--out", built, "--quiet")
    assert again.exit_code == 8 and "--overwrite" in again.stderr


def test_index_wiki_reads_the_flashrag_contents_form(tmp_path):
    rows = [{"id": str(i), "contents": f'"Title {i}"\nPassage number {i} about topic{i}.'} for i in range(5)]
    corpus = write_lines(tmp_path / "wiki.jsonl", rows)
    result = run_cli("index", "wiki", "--corpus", corpus, "--out", tmp_path / "wiki")
    assert result.exit_code == 0, result.stderr
    assert "indexed 5 passages (bm25)" in result.stderr and result.stdout == ""
    found = run_cli("search", "--index", tmp_path / "wiki", "topic3", "-k", "1")
    assert found.stdout == "1\t" + found.stdout.split("\t")[1] + "\t3\tTitle 3\tPassage number 3 about topic3.\n"
