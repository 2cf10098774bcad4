"""The URL rule: one table of URLs that must pass and URLs that must be refused."""

from __future__ import annotations

import pytest

from memoriesd.errors import UrlRefused
from memoriesd.urls import check_url, display_url, host_of, is_loopback_url

ALLOWED = [
    # (url, loopback)
    ("https://api.example.com/v1/embeddings", False),
    ("https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent", False),
    ("HTTPS://API.EXAMPLE.COM/v1", False),
    ("https://example.com", False),
    ("https://example.com:8443/v1", False),
    ("https://10.0.0.1/v1", False),  # private address over TLS is fine
    ("https://169.254.169.254/latest", False),  # TLS, so not the metadata trick
    ("https://[2001:db8::1]:443/v1", False),
    ("https://localhost.evil.com/v1", False),
    ("https://xn--bcher-kva.example/v1", False),
    ("http://127.0.0.1:11434/v1/chat/completions", True),
    ("http://127.0.0.1/", True),
    ("http://127.1.2.3:8080/x", True),
    ("http://127.255.255.254/x", True),
    ("http://localhost:8080/v1", True),
    ("http://LOCALHOST:8080/v1", True),
    ("http://[::1]:8080/v1", True),
    ("http://[0:0:0:0:0:0:0:1]/v1", True),
    ("http://[::ffff:127.0.0.1]:8080/v1", True),
    ("http://[::ffff:7f00:1]/v1", True),
    ("https://127.0.0.1:8443/x", True),
    ("http://localhost", True),
]

REFUSED = [
    # (url, words the message must contain)
    ("http://example.com/v1", "http:// only for a loopback"),
    ("http://api.example.com:80/v1", "loopback"),
    ("http://10.0.0.1/v1", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "loopback"),
    ("http://0.0.0.0:8080/", "loopback"),
    ("http://[::ffff:10.0.0.1]/v1", "loopback"),
    ("http://[::ffff:169.254.169.254]/", "loopback"),
    ("http://[::127.0.0.1]/", "loopback"),  # IPv4-compatible form: not loopback
    ("http://[fe80::1%25lo]/", "zone id"),
    ("http://localhost./v1", "loopback"),
    ("http://localhost.evil.com/v1", "loopback"),
    ("http://evil.localhost/v1", "loopback"),
    ("http://127.0.0.1.nip.io/v1", "loopback"),
    ("http://2130706433/", "ambiguous"),
    ("https://2130706433/", "ambiguous"),
    ("http://0x7f000001/", "ambiguous"),
    ("http://0x7f.0.0.1/", "ambiguous"),
    ("http://0177.0.0.1/", "ambiguous"),
    ("http://127.1/", "ambiguous"),
    ("http://127.0.0.01/", "ambiguous"),
    ("http://127.0.0.1./", "ambiguous"),
    ("http://256.0.0.1/", "out of range"),
    ("http://127.0.0.%31/", "percent"),
    ("http://user:pass@127.0.0.1/v1", "user-info"),
    ("https://user@example.com/v1", "user-info"),
    ("https://example.com@127.0.0.1/", "user-info"),
    ("https://example.com/v1?key=secret", "?query"),
    ("https://example.com/v1?", "?query"),
    ("https://example.com/v1#frag", "#fragment"),
    ("ftp://example.com/file", "scheme ftp"),
    ("file:///etc/passwd", "scheme file"),
    ("javascript:alert(1)", "scheme javascript"),
    ("example.com/v1", "no scheme"),
    ("//example.com/v1", "no scheme"),
    ("https:example.com", "does not start"),
    ("https:///v1", "no host"),
    ("http://:8080/v1", "no host"),
    ("", "empty"),
    (" https://example.com/v1", "whitespace"),
    ("https://example.com/v1\n", "whitespace"),
    ("https://exa mple.com/", "whitespace"),
    ("https://example.com/\x00", "control"),
    ("https://ex\u0430mple.com/", "non-ASCII"),
    ("http://\uff11\uff12\uff17.0.0.1/", "non-ASCII"),
    ("http://127.0.0.1\\@evil.com/", "backslash"),
    ("http://127.0.0.1:0/", "port"),
    ("http://127.0.0.1:99999/", "port"),
    ("http://127.0.0.1:80a/", "port"),
    ("http://[::1/", "closing ]"),
    ("http://[127.0.0.1]/", "not an IPv6"),
    ("https://exa_mple..com/", "malformed"),
]


@pytest.mark.parametrize(("url", "loopback"), ALLOWED)
def test_allowed_url_passes_and_reports_loopback(url: str, loopback: bool) -> None:
    assert check_url(url, purpose="generation") == url
    assert is_loopback_url(url) is loopback


@pytest.mark.parametrize(("url", "words"), REFUSED)
def test_refused_url_raises_url_refused_naming_the_purpose(url: str, words: str) -> None:
    with pytest.raises(UrlRefused) as info:
        check_url(url, purpose="generation")
    msg = info.value.message
    assert msg.startswith("the generation URL")
    assert words in msg
    assert "\n" not in msg
    assert info.value.code == "url_refused"
    assert not is_loopback_url(url)


def test_table_has_at_least_forty_urls() -> None:
    assert len(ALLOWED) + len(REFUSED) >= 40


def test_plain_http_message_says_what_is_allowed() -> None:
    with pytest.raises(UrlRefused) as info:
        check_url("http://example.com/v1", purpose="generation")
    assert info.value.message == (
        "the generation URL http://example.com/v1 is refused: use https://, or http:// only for a loopback "
        "service (127.0.0.1, ::1, localhost)"
    )


def test_messages_never_show_credentials_or_query() -> None:
    for url in ("https://alice:hunter2@example.com/v1", "https://example.com/v1?key=AIzaSECRET#x"):
        with pytest.raises(UrlRefused) as info:
            check_url(url, purpose="embedding")
        assert "hunter2" not in info.value.message and "alice" not in info.value.message
        assert "AIzaSECRET" not in info.value.message
        assert "example.com/v1" in info.value.message


def test_query_allowed_only_when_asked_and_only_with_https() -> None:
    signed = "https://cdn-lfs.example.co/repos/ab/cd?X-Amz-Signature=abc&Expires=123"
    assert check_url(signed, purpose="model download redirect", allow_query=True) == signed
    with pytest.raises(UrlRefused):
        check_url(signed, purpose="model download")
    with pytest.raises(UrlRefused, match="loopback"):
        check_url("http://cdn.example.com/x?sig=1", purpose="model download redirect", allow_query=True)
    with pytest.raises(UrlRefused, match="fragment"):
        check_url("https://cdn.example.com/x?sig=1#f", purpose="model download redirect", allow_query=True)


def test_host_of_works_for_refused_but_wellformed_urls() -> None:
    assert host_of("http://Example.COM:80/v1") == "example.com"
    assert host_of("https://[::1]:8443/x") == "::1"
    assert host_of("ftp://x/") == ""
    assert display_url("https://u:p@example.com/a?b=c#d") == "https://example.com/a"
