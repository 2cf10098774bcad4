"""`ask`: retrieve, send only the selected fragments and the question, validate the citations.

One core function, :func:`ask`, serves `memories rag ask` and the MCP tool `memory_ask`. Lock,
auto-lock, a grant's expiry or revocation (``ctx.checks``), or a change to a source record while
the generation call is in flight cancel the ask and drop a late answer (code ``cancelled``).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import Cancelled, GenerationNotConfigured, NotFound
from ..vault.live import LiveVault
from ..vault.store import VaultStore
from .engine import RagEngine
from .grounding import grounded_answer
from .host import Work
from .search import SearchRequest, run_search

POLL_SECONDS = 0.05
_T = TypeVar("_T")


def _run_cancellable(fn: Callable[[], _T], check: Callable[[], None]) -> _T:
    """Run ``fn`` in a thread; return its result, or raise as soon as ``check()`` raises.

    A request already sent cannot be recalled; its late answer is simply dropped.
    """
    box: queue.Queue[tuple[_T] | BaseException] = queue.Queue(maxsize=1)  # (result,) or what fn raised

    def target() -> None:
        try:
            box.put((fn(),))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box.put(exc)

    threading.Thread(target=target, name="memoriesd-ask", daemon=True).start()
    while True:
        check()
        try:
            got = box.get(timeout=POLL_SECONDS)
        except queue.Empty:
            continue
        check()  # a late answer after a lock/revoke/change is dropped
        if isinstance(got, BaseException):
            raise got
        return got[0]


def unchanged_check(
    store: VaultStore, revisions: dict[str, int], ctx: Work, *, locked: str, changed: str
) -> Callable[[], None]:
    """A check for work that waits on a model: it raises :class:`Cancelled` when the vault was locked
    (``vault NAME <locked>``), the request ended, or a record of ``revisions`` changed (``changed``)."""

    def check() -> None:
        if store.closed:
            raise Cancelled(f"vault {store.name} {locked}")
        ctx.check_cancelled()
        for rid, rev in revisions.items():
            try:
                current = store.get(rid).revision
            except NotFound:
                current = -1
            if current != rev:
                raise Cancelled(changed)

    return check


def _insufficient(mode: str, notices: list[str]) -> dict[str, Any]:
    return {"status": "insufficient_evidence", "answer": "", "mode": mode, "citations": [], "notices": notices}


def ask(engine: RagEngine, vault: LiveVault, question: str, req: SearchRequest, ctx: Work) -> dict[str, Any]:
    store = vault.store
    gen_cfg = engine.config.generation
    if not gen_cfg.configured:
        raise GenerationNotConfigured(
            "no generation service is configured: add a [generation] table (protocol, url, model, api_key_env) "
            "to config.toml and restart the daemon (see config.example.toml)"
        )
    engine.check_remote_policy(store, gen_cfg.url, "generation")
    req.query = question
    # Vector search always has nearest neighbours; below the model's evidence floor they are not
    # evidence, so a question nothing in the vault speaks to is never sent to the generation service.
    req.evidence_floor = True
    outcome = run_search(engine, vault, req, ctx)
    if not outcome.hits:
        return _insufficient(outcome.mode, outcome.notices)

    sources = []
    meta = []
    for c in outcome.hits:
        got = outcome.fragment(c.frag_id)
        if got is None:
            continue
        doc, frag = got
        sources.append((doc.title, frag.text))
        meta.append((doc, frag))
    revisions = {doc.record_id: doc.revision for doc, _ in meta}

    check = unchanged_check(
        store, revisions, ctx,
        locked="was locked while the answer was pending: the late answer was dropped",
        changed="a source record changed while the answer was pending: ask again",
    )

    from .providers import Generator

    generator = Generator(engine.http_client(), gen_cfg, os.environ)
    answer = _run_cancellable(lambda: grounded_answer(generator, question, sources, before_attempt=check), check)
    citations = []
    for i in answer.cited_indices():
        doc, frag = meta[i]
        citations.append(
            {
                "label": answer.labels[i],
                "record_id": doc.record_id,
                "revision": doc.revision,
                "title": doc.title,
                "start": frag.start,
                "end": frag.end,
                "source": doc.source,
                "line": outcome.line(doc, frag.start),
            }
        )
    if answer.parsed.insufficient and not citations:
        # The service read the sources and found no answer there: its uncited sentence is not kept.
        return _insufficient(outcome.mode, [*outcome.notices, f"the generation service found no answer in the {len(sources)} sources it was sent"])
    return {
        "status": "answered",
        "answer": answer.parsed.answer,
        "mode": outcome.mode,
        "citations": citations,
        "notices": outcome.notices,
    }
