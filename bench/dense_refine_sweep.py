"""ivfpq-refine's recall against Flat as nprobe and refine_factor grow (issue 17), on the cached MiniLM vectors of
the shared corpus and the cached dev query vectors that `bench/dense_scale.py` uses: one index, the search
settings swept; recall@10/@50 of k=50 against exact inner products, and queries/s.

    .venv/bin/python bench/dense_refine_sweep.py --out bench/results/dense_refine_sweep.md
"""

from __future__ import annotations

import argparse
import glob
import tempfile
import time
from pathlib import Path

import numpy as np

from cosearch_cli.index import dense
from results_io import load_average, write_results

CACHE = Path.home() / ".cache" / "cosearch" / "embeddings"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embeddings", default=None, help="passage vectors .npy (default: the cached MiniLM ones)")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--nprobe", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--refine", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    path = Path(args.embeddings or sorted(glob.glob(str(CACHE / "minilm-*.npy")))[0])
    vectors = np.load(path, mmap_mode="r")
    query_files = sorted(glob.glob(str(CACHE / "queries-*.npy")))
    queries = np.concatenate([np.load(f) for f in query_files]).astype(np.float32)
    rng = np.random.default_rng(0)
    queries = queries[np.sort(rng.choice(len(queries), min(args.queries, len(queries)), replace=False))]
    exact = np.argsort(-(queries @ np.asarray(vectors, dtype=np.float32).T), axis=1, kind="stable")[:, :50]
    load = load_average()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        faiss_path = Path(tmp) / "ivfpq-refine.faiss"
        dense.write_refined(vectors, faiss_path)
        index = dense.read_refined(faiss_path)
        for nprobe in args.nprobe:
            for refine in args.refine:
                index.nprobe, index.refine_factor = nprobe, refine
                started = time.perf_counter()
                _, found = index.search(queries, 50)
                seconds = time.perf_counter() - started
                r10 = np.mean([len(set(f[:10]) & set(e[:10])) / 10 for f, e in zip(found, exact)])
                r50 = np.mean([len(set(f) & set(e)) / 50 for f, e in zip(found, exact)])
                rows.append({"nprobe": index.nprobe, "refine_factor": refine, "recall_at_10": round(float(r10), 4),
                             "recall_at_50": round(float(r50), 4), "qps": round(len(queries) / seconds, 1)})
                print(rows[-1], flush=True)
        lists = int(index.ivfpq.nlist)
    result = {"passages": int(vectors.shape[0]), "dim": int(vectors.shape[1]), "queries": len(queries),
              "ivf_lists": lists, "rows": rows, "load_before": load,
              "command": "python bench/dense_refine_sweep.py" + (f" --out {args.out}" if args.out else "")}
    lines = [f"# ivfpq-refine: recall against Flat by nprobe and refine factor ({result['passages']:,} MiniLM "
             f"vectors, {lists} lists, {len(queries)} dev queries, k=50)", "",
             f"`{result['command']}`; 2-core x86-64; load before {load}. Recall against exact inner products "
             "over the same fp32 vectors.", "",
             "| nprobe | refine factor | recall@10 | recall@50 | queries/s |", "|---|---|---|---|---|"]
    lines += [f"| {r['nprobe']} | {r['refine_factor']} | {r['recall_at_10']:.3f} | {r['recall_at_50']:.3f} | "
              f"{r['qps']:,} |" for r in rows]
    write_results(args.out, "\n".join(lines) + "\n", result)


if __name__ == "__main__":
    main()
