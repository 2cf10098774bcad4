"""`config.toml`: typed tables (:mod:`.schema`), strict loading (:mod:`.load`), old keys read with a
notice for a release (:mod:`.deprecated`), and the effective values for `memories config show`
(:mod:`.show`). Light on purpose: the CLI imports it (no numpy, no onnxruntime)."""

from __future__ import annotations

from .deprecated import DEPRECATED_KEYS, Deprecation
from .load import load_config, parse_config, read_config, service
from .schema import (
    SERVICE_TABLES,
    CacheConfig,
    Config,
    ContextConfig,
    DaemonConfig,
    EmbeddingConfig,
    HttpConfig,
    IndexConfig,
    LocalEmbeddingConfig,
    LocalModelConfig,
    SearchConfig,
    ServiceConfig,
    SyncConfig,
    VaultConfig,
    WatchConfig,
    WatchSettings,
)
from .show import Option, effective_options, option_keys, render_text

__all__ = [
    "DEPRECATED_KEYS",
    "SERVICE_TABLES",
    "CacheConfig",
    "Config",
    "ContextConfig",
    "DaemonConfig",
    "Deprecation",
    "EmbeddingConfig",
    "HttpConfig",
    "IndexConfig",
    "LocalEmbeddingConfig",
    "LocalModelConfig",
    "Option",
    "SearchConfig",
    "ServiceConfig",
    "SyncConfig",
    "VaultConfig",
    "WatchConfig",
    "WatchSettings",
    "effective_options",
    "load_config",
    "option_keys",
    "parse_config",
    "read_config",
    "render_text",
    "service",
]
