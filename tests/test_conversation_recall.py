"""Recall over captured conversations: --speaker per fragment, --since/--until on session dates,
context packs that show speakers, dates and byte ranges, `rag context --mode`, and the MCP tool
memory_capture under its own grant scope.

A real memoriesd on a temp home (embeddings from a real loopback service, tests/embed_server.py),
the real CLI in subprocesses, and the MCP SDK's own stdio client as in tests/test_mcp.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.types import CallToolResult

from .conftest import Daemon, DaemonError, cli_json, create_vault, run_cli, short_tmpdir, write_config
from .embed_server import EmbeddingService
from .test_agent_writes import Env as WriteEnv
from .test_agent_writes import with_mcp
from .test_mcp import call, err, ok, text_of

PASS = "correct horse"
FILLER = "we walked along the harbour wall and talked about the old lighthouse and the boats that moor there at night"


def _turn(speaker: str, words: str) -> str:
    return f"{speaker}: {words} {FILLER}, {FILLER}."


# Conversation A: ten turns by Alice first (so some fragments hold none of Bob's), then Bob and Alice.
HARBOUR = "\n".join(
    [_turn("Alice", "quokkaalpha my first idea")]
    + [_turn("Alice", f"another thought number {i}") for i in range(2, 11)]
    + [_turn("Bob", "wombatbravo I decided to repaint the lighthouse"), _turn("Alice", "good, the lighthouse needs it")]
)
# Conversation B: Carol and Bob, a month later.
FERRY = "\n".join([_turn("Carol", "the ferry to the lighthouse island"), _turn("Bob", "I booked the ferry for June")])
# Conversation C: chat messages without a date (its day is the day it was captured).
CHAT = "\n".join(
    json.dumps({"role": r, "content": c})
    for r, c in (("user", "Remind me what the lighthouse keeper said."), ("assistant", "He said the lamp is serviced in spring."))
)


@dataclass
class Env:
    d: Daemon
    svc: EmbeddingService
    tmp: Path
    v: str
    a: str  # conversation A (Alice, Bob; 2023-05-08 13:56)
    b: str  # conversation B (Carol, Bob; 2023-06-20)
    c: str  # conversation C (user, assistant; no date)
    note: str
    profile: str

    def cli(self, *args: str) -> Any:
        return cli_json(self.d.home, *args)

    def turns(self, record_id: str) -> list[list[Any]]:
        return list(self.d.call("memory.read", {"vault": self.v, "id": record_id})["meta"]["conversation"]["turns"])

    def body(self, record_id: str) -> bytes:
        return str(self.d.call("memory.read", {"vault": self.v, "id": record_id})["body"]).encode("utf-8")

    def capture(self, text: str, **kw: Any) -> dict[str, Any]:
        out = self.d.call("memory.capture", {"vault": self.v, "text": text, "extract": False, **kw})
        return dict(out["records"][0])


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    svc = EmbeddingService()
    tmp = short_tmpdir("mc")
    home = tmp / "h"
    write_config(home, svc.config())
    d = Daemon(home).start()
    try:
        v = create_vault(d, "talks", PASS)
        e = Env(d, svc, tmp, v, "", "", "", "", "")
        e.a = e.capture(HARBOUR, format="markdown", date="2023-05-08T13:56", session_id="harbour-1", title="Harbour walk")["id"]
        e.b = e.capture(FERRY, format="markdown", date="2023-06-20", session_id="ferry-1", title="Ferry plans")["id"]
        e.c = e.capture(CHAT, format="jsonl", title="Lamp service")["id"]
        e.note = d.call("memory.add", {"vault": v, "title": "Lighthouse note", "body": "The lighthouse lamp is LED since 2022."})["id"]
        e.profile = d.call("memory.remember", {"vault": v, "text": "The user is called Ada.", "category": "profile"})["id"]
        yield e
    finally:
        d.stop()
        svc.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _speakers_in(turns: list[list[Any]], start: int, end: int) -> list[str]:
    """The speakers of the turns overlapping ``[start, end)``, from the record's own turn ranges."""
    return list(dict.fromkeys(t[2] for t in turns if t[0] < end and start < t[1]))


def _search(e: Env, *args: str) -> list[dict[str, Any]]:
    """`rag search --fragments`: these tests look at which fragments (turns) pass."""
    return list(e.cli("rag", "search", e.v, *args, "--fragments")["results"])


# ---------------------------------------------------------------------------- --speaker


