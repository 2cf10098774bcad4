"""The one HTTP client: retries, refusals, secrets, TLS and proxies, against real loopback servers."""

from __future__ import annotations

import email.utils
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from memoriesd.config import HttpConfig
from memoriesd.errors import (
    AuthFailed,
    Cancelled,
    ConfigError,
    HttpError,
    HttpTimeout,
    InvalidModelOutput,
    RedirectRefused,
    UrlRefused,
)
from memoriesd.net.http_client import HttpClient, error_excerpt, retry_delay
from memoriesd.net.proxy import no_proxy_matches
from tests.servers import ConnectProxy, LoopbackCA, Mirror, Scripted, Socks5Proxy, make_test_ca

KEY = "sk-test-0123456789abcdefSECRET"
FAST = HttpConfig(retries=2, backoff_ms=10, connect_timeout_seconds=2, timeout_seconds=5)
REMOTE = "https://models.example.invalid/x"
PROXY_VARS = ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"]


@pytest.fixture(autouse=True)
def clean_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def mirror() -> Iterator[Mirror]:
    with Mirror() as m:
        yield m


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> LoopbackCA:
    return make_test_ca(tmp_path_factory.mktemp("ca"))


def _client(**kw: object) -> HttpClient:
    fields = {**FAST.__dict__, **kw}
    return HttpClient(HttpConfig(**fields))  # type: ignore[arg-type]


# -- retry_delay ------------------------------------------------------------


def test_retry_delay_grows_exponentially_from_backoff() -> None:
    cfg = HttpConfig(backoff_ms=500)
    assert [retry_delay(a, cfg, None) for a in range(4)] == [0.5, 1.0, 2.0, 4.0]


def test_retry_delay_honours_retry_after_seconds_and_caps_at_30() -> None:
    cfg = HttpConfig(backoff_ms=100)
    assert retry_delay(0, cfg, "3") == 3.0
    assert retry_delay(0, cfg, "3600") == 30.0
    assert retry_delay(10, HttpConfig(backoff_ms=60000), None) == 30.0
    assert retry_delay(2, cfg, "0") == 0.4  # asking for less than the backoff does not shorten it


def test_retry_delay_understands_http_dates_and_ignores_garbage() -> None:
    cfg = HttpConfig(backoff_ms=100)
    now = 1_700_000_000.0
    assert retry_delay(0, cfg, email.utils.formatdate(now + 7, usegmt=True), now=now) == pytest.approx(7.0)
    assert retry_delay(0, cfg, email.utils.formatdate(now + 900, usegmt=True), now=now) == 30.0
    assert retry_delay(0, cfg, email.utils.formatdate(now - 50, usegmt=True), now=now) == 0.1
    assert retry_delay(0, cfg, "soon", now=now) == 0.1
    assert retry_delay(0, cfg, "-5", now=now) == 0.1


# -- post_json ----------------------------------------------------------------


def test_post_json_sends_json_and_returns_decoded_answer(mirror: Mirror) -> None:
    mirror.add("/v1/embed", Scripted.json(200, {"data": [1, 2]}))
    with _client() as http:
        out = http.post_json(mirror.url + "/v1/embed", {"input": "x"}, headers={"Authorization": f"Bearer {KEY}"},
                             purpose="embedding")
    assert out == {"data": [1, 2]}
    (seen,) = mirror.seen("/v1/embed")
    assert seen.method == "POST" and seen.body == b'{"input": "x"}'
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.headers["content-type"] == "application/json"


def test_401_is_auth_failed_after_exactly_one_request(mirror: Mirror) -> None:
    mirror.add("/v1/x", Scripted.json(401, {"error": {"message": f"invalid key {KEY}"}}), Scripted.json(200, {}))
    with _client(retries=5) as http, pytest.raises(AuthFailed) as info:
        http.post_json(mirror.url + "/v1/x", {}, headers={"x-api-key": KEY}, purpose="generation")
    assert len(mirror.seen("/v1/x")) == 1
    assert KEY not in info.value.message and "api_key_env" in info.value.message


def test_403_is_auth_failed_without_retry(mirror: Mirror) -> None:
    mirror.add("/v1/x", Scripted(status=403), Scripted.json(200, {}))
    with _client() as http, pytest.raises(AuthFailed):
        http.post_json(mirror.url + "/v1/x", {}, purpose="generation")
    assert len(mirror.seen("/v1/x")) == 1


def test_429_and_503_are_retried_until_success(mirror: Mirror) -> None:
    mirror.add("/v1/x", Scripted(status=429, headers={"Retry-After": "0"}), Scripted(status=503),
               Scripted.json(200, {"ok": True}))
    calls: list[int] = []
    with _client(retries=2) as http:
        out = http.post_json(mirror.url + "/v1/x", {}, purpose="generation", before_attempt=lambda: calls.append(1))
    assert out == {"ok": True}
    assert len(mirror.seen("/v1/x")) == 3 and len(calls) == 3


