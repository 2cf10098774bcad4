"""`config.toml`: one schema, strict validation, typed sections.

The file is optional. Every key has a default (see ``config.example.toml``).
An unknown key, a wrong type or an out-of-range value raises
:class:`~memoriesd.errors.ConfigError` with one line naming the key, the value
and what is allowed. Relative paths resolve next to the config file.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import ConfigError, UrlRefused
from .net.urls import check_url

# ---------------------------------------------------------------------------
# Typed sections
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DaemonConfig:
    autostart: bool = True
    auto_lock_minutes: float = 15.0
    log_level: str = "info"
    # Test-only: one more uid allowed to connect besides the daemon's own (-1 = none).
    test_allow_uid: int = -1
    max_frame_mib: int = 16
    # Resource bounds (issue 13; SECURITY.md "Resource bounds").
    max_connections: int = 256  # also capped below the open-file limit
    idle_timeout_seconds: float = 600.0  # 0 = never close an idle connection
    max_requests_per_connection: int = 32  # in flight; further frames are not read until one ends
    write_timeout_seconds: float = 30.0  # a client that does not read its replies this long is cut off
    keepalive_seconds: float = 10.0  # a keep-alive progress frame this often while a request runs


@dataclass(frozen=True)
class VaultConfig:
    kdf_memory_kib: int = 65536
    kdf_iterations: int = 3
    kdf_lanes: int = 4
    keep_revisions: int = 10
    unlock_delay_step_ms: int = 100
    unlock_delay_max_ms: int = 2000


@dataclass(frozen=True)
class HttpConfig:
    use_env_proxy: bool = True
    proxy_url: str = ""
    retries: int = 2
    backoff_ms: int = 500
    connect_timeout_seconds: float = 10.0
    timeout_seconds: float = 60.0
    download_timeout_seconds: float = 1800.0
    ca_bundle: str = ""  # resolved to an absolute path, "" = system store only


@dataclass(frozen=True)
class CacheConfig:
    # Sized from measured memory (README "Memory and the cache caps"): a vault of 150,000 fragments
    # (192 MiB of text fits CJK notes; 768-dim int8 vectors take 110 MiB).
    max_fragments: int = 150000
    max_source_mib: float = 192.0
    max_vector_mib: float = 128.0
    max_vaults: int = 2
    # How vectors are held in memory, and sealed on disk (vector sidecar version 2): float32, float16, int8.
    vector_precision: str = "int8"


@dataclass(frozen=True)
class LocalModelConfig:
    """Profile overrides for a local model directory that is not EmbeddingGemma."""

    dimensions: int = 0  # 0 = infer from the graph
    max_tokens: int = 0  # 0 = infer from the model files
    query_prompt: str = ""  # e.g. "task: search result | query: " ; "" = none
    document_prompt: str = ""  # may contain {title} and {text}; "" = none


@dataclass(frozen=True)
class ServiceConfig:
    """A remote model service: [rag.embedding], [rag.generation] or [rag.rerank]."""

    protocol: str = ""
    url: str = ""
    model: str = ""
    api_key_env: str = ""
    dimensions: int = 0  # embedding only; 0 = the service default

    @property
    def configured(self) -> bool:
        return bool(self.url)


@dataclass(frozen=True)
class WatchConfig:
    """One ``[[rag.watch]]`` table: a folder kept in sync with a vault while the vault is unlocked."""

    vault: str = ""  # vault id or name
    path: str = ""  # absolute after loading (~ expanded, relative = next to config.toml)
    recursive: bool = False
    include: tuple[str, ...] = ()  # file globs; () = *.md, *.markdown, *.txt
    prune: bool = False  # remove the card of a file deleted from the folder


@dataclass(frozen=True)
class RagConfig:
    local_model_dir: str = ""  # "" = HOME/models/embeddinggemma
    # Which embedder serves searches: "local", "remote" ([rag.embedding]) or "auto" (the local model
    # when installed, else the service); "" (not set) = the service when configured, else local.
    embedding_source: str = ""
    local_threads: int = 4
    max_tokens: int = 0  # 0 = the model's maximum
    model_download_base_url: str = ""
    operation_budget_seconds: float = 300.0
    on_demand_embed_limit: int = 256
    rrf_k: int = 60
    candidates: int = 100
    max_document_mib: float = 4.0
    ask_min_cosine: float = 0.0  # vector evidence floor for ask, context and search; 0 = the model's calibrated one, -1 = none
    rerank_default: bool = True
    fusion: str = "convex"  # hybrid: "convex" (min-max normalised scores) or "rrf" (reciprocal ranks)
    vector_weight: float = 0.0  # hybrid: the vector side's weight, BM25's being 1; 0 = the model's measured default
    background_index: bool = True  # embed missing fragments in the background (local model only)
    conversation_windows: bool = True  # a vector per two-turn window of conversation fragments (conversations.windows)
    model_idle_minutes: float = 10.0  # release the local model after this long unused; 0 = keep it
    query_cache_items: int = 1000  # query vectors kept in daemon memory (LRU); 0 = no cache
    query_cache_seconds: float = 300.0  # a cached query vector is used for this long
    context_budget: int = 1000  # `rag context`: default token budget of a pack
    context_profile_share: float = 0.3  # `rag context`: share of the budget the profile block keeps while memories wait
    context_items: int = 20  # `rag context`: search results considered for the relevant block
    watch_debounce_seconds: float = 1.0  # a watched folder syncs once no change came for this long
    watch: tuple[WatchConfig, ...] = ()  # [[rag.watch]] tables
    http: HttpConfig = field(default_factory=HttpConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    local_model: LocalModelConfig = field(default_factory=LocalModelConfig)
    embedding: ServiceConfig = field(default_factory=ServiceConfig)
    generation: ServiceConfig = field(default_factory=ServiceConfig)
    rerank: ServiceConfig = field(default_factory=ServiceConfig)


@dataclass(frozen=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    vault: VaultConfig = field(default_factory=VaultConfig)
    rag: RagConfig = field(default_factory=RagConfig)
    path: str = ""  # the file it came from, "" when absent
    deprecated: tuple[str, ...] = ()  # one line per removed key still in the file (logged at start)


#: Keys that were removed: still read (and ignored) for a release, with a one-line notice each.
DEPRECATED_KEYS: dict[str, str] = {
    "daemon.vault_process": "[daemon] vault_process is gone: every unlocked vault now runs in its own process "
    "(which lock ends) whatever it says; delete the line",
}


# ---------------------------------------------------------------------------
# Validation rules: (min, max) for numbers, choices for strings.
# ---------------------------------------------------------------------------

_RANGES: dict[str, tuple[float, float]] = {
    "daemon.auto_lock_minutes": (0, 60 * 24 * 365),
    "daemon.test_allow_uid": (-1, 2**32 - 1),
    "daemon.max_frame_mib": (9, 256),
    "daemon.max_connections": (1, 65536),
    "daemon.idle_timeout_seconds": (0, 7 * 86400),
    "daemon.max_requests_per_connection": (1, 1024),
    "daemon.write_timeout_seconds": (0.05, 3600),
    # Below the CLI's 30 s silence timeout, so a running request never looks like a hung daemon.
    "daemon.keepalive_seconds": (0.05, 20),
    "vault.kdf_memory_kib": (8, 4 * 1024 * 1024),
    "vault.kdf_iterations": (1, 64),
    "vault.kdf_lanes": (1, 64),
    "vault.keep_revisions": (1, 10000),
    "vault.unlock_delay_step_ms": (0, 10000),
    "vault.unlock_delay_max_ms": (0, 60000),
    "rag.local_threads": (1, 256),
    "rag.max_tokens": (0, 1 << 20),
    "rag.operation_budget_seconds": (1, 86400),
    "rag.on_demand_embed_limit": (0, 100000),
    "rag.rrf_k": (1, 1000),
    "rag.candidates": (10, 1000),
    "rag.max_document_mib": (0.001, 64),
    "rag.ask_min_cosine": (-1, 1),
    "rag.model_idle_minutes": (0, 60 * 24 * 365),
    "rag.query_cache_items": (0, 1_000_000),
    "rag.query_cache_seconds": (0, 86400),
    "rag.context_budget": (32, 1_000_000),
    "rag.context_profile_share": (0, 1),
    "rag.context_items": (1, 100),
    "rag.vector_weight": (0, 100),
    "rag.watch_debounce_seconds": (0.05, 60),
    "rag.http.retries": (0, 5),
    "rag.http.backoff_ms": (0, 60000),
    "rag.http.connect_timeout_seconds": (0.05, 600),
    "rag.http.timeout_seconds": (0.05, 3600),
    "rag.http.download_timeout_seconds": (0.05, 86400),
    "rag.cache.max_fragments": (1, 10_000_000),
    "rag.cache.max_source_mib": (0.001, 65536),
    "rag.cache.max_vector_mib": (0.001, 65536),
    "rag.cache.max_vaults": (1, 64),
    "rag.local_model.dimensions": (0, 65536),
    "rag.local_model.max_tokens": (0, 1 << 20),
    "rag.embedding.dimensions": (0, 65536),
}

_CHOICES: dict[str, tuple[str, ...]] = {
    "daemon.log_level": ("debug", "info", "warning", "error"),
    "rag.embedding.protocol": ("", "gemini", "compatible"),
    "rag.generation.protocol": ("", "gemini", "compatible"),
    "rag.rerank.protocol": ("", "compatible"),
    "rag.fusion": ("convex", "rrf"),
    "rag.embedding_source": ("", "local", "remote", "auto"),
    "rag.cache.vector_precision": ("float32", "float16", "int8"),
}

_PATH_KEYS = {"rag.local_model_dir", "rag.http.ca_bundle"}

# Keys that must never carry a secret value: where a key belongs instead.
_SECRET_HINT = (
    "API keys are never read from config.toml; put the key in an environment variable of the "
    "daemon and name that variable in api_key_env"
)


def _convert(key: str, value: Any, tp: Any) -> Any:
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key {key} = {value!r} is invalid: allowed is true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key {key} = {value!r} is invalid: allowed is an integer")
        out: Any = value
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"config key {key} = {value!r} is invalid: allowed is a finite number")
        out = float(value)
    elif tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"config key {key} = {value!r} is invalid: allowed is a string")
        out = value
    else:  # pragma: no cover - schema error
        raise ConfigError(f"config key {key} has an unsupported type")
    if key in _RANGES:
        lo, hi = _RANGES[key]
        if not (lo <= out <= hi):
            raise ConfigError(f"config key {key} = {value!r} is out of range: allowed is {lo:g} to {hi:g}")
    if key in _CHOICES and out not in _CHOICES[key]:
        allowed = ", ".join(repr(c) for c in _CHOICES[key] if c)
        raise ConfigError(f"config key {key} = {value!r} is invalid: allowed is one of {allowed}")
    return out


def _build(cls: Any, table: Any, prefix: str, base_dir: Path, notes: list[str] | None = None) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"config key {prefix} must be a table ([{prefix}])")
    known = {f.name: f for f in fields(cls) if f.name not in ("path", "deprecated") or cls is not Config}
    kwargs: dict[str, Any] = {}
    for name, value in table.items():
        key = f"{prefix}.{name}" if prefix else name
        if key in DEPRECATED_KEYS:
            if notes is not None:
                notes.append(DEPRECATED_KEYS[key])
            continue
        if name not in known:
            if name in ("api_key", "key", "token", "secret", "password"):
                raise ConfigError(f"config key {key} is not allowed: {_SECRET_HINT}")
            allowed = ", ".join(sorted(known))
            raise ConfigError(f"unknown config key {key}: allowed keys here are {allowed}")
        f = known[name]
        if key == "rag.watch":
            kwargs[name] = _build_watches(value, base_dir)
            continue
        default = getattr(cls(), name)
        if hasattr(default, "__dataclass_fields__"):
            kwargs[name] = _build(type(default), value, key, base_dir, notes)
            continue
        conv = _convert(key, value, type(default))
        if key in _PATH_KEYS and conv:
            conv = str((base_dir / Path(conv).expanduser()).resolve())
        kwargs[f.name] = conv
    return cls(**kwargs)


def _build_watches(value: Any, base_dir: Path) -> tuple[WatchConfig, ...]:
    """``[[rag.watch]]`` tables; a key error names the table by its position (``rag.watch[2].prune``)."""
    if not isinstance(value, list):
        raise ConfigError("config key rag.watch must be an array of tables: write one [[rag.watch]] table per folder")
    out: list[WatchConfig] = []
    seen: dict[tuple[str, str], int] = {}
    for i, table in enumerate(value, 1):
        prefix = f"rag.watch[{i}]"
        if not isinstance(table, dict):
            raise ConfigError(f"config key {prefix} must be a table: write it as a [[rag.watch]] table")
        include = table.get("include", [])
        if not isinstance(include, list) or not all(isinstance(g, str) and g.strip() for g in include):
            raise ConfigError(f'config key {prefix}.include = {include!r} is invalid: allowed is a list of file globs such as ["*.md"]')
        w = _build(WatchConfig, {k: v for k, v in table.items() if k != "include"}, prefix, base_dir)
        if not w.vault.strip():
            raise ConfigError(f"config table [[rag.watch]] number {i} needs vault: the id or name of a vault")
        if not w.path.strip() or "\x00" in w.path:
            raise ConfigError(f"config table [[rag.watch]] number {i} needs path: the folder to keep in sync")
        vault, path = w.vault.strip(), os.path.normpath(base_dir / Path(w.path).expanduser())
        if (vault, path) in seen:
            raise ConfigError(
                f"config tables [[rag.watch]] number {seen[(vault, path)]} and {i} both watch {path} for vault {vault}: remove one"
            )
        seen[(vault, path)] = i
        out.append(WatchConfig(vault, path, w.recursive, tuple(g.strip() for g in include), w.prune))
    return tuple(out)


def _check_services(cfg: Config) -> None:
    for name in ("embedding", "generation", "rerank"):
        svc: ServiceConfig = getattr(cfg.rag, name)
        prefix = f"rag.{name}"
        if not svc.url:
            if svc.protocol or svc.model:
                raise ConfigError(f"config table [{prefix}] needs url: the full operation URL of the service")
            continue
        if not svc.protocol:
            raise ConfigError(f"config table [{prefix}] needs protocol: allowed is {_CHOICES[prefix + '.protocol'][1:]}")
        if not svc.model and svc.protocol != "gemini":
            raise ConfigError(f"config table [{prefix}] needs model: the model name the service expects")
        if svc.api_key_env and not svc.api_key_env.replace("_", "").isalnum():
            # The value is not repeated: what is written here is often the key itself.
            raise ConfigError(
                f"config key {prefix}.api_key_env is invalid: it names an environment variable "
                f"(letters, digits, _), it never holds the key itself: {_SECRET_HINT}"
            )
        try:  # the URL rule at load time: a key in a ?query or user-info is refused before any use
            check_url(svc.url, purpose=f"[{prefix}]")
        except UrlRefused as exc:
            raise ConfigError(f"config key {prefix}.url: {exc.message}") from None
        if svc.dimensions and name != "embedding":
            raise ConfigError(f"config key {prefix}.dimensions is for [rag.embedding] only: remove it")
        if svc.api_key_env and len(svc.api_key_env) > 20 and any(c.islower() for c in svc.api_key_env) and any(
            c.isdigit() for c in svc.api_key_env
        ):
            raise ConfigError(f"config key {prefix}.api_key_env looks like a key value: {_SECRET_HINT}")


def parse_config(data: dict[str, Any], base_dir: Path, path: str = "") -> Config:
    """Validate a decoded TOML document into a :class:`Config`."""
    notes: list[str] = []
    built = _build(Config, data, "", base_dir, notes)
    cfg = Config(daemon=built.daemon, vault=built.vault, rag=built.rag, path=path, deprecated=tuple(notes))
    _check_services(cfg)
    if cfg.rag.embedding_source == "remote" and not cfg.rag.embedding.configured:
        raise ConfigError(
            'config key rag.embedding_source = "remote" needs an embedding service: add a [rag.embedding] table '
            '(protocol, url, model), or set embedding_source to "local" or "auto"'
        )
    if cfg.rag.http.proxy_url:
        # Credentials are refused in TOML (they belong in the environment's proxy variables).
        from urllib.parse import urlsplit

        parts = urlsplit(cfg.rag.http.proxy_url)
        if parts.scheme not in ("http", "https", "socks5", "socks5h"):
            raise ConfigError(
                f"config key rag.http.proxy_url = {cfg.rag.http.proxy_url!r} is invalid: allowed schemes are "
                "http, https, socks5, socks5h"
            )
        if parts.username or parts.password or "@" in parts.netloc:
            raise ConfigError(
                "config key rag.http.proxy_url must not contain credentials: put them in the "
                "HTTPS_PROXY/ALL_PROXY environment variable of the daemon and set use_env_proxy = true"
            )
    return cfg


def load_config(path: Path) -> Config:
    """Read ``path`` (absent → defaults)."""
    if not path.exists():
        return Config()
    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text: save it as UTF-8") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML ({exc}): fix the line it names") from exc
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read ({exc.strerror})") from exc
    try:
        return parse_config(data, path.parent.resolve(), str(path))
    except ConfigError as exc:  # the key alone does not say which file: the home may be anywhere
        raise ConfigError(f"{exc.message} (config file {path})") from None
