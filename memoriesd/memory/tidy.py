"""Tidy over time: condense old records into a summary (``memory summarize``), prune stale facts
(``memory prune``). Both run only when asked (nothing is scheduled) and both list before they act:
without ``apply`` they write nothing.

**Age.** A record is older than N days when its time is at least N days before now (``0``: every
record). A fact's time is its last revision (``updated``: when it was last stated); a
conversation's is its session date when known (``meta.conversation.date``, else
``meta.session_date``: a session captured today may have happened long ago), else its last
revision. Private records are never candidates: they are never sent to a model, and ``prune``
leaves them to ``memory forget --id`` (a private fact is never recalled, so ``--never-recalled``
would always take it).

**Summarize.** The current, non-private records of the kind (``conversation`` by default, or
``fact``) older than N days are taken oldest first and cut into batches of at most
``batch_tokens`` tokens of record text (counted as ``rag context`` counts: the local model's
tokenizer, else the estimate), so no request grows without bound; a record longer than that on its
own is left as it is, and at most :data:`MAX_BATCHES` batches are done per run (the rest wait for
the next run). Each batch is sent to the ``[generation]`` service as untrusted data
(:mod:`.summary_prompt`) after the vault's device-only policy allowed it, and its reply is checked
strictly. Only when every batch has a valid summary, and none of the originals changed meanwhile,
is one record per batch written, and, under the same store lock hold, the originals are forgotten
exactly as ``memory forget`` does (:func:`memoriesd.memory.forget.purge`: every revision,
sidecars, snapshot, counters). A failed or malformed reply writes and forgets nothing.

A summary is a record of kind ``memory`` tagged ``summary``, titled with what and when it
condenses ("Summary of 12 conversations, 2023-05-08 to 2023-06-20"), whose body is the model's
text and whose metadata (sealed like all metadata) holds ``summarized``: ``{"kind", "from", "to"
(local days of the oldest and newest original), "replaced" (how many records), "tokens" (their
token total)}``, plus ``speakers`` (the conversations' speakers, searchable) when there were any.

**Prune.** Current, non-private facts matching every criterion given (at least one):
``older_than`` days (by ``updated``), ``below_importance`` (importance < F), ``never_recalled``
(a recall count of 0, :mod:`.recalls`); forgotten the same real way.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import DeviceOnly, GenerationNotConfigured, UsageError
from ..kinds.fact import KIND as FACT
from ..kinds.fact import category_of
from ..vault.live import LiveVault, VaultLock
from ..vault.records import Record, new_record_id, now
from ..vault.store import VaultStore
from .facts import fact_view, importance_of
from .forget import SNIPPET, purge
from .summary_prompt import SourceRecord, build_summary_prompt, parse_summary

if TYPE_CHECKING:
    from ..rag.engine import RagEngine
    from ..rag.host import Host, Work
    from .recalls import Recalls

#: Kinds ``memory summarize`` condenses (the first is the default).
SUMMARIZE_KINDS = ("conversation", FACT)
SUMMARY_KIND = "memory"
SUMMARY_TAG = "summary"
META_KEY = "summarized"
DAY_SECONDS = 86_400
MAX_DAYS = 100 * 366
DEFAULT_BATCH_TOKENS = 6000
MIN_BATCH_TOKENS = 200
MAX_BATCH_TOKENS = 100_000
#: Batches (generation requests) of one ``memory summarize --apply``; later ones wait for another run.
MAX_BATCHES = 16
#: Tokens a record's ``<source ...>`` wrapping adds to its text in the prompt.
SOURCE_OVERHEAD = 16
NOT_CONFIGURED = (
    "no generation service is configured: add a [generation] table (protocol, url, model, api_key_env) "
    "to config.toml and restart the daemon (see config.example.toml)"
)


# ---------------------------------------------------------------------------- time


def _parse_time(value: object) -> float | None:
    """Unix time of an ISO date or datetime (naive: local time), or None."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return datetime.fromisoformat(value.strip()).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def record_time(rec: Record) -> float:
    """The time a record's age counts from (module docstring)."""
    if rec.kind == "conversation":
        conv = rec.meta.get("conversation")
        for value in (conv.get("date") if isinstance(conv, dict) else None, rec.meta.get("session_date")):
            t = _parse_time(value)
            if t is not None:
                return t
    return rec.updated


