"""Remote embeddings and generation against REAL loopback HTTP servers (gemini and compatible)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from memoriesd.config import HttpConfig, ServiceConfig
from memoriesd.errors import (
    AuthFailed,
    ConfigError,
    DeviceOnly,
    GenerationNotConfigured,
    HttpError,
    HttpTimeout,
    InvalidModelOutput,
    MemoriesError,
    RedirectRefused,
)
from memoriesd.net.http_client import HttpClient
from memoriesd.rag.grounding import grounded_answer
from memoriesd.rag.policy import check_device_policy
from memoriesd.rag.providers import Generator, RemoteEmbedder
from tests.servers import Mirror, Scripted, Socks5Proxy

KEY = "sk-test-9f8e7d6c5b4a-SECRET"
ENV = {"TEST_MODEL_KEY": KEY}
G_EMBED = "/v1beta/models/gemini-embedding-001:embedContent"
G_BATCH = "/v1beta/models/gemini-embedding-001:batchEmbedContents"
G_GEN = "/v1beta/models/gemini-2.5-flash:generateContent"
C_EMBED = "/v1/embeddings"
C_CHAT = "/v1/chat/completions"


@pytest.fixture
def server() -> Iterator[Mirror]:
    with Mirror() as m:
        yield m


@pytest.fixture(scope="module")
def client() -> Iterator[HttpClient]:
    # One client for the module: building its TLS context costs ~0.1 s.
    c = HttpClient(HttpConfig(retries=2, backoff_ms=10, timeout_seconds=2.0, connect_timeout_seconds=2.0))
    yield c
    c.close()


def gemini_embed(server: Mirror, dims: int = 0, key: bool = True) -> ServiceConfig:
    return ServiceConfig(
        protocol="gemini", url=server.url + G_EMBED, model="", api_key_env="TEST_MODEL_KEY" if key else "", dimensions=dims
    )


def compat_embed(server: Mirror, dims: int = 0, key: bool = True) -> ServiceConfig:
    return ServiceConfig(
        protocol="compatible",
        url=server.url + C_EMBED,
        model="nomic-embed-text",
        api_key_env="TEST_MODEL_KEY" if key else "",
        dimensions=dims,
    )


def body(seen: object) -> dict:
    return json.loads(seen.body)  # type: ignore[attr-defined]


def compat_data(vectors: list[list[float]], order: list[int] | None = None) -> dict:
    order = order if order is not None else list(range(len(vectors)))
    return {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": vectors[i]} for i in order]}


def chat(content: str | None, finish: str = "stop") -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}]}


def gemini_answer(*parts: dict, finish: str = "STOP") -> dict:
    return {"candidates": [{"content": {"role": "model", "parts": list(parts)}, "finishReason": finish}]}


# --- embeddings: gemini -----------------------------------------------------------------


def test_gemini_single_query_uses_embed_content_with_the_key_header(server: Mirror, client: HttpClient) -> None:
    server.add(G_EMBED, Scripted.json(200, {"embedding": {"values": [3.0, 4.0, 0.0]}}))
    emb = RemoteEmbedder(client, gemini_embed(server), ENV)
    assert emb.dimensions is None
    vec = emb.embed_queries(["what is my backup key?"])
    assert vec.dtype == np.float32 and vec.shape == (1, 3)
    assert np.allclose(vec[0], [0.6, 0.8, 0.0])
    assert emb.dimensions == 3
    (seen,) = server.seen(G_EMBED)
    assert seen.headers["x-goog-api-key"] == KEY and "authorization" not in seen.headers
    assert body(seen) == {
        "model": "models/gemini-embedding-001",
        "content": {"parts": [{"text": "what is my backup key?"}]},
        "taskType": "RETRIEVAL_QUERY",
    }


def test_gemini_documents_go_in_batches_with_titles_and_dimensions(server: Mirror, client: HttpClient) -> None:
    server.add(
        G_BATCH,
        Scripted.json(200, {"embeddings": [{"values": [1.0, 0.0]}, {"values": [0.0, 2.0]}]}),
        Scripted.json(200, {"embeddings": [{"values": [1.0, 1.0]}, {"values": [0.0, -5.0]}]}),
    )
    emb = RemoteEmbedder(client, gemini_embed(server, dims=2), ENV, batch_size=2)
    progress: list[tuple[int, int]] = []
    items = [("Keys", "backup key"), (None, "no title"), ("", "empty title"), ("T", "last")]
    mat = emb.embed_documents(items, on_batch=lambda d, t: progress.append((d, t)))
    assert mat.shape == (4, 2)
    assert np.allclose(np.linalg.norm(mat, axis=1), 1.0)
    assert np.allclose(mat[3], [0.0, -1.0])
    assert progress == [(2, 4), (4, 4)]
    first, second = (body(s) for s in server.seen(G_BATCH))
    assert first["requests"][0] == {
        "model": "models/gemini-embedding-001",
        "content": {"parts": [{"text": "backup key"}]},
        "taskType": "RETRIEVAL_DOCUMENT",
        "title": "Keys",
        "outputDimensionality": 2,
    }
    assert "title" not in first["requests"][1] and "title" not in second["requests"][0]
    assert not server.seen(G_EMBED)


# --- embeddings: compatible -------------------------------------------------------------


def test_compatible_vectors_are_placed_by_their_index(server: Mirror, client: HttpClient) -> None:
    vectors = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    server.add(C_EMBED, Scripted.json(200, compat_data(vectors, order=[2, 0, 1])))
    emb = RemoteEmbedder(client, compat_embed(server), ENV)
    mat = emb.embed_documents([(None, "a"), ("t", "b"), (None, "c")])
    assert np.allclose(mat, np.eye(3))
    (seen,) = server.seen(C_EMBED)
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert body(seen) == {"model": "nomic-embed-text", "input": ["a", "b", "c"]}


def test_compatible_sends_dimensions_only_when_configured_and_no_key_on_loopback(
    server: Mirror, client: HttpClient
) -> None:
    server.add(C_EMBED, Scripted.json(200, compat_data([[0.5, 0.5]])))
    emb = RemoteEmbedder(client, compat_embed(server, dims=2, key=False), {})
    emb.embed_queries(["q"])
    (seen,) = server.seen(C_EMBED)
    assert "authorization" not in seen.headers
    assert body(seen) == {"model": "nomic-embed-text", "input": ["q"], "dimensions": 2}


def test_no_texts_means_no_request(server: Mirror, client: HttpClient) -> None:
    emb = RemoteEmbedder(client, compat_embed(server, dims=8), ENV)
    assert emb.embed_documents([]).shape == (0, 8)
    assert server.seen() == []


BAD_COMPAT = {
    "wrong dimensions": compat_data([[1.0, 0.0], [1.0, 0.0, 0.0]]),
    "NaN": compat_data([[1.0, math.nan, 0.0], [1.0, 0.0, 0.0]]),
    "infinity": compat_data([[1.0, math.inf, 0.0], [1.0, 0.0, 0.0]]),
    "missing index": {"data": [{"embedding": [1.0, 0.0, 0.0]}, {"index": 1, "embedding": [1.0, 0.0, 0.0]}]},
    "duplicate index": compat_data([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]], order=[0, 0]),
    "index out of range": {"data": [{"index": 0, "embedding": [1.0, 0.0, 0.0]}, {"index": 2, "embedding": [1.0, 0.0, 0.0]}]},
    "too few vectors": compat_data([[1.0, 0.0, 0.0]]),
    "zero vector": compat_data([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]),
    "strings": compat_data([["1.0", "0", "0"], [1.0, 0.0, 0.0]]),  # type: ignore[list-item]
    "no data": {"embeddings": []},
}


@pytest.mark.parametrize("case", sorted(BAD_COMPAT))
def test_bad_compatible_vectors_return_nothing(server: Mirror, client: HttpClient, case: str) -> None:
    server.add(C_EMBED, Scripted.json(200, BAD_COMPAT[case]))
    emb = RemoteEmbedder(client, compat_embed(server), ENV)
    got = None
    with pytest.raises(InvalidModelOutput) as info:
        got = emb.embed_documents([(None, "a"), (None, "b")])
    assert got is None
    assert "nothing was stored" in info.value.message and "\n" not in info.value.message
    assert emb.dimensions is None  # a rejected answer teaches nothing


def test_configured_dimensions_are_enforced(server: Mirror, client: HttpClient) -> None:
    server.add(G_EMBED, Scripted.json(200, {"embedding": {"values": [1.0, 0.0, 0.0, 0.0]}}))
    emb = RemoteEmbedder(client, gemini_embed(server, dims=3), ENV)
    with pytest.raises(InvalidModelOutput, match="4 dimensions where 3 were expected"):
        emb.embed_queries(["q"])


def test_gemini_batch_with_a_missing_embedding_is_refused(server: Mirror, client: HttpClient) -> None:
    server.add(G_BATCH, Scripted.json(200, {"embeddings": [{"values": [1.0, 0.0]}]}))
    emb = RemoteEmbedder(client, gemini_embed(server), ENV)
    with pytest.raises(InvalidModelOutput, match="1 vectors for 2 inputs"):
        emb.embed_documents([(None, "a"), (None, "b")])


def test_learned_dimensions_must_stay_the_same_across_batches(server: Mirror, client: HttpClient) -> None:
    server.add(C_EMBED, Scripted.json(200, compat_data([[1.0, 0.0]])), Scripted.json(200, compat_data([[1.0, 0.0, 1.0]])))
    emb = RemoteEmbedder(client, compat_embed(server), ENV, batch_size=1)
    with pytest.raises(InvalidModelOutput, match="3 dimensions where 2 were expected"):
        emb.embed_documents([(None, "a"), (None, "b")])


def test_identity_names_protocol_host_model_and_dimensions(server: Mirror, client: HttpClient) -> None:
    a = RemoteEmbedder(client, compat_embed(server), ENV).identity
    b = RemoteEmbedder(client, compat_embed(server, dims=256), ENV).identity
    c = RemoteEmbedder(client, gemini_embed(server), ENV).identity
    assert a == f"remote:compatible:127.0.0.1:{server.port}:nomic-embed-text:default:d2"
    assert b.endswith(":256:d2") and a != b
    assert c.startswith("remote:gemini:") and "models/gemini-embedding-001" in c
    assert KEY not in a + b + c


def test_gemini_embedding_url_must_name_the_operation(server: Mirror, client: HttpClient) -> None:
    svc = ServiceConfig(protocol="gemini", url=server.url + "/v1beta/models/x", model="x", api_key_env="TEST_MODEL_KEY")
    with pytest.raises(ConfigError, match=":embedContent"):
        RemoteEmbedder(client, svc, ENV)


# --- keys -------------------------------------------------------------------------------


def test_a_missing_key_variable_is_named_and_nothing_is_sent(server: Mirror, client: HttpClient) -> None:
    with pytest.raises(ConfigError) as info:
        RemoteEmbedder(client, compat_embed(server), {})
    assert "TEST_MODEL_KEY" in info.value.message and "\n" not in info.value.message
    assert server.seen() == []


def test_a_remote_host_needs_an_api_key_variable(client: HttpClient) -> None:
    svc = ServiceConfig(protocol="compatible", url="https://api.example.invalid/v1/embeddings", model="m")
    with pytest.raises(ConfigError, match="api_key_env"):
        RemoteEmbedder(client, svc, {})


def test_the_key_never_appears_in_errors_even_when_the_service_echoes_it(server: Mirror, client: HttpClient) -> None:
    server.add(C_EMBED, Scripted.json(400, {"error": {"message": f"invalid api key {KEY} for model"}}))
    server.add(C_CHAT, Scripted.json(401, {"error": {"message": f"bad key {KEY}"}}))
    emb = RemoteEmbedder(client, compat_embed(server), ENV)
    gen = Generator(client, ServiceConfig("compatible", server.url + C_CHAT, "m", "TEST_MODEL_KEY"), ENV)
    errors: list[MemoriesError] = []
    for call in (lambda: emb.embed_queries(["q"]), lambda: gen.generate("s", "u")):
        with pytest.raises(HttpError) as info:
            call()
        errors.append(info.value)
    assert errors[0].code == "http_error" and errors[1].code == "auth_failed"
    for err in errors:
        assert KEY not in str(err) and KEY not in json.dumps(err.to_dict()) and "9f8e7d6c5b4a" not in str(err)


# --- HTTP behaviour through the shared client -------------------------------------------


def test_401_is_not_retried(server: Mirror, client: HttpClient) -> None:
    server.add(G_EMBED, Scripted.json(401, {"error": {"message": "API key not valid"}}))
    emb = RemoteEmbedder(client, gemini_embed(server), ENV)
    with pytest.raises(AuthFailed):
        emb.embed_queries(["q"])
    assert len(server.seen(G_EMBED)) == 1


def test_429_with_retry_after_is_retried_after_the_wait(server: Mirror, client: HttpClient) -> None:
    server.add(
        C_EMBED,
        Scripted.json(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "1"}),
        Scripted.json(200, compat_data([[1.0, 0.0]])),
    )
    emb = RemoteEmbedder(client, compat_embed(server), ENV)
    t0 = time.monotonic()
    mat = emb.embed_queries(["q"])
    assert time.monotonic() - t0 >= 0.9
    assert mat.shape == (1, 2) and len(server.seen(C_EMBED)) == 2


def test_503_then_success_answers(server: Mirror, client: HttpClient) -> None:
    server.add(G_GEN, Scripted(status=503, body=b"overloaded"), Scripted.json(200, gemini_answer({"text": "ok"})))
    gen = Generator(client, ServiceConfig("gemini", server.url + G_GEN, "gemini-2.5-flash", "TEST_MODEL_KEY"), ENV)
    assert gen.generate("sys", "user") == "ok"
    assert len(server.seen(G_GEN)) == 2


def test_a_redirect_is_refused_and_not_followed(server: Mirror, client: HttpClient) -> None:
    server.add(C_EMBED, Scripted(status=302, headers={"Location": server.url + "/elsewhere"}, body=b""))
    emb = RemoteEmbedder(client, compat_embed(server), ENV)
    with pytest.raises(RedirectRefused):
        emb.embed_queries(["q"])
    assert [s.path for s in server.seen()] == [C_EMBED]


def test_a_slow_service_times_out(server: Mirror) -> None:
    held = threading.Event()  # the answer comes only after the client gave up on it
    server.add(C_CHAT, Scripted.json(200, chat("late"), hold=held))
    try:
        with HttpClient(HttpConfig(retries=0, timeout_seconds=0.3)) as quick:
            gen = Generator(quick, ServiceConfig("compatible", server.url + C_CHAT, "m"), {})
            with pytest.raises(HttpTimeout):
                gen.generate("s", "u")
            assert not held.is_set()
    finally:
        held.set()


def test_before_attempt_runs_before_each_attempt_and_can_stop_retries(server: Mirror, client: HttpClient) -> None:
    server.add(C_EMBED, Scripted(status=503, body=b""), Scripted(status=503, body=b""), Scripted(status=503, body=b""))
    calls: list[int] = []

    def gate() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise GenerationNotConfigured("stopped")  # any MemoriesError: lock/cancel in the daemon

    emb = RemoteEmbedder(client, compat_embed(server), ENV)
    with pytest.raises(GenerationNotConfigured):
        emb.embed_queries(["q"], before_attempt=gate)
    assert len(calls) == 2 and len(server.seen(C_EMBED)) == 1


# --- generation -------------------------------------------------------------------------


def test_gemini_generation_request_and_answer_text(server: Mirror, client: HttpClient) -> None:
    server.add(G_GEN, Scripted.json(200, gemini_answer({"text": "thinking...", "thought": True}, {"text": '{"a":'}, {"text": " 1}"})))
    gen = Generator(client, ServiceConfig("gemini", server.url + G_GEN, "gemini-2.5-flash", "TEST_MODEL_KEY"), ENV)
    assert gen.generate("SYSTEM", "USER") == '{"a": 1}'
    (seen,) = server.seen(G_GEN)
    assert seen.headers["x-goog-api-key"] == KEY
    assert body(seen) == {
        "contents": [{"role": "user", "parts": [{"text": "USER"}]}],
        "systemInstruction": {"parts": [{"text": "SYSTEM"}]},
        "generationConfig": {"responseMimeType": "application/json"},
    }


def test_compatible_generation_request_and_answer_text(server: Mirror, client: HttpClient) -> None:
    server.add(C_CHAT, Scripted.json(200, chat("<think>hmm</think>\n{\"x\": 1}")))
    gen = Generator(client, ServiceConfig("compatible", server.url + C_CHAT, "llama3", "TEST_MODEL_KEY"), ENV)
    assert gen.generate("SYSTEM", "USER") == '{"x": 1}'
    (seen,) = server.seen(C_CHAT)
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert body(seen) == {
        "model": "llama3",
        "messages": [{"role": "system", "content": "SYSTEM"}, {"role": "user", "content": "USER"}],
    }


@pytest.mark.parametrize(
    ("path", "proto", "answer", "fragment"),
    [
        (C_CHAT, "compatible", chat("{\"answer\": \"cut", finish="length"), "length limit"),
        (C_CHAT, "compatible", chat(None), "without message text"),
        (C_CHAT, "compatible", {"id": "x"}, 'without "choices"'),
        (C_CHAT, "compatible", chat("   "), "empty answer"),
        (G_GEN, "gemini", {"promptFeedback": {"blockReason": "SAFETY"}}, "blocked: SAFETY"),
        (G_GEN, "gemini", gemini_answer({"text": "x"}, finish="RECITATION"), "finish reason RECITATION"),
        (G_GEN, "gemini", gemini_answer({"text": "x"}, finish="MAX_TOKENS"), "length limit"),
    ],
)
def test_unusable_generation_answers_are_reported(
    server: Mirror, client: HttpClient, path: str, proto: str, answer: dict, fragment: str
) -> None:
    server.add(path, Scripted.json(200, answer))
    gen = Generator(client, ServiceConfig(proto, server.url + path, "m"), {})
    with pytest.raises(InvalidModelOutput, match=fragment):
        gen.generate("s", "u")


def test_generation_needs_a_configured_service(client: HttpClient) -> None:
    with pytest.raises(GenerationNotConfigured):
        Generator(client, ServiceConfig(), {})


def test_grounded_answer_end_to_end_accepts_valid_and_refuses_invented_citations(
    server: Mirror, client: HttpClient
) -> None:
    good = json.dumps({"answer": "The backup key is in the safe [S2].", "citations": ["S2"]})
    bad = json.dumps({"answer": "It is in the car [S7].", "citations": ["S7"]})
    server.add(C_CHAT, Scripted.json(200, chat(good)), Scripted.json(200, chat(bad)))
    gen = Generator(client, ServiceConfig("compatible", server.url + C_CHAT, "m"), {})
    sources = [("Car", "The car is blue."), ("Safe", "The backup key is kept in the safe.")]
    got = grounded_answer(gen, "Where is the backup key?", sources)
    assert got.parsed.citations == ["S2"] and got.cited_indices() == [1]
    sent = body(server.seen(C_CHAT)[0])["messages"][1]["content"]
    assert '<source id="S2" title="Safe">' in sent and "Where is the backup key?" in sent
    with pytest.raises(InvalidModelOutput, match="cited S7, which was not among the 2 sources sent"):
        grounded_answer(gen, "Where is the backup key?", sources)


# --- device-only ------------------------------------------------------------------------


def test_device_only_refuses_a_remote_generation_endpoint_before_any_connection() -> None:
    # Every connection (and, with socks5h, every name lookup) would go through this proxy.
    with Socks5Proxy() as proxy:
        cfg = HttpConfig(proxy_url=proxy.url("socks5h"), use_env_proxy=False, retries=0, timeout_seconds=2.0)
        with HttpClient(cfg) as remote_client:
            svc = ServiceConfig("compatible", "https://generation.example.invalid/v1/chat/completions", "m", "TEST_MODEL_KEY")
            gen = Generator(remote_client, svc, ENV)
            with pytest.raises(DeviceOnly) as info:
                check_device_policy(True, gen.url, "generation")
            assert info.value.code == "device_only"
            assert "generation.example.invalid" in info.value.message and KEY not in info.value.message
            assert proxy.requests == []
            # Sanity: the same client really would have used that proxy for this endpoint.
            with pytest.raises(HttpError):
                gen.generate("s", "u")
            assert [r["host"] for r in proxy.requests] == ["generation.example.invalid"]


def test_device_only_allows_a_loopback_embedding_service(server: Mirror, client: HttpClient) -> None:
    server.add(C_EMBED, Scripted.json(200, compat_data([[1.0, 0.0]])))
    emb = RemoteEmbedder(client, compat_embed(server), ENV)
    check_device_policy(True, emb.url, "embedding")
    assert emb.embed_queries(["q"]).shape == (1, 2)
