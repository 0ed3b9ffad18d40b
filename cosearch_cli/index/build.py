"""Building and opening index folders.

An index folder holds everything later stages need:
  passages.jsonl, offsets.npy, ids*.npy, rows_sorted.npy   the doc store (docstore.py)
  bm25/                                                    the bm25s index (bm25.py), or the sharded one
                                                           (bm25_sharded.py: bounded memory, same scores)
  dense/<type>.faiss                                       FAISS indexes over the encoder's embeddings
  index.manifest.json                                      corpus hash and count, encoder, settings, versions
It is built in a temporary folder beside the target and renamed into place only when complete, so a failed
build leaves nothing behind. The same passages and settings give byte-identical files (the manifest carries
no timestamp for that reason).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import orjson

from cosearch_cli.artifacts import (make_manifest, output_lock, sweep_temporaries, temporary_path,
                                    write_json_atomic)
from cosearch_cli.errors import ConfigError, IndexError_, InputError, OutputExists
from cosearch_cli.gcpause import paused_gc
from cosearch_cli.index import bm25 as bm25_mod
from cosearch_cli.index import bm25_sharded
from cosearch_cli.index import dense as dense_mod
from cosearch_cli.index.corpus import Corpus, passage_key
from cosearch_cli.index.docstore import DAMAGED, DocStore, DocStoreWriter, RowIds, damaged_index, duplicate_error
from cosearch_cli.records import Passage
from cosearch_cli.retrieval import Retriever

MANIFEST = "index.manifest.json"
BM25_BACKENDS = ("bm25s", "sharded", "pyserini")
INDEX_FORMAT = 1
Progress = Callable[[str, int], None]


def build_index(passages: Iterable[Passage], folder: str | Path, *, bm25: bool = True, dense: str | None = None,
                dense_index: str | Sequence[str] = "flat", bm25_backend: str = "bm25s",
                shard_size: int = bm25_sharded.SHARD_SIZE, overwrite: bool = False, batch_size: int = 64,
                cache_embeddings: bool = True, embeddings=None, options: dict | None = None,
                nprobe: int = dense_mod.NPROBE, refine_factor: int = dense_mod.REFINE_FACTOR,
                on_progress: Progress | None = None) -> dict:
    """Index `passages` into `folder` (BM25 and/or dense with encoder `dense`); returns the manifest.

    `passages` may be a `Corpus` (then errors name its files and lines) or any iterable of Passages.
    `bm25_backend`: "bm25s" (default), "sharded" (the same scores in bounded memory, `shard_size` passages a
    shard; for wiki-18) or "pyserini" (optional extra, Java 17; README "BM25 backends").
    `dense_index`: one FAISS type or several ("flat", "hnsw", "ivfpq", "ivfpq-refine"), each stored as
    dense/<type>.faiss (ivfpq-refine also keeps its fp16 vectors in dense/ivfpq-refine.f16.npy).
    `nprobe`: inverted lists an ivfpq/ivfpq-refine search visits; `refine_factor`: ivfpq-refine scores
    refine_factor * k candidates exactly (both recorded in the manifest).
    `embeddings`: precomputed passage vectors in corpus order (e.g. the fixture's shipped MiniLM vectors);
    otherwise they come from the embedding cache or are encoded (and cached).
    """
    folder = Path(folder)
    types = [dense_index] if isinstance(dense_index, str) else list(dense_index)
    for kind in types:
        if kind not in dense_mod.INDEX_TYPES:
            raise ConfigError(f"unknown dense index type {kind!r}",
                              fix=f"use one of {', '.join(dense_mod.INDEX_TYPES)}")
    if nprobe < 1 or refine_factor < 1:
        raise ConfigError(f"nprobe {nprobe} and refine factor {refine_factor} must be positive",
                          fix="pass --nprobe and --refine-factor of 1 or more")
    if bm25 and bm25_backend not in BM25_BACKENDS:
        raise ConfigError(f"unknown BM25 backend {bm25_backend!r}", fix=f"use {', '.join(BM25_BACKENDS)}")
    if bm25 and bm25_backend == "sharded" and shard_size < 1:
        raise ConfigError(f"shard size {shard_size} is not positive", fix="pass a shard size such as 1000000")
    if bm25 and bm25_backend == "pyserini":
        from cosearch_cli.index.lucene import _check_installed
        _check_installed()
    if not bm25 and not dense:
        raise ConfigError("nothing to build: neither BM25 nor a dense encoder was asked for",
                          fix="keep BM25 on, or pass a dense encoder ('minilm' or a folder)")
    # fail before writing; precomputed embeddings need only the encoder's config (name, dim), not its weights
    encoder = None
    if dense:
        encoder = (dense_mod.EncoderSpec(dense) if embeddings is not None
                   else dense_mod.HFEncoder(dense, batch_size=batch_size))
    with output_lock(folder):  # a second build into the same folder stops here instead of replacing this one
        _refuse_existing(folder, overwrite)
        sweep_temporaries(folder.parent)
        tmp = temporary_path(folder)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            manifest = _build(passages, tmp, bm25=bm25_backend if bm25 else None, shard_size=shard_size,
                              encoder=encoder, types=types, embeddings=embeddings,
                              cache_embeddings=cache_embeddings, options=options or {}, on_progress=on_progress,
                              nprobe=nprobe, refine_factor=refine_factor)
            _refuse_existing(folder, overwrite)  # again: something else may have made it meanwhile
            _replace_folder(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _refuse_existing(folder: Path, overwrite: bool) -> None:
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())) and not overwrite:
        raise OutputExists(f"{folder} already exists", fix="pass --overwrite to replace it, or choose another path")


def _build(passages, tmp: Path, *, bm25: str | None, shard_size: int, encoder, types, embeddings, cache_embeddings, options,
           on_progress, nprobe: int = dense_mod.NPROBE, refine_factor: int = dense_mod.REFINE_FACTOR) -> dict:
    import hashlib

    writer = DocStoreWriter(tmp)
    digest = hashlib.sha256()
    try:
        for passage in passages:
            writer.add(passage)
            digest.update(passage_key(passage))
            if on_progress and writer.count % 1000 == 0:
                on_progress("read", 1000)
    finally:
        duplicates = writer.close()
    if on_progress:
        on_progress("read", writer.count % 1000)
    paths = passages.reader.paths if isinstance(passages, Corpus) else []
    if writer.count == 0:
        raise InputError("the corpus is empty", path=", ".join(paths) or None,
                         fix="pass a JSONL file with one passage per line")
    if len(duplicates):
        raise _duplicate(DocStore(tmp), int(duplicates[0]), paths)
    corpus_sha = digest.hexdigest()
    store = DocStore(tmp)
    settings: dict = {}
    if bm25 == "pyserini":
        from cosearch_cli.index.lucene import build_lucene
        build_lucene(_counting(store, on_progress, "bm25"), tmp / "bm25")
        settings["bm25"] = {"backend": "pyserini", "k1": bm25_mod.K1, "b": bm25_mod.B, "analyzer": "lucene default",
                            "title_weight": bm25_mod.TITLE_WEIGHT}
    elif bm25 == "sharded":
        stats = bm25_sharded.build_sharded_bm25(
            _counting(store, on_progress, "bm25"), tmp / "bm25", shard_size=shard_size,
            on_shard=(lambda n: on_progress("bm25-shards", n)) if on_progress else None)
        settings["bm25"] = {**_bm25_settings("sharded"), "shard_size": shard_size, "shards": len(stats["shards"]),
                            "terms": stats["terms"]}
    elif bm25:
        bm25_mod.build_bm25(_counting(store, on_progress, "bm25"), tmp / "bm25")
        settings["bm25"] = _bm25_settings("bm25s")
    if encoder is not None:
        vectors = embeddings
        if vectors is not None and tuple(vectors.shape) != (len(store), encoder.dim):
            raise ConfigError(f"precomputed embeddings have shape {tuple(vectors.shape)}, the corpus needs "
                              f"{(len(store), encoder.dim)}", fix="encode this corpus with this encoder")
        if vectors is None and cache_embeddings:
            vectors = dense_mod.load_cached_embeddings(encoder.name, corpus_sha, len(store))
        scratch = tmp / ".embeddings.f32.npy"  # encoded vectors wait on disk, not in memory; removed below
        if vectors is None:
            vectors = dense_mod.encode_corpus(encoder, iter(store), out=scratch, count=len(store),
                                              on_progress=(lambda n: on_progress("encode", n)) if on_progress
                                              else None)
            if cache_embeddings:
                dense_mod.save_cached_embeddings(encoder.name, corpus_sha, vectors)
        elif on_progress:
            on_progress("encode", len(store))
        (tmp / "dense").mkdir()
        for kind in types:
            if kind == dense_mod.REFINED:
                dense_mod.write_refined(vectors, tmp / "dense" / f"{kind}.faiss", nprobe=nprobe)
            else:
                dense_mod.write_faiss(dense_mod.build_faiss(vectors, kind, nprobe=nprobe),
                                      tmp / "dense" / f"{kind}.faiss")
        settings["dense"] = {"encoder": encoder_spec(encoder.name), "encoder_key": dense_mod.encoder_key(encoder.name),
                             "dim": encoder.dim, "prefixes": encoder.prefixes, "max_length": encoder.max_length,
                             "pooling": "mean", "normalize": True, "index_types": types}
        del vectors
        scratch.unlink(missing_ok=True)
        if any(kind in ("ivfpq", dense_mod.REFINED) for kind in types):
            settings["dense"]["nprobe"] = nprobe
        if dense_mod.REFINED in types:
            settings["dense"]["refine_factor"] = refine_factor
    manifest = make_manifest("index", options, inputs=passages.file_hashes if isinstance(passages, Corpus) else {})
    manifest.pop("created")  # same inputs => byte-identical index, manifest included
    manifest.update({"format": INDEX_FORMAT, "corpus": {"sha256": corpus_sha, "passages": len(store)}, **settings})
    write_json_atomic(tmp / MANIFEST, manifest)
    return manifest


def _bm25_settings(backend: str) -> dict:
    """What the manifest records of a bm25s or sharded index (both score alike)."""
    return {"backend": backend, "k1": bm25_mod.K1, "b": bm25_mod.B, "method": "lucene",
            "stopwords": bm25_mod.STOPWORDS, "stemmer": bm25_mod.STEMMER, "title_weight": bm25_mod.TITLE_WEIGHT}


def encoder_spec(name: str) -> str:
    """What the manifest records: the embedded name, or the encoder folder as an absolute path."""
    if name == dense_mod.EMBEDDED_ENCODER:
        return name
    return str(dense_mod.resolve_encoder(name).resolve())


def _counting(store: DocStore, on_progress, phase: str):
    for i, passage in enumerate(store, start=1):
        if on_progress and i % 1000 == 0:
            on_progress(phase, 1000)
        yield passage
    if on_progress:
        on_progress(phase, len(store) % 1000)


def _duplicate(store: DocStore, row: int, paths: list[str]):
    pid = store.row_id(row)
    first_row = min(r for r in range(len(store)) if store.row_id(r) == pid)
    where = _locate(paths, [first_row, row]) if paths else {}
    return duplicate_error(pid, where.get(first_row), where.get(row))


def _locate(paths: list[str], rows: list[int]) -> dict[int, tuple[str, int]]:
    """(file, line) of the given corpus rows, by reading the corpus again (only on an error)."""
    wanted, found = set(rows), {}
    for index, row in enumerate(Corpus(paths).reader.rows()):
        if index in wanted:
            found[index] = (row.path, row.line)
            if len(found) == len(wanted):
                break
    return found


def _replace_folder(tmp: Path, folder: Path) -> None:
    if folder.exists():
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, folder)


# ---------------------------------------------------------------------------------------------------------
# Opening


class Index:
    """An opened index folder: `docs` (the doc store), `manifest`, and `retriever(kind)`."""

    def __init__(self, folder: Path, manifest: dict):
        self.folder = folder
        self.manifest = manifest
        self.docs = DocStore(folder)
        self._retrievers: dict[tuple, Retriever] = {}

    @property
    def kinds(self) -> list[str]:
        return [k for k in ("bm25", "dense") if k in self.manifest]

    def retriever(self, kind: str | None = None, *, encoder: str | None = None,
                  index_type: str | None = None) -> Retriever:
        """The BM25 or dense retriever (default: BM25 when built, else dense). Asking for dense with
        another encoder than the index was built with is an error, not silently wrong results."""
        kind = kind or self.kinds[0]
        if kind not in ("bm25", "dense"):
            raise ConfigError(f"unknown retriever {kind!r}", fix="use 'bm25' or 'dense'")
        if kind not in self.manifest:
            other = f" (it has {', '.join(self.kinds)})" if self.kinds else ""
            build = "--bm25" if kind == "bm25" else "--dense minilm"
            raise IndexError_(f"this index has no {kind} retriever{other}", path=self.folder,
                              fix=f"rebuild it with {build}, or ask for {self.kinds[0]}")
        key = (kind, encoder, index_type)
        if key not in self._retrievers:
            self._retrievers[key] = self._open(kind, encoder, index_type)
        return self._retrievers[key]

    def _open(self, kind: str, encoder: str | None, index_type: str | None) -> Retriever:
        if kind == "bm25":
            try:
                return self._open_bm25()
            except DAMAGED as exc:
                raise damaged_index(self.folder / "bm25", exc) from None
        return self._open_dense(encoder, index_type)

    def _open_bm25(self) -> Retriever:
        info = self.manifest["bm25"]
        if info["backend"] == "pyserini":
            from cosearch_cli.index.lucene import LuceneRetriever
            return LuceneRetriever(self.folder / "bm25", k1=info["k1"], b=info["b"])
        if info["backend"] == "sharded":
            return bm25_sharded.ShardedBM25Retriever(self.folder / "bm25", self.docs.row_ids())
        return bm25_mod.BM25Retriever(self.folder / "bm25", self.docs.row_ids(), stemmer=info.get("stemmer"),
                                      stopwords=info.get("stopwords", "en"))

    def _open_dense(self, encoder: str | None, index_type: str | None) -> Retriever:
        info = self.manifest["dense"]
        built_with = info["encoder"]
        if encoder is not None and encoder_spec(encoder) != built_with:
            raise IndexError_(f"index was built with encoder {built_with!r}, not {encoder!r}", path=self.folder,
                              fix=f"use --encoder {built_with}, or rebuild the index with --dense {encoder}")
        index_type = index_type or info["index_types"][0]
        if index_type not in info["index_types"]:
            raise IndexError_(f"no {index_type} dense index here (built: {', '.join(info['index_types'])})",
                              path=self.folder, fix=f"rebuild with --dense-index {index_type}")
        faiss_file = self.folder / "dense" / f"{index_type}.faiss"
        if index_type == dense_mod.REFINED:
            faiss_index = dense_mod.read_refined(faiss_file, refine_factor=info["refine_factor"])
        else:
            try:
                faiss_index = dense_mod.read_faiss(faiss_file)
            except DAMAGED as exc:
                raise damaged_index(faiss_file, exc) from None
        model = dense_mod.HFEncoder(built_with, prefixes=info["prefixes"], max_length=info["max_length"])
        return DenseRetriever(model, faiss_index, self.docs.row_ids())


class DenseRetriever:
    """Encode the queries, search FAISS, map rows to passage ids."""

    name = "dense"

    def __init__(self, encoder, faiss_index, row_ids: RowIds):
        self.encoder = encoder
        self.index = faiss_index
        self.row_ids = row_ids

    def search(self, queries: Sequence[str], k: int):
        if not queries:
            return []
        return self.search_vectors(self.encoder.encode_queries(list(queries)), k)

    def search_vectors(self, vectors, k: int):
        """Search with query vectors already encoded by this index's encoder."""
        from cosearch_cli.records import Hit

        scores, rows = self.index.search(vectors, min(k, len(self.row_ids)))
        with paused_gc():  # k hits a query, all acyclic (gcpause.py)
            return [[Hit(id=i, score=s) for i, s in zip(self.row_ids.take(rr[rr >= 0]), ss[rr >= 0].tolist())]
                    for rr, ss in zip(rows, scores)]


def open_index(folder: str | Path) -> Index:
    """Open an index folder, or connect to a `cosearch serve` server given as http://host:port (remote.py)."""
    from cosearch_cli.index.remote import RemoteIndex, is_remote

    if is_remote(folder):
        return RemoteIndex(folder)
    folder = Path(folder)
    build_hint = "build it with `cosearch index fixture` or `cosearch index build --corpus PATH --out DIR`"
    if not folder.is_dir():
        raise IndexError_("no index folder here", path=folder, fix=build_hint)
    manifest_file = folder / MANIFEST
    if not manifest_file.is_file():
        raise IndexError_(f"not a cosearch index (no {MANIFEST})", path=folder, fix=build_hint)
    try:
        manifest = orjson.loads(manifest_file.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise damaged_index(manifest_file, exc) from None
    if manifest.get("format") != INDEX_FORMAT:
        raise IndexError_(f"index format {manifest.get('format')!r}, this cosearch reads {INDEX_FORMAT}",
                          path=folder, fix="rebuild the index with this version")
    return Index(folder, manifest)


def index_location(index: str | Path) -> str:
    """How manifests record an index: a server's URL as given, a folder as an absolute path."""
    from cosearch_cli.index.remote import is_remote

    return index if is_remote(index) else str(Path(index).resolve())
