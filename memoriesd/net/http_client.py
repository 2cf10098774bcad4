"""The one HTTP client of Memories.

Every outbound request (remote model services, model downloads) goes through
:class:`HttpClient`, configured by :class:`~memoriesd.config.HttpConfig`:

* the URL rule (:func:`~memoriesd.urls.check_url`) before any connection;
* TLS verification always on, against the system store plus certifi, plus the
  configured ``ca_bundle`` (added, never replacing);
* proxies per :mod:`memoriesd.net.proxy` (loopback always direct);
* redirects are never followed here (downloads follow them themselves, under
  their own rule);
* retries of connection failures, timeouts, 429 and 500/502/503/504 with
  exponential backoff and ``Retry-After`` (capped at 30 s); 401/403 and other
  4xx are never retried.

Header values (API keys) never appear in an exception message or a log line:
logs carry method, host and status only.
"""

from __future__ import annotations

import email.utils
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import certifi
import httpx

from .. import __version__
from ..config import HttpConfig
from ..errors import AuthFailed, ConfigError, HttpError, HttpTimeout, InvalidModelOutput, RedirectRefused
from ..urls import ParsedUrl, parse_url
from .proxy import proxy_for, proxy_label

log = logging.getLogger("memoriesd.net")

USER_AGENT = f"memories/{__version__}"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER_SECONDS = 30.0
MAX_JSON_BYTES = 64 * 1024 * 1024
_EXCERPT_CHARS = 160


