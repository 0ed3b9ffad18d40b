"""The bundled fixture split: every dataset of the paper's seven in dev, train and dev disjoint, and the
numbers fixtures/README.md gives are the files' own."""

from __future__ import annotations

import re
import sys
from collections import Counter

import orjson
import pytest
from conftest import FIXTURES, ROOT

from cosearch_cli.evaluate import DATASETS
from cosearch_cli.metrics import normalize_answer


def rows(name: str) -> list[dict]:
    return [orjson.loads(line) for line in (FIXTURES / name).read_bytes().splitlines() if line.strip()]


def test_every_dataset_is_in_dev_so_dev_averages_are_over_the_seven():
    assert set(Counter(q["dataset"] for q in rows("dev.jsonl"))) == set(DATASETS)


def test_train_and_dev_are_disjoint():
    train, dev = rows("train.jsonl"), rows("dev.jsonl")
    assert not {q["id"] for q in train} & {q["id"] for q in dev}
    assert not {normalize_answer(q["question"]) for q in train} & {normalize_answer(q["question"]) for q in dev}


def test_the_readme_counts_are_the_files():
    readme = (FIXTURES / "README.md").read_text()
    for name in ("train.jsonl", "dev.jsonl"):
        counts = Counter(q["dataset"] for q in rows(name))
        line = next(ln for ln in readme.splitlines() if ln.startswith(f"| `{name}` |"))
        total, per_dataset, bamboogle = map(int, re.search(r"(\d+) questions \((\d+) per dataset, (\d+) for "
                                                           r"Bamboogle\)", line).groups())
        assert total == sum(counts.values()) and bamboogle == counts["bamboogle"]
        assert {n for d, n in counts.items() if d != "bamboogle"} == {per_dataset}
    passages = int(re.search(r"\| `corpus.jsonl` \| ([\d,]+) passages", readme).group(1).replace(",", ""))
    assert passages == len(rows("corpus.jsonl"))


@pytest.mark.skipif(not (ROOT.parent / "shared" / "data" / "corpus").is_dir(), reason="needs ../shared/data")
def test_make_fixtures_reproduces_the_committed_files(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import make_fixtures
    finally:
        sys.path.pop(0)
    make_fixtures.main(ROOT.parent / "shared" / "data", tmp_path)
    for name in ("corpus.jsonl", "train.jsonl", "dev.jsonl"):
        assert (tmp_path / name).read_bytes() == (FIXTURES / name).read_bytes(), name
