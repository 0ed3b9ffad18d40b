"""A `cosearch serve` server used as an index: `open_index("http://host:port")` returns a RemoteIndex.

It answers like an opened index folder (build.Index): `manifest`, `kinds`, `retriever(kind).search(queries, k)`
giving the same Hit records, and `docs.get(ids)` giving Passages. The passages of every search reply are kept
(a bounded cache), so the rollout's `docs.get` right after a search costs no second request; other ids are asked
of POST /passages.

Each request has a timeout; a refused or reset connection and a 5xx reply are retried with exponential backoff
a bounded number of times, a 4xx reply never (the same request would be refused again).
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Sequence

import orjson

from cosearch_cli.errors import ConfigError, CosearchError, IndexError_
from cosearch_cli.records import Hit, Passage

SERVE_HINT = "start one with `cosearch serve --index DIR --port PORT`, or check the address"
TIMEOUT_S = 60.0
RETRIES = 4
BACKOFF_S = 0.25
CACHE_PASSAGES = 100_000


def is_remote(index) -> bool:
    """Whether `index` names a server (http:// or https://) rather than an index folder."""
    return isinstance(index, str) and index.startswith(("http://", "https://"))


class Http:
    """JSON over HTTP to one server, with a timeout and bounded retries."""

    def __init__(self, url: str, *, timeout: float = TIMEOUT_S, retries: int = RETRIES, backoff: float = BACKOFF_S,
                 sleep=time.sleep):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.sleep = sleep
        self.attempts = 0  # requests sent, retries included (tests)

    def get(self, path: str) -> dict:
        return self._call(urllib.request.Request(self.url + path, method="GET"))

    def post(self, path: str, payload: dict, *, refused: type[CosearchError] = ConfigError) -> dict:
        """POST `payload`; a 4xx reply raises `refused` with the server's message."""
        request = urllib.request.Request(self.url + path, data=orjson.dumps(payload), method="POST",
                                         headers={"Content-Type": "application/json"})
        return self._call(request, refused)

    def _call(self, request: urllib.request.Request, refused: type[CosearchError] = ConfigError) -> dict:
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(self.backoff * 2 ** (attempt - 1))
            self.attempts += 1
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return _decode(response.read(), self.url)
            except urllib.error.HTTPError as exc:
                message = _error_message(exc)
                if exc.code < 500:
                    raise refused(f"the retrieval server refused {request.get_method()} "
                                  f"{request.selector}: {message}", path=self.url,
                                  fix="see README 'Serving an index: cosearch serve' for the request format") from None
                last = f"HTTP {exc.code}: {message}"
            except (OSError, http.client.HTTPException) as exc:  # refused, reset, cut off mid-reply, timed out
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                if isinstance(reason, TimeoutError):
                    raise IndexError_(f"the retrieval server gave no answer within {self.timeout:g} s",
                                      path=self.url, fix="check that it is running and not overloaded, or raise "
                                                         "the client's timeout") from None
                last = f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
        raise IndexError_(f"cannot reach the retrieval server after {self.retries + 1} tries ({last})",
                          path=self.url, fix=SERVE_HINT)


def _decode(raw: bytes, url: str) -> dict:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise IndexError_("the server's reply is not a JSON object", path=url, fix=SERVE_HINT)
    return data


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(orjson.loads(exc.read())["error"])
    except (orjson.JSONDecodeError, KeyError, TypeError, OSError):
        return exc.reason or f"HTTP {exc.code}"


class RemoteDocs:
    """Passages by id: from the search replies seen last, else from POST /passages."""

    def __init__(self, http_: Http, count: int, max_ids: int, cache_size: int = CACHE_PASSAGES):
        self._http = http_
        self._count = count
        self._max_ids = max_ids
        self._cache: OrderedDict[str, Passage] = OrderedDict()
        self._cache_size = cache_size

    def remember(self, passages: Sequence[Passage]) -> None:
        for passage in passages:
            self._cache[passage.id] = passage
            self._cache.move_to_end(passage.id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def get(self, ids: Sequence[str]) -> list[Passage]:
        found = {pid: self._cache[pid] for pid in ids if pid in self._cache}
        missing = [pid for pid in dict.fromkeys(ids) if pid not in found]
        for start in range(0, len(missing), self._max_ids):
            reply = self._http.post("/passages", {"ids": missing[start:start + self._max_ids]}, refused=IndexError_)
            passages = [_passage(doc, self._http.url) for doc in reply.get("result", [])]
            self.remember(passages)
            found.update((p.id, p) for p in passages)
        return [found[pid] for pid in ids]

    def __contains__(self, pid: str) -> bool:
        try:
            self.get([pid])
        except IndexError_:
            return False
        return True

    def __len__(self) -> int:
        return self._count


def _passage(doc, url: str) -> Passage:
    try:
        return Passage(id=doc["id"], title=doc["title"], text=doc["text"])
    except (KeyError, TypeError):
        raise IndexError_("a document in the server's reply lacks id, title or text", path=url,
                          fix="point --index at `cosearch serve` (other Search-R1 servers send only contents)") from None


class RemoteRetriever:
    """The server's retriever: `search(queries, k)` as a local one, in requests of at most max_queries."""

    def __init__(self, name: str, http_: Http, docs: RemoteDocs, max_queries: int):
        self.name = name
        self._http = http_
        self._docs = docs
        self._max_queries = max_queries

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        results: list[list[Hit]] = []
        for start in range(0, len(queries), self._max_queries):
            chunk = list(queries[start:start + self._max_queries])
            reply = self._http.post("/retrieve", {"queries": chunk, "topk": k, "return_scores": True})
            lists = reply.get("result")
            if not isinstance(lists, list) or len(lists) != len(chunk):
                raise IndexError_(f"the server answered {len(lists) if isinstance(lists, list) else 'no'} result "
                                  f"lists for {len(chunk)} queries", path=self._http.url, fix=SERVE_HINT)
            for items in lists:
                passages = [_passage(item["document"], self._http.url) for item in items]
                self._docs.remember(passages)
                results.append([Hit(id=p.id, score=item["score"]) for p, item in zip(passages, items)])
        return results


class RemoteIndex:
    """An index served by `cosearch serve` (see the module docstring)."""

    def __init__(self, url: str, *, timeout: float = TIMEOUT_S, retries: int = RETRIES, backoff: float = BACKOFF_S):
        self.http = Http(url, timeout=timeout, retries=retries, backoff=backoff)
        self.folder = self.http.url
        health = self.http.get("/health")
        if not isinstance(health.get("manifest"), dict) or not isinstance(health.get("retrievers"), list):
            raise IndexError_("not a cosearch retrieval server (its /health has no manifest)", path=self.folder,
                              fix="point --index at `cosearch serve`, or at an index folder")
        self.manifest = health["manifest"]
        self.served: list[str] = health["retrievers"]
        self.dense_index = health.get("dense_index")
        self.max_queries = int(health.get("max_queries", 1024))
        self.docs = RemoteDocs(self.http, int(health["passages"]), int(health.get("max_ids", 10_000)))
        self._retrievers: dict[str, RemoteRetriever] = {}

    @property
    def kinds(self) -> list[str]:
        return list(self.served)

    def retriever(self, kind: str | None = None, *, encoder: str | None = None,
                  index_type: str | None = None) -> RemoteRetriever:
        """The server's retriever; asking for another kind, encoder or dense index type is an error."""
        kind = kind or self.served[0]
        if kind not in self.served:
            raise IndexError_(f"this server serves {', '.join(self.served)}, not {kind}", path=self.folder,
                              fix=f"ask for {self.served[0]}, or start a server with `cosearch serve --retriever "
                                  f"{kind}`")
        dense = self.manifest.get("dense", {})
        if kind == "dense" and encoder is not None and encoder not in (dense.get("encoder"), dense.get("encoder_key")):
            raise IndexError_(f"the served index was built with encoder {dense.get('encoder')!r}, not {encoder!r}",
                              path=self.folder, fix=f"use --encoder {dense.get('encoder')}")
        if kind == "dense" and index_type is not None and index_type != self.dense_index:
            raise IndexError_(f"the server serves the {self.dense_index} dense index, not {index_type}",
                              path=self.folder, fix=f"start a server with `cosearch serve --dense-index {index_type}`")
        if kind not in self._retrievers:
            self._retrievers[kind] = RemoteRetriever(kind, self.http, self.docs, self.max_queries)
        return self._retrievers[kind]
