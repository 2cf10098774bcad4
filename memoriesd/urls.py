"""The URL rule of Memories, in one place.

Every URL the product connects to (model services, the model download mirror
and any redirect a download follows) passes :func:`check_url`:

* ``https://`` to any host;
* ``http://`` only to a loopback service: ``127.0.0.0/8``, ``::1`` (also as
  the IPv4-mapped ``::ffff:127.x.y.z``) or exactly ``localhost``;
* no user-info (credentials in URLs end up in logs), no fragment, and no query
  unless the caller allows one (only download redirect targets, which are
  HTTPS and may carry a signed query);
* no whitespace, control or non-ASCII characters, no backslashes, no
  percent-encoded hosts;
* numeric hosts only as four plain decimal numbers (``127.0.0.1``). The
  shorthand, decimal, hex and octal spellings (``2130706433``, ``0x7f.1``,
  ``0177.0.0.1``, ``127.1``) are refused outright whatever the scheme: they
  mean different addresses to different parsers, so they cannot be allowed to
  be a way around the loopback rule.

``localhost.`` (trailing dot) and ``*.localhost`` are *not* treated as
loopback: they are sent to DNS by some resolvers.

Error messages show the URL only as ``scheme://host[:port]/path`` (never
credentials, query or fragment) so they can be shown and logged.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from .errors import UrlRefused

ALLOWED_HINT = "use https://, or http:// only for a loopback service (127.0.0.1, ::1, localhost)"

_HOSTNAME_RE = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*\.?$")
_DOTTED_QUAD_RE = re.compile(r"^(?:0|[1-9][0-9]{0,2})(?:\.(?:0|[1-9][0-9]{0,2})){3}$")
# WHATWG: a host whose last label is a number (decimal, 0x-hex, octal) is parsed as IPv4.
_NUMERIC_LABEL_RE = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)$")
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_MAX_SHOWN = 120


@dataclass(frozen=True)
class ParsedUrl:
    """The parts of a URL that passed the syntax checks."""

    scheme: str  # lower case
    host: str  # lower case, IPv6 without brackets
    port: int | None
    path: str
    query: str
    loopback: bool
    has_query: bool = False
    has_fragment: bool = False
    shown: str = ""  # scheme://host[:port]/path, safe to show

    @property
    def origin(self) -> tuple[str, str, int]:
        """(scheme, host, effective port): what "the same server" means."""
        default = 443 if self.scheme == "https" else 80
        return (self.scheme, self.host, self.port if self.port is not None else default)


class _Bad(Exception):
    """Internal: why a URL is malformed (``reason`` is safe to show)."""

    def __init__(self, reason: str, shown: str | None = None, *, hint: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.shown = shown
        self.hint = hint  # append what is allowed


def _clean(text: str) -> str:
    """Printable ASCII only, capped: safe for a one-line message or log."""
    out = "".join(c if 0x21 <= ord(c) < 0x7F else "?" for c in text)
    return out if len(out) <= _MAX_SHOWN else out[: _MAX_SHOWN - 3] + "..."


def _shown(scheme: str, hostport: str, path: str) -> str:
    return _clean(f"{scheme}://{hostport}{path}")


def _classify_host(host: str) -> tuple[str, bool]:
    """Validate a (lower-cased, unbracketed) host; return (host, is_loopback)."""
    if not host:
        raise _Bad("it has no host")
    if "%" in host:
        raise _Bad("its host is percent-encoded or carries a zone id; write the host literally")
    if ":" in host:  # IPv6 literal (only reachable from a bracketed host)
        try:
            ip6 = ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise _Bad("its IPv6 address is malformed") from exc
        mapped = ip6.ipv4_mapped
        if mapped is not None:
            return host, mapped in ipaddress.IPv4Network("127.0.0.0/8")
        return host, ip6 == ipaddress.IPv6Address("::1")
    labels = host.rstrip(".").split(".")
    if _NUMERIC_LABEL_RE.match(labels[-1]):
        if not _DOTTED_QUAD_RE.match(host):
            raise _Bad(
                "its host is a numeric address in an ambiguous form; "
                "write an IPv4 address as four decimal numbers (e.g. 127.0.0.1)"
            )
        try:
            ip4 = ipaddress.IPv4Address(host)
        except ValueError as exc:
            raise _Bad("its IPv4 address is out of range") from exc
        return host, ip4 in ipaddress.IPv4Network("127.0.0.0/8")
    if not _HOSTNAME_RE.match(host) or len(host) > 253:
        raise _Bad("its host name is malformed")
    return host, host == "localhost"


def _parse(url: str) -> ParsedUrl:
    """Syntax checks only (the policy is in :func:`_apply_rule`)."""
    if not isinstance(url, str) or not url:
        raise _Bad("it is empty")
    for c in url:
        o = ord(c)
        if o <= 0x20 or o == 0x7F or c.isspace():
            raise _Bad("it contains whitespace or control characters: remove them")
        if o > 0x7E:
            raise _Bad("it contains non-ASCII characters; write the host in its xn-- form and percent-encode the path")
    if "\\" in url:
        raise _Bad("it contains a backslash")
    m = _SCHEME_RE.match(url)
    if not m:
        raise _Bad("it has no scheme", hint=True)
    scheme = m.group(1).lower()
    rest = url[m.end() :]
    if scheme not in ("http", "https"):
        raise _Bad(f"the scheme {_clean(scheme)}: is not allowed", hint=True)
    if not rest.startswith("//"):
        raise _Bad(f"it does not start with {scheme}://", hint=True)
    rest = rest[2:]
    cut = len(rest)
    for sep in "/?#":
        i = rest.find(sep)
        if i != -1:
            cut = min(cut, i)
    netloc, tail = rest[:cut], rest[cut:]
    fragment_present = "#" in tail
    before_fragment = tail.partition("#")[0]
    path_part, qmark, query = before_fragment.partition("?")
    if "@" in netloc:
        host_hint = netloc.rpartition("@")[2]
        raise _Bad(
            "it contains user-info (a name or password before @): remove it; an API key belongs in the "
            "environment variable named by api_key_env",
            _shown(scheme, host_hint, path_part),
        )
    # Split host and port.
    port_text: str | None = None
    if netloc.startswith("["):
        end = netloc.find("]")
        if end == -1:
            raise _Bad("its IPv6 address has no closing ]")
        host, after = netloc[1:end], netloc[end + 1 :]
        if after:
            if not after.startswith(":"):
                raise _Bad("its host is malformed")
            port_text = after[1:]
        if ":" not in host:
            raise _Bad("its bracketed host is not an IPv6 address")
    else:
        host, colon, after = netloc.partition(":")
        if colon:
            port_text = after
    port: int | None = None
    if port_text is not None:
        if not port_text.isdigit() or not (0 < int(port_text) < 65536) or len(port_text) > 5:
            raise _Bad("its port is not a number from 1 to 65535", _shown(scheme, host, path_part))
        port = int(port_text)
    try:
        host, loopback = _classify_host(host.lower())
    except _Bad as exc:
        raise _Bad(exc.reason, _shown(scheme, netloc, path_part), hint=exc.hint) from None
    return ParsedUrl(
        scheme=scheme,
        host=host,
        port=port,
        path=path_part or "/",
        query=query,
        loopback=loopback,
        has_query=bool(qmark),
        has_fragment=fragment_present,
        shown=_shown(scheme, netloc, path_part),
    )


def _apply_rule(url: str, *, allow_query: bool) -> ParsedUrl:
    p = _parse(url)
    if p.has_fragment:
        raise _Bad("it has a #fragment", p.shown)
    if p.has_query and not allow_query:
        raise _Bad("it has a ?query; put options in the configuration and an API key in the daemon environment variable named by api_key_env, never in the URL", p.shown)
    if p.scheme == "http" and not p.loopback:
        raise _Bad(ALLOWED_HINT, p.shown)
    return p


def display_url(url: str) -> str:
    """``scheme://host[:port]/path`` of a URL, safe to show (no credentials, query or fragment)."""
    try:
        return _parse(url).shown
    except _Bad as exc:
        return exc.shown or "(malformed URL)"


