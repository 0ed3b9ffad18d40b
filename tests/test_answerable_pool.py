"""bench/answerable_pool.py: training questions whose gold answer the agent is shown, and no title shortcut."""

import subprocess
import sys

import orjson

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from answerable_pool import answerable  # noqa: E402
from test_answerable import WordTokenizer  # noqa: E402


def test_answer_must_show_within_the_budget_of_the_first_k():
    texts = ["one two three four Montreal", "Montreal is here", "nothing"]
    titles = ["A", "B", "C"]
    tok = WordTokenizer()
    assert answerable(["Montreal"], texts, titles, k=1, tokenizer=tok, passage_tokens=5)
    assert not answerable(["Montreal"], texts, titles, k=1, tokenizer=tok, passage_tokens=4)  # cut before it
    assert answerable(["Montreal"], texts, titles, k=2, tokenizer=tok, passage_tokens=4)  # the second shows it
    assert not answerable(["Montreal"], texts[2:] + texts[:2], titles, k=1, tokenizer=tok, passage_tokens=50)


def test_title_answers_and_yes_no_never_count():
    tok = WordTokenizer()
    assert not answerable(["Lyon Cohen"], ["Lyon Cohen was born"], ["Lyon Cohen"], k=3, tokenizer=tok,
                          passage_tokens=48)
    assert not answerable(["yes"], ["yes it was"], ["A"], k=3, tokenizer=tok, passage_tokens=48)


def test_script_draws_unseen_dev_questions_it_can_answer(tmp_path, fixture_bm25):
    dev = tmp_path / "data" / "dev"
    dev.mkdir(parents=True)
    query = "Lyon Cohen Polish-born Canadian businessman philanthropist grandfather"
    rows = [{"id": "kept", "question": query, "answers": ["Leonard Cohen"], "dataset": "2wikimultihopqa"},
            {"id": "title", "question": query + " who", "answers": ["Lyon Cohen"], "dataset": "2wikimultihopqa"},
            {"id": "absent", "question": query + " where", "answers": ["Zanzibar"], "dataset": "2wikimultihopqa"},
            {"id": "held", "question": "Fernando Cortes Puerto Rican film actor born where",
             "answers": ["San Juan"], "dataset": "2wikimultihopqa"}]
    (dev / "2wikimultihopqa.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    held = tmp_path / "held.jsonl"
    held.write_bytes(orjson.dumps(rows[3] | {"id": "other-id", "question": "fernando cortes, Puerto Rican film actor: "
                                             "born WHERE?"}) + b"\n")  # the same normalised text, another id
    out = tmp_path / "pool.jsonl"
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "answerable_pool.py"), "--data",
                             str(tmp_path / "data"), "--exclude", str(held), "--index", str(fixture_bm25.folder),
                             "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()] == ["kept"]
    assert orjson.loads(result.stdout)["per_dataset"]["2wikimultihopqa"] == {"candidates": 3, "looked_at": 3,
                                                                            "kept": 1}
    manifest = orjson.loads((tmp_path / "pool.manifest.json").read_bytes())
    assert manifest["stage"] == "answerable_pool" and manifest["options"]["counts"]["2wikimultihopqa"]["kept"] == 1
