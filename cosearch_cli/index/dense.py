"""Dense retrieval: an encoder protocol, Hugging Face encoders, and FAISS indexes over their embeddings.

Encoders: the embedded all-MiniLM-L6-v2 (`minilm`), or any local Hugging Face encoder folder (e5-base-v2 and
the like), which gets the `query: ` / `passage: ` prefixes the paper's e5 retriever uses. Both use mean
pooling over the attention mask and L2 normalisation, so inner product is cosine similarity.

Index types (all inner product), stored as dense/<type>.faiss and opened memory-mapped (processes on one
node that open the same file share its pages):
  flat          exact search; 4*dim bytes per passage (wiki-18 with e5: 21M x 3 KB = 64 GB)
  hnsw          graph search over full vectors: faster queries, more memory than flat
  ivfpq         inverted lists + product quantisation: ~dim/8 + 8 bytes per passage, approximate
  ivfpq-refine  ivfpq finds refine_factor * k candidates, which are scored exactly against the full vectors
                kept on disk as fp16 (dense/ivfpq-refine.f16.npy, 2*dim bytes per passage, memory-mapped):
                ivfpq's memory with about flat's top k
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from cosearch_cli.errors import ConfigError, ModelError
from cosearch_cli.models import EMBEDDED_ENCODER, resolve_encoder
from cosearch_cli.records import Passage

INDEX_TYPES = ("flat", "hnsw", "ivfpq", "ivfpq-refine")
REFINED = "ivfpq-refine"
NPROBE = 128  # inverted lists an IVF search visits (capped at the number of lists); on the shared corpus's 722
# lists ivfpq-refine's recall@50 vs flat is 0.831 at 32, 0.958 at 128, for 18% fewer queries/s
# (bench/results/dense_refine_sweep.md)
CHUNK = 65_536  # rows an ivfpq/ivfpq-refine build reads and adds at a time
TRAIN_ROWS = 500_000  # IVF-PQ trains on all rows up to this many, else on a sample (_train_ivfpq)
REFINE_FACTOR = 16  # ivfpq-refine scores this many times k candidates exactly (fixture: recall@10/@50 0.99)


class Encoder(Protocol):
    """Turns queries and passages into L2-normalised float32 vectors of size `dim`."""

    name: str
    dim: int

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray: ...

    def encode_passages(self, passages: Sequence[Passage]) -> np.ndarray: ...


def passage_text(passage: Passage) -> str:
    """The Search-R1/FlashRAG `contents` form, which the paper's e5 index encodes."""
    return f'"{passage.title}"\n{passage.text}'


class EncoderSpec:
    """What an index records of a Hugging Face encoder folder (name, dim, prefixes, max_length), read from
    its config.json without loading tokenizer or weights: all a build from precomputed embeddings needs."""

    def __init__(self, name: str, *, prefixes: bool | None = None, max_length: int | None = None):
        self.name = name
        self.folder = resolve_encoder(name)
        self.prefixes = (name != EMBEDDED_ENCODER) if prefixes is None else prefixes
        self.dim, limit = _config_sizes(self.folder)
        self.max_length = min(max_length or (256 if name == EMBEDDED_ENCODER else 512), limit)


def _config_sizes(folder: Path) -> tuple[int, int]:
    """(hidden size, max positions) of an encoder folder. BERT-like configs name both in config.json, read
    as JSON (no torch import); others (DistilBERT's `dim`, ...) go through transformers' AutoConfig."""
    import json

    try:
        config = json.loads((folder / "config.json").read_text())
        if "hidden_size" in config and "max_position_embeddings" in config:
            return int(config["hidden_size"]), int(config["max_position_embeddings"])
        from transformers import AutoConfig

        auto = AutoConfig.from_pretrained(folder)
        return int(auto.hidden_size), int(getattr(auto, "max_position_embeddings", 512))
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise _load_error(folder, exc) from None


def _load_error(folder: Path, exc: Exception) -> ModelError:
    return ModelError(f"cannot load an encoder from {folder}: {str(exc).splitlines()[0]}",
                      fix="pass 'minilm' or a Hugging Face encoder folder (config.json, tokenizer, weights)")


