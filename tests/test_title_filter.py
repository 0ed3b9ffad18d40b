"""bench/title_filter.py, with its rules in cosearch_cli/answerable.py: which training questions have a gold
answer that is a retrieved passage's title."""

import subprocess
import sys

import orjson

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from title_filter import flags  # noqa: E402

from cosearch_cli.answerable import answer_is_title, title_forms  # noqa: E402


def test_title_forms_strip_a_trailing_qualifier():
    assert title_forms("Scrutiny (Journal)") == {"scrutiny journal", "scrutiny"}
    assert title_forms("The Beatles") == {"beatles"}  # SQuAD normalisation drops articles


def test_answer_is_title_compares_normalised_forms():
    assert answer_is_title(["scrutiny"], ["Scrutiny (Journal)", "Other"])
    assert answer_is_title(["Annam", "the Beatles!"], ["Beatles"])
    assert not answer_is_title(["Brazil"], ["Women's volleyball at the 2012 Summer Olympics"])
    assert not answer_is_title(["Brazil"], [])


def test_flags_use_the_retrievers_top_n(fixture_bm25):
    rows = [{"question": "Lyon Cohen Polish-born Canadian businessman philanthropist", "answers": ["Lyon Cohen"]},
            {"question": "Lyon Cohen Polish-born Canadian businessman philanthropist", "answers": ["Montreal"]}]
    assert flags(rows, fixture_bm25, 3) == [True, False]


def test_script_writes_the_kept_questions_and_counts(tmp_path, fixture_bm25):
    questions = tmp_path / "q.jsonl"
    rows = [{"id": "a", "question": "Lyon Cohen Polish-born Canadian businessman philanthropist",
             "answers": ["Lyon Cohen"]},
            {"id": "b", "question": "Lyon Cohen Polish-born Canadian businessman philanthropist",
             "answers": ["Montreal"]}]
    questions.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out = tmp_path / "kept.jsonl"
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "title_filter.py"), "--questions", str(questions),
                             "--index", str(fixture_bm25.folder), "--top-n", "3", "--out", str(out)],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()] == ["b"]
    assert orjson.loads(result.stdout) == {"questions": 2, "dropped": 1, "kept": 1}
    manifest = orjson.loads((tmp_path / "kept.manifest.json").read_bytes())
    assert manifest["stage"] == "title_filter"
    assert manifest["options"]["counts"] == {"questions": 2, "dropped": 1, "kept": 1}