def parse_url(url: str, *, purpose: str, allow_query: bool = False) -> ParsedUrl:
    """:func:`check_url`, returning the parsed parts."""
    try:
        return _apply_rule(url, allow_query=allow_query)
    except _Bad as exc:
        what = f"the {purpose} URL {exc.shown}" if exc.shown else f"the {purpose} URL"
        if exc.hint:
            raise UrlRefused(f"{what} is refused: {exc.reason}; {ALLOWED_HINT}") from None
        raise UrlRefused(f"{what} is refused: {exc.reason}") from None


def check_url(url: str, *, purpose: str, allow_query: bool = False) -> str:
    """Apply the URL rule; return ``url`` unchanged or raise :class:`UrlRefused`.

    ``purpose`` names the URL in the message ("generation", "model download").
    ``allow_query`` is for download redirect targets only (signed URLs).
    """
    parse_url(url, purpose=purpose, allow_query=allow_query)
    return url


def is_loopback_url(url: str) -> bool:
    """True if ``url`` passes the rule (query allowed) and points at a loopback host."""
    try:
        return _apply_rule(url, allow_query=True).loopback
    except _Bad:
        return False


def host_of(url: str) -> str:
    """The URL's host (lower case, IPv6 without brackets), or "" when the URL is malformed.

    Works for refused-but-wellformed URLs too (``http://example.com``), for messages and logs.
    """
    try:
        return _parse(url).host
    except _Bad:
        return ""
