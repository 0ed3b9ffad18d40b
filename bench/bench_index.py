"""Index build and search speed on the shared 32k corpus: cosearch's retrievers side by side with the bare
libraries doing the same work, plus the FAISS index types and (with --pyserini) pyserini against bm25s.

    .venv/bin/python bench/bench_index.py [--data ../shared/data] [--pyserini /tmp/venv-pyserini/bin/python]

- BM25 build: build_index(bm25 only; doc store included) vs bm25s tokenize + index + save of the same texts.
- BM25 search, k=50, all dev questions in one batch: Index.retriever("bm25").search vs bm25s.tokenize+retrieve.
- Dense build from cached MiniLM embeddings (run bench/retrieval_quality.py --dense first, or any dense build
  of the corpus; without them random unit vectors of the same shape): build_index(dense, embeddings=...) vs
  faiss IndexFlatIP.add + write_index, and vs that plus a plain JSONL/npy doc store (ours writes one too).
- Dense build that encodes (the first --dense-build-passages passages): build_index(dense="minilm") vs
  transformers AutoModel + mean pooling + L2 norm + faiss, written here; bare, then ours and bare in turn.
- Dense search (cached embeddings only): DenseRetriever.search vs the same encoder call + faiss search (and
  faiss alone on precomputed query vectors).
- FAISS types: bytes per passage, recall@50 against flat on the dev queries, queries/s; wiki-18 extrapolation.
- pyserini 0.25 (Lucene, Java 17) in its own interpreter: JVM start, index build, batch search, quality.
Each timing is the median of --repeats runs, ours and bare alternating so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WIKI18 = 21_015_324  # passages in the Search-R1/FlashRAG wiki-18 100-word dump


def read_jsonl(pattern: str) -> list[dict]:
    """Rows of every file matching `pattern`, files in sorted order (stdlib only: runs in the pyserini venv)."""
    rows = []
    for path in sorted(glob.glob(pattern)):
        with open(path) as handle:
            rows.extend(json.loads(line) for line in handle if line.strip())
    return rows


def load_corpus_rows(data: Path) -> list[dict]:
    return read_jsonl(str(data / "corpus" / "*.jsonl"))


def load_questions(data: Path) -> list[dict]:
    return read_jsonl(str(data / "dev" / "*.jsonl"))


# ---------------------------------------------------------------------------------------------------------
# pyserini worker: runs inside the pyserini virtual environment (no cosearch, no orjson there)


def pyserini_worker(args) -> None:
    t0 = time.perf_counter()
    from pyserini.search.lucene import LuceneSearcher  # starts the JVM

    jvm_start = time.perf_counter() - t0
    rows = load_corpus_rows(Path(args.data))
    questions = load_questions(Path(args.data))
    report = {"jvm_start_s": jvm_start, "passages": len(rows), "queries": len(questions), "runs": {}}
    for name, title_weight, k1, b in (("default", 1, 0.9, 0.4), ("cosearch-settings", 4, 1.5, 0.75)):
        work = Path(tempfile.mkdtemp(prefix=f"pyserini-{name}-"))
        (work / "docs").mkdir()
        with open(work / "docs" / "corpus.jsonl", "w") as handle:
            for r in rows:
                contents = " ".join([r["title"]] * title_weight) + "\n" + r["text"]
                handle.write(json.dumps({"id": r["id"], "contents": contents}) + "\n")
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pyserini.index.lucene", "--collection", "JsonCollection",
                        "--input", str(work / "docs"), "--index", str(work / "index"), "--generator",
                        "DefaultLuceneDocumentGenerator", "--threads", "1"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        index_s = time.perf_counter() - start
        searcher = LuceneSearcher(str(work / "index"))
        searcher.set_bm25(k1, b)
        texts = [q["question"] for q in questions]
        qids = [str(i) for i in range(len(texts))]
        searcher.batch_search(texts[:50], qids[:50], k=50, threads=1)  # warm-up
        start = time.perf_counter()
        results = searcher.batch_search(texts, qids, k=50, threads=1)
        batch_s = time.perf_counter() - start
        start = time.perf_counter()
        for text in texts[:500]:
            searcher.search(text, k=50)
        single_qps = 500 / (time.perf_counter() - start)
        report["runs"][name] = {"k1": k1, "b": b, "title_weight": title_weight, "index_s": index_s,
                                "batch_qps": len(texts) / batch_s, "single_qps": single_qps,
                                "top10": [[h.docid for h in results[q][:10]] for q in qids]}
    json.dump(report, sys.stdout)


def run_pyserini(python: str, data: Path) -> dict:
    env = {**os.environ, "JAVA_TOOL_OPTIONS": "-Xmx4g"}
    done = subprocess.run([python, __file__, "--worker", "--data", str(data)], capture_output=True, text=True,
                          env=env, check=True)
    return json.loads(done.stdout)


# ---------------------------------------------------------------------------------------------------------
# Quality of a run (ids per question, question order = load_questions)


def quality(top10: list[list[str]], questions: list[dict], docs) -> dict[str, float]:
    from cosearch_cli.metrics import has_answer

    by_set: dict[str, list[float]] = {}
    for q, ids in zip(questions, top10):
        if q.get("gold_passage_ids"):
            value = len(set(ids[:10]) & set(q["gold_passage_ids"])) / len(q["gold_passage_ids"])
        elif q["dataset"] in ("nq", "triviaqa", "popqa", "bamboogle"):
            value = float(any(has_answer(p.text, q["answers"]) for p in docs.get(ids[:5])))
        else:
            continue
        by_set.setdefault(q["dataset"], []).append(value)
    return {name: sum(v) / len(v) for name, v in sorted(by_set.items())}


# ---------------------------------------------------------------------------------------------------------
# Speed: cosearch vs bare libraries


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def alternate(*fns, repeats: int) -> tuple[float, ...]:
    """Median seconds of each function, the functions run in turn `repeats` times."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return tuple(statistics.median(t) for t in times)