def day_of(t: float) -> str:
    """The local day of a Unix time, ``YYYY-MM-DD``."""
    return datetime.fromtimestamp(t).date().isoformat()


def record_day(rec: Record, when: float) -> str:
    """The day shown for a record: a conversation's session day as captured, else the local day of ``when``."""
    day = rec.meta.get("session_date") if rec.kind == "conversation" else None
    if isinstance(day, str) and len(day) == 10 and day[4] == "-" and day[7] == "-":
        return day
    return day_of(when)


def check_days(days: int | None, option: str = "--older-than") -> None:
    if days is not None and not 0 <= days <= MAX_DAYS:
        raise UsageError(f"{option} takes a number of days from 0 to {MAX_DAYS:,}")


def cutoff(days: int, at: float) -> float:
    """Records whose time is at or before this are older than ``days``."""
    return at - days * DAY_SECONDS


# ---------------------------------------------------------------------------- summarize: plan


@dataclass
class Candidate:
    record: Record
    when: float
    day: str = ""
    tokens: int = 0
    batch: int | None = None  # 1-based batch of this run; None: left as it is (too long, or a later run)

    def source(self) -> SourceRecord:
        r = self.record
        title = r.title or (f"{category_of(r)} fact" if r.kind == FACT else r.kind)
        return SourceRecord(title, self.day, r.body)

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        text = " ".join(r.body.split())
        return {
            "id": r.id,
            "kind": r.kind,
            "title": r.title,
            "text": text[: SNIPPET - 1] + "…" if len(text) > SNIPPET else text,
            "day": self.day,
            "tokens": self.tokens,
            "batch": self.batch,
        }


@dataclass
class Plan:
    candidates: list[Candidate]
    batches: list[list[Candidate]]  # done by this run
    too_long: list[Candidate] = field(default_factory=list)
    later: list[Candidate] = field(default_factory=list)  # in batches beyond MAX_BATCHES

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.candidates)


def select_old(store: VaultStore, kind: str, days: int, at: float) -> list[Candidate]:
    """Current, non-private records of ``kind`` older than ``days``, oldest first."""
    if kind not in SUMMARIZE_KINDS:
        raise UsageError(f"--kind takes {' or '.join(SUMMARIZE_KINDS)}")
    check_days(days)
    limit = cutoff(days, at)
    out = [Candidate(r, t, record_day(r, t)) for r in store.latest() if r.kind == kind and not r.private for t in (record_time(r),)]
    return sorted((c for c in out if c.when <= limit), key=lambda c: (c.when, c.record.id))


def plan(candidates: list[Candidate], count: Callable[[str], int], batch_tokens: int) -> Plan:
    """Consecutive batches (oldest first) of at most ``batch_tokens`` tokens of record text each."""
    if not MIN_BATCH_TOKENS <= batch_tokens <= MAX_BATCH_TOKENS:
        raise UsageError(f"--batch-tokens takes {MIN_BATCH_TOKENS} to {MAX_BATCH_TOKENS:,}")
    batches: list[list[Candidate]] = []
    too_long: list[Candidate] = []
    current: list[Candidate] = []
    used = 0
    for c in candidates:
        c.tokens = count(c.record.title + "\n" + c.record.body) if c.record.title else count(c.record.body)
        cost = c.tokens + SOURCE_OVERHEAD
        if cost > batch_tokens:
            too_long.append(c)
            continue
        if current and used + cost > batch_tokens:
            batches.append(current)
            current, used = [], 0
        current.append(c)
        used += cost
    if current:
        batches.append(current)
    later = [c for b in batches[MAX_BATCHES:] for c in b]
    batches = batches[:MAX_BATCHES]
    for i, b in enumerate(batches, 1):
        for c in b:
            c.batch = i
    return Plan(candidates, batches, too_long, later)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary_record(kind: str, batch: list[Candidate], text: str) -> Record:
    """The record that replaces ``batch`` (module docstring)."""
    first, last = min(c.day for c in batch), max(c.day for c in batch)
    period = first if first == last else f"{first} to {last}"
    meta: dict[str, Any] = {
        META_KEY: {
            "kind": kind,
            "from": first,
            "to": last,
            "replaced": len(batch),
            "tokens": sum(c.tokens for c in batch),
        }
    }
    speakers: dict[str, None] = {}
    for c in batch:
        value = c.record.meta.get("speakers")
        if isinstance(value, list):
            speakers.update((str(s), None) for s in value if isinstance(s, str) and s.strip())
    if speakers:
        meta["speakers"] = list(speakers)
    t = now()
    title = f"Summary of {_plural(len(batch), kind)}, {period}"
    return Record(new_record_id(), 1, SUMMARY_KIND, title, text, False, (SUMMARY_TAG,), meta=meta, created=t, updated=t)


