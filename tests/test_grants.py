"""Grants in the daemon: tokens, scopes, one vault, hidden records, lock, expiry, revoke, restart.

A real memoriesd on a temp home; grant connections speak the real protocol over its socket.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from memories_cli.grant_setup import parse_scopes, parse_ttl
from memoriesd.errors import UsageError
from memoriesd.vault.records import new_record_id

from .conftest import Daemon, create_vault, running_daemon, short_tmpdir, write_config

PASS = "correct horse"


@dataclass
class World:
    d: Daemon
    a: str  # vault A
    b: str  # vault B
    public: str
    private: str
    credential: str
    file: str
    card: str
    b_record: str


def seed(d: Daemon) -> World:
    a = create_vault(d, "alpha", PASS)
    b = create_vault(d, "beta", PASS)

    def add(vault: str, **kw: Any) -> str:
        return str(d.call("memory.add", {"vault": vault, **kw})["id"])

    public = add(a, title="Lighthouse", body="The lighthouse keeper feeds the zebra every morning.")
    private = add(a, title="Diary", body="zebra CANARYPRIVATE diary entry", private=True)
    credential = add(a, kind="credential", title="bank", body="zebra CANARYCRED pin 1234")
    data = base64.b64encode(b"zebra CANARYFILE bytes").decode()
    file = add(a, kind="file", data=data, filename="zebra.txt")
    d.call("rag.ingest", {"vault": a, "text": "Zebras are striped horses. The zebra card.", "title": "Zebra card"})
    card = next(r["id"] for r in d.call("memory.list", {"vault": a})["records"] if r["kind"] == "card")
    b_record = add(b, title="Beta note", body="zebra CANARYBETA in the other vault")
    return World(d, a, b, public, private, credential, file, card, b_record)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with running_daemon() as d:
        yield seed(d)


def grant(w: World, vault: str | None = None, **kw: Any) -> dict[str, Any]:
    return dict(w.d.call("grant.create", {"vault": vault or w.a, **kw}))


def present(w: World, token: str) -> tuple[socket.socket, dict[str, Any]]:
    s = w.d.connect(token=token)
    return s, w.d.request("session.grant", {"token": token}, sock=s)


def gcall(w: World, s: socket.socket, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return w.d.request(method, params or {}, sock=s)


def error(msg: dict[str, Any]) -> tuple[str, str]:
    assert "error" in msg, msg
    return msg["error"]["code"], msg["error"]["message"]


def ids_in(msg: dict[str, Any], key: str) -> set[str]:
    return {r[key] for r in msg["result"]["results"]}


def test_token_is_prefixed_random_and_the_home_keeps_only_a_keyed_hash(world: World) -> None:
    g = grant(world, label="laptop")
    token = g["token"]
    prefix, vault_id, grant_id, secret = token.split("_", 3)
    assert (prefix, vault_id, grant_id) == ("mg", world.a, g["grant_id"])
    assert len(base64.urlsafe_b64decode(secret + "=")) >= 32  # 256 bits
    assert g["scopes"] == ["search", "read", "retrieve"] and g["expires"] > time.time() + 23 * 3600
    s, _ = present(world, token)
    assert "result" in gcall(world, s, "memory.search", {"query": "zebra"})
    s.close()
    listed = world.d.call("grant.list", {"vault": world.a})
    assert token not in repr(listed) and secret not in repr(listed)
    mine = next(x for x in listed["grants"] if x["grant_id"] == grant_id)
    assert mine["label"] == "laptop" and mine["last_used"] is not None
    plain = hashlib.sha256(token.encode()).hexdigest().encode()
    for p in world.d.home.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert secret.encode() not in data and plain not in data, p


def test_a_grant_connection_may_call_only_granted_methods(world: World) -> None:
    s, ok = present(world, grant(world, scopes=["search", "read", "retrieve", "ask"])["token"])
    assert ok["result"]["verified"] is True
    for method, params in [
        ("vault.list", {}),
        ("daemon.status", {}),
        ("vault.lock", {"vault": world.a}),
        ("memory.add", {"vault": world.a, "body": "x"}),
        ("memory.list", {"vault": world.a}),
        ("grant.create", {"vault": world.a}),
        ("grant.list", {}),
        ("rag.ingest", {"vault": world.a, "text": "x", "title": "t"}),
    ]:
        code, message = error(gcall(world, s, method, params))
        assert code == "scope_denied", method
        assert "search" in message
    assert error(gcall(world, s, "session.grant", {"token": "x"}))[0] == "usage"
    assert world.d.call("vault.status", {"vault": world.a})["records"] == 5  # nothing was added or locked
    s.close()


def test_a_missing_scope_names_the_scope_and_the_command_that_grants_it(world: World) -> None:
    s, _ = present(world, grant(world, scopes=["search"])["token"])
    code, message = error(gcall(world, s, "memory.read", {"id": world.public}))
    assert code == "scope_denied"
    assert "read scope" in message and f"memories grant create {world.a} --scope search,read" in message
    code, message = error(gcall(world, s, "rag.ask", {"question": "zebra?"}))
    assert code == "scope_denied" and "ask scope" in message
    s.close()


def test_private_credential_and_file_reads_answer_exactly_like_a_missing_id(world: World) -> None:
    s, _ = present(world, grant(world)["token"])
    for rid in (world.private, world.credential, world.file):
        missing = new_record_id()
        hidden = error(gcall(world, s, "memory.read", {"id": rid}))
        absent = error(gcall(world, s, "memory.read", {"id": missing}))
        assert hidden == (absent[0], absent[1].replace(missing, rid))
        assert hidden[0] == "not_found"
        for rev in (1, 999):  # one the hidden record has, one it lacks
            hidden_rev = error(gcall(world, s, "memory.read", {"id": rid, "revision": rev}))
            absent_rev = error(gcall(world, s, "memory.read", {"id": missing, "revision": rev}))
            assert hidden_rev == (absent_rev[0], absent_rev[1].replace(missing, rid))
    # A visible record's missing revision says the same as well: nothing tells the cases apart.
    public_rev = error(gcall(world, s, "memory.read", {"id": world.public, "revision": 999}))
    absent_rev = error(gcall(world, s, "memory.read", {"id": new_record_id(), "revision": 999}))
    assert public_rev[0] == absent_rev[0] == "not_found"
    ok = gcall(world, s, "memory.read", {"id": world.public, "with_data": True})["result"]
    assert ok["body"].startswith("The lighthouse keeper") and ok["revision"] == 1 and "private" not in ok
    s.close()


def test_search_and_retrieve_never_return_private_records_credentials_or_files(world: World) -> None:
    s, _ = present(world, grant(world)["token"])
    for match_mode in ("any", "all"):
        found = gcall(world, s, "memory.search", {"query": "zebra", "match_mode": match_mode, "limit": 100})
        assert ids_in(found, "id") == {world.public, world.card}
        frags = gcall(world, s, "rag.search", {"query": "zebra CANARYPRIVATE CANARYCRED CANARYFILE", "limit": 100})
        assert ids_in(frags, "record_id") <= {world.public, world.card}
        assert "CANARY" not in repr(found) + repr(frags)
    s.close()


def test_a_grant_for_vault_a_cannot_reach_vault_b(world: World) -> None:
    s, _ = present(world, grant(world)["token"])
    missing = new_record_id()
    other = error(gcall(world, s, "memory.read", {"vault": world.b, "id": world.b_record}))
    absent = error(gcall(world, s, "memory.read", {"id": missing}))
    assert other == (absent[0], absent[1].replace(missing, world.b_record))
    found = gcall(world, s, "memory.search", {"vault": world.b, "query": "zebra CANARYBETA"})
    assert ids_in(found, "id") <= {world.public, world.card} and "CANARYBETA" not in repr(found)
    s.close()


def test_a_cards_only_grant_sees_only_knowledge_cards(world: World) -> None:
    s, _ = present(world, grant(world, cards_only=True)["token"])
    assert ids_in(gcall(world, s, "memory.search", {"query": "zebra", "cards_only": False}), "id") == {world.card}
    assert ids_in(gcall(world, s, "rag.search", {"query": "zebra lighthouse"}), "record_id") == {world.card}
    assert error(gcall(world, s, "memory.read", {"id": world.public}))[0] == "not_found"
    assert gcall(world, s, "memory.read", {"id": world.card})["result"]["kind"] == "card"
    s.close()


def test_a_locked_vault_answers_locked_and_leaks_nothing_then_the_grant_works_again(world: World) -> None:
    token = grant(world)["token"]
    held, _ = present(world, token)
    world.d.call("vault.lock", {"vault": world.a})
    try:
        # The connection held to the vault's process ended with it (the MCP server reconnects through
        # vault.route); a new one is answered by the router, which holds nothing of the vault.
        with pytest.raises((BrokenPipeError, ConnectionError)):
            gcall(world, held, "memory.search", {"query": "zebra"})
        fresh, presented = present(world, token)
        assert presented["result"] == {"vault_id": world.a, "grant_id": token.split("_")[2], "verified": False, "locked": True}
        expected = ("vault_locked", f"the vault of this grant is locked: the person must run `memories vault unlock {world.a}`")
        for method, params in [("memory.search", {"query": "zebra"}), ("memory.read", {"id": world.private}),
                               ("memory.read", {"id": new_record_id()}), ("rag.search", {"query": "zebra"}),
                               ("rag.ask", {"question": "zebra?"})]:
            assert error(gcall(world, fresh, method, params)) == expected
        # Even a forged secret for a real grant id cannot be told apart while locked.
        forged = token.rsplit("_", 1)[0] + "_" + "A" * 43
        f, fp = present(world, forged)
        assert fp["result"]["locked"] is True and error(gcall(world, f, "memory.search", {"query": "z"})) == expected
        f.close()
    finally:
        world.d.call("vault.unlock", {"vault": world.a, "passphrase": PASS})
    held.close()
    fresh.close()
    again, presented = present(world, token)
    assert presented["result"]["verified"] is True
    assert world.a and ids_in(gcall(world, again, "memory.search", {"query": "lighthouse"}), "id") == {world.public}
    assert "result" in gcall(world, again, "memory.read", {"id": world.public})
    again.close()


def test_revoke_takes_effect_on_the_next_call(world: World) -> None:
    g1, g2, g3 = grant(world), grant(world), grant(world)
    s1, _ = present(world, g1["token"])
    s2, _ = present(world, g2["token"])
    assert "result" in gcall(world, s1, "memory.search", {"query": "zebra"})
    assert world.d.call("grant.revoke", {"grant_id": g1["grant_id"]}) == {"revoked": [g1["grant_id"]], "vault_id": world.a}
    assert error(gcall(world, s1, "memory.search", {"query": "zebra"}))[0] == "grant_invalid"
    assert "result" in gcall(world, s2, "memory.search", {"query": "zebra"})
    revoked = world.d.call("grant.revoke", {"all": True, "vault": world.a})["revoked"]
    assert g2["grant_id"] in revoked and g3["grant_id"] in revoked
    assert error(gcall(world, s2, "memory.read", {"id": world.public}))[0] == "grant_invalid"
    again, presented = present(world, g3["token"])
    assert error(presented)[0] == "grant_invalid"
    assert world.d.call("grant.list", {"vault": world.a})["grants"] == []
    code, message = error(world.d.request("grant.revoke", {"grant_id": g1["grant_id"]}))
    assert code == "not_found" and "memories grant list" in message
    for s in (s1, s2, again):
        s.close()


def test_a_grant_expires_after_its_ttl(world: World) -> None:
    g = grant(world, ttl_seconds=10)  # time for the first call on a loaded machine
    s, _ = present(world, g["token"])
    assert "result" in gcall(world, s, "memory.search", {"query": "zebra"})
    time.sleep(max(0.0, g["expires"] - time.time()) + 0.05)
    code, message = error(gcall(world, s, "memory.search", {"query": "zebra"}))
    assert code == "grant_expired" and "memories grant create" in message
    listed = next(x for x in world.d.call("grant.list", {})["grants"] if x["grant_id"] == g["grant_id"])
    assert listed["expired"] is True
    never = grant(world, ttl_seconds=None)
    assert never["expires"] is None
    s.close()


def test_a_forged_token_is_refused_and_its_connection_stays_restricted(world: World) -> None:
    real = grant(world)
    forged = real["token"].rsplit("_", 1)[0] + "_" + "B" * 43
    s, presented = present(world, forged)
    assert error(presented)[0] == "grant_invalid"
    assert error(gcall(world, s, "memory.search", {"query": "zebra"}))[0] == "grant_invalid"
    assert error(gcall(world, s, "vault.list"))[0] == "scope_denied"
    s.close()
    for bad in ("mg_short", "xx_" + real["token"][3:], f"mg_{world.a}_../../x_{'C' * 43}", f"mg_zzzzzzzzzzzz_{real['grant_id']}_{'D' * 43}"):
        s, presented = present(world, bad)
        assert error(presented)[0] == "grant_invalid", bad
        assert error(gcall(world, s, "vault.list"))[0] == "scope_denied"
        s.close()


def test_creating_a_grant_needs_an_unlocked_vault_and_valid_scopes(world: World) -> None:
    world.d.call("vault.lock", {"vault": world.b})
    try:
        assert error(world.d.request("grant.create", {"vault": world.b}))[0] == "vault_locked"
        listed = world.d.call("grant.list", {})
        assert world.b in listed["locked_vaults"]
    finally:
        world.d.call("vault.unlock", {"vault": world.b, "passphrase": PASS})
    assert error(world.d.request("grant.create", {"vault": world.a, "scopes": ["write"]}))[0] == "usage"
    assert error(world.d.request("grant.create", {"vault": world.a, "ttl_seconds": 0}))[0] == "invalid_params"


def test_grants_and_last_use_survive_a_restart(tmp_path: Path) -> None:
    tmp = short_tmpdir("mr")
    home = tmp / "h"
    write_config(home)
    d = Daemon(home).start()
    try:
        vid = create_vault(d, "solo", PASS)
        d.call("memory.add", {"vault": vid, "title": "t", "body": "the harbour pilot"})
        g = d.call("grant.create", {"vault": vid, "label": "ci"})
        s = d.connect(token=g["token"])
        d.request("session.grant", {"token": g["token"]}, sock=s)
        assert d.request("memory.search", {"query": "harbour"}, sock=s)["result"]["results"]
        s.close()
        d.stop()
        d = Daemon(home).start()
        d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        listed = d.call("grant.list", {"vault": vid})["grants"]
        assert [x["grant_id"] for x in listed] == [g["grant_id"]] and listed[0]["last_used"] is not None
        s = d.connect(token=g["token"])
        assert d.request("session.grant", {"token": g["token"]}, sock=s)["result"]["verified"] is True
        assert d.request("memory.search", {"query": "harbour"}, sock=s)["result"]["results"]
        s.close()
        assert g["token"] not in d.log_text() and g["token"].split("_", 3)[3] not in d.log_text()
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_ttl_and_scope_options_parse_and_refuse_clearly() -> None:
    assert [parse_ttl(t) for t in ("90s", "30m", "8h", "7d", "never", "NEVER")] == [90, 1800, 28800, 604800, None, None]
    for bad in ("", "0s", "10", "5w", "-1h", "1.5h", "99999999999d"):
        with pytest.raises(UsageError):
            parse_ttl(bad)
    assert parse_scopes("ask, search") == ["search", "ask"]
    with pytest.raises(UsageError):
        parse_scopes("search,write")
