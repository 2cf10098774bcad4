"""Old config keys: each one is still read for a release, with a one-line notice naming its new key.

:data:`DEPRECATED_KEYS` is the one map: an old dotted key (or an old table, for a table that moved
whole) to a :class:`Deprecation`, which either names the new key (the value is used there) or says
why the key is gone (the value is ignored). :func:`migrate` rewrites a decoded document of the old
layout into the new one before validation, so every rule of the new key applies to the old spelling.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class Deprecation:
    new: str | None  # the dotted new key (a table for a moved table); None = removed
    reason: str = ""  # why a removed key is gone and what to do instead


class UnknownOldKey(ConfigError):
    """A key of a table that is gone (``[rag]``, ``[rag.cache]``) that was never one of its keys;
    :func:`.suggest.unknown_old_key` words it with the closest new keys."""

    def __init__(self, table: str, name: str) -> None:
        super().__init__(f"unknown config key {table}.{name}: [{table}] is gone, see docs/config.md for the new tables")
        self.table = table
        self.name = name


_RESEARCH = "a research knob, still on the command line as `rag search {flag}`; delete the line"

#: Old key → new key or removal. Tables that moved whole map table → table.
DEPRECATED_KEYS: dict[str, Deprecation] = {
    # removed
    "daemon.vault_process": Deprecation(None, "every unlocked vault now runs in its own process (which lock ends) "
                                        "whatever it says; delete the line"),
    "daemon.test_allow_uid": Deprecation(None, "a test switch that weakened the socket's peer check is no longer read "
                                         "from config.toml (only the test suite sets it, see SECURITY.md); delete the line"),
    "rag.fusion": Deprecation(None, _RESEARCH.format(flag="--fusion")),
    "rag.rrf_k": Deprecation(None, _RESEARCH.format(flag="--rrf-k")),
    "rag.vector_weight": Deprecation(None, _RESEARCH.format(flag="--vector-weight") + " (0 = the model's measured weight)"),
    "rag.rerank_default": Deprecation(None, "the light reranker runs where the model's profile measured that it helps; "
                                      "`rag search --no-rerank` skips it; delete the line"),
    "rag.query_cache_items": Deprecation(None, "the query-vector cache is fixed at 1,000 vectors for 300 s; delete the line"),
    "rag.query_cache_seconds": Deprecation(None, "the query-vector cache is fixed at 1,000 vectors for 300 s; delete the line"),
    "rag.cache.max_vaults": Deprecation(None, "every unlocked vault runs in its own process, so one index per process; "
                                        "delete the line"),
    "rag.context_profile_share": Deprecation(None, "the profile block keeps at most 0.3 of a pack while memories wait "
                                             "(measured); delete the line"),
    "rag.context_items": Deprecation(None, "a pack considers 20 search results (measured); delete the line"),
    # moved: [rag]
    "rag.local_model_dir": Deprecation("embedding.local.model_dir"),
    "rag.embedding_source": Deprecation("embedding.source"),
    "rag.local_threads": Deprecation("embedding.local.threads"),
    "rag.max_tokens": Deprecation("embedding.max_tokens"),
    "rag.model_download_base_url": Deprecation("embedding.local.download_url"),
    "rag.model_idle_minutes": Deprecation("embedding.local.idle_minutes"),
    "rag.operation_budget_seconds": Deprecation("index.budget_seconds"),
    "rag.background_index": Deprecation("index.background"),
    "rag.conversation_windows": Deprecation("index.conversation_windows"),
    "rag.max_document_mib": Deprecation("vault.max_document_mib"),
    "rag.candidates": Deprecation("search.candidates"),
    "rag.ask_min_cosine": Deprecation("search.min_cosine"),
    "rag.on_demand_embed_limit": Deprecation("search.on_demand_embed_limit"),
    "rag.context_budget": Deprecation("context.budget"),
    "rag.watch_debounce_seconds": Deprecation("watch.debounce_seconds"),
    "rag.watch": Deprecation("watch.folder"),
    # moved: [rag.cache], [rag.local_model]
    "rag.cache.max_fragments": Deprecation("index.max_fragments"),
    "rag.cache.max_source_mib": Deprecation("index.max_source_mib"),
    "rag.cache.max_vector_mib": Deprecation("index.max_vector_mib"),
    "rag.cache.vector_precision": Deprecation("index.vector_precision"),
    "rag.local_model.dimensions": Deprecation("embedding.local.dimensions"),
    "rag.local_model.max_tokens": Deprecation("embedding.max_tokens"),
    "rag.local_model.query_prompt": Deprecation("embedding.local.query_prompt"),
    "rag.local_model.document_prompt": Deprecation("embedding.local.document_prompt"),
    # moved whole: every key of the table keeps its name
    "rag.http": Deprecation("http"),
    "rag.embedding": Deprecation("embedding.service"),
    "rag.generation": Deprecation("generation"),
    "rag.rerank": Deprecation("rerank"),
}

_WHOLE_TABLES = ("rag.http", "rag.embedding", "rag.generation", "rag.rerank")
_SPLIT_TABLES = ("rag.cache", "rag.local_model")


def _spell(key: str) -> str:
    """``rag.http.retries`` → ``[rag.http] retries`` (how a user finds it in the file)."""
    table, _, name = key.rpartition(".")
    return f"[{table}] {name}" if table else key


def _place(out: dict[str, Any], new: str, value: object, old: str, notes: list[str], origin: dict[str, str]) -> None:
    """Put ``value`` at ``new`` unless the new key is already written (the new spelling wins)."""
    *tables, name = new.split(".")
    node = out
    for t in tables:
        child = node.setdefault(t, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config key {'.'.join(tables)} must be a table ([{'.'.join(tables)}])")
        node = child
    if new == "watch.folder":  # arrays of tables: the old tables are added to the new ones
        if not isinstance(value, list):
            raise ConfigError("config key rag.watch must be an array of tables: write one [[watch.folder]] table per folder")
        current = node.get(name, [])
        node[name] = (current if isinstance(current, list) else [current]) + list(value)
        notes.append("config: [[rag.watch]] is now [[watch.folder]]: rename the tables (read from the old name until the next release)")
        origin.setdefault(new, old)
        return
    if name in node:
        if new == "embedding.max_tokens" and origin.get(new, "").startswith("rag."):
            # [rag] max_tokens capped [rag.local_model] max_tokens: the smaller one that is set was in force.
            node[name] = min((v for v in (node[name], value) if isinstance(v, int) and v), default=node[name])
            notes.append(f"config: {_spell(old)} is now {_spell(new)} (with {_spell(origin[new])}, the smaller one is used): "
                         "keep one line")
            return
        notes.append(f"config: {_spell(old)} is ignored: {_spell(new)} is also set and wins; delete the old line")
        return
    node[name] = value
    origin[new] = old
    notes.append(f"config: {_spell(old)} is now {_spell(new)}: rename it (read from the old place until the next release)")


def migrate(data: dict[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """The document in the new layout, one notice per old key, and new key → the old key it came from."""
    out = copy.deepcopy({k: v for k, v in data.items() if k != "rag"})
    notes: list[str] = []
    origin: dict[str, str] = {}
    daemon = out.get("daemon")
    if isinstance(daemon, dict):
        for name in ("vault_process", "test_allow_uid"):
            if name in daemon:
                del daemon[name]
                notes.append(f"config: [daemon] {name} is gone: {DEPRECATED_KEYS['daemon.' + name].reason}")
    if "rag" not in data:
        return out, notes, origin
    rag = data["rag"]
    if not isinstance(rag, dict):
        raise ConfigError("config key rag must be a table ([rag])")
    for name, value in rag.items():
        key = f"rag.{name}"
        dep = DEPRECATED_KEYS.get(key)
        if key in _WHOLE_TABLES and isinstance(value, dict):
            assert dep is not None and dep.new is not None
            for sub, v in value.items():
                _place(out, f"{dep.new}.{sub}", v, f"{key}.{sub}", notes, origin)
            continue
        if key in _SPLIT_TABLES and isinstance(value, dict):
            for sub, v in value.items():
                sdep = DEPRECATED_KEYS.get(f"{key}.{sub}")
                if sdep is None:
                    raise UnknownOldKey(key, sub)
                if sdep.new is None:
                    notes.append(f"config: {_spell(key + '.' + sub)} is gone: {sdep.reason}")
                else:
                    _place(out, sdep.new, v, f"{key}.{sub}", notes, origin)
            continue
        if dep is None or key in _WHOLE_TABLES or key in _SPLIT_TABLES:
            raise UnknownOldKey("rag", name)
        if dep.new is None:
            notes.append(f"config: {_spell(key)} is gone: {dep.reason}")
        else:
            _place(out, dep.new, value, key, notes, origin)
    return out, notes, origin
