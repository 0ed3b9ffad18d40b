"""Held-out sets for studies: stratified shares by hand, exclusion by id and by normalised text, and
bench/learning_split.py run on fixture questions laid out like ../shared/data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import ROOT

from cosearch_cli.errors import ConfigError
from cosearch_cli.records import Question
from cosearch_cli.splits import QuestionKeys, allocate, draw_heldout, sha1_order


def test_allocate_gives_equal_shares_and_passes_on_what_a_small_dataset_lacks():
    # bamboogle has 25 < 210 / 7 = 30: it gives 25, the other six share 185 -> 30 first, then 31 each
    # (185 // 6 = 30; 155 // 5 = 31; ... the remainder goes to the datasets served last, by size then name).
    sizes = {"nq": 2888, "triviaqa": 800, "popqa": 800, "bamboogle": 25, "hotpotqa": 1014,
             "2wikimultihopqa": 800, "musique": 125}
    quotas = allocate(210, sizes)
    assert quotas == {"nq": 31, "triviaqa": 31, "popqa": 31, "bamboogle": 25, "hotpotqa": 31,
                      "2wikimultihopqa": 31, "musique": 30}
    assert sum(quotas.values()) == 210
    assert allocate(9, {"a": 1, "b": 10, "c": 10}) == {"a": 1, "b": 4, "c": 4}
    assert allocate(10, {"a": 1, "b": 10, "c": 10}) == {"a": 1, "b": 4, "c": 5}
    assert allocate(21, {"a": 1, "b": 10, "c": 10}) == {"a": 1, "b": 10, "c": 10}
    with pytest.raises(ConfigError, match="22 held-out questions asked for, only 21"):
        allocate(22, {"a": 1, "b": 10, "c": 10})


def q(qid: str, text: str, dataset: str = "nq") -> Question:
    return Question(qid, text, ["x"], dataset)


def test_question_keys_match_by_id_or_normalised_text():
    keys = QuestionKeys([q("a", "What is the capital of France?")])
    assert keys.matches(q("a", "something else"))
    assert keys.matches(q("z", "what is capital of france"))  # case, punctuation and articles ignored
    assert not keys.matches(q("z", "what is the capital of spain"))


def test_draw_heldout_skips_excluded_questions_and_takes_sha1_order():
    nq = [q(f"nq{i}", f"nq question {i}") for i in range(6)]
    pop = [q(f"pop{i}", f"popqa question {i}", "popqa") for i in range(2)]
    excluded = QuestionKeys([q("nq0", "-"), q("other-id", "NQ question 1!")])  # by id, and by text
    chosen, counts = draw_heldout({"nq": nq, "popqa": pop}, 5, excluded)
    # popqa has 2 < 5 / 2: both; nq the first 3 of its 4 remaining questions in sha1 order.
    assert counts == {"nq": {"questions": 6, "excluded": 2, "drawn": 3},
                      "popqa": {"questions": 2, "excluded": 0, "drawn": 2}}
    remaining = [x.id for x in sha1_order(nq) if x.id not in ("nq0", "nq1")]
    assert [x.id for x in chosen] == remaining[:3] + [x.id for x in sha1_order(pop)]
    with pytest.raises(ConfigError):
        draw_heldout({"nq": nq}, 5, excluded)


def test_learning_split_writes_a_stratified_disjoint_heldout_set_with_a_manifest(tmp_path, fixtures_dir):
    data = tmp_path / "data"
    (data / "dev").mkdir(parents=True)
    (data / "extra_qa_only").mkdir()
    rows = [orjson.loads(line) for name in ("dev.jsonl", "train.jsonl")
            for line in (fixtures_dir / name).read_bytes().splitlines()]
    by_dataset: dict[str, list[dict]] = {}
    for row in rows:
        by_dataset.setdefault(row["dataset"], []).append(row)
    for dataset, members in by_dataset.items():
        (data / "dev" / f"{dataset}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in members))
    # A warm-up that used two nq questions, and an extra training file that repeats every dev question's text
    # under another id: none of those may be held out, and no held-out text may come back through training.
    warm_ids = [r["id"] for r in sha1_order_rows(by_dataset["nq"])[:2]]
    (tmp_path / "warmup.json").write_text(json.dumps({"train_question_ids": warm_ids}))
    copies = [dict(r, id=f"copy-{r['id']}", question=r["question"].upper() + "?") for r in rows]
    (data / "extra_qa_only" / "copies_qa_only.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in copies))
    out = tmp_path / "split"
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "learning_split.py"), "--data", str(data),
                             "--heldout", "60", "--exclude", str(tmp_path / "warmup.json"), "--train-dev-per-dataset",
                             "3", "--train-extra-per-file", "500", "--more-warmup", "2", "--out", str(out)],
                            capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    held = [json.loads(line) for line in (out / "heldout.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    # 7 datasets, 60 questions: bamboogle (13) gives 8 = 60 // 7, the other six 8 or 9; nq lost 2 to the warm-up.
    manifest = json.loads((out / "heldout.manifest.json").read_text())
    drawn = {d: c["drawn"] for d, c in manifest["datasets"].items()}
    assert len(held) == 60 and sum(drawn.values()) == 60 and len(drawn) == 7 and min(drawn.values()) == 8
    assert manifest["datasets"]["nq"]["excluded"] == 2
    assert manifest["stage"] == "learning-split" and manifest["options"]["heldout"] == 60
    # recorded relative to the working directory (the subprocess's is this one), never as an absolute path
    assert os.path.relpath(tmp_path / "warmup.json") in manifest["inputs"]
    assert not any(Path(p).is_absolute() for p in [*manifest["inputs"], manifest["options"]["data"]])
    assert not {r["id"] for r in held} & set(warm_ids)
    held_texts = {r["question"].lower() for r in held}
    assert not {r["id"] for r in held} & {r["id"] for r in train}
    assert not held_texts & {r["question"].lower().rstrip("?") for r in train}
    assert len(train) == 7 * 3 + (len(rows) - 60)  # every copy not of a held-out question
    assert held[0].keys() >= {"id", "question", "answers", "dataset", "source_split"}  # fields kept
    assert (out / "train.manifest.json").is_file() and not (out / "eval.jsonl").exists()
    # --more-warmup: here every dev text comes back as an extra-file training copy, so none is left for it
    assert (out / "warmup_more.jsonl").read_text() == ""
    # without the copies: the 2 dev questions of each dataset that follow its 3 training ones in sha1 order
    (data / "extra_qa_only" / "copies_qa_only.jsonl").unlink()
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "learning_split.py"), "--data", str(data),
                             "--heldout", "60", "--exclude", str(tmp_path / "warmup.json"), "--train-dev-per-dataset",
                             "3", "--more-warmup", "2", "--out", str(tmp_path / "split2")],
                            capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    more = [json.loads(line) for line in (tmp_path / "split2" / "warmup_more.jsonl").read_text().splitlines()]
    held_ids = {r["id"] for r in held}
    for dataset, members in by_dataset.items():
        kept = [r["id"] for r in sha1_order_rows(members) if r["id"] not in held_ids]
        assert [r["id"] for r in more if r["dataset"] == dataset] == kept[3:5], dataset
    assert len(more) == 14 and not {r["id"] for r in more} & (held_ids | {r["id"] for r in train})


def sha1_order_rows(rows: list[dict]) -> list[dict]:
    order = [x.id for x in sha1_order(Question(r["id"], r["question"], r["answers"]) for r in rows)]
    return sorted(rows, key=lambda r: order.index(r["id"]))


def test_fresh_heldout_takes_from_the_back_of_the_sha1_order_and_skips_excluded_questions(tmp_path, fixtures_dir):
    data = tmp_path / "data"
    (data / "dev").mkdir(parents=True)
    rows = [orjson.loads(line) for line in (fixtures_dir / "dev.jsonl").read_bytes().splitlines()]
    nq = [r for r in rows if r["dataset"] == "nq"]
    (data / "dev" / "nq.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in nq))
    back = sha1_order_rows(nq)[::-1]
    # the last question in sha1 order by id, the next one by its text under another id
    excluded = [back[0], dict(back[1], id="other-id", question=back[1]["question"].upper())]
    (tmp_path / "used.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in excluded))
    out = tmp_path / "fresh" / "q.jsonl"

    def run(per_dataset: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "bench" / "fresh_heldout.py"), "--data", str(data),
                               "--datasets", "nq", "--per-dataset", str(per_dataset), "--exclude",
                               str(tmp_path / "used.jsonl"), "--out", str(out)],
                              capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})

    result = run(3)
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [r["id"] for r in back[2:5]]
    manifest = json.loads(out.with_name("q.manifest.json").read_text())
    assert manifest["datasets"] == {"nq": {"questions": len(nq), "excluded": 2, "drawn": 3}}
    result = run(len(nq) - 1)
    assert result.returncode != 0 and f"nq: only {len(nq) - 2} questions left" in result.stderr
