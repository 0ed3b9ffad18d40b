"""Dense index types at wiki-18 scale (issue 17): recall against flat, speed, memory, disk, extrapolated to 21M.

    .venv/bin/python bench/dense_scale.py [--data ../shared/data] [--real-build 2000000] [--processes 2]
    .venv/bin/python bench/dense_scale.py --synthetic 3000 --out /tmp/ds.md   # a quick check of the script

Vectors: the cached MiniLM (384-d) embeddings of the shared corpus that `just bench-retrieval` makes (without
the cache it stops and says so, unless --encode-missing: then it encodes and caches them once, ~25+ min on 2
cores) and the dev questions' query vectors (cached by retrieval_quality.query_vectors). --synthetic N uses N
clustered random unit vectors instead.

Per index type (flat, hnsw, ivfpq, ivfpq-refine), each built and opened in its own fresh process:
- build: seconds and peak memory (anonymous RSS sampled every 50 ms, and VmHWM);
- recall@10 and @50 of k=50 searches against flat, queries/s (one batch, k=50);
- RAM per passage: what opening the index and searching every query adds to the process's RSS, less the
  pages of ivfpq-refine's fp16 vector file (page cache that any process shares and the kernel reclaims; shown
  apart); disk per passage: the type's files;
- extrapolation to wiki-18 (21,015,324 passages) at e5-base's 768 dims from the per-passage figures (the
  formula is printed with the table);
- dev retrieval quality (recall@10, hit@5 as in retrieval_quality.md), unless --no-quality.
--processes P: P processes open the same index at once; each one's private memory (what it adds) and shared
memory (page cache it shares), from /proc/<pid>/smaps_rollup.
--real-build N: an N-passage ivfpq-refine index built for real from the real vectors tiled N/n times with
gaussian noise (--noise per component) and renormalised, so the distractors are near copies of real passages:
build time and peak memory, RAM and disk per passage, queries/s, recall against exact search over the same N
vectors (brute force in numpy, --real-build-queries queries).
Writes --out (Markdown) and the same path with .json.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # retrieval_quality, beside this file
from results_io import write_results  # noqa: E402

WIKI18 = 21_015_324  # passages in the Search-R1/FlashRAG wiki-18 100-word dump
E5_DIM = 768
TYPES = ("flat", "hnsw", "ivfpq", "ivfpq-refine")


# ---------------------------------------------------------------------------------------------------------
# Memory of a process (Linux /proc)


def status_kb(pid: int | str = "self") -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            out[name] = int(value.split()[0])
    return out


def rollup_kb(pid: int | str = "self") -> dict[str, int]:
    """Rss, Pss, Shared_*, Private_* of the whole process, in kB."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            out[name] = int(value.split()[0])
    return out


def mapped_rss_kb(path: Path, pid: int | str = "self") -> int:
    """Resident kB of the mappings of one file (e.g. the fp16 vectors) in a process."""
    total, inside = 0, False
    target = str(path.resolve())
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            inside = len(fields) >= 6 and fields[5] == target
        elif inside and fields and fields[0] == "Rss:":
            total += int(fields[1])
    return total


def private_kb(roll: dict[str, int]) -> int:
    return roll.get("Private_Clean", 0) + roll.get("Private_Dirty", 0)


