"""`cosearch serve`: one index behind Search-R1's retrieval API, batching the queries of concurrent clients.

    POST /retrieve  {"queries": ["..."], "topk": 3, "return_scores": false}
        -> {"result": [[doc, ...], ...]}, or with return_scores {"result": [[{"document": doc, "score": s}, ...]]}
        doc = {"id", "title", "text", "contents"}; contents is '"title"\\ntext', the shape of Search-R1's wiki-18
        rows, which its generation code splits back into title and text
    POST /passages  {"ids": ["..."]} -> {"result": [doc, ...]}   (cosearch's own: the doc store by id)
    GET  /health    -> index name, passages, retrievers, limits, the index manifest, requests and searches so far

Search-R1's server runs each request's queries as they come. Here handler threads (one per connection, the
standard library's ThreadingHTTPServer) hand their queries to one batcher thread, which searches the queries of
every request waiting, up to `max_batch`, in one call of the retriever, then wakes each handler with its own
hits. It waits up to `max_wait_ms` for more only while other requests are still being read, so a lone client
does not pay the wait. Requests with different topk are searched separately (one search per distinct topk),
so every client gets exactly what a local search with its own k returns.

Bad requests get a 4xx status and {"error": "<one line>"}; a failing search a 500 with the same shape.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer

import orjson

from cosearch_cli.errors import IndexError_
from cosearch_cli.records import Hit, Passage

DEFAULT_TOPK = 3  # Search-R1's server default when a request names no topk


@dataclass
class ServeConfig:
    """How the server listens, batches and bounds requests."""

    host: str = "127.0.0.1"
    port: int = 8000
    """0 picks a free port (tests); `server.server_address` tells which."""
    max_batch: int = 64
    """Queries searched together at most (a request with more is searched alone, whole)."""
    max_wait_ms: float = 5.0
    """How long a batch waits for requests that are still being read."""
    serial: bool = False
    """One request at a time, no batcher, one handler thread: what Search-R1's server does (the benchmark's
    baseline)."""
    max_queries: int = 1024
    """Queries one request may carry."""
    max_topk: int = 1000
    max_ids: int = 10_000
    """Passage ids one /passages request may ask for."""
    max_body: int = 8 * 1024 * 1024
    """Bytes of a request body."""
    read_timeout_s: float = 30.0
    """A client that stops sending mid-request is dropped after this long (no handler waits forever)."""
    workers: int = 1
    """Processes answering on the one port (`serve_in_workers`; reported by /health)."""


class RequestError(Exception):
    """A request the server refuses: HTTP status and a one-line message for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# ---------------------------------------------------------------------------------------------------------
# Batching


@dataclass
class _Job:
    queries: list[str]
    k: int
    done: threading.Event = field(default_factory=threading.Event)
    hits: list[list[Hit]] | None = None
    error: BaseException | None = None


