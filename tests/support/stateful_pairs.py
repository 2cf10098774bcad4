"""The two-at-once steps of :class:`.stateful.Machine`: two requests on two connections, released together.

Each takes the machine, a vault model and hypothesis's ``data``; the model accepts whichever order
the daemon chose, and learns from the replies (a reply it cannot explain fails the step).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from .live import Reply
from .stateful_model import Rec, Steps, VaultModel, both, token


def _add(m: Steps, v: VaultModel, data: st.DataObject) -> tuple[Callable[[], Reply], str]:
    tok = token()
    body = m.body(data, tok)
    return (lambda: m.req("memory.add", {"vault": v.vid, "body": body})), tok


def _added(m: Steps, v: VaultModel, r: Any, tok: str, what: str) -> None:
    assert isinstance(r, Reply), f"{what}: {r!r}"
    if m.locked_or(v, r, what):
        v.records[r.result["id"]] = Rec("memory", 1, tok)


def add_add(m: Steps, v: VaultModel, data: st.DataObject) -> None:
    (a, ta), (b, tb) = _add(m, v, data), _add(m, v, data)
    ra, rb = both(a, b)
    _added(m, v, ra, ta, "add+add (first)")
    _added(m, v, rb, tb, "add+add (second)")


def update_update(m: Steps, v: VaultModel, data: st.DataObject) -> None:
    ids = v.of_kind("memory", "fact")
    if not ids:
        return add_add(m, v, data)
    rid = m.pick(data, ids)
    ta, tb = token(), token()
    ba, bb = m.body(data, ta), m.body(data, tb)  # drawn here: hypothesis draws only in the test's thread
    ra, rb = both(
        lambda: m.req("memory.update", {"vault": v.vid, "id": rid, "body": ba}),
        lambda: m.req("memory.update", {"vault": v.vid, "id": rid, "body": bb}),
    )
    assert isinstance(ra, Reply) and isinstance(rb, Reply), (ra, rb)
    if not v.unlocked:
        m.expect(ra, "vault_locked", "update while locked")
        m.expect(rb, "vault_locked", "update while locked")
        return
    m.expect(ra, None, "update+update")
    m.expect(rb, None, "update+update")
    rec = v.records[rid]
    revs = {ra.result["revision"]: ta, rb.result["revision"]: tb}
    assert sorted(revs) == [rec.revision + 1, rec.revision + 2], (revs, rec)
    rec.revision += 2
    rec.token = revs[rec.revision]


def lock_add(m: Steps, v: VaultModel, data: st.DataObject) -> None:
    add, tok = _add(m, v, data)
    was_unlocked = v.unlocked
    rl, ra = both(lambda: m.req("vault.lock", {"vault": v.vid}), add)
    assert isinstance(rl, Reply) and isinstance(ra, Reply), (rl, ra)
    m.expect(rl, None, "lock+add: lock")
    if was_unlocked and ra.code is None:
        v.records[ra.result["id"]] = Rec("memory", 1, tok)  # acknowledged before the lock: kept
    elif ra.code is not None:
        m.expect(ra, "vault_locked", "lock+add: add")
    v.unlocked = False


def _strong_kdf(m: Steps, v: VaultModel) -> bool:
    """Whether the vault's key is wrapped under the default Argon2id (64 MiB), so that unlock and
    passwd at once run two real derivations."""
    try:
        kdf = json.loads((m.d.home / "vaults" / v.vid / "header.json").read_text("utf-8"))["kdf"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return int(kdf.get("memory_kib", 0)) >= 65536


def unlock_passwd(m: Steps, v: VaultModel, data: st.DataObject) -> None:
    """The KDF runs twice (unlock, passwd) on one vault at once; with real Argon2id when the vault was
    created or re-keyed under the strong configuration."""
    new = data.draw(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=16))
    old = v.passphrase
    if _strong_kdf(m, v):  # the vault's own parameters (its plaintext header), not a timing
        m.stats.strong_kdf_ops += 1
    ru, rp = both(
        lambda: m.req("vault.unlock", {"vault": v.vid, "passphrase": old}),
        lambda: m.req("vault.passwd", {"vault": v.vid, "old": old, "new": new}),
    )
    assert isinstance(ru, Reply) and isinstance(rp, Reply), (ru, rp)
    m.expect(rp, None, "unlock+passwd: passwd")
    v.passphrase = new
    if ru.code is None:
        v.unlocked = True
    elif new != old:  # the unlock came second: the old passphrase no longer opens the vault
        m.expect(ru, "bad_passphrase", "unlock+passwd: unlock")
    else:
        raise AssertionError(f"unlock with the unchanged passphrase failed: {dict(ru)}")


def search_add(m: Steps, v: VaultModel, data: st.DataObject) -> None:
    live = v.of_kind("memory", "fact", "card")
    rid = m.pick(data, live) if live else None
    query = v.records[rid].token if rid else "zebra"
    add, tok = _add(m, v, data)
    rs, ra = both(lambda: m.req("memory.search", {"vault": v.vid, "query": query}), add)
    assert isinstance(rs, Reply), rs
    if m.locked_or(v, rs, "search+add: search") and rid:
        assert [x["id"] for x in rs.result["results"]] == [rid], (rs, rid)
    _added(m, v, ra, tok, "search+add: add")


def remember_forget(m: Steps, v: VaultModel, data: st.DataObject) -> None:
    ids = sorted(v.records)
    rid = m.pick(data, ids) if ids else None
    tok = token()
    text = f"the user {m.pick(data, ['plays', 'owns', 'visits'])} {tok}"
    calls = [lambda: m.req("memory.remember", {"vault": v.vid, "text": text})]
    if rid:
        calls.append(lambda: m.req("memory.forget", {"vault": v.vid, "ids": [rid]}))
    else:
        calls.append(lambda: None)
    rr, rf = both(*calls)
    assert isinstance(rr, Reply), rr
    if m.locked_or(v, rr, "remember+forget: remember"):
        m._remembered(v, rr, tok)
    if rid:
        assert isinstance(rf, Reply), rf
        if m.locked_or(v, rf, "remember+forget: forget"):
            assert rf.result["forgotten"] == 1, rf
            m._gone(v, rid, forgotten=True)


def compact_update(m: Steps, v: VaultModel, data: st.DataObject) -> None:
    ids = v.of_kind("memory", "fact")
    if not ids:
        add, tok = _add(m, v, data)
        rc, ra = both(lambda: m.req("vault.compact", {"vault": v.vid}), add)
        _added(m, v, ra, tok, "compact+add: add")
    else:
        rid = m.pick(data, ids)
        tok = token()
        body = m.body(data, tok)
        rc, ru = both(
            lambda: m.req("vault.compact", {"vault": v.vid}),
            lambda: m.req("memory.update", {"vault": v.vid, "id": rid, "body": body}),
        )
        assert isinstance(ru, Reply), ru
        if m.locked_or(v, ru, "compact+update: update"):
            v.records[rid].revision += 1
            v.records[rid].token = tok
    assert isinstance(rc, Reply), rc
    m.locked_or(v, rc, "compact+update: compact")


def kill_add(m: Steps, v: VaultModel, data: st.DataObject) -> None:
    """SIGKILL while an add is in flight: acknowledged, it must survive; unanswered, it may."""
    add, tok = _add(m, v, data)
    delay = data.draw(st.floats(0, 0.03))

    def killer() -> None:
        time.sleep(delay)
        m.d.kill9()
        return None

    ra, _ = both(add, killer)
    m.stats.kills += 1
    m.stats.restarts += 1
    if isinstance(ra, Reply) and ra.code is None:
        v.records[ra.result["id"]] = Rec("memory", 1, tok)
    elif isinstance(ra, Reply):
        m.expect(ra, "vault_locked", "kill+add: add")
    else:
        v.maybe.add(tok)  # unanswered: after the restart it is there (under an id we never saw) or not
    m.d.start()
    for x in m.vaults:
        x.unlocked = False


PAIRS: dict[str, Callable[[Steps, VaultModel, st.DataObject], None]] = {
    "add+add": add_add,
    "update+update": update_update,
    "lock+add": lock_add,
    "unlock+passwd": unlock_passwd,
    "search+add": search_add,
    "remember+forget": remember_forget,
    "compact+update": compact_update,
    "kill+add": kill_add,
}

__all__ = ["PAIRS"]