def test_speaker_keeps_only_the_fragments_holding_a_turn_by_that_speaker(env: Env) -> None:
    everything = _search(env, "lighthouse", "--mode", "bm25", "--limit", "100")
    turns = {rid: env.turns(rid) for rid in (env.a, env.b, env.c)}
    alice_only = [r for r in everything if r["record_id"] == env.a and _speakers_in(turns[env.a], r["start"], r["end"]) == ["Alice"]]
    assert alice_only, "conversation A should have fragments with Alice's turns only"
    assert {r["record_id"] for r in everything} >= {env.a, env.b, env.c, env.note}

    bob = _search(env, "lighthouse", "--mode", "bm25", "--limit", "100", "--speaker", "bob")
    assert bob and {r["record_id"] for r in bob} == {env.a, env.b}  # not the note, not the chat
    for r in bob:
        assert r["kind"] == "conversation"
        assert "Bob" in _speakers_in(turns[r["record_id"]], r["start"], r["end"]), r
        assert "Bob" in r["conversation"]["speakers"]
    assert {(r["record_id"], r["start"]) for r in bob} < {(r["record_id"], r["start"]) for r in everything}
    assert not {(r["record_id"], r["start"]) for r in alice_only} & {(r["record_id"], r["start"]) for r in bob}

    upper = _search(env, "lighthouse", "--mode", "bm25", "--limit", "100", "--speaker", "BOB")
    assert [(r["record_id"], r["start"]) for r in upper] == [(r["record_id"], r["start"]) for r in bob]
    either = _search(env, "lighthouse", "--mode", "bm25", "--limit", "100", "--speaker", "Carol", "--speaker", "user")
    assert {r["record_id"] for r in either} == {env.b, env.c}

    # A word said only by Alice, early on: the record holds Bob's turns, but no fragment of it with the word does.
    assert [r["record_id"] for r in _search(env, "quokkaalpha", "--mode", "bm25")] == [env.a]
    assert _search(env, "quokkaalpha", "--mode", "bm25", "--speaker", "Bob") == []
    for mode in ("vector", "hybrid"):  # the vector side is narrowed to the same fragments
        got = env.d.call("rag.search", {"vault": env.v, "query": "lighthouse", "mode": mode, "limit": 100, "speakers": ["bob"], "min_score": -1})
        assert got["results"] and all("Bob" in _speakers_in(turns[r["record_id"]], r["start"], r["end"]) for r in got["results"])


def test_each_exchange_of_a_session_is_a_result_of_its_own_while_a_note_stays_one(env: Env) -> None:
    # "lighthouse" is in every turn of conversation A (several fragments) and in the note: grouped by
    # document, A's fragments would be one result; a conversation's exchanges are results of their own.
    grouped = env.cli("rag", "search", env.v, "lighthouse", "--mode", "bm25", "--limit", "20")
    assert grouped["grouping"] == "document"
    fragments = [r for r in grouped["results"] if r["record_id"] == env.a]
    n_a = len([r for r in _search(env, "lighthouse", "--mode", "bm25", "--limit", "100") if r["record_id"] == env.a])
    assert n_a >= 2 and len(fragments) == n_a
    assert len({(r["start"], r["end"]) for r in fragments}) == n_a
    assert all(r["matches"] == 1 and r["more"] == 0 for r in fragments)
    assert [r["record_id"] for r in grouped["results"]].count(env.note) == 1


def test_memory_search_takes_speaker_per_fragment_too(env: Env) -> None:
    found = env.cli("memory", "search", env.v, "quokkaalpha")["results"]
    assert [r["id"] for r in found] == [env.a]
    assert env.cli("memory", "search", env.v, "quokkaalpha", "--speaker", "bob")["results"] == []
    carol = env.cli("memory", "search", env.v, "lighthouse", "--speaker", "carol")["results"]
    assert [r["id"] for r in carol] == [env.b]


def test_speaker_with_another_kind_or_a_category_is_a_one_line_error(env: Env) -> None:
    for extra in (["--kind", "memory"], ["--category", "profile"]):
        r = run_cli(env.d.home, "rag", "search", env.v, "lighthouse", "--speaker", "bob", *extra)
        assert r.returncode != 0 and "--speaker" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    kind_ok = _search(env, "lighthouse", "--mode", "bm25", "--speaker", "bob", "--kind", "conversation")
    assert {r["record_id"] for r in kind_ok} == {env.a, env.b}


# ---------------------------------------------------------------------------- --since / --until


