"""Reading ``config.toml``: strict validation into the typed tables of :mod:`.schema`.

The file is optional. An unknown key, a wrong type or an out-of-range value raises
:class:`~memoriesd.errors.ConfigError` with one line naming the key, the value and what is allowed.
Relative paths resolve next to the config file. Old keys are rewritten first (:mod:`.deprecated`).
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ConfigError, UrlRefused
from ..urls import check_url
from .deprecated import UnknownOldKey, migrate
from .schema import (
    CHOICES,
    META_FIELDS,
    PATH_KEYS,
    PROGRAM_KEYS,
    RANGES,
    SERVICE_TABLES,
    Config,
    ServiceConfig,
    WatchConfig,
)
from .suggest import close_value, unknown_key, unknown_old_key

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

#: A config table's dataclass (:class:`~.schema.Config` or one of its sub-tables).
_Table = TypeVar("_Table", bound="DataclassInstance")
#: A key's value once checked against its field's type.
Scalar = bool | int | float | str

# Keys that must never carry a secret value: where a key belongs instead.
_SECRET_HINT = (
    "API keys are never read from config.toml; put the key in an environment variable of the "
    "daemon and name that variable in api_key_env"
)


class _Ctx:
    """What one parse carries: where relative paths resolve, which keys came from old spellings."""

    def __init__(self, base_dir: Path, origin: dict[str, str]) -> None:
        self.base_dir = base_dir
        self.origin = origin
        self.seen: list[str] = []

    def name(self, key: str) -> str:
        old = self.origin.get(key)
        return f"{key} (written as {old})" if old else key


def _convert(key: str, value: object, tp: type, ctx: _Ctx) -> Scalar:
    shown = ctx.name(key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key {shown} = {value!r} is invalid: allowed is true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key {shown} = {value!r} is invalid: allowed is an integer")
        out: Scalar = value
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"config key {shown} = {value!r} is invalid: allowed is a finite number")
        out = float(value)
    elif tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"config key {shown} = {value!r} is invalid: allowed is a string")
        out = value
    else:  # pragma: no cover - schema error
        raise ConfigError(f"config key {shown} has an unsupported type")
    if key in RANGES and isinstance(out, (int, float)):  # RANGES holds numeric keys only
        lo, hi = RANGES[key]
        if not (lo <= out <= hi):
            raise ConfigError(f"config key {shown} = {value!r} is out of range: allowed is {lo:g} to {hi:g}")
    if key in CHOICES and out not in CHOICES[key]:
        allowed = ", ".join(repr(c) for c in CHOICES[key] if c)
        raise ConfigError(f"config key {shown} = {value!r} is invalid: allowed is one of {allowed}{close_value(value, CHOICES[key])}")
    return out


def _build(cls: type[_Table], table: object, prefix: str, ctx: _Ctx) -> _Table:
    if not isinstance(table, dict):
        raise ConfigError(f"config key {ctx.name(prefix)} must be a table ([{prefix}])")
    known = {f.name: f for f in fields(cls) if not (cls is Config and f.name in META_FIELDS)}
    if prefix == "watch":  # [[watch.folder]] fills the field `folders`
        known = {("folder" if n == "folders" else n): f for n, f in known.items()}
    defaults = cls()
    kwargs: dict[str, Any] = {}
    for name, value in table.items():
        key = f"{prefix}.{name}" if prefix else name
        if name not in known:
            if name in ("api_key", "key", "token", "secret", "password"):
                raise ConfigError(f"config key {ctx.name(key)} is not allowed: {_SECRET_HINT}")
            raise ConfigError(unknown_key(prefix, name, dotted=ctx.name(key), is_table=isinstance(value, dict)))
        f = known[name]
        if key == "watch.folder":
            kwargs[f.name] = _build_watches(value, ctx)
            continue
        default = getattr(defaults, f.name)
        if is_dataclass(default) and not isinstance(default, type):
            kwargs[f.name] = _build(type(default), value, key, ctx)
            continue
        conv = _convert(key, value, type(default), ctx)
        if key in PATH_KEYS and isinstance(conv, str) and conv:  # path keys are strings
            conv = str((ctx.base_dir / Path(conv).expanduser()).resolve())
        elif key in PROGRAM_KEYS and isinstance(conv, str):
            conv = _program(key, conv, ctx)
        kwargs[f.name] = conv
        ctx.seen.append(key)
    return cls(**kwargs)


def _program(key: str, value: str, ctx: _Ctx) -> str:
    """A program key: a bare name stays (looked up on the daemon's PATH when run), a path resolves."""
    if not value.strip() or "\x00" in value:
        raise ConfigError(f"config key {ctx.name(key)} = {value!r} is invalid: allowed is a program name or path")
    if "/" not in value and not value.startswith("~"):
        return value
    return str((ctx.base_dir / Path(value).expanduser()).resolve())


def _build_watches(value: object, ctx: _Ctx) -> tuple[WatchConfig, ...]:
    """``[[watch.folder]]`` tables; a key error names the table by its position (``watch.folder[2].prune``)."""
    if not isinstance(value, list):
        raise ConfigError("config key watch.folder must be an array of tables: write one [[watch.folder]] table per folder")
    out: list[WatchConfig] = []
    seen: dict[tuple[str, str], int] = {}
    for i, table in enumerate(value, 1):
        prefix = f"watch.folder[{i}]"
        if not isinstance(table, dict):
            raise ConfigError(f"config key {prefix} must be a table: write it as a [[watch.folder]] table")
        include = table.get("include", [])
        if not isinstance(include, list) or not all(isinstance(g, str) and g.strip() for g in include):
            raise ConfigError(f'config key {prefix}.include = {include!r} is invalid: allowed is a list of file globs such as ["*.md"]')
        w = _build(WatchConfig, {k: v for k, v in table.items() if k != "include"}, prefix, _Ctx(ctx.base_dir, {}))
        if not w.vault.strip():
            raise ConfigError(f"config table [[watch.folder]] number {i} needs vault: the id or name of a vault")
        if not w.path.strip() or "\x00" in w.path:
            raise ConfigError(f"config table [[watch.folder]] number {i} needs path: the folder to keep in sync")
        vault, path = w.vault.strip(), os.path.normpath(ctx.base_dir / Path(w.path).expanduser())
        if (vault, path) in seen:
            raise ConfigError(
                f"config tables [[watch.folder]] number {seen[(vault, path)]} and {i} both watch {path} for vault {vault}: remove one"
            )
        seen[(vault, path)] = i
        out.append(WatchConfig(vault, path, w.recursive, tuple(g.strip() for g in include), w.prune))
    ctx.seen.append("watch.folder")
    return tuple(out)


def service(cfg: Config, table: str) -> ServiceConfig:
    """The :class:`ServiceConfig` of ``table`` (one of :data:`~.schema.SERVICE_TABLES`)."""
    return cfg.embedding.service if table == "embedding.service" else getattr(cfg, table)


def _check_services(cfg: Config, ctx: _Ctx) -> None:
    for prefix in SERVICE_TABLES:
        svc = service(cfg, prefix)
        if not svc.url:
            if svc.protocol or svc.model:
                raise ConfigError(f"config table [{prefix}] needs url: the full operation URL of the service")
            continue
        if not svc.protocol:
            raise ConfigError(f"config table [{prefix}] needs protocol: allowed is {CHOICES[prefix + '.protocol'][1:]}")
        if not svc.model and svc.protocol != "gemini":
            raise ConfigError(f"config table [{prefix}] needs model: the model name the service expects")
        if svc.api_key_env and not svc.api_key_env.replace("_", "").isalnum():
            # The value is not repeated: what is written here is often the key itself.
            raise ConfigError(
                f"config key {ctx.name(prefix + '.api_key_env')} is invalid: it names an environment variable "
                f"(letters, digits, _), it never holds the key itself: {_SECRET_HINT}"
            )
        try:  # the URL rule at load time: a key in a ?query or user-info is refused before any use
            check_url(svc.url, purpose=f"[{prefix}]")
        except UrlRefused as exc:
            raise ConfigError(f"config key {ctx.name(prefix + '.url')}: {exc.message}") from None
        if svc.dimensions and prefix != "embedding.service":
            raise ConfigError(f"config key {ctx.name(prefix + '.dimensions')} is for [embedding.service] only: remove it")
        if svc.api_key_env and len(svc.api_key_env) > 20 and any(c.islower() for c in svc.api_key_env) and any(
            c.isdigit() for c in svc.api_key_env
        ):
            raise ConfigError(f"config key {ctx.name(prefix + '.api_key_env')} looks like a key value: {_SECRET_HINT}")


def _check_proxy(cfg: Config) -> None:
    """Credentials are refused in TOML (they belong in the environment's proxy variables)."""
    if not cfg.http.proxy_url:
        return
    from urllib.parse import urlsplit

    parts = urlsplit(cfg.http.proxy_url)
    if parts.scheme not in ("http", "https", "socks5", "socks5h"):
        raise ConfigError(
            f"config key http.proxy_url = {cfg.http.proxy_url!r} is invalid: allowed schemes are http, https, socks5, socks5h"
        )
    if parts.username or parts.password or "@" in parts.netloc:
        raise ConfigError(
            "config key http.proxy_url must not contain credentials: put them in the "
            "HTTPS_PROXY/ALL_PROXY environment variable of the daemon and set use_env_proxy = true"
        )


def parse_config(data: dict[str, Any], base_dir: Path, path: str = "") -> Config:
    """Validate a decoded TOML document (new layout, old keys with notices) into a :class:`Config`."""
    try:
        new, notes, origin = migrate(data)
    except UnknownOldKey as exc:
        raise ConfigError(unknown_old_key(exc.table, exc.name)) from None
    ctx = _Ctx(base_dir, origin)
    built = _build(Config, new, "", ctx)
    sources = tuple((k, f"deprecated key {origin[k]}" if k in origin else "config.toml") for k in ctx.seen)
    cfg = replace(built, path=path, deprecated=tuple(notes), sources=sources)
    _check_services(cfg, ctx)
    if cfg.embedding.source == "remote" and not cfg.embedding.service.configured:
        raise ConfigError(
            f'config key {ctx.name("embedding.source")} = "remote" needs an embedding service: add an [embedding.service] '
            'table (protocol, url, model), or set source to "local" or "auto"'
        )
    _check_proxy(cfg)
    return cfg


def read_config(raw: bytes, path: Path) -> Config:
    """Decode and validate the bytes of ``path``; a :class:`ConfigError` here does not name the file
    (:func:`load_config` adds it; the restart notice names it once, first)."""
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError("the file is not UTF-8 text: save it as UTF-8") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the file is not valid TOML ({exc}): fix the line it names") from exc
    return parse_config(data, path.parent.resolve(), str(path))


def load_config(path: Path) -> Config:
    """Read ``path`` (absent → defaults); an error names the key, the file and the closest valid key."""
    if not path.exists():
        return Config()
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read ({exc.strerror})") from exc
    try:
        return read_config(raw, path)
    except ConfigError as exc:  # the key alone does not say which file: the home may be anywhere
        raise ConfigError(f"{exc.message} (config file {path})") from None