def bench_bm25(passages, queries, work: Path, repeats: int) -> list[tuple]:
    import bm25s
    import numpy as np

    from cosearch_cli.index import build_index, open_index
    from cosearch_cli.index import bm25 as ours_bm25

    def ours_build():
        build_index(passages, work / "ours-bm25", overwrite=True)

    def bare_build():
        stem = ours_bm25._stemmer(ours_bm25.STEMMER)
        texts = [ours_bm25.document_text(p) for p in passages]
        tokens = bm25s.tokenize(texts, stopwords=ours_bm25.STOPWORDS, stemmer=stem, show_progress=False)
        model = bm25s.BM25(k1=ours_bm25.K1, b=ours_bm25.B, method="lucene")
        model.index(tokens, show_progress=False)
        model.save(str(work / "bare-bm25"), show_progress=False)

    def bare_build_and_store():  # like for like: ours also writes the doc store and row -> id table
        write_plain_store(passages, work)
        bare_build()

    ours_build(), bare_build_and_store()  # warm-up, untimed: first imports and first file creation
    build = alternate(ours_build, bare_build, bare_build_and_store, repeats=repeats)
    retriever = open_index(work / "ours-bm25").retriever("bm25")
    model = bm25s.BM25.load(str(work / "bare-bm25"), show_progress=False)
    stem = ours_bm25._stemmer(ours_bm25.STEMMER)
    row_ids = np.load(work / "bare-ids.npy")

    def bare_search():
        tokens = bm25s.tokenize(queries, stopwords=ours_bm25.STOPWORDS, stemmer=stem, return_ids=False,
                                show_progress=False)
        return model.retrieve(tokens, k=50, show_progress=False)

    def bare_search_ids():  # like for like: ours returns passage ids, not row numbers
        rows, scores = bare_search()
        return [[(i.decode(), s) for i, s in zip(row_ids[r].tolist(), sc.tolist()) if s > 0]
                for r, sc in zip(rows, scores)]

    retriever.search(queries[:100], 50), bare_search_ids()  # warm-up
    search = alternate(lambda: retriever.search(queries, 50), bare_search, bare_search_ids, repeats=repeats)
    n, q = len(passages), len(queries)
    return [("BM25 build; bare = bm25s tokenize + index + save only (passages/s)", n / build[0], n / build[1]),
            ("BM25 build; bare = the same + JSONL/npy doc store (passages/s)", n / build[0], n / build[2]),
            ("BM25 search k=50, one batch; bare = bm25s retrieve, rows only (queries/s)", q / search[0],
             q / search[1]),
            ("BM25 search k=50, one batch; bare = the same + row -> id (queries/s)", q / search[0], q / search[2])]


