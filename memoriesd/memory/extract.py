"""Extraction: from a captured conversation to facts (``memory extract``, and after ``memory capture``).

**Which path.** ``model``: the ``[generation]`` service reads the transcript (turns labelled
T1…Tn, sent as untrusted data, :mod:`.extract_prompt`) and must reply with strict JSON: a 2–3
sentence summary and facts, decisions, actions and preferences, each citing the turns it comes from.
``patterns``: the rules of :mod:`.patterns`, without any model. ``auto`` (the default) takes the model
when one is configured and allowed, else the patterns, and says why in a notice: no generation
service; a device-only vault whose generation URL is not on this device (nothing is sent; the rules
run locally); a grant without the ``ask`` scope filing a conversation (its text goes to the
generation service only with ``ask``, as for ``rag ask``). Asking for ``model`` when it cannot run is
an error (``generation_not_configured``, ``device_only``).

**Bounds.** At most :data:`MAX_SEND_TOKENS` tokens of turns are sent (counted as ``rag context``
counts): a longer transcript sends its last turns, and a notice says which; the pattern rules read
every turn. A private conversation is never extracted (its facts would be searchable).

**What is written.** A malformed reply (not one JSON object, an unknown key, a wrong type, a cited
turn that was not sent, too many items...) is an ``invalid_model_output`` error and nothing is
written, as for ``rag ask``. Each accepted item goes through :func:`memoriesd.memory.facts.remember`
(exact repeats unchanged, same key revised, similar text merged) with ``meta["from"] =
{"conversation": id, "revision": n, "turns": ["T12", ...]}`` (an action is a fact tagged ``action``);
the model's summary becomes the conversation's ``meta["summary"]`` (indexed) in a new revision
with the same body. All of it under the vault's ``capture`` then ``facts`` mutexes, and only if the
conversation is still the revision that was read.

Result: ``{"path": "model"|"patterns"|"off", "record": {id, revision}, "summary", "facts": [remember
outcomes with their text and turns], "rejected", "sent": {turns, of, tokens} | null, "notices"}``;
``rejected`` counts the items that ``remember`` refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import Cancelled, DeviceOnly, GenerationNotConfigured, NotFound, UsageError
from ..kinds.turns import KIND, turn_spans
from ..urls import host_of, is_loopback_url
from ..vault.live import LiveVault, VaultLock
from ..vault.records import Record, now
from ..vault.store import VaultStore
from .extract_prompt import Extraction, Item, PromptTurn, build_extract_prompt, parse_extraction
from .facts import MAX_KEY, RememberRequest, normalise_key, remember
from .patterns import USER_ROLES, extract_patterns, is_assistant

if TYPE_CHECKING:
    from ..rag.host import Host, Work

__all__ = ["MAX_SEND_TOKENS", "PATHS", "ExtractRequest", "extract", "extract_enabled", "model_refusal", "record_turns"]

PATHS = ("auto", "model", "patterns")
#: Most tokens of transcript one generation request carries (the last turns of a longer one).
MAX_SEND_TOKENS = 6000
#: Setting of the per-vault switch (default on): `memories vault policy VAULT --extract/--no-extract`.
SETTING = "policy.extract"
ACTION_TAG = "action"
NOT_CONFIGURED = (
    "no generation service is configured: add a [generation] table (protocol, url, model, api_key_env) "
    "to config.toml and restart the daemon, or extract with the pattern rules (--patterns)"
)


@dataclass
class ExtractRequest:
    record_id: str
    path: str = "auto"
    skip_private: bool = False  # a grant's capture: private facts are neither matched nor revised
    model_allowed: bool = True  # False: a grant without the ask scope (module docstring)


@dataclass
class _Plan:
    path: str
    notices: list[str] = field(default_factory=list)


def extract_enabled(store: VaultStore) -> bool:
    """The vault's switch (default on)."""
    return bool(store.settings.get(SETTING, True))


def record_turns(rec: Record) -> list[PromptTurn]:
    """The turns of a conversation record (from its turn metadata), or ``usage`` when it has none."""
    if rec.kind != KIND:
        raise UsageError(
            f"record {rec.id} is a {rec.kind}, not a conversation: extraction reads conversations stored with "
            "`memories memory capture`"
        )
    spans = turn_spans(rec)
    if spans is None:
        raise UsageError(f"record {rec.id} no longer has readable turns (edited by hand?): capture the conversation again")
    data = rec.body.encode("utf-8")
    out = []
    for s in spans:
        block = data[s.start : s.end].decode("utf-8", "replace")
        out.append(PromptTurn(s.id, s.speaker, block[len(s.speaker) + 1 :].strip()))
    return out