class PeakSampler:
    """Samples this process's anonymous RSS every 50 ms in a thread; `.peak` in bytes."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, status_kb()["RssAnon"] * 1024)
            self._stop.wait(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, status_kb()["RssAnon"] * 1024)


# ---------------------------------------------------------------------------------------------------------
# Workers: one fresh process per build and per opened index, so memory figures are that index's alone


def worker_build(args) -> None:
    from cosearch_cli.index import dense

    vectors = np.load(args.vectors, mmap_mode="r")  # the build reads it in chunks
    out = Path(args.faiss)
    with PeakSampler() as sampler:
        start = time.perf_counter()
        if args.type == dense.REFINED:
            dense.write_refined(vectors, out)
        else:
            dense.write_faiss(dense.build_faiss(vectors, args.type), out)
        seconds = time.perf_counter() - start
    print(json.dumps({"build_s": seconds, "build_peak_anon": sampler.peak,
                      "build_vm_hwm": status_kb()["VmHWM"] * 1024}), flush=True)


def worker_open(args) -> None:
    """Open the index, search every query (k), report memory and speed, then stay alive until stdin closes
    (so that several workers hold the same index at once)."""
    import faiss  # noqa: F401  imported before the first reading: its own memory is not the index's

    from cosearch_cli.index import dense

    queries = np.load(args.query_vectors)
    path = Path(args.faiss)
    before, before_roll = status_kb(), rollup_kb()
    index = dense.read_refined(path) if args.type == dense.REFINED else dense.read_faiss(path, gpu=False)
    opened = status_kb()
    index.search(queries[:10], args.k)  # warm-up
    start = time.perf_counter()
    _, rows = index.search(queries, args.k)
    seconds = time.perf_counter() - start
    np.save(args.rows, rows)
    after, after_roll = status_kb(), rollup_kb()
    print(json.dumps({
        "pid": os.getpid(), "qps": len(queries) / seconds,
        # the index's own memory: the pages of its file that the searches touched (memory-mapped), plus what
        # opening it put on the heap (structures FAISS copies rather than maps)
        "index_file_resident": mapped_rss_kb(path) * 1024,
        "anon_added_by_open": (opened["RssAnon"] - before["RssAnon"]) * 1024,
        "anon_added_by_search": (after["RssAnon"] - opened["RssAnon"]) * 1024,
        "vectors_page_cache": (mapped_rss_kb(dense.refined_vectors_path(path)) * 1024
                               if args.type == dense.REFINED else 0),
        "rss_added": (after["VmRSS"] - before["VmRSS"]) * 1024,
        "private_added": (private_kb(after_roll) - private_kb(before_roll)) * 1024}), flush=True)
    sys.stdin.readline()


def index_ram(report: dict) -> int:
    """Bytes the index itself holds in a process: its resident file pages and what opening it allocated."""
    return report["index_file_resident"] + max(0, report["anon_added_by_open"])


def spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def run_build(vectors: Path, faiss_path: Path, kind: str) -> dict:
    proc = spawn("--worker", "build", "--vectors", str(vectors), "--faiss", str(faiss_path), "--type", kind)
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"building {kind} failed (exit {proc.returncode})")
    return json.loads(out.splitlines()[-1])


def open_processes(faiss_path: Path, kind: str, queries: Path, k: int, count: int, work: Path) -> list[dict]:
    """`count` processes open the index one after another and stay open; then each one's memory is read."""
    procs, reports = [], []
    try:
        for i in range(count):
            rows = work / f"rows-{kind}-{i}.npy"
            proc = spawn("--worker", "open", "--faiss", str(faiss_path), "--type", kind, "--query-vectors",
                         str(queries), "-k", str(k), "--rows", str(rows))
            procs.append(proc)
            report = json.loads(proc.stdout.readline())
            report["rows"] = str(rows)
            reports.append(report)
        for report in reports:  # with all of them open: what each holds privately and what they share
            roll = rollup_kb(report["pid"])
            report.update(rss_all_open=roll["Rss"] * 1024, pss_all_open=roll["Pss"] * 1024,
                          private_all_open=private_kb(roll) * 1024,
                          shared_all_open=(roll.get("Shared_Clean", 0) + roll.get("Shared_Dirty", 0)) * 1024)
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait()
    return reports


# ---------------------------------------------------------------------------------------------------------
# Inputs