def test_503_after_all_retries_is_http_error(mirror: Mirror) -> None:
    mirror.add("/v1/x", *[Scripted(status=503)] * 5)
    with _client(retries=2) as http, pytest.raises(HttpError) as info:
        http.post_json(mirror.url + "/v1/x", {}, purpose="generation")
    assert type(info.value) is HttpError and "HTTP 503" in info.value.message and "3 attempts" in info.value.message
    assert len(mirror.seen("/v1/x")) == 3


def test_before_attempt_can_cancel_between_retries(mirror: Mirror) -> None:
    mirror.add("/v1/x", *[Scripted(status=503)] * 5)
    calls: list[int] = []

    def before() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise Cancelled("cancelled by the user")

    with _client(retries=4) as http, pytest.raises(Cancelled):
        http.post_json(mirror.url + "/v1/x", {}, purpose="generation", before_attempt=before)
    assert len(mirror.seen("/v1/x")) == 1


def test_400_is_http_error_with_sanitized_excerpt_and_no_key(mirror: Mirror) -> None:
    message = f"model 'nope' not found\n\tfor key {KEY} " + "x" * 500
    mirror.add("/v1/x", Scripted.json(400, {"error": {"message": message}}))
    with _client() as http, pytest.raises(HttpError) as info:
        http.post_json(mirror.url + "/v1/x", {}, headers={"Authorization": f"Bearer {KEY}"}, purpose="generation")
    msg = info.value.message
    assert "HTTP 400" in msg and "model 'nope' not found for key [redacted]" in msg
    assert KEY not in msg and "\n" not in msg and len(msg) < 400
    assert len(mirror.seen("/v1/x")) == 1


def test_redirect_is_refused_and_not_followed(mirror: Mirror) -> None:
    mirror.add("/v1/x", Scripted(status=302, headers={"Location": mirror.url + "/elsewhere"}))
    with _client() as http, pytest.raises(RedirectRefused) as info:
        http.post_json(mirror.url + "/v1/x", {}, purpose="generation")
    assert "/v1/x" in info.value.message and "HTTP 302" in info.value.message
    assert mirror.seen("/elsewhere") == []


def test_slow_response_is_http_timeout(mirror: Mirror) -> None:
    held = threading.Event()  # the answer comes only after the client gave up on it
    mirror.add("/v1/x", Scripted.json(200, {}, hold=held))
    try:
        with _client(retries=0) as http, pytest.raises(HttpTimeout) as info:
            http.post_json(mirror.url + "/v1/x", {}, headers={"x-goog-api-key": KEY}, purpose="generation", timeout=0.3)
        assert not held.is_set()  # it gave up on its own, with the answer still held
    finally:
        held.set()
    assert KEY not in info.value.message and "timeout_seconds" in info.value.message


def test_non_json_answer_is_invalid_model_output(mirror: Mirror) -> None:
    mirror.add("/v1/x", Scripted(status=200, headers={"Content-Type": "text/html"}, body=b"<html>login</html>"))
    with _client() as http, pytest.raises(InvalidModelOutput):
        http.post_json(mirror.url + "/v1/x", {}, purpose="generation")


def test_refused_url_never_connects(mirror: Mirror) -> None:
    with _client() as http, pytest.raises(UrlRefused):
        http.post_json(f"http://localhost.:{mirror.port}/v1/x", {}, purpose="generation")
    assert mirror.seen() == []


def test_connection_refused_is_retried_then_http_error() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    calls: list[int] = []
    with _client(retries=2) as http, pytest.raises(HttpError) as info:
        http.post_json(f"http://127.0.0.1:{port}/v1", {}, purpose="rerank", before_attempt=lambda: calls.append(1))
    assert len(calls) == 3 and "cannot reach the rerank service at 127.0.0.1" in info.value.message


def test_key_never_appears_in_errors_or_logs(mirror: Mirror, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="memoriesd.net")
    mirror.add("/v1/x", Scripted(status=500, body=KEY.encode()), Scripted(status=418, body=f'"{KEY}"'.encode()))
    with _client(retries=1) as http, pytest.raises(HttpError) as info:
        http.post_json(mirror.url + "/v1/x", {"q": "private note text"}, headers={"Authorization": f"Bearer {KEY}"},
                       purpose="generation")
    assert KEY not in str(info.value) and "private note text" not in str(info.value)
    net_logs = [r.getMessage() for r in caplog.records if r.name == "memoriesd.net"]
    assert net_logs and all(KEY not in line and "/v1/x" not in line for line in net_logs)
    assert any("POST 127.0.0.1 -> 500" in line for line in net_logs)


def test_error_excerpt_is_one_short_printable_line() -> None:
    body = ('{"error": {"message": "bad\\u0000 value\\n\\n' + "y" * 400 + '"}}').encode()
    out = error_excerpt(body, [])
    assert out.startswith("bad value y") and out.endswith("...") and len(out) <= 160
    assert error_excerpt(b"plain text error", []) == "plain text error"


# -- TLS ---------------------------------------------------------------------


def test_ca_bundle_is_added_to_the_trust_store(test_ca: LoopbackCA) -> None:
    with Mirror(tls=test_ca.server_context()) as m:
        m.add("/v1/x", Scripted.json(200, {"tls": True}))
        with _client(ca_bundle=str(test_ca.ca_file)) as http:
            assert http.post_json(m.url + "/v1/x", {}, purpose="generation") == {"tls": True}


