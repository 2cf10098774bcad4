"""The record kinds the index and the search pipeline know, registered explicitly at start-up.

A record's ``kind`` names how it is cut into fragments, what the embedder reads of it, which day is
its own, which filters select it and what a search result shows of it. Each kind is one object that
answers these questions (:class:`RecordKind`); :mod:`memoriesd.index` and the search pipeline
(:mod:`memoriesd.rag.search`, :mod:`memoriesd.rag.filters`) ask :func:`kind_of` and know no kind by
name. Adding a kind is one module with a :class:`PlainKind` subclass and one :func:`register` call in
:func:`register_builtin_kinds` (or the caller's own start-up).

Registration is explicit, as in ``llm``'s plug-ins: importing a kind module registers nothing.
:func:`register_builtin_kinds` is called on the start-up path (daemon, vault process); a lookup
before it (a library user, a test) registers the built-in kinds first, once, so no caller can see
an empty registry.
"""

from __future__ import annotations

import threading

from .base import PlainKind, RecordKind
from .card import CardKind
from .conversation import ConversationKind
from .fact import FactKind

_lock = threading.Lock()
_kinds: dict[str, RecordKind] = {}
_builtins_done = False


def register(kind: RecordKind) -> None:
    """Make ``kind`` known under ``kind.name`` (a later registration of the same name replaces it)."""
    with _lock:
        _kinds[kind.name] = kind


def unregister(name: str) -> None:
    """Forget the kind registered as ``name`` (its records become plain text again)."""
    with _lock:
        _kinds.pop(name, None)


def register_builtin_kinds() -> None:
    """Register the kinds Memories ships: memories, cards, facts and conversations (in the order
    ``--kind`` lists them). Idempotent; called on the start-up path."""
    global _builtins_done
    with _lock:
        if _builtins_done:
            return
        for kind in (PlainKind("memory"), CardKind(), FactKind(), ConversationKind()):
            _kinds.setdefault(kind.name, kind)
        _builtins_done = True


def _registered() -> dict[str, RecordKind]:
    if not _builtins_done:
        register_builtin_kinds()
    return _kinds


def kind_of(name: str) -> RecordKind:
    """The kind registered as ``name``; a kind nobody registered is plain text."""
    got = _registered().get(name)
    return got if got is not None else PlainKind(name)


def kind_names() -> tuple[str, ...]:
    """Every registered kind's name, in registration order: what ``--kind`` takes."""
    return tuple(_registered())


def kinds() -> tuple[RecordKind, ...]:
    """Every registered kind, in registration order."""
    return tuple(_registered().values())


__all__ = [
    "kind_names",
    "kind_of",
    "kinds",
    "register",
    "register_builtin_kinds",
    "unregister",
]