def clustered(n: int, dim: int, seed: int, clusters: int = 200) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(12345).normal(size=(clusters, dim))
    vectors = (centers[rng.integers(0, clusters, size=n)] + 0.7 * rng.normal(size=(n, dim))).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def real_inputs(data: Path, max_queries: int, encode_missing: bool):
    """(cached MiniLM passage vectors as a memory map, their .npy path, dev query vectors, passages)."""
    from cosearch_cli.index import Corpus
    from cosearch_cli.index.corpus import corpus_sha256
    from cosearch_cli.index.dense import HFEncoder, embedding_cache_path, encode_corpus, save_cached_embeddings
    from retrieval_quality import MULTI_HOP, SINGLE_HOP, load_questions, query_vectors

    passages = list(Corpus(sorted(glob.glob(str(data / "corpus" / "*.jsonl")))))
    sha = corpus_sha256(passages)
    path = embedding_cache_path("minilm", sha)
    if not path.is_file() and not encode_missing:
        raise SystemExit(f"no cached MiniLM embeddings of the corpus ({path}): pass --encode-missing (encodes "
                         "the 32k passages once, ~25+ min on 2 cores, and caches them) or run `just bench-retrieval`")
    if not path.is_file():
        print(f"encoding {len(passages):,} passages with MiniLM into {path} (once)", file=sys.stderr, flush=True)
        save_cached_embeddings("minilm", sha, encode_corpus(HFEncoder("minilm"), passages))
    vectors = np.load(path, mmap_mode="r")
    if vectors.shape[0] != len(passages):
        raise SystemExit(f"{path} holds {vectors.shape[0]} vectors, the corpus {len(passages)}: rerun "
                         "`just bench-retrieval`")
    class LazyMiniLM:
        """Loads MiniLM only if some question set's vectors are not cached yet (a minute or two)."""

        name = "minilm"
        model = None

        def encode_queries(self, texts):
            self.model = self.model or HFEncoder("minilm")
            return self.model.encode_queries(texts)

    encoder, parts = LazyMiniLM(), []
    for dataset in MULTI_HOP + SINGLE_HOP:  # the same question lists, so the cached query vectors are reused
        questions = [q for q in load_questions(data, dataset)
                     if dataset not in MULTI_HOP or q.get("gold_passage_ids")]
        parts.append(query_vectors(dataset, [q["question"] for q in questions], encoder))
    queries = np.concatenate(parts)[:max_queries]
    return vectors, path, queries, passages


def tile_vectors(vectors: np.ndarray, n: int, noise: float, out: Path, seed: int = 0,
                 chunk: int = 262_144) -> np.ndarray:
    """n rows: row i is vectors[i % len(vectors)] plus gaussian noise (per component), renormalised; written
    to `out` chunk by chunk (float32 .npy), returned as a memory map."""
    tiled = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(n, vectors.shape[1]))
    rng = np.random.default_rng(seed)
    for start in range(0, n, chunk):
        rows = np.arange(start, min(n, start + chunk))
        block = np.array(vectors[rows % len(vectors)], dtype=np.float32)
        copies = rows >= len(vectors)  # the first copy is the real vectors themselves
        block[copies] += noise * rng.standard_normal((int(copies.sum()), block.shape[1]), dtype=np.float32)
        block[copies] /= np.linalg.norm(block[copies], axis=1, keepdims=True)
        tiled[start:start + len(block)] = block
    tiled.flush()
    del tiled
    return np.load(out, mmap_mode="r")


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int, chunk: int = 262_144) -> np.ndarray:
    """Brute-force top-k rows by inner product, reading `vectors` a chunk at a time."""
    best_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
    best_rows = np.zeros((len(queries), k), dtype=np.int64)
    for start in range(0, len(vectors), chunk):
        scores = queries @ np.asarray(vectors[start:start + chunk], dtype=np.float32).T
        rows = np.broadcast_to(np.arange(start, start + scores.shape[1]), scores.shape)
        all_scores = np.concatenate([best_scores, scores], axis=1)
        all_rows = np.concatenate([best_rows, rows], axis=1)
        top = np.argpartition(-all_scores, k - 1, axis=1)[:, :k]
        best_scores = np.take_along_axis(all_scores, top, axis=1)
        best_rows = np.take_along_axis(all_rows, top, axis=1)
    order = np.argsort(-best_scores, axis=1, kind="stable")
    return np.take_along_axis(best_rows, order, axis=1)


# ---------------------------------------------------------------------------------------------------------
# Figures