class HFEncoder(EncoderSpec):
    """A transformers AutoModel with mean pooling; batches are sorted by length to cut padding on CPU."""

    def __init__(self, name: str, *, prefixes: bool | None = None, batch_size: int = 64,
                 max_length: int | None = None, device: str | None = None):
        import torch
        import transformers
        from transformers import AutoModel, AutoTokenizer

        transformers.utils.logging.disable_progress_bar()  # stderr carries our own progress bars
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        super().__init__(name, prefixes=prefixes, max_length=max_length)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
            self.model = AutoModel.from_pretrained(self.folder, dtype=torch.float32).to(device).eval()
        except (OSError, ValueError) as exc:
            raise _load_error(self.folder, exc) from None
        self.batch_size = batch_size
        self.device = device

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self._encode([("query: " + q) if self.prefixes else q for q in queries])

    def encode_passages(self, passages: Sequence[Passage]) -> np.ndarray:
        return self._encode([("passage: " if self.prefixes else "") + passage_text(p) for p in passages])

    def _encode(self, texts: list[str]) -> np.ndarray:
        import torch

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                rows = order[start:start + self.batch_size]
                batch = self.tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
                out[rows] = pooled.float().cpu().numpy()
        return out


def encoder_key(name: str) -> str:
    """A short stable name for an encoder, for cache files: the embedded name or a hash of the folder's
    config and weight sizes (a retrained model in the same folder gets a new key)."""
    if name == EMBEDDED_ENCODER:
        return name
    folder = resolve_encoder(name)
    digest = hashlib.sha256(str(folder.resolve()).encode())
    for path in sorted(folder.iterdir()):
        if path.is_file():
            digest.update(f"{path.name}:{path.stat().st_size}".encode())
    digest.update((folder / "config.json").read_bytes())
    return "enc-" + digest.hexdigest()[:16]


def encode_corpus(encoder: Encoder, passages, *, chunk: int = 4096, out: Path | None = None,
                  count: int | None = None, on_progress: Callable[[int], None] | None = None) -> np.ndarray:
    """Embeddings of a passage stream, `chunk` passages at a time. With `out` (and `count`, the number of
    passages) they are written into a float32 .npy there and returned memory-mapped, so memory holds one
    chunk (wiki-18 x e5: 64 GB on disk, not in RAM); without, they are returned in memory."""
    target = None if out is None else np.lib.format.open_memmap(out, mode="w+", dtype=np.float32,
                                                                shape=(count, getattr(encoder, "dim", 0)))
    parts: list[np.ndarray] = []
    done = 0

    def flush(buffer: list[Passage]) -> None:
        nonlocal done
        block = encoder.encode_passages(buffer).astype(np.float32)
        if target is None:
            parts.append(block)
        else:
            target[done:done + len(block)] = block
        done += len(block)
        if on_progress:
            on_progress(len(block))

    buffer: list[Passage] = []
    for passage in passages:
        buffer.append(passage)
        if len(buffer) == chunk:
            flush(buffer)
            buffer = []
    if buffer:
        flush(buffer)
    if target is not None:
        assert done == count, f"encoded {done} passages, expected {count}"
        target.flush()
        del target
        return np.load(out, mmap_mode="r")
    if not parts:
        return np.zeros((0, getattr(encoder, "dim", 0)), dtype=np.float32)
    return np.concatenate(parts)


# ---------------------------------------------------------------------------------------------------------
# FAISS


def build_faiss(vectors: np.ndarray, index_type: str = "flat", *, hnsw_m: int = 32,
                ivf_lists: int | None = None, pq_bytes: int | None = None, nprobe: int = NPROBE, seed: int = 0):
    """A CPU FAISS inner-product index over `vectors` (float32, L2-normalised; a memory map is read in chunks
    by ivfpq, so it is never copied whole). ivfpq-refine is built by `write_refined`, not here."""
    import faiss

    n, dim = vectors.shape
    if index_type == "ivfpq":
        return _train_ivfpq(vectors, ivf_lists=ivf_lists, pq_bytes=pq_bytes, nprobe=nprobe, seed=seed,
                            on_chunk=None)
    if index_type == "flat":
        index = faiss.IndexFlatIP(dim)
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        index.hnsw.efSearch = 128
    else:
        raise ConfigError(f"unknown dense index type {index_type!r}", fix=f"use one of {', '.join(INDEX_TYPES)}")
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index