def test_since_and_until_use_the_session_date_of_a_conversation(env: Env) -> None:
    def ids(*args: str) -> set[str]:
        return {r["record_id"] for r in _search(env, "lighthouse", "--mode", "bm25", "--limit", "100", *args)}

    assert ids("--since", "2023-06-01", "--until", "2023-12-31") == {env.b}
    assert ids("--until", "2023-05-31") == {env.a}
    assert ids("--since", "2023-05-08", "--until", "2023-05-08") == {env.a}  # both ends included
    today = date.today().isoformat()
    # Without a session date, a conversation's day is the day it was captured (like a note's).
    assert ids("--since", today) == {env.c, env.note}
    dated = env.cli("memory", "search", env.v, "ferry", "--since", "2023-06-01", "--until", "2023-06-30")["results"]
    assert [r["id"] for r in dated] == [env.b]


# ---------------------------------------------------------------------------- context packs


def test_a_context_pack_shows_each_excerpt_with_its_speakers_date_and_byte_range(env: Env) -> None:
    pack = env.cli("rag", "context", env.v, "wombatbravo lighthouse ferry", "--mode", "bm25", "--budget", "4000")
    items = pack["items"]
    profile = [i for i in items if i["block"] == "profile"]
    assert [i["record_id"] for i in profile] == [env.profile]
    assert profile[0]["start"] is None and profile[0]["end"] is None and profile[0]["conversation"] is None
    convs = [i for i in items if i["kind"] == "conversation"]
    assert {i["record_id"] for i in convs} >= {env.a, env.b}
    for it in convs:
        conv = it["conversation"]
        rid, start, end = it["record_id"], it["start"], it["end"]
        assert isinstance(start, int) and isinstance(end, int) and start < end
        assert it["text"] == " ".join(env.body(rid)[start:end].decode("utf-8").split())
        turns = env.turns(rid)
        assert conv["speakers"] == _speakers_in(turns, start, end)
        assert conv["turns"] == [f"T{n}" for n, t in enumerate(turns, start=1) if t[0] < end and start < t[1]]
        assert conv["refs"] == []
        when = {env.a: "8 May 2023, 1:56 pm", env.b: "20 June 2023"}.get(rid)
        assert conv["when"] == when and conv["date"] == {env.a: "2023-05-08", env.b: "2023-06-20"}.get(rid)
        # The line carries the session day; the speakers are in the text ("Carol: ...").
        day = when.split(",")[0] if when else None
        line = f"[{it['label']}] {it['title']} ({day}): {it['text']}" if day else f"[{it['label']}] {it['title']}: {it['text']}"
        assert line in pack["text"].splitlines()
    note = next(i for i in items if i["record_id"] == env.note)
    assert isinstance(note["start"], int) and note["end"] > note["start"] and note["conversation"] is None
    assert f"[{note['label']}] Lighthouse note: " in pack["text"]

    r = run_cli(env.d.home, "rag", "context", env.v, "wombatbravo lighthouse ferry", "--mode", "bm25", "--budget", "4000")
    assert r.returncode == 0 and r.stdout == pack["text"]  # the plain text is the same pack
    bob = next(i for i in convs if i["record_id"] == env.a and "Bob" in i["conversation"]["speakers"])
    assert "Harbour walk (8 May 2023): " in r.stdout and "Bob: wombatbravo" in r.stdout
    assert set(bob["conversation"]["speakers"]) == {"Alice", "Bob"}


def test_a_context_pack_with_speaker_holds_only_their_excerpts(env: Env) -> None:
    pack = env.cli("rag", "context", env.v, "lighthouse", "--speaker", "Carol", "--budget", "2000")
    assert pack["items"] and {i["record_id"] for i in pack["items"]} == {env.b}  # no profile fact: not a conversation
    assert all("Carol" in i["conversation"]["speakers"] for i in pack["items"])
    assert "## About the user" not in pack["text"]


def test_context_mode_picks_the_search_and_defaults_to_hybrid_with_a_model(env: Env) -> None:
    assert env.cli("rag", "context", env.v, "lighthouse")["mode"] == "hybrid"
    for mode in ("bm25", "vector", "hybrid"):
        pack = env.cli("rag", "context", env.v, "lighthouse keeper", "--mode", mode)
        assert pack["mode"] == mode and pack["items"], mode
    bm25 = env.d.call("rag.context", {"vault": env.v, "query": "quokkaalpha", "mode": "bm25"})
    assert [i["record_id"] for i in bm25["items"] if i["block"] == "relevant"] == [env.a]
    r = run_cli(env.d.home, "rag", "context", env.v, "lighthouse", "--mode", "fuzzy")
    assert r.returncode != 0 and "mode" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--mode" in run_cli(env.d.home, "rag", "context", "--help").stdout