def retry_delay(attempt: int, cfg: HttpConfig, retry_after: str | None, *, now: float | None = None) -> float:
    """Seconds to wait before retry number ``attempt + 1`` (``attempt`` counts from 0).

    Exponential backoff ``backoff_ms * 2**attempt``; a valid ``Retry-After``
    (integer seconds or an HTTP date) raises the wait to what the service asked.
    Everything is capped at 30 s. ``now`` (epoch seconds) is for HTTP dates in tests.
    """
    delay = (cfg.backoff_ms / 1000.0) * (2 ** max(0, attempt))
    asked = parse_retry_after(retry_after, now=now)
    if asked is not None:
        delay = max(delay, asked)
    return min(delay, MAX_RETRY_AFTER_SECONDS)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header value, or None when absent or invalid."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if value.isdigit():
        return float(int(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    ref = time.time() if now is None else now
    return max(0.0, when.timestamp() - ref)


def build_ssl_context(cfg: HttpConfig) -> ssl.SSLContext:
    """Verification always on: system store + certifi + ``cfg.ca_bundle``."""
    ctx = ssl.create_default_context(cafile=certifi.where())
    ctx.load_default_certs()
    if cfg.ca_bundle:
        try:
            ctx.load_verify_locations(cafile=cfg.ca_bundle)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"config key http.ca_bundle = {cfg.ca_bundle!r} cannot be used as a CA file: "
                "point it at a readable PEM file of CA certificates"
            ) from exc
    return ctx


def make_httpx_client(cfg: HttpConfig, proxy: str | None, ssl_context: ssl.SSLContext) -> httpx.Client:
    """The single place an ``httpx.Client`` is built."""
    return httpx.Client(
        verify=ssl_context,
        trust_env=False,
        proxy=proxy,
        follow_redirects=False,
        timeout=httpx.Timeout(cfg.timeout_seconds, connect=cfg.connect_timeout_seconds),
        headers={"User-Agent": USER_AGENT},
    )


def _redact(text: str, secrets: list[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "[redacted]")
    return text


def _secrets_of(headers: Mapping[str, str] | None) -> list[str]:
    """Every header value and its space-separated parts ("Bearer <key>") that could be a secret."""
    out: set[str] = set()
    for value in (headers or {}).values():
        for piece in [value, *value.split()]:
            if len(piece) >= 4:
                out.add(piece)
    return sorted(out, key=len, reverse=True)


def error_excerpt(body: bytes, secrets: list[str]) -> str:
    """A short, one-line, printable excerpt of a service's error message, secrets redacted."""
    text = body[:8192].decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, list) and data:
        data = data[0]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            err = err.get("message") or err.get("detail") or err.get("type") or ""
        if not isinstance(err, str) or not err:
            err = data.get("message") or data.get("detail") or data.get("error_description") or ""
        text = err if isinstance(err, str) else json.dumps(err)[:_EXCERPT_CHARS]
    text = _redact(text, secrets)
    text = "".join(c if c.isprintable() else " " for c in text)
    text = " ".join(text.split())
    if len(text) > _EXCERPT_CHARS:
        text = text[: _EXCERPT_CHARS - 3] + "..."
    return text


def describe_transport_error(exc: httpx.TransportError) -> tuple[str, bool]:
    """(safe reason, retryable) for a transport failure. Never includes the exception text."""
    if isinstance(exc, httpx.ConnectTimeout):
        return "could not connect in time", True
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time", True
    if isinstance(exc, httpx.ProxyError):
        return "the proxy refused or failed the connection", True
    if isinstance(exc, httpx.ConnectError):
        if "CERTIFICATE_VERIFY_FAILED" in str(exc) or "certificate verify failed" in str(exc):
            return (
                "its TLS certificate could not be verified; if a TLS-inspecting proxy is in use, "
                "set http.ca_bundle to its CA file",
                False,
            )
        if "SSL" in str(exc):
            return "the TLS handshake failed", False
        return "the connection failed", True
    if isinstance(exc, httpx.RemoteProtocolError):
        return "the server closed the connection or sent an invalid response", True
    if isinstance(exc, (httpx.ReadError, httpx.WriteError, httpx.NetworkError)):
        return "the connection dropped", True
    return "the request failed", False


class HttpClient:
    """Thread-safe; one per daemon. Builds an httpx client per proxy lazily."""

    def __init__(self, cfg: HttpConfig) -> None:
        self.cfg = cfg
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None
        self._clients: dict[str | None, httpx.Client] = {}
        self._closed = False

    # -- plumbing --------------------------------------------------------

    def client_for(self, url: ParsedUrl) -> tuple[httpx.Client, str | None]:
        """The httpx client (direct or through the proxy) for ``url``, and that proxy."""
        proxy = proxy_for(url, self.cfg)
        with self._lock:
            if self._closed:
                raise HttpError("the HTTP client was closed: restart the daemon")
            if self._ssl is None:
                self._ssl = build_ssl_context(self.cfg)
            client = self._clients.get(proxy)
            if client is None:
                try:
                    client = make_httpx_client(self.cfg, proxy, self._ssl)
                except ValueError as exc:
                    raise ConfigError(
                        f"the proxy {proxy_label(proxy)} cannot be used: allowed schemes are http, https, "
                        "socks5 and socks5h"
                    ) from exc
                self._clients[proxy] = client
        return client, proxy

    def timeout(self, seconds: float | None = None, *, budget: float | None = None) -> httpx.Timeout:
        """Read/write timeout ``seconds`` (default ``timeout_seconds``), all capped by ``budget``."""
        read = self.cfg.timeout_seconds if seconds is None else seconds
        connect = self.cfg.connect_timeout_seconds
        if budget is not None:
            read, connect = min(read, budget), min(connect, budget)
        return httpx.Timeout(read, connect=connect)

    @contextmanager
    def stream(
        self,
        method: str,
        url: str,
        *,
        purpose: str,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
        timeout: httpx.Timeout | None = None,
        allow_query: bool = False,
    ) -> Iterator[httpx.Response]:
        """One request, no retries, no redirects: the response with its body unread.

        The URL rule is applied first. Transport errors propagate as httpx
        exceptions (callers decide about retries; see :func:`describe_transport_error`).
        """
        parsed = parse_url(url, purpose=purpose, allow_query=allow_query)
        client, proxy = self.client_for(parsed)
        try:
            request = client.build_request(
                method, url, headers=dict(headers or {}), content=content, timeout=timeout or self.timeout()
            )
        except (UnicodeError, ValueError, TypeError):
            # The exception would carry the header value (an API key): never let it out.
            raise HttpError(
                f"a request header for the {purpose} service is not valid (non-ASCII or malformed): check the "
                "API key in the environment variable named by api_key_env"
            ) from None
        response = client.send(request, stream=True)
        try:
            log.debug("%s %s -> %d (%s)", method, parsed.host, response.status_code, proxy_label(proxy))
            yield response
        finally:
            response.close()

    # -- JSON services ---------------------------------------------------

    def post_json(
        self,
        url: str,
        payload: object,
        *,
        headers: Mapping[str, str] | None = None,
        purpose: str,
        before_attempt: Callable[[], None] | None = None,
        timeout: float | None = None,
    ) -> object:
        """POST ``payload`` as JSON and return the decoded JSON answer (see the module doc)."""
        parsed = parse_url(url, purpose=purpose)
        host = parsed.host
        secrets = _secrets_of(headers)
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        send_headers = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}
        attempts = 1 + self.cfg.retries
        last: HttpError | None = None
        retry_after: str | None = None
        for attempt in range(attempts):
            if attempt:
                delay = retry_delay(attempt - 1, self.cfg, retry_after)
                log.info("POST %s retry %d/%d in %.2fs", host, attempt, attempts - 1, delay)
                time.sleep(delay)
            if before_attempt is not None:
                before_attempt()
            try:
                with self.stream(
                    "POST", url, purpose=purpose, headers=send_headers, content=body, timeout=self.timeout(timeout)
                ) as resp:
                    status = resp.status_code
                    log.log(
                        logging.DEBUG if 200 <= status < 300 else logging.INFO,
                        "POST %s -> %d (attempt %d/%d)", host, status, attempt + 1, attempts,
                    )
                    data = self._read_limited(resp, purpose, host)
            except httpx.TransportError as exc:
                retry_after = None
                log.info("POST %s -> %s (attempt %d/%d)", host, type(exc).__name__, attempt + 1, attempts)
                last, retryable = _transport_error(exc, purpose, host, attempt + 1)
                if not retryable:
                    raise last from None
                continue
            refused = _status_error(status, data, purpose, parsed, secrets, attempt + 1)
            if refused is not None:  # a status worth retrying (the others raise)
                last, retry_after = refused, resp.headers.get("Retry-After")
                continue
            return _decode_json(data, purpose, host, status)
        assert last is not None
        raise last

    @staticmethod
    def _read_limited(resp: httpx.Response, purpose: str, host: str) -> bytes:
        chunks: list[bytes] = []
        total = 0
        for chunk in resp.iter_bytes():
            total += len(chunk)
            if total > MAX_JSON_BYTES:
                raise InvalidModelOutput(
                    f"the {purpose} service at {host} returned more than {MAX_JSON_BYTES >> 20} MiB: "
                    "check that the URL is the service's API endpoint"
                )
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _attempts(n: int) -> str:
    return "1 attempt" if n == 1 else f"{n} attempts"