# ---------------------------------------------------------------------------- summarize: run


@dataclass
class SummarizeRequest:
    kind: str = SUMMARIZE_KINDS[0]
    older_than: int = 0
    apply: bool = False
    batch_tokens: int = DEFAULT_BATCH_TOKENS


def _generation_notice(engine: RagEngine, store: VaultStore) -> str | None:
    """Why ``--apply`` would be refused, if it would."""
    gen = engine.config.generation
    if not gen.configured:
        return NOT_CONFIGURED.replace("no generation service is configured", "--apply needs a generation service")
    try:
        engine.check_remote_policy(store, gen.url, "generation")
    except DeviceOnly as exc:
        return exc.message
    return None


def _unchanged(store: VaultStore, revisions: dict[str, int], ctx: Work) -> Callable[[], None]:
    """A check that raises when the vault locked, the request ended, or an original changed."""
    from ..rag.ask import unchanged_check

    return unchanged_check(
        store, revisions, ctx,
        locked="was locked while the summary was pending: nothing was written or forgotten",
        changed="a record changed while the summary was pending: nothing was written or forgotten; run it again",
    )


def summarize(app: Host, vault: LiveVault, req: SummarizeRequest, ctx: Work) -> dict[str, Any]:
    """List the candidates (and without ``apply`` stop there), or replace them with summaries."""
    store = vault.store
    from ..rag.ask import _run_cancellable
    from ..rag.providers import Generator
    from .packs import _counter

    engine = app.rag
    at = time.time()
    count = _counter(engine)
    p = plan(select_old(store, req.kind, req.older_than, at), count, req.batch_tokens)
    notices: list[str] = []
    if p.too_long:
        notices.append(
            f"{_plural(len(p.too_long), 'record')} longer than --batch-tokens {req.batch_tokens:,} on its own "
            "is left as it is: raise --batch-tokens to include it"
        )
    if p.later:
        notices.append(f"{_plural(len(p.later), 'more record')} beyond {MAX_BATCHES} batches wait for another run")
    out: dict[str, Any] = {
        "vault_id": store.vault_id,
        "kind": req.kind,
        "older_than_days": req.older_than,
        "dry_run": not req.apply,
        "candidates": [c.to_dict() for c in p.candidates],
        "tokens": p.tokens,
        "tokenizer": count.kind,
        "batches": [
            {"batch": i, "records": len(b), "tokens": sum(c.tokens for c in b), "from": min(c.day for c in b), "to": max(c.day for c in b)}
            for i, b in enumerate(p.batches, 1)
        ],
        "summaries": [],
        "forgotten": 0,
        "notices": notices,
    }
    if not req.apply:
        why = _generation_notice(engine, store) if p.batches else None
        if why:
            notices.append(why)
        return out
    gen = engine.config.generation
    if not gen.configured:
        raise GenerationNotConfigured(NOT_CONFIGURED)
    engine.check_remote_policy(store, gen.url, "generation")  # before any connection
    if not p.batches:
        return out
    revisions = {c.record.id: c.record.revision for b in p.batches for c in b}
    unchanged = _unchanged(store, revisions, ctx)
    generator = Generator(engine.http_client(), gen, os.environ)
    what = req.kind + "s"
    texts: list[str] = []
    for b in p.batches:
        system, user = build_summary_prompt(what, [c.source() for c in b])

        def ask(system: str = system, user: str = user) -> str:
            return generator.generate(system, user, before_attempt=unchanged)

        texts.append(parse_summary(_run_cancellable(ask, unchanged)))
    records = [summary_record(req.kind, b, text) for b, text in zip(p.batches, texts, strict=True)]

    def write_summaries() -> None:
        # Run by purge() under the store lock right before the originals' deletions are committed:
        # the summaries and the deletions are one step for every other writer.
        unchanged()
        store.commit(records)

    # No capture revises a conversation, nor remember a fact, between the check and the deletions.
    with vault.hold(*((VaultLock.CAPTURE,) if req.kind == "conversation" else ()), VaultLock.FACTS):
        out.update(purge(app, vault, list(revisions), check=write_summaries, notices=out["notices"]))
    out["summaries"] = [
        {"id": r.id, "title": r.title, **{k: r.meta[META_KEY][k] for k in ("from", "to", "replaced", "tokens")}}
        for r in records
    ]
    return out


