"""`cosearch index`: build retrieval index folders (doc store + BM25 and/or dense FAISS) from passage JSONL."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import orjson
import typer

from cosearch_cli.cli import app
from cosearch_cli.cli.common import FIXTURE_INDEX, FIXTURES, Overwrite, Quiet, progress, refuse_existing, stderr
from cosearch_cli.index import Corpus, build_index
from cosearch_cli.index.bm25_sharded import SHARD_SIZE
from cosearch_cli.index.dense import NPROBE, REFINE_FACTOR, REFINED

index_app = typer.Typer(help="Build retrieval indexes (doc store + BM25 and/or dense) from passage JSONL.",
                        no_args_is_help=True, rich_markup_mode=None)
app.add_typer(index_app, name="index")

FIXTURE_VECTORS = "corpus.minilm-f16.npy"

CorpusPaths = Annotated[list[str], typer.Option(
    "--corpus", help="Passage JSONL file(s) or quoted globs: {id,title,text} or {id,contents} lines "
                     "(contents = '\"Title\"\\ntext'); - for stdin. Repeat for several files.")]
Bm25 = Annotated[bool, typer.Option(help="Build the BM25 index (Lucene BM25, k1=1.5, b=0.75, stemmed, "
                                          "title x4).")]
Bm25Backend = Annotated[str, typer.Option(
    help="bm25s (pure Python; holds all token ids and scores in memory), sharded (the same scores, built in "
         "two streaming passes into --shard-size shards: memory stays flat as the corpus grows; the default of "
         "`index wiki`) or pyserini (Lucene; optional extra, Java 17). README 'BM25 backends' compares them.")]
ShardSize = Annotated[int, typer.Option(
    help="Passages per BM25 shard with --bm25-backend sharded. Building holds one shard's postings (about "
         "0.5 GB per million passages) besides the vocabulary; searching reads every shard.")]
DenseIndex = Annotated[list[str], typer.Option(
    "--dense-index", help="FAISS index type(s) for --dense: flat (exact, default), hnsw (faster queries, "
                          "more memory), ivfpq (~1/32 of flat's memory, approximate), ivfpq-refine (ivfpq's "
                          "memory; its candidates scored exactly from fp16 vectors kept on disk, "
                          "memory-mapped). Repeat for several.")]
Nprobe = Annotated[int, typer.Option(help="Inverted lists an ivfpq or ivfpq-refine search visits (more: better "
                                          "recall, slower).")]
RefineFactor = Annotated[int, typer.Option(help="ivfpq-refine scores refine-factor x k candidates exactly "
                                                "(more: closer to flat's top k, slower).")]
BatchSize = Annotated[int, typer.Option(help="Passages per encoder batch.")]
Cache = Annotated[bool, typer.Option(help="Reuse and keep passage embeddings in the cache folder "
                                          "($COSEARCH_CACHE or ~/.cache/cosearch/embeddings).")]


def _run(corpus: list[str], out: str, *, bm25: bool, dense: str | None, dense_index: list[str], batch_size: int,
         cache: bool, overwrite: bool, quiet: bool, bm25_backend: str = "bm25s", shard_size: int = SHARD_SIZE,
         embeddings=None, total: int | None = None, nprobe: int = NPROBE, refine_factor: int = REFINE_FACTOR) -> dict:
    refuse_existing(out, overwrite)
    options = {"corpus": corpus, "out": out, "bm25": bm25, "bm25_backend": bm25_backend, "dense": dense,
               "dense_index": dense_index, "batch_size": batch_size}
    if {"ivfpq", REFINED} & set(dense_index):
        options["nprobe"] = nprobe
    if REFINED in dense_index:
        options["refine_factor"] = refine_factor
    if bm25 and bm25_backend == "sharded":
        options["shard_size"] = shard_size
    with progress(quiet) as bar:
        tasks: dict = {}

        def on_progress(phase: str, n: int) -> None:
            if phase not in tasks:
                label = {"read": "reading passages", "bm25": "BM25 index", "encode": f"encoding ({dense})",
                         "bm25-shards": "BM25 shards"}
                if bm25_backend == "sharded":
                    label["bm25"] = "BM25 terms (pass 1)"
                for earlier in tasks.values():  # phases run one after the other
                    bar.finish(earlier)
                read = tasks["read"].done if "read" in tasks else None
                tasks[phase] = bar.add(label[phase], total if phase == "read" else read, unit="passages")
            bar.advance(tasks[phase], n)

        manifest = build_index(Corpus(corpus), out, bm25=bm25, bm25_backend=bm25_backend, shard_size=shard_size,
                               dense=dense, dense_index=dense_index, overwrite=overwrite, batch_size=batch_size,
                               cache_embeddings=cache, embeddings=embeddings, options=options,
                               nprobe=nprobe, refine_factor=refine_factor, on_progress=on_progress)
    if not quiet:
        kinds = [k for k in ("bm25", "dense") if k in manifest]
        stderr.print(f"indexed {manifest['corpus']['passages']:,} passages ({', '.join(kinds)}) into {out}")
    return manifest


@index_app.command("fixture")
def fixture(out: Annotated[str, typer.Option(help="Index folder to write.")] = FIXTURE_INDEX,
            dense: Annotated[bool, typer.Option(help="Also build the dense MiniLM index (uses the shipped "
                                                     "fixture embeddings, so it takes seconds).")] = True,
            reencode: Annotated[bool, typer.Option(help="Encode the fixture again (minutes on CPU) and "
                                                        "rewrite the shipped fixtures/" + FIXTURE_VECTORS)] = False,
            bm25_backend: Bm25Backend = "bm25s", shard_size: ShardSize = SHARD_SIZE,
            overwrite: Overwrite = True, quiet: Quiet = False) -> None:
    """Index the bundled fixture passages (fixtures/corpus.jsonl) into indexes/fixture: BM25 + MiniLM flat."""
    corpus = FIXTURES / "corpus.jsonl"
    vectors = None
    if dense and not reencode:
        vectors = _shipped_vectors(corpus)
        if vectors is None and not quiet:
            stderr.print(f"fixtures/{FIXTURE_VECTORS} does not match the fixture corpus: encoding it (minutes)")
    manifest = _run([str(corpus)], out, bm25=True, dense="minilm" if dense else None, dense_index=["flat"],
                    batch_size=64, cache=not reencode, overwrite=overwrite, quiet=quiet, embeddings=vectors,
                    bm25_backend=bm25_backend, shard_size=shard_size)
    if reencode and dense:
        _write_shipped_vectors(corpus, out, manifest)


def _shipped_vectors(corpus: Path) -> np.ndarray | None:
    """The fixture's fp16 MiniLM embeddings, when they were made from exactly this corpus."""
    info_path = (FIXTURES / FIXTURE_VECTORS).with_suffix(".json")
    if not info_path.is_file() or not (FIXTURES / FIXTURE_VECTORS).is_file():
        return None
    info = orjson.loads(info_path.read_bytes())
    passages = Corpus([str(corpus)])
    for _ in passages:
        pass
    if info.get("corpus_sha256") != passages.sha256:
        return None
    return np.load(FIXTURES / FIXTURE_VECTORS).astype(np.float32)


