"""`memories config show`: the effective value of every option and where it came from.

Pure: reads a :class:`~.schema.Config` (no daemon, no numpy), so the CLI calls it directly. Sources:
``default``, ``config.toml``, ``deprecated key rag.x`` (an old spelling still read), ``derived`` (a
default worked out from other keys, the reason given).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import TYPE_CHECKING

from .schema import META_FIELDS, Config

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

#: (dotted key, value, default), values as :func:`_plain` gives them.
_Row = tuple[str, object, object]


@dataclass(frozen=True)
class Option:
    key: str  # dotted: "embedding.local.threads"
    value: object  # as JSON: a sub-table's dataclass is a dict, a tuple a list
    default: object
    source: str  # default | config.toml | deprecated key OLD | derived: WHY


#: ``dimensions`` is a field of every :class:`~.schema.ServiceConfig` but a key of [embedding.service] only.
_NOT_OPTIONS = ("generation.dimensions", "rerank.dimensions")


def _plain(value: object) -> object:
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _walk(obj: DataclassInstance, default: DataclassInstance, prefix: str, out: list[_Row]) -> None:
    for f in fields(obj):
        if isinstance(obj, Config) and f.name in META_FIELDS:
            continue
        key = f"{prefix}{f.name}"
        value, dflt = getattr(obj, f.name), getattr(default, f.name)
        if key in _NOT_OPTIONS:
            continue
        if key == "watch.folders":
            out.append(("watch.folder", _plain(value), []))
        elif is_dataclass(value) and not isinstance(value, type):
            _walk(value, dflt, key + ".", out)
        else:
            out.append((key, _plain(value), _plain(dflt)))


def option_keys(cfg: Config | None = None) -> list[str]:
    """Every option's dotted key, in table order."""
    out: list[_Row] = []
    _walk(cfg or Config(), Config(), "", out)
    return [k for k, _, _ in out]


def effective_options(cfg: Config) -> list[Option]:
    """Every option with its effective value and source, in table order."""
    rows: list[_Row] = []
    _walk(cfg, Config(), "", rows)
    sources = dict(cfg.sources)
    out: list[Option] = []
    for key, value, default in rows:
        source = sources.get(key, "default")
        if key == "embedding.source" and not value:
            value = cfg.embedding.effective_source
            source = "derived: " + ("[embedding.service] is configured" if value == "remote" else "no [embedding.service] is configured")
        out.append(Option(key, value, default, source))
    return out


def render_text(options: list[Option]) -> str:
    """One ``[table]`` heading per table, then ``key = value  # source`` lines (TOML-like)."""
    import json

    lines: list[str] = []
    table = None
    for o in options:
        t, _, name = o.key.rpartition(".")
        if t != table:
            if lines:
                lines.append("")
            lines.append(f"[{t}]")
            table = t
        shown = json.dumps(o.value, ensure_ascii=False)
        lines.append(f"{name} = {shown}  # {o.source}")
    return "\n".join(lines)