# ---------------------------------------------------------------------------- prune


@dataclass
class PruneRequest:
    older_than: int | None = None
    below_importance: float | None = None
    never_recalled: bool = False
    apply: bool = False

    def check(self) -> None:
        if self.older_than is None and self.below_importance is None and not self.never_recalled:
            raise UsageError("say which facts are stale: --older-than DAYS, --below-importance F and/or --never-recalled")
        check_days(self.older_than)
        if self.below_importance is not None and not 0.0 <= self.below_importance <= 1.0:
            raise UsageError("--below-importance is a number from 0 to 1")


def select_stale(store: VaultStore, recalls: Recalls, req: PruneRequest, at: float) -> list[dict[str, Any]]:
    """Current, non-private facts matching every criterion of ``req``, oldest first (as fact views)."""
    req.check()
    limit = cutoff(req.older_than, at) if req.older_than is not None else None
    out = []
    for r in sorted(store.latest(), key=lambda r: (r.updated, r.id)):
        if r.kind != FACT or r.private:
            continue
        if limit is not None and r.updated > limit:
            continue
        if req.below_importance is not None and not importance_of(r) < req.below_importance:
            continue
        counted = recalls.get(r.id)
        if req.never_recalled and counted[0] > 0:
            continue
        out.append(fact_view(r, counted))
    return out


def prune(app: Host, vault: LiveVault, req: PruneRequest, ctx: Work) -> dict[str, Any]:
    """List the stale facts (and without ``apply`` stop there), or forget them for real."""
    from .recalls import recalls_of

    store = vault.store
    req.check()
    with vault.hold(VaultLock.FACTS):
        records = select_stale(store, recalls_of(vault), req, time.time())
        out: dict[str, Any] = {
            "vault_id": store.vault_id,
            "dry_run": not req.apply,
            "criteria": {"older_than_days": req.older_than, "below_importance": req.below_importance, "never_recalled": req.never_recalled},
            "records": records,
            "forgotten": 0,
        }
        if not req.apply or not records:
            return out
        ctx.check_cancelled()
        notices: list[str] = []
        out.update(purge(app, vault, [r["id"] for r in records], check=ctx.check_cancelled, notices=notices))
        if notices:
            out["notices"] = notices
    return out


__all__ = [
    "DEFAULT_BATCH_TOKENS",
    "MAX_BATCHES",
    "META_KEY",
    "SUMMARIZE_KINDS",
    "SUMMARY_TAG",
    "PruneRequest",
    "SummarizeRequest",
    "day_of",
    "plan",
    "prune",
    "record_time",
    "select_old",
    "select_stale",
    "summarize",
]