# ---------------------------------------------------------------------------- MCP memory_capture


def _grant(e: Env, scopes: list[str]) -> dict[str, Any]:
    return dict(e.d.call("grant.create", {"vault": e.v, "scopes": scopes}))


def _mcp(e: Env, token: str, fn: Any) -> Any:
    return with_mcp(WriteEnv(e.d, e.svc, e.tmp, e.v, "", "", ""), token, fn)


def _conversations(e: Env) -> dict[str, int]:
    records = e.d.call("memory.list", {"vault": e.v})["records"]
    return {r["id"]: r["revision"] for r in records if r["kind"] == "conversation"}


MESSAGES = [
    {"role": "user", "content": "Let's pick the pelican colour scheme for the site.", "timestamp": "2024-03-02T09:15:00Z"},
    {"role": "assistant", "content": "I suggest teal and sand; you agreed on teal.", "timestamp": "2024-03-02T09:16:00Z"},
]


def test_memory_capture_files_a_conversation_once_with_the_capture_scope(env: Env) -> None:
    token = _grant(env, ["capture"])["token"]
    markdown = "Dana: the pelican boat leaves at noon\nEli: then we meet at the pier"

    async def go(s: ClientSession) -> dict[str, Any]:
        tools = {t.name: t for t in (await s.list_tools()).tools}
        return {
            "tool": tools["memory_capture"],
            "first": await call(s, "memory_capture", messages=MESSAGES, date="2024-03-02", session_id="site-colours"),
            "again": await call(s, "memory_capture", messages=MESSAGES, date="2024-03-02", session_id="site-colours"),
            "longer": await call(s, "memory_capture", messages=[*MESSAGES, {"role": "user", "content": "And the pelican logo stays."}],
                                 date="2024-03-02", session_id="site-colours"),
            "text": await call(s, "memory_capture", text=markdown, format="markdown", title="Boat trip"),
            "both": await call(s, "memory_capture", messages=MESSAGES, text=markdown),
        }

    out = _mcp(env, token, go)
    tool = out["tool"]
    assert set(tool.input_schema["properties"]) == {"messages", "text", "format", "title", "date", "session_id"}
    assert tool.annotations is not None and tool.annotations.read_only_hint is False and tool.annotations.destructive_hint is False
    assert "`capture`" in (tool.description or "")
    first = ok(out["first"])["records"][0]
    assert first["status"] == "created" and first["turns"] == 2 and first["date"] == "2024-03-02" and first["revision"] == 1
    assert f"created: id={first['id']}" in text_of(out["first"])
    again = ok(out["again"])["records"][0]
    assert again["status"] == "unchanged" and again["id"] == first["id"]
    longer = ok(out["longer"])["records"][0]
    assert longer["status"] == "revised" and longer["id"] == first["id"] and longer["revision"] == 2 and longer["turns"] == 3
    boat = ok(out["text"])["records"][0]
    assert boat["status"] == "created" and boat["title"] == "Boat trip" and boat["turns"] == 2
    code, message = err(out["both"])
    assert code == "usage" and "either as messages or as text" in message and "\n" not in message

    stored = env.d.call("memory.read", {"vault": env.v, "id": first["id"]})
    assert stored["kind"] == "conversation" and stored["meta"]["speakers"] == ["user", "assistant"]
    assert stored["body"].startswith("user: Let's pick the pelican colour scheme")
    found = _search(env, "pelican", "--mode", "bm25", "--speaker", "assistant")
    assert [r["record_id"] for r in found] == [first["id"]]


def test_memory_capture_without_the_scope_or_with_a_revoked_grant_captures_nothing(env: Env) -> None:
    before = _conversations(env)
    reader = _grant(env, ["search", "read"])
    revoked = _grant(env, ["capture"])
    env.d.call("grant.revoke", {"grant_id": revoked["grant_id"]})

    async def go(s: ClientSession) -> CallToolResult:
        return await call(s, "memory_capture", messages=[{"role": "user", "content": "CANARYNOCAPTURE lighthouse"}])

    code, message = err(_mcp(env, reader["token"], go))
    assert code == "scope_denied" and "lacks the capture scope" in message and "\n" not in message
    assert f"memories grant create {env.v} --scope search,read,capture" in message
    code, _ = err(_mcp(env, revoked["token"], go))
    assert code == "grant_invalid"
    assert _conversations(env) == before
    assert _search(env, "CANARYNOCAPTURE", "--mode", "bm25") == []


