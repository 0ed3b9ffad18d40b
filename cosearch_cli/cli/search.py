"""`cosearch search`: query an index folder, one query from the command line or a JSONL of questions."""

from __future__ import annotations

from typing import Annotated

import typer

from cosearch_cli.artifacts import Reader, Writer, make_manifest
from cosearch_cli.cli import app
from cosearch_cli.cli.common import Output, Quiet, progress
from cosearch_cli.errors import ConfigError, InputError, RecordError
from cosearch_cli.index import open_index

_BATCH = 256


@app.command("search")
def search(
    query: Annotated[str | None, typer.Argument(help="One query; prints rank, score, id, title and text.")] = None,
    index: Annotated[str, typer.Option(
        "--index", help="Index folder (from `cosearch index`), or http://HOST:PORT of `cosearch serve`.")] = "indexes/fixture",
    queries: Annotated[str | None, typer.Option(
        help="JSONL of questions (fields id and question) to search in batches; - for stdin. Writes one record "
             "per question.")] = None,
    output: Output = "-",
    k: Annotated[int, typer.Option("-k", "--k", help="Hits per query.")] = 10,
    retriever: Annotated[str | None, typer.Option(help="bm25 or dense (default: bm25 when the index has it).")] = None,
    encoder: Annotated[str | None, typer.Option(help="Dense only: the encoder you expect the index to use; "
                                                     "refused when the index was built with another.")] = None,
    dense_index: Annotated[str | None, typer.Option(help="Dense only: which FAISS index of the folder "
                                                         "(flat, hnsw, ivfpq, ivfpq-refine; default: the first "
                                                         "built).")] = None,
    text: Annotated[bool, typer.Option(help="Batch mode: include each hit's title and text.")] = False,
    quiet: Quiet = False,
) -> None:
    """Search an index: `cosearch search "who wrote hamlet"` or `--queries q.jsonl -o hits.jsonl`."""
    if (query is None) == (queries is None):
        raise ConfigError("give either one QUERY or --queries FILE", fix='e.g. cosearch search "who wrote hamlet"')
    if k < 1:
        raise ConfigError(f"-k must be at least 1, got {k}", fix="pass -k 10")
    opened = open_index(index)
    engine = opened.retriever(retriever, encoder=encoder, index_type=dense_index)
    if query is not None:
        hits = engine.search([query], k)[0]
        for rank, (hit, passage) in enumerate(zip(hits, opened.docs.get([h.id for h in hits])), start=1):
            typer.echo(f"{rank}\t{hit.score:.4f}\t{hit.id}\t{passage.title}\t{passage.text}")
        return
    reader = Reader.open(queries)
    options = {"index": index, "k": k, "retriever": engine.name, "encoder": encoder, "dense_index": dense_index,
               "text": text, "index_corpus_sha256": opened.manifest["corpus"]["sha256"]}
    with Writer(output) as writer, progress(quiet) as bar:
        task = bar.add(f"searching ({engine.name})", unit="queries")
        batch: list[tuple[str, str]] = []
        for row in reader.rows():
            batch.append(_question(row.data, row.path, row.line))
            if len(batch) == _BATCH:
                _flush(batch, engine, opened.docs, k, text, writer)
                bar.advance(task, len(batch))
                batch = []
        if batch:
            _flush(batch, engine, opened.docs, k, text, writer)
            bar.advance(task, len(batch))
        if not writer.count:
            raise InputError("no queries in the input", path=queries, fix="pass a JSONL file with one question a line")
        writer.manifest = make_manifest("search", options, inputs=reader.hashes, upstream=reader.upstream)


def _question(data: dict, path: str, line: int) -> tuple[str, str]:
    for name in ("id", "question"):
        if name not in data:
            raise RecordError(f"missing field {name!r}", path=path, line=line,
                              fix="each line needs an id and a question (string)")
    if not isinstance(data["question"], str):
        raise RecordError("field 'question' should be a string", path=path, line=line,
                          fix="each line needs an id and a question (string)")
    return str(data["id"]), data["question"]


def _flush(batch, engine, docs, k: int, text: bool, writer: Writer) -> None:
    results = engine.search([q for _, q in batch], k)
    for (qid, question), hits in zip(batch, results):
        out = [{"id": h.id, "score": h.score} for h in hits]
        if text:
            for item, passage in zip(out, docs.get([h.id for h in hits])):
                item.update(title=passage.title, text=passage.text)
        writer.write({"id": qid, "question": question, "hits": out})
