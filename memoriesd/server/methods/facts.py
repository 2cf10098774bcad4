"""Protocol methods of memory for assistants: remember facts, list them, forget for real, context packs.

``memory.remember``, ``memory.facts``, ``memory.forget`` and ``rag.context`` (logic in
:mod:`memoriesd.memory`). A grant connection may call ``memory.remember``, ``memory.forget`` and
``rag.context`` with the scopes of the same names (their ``scope`` in METHODS below): it never matches a
private fact, and forgets only records it may see.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import UsageError
from ...kinds.fact import CATEGORIES, KIND
from ...memory.facts import RememberRequest, current_facts, fact_view, remember
from ...memory.forget import QUERY_KINDS, SCOPES, Target, purge, select_all, select_ids, select_query
from ...memory.packs import build_pack
from ...memory.recalls import recalls_of
from ...memory.rewrite import RewriteRequest
from ...rag.search import MODES
from ...vault.live import VaultLock
from ...vault.records import KINDS
from ..context import Context
from ..method import Method
from .records import _changed, _tags

if TYPE_CHECKING:
    from ..app import App

#: How many records one `memory forget --id` may name.
MAX_IDS = 10_000
#: How many passed-over records (on a query's topic, of a kind it did not choose) a reply lists.
PASSED_OVER = 20



def memory_remember(app: App, ctx: Context) -> dict[str, Any]:
    """Add a fact, or revise the current fact it restates (``action``: added, updated, unchanged)."""
    p = ctx.params
    vault = app.lease(ctx)
    store = vault.store
    req = RememberRequest(
        text=p.text("text"),  # the length is checked by remember(), with a hint for long text
        category=p.choice("category", CATEGORIES, "fact"),
        key=p.text("key", None, max_len=1000),
        importance=p.number("importance", None),
        tags=_tags(p.texts("tags", [])),
        skip_private=ctx.grant is not None,  # an agent's fact never revises (nor reveals) a private one
    )
    with vault.hold(VaultLock.FACTS):
        outcome = remember(app.rag, vault, req, ctx)
    if outcome.action != "unchanged":
        _changed(app, store, outcome.record)
    return outcome.to_dict()


def memory_facts(app: App, ctx: Context) -> dict[str, Any]:
    """The current facts (optionally of one category) with their recall counters."""
    vault = app.lease(ctx)
    store = vault.store
    category = ctx.params.choice("category", CATEGORIES, None)
    order = {c: i for i, c in enumerate(CATEGORIES)}
    facts = sorted(current_facts(store, category), key=lambda r: (order.get(str(r.meta.get("category")), 99), -r.updated, r.id))
    recalls = recalls_of(vault)
    return {"facts": [fact_view(f, recalls.get(f.id)) for f in facts]}


def _forget_kinds(ctx: Context) -> tuple[str, ...] | None:
    """``kind``: one kind or a list of them (``--kind`` repeated), or None."""
    raw = ctx.params.raw.get("kind")
    if raw is None:
        return None
    if isinstance(raw, list):
        kinds = ctx.params.texts("kind")
        if not kinds or any(k not in KINDS for k in kinds):
            raise UsageError(f"--kind takes {', '.join(KINDS)}")
        return tuple(dict.fromkeys(kinds))
    return (ctx.params.choice("kind", KINDS),)


def memory_forget(app: App, ctx: Context) -> dict[str, Any]:
    """Forget records for real (see memoriesd.memory.forget); ``dry_run`` only lists them.

    A query chooses among facts and conversations unless ``kind`` names kinds; the records on the
    topic it passed over (notes, cards) are listed under ``passed_over`` (at most PASSED_OVER of
    them, ``passed_over_total`` counts all) and kept."""
    p = ctx.params
    vault = app.lease(ctx)
    store = vault.store
    ids = p.texts("ids", [])
    query = p.text("query", None, max_len=10_000)
    everything = p.flag("all", False)
    kinds = _forget_kinds(ctx)
    scope = p.choice("scope", SCOPES, "specific")
    dry_run = p.flag("dry_run", False)
    if sum((bool(ids), query is not None, everything)) != 1:
        raise UsageError(
            "say what to forget: --id ID (repeatable), --query TEXT [--scope specific|topic] [--kind K], or --all [--kind K]"
        )
    if kinds is not None and ids:
        raise UsageError("--kind goes with --query or --all: an --id names its record whatever its kind")
    if len(ids) > MAX_IDS:
        raise UsageError(f"at most {MAX_IDS:,} ids per forget")
    notices: list[str] = []
    passed: list[Target] = []
    with vault.hold(VaultLock.FACTS):
        if ids:
            targets = select_ids(store, ids)
        elif everything:
            targets = select_all(store, kinds)
        else:
            assert query is not None  # exactly one of ids, all, query (checked above)
            choice = select_query(app.rag, vault, query, scope, ctx, kinds)
            targets, notices, passed = choice.targets, choice.notices, choice.passed_over
        if ctx.grant is not None:
            from ..grants import granted_targets

            targets = granted_targets(app, ctx, targets, ids)
            passed = granted_targets(app, ctx, passed, [])
        out: dict[str, Any] = {
            "vault_id": store.vault_id,
            "vault": store.name,
            "dry_run": dry_run,
            "records": [t.to_dict() for t in targets],
            "notices": notices,
        }
        if query is not None:
            out["kinds"] = list(kinds or QUERY_KINDS)
            out["passed_over"] = [t.to_dict() for t in passed[:PASSED_OVER]]
            out["passed_over_total"] = len(passed)
        preserved = sum(1 for f in store.dir.glob("preserved-*") if f.is_file())
        if dry_run or not targets:
            out["preserved_files"] = preserved
            out["forgotten"] = 0
            return out
        ctx.check_cancelled()
        # Checked again under the store lock right before the deletions are committed: a grant revoked
        # or expired by then (or a client gone) forgets nothing.
        out.update(purge(app, vault, [t.record.id for t in targets], check=ctx.check_cancelled, notices=notices))
    return out


def rag_context(app: App, ctx: Context) -> dict[str, Any]:
    """A token-budgeted context pack for a query: profile first, then the most relevant memories."""
    from ..grants import verify
    from .search import search_filter

    vault = app.lease(ctx)
    p = ctx.params
    budget = p.integer("budget", app.config.context.budget)
    flt = search_filter(p)
    if p.flag("cards_only", False):  # a cards-only grant: the pack holds cards only
        flt = flt.only_cards()
    mode = p.choice("mode", MODES, None)
    # Rewriting sends the query to the generation service: a grant needs the ask scope for it (memory.rewrite).
    may_ask = ctx.grant is None or "ask" in verify(app, ctx.grant)[1].get("scopes", ())
    rewrite = RewriteRequest(p.flag("rewrite", None), allowed=may_ask)
    return build_pack(app, vault, p.text("query", max_len=10_000), budget, ctx, flt, mode, rewrite)



#: The methods this module serves (assembled into the daemon's table by memoriesd.main).
METHODS: list[Method[App]] = [
    Method("memory.remember", memory_remember, scope="remember", owner_only=False, grant_params=('text', 'category', 'key', 'importance')),
    Method("memory.facts", memory_facts),
    Method("memory.forget", memory_forget, scope="forget", owner_only=False, grant_params=('ids', 'query', 'scope', 'all', 'kind', 'dry_run')),
    Method("rag.context", rag_context, scope="context", owner_only=False, grant_params=('query', 'budget')),
]

__all__ = ["memory_facts", "memory_forget", "memory_remember", "rag_context", "KIND"]