def test_unknown_certificate_is_refused_without_retry(test_ca: LoopbackCA) -> None:
    with Mirror(tls=test_ca.server_context()) as m:
        calls: list[int] = []
        with _client(retries=3) as http, pytest.raises(HttpError) as info:
            http.post_json(m.url + "/v1/x", {}, purpose="generation", before_attempt=lambda: calls.append(1))
        assert "ca_bundle" in info.value.message and len(calls) == 1
        assert m.seen() == []


def test_unreadable_ca_bundle_is_a_config_error(tmp_path: Path, mirror: Mirror) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with _client(ca_bundle=str(bad)) as http, pytest.raises(ConfigError, match="ca_bundle"):
        http.post_json(mirror.url + "/v1/x", {}, purpose="generation")


# -- proxies -------------------------------------------------------------------


def _fails(http: HttpClient, url: str = REMOTE) -> HttpError:
    with pytest.raises(HttpError) as info:
        http.post_json(url, {}, headers={"Authorization": f"Bearer {KEY}"}, purpose="embedding")
    assert KEY not in info.value.message
    return info.value


def test_explicit_http_proxy_sees_connect_for_remote_host() -> None:
    with ConnectProxy() as proxy, _client(retries=0, proxy_url=proxy.url) as http:
        _fails(http)
        assert proxy.lines == ["CONNECT models.example.invalid:443 HTTP/1.1"]


@pytest.mark.parametrize("scheme", ["socks5", "socks5h"])
def test_explicit_socks_proxy_sees_remote_host(scheme: str) -> None:
    with Socks5Proxy() as proxy, _client(retries=0, proxy_url=proxy.url(scheme)) as http:
        _fails(http)
        (req,) = proxy.requests
        assert (req["cmd"], req["host"], req["port"]) == (1, "models.example.invalid", 443)


def test_env_https_proxy_is_used_when_use_env_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    with ConnectProxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        with _client(retries=0) as http:
            _fails(http)
        assert proxy.lines == ["CONNECT models.example.invalid:443 HTTP/1.1"]


def test_env_all_proxy_socks_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    with Socks5Proxy() as proxy:
        monkeypatch.setenv("ALL_PROXY", proxy.url("socks5h"))
        with _client(retries=0) as http:
            _fails(http)
        assert [r["host"] for r in proxy.requests] == ["models.example.invalid"]


def test_env_proxy_ignored_when_use_env_proxy_false(monkeypatch: pytest.MonkeyPatch) -> None:
    with ConnectProxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        with _client(retries=0, use_env_proxy=False) as http:
            _fails(http)
        assert proxy.lines == []


def test_no_proxy_excludes_matching_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    with ConnectProxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "other.test,.example.invalid")
        with _client(retries=0) as http:
            _fails(http)
        assert proxy.lines == []


def test_explicit_proxy_overrides_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with ConnectProxy() as env_proxy, Socks5Proxy() as cfg_proxy:
        monkeypatch.setenv("HTTPS_PROXY", env_proxy.url)
        with _client(retries=0, proxy_url=cfg_proxy.url()) as http:
            _fails(http)
        assert env_proxy.lines == [] and len(cfg_proxy.requests) == 1


def test_loopback_endpoint_bypasses_every_proxy(monkeypatch: pytest.MonkeyPatch, mirror: Mirror) -> None:
    mirror.add("/v1/x", Scripted.json(200, {"direct": 1}), Scripted.json(200, {"direct": 2}))
    with ConnectProxy() as env_proxy, Socks5Proxy() as cfg_proxy:
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
            monkeypatch.setenv(name, env_proxy.url)
        with _client(proxy_url=cfg_proxy.url()) as http:
            assert http.post_json(mirror.url + "/v1/x", {}, purpose="generation") == {"direct": 1}
        with _client() as http:
            assert http.post_json(f"http://localhost:{mirror.port}/v1/x", {}, purpose="generation") == {"direct": 2}
        assert env_proxy.lines == [] and cfg_proxy.requests == []


def test_no_proxy_matching_follows_curl_rules() -> None:
    assert no_proxy_matches("api.example.com", "example.com")
    assert no_proxy_matches("api.example.com", ".example.com")
    assert no_proxy_matches("example.com", ".example.com")
    assert not no_proxy_matches("badexample.com", "example.com")
    assert no_proxy_matches("10.1.2.3", "10.0.0.0/8")
    assert no_proxy_matches("::1", "[::1]")
    assert no_proxy_matches("anything.test", "a.test, *")
    assert not no_proxy_matches("api.example.com", "")


def test_malformed_header_value_never_leaks_the_key(mirror: Mirror) -> None:
    bad_key = KEY + "\u00e9"
    with _client() as http, pytest.raises(HttpError) as info:
        http.post_json(mirror.url + "/v1/x", {}, headers={"x-api-key": bad_key}, purpose="generation")
    assert KEY not in str(info.value) and info.value.__cause__ is None and info.value.__suppress_context__
    assert mirror.seen() == []