def recall(found: np.ndarray, exact: np.ndarray, k: int) -> float:
    return float(np.mean([len(set(a[:k]) & set(e[:k])) / k for a, e in zip(found, exact)]))


def disk_bytes(faiss_path: Path) -> int:
    from cosearch_cli.index.dense import refined_vectors_path

    vectors = refined_vectors_path(faiss_path)
    return faiss_path.stat().st_size + (vectors.stat().st_size if vectors.is_file() else 0)


def ivf_fixed_bytes(faiss_path: Path, kind: str) -> int:
    """The part of an IVF index that does not grow with the passages: its centroids (lists x dim x 4)."""
    if kind not in ("ivfpq", "ivfpq-refine"):
        return 0
    from cosearch_cli.index.dense import read_faiss

    index = read_faiss(faiss_path, gpu=False)
    return int(index.nlist) * int(index.d) * 4


def at_wiki18(kind: str, ram: float, disk: float, fixed: int, n: int, dim: int) -> tuple[float, float]:
    """(RAM, disk) in GB for 21M passages at 768 dims, from per-passage figures measured at n passages and
    `dim` dims: full vectors grow by 4 bytes a dimension (flat, hnsw; the HNSW graph does not grow with dim),
    PQ codes by 1 byte per 8 dimensions (ivfpq, ivfpq-refine), ivfpq-refine's fp16 vectors (disk only) by 2
    bytes a dimension; IVF centroids are a fixed part, recomputed for 21M passages (4 sqrt(n) lists)."""
    extra = E5_DIM - dim
    if kind in ("flat", "hnsw"):
        ram_768, disk_768, fixed_21m = ram + 4 * extra, disk + 4 * extra, 0
    else:
        per_ram, per_disk = ram - fixed / n, disk - fixed / n
        ram_768, disk_768 = per_ram + extra / 8, per_disk + extra / 8
        if kind == "ivfpq-refine":
            disk_768 += 2 * extra
        fixed_21m = int(4 * math.sqrt(WIKI18)) * E5_DIM * 4
    return (WIKI18 * ram_768 + fixed_21m) / 1e9, (WIKI18 * disk_768 + fixed_21m) / 1e9


def quality_rows(passages, vectors, data: Path, work: Path, types) -> dict[str, dict[str, float]]:
    """Dev recall@10 / hit@5 per index type (retrieval_quality.evaluate over an index folder of that type)."""
    from cosearch_cli.index import build_index, open_index
    from retrieval_quality import evaluate

    folder = work / "quality-index"
    build_index(passages, folder, bm25=False, dense="minilm", embeddings=vectors, dense_index=list(types),
                overwrite=True)
    index = open_index(folder)
    return {kind: {d: v[1] for d, v in evaluate(index, "dense", data, index_type=kind).items()} for kind in types}


