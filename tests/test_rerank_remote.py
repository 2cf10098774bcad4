"""The optional trained reranker service against a REAL loopback HTTP server."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from memoriesd.config import HttpConfig, ServiceConfig
from memoriesd.errors import AuthFailed, ConfigError, RerankFailed
from memoriesd.net.http_client import HttpClient
from memoriesd.rag.fusion import Candidate, order_by_scores
from memoriesd.rag.rerank import remote_rerank
from tests.conftest import create_vault, running_daemon
from tests.servers import Mirror, Scripted

PATH = "/v1/rerank"
KEY = "rk-test-0a1b2c3d4e5f-SECRET"
DOCS = ["the cat sat", "backup keys live in the safe", "weather report"]


@pytest.fixture
def server() -> Iterator[Mirror]:
    with Mirror() as m:
        yield m


@pytest.fixture(scope="module")
def client() -> Iterator[HttpClient]:
    # One client for the module: building its TLS context costs ~0.1 s.
    c = HttpClient(HttpConfig(retries=1, backoff_ms=10, timeout_seconds=2.0))
    yield c
    c.close()


def svc(server: Mirror, key: bool = False) -> ServiceConfig:
    return ServiceConfig(
        protocol="compatible", url=server.url + PATH, model="bge-reranker-v2-m3", api_key_env="RR_KEY" if key else ""
    )


def results(*pairs: tuple[object, object]) -> dict:
    return {"model": "bge", "results": [{"index": i, "relevance_score": s} for i, s in pairs]}


def test_scores_come_back_aligned_with_the_documents_sent(server: Mirror, client: HttpClient) -> None:
    # The service answers best first (as they do); scores must be re-aligned by index.
    server.add(PATH, Scripted.json(200, results((1, 0.92), (0, 0.11), (2, -3.5))))
    scores = remote_rerank(client, svc(server), "where are the backup keys?", DOCS, {})
    assert scores == [0.11, 0.92, -3.5]
    (seen,) = server.seen(PATH)
    assert json.loads(seen.body) == {
        "model": "bge-reranker-v2-m3",
        "query": "where are the backup keys?",
        "documents": DOCS,
        "top_n": 3,
    }
    assert "authorization" not in seen.headers
    cands = [Candidate(frag_id=10 + i, score=0.03 - i * 0.001, text=t) for i, t in enumerate(DOCS)]
    assert [c.frag_id for c in order_by_scores(cands, scores)] == [11, 10, 12]


def test_the_bearer_key_is_sent_when_configured(server: Mirror, client: HttpClient) -> None:
    server.add(PATH, Scripted.json(200, results((0, 1), (1, 0), (2, 0.5))))
    assert remote_rerank(client, svc(server, key=True), "q", DOCS, {"RR_KEY": KEY}) == [1.0, 0.0, 0.5]
    assert server.seen(PATH)[0].headers["authorization"] == f"Bearer {KEY}"


BAD = {
    "duplicate": (results((0, 0.1), (0, 0.2), (2, 0.3)), "appears twice"),
    "missing": (results((0, 0.1), (2, 0.3)), "1 of 3 documents have no score"),
    "out of range": (results((0, 0.1), (1, 0.2), (3, 0.3)), "index 3 is out of range for 3 documents"),
    "negative": (results((0, 0.1), (1, 0.2), (-1, 0.3)), "out of range"),
    "NaN": (results((0, 0.1), (1, math.nan), (2, 0.3)), "not finite"),
    "infinity": (results((0, 0.1), (1, math.inf), (2, 0.3)), "not finite"),
    "string score": (results((0, 0.1), (1, "0.5"), (2, 0.3)), "not a number"),
    "bool score": (results((0, 0.1), (1, True), (2, 0.3)), "not a number"),
    "string index": (results(("0", 0.1), (1, 0.2), (2, 0.3)), "no integer index"),
    "float index": (results((0.0, 0.1), (1, 0.2), (2, 0.3)), "no integer index"),
    "no results": ({"data": []}, 'no "results" list'),
    "results not list": ({"results": {"0": 1}}, 'no "results" list'),
    "result not object": ({"results": [0.1, 0.2, 0.3]}, "not an object"),
    "top-level list": ([{"index": 0, "score": 1}], 'no "results" list'),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_broken_rerank_answer_fails_instead_of_reordering(server: Mirror, client: HttpClient, case: str) -> None:
    answer, fragment = BAD[case]
    server.add(PATH, Scripted.json(200, answer))
    got = None
    with pytest.raises(RerankFailed) as info:
        got = remote_rerank(client, svc(server), "q", DOCS, {})
    assert got is None
    assert fragment in info.value.message
    assert info.value.code == "rerank_failed" and "\n" not in info.value.message


def test_a_non_json_body_is_a_rerank_failure(server: Mirror, client: HttpClient) -> None:
    server.add(PATH, Scripted(status=200, headers={"Content-Type": "text/html"}, body=b"<html>hi</html>"))
    with pytest.raises(RerankFailed, match="not JSON"):
        remote_rerank(client, svc(server), "q", DOCS, {})


def test_auth_failures_keep_their_own_code_and_hide_the_key(server: Mirror, client: HttpClient) -> None:
    server.add(PATH, Scripted.json(401, {"error": {"message": f"bad key {KEY}"}}))
    with pytest.raises(AuthFailed) as info:
        remote_rerank(client, svc(server, key=True), "q", DOCS, {"RR_KEY": KEY})
    assert KEY not in str(info.value)
    assert len(server.seen(PATH)) == 1


def test_no_documents_means_no_request(server: Mirror, client: HttpClient) -> None:
    assert remote_rerank(client, svc(server), "q", [], {}) == []
    assert server.seen() == []


def test_only_the_compatible_protocol_is_accepted(server: Mirror, client: HttpClient) -> None:
    bad = ServiceConfig(protocol="gemini", url=server.url + PATH, model="m")
    with pytest.raises(ConfigError, match="compatible"):
        remote_rerank(client, bad, "q", DOCS, {})
    assert server.seen() == []


def _wait(what: str, cond: Callable[[], object], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_lock_during_a_remote_rerank_stops_its_retries(server: Mirror) -> None:
    config = (
        f'[embedding.service]\nprotocol = "compatible"\nurl = "{server.url}/v1/embeddings"\nmodel = "e"\ndimensions = 3\n'
        f'[rerank]\nprotocol = "compatible"\nurl = "{server.url}{PATH}"\nmodel = "bge"\n'
        "[http]\nretries = 3\nbackoff_ms = 10\ntimeout_seconds = 60\n"  # a held answer waits for the test
    )
    with running_daemon(config) as d:
        vid = create_vault(d)
        d.call("memory.add", {"vault": vid, "body": "backup keys live in the safe"})
        emb = {"data": [{"index": 0, "embedding": [1.0, 0.0, 0.0]}]}
        server.add("/v1/embeddings", Scripted.json(200, emb), Scripted.json(200, emb))
        held = threading.Event()  # the first rerank answer (503) comes only once the lock has begun
        server.add(PATH, *[Scripted.json(503, {"error": "busy"}, hold=held) for _ in range(4)])
        box: dict = {}
        t = threading.Thread(target=lambda: box.update(msg=d.request("rag.search", {"vault": vid, "query": "backup keys", "mode": "hybrid"})))
        locker = threading.Thread(target=lambda: d.call("vault.lock", {"vault": vid}))
        t.start()
        try:
            _wait("the rerank request", lambda: server.seen(PATH))
            locker.start()  # it waits for the search, whose rerank request is held
            _wait("the lock to begin", lambda: d.request("memory.list", {"vault": vid}).get("error", {}).get("code") == "vault_locked")
        finally:
            held.set()
            t.join(60)
            if locker.ident is not None:
                locker.join(60)
        assert box["msg"]["error"]["code"] in ("cancelled", "vault_locked"), box["msg"]
        assert d.call("vault.status", {"vault": vid})["locked"]
        assert len(server.seen(PATH)) == 1  # the 503 is not retried once the vault is locked
