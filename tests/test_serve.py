"""`cosearch serve` and the remote index: the same hits as a local search, batching across concurrent
clients, one-line 4xx errors for every bad request, retries, graceful shutdown, and the CLI end to end.

Servers run in-process on a free loopback port over the real fixture BM25 index (conftest.fixture_bm25)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager

import orjson
import pytest
from conftest import FIXTURES, ROOT, run_cli

from cosearch_cli.errors import ConfigError, IndexError_
from cosearch_cli.index import open_index
from cosearch_cli.index.remote import RemoteIndex
from cosearch_cli.serve import ServeConfig, close_server, make_server

QUESTIONS = [json.loads(line)["question"] for line in (FIXTURES / "dev.jsonl").read_text().splitlines()[:8]]


@contextmanager
def serving(index, retriever=None, dense_index=None, **config):
    """A server on 127.0.0.1:<free port> in a background thread; yields it, shuts it down gracefully."""
    server = make_server(index, retriever or index.retriever("bm25"), ServeConfig(port=0, **config),
                         dense_index=dense_index)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join()
        close_server(server)


def url(server) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


def request(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """(status, content type, decoded JSON body) of one raw HTTP request."""
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        raw = response.read()
        return response.status, response.getheader("Content-Type"), raw
    finally:
        conn.close()


@pytest.fixture(scope="module")
def server(fixture_bm25):
    with serving(fixture_bm25) as running:
        yield running


def test_remote_search_gives_the_local_ids_scores_and_passages(server, fixture_bm25):
    remote = open_index(url(server))
    assert isinstance(remote, RemoteIndex) and remote.kinds == ["bm25"]
    assert remote.manifest == fixture_bm25.manifest and len(remote.docs) == len(fixture_bm25.docs) == 1464
    local = fixture_bm25.retriever("bm25")
    for k in (1, 3, 10, 50):
        got, expected = remote.retriever("bm25").search(QUESTIONS, k), local.search(QUESTIONS, k)
        assert [[(h.id, h.score) for h in hits] for hits in got] == [[(h.id, h.score) for h in hits]
                                                                    for hits in expected]
        assert all(len(hits) == k for hits in got)
        ids = [h.id for hits in got for h in hits]
        assert remote.docs.get(ids) == fixture_bm25.docs.get(ids)
    # passages never seen in a reply come from POST /passages; an unknown id is an index error, as locally
    fresh = open_index(url(server))
    some = [fixture_bm25.docs.row_id(row) for row in (0, 7, 1463)]
    assert fresh.docs.get(some) == fixture_bm25.docs.get(some)
    assert some[0] in fresh.docs and "no-such-id" not in fresh.docs
    with pytest.raises(IndexError_, match="'no-such-id' is not in this index"):
        fresh.docs.get(["no-such-id"])


def test_reply_has_search_r1_shape(server, fixture_bm25):
    body = orjson.dumps({"queries": QUESTIONS[:2], "topk": 2, "return_scores": True})
    status, kind, raw = request(server, "POST", "/retrieve", body)
    assert (status, kind) == (200, "application/json")
    result = orjson.loads(raw)["result"]
    expected = fixture_bm25.retriever("bm25").search(QUESTIONS[:2], 2)
    assert [[item["score"] for item in items] for items in result] == [[h.score for h in hits] for hits in expected]
    doc = result[0][0]["document"]
    passage = fixture_bm25.docs.get([expected[0][0].id])[0]
    assert doc == {"id": passage.id, "title": passage.title, "text": passage.text,
                   "contents": f'"{passage.title}"\n{passage.text}'}
    # without scores: lists of documents; without topk: Search-R1's default of 3
    status, _, raw = request(server, "POST", "/retrieve", orjson.dumps({"queries": QUESTIONS[:1]}))
    plain = orjson.loads(raw)["result"]
    assert status == 200 and [d["id"] for d in plain[0]] == [h.id for h in
                                                            fixture_bm25.retriever("bm25").search(QUESTIONS[:1], 3)[0]]
    status, _, raw = request(server, "GET", "/health")
    health = orjson.loads(raw)
    assert status == 200 and health["status"] == "ok" and health["passages"] == 1464
    assert health["retrievers"] == ["bm25"] and health["index"] == fixture_bm25.folder.name


class Gated:
    """The real BM25 retriever, but the search of the query "blocker" holds the batcher until `expected` other
    requests are queued behind it, so the test knows they all meet in the next batch (no timing involved)."""

    name = "bm25"

    def __init__(self, inner, expected: int):
        self.inner, self.expected = inner, expected
        self.server = None
        self.calls: list[int] = []
        self.entered = threading.Event()

    def search(self, queries, k):
        self.calls.append(len(queries))
        if queries == ["blocker"]:
            self.entered.set()
            batcher = self.server.app.batcher
            for _ in range(6000):  # at most a minute (a broken batcher then fails the test, it does not hang)
                if batcher.queued() >= self.expected:
                    break
                threading.Event().wait(0.01)
        return self.inner.search(queries, k)


def test_concurrent_clients_get_their_own_hits_in_fewer_searches(fixture_bm25):
    clients = 12
    local = fixture_bm25.retriever("bm25")
    gated = Gated(local, expected=clients)
    with serving(fixture_bm25, gated, max_batch=64, max_wait_ms=0) as server:
        gated.server = server
        remote = open_index(url(server))
        blocker = threading.Thread(target=lambda: remote.retriever().search(["blocker"], 1))
        blocker.start()
        assert gated.entered.wait(60)
        answers: dict[int, tuple] = {}

        def client(i: int) -> None:
            queries, k = [QUESTIONS[i % 8], QUESTIONS[(i + 3) % 8]], 2 + i % 2  # two distinct k
            answers[i] = (remote.retriever().search(queries, k), local.search(queries, k))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in [*threads, blocker]:
            thread.join()
        searches = server.app.searches
    for i in range(clients):
        got, expected = answers[i]
        assert [[(h.id, h.score) for h in hits] for hits in got] == [[(h.id, h.score) for h in hits]
                                                                    for hits in expected]
    # the blocker alone, then the 12 requests queued behind it in one batch: one search per distinct k
    assert searches == len(gated.calls) == 3 < clients + 1
    assert gated.calls == [1, 12, 12]


BAD = [  # (method, path, body, headers, status, message)
    ("POST", "/retrieve", b"{not json", {}, 400, "malformed JSON"),
    ("POST", "/retrieve", b"[1, 2]", {}, 400, "must be a JSON object"),
    ("POST", "/retrieve", b'{"topk": 3}', {}, 400, "missing field 'queries'"),
    ("POST", "/retrieve", b'{"queries": "who"}', {}, 400, "'queries' must be a list of strings"),
    ("POST", "/retrieve", b'{"queries": ["who", 3]}', {}, 400, "'queries' must be a list of strings"),
    ("POST", "/retrieve", b'{"queries": ["who"], "topk": "3"}', {}, 400, "'topk' must be an integer"),
    ("POST", "/retrieve", b'{"queries": ["who"], "topk": true}', {}, 400, "'topk' must be an integer"),
    ("POST", "/retrieve", b'{"queries": ["who"], "topk": 0}', {}, 400, "'topk' must be between 1 and 1000, got 0"),
    ("POST", "/retrieve", b'{"queries": ["who"], "topk": 1001}', {}, 400, "between 1 and 1000, got 1001"),
    ("POST", "/retrieve", b'{"queries": ["who"], "return_scores": "yes"}', {}, 400, "'return_scores' must be"),
    ("POST", "/retrieve", orjson.dumps({"queries": ["q"] * 9}), {}, 413, "too many queries: 9 in one request, "
                                                                          "at most 8"),
    ("POST", "/retrieve", orjson.dumps({"queries": ["x" * 3000]}), {}, 413, "over the limit of 2,000"),
    ("POST", "/retrieve", b"", {"Content-Length": "123456789"}, 413, "request body of 123,456,789 bytes"),
    ("POST", "/retrieve", b"", {"Content-Length": "ten"}, 400, "bad Content-Length"),
    ("POST", "/passages", b'{"ids": ["nope"]}', {}, 404, "passage id 'nope' is not in this index"),
    ("POST", "/passages", b'{"ids": 5}', {}, 400, "'ids' must be a list of strings"),
    ("GET", "/nope", None, {}, 404, "no such endpoint '/nope'"),
    ("POST", "/health", b"{}", {}, 405, "/health takes GET, not POST"),
    ("GET", "/retrieve", None, {}, 405, "/retrieve takes POST, not GET"),
    ("DELETE", "/retrieve", None, {}, 405, "/retrieve takes POST, not DELETE"),
    ("PATCH", "/retrieve", b"{}", {}, 501, "Unsupported method ('PATCH')"),
]


def test_every_bad_request_gets_its_4xx_and_a_one_line_message(fixture_bm25):
    with serving(fixture_bm25, max_queries=8, max_body=2000) as server:
        for method, path, body, headers, status, message in BAD:
            got, kind, raw = request(server, method, path, body, headers)
            assert (got, kind) == (status, "application/json"), (method, path, body, raw)
            assert b"\n" not in raw and b"Traceback" not in raw
            assert message in orjson.loads(raw)["error"], (message, raw)
        # no Content-Length at all, and a garbled request line, straight on the socket
        for raw_request, status, message in [(b"POST /retrieve HTTP/1.0\r\n\r\n", 411, "Content-Length"),
                                             (b"GET / HTTP/x.y\r\n\r\n", 400, "Bad request version"),
                                             (b"garbage\r\n\r\n", 400, "Bad request syntax")]:
            with socket.create_connection(server.server_address[:2], timeout=30) as sock:
                sock.sendall(raw_request)
                reply = b"".join(iter(lambda: sock.recv(65536), b""))
            head, _, body = reply.partition(b"\r\n\r\n")
            assert head.split(b" ")[1] == str(status).encode() and message in orjson.loads(body)["error"]
        # a body that ends early: answered when the client closes its side, not left hanging
        with socket.create_connection(server.server_address[:2], timeout=30) as sock:
            sock.sendall(b"POST /retrieve HTTP/1.0\r\nContent-Length: 100\r\n\r\n{\"queries\"")
            sock.shutdown(socket.SHUT_WR)
            reply = b"".join(iter(lambda: sock.recv(65536), b""))
        assert b" 400 " in reply.split(b"\r\n")[0] and b"the body ended after 10 of 100 bytes" in reply
        # and the server still answers well-formed requests
        status, _, raw = request(server, "POST", "/retrieve", orjson.dumps({"queries": ["hamlet"], "topk": 1}))
        assert status == 200 and len(orjson.loads(raw)["result"][0]) == 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serve_command(folder, *options: str, env: dict | None = None):
    """`cosearch serve --index FOLDER --port 0 OPTIONS` as a user starts it (a process); yields (process, the
    first stderr line, the port). Whatever the test does, the process is gone afterwards."""
    process = subprocess.Popen([sys.executable, "-m", "cosearch_cli", "serve", "--index", str(folder), "--port", "0",
                                *options], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                               stderr=subprocess.PIPE, text=True)
    try:
        line = process.stderr.readline()
        yield process, line, int(line.split("http://127.0.0.1:")[1].split(" ")[0])
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def get_json(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path, body=body)
    reply = conn.getresponse()
    status, data = reply.status, orjson.loads(reply.read())
    conn.close()
    return status, data


def test_client_retries_with_backoff_then_fails_clearly_on_a_closed_port():
    slept: list[float] = []
    address = f"http://127.0.0.1:{free_port()}"
    from cosearch_cli.index.remote import Http

    client = Http(address, retries=3, backoff=0.5, sleep=slept.append)
    with pytest.raises(IndexError_, match=r"cannot reach the retrieval server after 4 tries \(Connection"):
        client.get("/health")
    assert client.attempts == 4 and slept == [0.5, 1.0, 2.0]
    with pytest.raises(IndexError_) as caught:
        RemoteIndex(address, retries=0)
    assert caught.value.exit_code == 6 and "cosearch serve --index DIR" in str(caught.value)


class FailsOnce:
    """Raises on its first search (a 500), then searches for real."""

    name = "bm25"

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def search(self, queries, k):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("disk hiccup")
        return self.inner.search(queries, k)


def test_5xx_is_retried_and_4xx_is_not(fixture_bm25):
    flaky = FailsOnce(fixture_bm25.retriever("bm25"))
    with serving(fixture_bm25, flaky) as server:
        status, _, raw = request(server, "POST", "/retrieve", orjson.dumps({"queries": ["hamlet"]}))
        assert status == 500 and orjson.loads(raw) == {"error": "internal error (RuntimeError: disk hiccup)"}
        flaky.calls = 0
        remote = RemoteIndex(url(server), backoff=0.0)
        before = remote.http.attempts
        hits = remote.retriever().search(["hamlet"], 2)
        assert remote.http.attempts - before == 2 and flaky.calls == 2
        assert hits == fixture_bm25.retriever("bm25").search(["hamlet"], 2)
        before = remote.http.attempts
        with pytest.raises(ConfigError, match="between 1 and 1000, got 5000"):
            remote.retriever().search(["hamlet"], 5000)
        assert remote.http.attempts - before == 1


def test_remote_refuses_a_retriever_the_server_does_not_serve(server):
    remote = open_index(url(server))
    with pytest.raises(IndexError_, match="serves bm25, not dense"):
        remote.retriever("dense")


def test_shutdown_answers_the_request_in_flight(fixture_bm25):
    entered, gate = threading.Event(), threading.Event()

    class Slow:
        name = "bm25"

        def search(self, queries, k):
            entered.set()
            gate.wait(60)
            return fixture_bm25.retriever("bm25").search(queries, k)

    server = make_server(fixture_bm25, Slow(), ServeConfig(port=0))
    serve = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    serve.start()
    reply = {}
    client = threading.Thread(target=lambda: reply.update(
        zip(("status", "kind", "raw"), request(server, "POST", "/retrieve", b'{"queries": ["hamlet"], "topk": 2}'))))
    client.start()
    assert entered.wait(60)  # the request is being searched
    stopper = threading.Thread(target=lambda: (server.shutdown(), close_server(server)))
    stopper.start()
    serve.join(60)  # no longer accepting ...
    assert not serve.is_alive() and stopper.is_alive() and not reply  # ... but waiting for the request in flight
    gate.set()
    stopper.join(60)
    client.join(60)
    assert not stopper.is_alive() and reply["status"] == 200
    assert len(orjson.loads(reply["raw"])["result"][0]) == 2


def test_cli_search_through_the_server_prints_what_the_folder_does(server, fixture_bm25, tmp_path):
    local = run_cli("search", "--index", fixture_bm25.folder, "who wrote hamlet", "-k", "3")
    remote = run_cli("search", "--index", url(server), "who wrote hamlet", "-k", "3")
    assert remote.exit_code == local.exit_code == 0, remote.stderr
    assert remote.stdout == local.stdout and len(remote.stdout.splitlines()) == 3
    outputs = {}
    for name, index in (("local", fixture_bm25.folder), ("remote", url(server))):
        out = tmp_path / f"{name}.jsonl"
        result = run_cli("search", "--index", index, "--queries", FIXTURES / "dev.jsonl", "-k", "5", "--text",
                         "-o", out, "--quiet")
        assert result.exit_code == 0, result.stderr
        outputs[name] = out.read_bytes()
    questions = len((FIXTURES / "dev.jsonl").read_text().splitlines())
    assert outputs["remote"] == outputs["local"] and outputs["local"].count(b"\n") == questions


def test_cli_on_an_unreachable_server_is_exit_6(tmp_path):
    result = run_cli("search", "--index", f"http://127.0.0.1:{free_port()}", "who wrote hamlet")
    assert result.exit_code == 6
    assert result.stderr.startswith("error: http://127.0.0.1:") and "cannot reach the retrieval server" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_rollout_through_the_server_gives_the_local_records(server, fixture_bm25):
    from test_rollout import Scripted, search_then_answer

    from cosearch_cli.models import load_tokenizer
    from cosearch_cli.records import Question
    from cosearch_cli.rollout import RolloutConfig, run_rollouts

    tokenizer = load_tokenizer("smollm2")
    asked = [Question(f"q{i}", text, ["x"]) for i, text in enumerate(QUESTIONS[:3])]
    config = RolloutConfig(n=2, top_n=5, k=3, ranker="none", max_turns=2)
    records = {}
    searches = server.app.searches
    for name, index in (("local", fixture_bm25), ("remote", open_index(url(server)))):
        records[name] = list(run_rollouts(asked, agent=Scripted(tokenizer, search_then_answer), ranker_backend=None,
                                          index=index, config=config))
    assert server.app.searches > searches  # the remote rollout searched through the server
    observed = [t.turns[0].observation_ids for r in records["remote"] for t in r.trajectories]
    assert len(observed) == 6 and all(len(ids) == 3 for ids in observed)
    for remote, local in zip(records["remote"], records["local"], strict=True):
        assert remote.trajectories == local.trajectories and remote.ranker_calls == local.ranker_calls


def test_serve_command_stops_on_sigterm_with_exit_0(fixture_bm25):
    with serve_command(fixture_bm25.folder) as (process, line, port):
        assert line.startswith(f"serving {fixture_bm25.folder} (bm25, 1,464 passages) on http://127.0.0.1:"), line
        assert get_json(port, "POST", "/retrieve", b'{"queries": ["hamlet"], "topk": 1}')[0] == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert "stopped after 1 requests and 1 index searches" in process.stderr.read()


def test_serve_refuses_a_port_in_use_and_bad_options(fixture_bm25):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = run_cli("serve", "--index", fixture_bm25.folder, "--port", taken.getsockname()[1])
    assert result.exit_code == 4 and "is already in use" in result.stderr
    assert run_cli("serve", "--index", fixture_bm25.folder, "--max-batch", "0").exit_code == 4
    missing = run_cli("serve", "--index", fixture_bm25.folder / "nope")
    assert missing.exit_code == 6 and "no index folder here" in missing.stderr


def test_dense_retriever_served_gives_the_local_hits(tmp_path):
    folder = tmp_path / "fx"
    assert run_cli("index", "fixture", "--out", folder, "--quiet").exit_code == 0
    local = open_index(folder)
    dense = local.retriever("dense")
    with serving(local, dense, dense_index="flat") as server:
        remote = open_index(url(server))
        got, expected = remote.retriever("dense").search(QUESTIONS[:4], 5), dense.search(QUESTIONS[:4], 5)
        assert [[(h.id, h.score) for h in hits] for hits in got] == [[(h.id, h.score) for h in hits]
                                                                    for hits in expected]
        with pytest.raises(IndexError_, match="serves the flat dense index, not hnsw"):
            remote.retriever("dense", index_type="hnsw")
        with pytest.raises(IndexError_, match="serves dense, not bm25"):
            remote.retriever("bm25")


def test_a_client_that_hangs_up_early_is_one_log_line(fixture_bm25, capsys):
    lines: list[str] = []
    server = make_server(fixture_bm25, fixture_bm25.retriever("bm25"), ServeConfig(port=0), log=lines.append)
    try:
        with socket.create_connection(server.server_address[:2], timeout=30) as sock:
            sock.sendall(b"POST /retrieve HTTP/1.0\r\nContent-Length: 40\r\n\r\n")
        server.handle_request()  # its 400 reply meets a closed connection: reset or broken pipe, or nothing
    finally:
        close_server(server)  # joins the handler thread: its log line, if any, is written
    try:
        raise BrokenPipeError(32, "Broken pipe")
    except BrokenPipeError:
        server.handle_error(None, ("127.0.0.1", 5))
    assert all(re.fullmatch(r"connection from 127\.0\.0\.1:\d+ failed: (BrokenPipe|ConnectionReset)Error: .*", line)
               for line in lines[:-1]) and len(lines) <= 2
    assert lines[-1] == "connection from 127.0.0.1:5 failed: BrokenPipeError: [Errno 32] Broken pipe"
    assert "Traceback" not in capsys.readouterr().err




def test_workers_answer_on_one_port_and_stop_together_on_sigterm(fixture_bm25):
    """--workers 2: two processes accept on the one port, answer what a local search gives, report themselves
    in /health, and all stop with exit 0 on SIGTERM to the parent."""
    with serve_command(fixture_bm25.folder, "--workers", "2", "--serial") as (process, line, port):
        assert "(one request at a time, 2 worker processes)" in line, line
        pids = set()
        for _ in range(40):
            health = get_json(port, "GET", "/health")[1]
            assert health["workers"] == 2 and health["pid"] != process.pid
            pids.add(health["pid"])
        assert 1 <= len(pids) <= 2  # the kernel hands each connection to whichever worker accepts first
        remote = open_index(f"http://127.0.0.1:{port}").retriever("bm25").search(QUESTIONS[:4], 5)
        local = fixture_bm25.retriever("bm25").search(QUESTIONS[:4], 5)
        assert [[(h.id, h.score) for h in hits] for hits in remote] == [[(h.id, h.score) for h in hits]
                                                                        for hits in local]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        log = process.stderr.read()
        assert "worker 0 stopped after" in log and "worker 1 stopped after" in log
    assert run_cli("serve", "--index", fixture_bm25.folder, "--workers", "0").exit_code == 4


def test_a_worker_that_fails_to_start_makes_the_server_exit_1(tmp_path):
    """serve_in_workers forks; a worker whose app cannot be made logs one line and exits 1, and the parent
    returns 1 once every worker has exited (none is left serving)."""
    from cosearch_cli.serve import bind_server, serve_in_workers

    logfile = tmp_path / "log"

    def log(line: str) -> None:  # the workers are other processes: they log to a file
        with open(logfile, "a") as handle:
            handle.write(line + "\n")

    def make_app():
        raise RuntimeError("no memory for the index")

    assert serve_in_workers(bind_server(ServeConfig(port=0)), make_app, 2, log) == 1
    lines = logfile.read_text().splitlines()
    assert {"worker 0 failed: RuntimeError: no memory for the index",
            "worker 1 failed: RuntimeError: no memory for the index"} <= set(lines)
    assert sum(line.endswith("exited with 1: stopping the others") for line in lines) == 1


def test_dense_workers_share_the_cores_instead_of_each_taking_all(dense_fixture_folder):
    """Each of N workers gives torch cores // N threads (measured: 2 workers x 2 threads on 2 cores answered
    63 dense requests a second, 2 x 1 thread 213)."""
    options = ("--retriever", "dense", "--workers", "2")
    # 2 CPUs for the server: 1 thread a worker
    with serve_command(dense_fixture_folder, *options, env={"OMP_NUM_THREADS": "2"}) as (process, _, port):
        for _ in range(6):
            health = get_json(port, "GET", "/health")[1]
            assert (health["workers"], health["torch_threads"]) == (2, 1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0


def test_dense_serve_stops_on_sigterm_with_exit_0_and_its_last_line(dense_fixture_folder):
    """The dense server leaves without the interpreter's teardown (cli/serve.py: _exit_before_teardown), after
    answering and logging everything."""
    with serve_command(dense_fixture_folder, "--retriever", "dense", "--serial") as (process, _, port):
        assert get_json(port, "POST", "/retrieve", b'{"queries": ["hamlet"], "topk": 2}')[0] == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert process.stderr.read().strip().endswith("stopped after 1 requests and 1 index searches")


@pytest.fixture(scope="module")
def dense_fixture_folder(tmp_path_factory):
    """`cosearch index fixture`: BM25 and the shipped MiniLM flat index over the fixture corpus."""
    folder = tmp_path_factory.mktemp("dense-fixture") / "fx"
    assert run_cli("index", "fixture", "--out", folder, "--quiet").exit_code == 0
    return folder