def model_refusal(app: Host, store: VaultStore) -> tuple[str, str] | None:
    """Why the model path cannot run for this vault, as ``(code, message)``; None when it can."""
    gen = app.config.generation
    if not gen.configured:
        return "generation_not_configured", NOT_CONFIGURED
    if bool(store.settings.get("policy.device_only", False)) and not is_loopback_url(gen.url):
        host = host_of(gen.url) or "(malformed URL)"
        return "device_only", (
            f"this vault is device-only, so its conversations may not be sent to the generation service at {host}: "
            "use a service on this device (127.0.0.1, ::1, localhost), extract with the pattern rules (--patterns), "
            "or change the vault's device-only policy"
        )
    return None


def _plan(app: Host, store: VaultStore, req: ExtractRequest) -> _Plan:
    if req.path not in PATHS:
        raise UsageError(f"the extraction path is one of {', '.join(PATHS)}")
    if req.path == "patterns":
        return _Plan("patterns")
    refusal = model_refusal(app, store)
    if req.path == "model":
        if refusal is not None:
            code, message = refusal
            raise DeviceOnly(message) if code == "device_only" else GenerationNotConfigured(message)
        return _Plan("model")
    if refusal is not None:
        code, message = refusal
        why = "no generation service is configured" if code == "generation_not_configured" else (
            f"device_only: the vault is device-only and the generation service at {host_of(app.config.generation.url)} "
            "is not on this device, so nothing was sent"
        )
        return _Plan("patterns", [f"{why}: the pattern rules ran instead"])
    if not req.model_allowed:
        return _Plan("patterns", ["this grant lacks the ask scope, so the conversation was not sent to the generation service: the pattern rules ran instead"])
    return _Plan("model")


# ---------------------------------------------------------------------------- the model path