def write_plain_store(passages, work: Path) -> None:
    """What a user would write to get passages back by index row: JSONL, byte offsets, row -> id."""
    import numpy as np
    import orjson

    offsets, ids = [0], []
    with open(work / "bare-passages.jsonl", "wb") as handle:
        for p in passages:
            line = orjson.dumps({"id": p.id, "title": p.title, "text": p.text}) + b"\n"
            handle.write(line)
            offsets.append(offsets[-1] + len(line))
            ids.append(p.id)
    np.save(work / "bare-offsets.npy", np.array(offsets, dtype=np.uint64))
    np.save(work / "bare-ids.npy", np.array(ids, dtype=bytes))


def bench_dense_build_cached(passages, vectors, work: Path, repeats: int) -> list[tuple]:
    """Flat dense build from vectors already computed: ours vs FAISS alone, and vs FAISS plus a plain doc store
    (the folder ours writes also holds the passages, so the second bare is the like-for-like one)."""
    import faiss

    from cosearch_cli.index import build_index

    def ours():
        build_index(passages, work / "ours-dense", bm25=False, dense="minilm", embeddings=vectors, overwrite=True)

    def bare_faiss():
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        faiss.write_index(index, str(work / "bare.faiss"))

    def bare_faiss_and_store():
        write_plain_store(passages, work)
        bare_faiss()

    ours(), bare_faiss_and_store()  # warm-up, untimed: first imports and first file creation
    t_ours, t_faiss, t_store = alternate(ours, bare_faiss, bare_faiss_and_store, repeats=repeats)
    n = len(passages)
    return [("dense build from cached vectors, flat; bare = FAISS add + write only (ours also writes the doc "
             "store) (passages/s)", n / t_ours, n / t_faiss),
            ("dense build from cached vectors, flat; bare = FAISS add + write + JSONL/npy doc store "
             "(passages/s)", n / t_ours, n / t_store)]