def _train_ivfpq(vectors, *, ivf_lists: int | None, pq_bytes: int | None, nprobe: int, seed: int, on_chunk,
                 chunk: int = CHUNK):
    """IVF-PQ trained on at most max(TRAIN_ROWS, 40 per list) rows (a seeded sample when there are more),
    then filled `chunk` rows at a time; `on_chunk(start, block)` sees every float32 block as it is added.
    Peak memory: the training rows, one chunk and the codes, never the whole float32 matrix."""
    import faiss

    n, dim = vectors.shape
    lists = ivf_lists or max(1, min(int(4 * math.sqrt(n)), n // 39))
    m = pq_bytes or _pq_subquantizers(dim)
    bits = 8 if n >= 256 * 39 else max(1, min(8, int(math.log2(max(2, n // 39)))))
    index = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, lists, m, bits, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = seed
    index.pq.cp.seed = seed
    # k-means wants >= 39 points a list and PQ 256 x 39; beyond 500k rows more change little. 21M passages
    # (18,330 lists) train on 0.73M rows: 2.2 GB at 768 dims instead of 64 GB
    sample = min(n, max(TRAIN_ROWS, 40 * lists))
    train = vectors if sample == n else vectors[np.sort(np.random.default_rng(seed).choice(n, sample, replace=False))]
    index.train(np.ascontiguousarray(train, dtype=np.float32))
    del train
    for start in range(0, n, chunk):
        block = np.ascontiguousarray(vectors[start:start + chunk], dtype=np.float32)
        index.add(block)
        if on_chunk:
            on_chunk(start, block)
    index.nprobe = min(lists, nprobe)
    return index


def _pq_subquantizers(dim: int) -> int:
    """dim/8 sub-vectors (1 byte each) when that divides dim: ~32x smaller than flat."""
    for m in (dim // 8, dim // 12, dim // 16, dim // 4, dim // 2, 1):
        if m >= 1 and dim % m == 0:
            return m
    return 1


def write_faiss(index, path: Path) -> None:
    import faiss

    faiss.write_index(index, str(path))


def read_faiss(path: Path, *, gpu: bool | None = None):
    """Load an index memory-mapped: its pages come from the page cache, shared by every process that opens
    the file. FAISS >= 1.10's IO_FLAG_MMAP_IFC maps flat codes, HNSW storage and inverted lists alike (with
    IO_FLAG_MMAP too, an IVF index does not load); older FAISS maps only inverted lists (IO_FLAG_MMAP).
    Indexes move to the GPUs when faiss has any (faiss-gpu installed)."""
    import faiss

    flags = getattr(faiss, "IO_FLAG_MMAP_IFC", None) or faiss.IO_FLAG_MMAP
    index = faiss.read_index(str(path), flags)
    n_gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if (gpu is None and n_gpus > 0) or gpu:
        index = faiss.index_cpu_to_all_gpus(index)
    return index


# ---------------------------------------------------------------------------------------------------------
# ivfpq-refine: IVF-PQ candidates, exact scores from fp16 vectors on disk


def refined_vectors_path(faiss_path: Path) -> Path:
    """dense/ivfpq-refine.faiss keeps its full vectors beside it in dense/ivfpq-refine.f16.npy."""
    return faiss_path.with_suffix(".f16.npy")


def write_refined(vectors, faiss_path: Path, *, ivf_lists: int | None = None, pq_bytes: int | None = None,
                  nprobe: int = NPROBE, seed: int = 0, chunk: int = CHUNK) -> None:
    """Build ivfpq-refine from `vectors` (an array or a memory map, read in chunks): the IVF-PQ index to
    `faiss_path` and the vectors as fp16 to `refined_vectors_path(faiss_path)`, written chunk by chunk."""
    n, dim = vectors.shape
    fp16 = np.lib.format.open_memmap(refined_vectors_path(faiss_path), mode="w+", dtype=np.float16,
                                     shape=(n, dim))

    def keep(start: int, block: np.ndarray) -> None:
        fp16[start:start + len(block)] = block

    index = _train_ivfpq(vectors, ivf_lists=ivf_lists, pq_bytes=pq_bytes, nprobe=nprobe, seed=seed,
                         on_chunk=keep, chunk=chunk)
    fp16.flush()
    del fp16
    write_faiss(index, faiss_path)


class RefinedIndex:
    """Searches like a FAISS index (`search(queries, k) -> (scores, rows)`): the IVF-PQ index proposes
    `refine_factor * k` candidates, their fp16 vectors (memory-mapped: only the candidates' pages are read)
    are scored exactly against the query, and the best k are returned, ties by row. Scores differ from a
    flat index's by at most the fp16 rounding of the passage vector: |q . (v - fp16(v))| <= 2^-11 for unit
    vectors."""

    def __init__(self, ivfpq, vectors: np.ndarray, *, refine_factor: int = REFINE_FACTOR):
        self.ivfpq = ivfpq
        self.vectors = vectors
        self.refine_factor = refine_factor

    @property
    def ntotal(self) -> int:
        return int(self.ivfpq.ntotal)

    @property
    def nprobe(self) -> int:
        return int(self.ivfpq.nprobe)

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        self.ivfpq.nprobe = min(int(value), int(self.ivfpq.nlist))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        pool = min(self.ntotal, max(k, self.refine_factor * k))
        _, candidates = self.ivfpq.search(queries, pool)
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        rows = np.full((len(queries), k), -1, dtype=np.int64)
        for i, (query, found) in enumerate(zip(queries, candidates)):
            found = np.sort(found[found >= 0])  # row order: the memory map is read front to back
            exact = self.vectors[found].astype(np.float32) @ query
            best = np.argsort(-exact, kind="stable")[:k]
            scores[i, :len(best)] = exact[best]
            rows[i, :len(best)] = found[best]
        return scores, rows


def read_refined(faiss_path: Path, *, refine_factor: int = REFINE_FACTOR) -> RefinedIndex:
    """Open ivfpq-refine: both files memory-mapped; a vectors file that does not fit the index is damaged."""
    from cosearch_cli.index.docstore import DAMAGED, damaged_index

    try:
        ivfpq = read_faiss(faiss_path, gpu=False)
    except DAMAGED as exc:
        raise damaged_index(faiss_path, exc) from None
    path = refined_vectors_path(faiss_path)
    try:
        vectors = np.load(path, mmap_mode="r")
    except DAMAGED as exc:
        raise damaged_index(path, exc) from None
    if vectors.dtype != np.float16 or vectors.shape != (ivfpq.ntotal, ivfpq.d):
        raise damaged_index(path, f"holds {vectors.dtype} {vectors.shape}, the index needs float16 "
                                  f"({ivfpq.ntotal}, {ivfpq.d})")
    return RefinedIndex(ivfpq, vectors, refine_factor=refine_factor)


def index_bytes(path: Path, n: int) -> float:
    return path.stat().st_size / max(1, n)


# ---------------------------------------------------------------------------------------------------------
# Embedding cache: encoding is the slow part (MiniLM ~23 passages/s on 2 CPU cores), and the same corpus is
# indexed again with other index types or settings, so embeddings are kept per (encoder, corpus hash).


def embedding_cache_path(encoder_name: str, corpus_sha: str) -> Path:
    from cosearch_cli.models import cache_dir

    return cache_dir() / "embeddings" / f"{encoder_key(encoder_name)}-{corpus_sha[:24]}.npy"


def load_cached_embeddings(encoder_name: str, corpus_sha: str, count: int) -> np.ndarray | None:
    path = embedding_cache_path(encoder_name, corpus_sha)
    if not path.is_file():
        return None
    vectors = np.load(path, mmap_mode="r")
    if vectors.shape[0] != count:  # a truncated or foreign file: ignore it, it will be rewritten
        return None
    return np.asarray(vectors, dtype=np.float32)


def save_cached_embeddings(encoder_name: str, corpus_sha: str, vectors: np.ndarray) -> Path:
    import os

    from cosearch_cli.artifacts import sweep_temporaries, temporary_path

    path = embedding_cache_path(encoder_name, corpus_sha)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_temporaries(path.parent)
    tmp = temporary_path(path, ".npy")
    try:
        np.save(tmp, np.asarray(vectors, dtype=np.float32))  # a float32 memory map is written, not copied
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