class Batcher:
    """One thread that runs the searches of all handler threads, several requests' queries per call."""

    def __init__(self, search: Callable[[list[str], int], list[list[Hit]]], *, max_batch: int, max_wait_s: float):
        self._search = search
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.searches = 0  # calls of the retriever (tests check that concurrent requests share them)
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._arriving = 0  # requests being read that will submit a job
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="cosearch-batcher", daemon=True)
        self._thread.start()

    def announce(self) -> None:
        """A handler started reading a request: a batch may wait for it."""
        with self._lock:
            self._arriving += 1

    def withdraw(self) -> None:
        """The announced request will not come (it was refused)."""
        with self._lock:
            self._arriving -= 1

    def submit(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Search `queries` (after `announce`) in the next batch; blocks until their hits are ready."""
        job = _Job(queries, k)
        with self._lock:
            self._arriving -= 1
            self._jobs.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.hits

    def queued(self) -> int:
        """Requests waiting for the next batch."""
        return self._jobs.qsize()

    def close(self) -> None:
        """Answer what is queued, then stop the thread."""
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._jobs.get()
            if first is None:
                return
            jobs, size = [first], len(first.queries)
            deadline = time.monotonic() + self.max_wait_s
            while size < self.max_batch:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._arriving <= 0:
                        break
                    try:
                        job = self._jobs.get(timeout=remaining)
                    except queue.Empty:
                        break
                if job is None:
                    stopping = True
                    break
                jobs.append(job)
                size += len(job.queries)
            self._answer(jobs)

    def _answer(self, jobs: list[_Job]) -> None:
        for k in dict.fromkeys(job.k for job in jobs):
            same_k = [job for job in jobs if job.k == k]
            try:
                hits = self._search([q for job in same_k for q in job.queries], k)
                self.searches += 1
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting handler, which answers 500
                for job in same_k:
                    job.error = exc
            else:
                start = 0
                for job in same_k:
                    job.hits = hits[start:start + len(job.queries)]
                    start += len(job.queries)
            for job in same_k:
                job.done.set()


# ---------------------------------------------------------------------------------------------------------
# The API, without HTTP


def document(passage: Passage) -> dict:
    """A passage as Search-R1's server returns it (plus title and text, so no client has to split contents)."""
    return {"id": passage.id, "title": passage.title, "text": passage.text,
            "contents": f'"{passage.title}"\n{passage.text}'}


class RetrievalApp:
    """Parses, checks and answers requests for one retriever of one opened index (local folder)."""

    def __init__(self, index, retriever, config: ServeConfig, *, dense_index: str | None = None,
                 log: Callable[[str], None] | None = None):
        self.index = index
        self.retriever = retriever
        self.dense_index = dense_index if retriever.name == "dense" else None
        self.config = config
        self.log = log or (lambda message: None)
        self.requests = 0
        self._serial_searches = 0
        self._lock = threading.Lock()
        self.batcher = None if config.serial else Batcher(retriever.search, max_batch=config.max_batch,
                                                          max_wait_s=config.max_wait_ms / 1000)

    @property
    def searches(self) -> int:
        return self.batcher.searches if self.batcher else self._serial_searches

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()

    def handle(self, method: str, path: str, read_body: Callable[[], bytes]) -> dict:
        """The reply to one request (its body read by `read_body`), or RequestError."""
        path = path.split("?", 1)[0]
        routes = {"/retrieve": "POST", "/passages": "POST", "/health": "GET"}
        if path not in routes:
            raise RequestError(404, f"no such endpoint {path!r}: use POST /retrieve, POST /passages or GET /health")
        if method != routes[path]:
            raise RequestError(405, f"{path} takes {routes[path]}, not {method}")
        with self._lock:
            self.requests += 1
        if path == "/health":
            return self.health()
        if path == "/passages":
            return self.passages(_json_object(read_body()))
        return self.retrieve(read_body)

    def health(self) -> dict:
        manifest = self.index.manifest
        return {"status": "ok", "index": self.index.folder.name, "passages": len(self.index.docs),
                "retrievers": [self.retriever.name], "dense_index": self.dense_index,
                "index_retrievers": self.index.kinds,
                "corpus_sha256": manifest["corpus"]["sha256"], "max_batch": self.config.max_batch,
                "max_wait_ms": self.config.max_wait_ms, "serial": self.config.serial,
                "max_queries": self.config.max_queries, "max_topk": self.config.max_topk,
                "max_ids": self.config.max_ids, "workers": self.config.workers, "pid": os.getpid(),
                "torch_threads": _torch_threads(),
                "requests": self.requests, "searches": self.searches,
                "manifest": manifest}

    def retrieve(self, read_body: Callable[[], bytes]) -> dict:
        if self.batcher is not None:
            self.batcher.announce()  # before reading: a batch being formed may wait for this request
        try:
            queries, k, with_scores = self._retrieve_request(_json_object(read_body()))
        except BaseException:
            if self.batcher is not None:
                self.batcher.withdraw()
            raise
        if not queries:
            if self.batcher is not None:
                self.batcher.withdraw()
            return {"result": []}
        if self.batcher is not None:
            hit_lists = self.batcher.submit(queries, k)
        else:
            hit_lists = self.retriever.search(queries, k)
            self._serial_searches += 1
        unique = list(dict.fromkeys(h.id for hits in hit_lists for h in hits))
        docs = {p.id: document(p) for p in self.index.docs.get(unique)}
        if with_scores:
            return {"result": [[{"document": docs[h.id], "score": h.score} for h in hits] for hits in hit_lists]}
        return {"result": [[docs[h.id] for h in hits] for hits in hit_lists]}

    def _retrieve_request(self, data: dict) -> tuple[list[str], int, bool]:
        queries = _strings(data, "queries", self.config.max_queries)
        k = data.get("topk")
        if k is None:
            k = DEFAULT_TOPK
        if not isinstance(k, int) or isinstance(k, bool):
            raise RequestError(400, f"'topk' must be an integer, got {type(k).__name__}")
        if not 1 <= k <= self.config.max_topk:
            raise RequestError(400, f"'topk' must be between 1 and {self.config.max_topk}, got {k}")
        with_scores = data.get("return_scores", False)
        if not isinstance(with_scores, bool):
            raise RequestError(400, f"'return_scores' must be true or false, got {type(with_scores).__name__}")
        return queries, k, with_scores

    def passages(self, data: dict) -> dict:
        ids = _strings(data, "ids", self.config.max_ids)
        try:
            found = self.index.docs.get(ids)
        except IndexError_ as exc:
            raise RequestError(404, exc.message) from None
        return {"result": [document(p) for p in found]}


def _torch_threads() -> int | None:
    """The intra-op threads of torch when this process has loaded it (a dense encoder), else None."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def _json_object(body: bytes) -> dict:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError(400, 'the body must be a JSON object such as {"queries": ["who wrote hamlet"], '
                                '"topk": 3}')
    return data


def _strings(data: dict, name: str, limit: int) -> list[str]:
    if name not in data:
        raise RequestError(400, f"missing field {name!r} (a list of strings)")
    values = data[name]
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise RequestError(400, f"{name!r} must be a list of strings")
    if len(values) > limit:
        raise RequestError(413, f"too many {name}: {len(values)} in one request, at most {limit}; split it")
    return values


# ---------------------------------------------------------------------------------------------------------
# HTTP


_DRAIN = 16 * 1024 * 1024


class _Handler(BaseHTTPRequestHandler):
    server_version = "cosearch"
    protocol_version = "HTTP/1.0"  # one request a connection: nothing idles open at shutdown

    def setup(self) -> None:
        self.timeout = self.server.app.config.read_timeout_s
        super().setup()

    def do_GET(self) -> None:  # noqa: N802 - the standard library's naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        app: RetrievalApp = self.server.app
        self._unread = 0
        try:
            status, reply = 200, app.handle(method, self.path, lambda: self._body(app.config.max_body))
        except RequestError as exc:
            status, reply = exc.status, {"error": exc.message}
        except Exception as exc:  # noqa: BLE001 - the client gets one line, the log the cause
            app.log(f"error answering {method} {self.path}: {type(exc).__name__}: {exc}")
            status, reply = 500, {"error": f"internal error ({type(exc).__name__}: {exc})"}
        self._drain()
        self._reply(status, reply)

    def _body(self, limit: int) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            raise RequestError(411, "send a Content-Length header with the JSON body")
        try:
            size = int(length)
        except ValueError:
            raise RequestError(400, f"bad Content-Length {length!r}") from None
        if size < 0:
            raise RequestError(400, f"bad Content-Length {length!r}")
        self._unread = size
        if size > limit:
            raise RequestError(413, f"request body of {size:,} bytes is over the limit of {limit:,}")
        body = self.rfile.read(size)
        self._unread = 0
        if len(body) < size:
            raise RequestError(400, f"the body ended after {len(body):,} of {size:,} bytes")
        return body

    def _drain(self) -> None:
        """Read a refused body (up to _DRAIN bytes) before answering: closing a socket with unread data
        resets the connection, and the client would see a reset instead of the error message."""
        if not 0 < self._unread <= _DRAIN:
            return
        try:
            self.rfile.read(self._unread)
        except OSError:
            pass

    def _reply(self, status: int, reply: dict) -> None:
        data = orjson.dumps(reply)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own refusals (a garbled request line, an unknown method) as one JSON line."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # a garbled request line: still answer with status and headers
            self.request_version = "HTTP/1.0"
        try:
            self._reply(code, {"error": message or self.responses.get(code, ("error",))[0]})
        except OSError:
            pass

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - per request: silent (the summary logs)
        pass


class _Logged:
    """One log line, not the standard library's traceback on stderr, for a connection that failed (e.g. a
    client that gave up and closed it before the reply was written)."""

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        self.app.log(f"connection from {client_address[0]}:{client_address[1]} failed: {type(exc).__name__}: {exc}")


class _Threaded(_Logged, ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins the handlers: in-flight requests finish on shutdown
    block_on_close = True
    request_queue_size = 256  # 32+ clients connecting at once must not overflow the listen backlog


class _Serial(_Logged, HTTPServer):
    request_queue_size = 256


def bind_server(config: ServeConfig) -> HTTPServer:
    """The listening socket and its HTTP server, with no app yet (`make_server` or `serve_in_workers` adds it)."""
    return (_Serial if config.serial else _Threaded)((config.host, config.port), _Handler)


def make_server(index, retriever, config: ServeConfig, *, dense_index: str | None = None,
                log: Callable[[str], None] | None = None) -> HTTPServer:
    """A bound HTTP server, not yet serving: run `serve_forever()`, call `shutdown()` from another thread, then
    `close_server`. `dense_index`: which FAISS index a dense retriever searches (reported by /health)."""
    app = RetrievalApp(index, retriever, config, dense_index=dense_index, log=log)
    try:
        server = bind_server(config)
    except BaseException:
        app.close()
        raise
    server.app = app
    return server


STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


def serve_until_stopped(server: HTTPServer, log: Callable[[str], None], label: str = "") -> None:
    """Serve until SIGINT or SIGTERM (their handlers restored afterwards; signals held back until then are let
    through), answer the requests in flight, close the server and log what it answered."""

    def stop(signum, frame) -> None:  # serve_forever runs in this thread: shut it down from another
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        close_server(server)
    log(f"{label}stopped after {server.app.requests:,} requests and {server.app.searches:,} index searches")


def serve_in_workers(server: HTTPServer, make_app: Callable[[], RetrievalApp], workers: int,
                     log: Callable[[str], None]) -> int:
    """Pre-fork: `workers` processes accept on the one listening socket of `server` (bound, no app), each with
    its own app (`make_app()`, called in the worker) over the index the parent opened, whose memory-mapped
    files they share. One process answers with one core (Python's GIL); this uses a node's others. SIGTERM or
    SIGINT to the parent stops every worker after its requests in flight. Returns 0 when every worker exited
    0; when one fails, the others are stopped and it returns 1."""
    children: dict[int, int] = {}

    def forward(signum, frame) -> None:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    # every worker wakes for a new connection and one wins it: the others' accept must fail (they go back to
    # waiting, able to see a shutdown), not block until the next connection
    server.socket.setblocking(False)
    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        for worker in range(workers):
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # held until the worker has its own handlers
            pid = os.fork()
            if pid == 0:  # the worker: never returns into the caller's code
                os._exit(_worker(server, make_app, worker, log))
            children[pid] = worker
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        server.socket.close()  # the workers hold the listening socket
        failed = False
        while children:
            pid, status = os.wait()
            worker = children.pop(pid, None)
            if worker is not None and os.waitstatus_to_exitcode(status) != 0 and not failed:
                failed = True
                log(f"worker {worker} exited with {os.waitstatus_to_exitcode(status)}: stopping the others")
                forward(signal.SIGTERM, None)
        return 1 if failed else 0
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _worker(server: HTTPServer, make_app: Callable[[], RetrievalApp], worker: int, log: Callable[[str], None]) -> int:
    """One forked worker (stop signals still held back from the fork): make its app, serve, exit code."""
    code = 1
    try:
        server.app = make_app()
        serve_until_stopped(server, log, label=f"worker {worker} ")
        code = 0
    except BaseException as exc:  # noqa: BLE001 - one line in the log; the parent sees the exit code
        log(f"worker {worker} failed: {type(exc).__name__}: {exc}")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def close_server(server: HTTPServer) -> None:
    """After serve_forever returned: wait for in-flight requests, then stop the batcher."""
    server.server_close()
    server.app.close()