# ---------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data", help="folder with corpus/ and dev/")
    parser.add_argument("--synthetic", type=int, metavar="N",
                        help="instead of the cached MiniLM vectors: N clustered random unit vectors (a check)")
    parser.add_argument("--dim", type=int, default=384, help="--synthetic only: dimensions")
    parser.add_argument("--queries", type=int, default=2000, help="queries to search (dev questions)")
    parser.add_argument("--types", nargs="+", default=list(TYPES), choices=TYPES)
    parser.add_argument("--processes", type=int, default=1, metavar="P",
                        help="also open each index in P processes at once and report what each adds")
    parser.add_argument("--real-build", type=int, default=0, metavar="N",
                        help="also build and search an N-passage ivfpq-refine index from tiled real vectors")
    parser.add_argument("--noise", type=float, default=0.01, help="--real-build: noise per component")
    parser.add_argument("--real-build-queries", type=int, default=200,
                        help="--real-build: queries checked against brute-force exact search")
    parser.add_argument("--no-quality", action="store_true", help="skip dev recall@10 / hit@5 per type")
    parser.add_argument("--encode-missing", action="store_true",
                        help="encode and cache the corpus when its MiniLM embeddings are not cached (else stop)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a new one under /tmp)")
    parser.add_argument("--out", default="bench/results/dense_scale.md")
    parser.add_argument("--worker", choices=("build", "open"), help=argparse.SUPPRESS)
    parser.add_argument("--vectors", help=argparse.SUPPRESS)
    parser.add_argument("--faiss", help=argparse.SUPPRESS)
    parser.add_argument("--type", help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    parser.add_argument("--query-vectors", help=argparse.SUPPRESS)
    parser.add_argument("-k", type=int, default=50, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "build":
        return worker_build(args)
    if args.worker == "open":
        return worker_open(args)

    started = time.time()
    work = Path(args.work or tempfile.mkdtemp(prefix="dense-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    data = Path(args.data)
    if args.synthetic:
        vectors = clustered(args.synthetic, args.dim, seed=0)
        queries = clustered(args.queries, args.dim, seed=1)
        vectors_path = work / "vectors.npy"
        np.save(vectors_path, vectors)
        passages = None
        source = (f"SYNTHETIC: {args.synthetic:,} clustered random unit vectors, {args.dim} dims (a check of "
                  "this script, not a measurement of real embeddings)")
    else:
        vectors, vectors_path, queries, passages = real_inputs(data, args.queries, args.encode_missing)
        source = (f"real MiniLM (all-MiniLM-L6-v2) embeddings of the shared corpus, {len(vectors):,} passages x "
                  f"{vectors.shape[1]} dims, from the embedding cache; queries: {len(queries):,} dev questions")
    queries_path = work / "queries.npy"
    np.save(queries_path, np.ascontiguousarray(queries, dtype=np.float32))
    n, dim = vectors.shape

    rows_by_type, results = {}, []
    for kind in ["flat", *[t for t in args.types if t != "flat"]]:  # flat first: the reference
        faiss_path = work / f"{kind}.faiss"
        build = run_build(vectors_path, faiss_path, kind)
        opened = open_processes(faiss_path, kind, queries_path, 50, max(1, args.processes), work)
        rows_by_type[kind] = np.load(opened[0]["rows"])
        first = opened[0]
        ram = index_ram(first) / n
        disk = disk_bytes(faiss_path) / n
        ram_21m, disk_21m = at_wiki18(kind, ram, disk, ivf_fixed_bytes(faiss_path, kind), n, dim)
        results.append({
            "index_type": kind, "passages": n, "dim": dim,
            "recall_at_10": recall(rows_by_type[kind], rows_by_type["flat"], 10),
            "recall_at_50": recall(rows_by_type[kind], rows_by_type["flat"], 50),
            "qps": first["qps"], "build_s": build["build_s"], "build_peak_anon_bytes": build["build_peak_anon"],
            "ram_bytes_per_passage": ram, "vectors_page_cache_bytes_per_passage": first["vectors_page_cache"] / n,
            "disk_bytes_per_passage": disk, "ram_gb_21m_768": ram_21m, "disk_gb_21m_768": disk_21m,
            "search_heap_bytes": first["anon_added_by_search"],
            "processes": [{k: o[k] for k in ("rss_added", "private_added", "rss_all_open", "pss_all_open",
                                             "private_all_open", "shared_all_open")} for o in opened]})
        print(f"{kind}: {json.dumps(results[-1])}", file=sys.stderr, flush=True)
    if "flat" not in args.types:
        results = [r for r in results if r["index_type"] != "flat"]

    quality = {}
    if passages is not None and not args.no_quality:
        quality = quality_rows(passages, vectors, data, work, args.types)

    real = {}
    if args.real_build:
        real = real_build(vectors, queries[:args.real_build_queries], args.real_build, args.noise, work)

    lines = report(args, source, results, quality, real, started)
    refined = next((r for r in results if r["index_type"] == "ivfpq-refine"), results[-1])
    summary = {"index_type": refined["index_type"], "recall_at_50": refined["recall_at_50"],
               "ram_bytes_per_passage": refined["ram_bytes_per_passage"],
               "disk_bytes_per_passage": refined["disk_bytes_per_passage"],
               "ram_gb_21m_768": refined["ram_gb_21m_768"], "real_build_passages": args.real_build,
               "vectors": source, "types": results, "dev_quality": quality, "real_build": real,
               "command": " ".join([Path(sys.executable).name, *sys.argv])}
    write_results(args.out, "\n".join(lines) + "\n", summary)


def real_build(vectors, queries, n: int, noise: float, work: Path) -> dict:
    """Build and search an n-passage ivfpq-refine index over tiled real vectors (see the module doc)."""
    tiled_path = work / f"tiled-{n}.npy"
    start = time.perf_counter()
    tiled = tile_vectors(vectors, n, noise, tiled_path)
    tile_s = time.perf_counter() - start
    queries_path = work / "real-queries.npy"
    np.save(queries_path, np.ascontiguousarray(queries, dtype=np.float32))
    faiss_path = work / f"real-{n}.faiss"
    build = run_build(tiled_path, faiss_path, "ivfpq-refine")
    opened = open_processes(faiss_path, "ivfpq-refine", queries_path, 50, 1, work)[0]
    start = time.perf_counter()
    exact = exact_top(tiled, queries, 50)
    exact_s = time.perf_counter() - start
    found = np.load(opened["rows"])
    ram = index_ram(opened) / n
    disk = disk_bytes(faiss_path) / n
    ram_21m, disk_21m = at_wiki18("ivfpq-refine", ram, disk, ivf_fixed_bytes(faiss_path, "ivfpq-refine"), n,
                                  tiled.shape[1])
    tiled_path.unlink()
    return {"passages": n, "base": len(vectors), "noise": noise, "queries": len(queries), "tile_s": tile_s,
            "build_s": build["build_s"], "build_peak_anon_bytes": build["build_peak_anon"],
            "build_vm_hwm_bytes": build["build_vm_hwm"], "qps": opened["qps"],
            "recall_at_10": recall(found, exact, 10), "recall_at_50": recall(found, exact, 50),
            "ram_bytes_per_passage": ram, "vectors_page_cache_bytes_per_passage": opened["vectors_page_cache"] / n,
            "disk_bytes_per_passage": disk, "ram_gb_21m_768": ram_21m, "disk_gb_21m_768": disk_21m,
            "exact_search_s": exact_s}


def report(args, source: str, results: list[dict], quality: dict, real: dict, started: float) -> list[str]:
    from cosearch_cli.index.dense import NPROBE, REFINE_FACTOR

    gib = 1 << 30
    lines = ["# Dense index types at wiki-18 scale", "",
             f"Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`  ",
             f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.machine()}, "
             f"{os.cpu_count()} cores, no GPU; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
             f"nice {os.nice(0)}, load average at start {os.getloadavg()[0]:.2f}; took "
             f"{(time.time() - started) / 60:.1f} min.  ",
             f"Vectors: {source}.  ",
             f"Settings: nprobe {NPROBE} (ivfpq, ivfpq-refine), refine factor {REFINE_FACTOR} (ivfpq-refine "
             f"scores {REFINE_FACTOR} x k candidates exactly), hnsw M=32 efSearch=128; k=50, one batch.", "",
             "| type | recall@10 vs flat | recall@50 vs flat | queries/s | build s | build peak (anon) | "
             "RAM bytes/passage | fp16 page cache bytes/passage | disk bytes/passage | wiki-18 x 768: RAM | disk |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['index_type']} | {r['recall_at_10']:.3f} | {r['recall_at_50']:.3f} | {r['qps']:,.0f} | "
                     f"{r['build_s']:.1f} | {r['build_peak_anon_bytes'] / gib:.2f} GiB | "
                     f"{r['ram_bytes_per_passage']:,.0f} | {r['vectors_page_cache_bytes_per_passage']:,.0f} | "
                     f"{r['disk_bytes_per_passage']:,.0f} | {r['ram_gb_21m_768']:.1f} GB | "
                     f"{r['disk_gb_21m_768']:.1f} GB |")
    lines += ["", "RAM bytes/passage: the index's own memory in a fresh process after searching every query: the "
              "resident pages of its memory-mapped .faiss file (page cache, shared with any other process that "
              "opens the same file) plus what opening it allocated on the heap. ivfpq-refine's fp16 vector file "
              "is shown apart: its pages are read only for each query's candidates, shared, and dropped by the "
              "kernel under memory pressure. Search buffers (heap added by searching the batch): "
              + ", ".join(f"{r['index_type']} {r['search_heap_bytes'] / 2**20:.1f} MiB" for r in results) + "."
              " wiki-18 x 768: 21,015,324 passages at e5-base's 768 dims, from the per-passage "
              "figures: flat and hnsw + 4 bytes per extra dimension; ivfpq and ivfpq-refine + 1 byte per 8 extra "
              "dimensions (PQ codes), their centroids recomputed for 4 sqrt(21M) = 18,336 lists (56 MB); "
              "ivfpq-refine's disk + 2 bytes per extra dimension (fp16 vectors)."]
    if args.processes > 1:
        lines += ["", f"## {args.processes} processes opening the same index", "",
                  "| type | process | RSS added by opening + searching | private memory added | with all open: "
                  "RSS | PSS | private | shared |", "|---|---|---|---|---|---|---|---|"]
        for r in results:
            for i, p in enumerate(r["processes"], start=1):
                lines.append(f"| {r['index_type']} | {i} | {p['rss_added'] / 2**20:,.1f} MiB | "
                             f"{p['private_added'] / 2**20:,.1f} MiB | {p['rss_all_open'] / 2**20:,.1f} MiB | "
                             f"{p['pss_all_open'] / 2**20:,.1f} MiB | {p['private_all_open'] / 2**20:,.1f} MiB | "
                             f"{p['shared_all_open'] / 2**20:,.1f} MiB |")
        lines += ["", "What an extra process adds is its private memory (the interpreter, numpy, FAISS and "
                  "the search buffers); the index pages are shared (PSS splits them between the processes)."]
    if quality:
        datasets = list(next(iter(quality.values())))
        lines += ["", "## Dev retrieval quality (recall@10: 2wiki, hotpotqa, musique; hit@5: the others)", "",
                  "| type | " + " | ".join(datasets) + " |", "|---|" + "---|" * len(datasets)]
        for kind, values in quality.items():
            lines.append(f"| {kind} | " + " | ".join(f"{values[d]:.3f}" for d in datasets) + " |")
    if real:
        lines += ["", f"## A real {real['passages']:,}-passage ivfpq-refine build", "",
                  f"Vectors: the {real['base']:,} vectors above repeated to {real['passages']:,}, every copy "
                  f"after the first with gaussian noise ({real['noise']} per component) and renormalised: the "
                  "distractors are near copies of real passages (harder than real distractors: each query's "
                  "neighbours come in near-identical groups). Recall against brute-force exact search over the "
                  f"same {real['passages']:,} vectors, {real['queries']} queries.", "",
                  "| passages | build s | build peak anon RSS | build VmHWM | queries/s | recall@10 | recall@50 | "
                  "RAM bytes/passage | fp16 page cache bytes/passage | disk bytes/passage | wiki-18 x 768: RAM | "
                  "disk |", "|---|---|---|---|---|---|---|---|---|---|---|---|",
                  f"| {real['passages']:,} | {real['build_s']:.0f} | {real['build_peak_anon_bytes'] / gib:.2f} GiB | "
                  f"{real['build_vm_hwm_bytes'] / gib:.2f} GiB | {real['qps']:,.0f} | {real['recall_at_10']:.3f} | "
                  f"{real['recall_at_50']:.3f} | {real['ram_bytes_per_passage']:,.0f} | "
                  f"{real['vectors_page_cache_bytes_per_passage']:,.0f} | {real['disk_bytes_per_passage']:,.0f} | "
                  f"{real['ram_gb_21m_768']:.1f} GB | {real['disk_gb_21m_768']:.1f} GB |", "",
                  "Build VmHWM counts the pages of the memory-mapped input and fp16 output that were resident at "
                  "once (page cache); the anonymous peak is the memory the build itself needs."]
    return lines


if __name__ == "__main__":
    main()