def _transport_error(exc: httpx.TransportError, purpose: str, host: str, attempts: int) -> tuple[HttpError, bool]:
    """The error a failed connection or exchange is reported as, and whether another attempt may help."""
    reason, retryable = describe_transport_error(exc)
    if isinstance(exc, httpx.TimeoutException):
        which = "connect_timeout_seconds" if isinstance(exc, httpx.ConnectTimeout) else "timeout_seconds"
        return HttpTimeout(
            f"the {purpose} service at {host} gave {reason} ({_attempts(attempts)}): "
            f"try again later, or raise http.{which}"
        ), retryable
    return HttpError(
        f"cannot reach the {purpose} service at {host}: {reason} ({_attempts(attempts)}); "
        "check the URL, the network and the proxy settings"
    ), retryable


def _status_error(
    status: int, data: bytes, purpose: str, parsed: ParsedUrl, secrets: list[str], attempts: int
) -> HttpError | None:
    """None for a 2xx answer; the error for a status worth retrying; raises for the others."""
    host = parsed.host
    if 300 <= status < 400:
        raise RedirectRefused(
            f"the {purpose} URL {parsed.shown} answered with a redirect (HTTP {status}), which is not "
            "followed: configure the final URL of the service"
        )
    if status in (401, 403):
        raise AuthFailed(
            f"the {purpose} service at {host} refused the credentials (HTTP {status}): check the API key "
            "in the environment variable named by api_key_env and its permissions"
        )
    if status in RETRY_STATUSES:
        return HttpError(
            f"the {purpose} service at {host} failed with HTTP {status} ({_attempts(attempts)}): try again later"
        )
    if status >= 400:
        excerpt = error_excerpt(data, secrets)
        detail = f": {excerpt}" if excerpt else ""
        what = "rejected the request" if status < 500 else "failed"
        raise HttpError(
            f"the {purpose} service at {host} {what} (HTTP {status}{detail}); check the model name "
            "and the request settings"
        )
    if status < 200 or status >= 300:
        raise InvalidModelOutput(f"the {purpose} service at {host} answered HTTP {status}, not a result")
    return None


def _decode_json(data: bytes, purpose: str, host: str, status: int) -> object:
    try:
        return json.loads(data)
    except ValueError:
        raise InvalidModelOutput(
            f"the {purpose} service at {host} returned a response that is not JSON (HTTP {status}): "
            "check that the URL is the service's API endpoint"
        ) from None
