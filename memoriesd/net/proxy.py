"""Which proxy (if any) a request goes through.

Rules, in order:

1. a loopback endpoint always connects directly;
2. an explicit ``http.proxy_url`` is used for every other endpoint;
3. with ``use_env_proxy`` the environment decides: ``https_proxy``/``HTTPS_PROXY``
   (``http_proxy``/``HTTP_PROXY`` for http URLs), else ``all_proxy``/``ALL_PROXY``,
   unless ``no_proxy``/``NO_PROXY`` names the host (curl's semantics: ``*``,
   host names matching themselves and their sub-domains, a leading ``.`` is
   ignored, IP addresses and CIDR ranges);
4. otherwise directly.

We resolve the environment ourselves (the httpx clients run with
``trust_env=False``) so that httpx never picks up ``~/.netrc`` credentials or
``SSL_CERT_FILE`` behind the configuration's back.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from ..config import HttpConfig
from ..errors import ConfigError
from ..urls import ParsedUrl

PROXY_SCHEMES = ("http", "https", "socks5", "socks5h")


def _env(environ: Mapping[str, str], name: str) -> str:
    """Lower-case variable first (curl's order), then upper case; "" when unset or blank."""
    for key in (name.lower(), name.upper()):
        value = environ.get(key, "").strip()
        if value:
            return value
    return ""


def no_proxy_matches(host: str, no_proxy: str) -> bool:
    """True if ``host`` (lower case, IPv6 unbracketed) is excluded by a NO_PROXY value."""
    host = host.lower().rstrip(".")
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if entry.startswith("["):  # [v6] or [v6]:port
            entry = entry[1:].partition("]")[0]
        elif entry.count(":") == 1:  # host:port — the port is not compared
            entry = entry.partition(":")[0]
        entry = entry.lstrip(".").rstrip(".")
        if not entry:
            continue
        if ip is not None:
            try:
                if ip in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        if host == entry or host.endswith("." + entry):
            return True
    return False


def normalize_proxy_url(value: str, *, source: str) -> str:
    """Give a scheme-less proxy (``proxy:3128``) ``http://`` and check the scheme."""
    if "://" not in value:
        value = "http://" + value
    scheme = urlsplit(value).scheme.lower()
    if scheme not in PROXY_SCHEMES:
        raise ConfigError(
            f"the proxy set in {source} uses the scheme {scheme or '(none)'}: allowed are "
            "http, https, socks5 and socks5h"
        )
    return value


def env_proxy(scheme: str, host: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The proxy the environment names for a ``scheme`` URL to ``host``, or None."""
    env = os.environ if environ is None else environ
    if no_proxy_matches(host, _env(env, "no_proxy")):
        return None
    for name in (f"{scheme}_proxy", "all_proxy"):
        value = _env(env, name)
        if value:
            return normalize_proxy_url(value, source=name.upper())
    return None


def proxy_for(url: ParsedUrl, cfg: HttpConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The proxy URL for a request to ``url`` (None = connect directly)."""
    if url.loopback:
        return None
    if cfg.proxy_url:
        return normalize_proxy_url(cfg.proxy_url, source="http.proxy_url")
    if not cfg.use_env_proxy:
        return None
    return env_proxy(url.scheme, url.host, environ)


def proxy_label(proxy: str | None) -> str:
    """``scheme://host:port`` of a proxy, without credentials (for logs)."""
    if proxy is None:
        return "direct"
    parts = urlsplit(proxy)
    host = parts.hostname or "?"
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")