def bench_dense_build_encoded(passages, work: Path, repeats: int, batch_size: int = 64) -> tuple[tuple, list[str]]:
    """Like for like: encode `passages` with MiniLM and write a flat index. Ours: build_index (also writes the
    doc store). Bare: transformers + faiss as a user would write it, same texts, batches, pooling and
    max_length. Order: bare, then (ours, bare) x repeats, after an untimed warm-up load of the model."""
    import faiss
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    from cosearch_cli.index import build_index
    from cosearch_cli.models import minilm_folder

    folder = minilm_folder()
    texts = [f'"{p.title}"\n{p.text}' for p in passages]

    def bare_vectors():
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
        out = np.zeros((len(texts), model.config.hidden_size), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # the same batches as ours
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                rows = order[start:start + batch_size]
                batch = tokenizer([texts[i] for i in rows], padding=True, truncation=True, max_length=256,
                                  return_tensors="pt")
                hidden = model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).float()
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out[rows] = torch.nn.functional.normalize(pooled, dim=-1).numpy()
        return out

    def bare():
        vectors = bare_vectors()
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        faiss.write_index(index, str(work / "bare-encoded.faiss"))

    def ours():
        build_index(passages, work / "ours-encoded", bm25=False, dense="minilm", batch_size=batch_size,
                    cache_embeddings=False, overwrite=True)

    AutoModel.from_pretrained(folder)  # warm-up: first import and load of the model classes, untimed
    t_ours, t_bare = [], []
    for fn, out in [(bare, t_bare)] + [(ours, t_ours), (bare, t_bare)] * repeats:
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    read = [faiss.read_index(str(path)) for path in (work / "ours-encoded" / "dense" / "flat.faiss",
                                                      work / "bare-encoded.faiss")]
    diff = float(np.abs(read[0].reconstruct_n(0, len(texts)) - read[1].reconstruct_n(0, len(texts))).max())
    n = len(passages)
    row = (f"dense build encoding {n:,} passages with MiniLM, flat (passages/s)", n / statistics.median(t_ours),
           n / statistics.median(t_bare))
    fastest = 100 * (min(t_ours) / min(t_bare) - 1)
    notes = [f"Encoded build, seconds per run (bare first, then ours and bare in turn): bare "
             f"{', '.join(f'{t:.1f}' for t in t_bare)}; ours {', '.join(f'{t:.1f}' for t in t_ours)}. Medians in "
             f"the table; by the fastest run: ours {n / min(t_ours):,.1f} vs bare {n / min(t_bare):,.1f} "
             f"passages/s ({fastest:+.1f}%). Largest difference between ours' and bare's vectors: {diff:.1e}."]
    return row, notes


def bench_dense_search(queries, work: Path, repeats: int) -> tuple[list[tuple], object]:
    """Search of the flat index bench_dense_build_cached wrote: ours vs the same encoder call + faiss."""
    import faiss

    from cosearch_cli.index import open_index

    retriever = open_index(work / "ours-dense").retriever("dense")
    encoder = retriever.encoder
    flat = faiss.read_index(str(work / "bare.faiss"))
    search = alternate(lambda: retriever.search(queries, 50),
                       lambda: flat.search(encoder.encode_queries(queries), 50), repeats=repeats)
    qvec = encoder.encode_queries(queries)
    # FAISS alone, on precomputed query vectors: our wrapper's own cost (row ids -> Hit objects)
    wrapped = alternate(lambda: retriever.search_vectors(qvec, 50), lambda: flat.search(qvec, 50), repeats=repeats)
    return [("dense search k=50 incl. MiniLM query encoding (queries/s)", len(queries) / search[0],
             len(queries) / search[1]),
            ("dense search k=50, precomputed query vectors (queries/s)", len(queries) / wrapped[0],
             len(queries) / wrapped[1])], qvec


def bench_faiss_types(vectors, qvec, work: Path) -> list[tuple]:
    import numpy as np

    from cosearch_cli.index.dense import (REFINED, build_faiss, read_refined, refined_vectors_path, write_faiss,
                                          write_refined)

    out = []
    exact = None
    for kind in ("flat", "hnsw", "ivfpq", REFINED):
        start = time.perf_counter()
        if kind == REFINED:  # IVF-PQ candidates scored exactly from fp16 vectors on disk
            write_refined(vectors, work / f"{kind}.faiss")
            index = read_refined(work / f"{kind}.faiss")
        else:
            index = build_faiss(vectors, kind)
            write_faiss(index, work / f"{kind}.faiss")
        build_s = time.perf_counter() - start
        files = (work / f"{kind}.faiss", refined_vectors_path(work / f"{kind}.faiss"))
        size = sum(path.stat().st_size for path in files if path.is_file()) / len(vectors)
        start = time.perf_counter()
        _, rows = index.search(qvec, 50)
        qps = len(qvec) / (time.perf_counter() - start)
        if exact is None:
            exact = rows
        recall = float(np.mean([len(set(a) & set(e)) / 50 for a, e in zip(rows, exact)]))
        out.append((kind, build_s, size, recall, qps))
    return out


