"""`cosearch serve`: an index folder behind Search-R1's HTTP retrieval API (the server is cosearch_cli/serve.py)."""

from __future__ import annotations

import errno
import os
import sys
from typing import Annotated

import typer

from cosearch_cli.cli import app
from cosearch_cli.cli.common import Quiet, stderr
from cosearch_cli.errors import ConfigError
from cosearch_cli.threads import thread_count


@app.command("serve")
def serve(
    index: Annotated[str, typer.Option(help="Index folder (from `cosearch index`) to serve.")],
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface; the API has no "
                                           "authentication, keep it on a trusted network).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port, printed on stderr).")] = 8000,
    max_batch: Annotated[int, typer.Option(help="Queries of concurrent requests searched together at most.")] = 64,
    max_wait_ms: Annotated[float, typer.Option(
        help="How long a batch waits for requests that are still being read (a lone client never waits).")] = 5.0,
    retriever: Annotated[str | None, typer.Option(help="bm25 or dense (default: bm25 when the index has it).")] = None,
    dense_index: Annotated[str | None, typer.Option(help="Dense only: which FAISS index of the folder "
                                                         "(flat, hnsw, ivfpq; default: the first built).")] = None,
    serial: Annotated[bool, typer.Option(help="Answer one request at a time with no batching (how Search-R1's "
                                              "server behaves; the baseline of bench/serve_load.py).")] = False,
    workers: Annotated[int, typer.Option(
        help="Processes answering on the one port, sharing the memory-mapped index (one process uses one core; "
             "give a many-core node several, e.g. with --serial for BM25). Not on Windows.")] = 1,
    quiet: Quiet = False,
) -> None:
    """Serve an index over HTTP: POST /retrieve takes Search-R1's {"queries", "topk", "return_scores"} and
    answers its {"result": ...} shape; GET /health describes the index. Point `--index http://HOST:PORT` of
    search, rollout, oracle, warmup or evaluate (or `index = "http://..."` in a train config) at it. Ctrl-C or
    SIGTERM stops it after the requests in flight are answered (exit 0)."""
    from cosearch_cli.index import open_index
    from cosearch_cli.index.remote import is_remote
    from cosearch_cli.serve import RetrievalApp, ServeConfig, bind_server, serve_in_workers, serve_until_stopped

    if workers < 1 or (workers > 1 and not hasattr(os, "fork")):
        raise ConfigError(f"--workers {workers}: needs 1 or more, and more than 1 needs os.fork (not on Windows)",
                          fix="pass --workers 1, or a larger number on Linux or macOS")
    if max_batch < 1 or max_wait_ms < 0:
        raise ConfigError(f"--max-batch must be >= 1 and --max-wait-ms >= 0, got {max_batch} and {max_wait_ms}",
                          fix="e.g. --max-batch 64 --max-wait-ms 5")
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port} is not a port", fix="pass a port from 1 to 65535, or 0 for any free one")
    if is_remote(index):
        raise ConfigError("--index of `cosearch serve` must be a folder, not a server", fix="pass an index folder")
    opened = open_index(index)
    engine = opened.retriever(retriever, index_type=dense_index)
    served_type = (dense_index or opened.manifest["dense"]["index_types"][0]) if engine.name == "dense" else None
    config = ServeConfig(host=host, port=port, max_batch=1 if serial else max_batch, max_wait_ms=max_wait_ms,
                         serial=serial, workers=workers)
    log = (lambda message: None) if quiet else (lambda message: stderr.print(message, highlight=False, markup=False,
                                                                                      soft_wrap=True))
    try:
        server = bind_server(config)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"{host}:{port} is already in use", fix="pass another --port (or stop the other "
                                                                      "server)") from None
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror or exc})",
                          fix="pass another --host or --port") from None
    bound_host, bound_port = server.server_address[:2]
    mode = "one request at a time" if serial else f"batches of up to {max_batch} queries, {max_wait_ms:g} ms wait"
    if workers > 1:
        mode += f", {workers} worker processes"
    log(f"serving {index} ({engine.name}, {len(opened.docs):,} passages) on http://{bound_host}:{bound_port} "
        f"({mode}); Ctrl-C stops")

    def make_app() -> RetrievalApp:
        if workers > 1 and "torch" in sys.modules:  # a dense encoder: each worker gets its share of the cores
            import torch

            torch.set_num_threads(max(1, thread_count()[0] // workers))
        return RetrievalApp(opened, engine, config, dense_index=served_type, log=log)

    if workers > 1:
        code = serve_in_workers(server, make_app, workers, log)
        if code:
            raise typer.Exit(code)
        return
    try:
        server.app = make_app()
    except BaseException:
        server.server_close()
        raise
    serve_until_stopped(server, log)
    if engine.name == "dense":
        _exit_before_teardown()


def _exit_before_teardown() -> None:
    """Exit 0 now, skipping the interpreter's teardown: everything is answered and written. In that teardown a
    native thread of the dense encoder's libraries aborted the process ("terminate called without an active
    exception", SIGABRT, no Python frame) after a clean stop in 3 of 10 serial dense load runs of bench/serve_load.py
    (2026-12-05; none in 6 runs since), which a job scheduler would report as a failure."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