def test_a_grant_capture_never_revises_nor_shows_a_private_conversation(env: Env) -> None:
    secret = env.capture("Fay: CANARYSECRETTITLE plans\nGus: noted", format="markdown", session_id="private-1", title="CANARYSECRETTITLE")
    env.d.call("memory.update", {"vault": env.v, "id": secret["id"], "private": True})
    rev = env.d.call("memory.read", {"vault": env.v, "id": secret["id"]})["revision"]
    token = _grant(env, ["capture", "search"])["token"]

    async def go(s: ClientSession) -> CallToolResult:
        return await call(s, "memory_capture", text="Fay: other plans\nGus: fine", format="markdown", session_id="private-1")

    got = ok(_mcp(env, token, go))
    assert got["records"][0]["status"] == "created" and got["records"][0]["id"] != secret["id"]
    assert "CANARYSECRETTITLE" not in json.dumps(got)
    assert env.d.call("memory.read", {"vault": env.v, "id": secret["id"]})["revision"] == rev


def test_grant_create_takes_the_capture_scope_and_says_it_writes(env: Env) -> None:
    r = run_cli(env.d.home, "grant", "create", env.v, "--scope", "search,capture", "--label", "assistant")
    assert r.returncode == 0, r.stderr
    assert "scopes search,capture" in r.stderr and "may change the vault (capture)" in r.stderr
    assert "capture" in run_cli(env.d.home, "grant", "create", "--help", env={"COLUMNS": "200"}).stdout
    assert env.d.call("grant.create", {"vault": env.v})["scopes"] == ["search", "read", "retrieve"]  # never a default
    with pytest.raises(DaemonError) as bad:
        env.d.call("grant.create", {"vault": env.v, "scopes": ["capture", "write"]})
    assert "capture" in bad.value.message


def test_a_conversation_fragment_too_long_for_the_pack_comes_as_an_excerpt_of_whole_turns(env: Env) -> None:
    # Conversation A's fragments hold several long turns; a small budget cannot take one whole, so the
    # pack shows the turns around the one that matches ("wombatbravo": Bob's), cut at turn boundaries.
    pack = env.cli("rag", "context", env.v, "wombatbravo repaint", "--mode", "bm25", "--budget", "150")
    convs = [i for i in pack["items"] if i["kind"] == "conversation" and i["record_id"] == env.a]
    assert convs, pack["text"]
    it = convs[0]
    turns = env.turns(env.a)
    assert it["start"] in {t[0] for t in turns} and it["end"] in {t[1] for t in turns}  # whole turns only
    shown = [t for t in turns if it["start"] <= t[0] and t[1] <= it["end"]]
    assert 1 <= len(shown) <= 3
    body = env.body(env.a)
    assert any(t[2] == "Bob" and "wombatbravo" in body[t[0] : t[1]].decode() for t in shown)
    assert it["text"] == " ".join(body[it["start"] : it["end"]].decode("utf-8").split())
    assert pack["used_tokens"] <= 150
    # The fragment the search found is longer than what the pack shows of it.
    hits = _search(env, "wombatbravo repaint", "--mode", "bm25", "--limit", "1")
    assert hits[0]["record_id"] == env.a and hits[0]["end"] - hits[0]["start"] > it["end"] - it["start"]


def test_a_context_pack_shows_each_turn_once_though_neighbouring_fragments_share_one(env: Env) -> None:
    # Every turn of conversation A speaks of the harbour wall, so all its fragments match; they overlap
    # by a turn, and the pack shows each turn once: its items of A never share a byte.
    hits = [h for h in _search(env, "harbour wall boats", "--mode", "bm25", "--limit", "20") if h["record_id"] == env.a]
    assert len(hits) >= 3 and any(a["end"] > b["start"] and b["end"] > a["start"] for a in hits for b in hits if a is not b)
    pack = env.cli("rag", "context", env.v, "harbour wall boats", "--mode", "bm25", "--budget", "4000")
    spans = sorted((i["start"], i["end"]) for i in pack["items"] if i["record_id"] == env.a)
    assert len(spans) >= 2, pack["text"]
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
    starts = {t[0] for t in env.turns(env.a)}
    assert all(s in starts for s, _ in spans)  # cut at turn boundaries
