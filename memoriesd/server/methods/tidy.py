"""Protocol methods that tidy memory over time: ``memory.summarize`` and ``memory.prune``.

Logic in :mod:`memoriesd.memory.tidy`. Both are owner-only (no grant scope in METHODS below):
an MCP grant cannot call them, whatever its scopes; they are the person's own `memories memory summarize` / `memory prune`. Nothing calls
them on a schedule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...memory.tidy import (
    DEFAULT_BATCH_TOKENS,
    MAX_BATCH_TOKENS,
    MAX_DAYS,
    MIN_BATCH_TOKENS,
    SUMMARIZE_KINDS,
    PruneRequest,
    SummarizeRequest,
    prune,
    summarize,
)
from ..context import Context
from ..method import Method

if TYPE_CHECKING:
    from ..app import App

def memory_summarize(app: App, ctx: Context) -> dict[str, Any]:
    """Condense old conversations (or facts) into summary records; ``apply`` false: only list them."""
    p = ctx.params
    vault = app.lease(ctx)
    store = vault.store
    req = SummarizeRequest(
        kind=p.choice("kind", SUMMARIZE_KINDS, SUMMARIZE_KINDS[0]),
        older_than=p.integer("older_than", lo=0, hi=MAX_DAYS),
        apply=p.flag("apply", False),
        batch_tokens=p.integer("batch_tokens", DEFAULT_BATCH_TOKENS, lo=MIN_BATCH_TOKENS, hi=MAX_BATCH_TOKENS),
    )
    out = summarize(app, vault, req, ctx)
    if out["summaries"] and app.rag is not None:
        app.rag.background.request(store.vault_id)  # the summaries are indexed like any new record
    return out


def memory_prune(app: App, ctx: Context) -> dict[str, Any]:
    """Forget stale facts for real; ``apply`` false: only list them."""
    p = ctx.params
    vault = app.lease(ctx)
    req = PruneRequest(
        older_than=p.integer("older_than", None, lo=0, hi=MAX_DAYS),
        below_importance=p.number("below_importance", None),
        never_recalled=p.flag("never_recalled", False),
        apply=p.flag("apply", False),
    )
    return prune(app, vault, req, ctx)



#: The methods this module serves (assembled into the daemon's table by memoriesd.main).
METHODS: list[Method[App]] = [
    Method("memory.summarize", memory_summarize),
    Method("memory.prune", memory_prune),
]

__all__ = ["memory_prune", "memory_summarize"]
