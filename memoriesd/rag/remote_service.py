"""What every remote model service shares: its URL rule, its API key, its auth header.

API keys live in environment variables of the daemon; config.toml only names
the variable (``api_key_env``). A key is read when a request is made, put in a
header and nowhere else: never in a message, a log line or a return value.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..config import ServiceConfig
from ..errors import ConfigError
from ..urls import ParsedUrl, parse_url

__all__ = ["ServiceEndpoint", "auth_headers"]


def _read_key(svc: ServiceConfig, env: Mapping[str, str], section: str, parsed: ParsedUrl) -> str | None:
    name = svc.api_key_env
    if not name:
        if parsed.loopback:
            return None
        raise ConfigError(
            f"[{section}] points at {parsed.host}, which is not on this device, but names no API key: "
            f"set {section}.api_key_env to the name of an environment variable of the daemon that holds the key"
        )
    value = env.get(name, "")
    if not value.strip():
        raise ConfigError(
            f"the environment variable {name} named by {section}.api_key_env is not set for the daemon: "
            "export it and restart the daemon"
        )
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in value.strip()):
        raise ConfigError(
            f"the environment variable {name} named by {section}.api_key_env holds characters that cannot "
            "be sent in a header: check its value"
        )
    return value.strip()


def auth_headers(protocol: str, key: str | None) -> dict[str, str]:
    """Gemini: ``x-goog-api-key``; compatible: ``Authorization: Bearer``; none without a key."""
    if key is None:
        return {}
    if protocol == "gemini":
        return {"x-goog-api-key": key}
    return {"Authorization": f"Bearer {key}"}


class ServiceEndpoint:
    """A configured service: checked URL, display host and, per request, its auth headers."""

    def __init__(self, svc: ServiceConfig, env: Mapping[str, str], *, section: str, purpose: str) -> None:
        if not svc.configured:
            raise ConfigError(f"[{section}] has no url: set url, protocol and model in config.toml")
        self.svc = svc
        self.section = section
        self.purpose = purpose
        self.parsed = parse_url(svc.url, purpose=purpose)
        self._env = env
        # Fail early (construction time) when the key variable is missing.
        _read_key(svc, env, section, self.parsed)

    @property
    def url(self) -> str:
        return self.svc.url

    @property
    def host(self) -> str:
        """``host`` or ``host:port`` — what identifies the service in identities and messages."""
        p = self.parsed
        host = f"[{p.host}]" if ":" in p.host else p.host
        return f"{host}:{p.port}" if p.port is not None else host

    def headers(self) -> dict[str, str]:
        """Fresh auth headers (the key is read from the environment mapping at each request)."""
        return auth_headers(self.svc.protocol, _read_key(self.svc, self._env, self.section, self.parsed))