def _select(turns: list[PromptTurn], count: Callable[[str], int], budget: int) -> tuple[list[PromptTurn], int, int]:
    """The last turns that fit in ``budget`` tokens (the last one cut to its end when it alone is
    over), their tokens, and the whole transcript's tokens."""
    costs = [count(f"{t.speaker}: {t.text}") + 8 for t in turns]  # 8: the <turn ...> wrapping
    total = sum(costs)
    chosen: list[PromptTurn] = []
    used = 0
    for t, c in zip(reversed(turns), reversed(costs), strict=True):
        if used + c > budget:
            break
        chosen.append(t)
        used += c
    if not chosen and turns:
        last = turns[-1]
        text = last.text
        while text and count(f"{last.speaker}: {text}") + 8 > budget:
            text = text[len(text) // 4 :]  # keep the end: what was said last
        chosen, used = [PromptTurn(last.id, last.speaker, "…" + text)], count(text) + 8
    chosen.reverse()
    return chosen, used, total


def _ask_model(app: Host, store: VaultStore, rec: Record, turns: list[PromptTurn], ctx: Work, notices: list[str]) -> tuple[Extraction, dict[str, Any]]:
    from ..rag.ask import _run_cancellable
    from ..rag.providers import Generator
    from .packs import _counter

    gen = app.config.generation
    app.rag.check_remote_policy(store, gen.url, "generation")  # before any connection
    count = _counter(app.rag)
    chosen, used, total = _select(turns, count, MAX_SEND_TOKENS)
    if len(chosen) < len(turns) or (chosen and chosen[-1].text != turns[-1].text):
        notices.append(
            f"the transcript is ~{total:,} tokens, over the {MAX_SEND_TOKENS:,} one extraction sends: only its last "
            f"{len(chosen)} of {len(turns)} turns ({chosen[0].id} to {chosen[-1].id}) were sent to the model"
        )
    system, user = build_extract_prompt(rec.title, rec.meta.get("session_when") or rec.meta.get("session_date"), chosen, len(turns))

    def check() -> None:
        if store.closed:
            raise Cancelled(f"vault {store.name} was locked while the extraction was pending: nothing was written")
        ctx.check_cancelled()
        if _revision(store, rec.id) != rec.revision:
            raise Cancelled("the conversation changed while the extraction was pending: nothing was written; run it again")

    generator = Generator(app.rag.http_client(), gen, os.environ)
    raw = _run_cancellable(lambda: generator.generate(system, user, before_attempt=check), check)
    sent = {"turns": len(chosen), "of": len(turns), "tokens": used, "tokenizer": count.kind}
    return parse_extraction(raw, [t.id for t in chosen]), sent


def _own_key(item: Item, turns: list[PromptTurn]) -> Item:
    """A model's key, prefixed with the speaker's name when every cited turn is one named person's
    (not "user", not an assistant): two people's tastes never revise each other, as with the patterns."""
    if item.key is None:
        return item
    by_id = {t.id: t.speaker for t in turns}
    people = {by_id[t] for t in item.turns if t in by_id and not is_assistant(by_id[t])}
    if len(people) != 1:
        return item
    name = " ".join(next(iter(people)).split())
    if name.casefold() in USER_ROLES or normalise_key(item.category, item.key).startswith(normalise_key(item.category, name) + "-"):
        return item
    return replace(item, key=f"{name} {item.key}"[:MAX_KEY])


def _revision(store: VaultStore, rid: str) -> int:
    try:
        return store.get(rid).revision
    except NotFound:
        return -1


# ---------------------------------------------------------------------------- writing


def _with_summary(rec: Record, summary: str) -> Record:
    meta = dict(rec.meta)
    meta["summary"] = summary
    return Record(rec.id, rec.revision + 1, rec.kind, rec.title, rec.body, rec.private, rec.tags, meta=meta,
                  private_meta=rec.private_meta, created=rec.created, updated=now())


def _write(app: Host, vault: LiveVault, rec: Record, items: list[Item], summary: str | None, req: ExtractRequest, ctx: Work) -> tuple[list[dict[str, Any]], int, bool]:
    """Remember ``items`` and store ``summary``; ``(outcomes, rejected, anything changed)``."""
    store = vault.store
    outcomes: list[dict[str, Any]] = []
    rejected = 0
    changed = False
    with vault.hold(VaultLock.CAPTURE, VaultLock.FACTS):
        if _revision(store, rec.id) != rec.revision:
            raise Cancelled("the conversation changed while it was being extracted: nothing was written; run it again")
        for item in items:
            source = {"conversation": rec.id, "revision": rec.revision, "turns": list(item.turns)}
            r = RememberRequest(item.text, item.category, item.key, item.importance, (ACTION_TAG,) if item.action else (),
                                skip_private=req.skip_private, source=source)
            try:
                outcome = remember(app.rag, vault, r, ctx)
            except UsageError:
                rejected += 1
                continue
            changed = changed or outcome.action != "unchanged"
            outcomes.append({**outcome.to_dict(), "text": outcome.record.body, "turns": list(item.turns)})
        if summary is not None and rec.meta.get("summary") != summary:
            with store.exclusive():
                ctx.check_cancelled()
                current = store.get(rec.id)
                if current.revision != rec.revision:
                    raise Cancelled("the conversation changed while it was being extracted: its summary was not written; run it again")
                store.commit([_with_summary(current, summary)])
            changed = True
    return outcomes, rejected, changed


def extract(app: Host, vault: LiveVault, req: ExtractRequest, ctx: Work) -> dict[str, Any]:
    """Extract from one conversation record (module docstring)."""
    store = vault.store
    plan = _plan(app, store, req)
    rec = store.get(req.record_id)
    if rec.private:
        raise UsageError(
            f"conversation {rec.id} is private: nothing is extracted from it (its facts would be searchable); "
            "make it non-private first if you want its facts"
        )
    turns = record_turns(rec)
    notices = list(plan.notices)
    sent: dict[str, Any] | None = None
    summary: str | None = None
    if plan.path == "model":
        got, sent = _ask_model(app, store, rec, turns, ctx, notices)
        summary, items = got.summary, [_own_key(i, turns) for i in got.items]
    else:
        items = [
            Item(f.category, f.key, f.text, None, f.turns)
            for f in extract_patterns(turns)
        ]
    ctx.check_cancelled()
    outcomes, rejected, changed = _write(app, vault, rec, items, summary, req, ctx)
    if changed and app.rag is not None:
        app.rag.background.request(store.vault_id)  # the facts and the summary are indexed like any change
    if not items:
        notices.append(
            "nothing to remember was found" + (" (the pattern rules only read plain first-person preferences, decisions and habits)" if plan.path == "patterns" else "")
        )
    return {
        "path": plan.path,
        "record": {"id": rec.id, "revision": rec.revision},
        "summary": summary,
        "facts": outcomes,
        "rejected": rejected,
        "sent": sent,
        "notices": notices,
    }