def faiss_on_fixture(out: str) -> None:
    """FAISS types on the fixture's shipped MiniLM vectors and its 157 questions (a quick stand-in)."""
    import numpy as np

    from cosearch_cli.index.dense import HFEncoder

    vectors = np.load("fixtures/corpus.minilm-f16.npy").astype(np.float32)
    questions = read_jsonl("fixtures/dev.jsonl") + read_jsonl("fixtures/train.jsonl")
    qvec = HFEncoder("minilm").encode_queries([q["question"] for q in questions])
    lines = [f"# FAISS index types on the fixture ({len(vectors):,} MiniLM passages, {len(qvec)} questions)", "",
             f"Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`  ",
             f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.machine()}, "
             f"{os.cpu_count()} cores, no GPU, shared/noisy.", ""]
    lines += faiss_table(bench_faiss_types(vectors, qvec, Path(tempfile.mkdtemp())))
    Path(out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def faiss_table(faiss_rows) -> list[str]:
    lines = ["| type | build s | bytes/passage (disk) | recall@50 vs flat | queries/s (k=50) | wiki-18, 384 dims | "
             "wiki-18, e5-base 768 dims |", "|---|---|---|---|---|---|---|"]
    for kind, build_s, size, recall, qps in faiss_rows:
        # at 768 dims: vectors take 384 x 4 more bytes (flat, hnsw; the HNSW graph does not grow), PQ codes
        # take 768/8 - 384/8 = 48 more bytes (ivfpq; its 8-byte ids do not grow), plus 384 x 2 more for
        # ivfpq-refine's fp16 vectors (on disk)
        scale768 = size + {"ivfpq": 48, "ivfpq-refine": 48 + 384 * 2}.get(kind, 384 * 4)
        lines.append(f"| {kind} | {build_s:.2f} | {size:,.0f} | {recall:.3f} | {qps:,.0f} | "
                     f"{size * WIKI18 / 1e9:.1f} GB | {scale768 * WIKI18 / 1e9:.1f} GB |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--pyserini", help="python of a venv with pyserini==0.25.0 (Java 17) to compare")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/index_speed.md")
    parser.add_argument("--only", choices=("bm25", "dense"), help="run only the BM25 or only the dense rows")
    parser.add_argument("--dense-queries", type=int, default=1000,
                        help="dev questions for the dense rows (query encoding dominates on CPU)")
    parser.add_argument("--dense-build-passages", type=int, default=2000, metavar="M",
                        help="the encoding dense build row encodes the first M passages (0: skip the row)")
    parser.add_argument("--append", action="store_true", help="append this run to --out instead of replacing it")
    parser.add_argument("--faiss-fixture", metavar="OUT", help="only: FAISS types on the fixture's vectors")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return pyserini_worker(args)
    if args.faiss_fixture:
        return faiss_on_fixture(args.faiss_fixture)

    import numpy as np

    from cosearch_cli.index import Corpus
    from cosearch_cli.index.corpus import corpus_sha256
    from cosearch_cli.index.dense import EncoderSpec, load_cached_embeddings

    data = Path(args.data)
    passages = list(Corpus(sorted(glob.glob(str(data / "corpus" / "*.jsonl")))))
    questions = load_questions(data)
    queries = [q["question"] for q in questions]
    work = Path(tempfile.mkdtemp(prefix="bench-index-"))
    lines = ["# Index build and search speed: cosearch vs the bare libraries", "",
             f"Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`  ",
             f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {platform.machine()}, "
             f"{os.cpu_count()} cores, 24 GiB, no GPU (the load average below says how busy it was); medians of "
             f"{args.repeats} alternating runs.  ",
             f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, nice {os.nice(0)}, load average "
             f"(1/5/15 min) at start: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}.  ",
             f"Corpus: {len(passages):,} passages (../shared/data/corpus/*.jsonl); queries: all {len(queries):,} "
             f"dev questions for BM25, the first {args.dense_queries:,} for dense.", ""]
    rows = [] if args.only == "dense" else bench_bm25(passages, queries, work, args.repeats)
    faiss_rows, notes = [], []
    if args.only != "bm25":
        vectors = load_cached_embeddings("minilm", corpus_sha256(passages), len(passages))
        real = vectors is not None
        if not real:  # FAISS flat add and write take the same time whatever the values
            vectors = np.random.default_rng(0).standard_normal((len(passages), EncoderSpec("minilm").dim),
                                                               dtype=np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            notes.append("No cached MiniLM embeddings of this corpus: the cached-vector rows use random unit "
                         "vectors of the same shape; the search rows and FAISS types (they need real vectors) "
                         "are skipped.")
        rows += bench_dense_build_cached(passages, vectors, work, args.repeats)
        if args.dense_build_passages:
            row, more = bench_dense_build_encoded(passages[:args.dense_build_passages], work, args.repeats)
            rows.append(row)
            notes += more
        if real:
            dense_rows, qvec = bench_dense_search(queries[:args.dense_queries], work, args.repeats)
            rows += dense_rows
            faiss_rows = bench_faiss_types(vectors, qvec, work)
    lines += ["| what | cosearch | bare library | overhead |", "|---|---|---|---|"]
    for name, ours, bare in rows:
        lines.append(f"| {name} | {ours:,.{1 if ours < 100 else 0}f} | {bare:,.{1 if bare < 100 else 0}f} | "
                     f"{100 * (bare / ours - 1):+.1f}% |")
    notes.append(f"Load average at the end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}.")
    lines += [""] + notes
    if faiss_rows:
        lines += ["", "## FAISS index types (MiniLM, 384 dims, inner product)", ""] + faiss_table(faiss_rows)
    if args.pyserini:
        from cosearch_cli.index import open_index

        report = run_pyserini(args.pyserini, data)
        docs = open_index(work / "ours-bm25").docs
        ours = open_index(work / "ours-bm25").retriever("bm25")
        start = time.perf_counter()
        ours_hits = ours.search(queries, 10)
        ours_top10 = [[h.id for h in hs] for hs in ours_hits]
        lines += ["", "## BM25 backends: pyserini 0.25.0 (Lucene 9, Java 17) vs bm25s (cosearch default)", "",
                  f"pyserini import + JVM start: {report['jvm_start_s']:.1f} s. Index with 1 thread; search "
                  "k=50, all dev questions, 1 thread.", "",
                  "| backend | settings | index passages/s | batch queries/s | single queries/s | "
                  + " | ".join(quality(ours_top10, questions, docs)) + " |",
                  "|---|---|---|---|---|" + "---|" * len(quality(ours_top10, questions, docs))]
        q_ours = quality(ours_top10, questions, docs)
        bm25_build = rows[0]
        bm25_search = rows[1]
        single = len(queries[:500]) / median_time(lambda: [ours.search([q], 50) for q in queries[:500]], 1)
        lines.append(f"| bm25s (cosearch) | k1=1.5 b=0.75, stemmed, title x4 | {bm25_build[1]:,.0f} | "
                     f"{bm25_search[1]:,.0f} | {single:,.0f} | " + " | ".join(f"{v:.3f}" for v in q_ours.values())
                     + " |")
        for name, run in report["runs"].items():
            q = quality(run["top10"], questions, docs)
            lines.append(f"| pyserini | {name}: k1={run['k1']} b={run['b']}, title x{run['title_weight']} | "
                         f"{len(passages) / run['index_s']:,.0f} | {run['batch_qps']:,.0f} | "
                         f"{run['single_qps']:,.0f} | " + " | ".join(f"{q[k]:.3f}" for k in q_ours) + " |")
        lines += ["", "Quality columns: gold-passage recall@10 (2wiki, hotpotqa, musique), answer hit@5 (others)."]
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a" if args.append else "w") as handle:
        handle.write(("\n" if args.append else "") + text)
    print(text)


if __name__ == "__main__":
    main()
