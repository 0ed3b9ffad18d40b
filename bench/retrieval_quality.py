"""Retrieval quality on the shared data: gold-passage recall@10 (multi-hop) and answer hit@5 (single-hop).

    .venv/bin/python bench/retrieval_quality.py [--data ../shared/data] [--index indexes/shared-32k]

Builds the index over all corpus files (BM25, plus dense MiniLM when --dense) if the folder is missing, then
searches every dev question with each retriever the index has and writes a Markdown table.
- recall@10: per question, the share of its gold_passage_ids in the top 10, averaged (hotpotqa, 2wiki, musique)
- hit@5: share of questions with a gold answer (metrics.has_answer, DPR rule) in the text of a top-5 passage
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import sys
import time
from pathlib import Path

import orjson

from cosearch_cli.index import Corpus, build_index, open_index
from cosearch_cli.metrics import has_answer

MULTI_HOP = ("hotpotqa", "2wikimultihopqa", "musique")
SINGLE_HOP = ("nq", "triviaqa", "popqa", "bamboogle")
FLOOR = {"hotpotqa": 0.824, "2wikimultihopqa": 0.713, "musique": 0.556}  # ../shared/data/README.md


def load_questions(data: Path, dataset: str) -> list[dict]:
    return [orjson.loads(line) for line in (data / "dev" / f"{dataset}.jsonl").read_bytes().splitlines() if line]


def query_vectors(dataset: str, texts: list[str], encoder):
    """Encoded questions, cached by (encoder, question texts) next to the passage embeddings."""
    import hashlib

    import numpy as np

    from cosearch_cli.index.dense import embedding_cache_path

    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()
    path = embedding_cache_path(encoder.name, digest).with_name(f"queries-{dataset}-{digest[:16]}.npy")
    if path.is_file():
        return np.load(path)
    vectors = encoder.encode_queries(texts)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def evaluate(index, kind: str, data: Path, batch: int = 512,
             index_type: str | None = None) -> dict[str, tuple[str, float, int, float]]:
    retriever = index.retriever(kind, index_type=index_type)
    rows = {}
    for dataset in MULTI_HOP + SINGLE_HOP:
        questions = load_questions(data, dataset)
        if dataset in MULTI_HOP:
            questions = [q for q in questions if q.get("gold_passage_ids")]
        start = time.perf_counter()
        texts = [q["question"] for q in questions]
        if kind == "dense":  # query encoding dominates on CPU: reuse vectors from an earlier run
            hits = retriever.search_vectors(query_vectors(dataset, texts, retriever.encoder), 10)
        else:
            hits = [h for i in range(0, len(texts), batch) for h in retriever.search(texts[i:i + batch], 10)]
        seconds = time.perf_counter() - start
        if dataset in MULTI_HOP:
            scores = [len({h.id for h in hs[:10]} & set(q["gold_passage_ids"])) / len(q["gold_passage_ids"])
                      for q, hs in zip(questions, hits)]
            metric = "gold-passage recall@10"
        else:
            scores = [any(has_answer(p.text, q["answers"]) for p in index.docs.get([h.id for h in hs[:5]]))
                      for q, hs in zip(questions, hits)]
            metric = "answer hit@5"
        rows[dataset] = (metric, sum(scores) / len(scores), len(questions), seconds)
    return rows


SWEEP = [  # (k1, b, stemmer, title weight); the last row is what cosearch ships
    (0.9, 0.4, None, 1), (1.5, 0.75, None, 1), (0.9, 0.4, "english", 1), (1.5, 0.75, "english", 1),
    (1.5, 0.75, "english", 2), (1.2, 0.75, "english", 3), (1.5, 0.75, "english", 4)]


def bm25_sweep(index, data: Path, out: str) -> None:
    """Multi-hop recall@10 for BM25 settings, built from the index's doc store (how the defaults were chosen)."""
    import tempfile

    from cosearch_cli.index import bm25

    questions = {d: [q for q in load_questions(data, d) if q.get("gold_passage_ids")] for d in MULTI_HOP}
    lines = ["# BM25 settings on the shared dev questions (multi-hop gold-passage recall@10)", "",
             f"Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`  ",
             f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; bm25s, Lucene scoring, English "
             f"stopwords, {index.manifest['corpus']['passages']:,} passages. Chosen on these dev questions "
             "(there is no other labelled split with this corpus), so the margin over the floor is optimistic.", "",
             "| k1 | b | stemmer | title weight | " + " | ".join(MULTI_HOP) + " |", "|---|---|---|---|---|---|---|"]
    for k1, b, stemmer, title_weight in SWEEP:
        folder = Path(tempfile.mkdtemp(prefix="bm25-sweep-"))
        bm25.build_bm25(iter(index.docs), folder, k1=k1, b=b, stemmer=stemmer, title_weight=title_weight)
        retriever = bm25.BM25Retriever(folder, index.docs.row_ids(), stemmer=stemmer)
        values = []
        for dataset, qs in questions.items():
            hits = retriever.search([q["question"] for q in qs], 10)
            values.append(sum(len({h.id for h in hs} & set(q["gold_passage_ids"])) / len(q["gold_passage_ids"])
                              for q, hs in zip(qs, hits)) / len(qs))
        lines.append(f"| {k1} | {b} | {stemmer or '-'} | {title_weight} | "
                     + " | ".join(f"{v:.3f}" for v in values) + " |")
    lines.append(f"| | | | floor | {FLOOR['hotpotqa']} | {FLOOR['2wikimultihopqa']} | {FLOOR['musique']} |")
    Path(out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data", help="folder with corpus/ and dev/")
    parser.add_argument("--index", default="indexes/shared-32k", help="index folder (built if missing)")
    parser.add_argument("--dense", action="store_true", help="also build and score the dense MiniLM index")
    parser.add_argument("--out", default="bench/results/retrieval_quality.md", help="Markdown table to write")
    parser.add_argument("--encode-queries", action="store_true",
                        help="only encode the dev questions with MiniLM into the cache (can run while the "
                             "corpus is still being encoded)")
    parser.add_argument("--bm25-sweep", metavar="OUT", help="instead: compare BM25 settings, write this table")
    args = parser.parse_args()
    data = Path(args.data)
    if args.encode_queries:
        from cosearch_cli.index.dense import HFEncoder

        encoder = HFEncoder("minilm")
        for dataset in MULTI_HOP + SINGLE_HOP:
            questions = [q for q in load_questions(data, dataset)
                         if dataset not in MULTI_HOP or q.get("gold_passage_ids")]
            query_vectors(dataset, [q["question"] for q in questions], encoder)
        return
    if not Path(args.index).is_dir():
        paths = sorted(glob.glob(str(data / "corpus" / "*.jsonl")))
        build_index(Corpus(paths), args.index, dense="minilm" if args.dense else None)
    index = open_index(args.index)
    if args.bm25_sweep:
        return bm25_sweep(index, data, args.bm25_sweep)
    results = {kind: evaluate(index, kind, data) for kind in index.kinds}
    kinds = list(results)
    lines = [
        "# Retrieval quality on the shared dev questions",
        "",
        f"Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, no GPU, shared/noisy.  ",
        f"Corpus: {index.manifest['corpus']['passages']:,} passages (sha256 {index.manifest['corpus']['sha256'][:12]}); "
        f"BM25: {index.manifest.get('bm25')}; dense: {index.manifest.get('dense', {}).get('encoder')} "
        f"{index.manifest.get('dense', {}).get('index_types', '')}.",
        "",
        "| dataset | metric | questions | " + " | ".join(kinds) + " | floor (data README) |",
        "|---|---|---|" + "---|" * len(kinds) + "---|",
    ]
    for dataset in MULTI_HOP + SINGLE_HOP:
        metric, _, n, _ = results[kinds[0]][dataset]
        values = " | ".join(f"{results[k][dataset][1]:.3f}" for k in kinds)
        lines.append(f"| {dataset} | {metric} | {n} | {values} | {FLOOR.get(dataset, '-')} |")
    lines += ["", "Search time for all questions (k=10, batches of 512): " + ", ".join(
        f"{k} {sum(r[3] for r in results[k].values()):.1f} s" for k in kinds) + " (dense: FAISS only, the "
        "MiniLM query vectors come from the cache that `--encode-queries` fills).",
        "Dense documents are encoded as `\"title\"\\ntext` (the Search-R1 `contents` form), up to 256 tokens."]
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
