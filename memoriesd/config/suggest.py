""" "Did you mean": the valid keys closest to an unknown one in ``config.toml``.

An unknown key used to be answered with every key of its table (30 of them for ``[daemon]`` and
``[vault]`` together): the one the person meant was lost in the list. :func:`unknown_key` names the
file's table and key and at most :data:`MAX_SUGGESTIONS` candidates, found in this order:

1. an old spelling (:data:`~.deprecated.DEPRECATED_KEYS`): ``local_model_dir`` anywhere names its
   new place, ``model_dir`` in ``[embedding.local]``; a removed key says why it is gone;
2. close spellings in the same table (:func:`difflib.get_close_matches`, the stdlib's ratio);
3. the same key in another table (a line written under the wrong ``[table]`` header);
4. only when none of those: close spellings anywhere (a stricter cutoff, so a stray word gets
   "no such key" and the reference, not a far-fetched guess).

Pure and light (stdlib only, difflib imported when an error is being worded): the CLI calls it.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from functools import cache

from .deprecated import DEPRECATED_KEYS
from .schema import META_FIELDS, Config, WatchConfig

MAX_SUGGESTIONS = 3
SAME_TABLE_CUTOFF = 0.6  # difflib's default: "auto_lock_minute", "autolock_minutes" → auto_lock_minutes
ANYWHERE_CUTOFF = 0.75  # across tables a guess must be closer: it moves the line to another table
REFERENCE = "docs/config.md lists every key"


@cache
def catalogue() -> dict[str, dict[str, bool]]:
    """Each table's keys (``""`` = the top level), each with whether it is itself a table."""
    out: dict[str, dict[str, bool]] = {}

    def walk(obj: object, prefix: str) -> None:
        keys = out.setdefault(prefix, {})
        assert is_dataclass(obj)
        for f in fields(obj):
            if isinstance(obj, Config) and f.name in META_FIELDS:
                continue
            value = getattr(obj, f.name)
            name = "folder" if (prefix, f.name) == ("watch", "folders") else f.name
            sub = f"{prefix}.{name}" if prefix else name
            if name == "folder":
                keys[name] = True
                walk(WatchConfig(), sub)
            elif is_dataclass(value) and not isinstance(value, type):
                keys[name] = True
                walk(value, sub)
            else:
                keys[name] = False

    walk(Config(), "")
    return out


def table_of(prefix: str) -> str:
    """``watch.folder[2]`` → ``watch.folder`` (every ``[[watch.folder]]`` table has the same keys)."""
    head, bracket, _ = prefix.partition("[")
    return head if bracket else prefix


def spell(table: str, name: str, *, here: str | None = None) -> str:
    """How a person finds a key: `` `auto_lock_minutes` `` in its own table (``here``),
    `` `model_dir` in [embedding.local] `` elsewhere, ``[search]`` for a table."""
    sub = f"{table}.{name}" if table else name
    if catalogue().get(table, {}).get(name):
        return f"[[{sub}]]" if sub == "watch.folder" else f"[{sub}]"
    if table == here:
        return f"`{name}`"
    return f"`{name}` in [{table}]" if table else f"`{name}`"


def _close(word: str, options: list[str], cutoff: float) -> list[str]:
    import difflib

    return difflib.get_close_matches(word, options, n=MAX_SUGGESTIONS, cutoff=cutoff)


def _new_place(new: str, here: str) -> str:
    table, _, name = new.rpartition(".")
    return spell(table, name, here=here)