def _write_shipped_vectors(corpus: Path, out: str, manifest: dict) -> None:
    import faiss

    index = faiss.read_index(str(Path(out) / "dense" / "flat.faiss"))
    vectors = index.reconstruct_n(0, index.ntotal).astype(np.float16)
    np.save(FIXTURES / FIXTURE_VECTORS, vectors)
    info = orjson.loads((FIXTURES / FIXTURE_VECTORS).with_suffix(".json").read_bytes())
    info.update(corpus_sha256=manifest["corpus"]["sha256"], shape=list(vectors.shape))
    (FIXTURES / FIXTURE_VECTORS).with_suffix(".json").write_bytes(orjson.dumps(info, option=orjson.OPT_INDENT_2))


@index_app.command("wiki")
def wiki(corpus: CorpusPaths, out: Annotated[str, typer.Option(help="Index folder to write.")] = "indexes/wiki",
         bm25: Bm25 = True, bm25_backend: Bm25Backend = "sharded", shard_size: ShardSize = SHARD_SIZE,
         dense: Annotated[str | None, typer.Option(help="Also build a dense index with this encoder: 'minilm' or "
                                                        "a local Hugging Face encoder folder (e5-base-v2...). "
                                                        "Off by default: 21M passages take days on CPU.")] = None,
         dense_index: DenseIndex = ["flat"], nprobe: Nprobe = NPROBE, refine_factor: RefineFactor = REFINE_FACTOR,
         batch_size: BatchSize = 256,
         cache: Annotated[bool, typer.Option(help="Keep a copy of the embeddings in the cache folder "
                                                  "(wiki-18 x e5: 64 GB; off by default).")] = False,
         overwrite: Overwrite = False, quiet: Quiet = False) -> None:
    """Index the wiki-18 dump (21M passages, Search-R1/FlashRAG JSONL), streaming with a progress bar.

    Passage text is streamed and never held in memory. BM25 is sharded by default: pass 1 tokenises each
    passage once and counts document frequencies (in memory: the vocabulary), pass 2 writes the shards with
    the global statistics (in memory: one shard), so memory stays flat as the corpus grows and scores equal
    a bm25s index built in one piece. Encoded dense vectors wait in a scratch file on disk (4 x dim bytes a
    passage); --dense-index ivfpq-refine builds from it in chunks and keeps them as fp16 (README "Dense index
    types"), so its build memory stays small.
    """
    _run(corpus, out, bm25=bm25, bm25_backend=bm25_backend, shard_size=shard_size, dense=dense,
         dense_index=dense_index, batch_size=batch_size, cache=cache, overwrite=overwrite, quiet=quiet,
         total=None if quiet else _count_lines(corpus), nprobe=nprobe, refine_factor=refine_factor)


@index_app.command("build")
def build(corpus: CorpusPaths, out: Annotated[str, typer.Option(help="Index folder to write.")],
          bm25: Bm25 = True, bm25_backend: Bm25Backend = "bm25s", shard_size: ShardSize = SHARD_SIZE,
          dense: Annotated[str | None, typer.Option(help="Also build a dense index with this encoder: 'minilm' "
                                                         "or a local Hugging Face encoder folder.")] = None,
          dense_index: DenseIndex = ["flat"], nprobe: Nprobe = NPROBE, refine_factor: RefineFactor = REFINE_FACTOR,
          batch_size: BatchSize = 64, cache: Cache = True, overwrite: Overwrite = False,
          quiet: Quiet = False) -> None:
    """Index any passage corpus (JSONL) into a folder."""
    _run(corpus, out, bm25=bm25, bm25_backend=bm25_backend, shard_size=shard_size, dense=dense,
         dense_index=dense_index, batch_size=batch_size, cache=cache, overwrite=overwrite, quiet=quiet,
         nprobe=nprobe, refine_factor=refine_factor)


def _count_lines(paths: list[str]) -> int | None:
    """Lines in the corpus files, for the progress bar's total (one fast pass over the bytes)."""
    from cosearch_cli.artifacts import expand_inputs

    files = expand_inputs(paths)
    if "-" in files:
        return None
    total = 0
    for path in files:
        with open(path, "rb") as handle:
            while block := handle.read(1 << 24):
                total += block.count(b"\n")
    return total