def candidates(table: str, name: str) -> tuple[list[str], str]:
    """The suggestions for ``name`` written in ``table`` (each already spelled), and why an old key is
    gone ("" when it is not a removed key)."""
    here = table_of(table)
    cat = catalogue()
    # 1. an old spelling: its new place, or why it is gone
    old = [k for k in DEPRECATED_KEYS if k == f"{here}.{name}" or k.rpartition(".")[2] == name]
    for key in old:
        dep = DEPRECATED_KEYS[key]
        if dep.new is None:
            return [], dep.reason
    moved = [_new_place(DEPRECATED_KEYS[k].new or "", here) for k in old]
    if moved:
        return list(dict.fromkeys(moved))[:MAX_SUGGESTIONS], ""
    # 2. close spellings in this table
    out = [spell(here, n, here=here) for n in _close(name, list(cat.get(here, {})), SAME_TABLE_CUTOFF)]
    # 3. the same key under another table's header
    out += [spell(t, name, here=here) for t, keys in cat.items() if t != here and name in keys]
    if out:
        return list(dict.fromkeys(out))[:MAX_SUGGESTIONS], ""
    # 4. close spellings anywhere, old spellings included (they name their new place)
    where: dict[str, list[str]] = {}
    for t, keys in cat.items():
        for n in keys:
            where.setdefault(n, []).append(spell(t, n, here=here))
    for key, dep in DEPRECATED_KEYS.items():
        if dep.new is not None:
            where.setdefault(key.rpartition(".")[2], []).append(_new_place(dep.new, here))
    for n in _close(name, list(where), ANYWHERE_CUTOFF):
        out += where[n]
    return list(dict.fromkeys(out))[:MAX_SUGGESTIONS], ""


def did_you_mean(options: list[str]) -> str:
    """``did you mean `a`?`` / ``did you mean `a` or `b`?`` / ``did you mean `a`, `b` or `c`?``; one key
    in several tables is named once (``did you mean `url` in [embedding.service] or [generation]?``)."""
    if not options:
        return ""
    heads = {o.partition(" in [")[0] for o in options}
    if len(options) > 1 and len(heads) == 1 and all(" in [" in o for o in options):
        return f"did you mean {heads.pop()} in {_either([o.partition(' in ')[2] for o in options])}?"
    return f"did you mean {_either(options)}?"


def _either(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def unknown_key(table: str, name: str, *, dotted: str, is_table: bool = False) -> str:
    """The one-line message for an unknown key: the key, its table, the closest valid keys.

    ``dotted`` is the key as the rest of the messages name it (``daemon.bogus``, or with the old
    spelling it was written as); ``is_table`` says the unknown name holds a table (``[serach]``).
    """
    found, gone = candidates(table, name)
    if is_table:
        where = f"there is no [{dotted}] table"
    elif table.startswith("watch.folder["):
        where = f"[[watch.folder]] number {table[len('watch.folder[') : -1]} has no key `{name}`"
    elif table:
        where = f"[{table}] has no key `{name}`"
    else:
        where = f"`{name}` is written above every [table] header"
    if gone:
        return f"unknown config key {dotted}: it is gone: {gone}"
    hint = f"; {did_you_mean(found)}" if found else f" ({REFERENCE} and its table)"
    return f"unknown config key {dotted}: {where}{hint}"


def unknown_old_key(table: str, name: str) -> str:
    """An unknown key of a gone table (``[rag]``): the closest new keys, else where the new tables are."""
    found, gone = candidates(table, name)
    hint = f"it is gone: {gone}" if gone else did_you_mean(found) or "see docs/config.md for the new tables"
    return f"unknown config key {table}.{name}: [{table}] is gone; {hint}"


def close_value(value: object, allowed: tuple[str, ...]) -> str:
    """`` (did you mean "warning"?)`` for a string close to one of ``allowed``, else ""."""
    if not isinstance(value, str):
        return ""
    near = _close(value.lower(), [a for a in allowed if a], SAME_TABLE_CUTOFF)
    return f" (did you mean {near[0]!r}?)" if near else ""


__all__ = [
    "MAX_SUGGESTIONS",
    "candidates",
    "catalogue",
    "close_value",
    "did_you_mean",
    "table_of",
    "unknown_key",
    "unknown_old_key",
]
