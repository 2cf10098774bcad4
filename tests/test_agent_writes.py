"""Agents that may write: memory_remember, memory_forget and memory_context through `memories mcp`.

A real memoriesd on a temp home (embeddings from a real loopback service, tests/embed_server.py)
and the MCP SDK's own stdio client, as in tests/test_mcp.py. Each write tool needs its own grant
scope, which is never a default; a grant revoked while its write waits is refused before the commit.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import CallToolResult

from .conftest import REPO, Daemon, DaemonError, create_vault, short_tmpdir, write_config
from .embed_server import EmbeddingService
from .test_mcp import BOOT, call, err, ok, text_of

T = TypeVar("T")
PASS = "correct horse"


@dataclass
class Env:
    d: Daemon
    svc: EmbeddingService
    tmp: Path
    a: str  # the vault grants reach
    b: str  # another vault
    note: str  # a note in vault a
    private_fact: str


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    svc = EmbeddingService()
    tmp = short_tmpdir("mw")
    home = tmp / "h"
    write_config(home, svc.config())
    d = Daemon(home).start()
    try:
        a = create_vault(d, "alpha", PASS)
        b = create_vault(d, "beta", PASS)
        note = d.call("memory.add", {"vault": a, "title": "Editor", "body": "The editor config lives in the dotfiles repo."})["id"]
        d.call("memory.remember", {"vault": a, "text": "The user is called Ada and lives in Lyon.", "category": "profile"})
        secret = d.call("memory.remember", {"vault": a, "text": "The user's home address is 3 rue CANARYADDR.", "category": "profile", "key": "address"})
        d.call("memory.update", {"vault": a, "id": secret["id"], "private": True})
        yield Env(d, svc, tmp, a, b, note, secret["id"])
    finally:
        d.stop()
        svc.close()
        shutil.rmtree(tmp, ignore_errors=True)


def grant(e: Env, scopes: list[str], **kw: Any) -> dict[str, Any]:
    return dict(e.d.call("grant.create", {"vault": e.a, "scopes": scopes, **kw}))


def with_mcp(e: Env, token: str, fn: Callable[[ClientSession], Awaitable[T]]) -> T:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-c", BOOT, "--home", str(e.d.home), "mcp"],
        env={"MEMORIES_GRANT": token, "ORT_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(REPO)},
        cwd=str(REPO),
    )

    async def main() -> T:
        with open(e.tmp / "mcp-stderr.txt", "a") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await fn(session)

    return anyio.run(main)


def facts(e: Env, vault: str | None = None) -> list[dict[str, Any]]:
    return list(e.d.call("memory.facts", {"vault": vault or e.a})["facts"])


def test_write_tools_are_listed_with_hints_and_say_when_to_call_them(env: Env) -> None:
    async def go(s: ClientSession) -> Any:
        return (await s.list_tools()).tools

    tools = {t.name: t for t in with_mcp(env, grant(env, ["search"])["token"], go)}
    remember, forget, context = tools["memory_remember"], tools["memory_forget"], tools["memory_context"]
    assert set(remember.input_schema["required"]) == {"text"}
    assert set(remember.input_schema["properties"]) == {"text", "category", "key", "importance"}
    assert set(forget.input_schema["properties"]) == {"query", "scope", "ids", "kind", "dry_run"}
    assert set(context.input_schema["properties"]) == {"query", "budget"}
    assert remember.annotations is not None and remember.annotations.read_only_hint is False
    assert remember.annotations.destructive_hint is False and remember.annotations.idempotent_hint is True
    assert forget.annotations is not None and forget.annotations.destructive_hint is True
    assert context.annotations is not None and context.annotations.read_only_hint is True
    assert "Never save secrets" in (remember.description or "") and "`remember`" in (remember.description or "")
    assert "dry_run" in (forget.description or "") and "`forget-all`" in (forget.description or "")
    assert "start of a task" in (context.description or "")


def test_remember_through_mcp_adds_then_revises_one_fact_and_a_repeat_changes_nothing(env: Env) -> None:
    token = grant(env, ["remember"])["token"]

    async def go(s: ClientSession) -> list[CallToolResult]:
        return [
            await call(s, "memory_remember", text="The user prefers tabs over spaces.", category="preference", key="indentation"),
            await call(s, "memory_remember", text="Actually the user switched to spaces.", category="preference", key="Indentation"),
            await call(s, "memory_remember", text="actually the user switched to spaces", category="preference", key="indentation"),
        ]

    first, second, again = (ok(r) for r in with_mcp(env, token, go))
    assert (first["action"], first["revision"], first["category"]) == ("added", 1, "preference")
    assert (second["action"], second["id"], second["revision"]) == ("updated", first["id"], 2)
    assert second["previous"] == {"revision": 1}  # no text: this grant has no scope that reads
    assert (again["action"], again["revision"]) == ("unchanged", 2)
    history = env.d.call("memory.history", {"vault": env.a, "id": first["id"]})["revisions"]
    assert [r["text"] for r in history] == ["The user prefers tabs over spaces.", "Actually the user switched to spaces."]
    mine = [f for f in facts(env) if f["key"] == "preference:indentation"]
    assert len(mine) == 1 and mine[0]["text"] == "Actually the user switched to spaces."
    assert "updated: fact id=" in text_of(with_mcp(env, token, _remember_again))


async def _remember_again(s: ClientSession) -> CallToolResult:
    return await call(s, "memory_remember", text="The user now indents with spaces.", category="preference", key="indentation")


def test_a_grant_that_can_read_sees_the_text_a_fact_said_before(env: Env) -> None:
    token = grant(env, ["read", "remember"])["token"]

    async def go(s: ClientSession) -> list[CallToolResult]:
        return [
            await call(s, "memory_remember", text="The user drinks green tea.", category="preference", key="tea"),
            await call(s, "memory_remember", text="The user switched to black tea.", category="preference", key="tea"),
        ]

    _, second = (ok(r) for r in with_mcp(env, token, go))
    assert second["previous"] == {"revision": 1, "text": "The user drinks green tea."}


def test_without_the_scope_each_write_tool_is_refused_naming_the_scope(env: Env) -> None:
    before = facts(env)
    token = grant(env, ["search", "read", "retrieve", "ask"])["token"]  # every reading scope but context

    async def go(s: ClientSession) -> list[CallToolResult]:
        return [
            await call(s, "memory_remember", text="The user likes CANARYNOSCOPE.", category="preference"),
            await call(s, "memory_forget", query="Ada", scope="topic"),
            await call(s, "memory_context", query="editor settings"),
        ]

    for r, scope in zip(with_mcp(env, token, go), ("remember", "forget", "context"), strict=True):
        code, message = err(r)
        assert code == "scope_denied" and f"lacks the {scope} scope" in message
        assert f"memories grant create {env.a} --scope search,read,retrieve,ask,{scope}" in message
    assert facts(env) == before


def test_a_read_only_grant_cannot_write_through_any_method(env: Env) -> None:
    token = grant(env, ["search", "read", "retrieve", "ask", "context"])["token"]
    s = env.d.connect(token=token)
    try:
        assert env.d.request("session.grant", {"token": token}, sock=s)["result"]["verified"] is True
        for method, params in [
            ("memory.remember", {"text": "The user likes CANARYRO."}),
            ("memory.forget", {"all": True, "dry_run": True}),
            ("memory.forget", {"ids": [env.note], "dry_run": True}),
            ("memory.add", {"body": "CANARYRO"}),
            ("memory.update", {"id": env.note, "body": "CANARYRO"}),
            ("memory.delete", {"id": env.note}),
            ("rag.ingest", {"text": "CANARYRO", "title": "t"}),
        ]:
            msg = env.d.request(method, {"vault": env.a, **params}, sock=s)
            assert msg["error"]["code"] == "scope_denied", method
    finally:
        s.close()
    assert env.d.call("memory.read", {"vault": env.a, "id": env.note})["revision"] == 1
    assert not [f for f in facts(env) if "CANARYRO" in f["text"]]


def test_a_remember_grant_writes_only_facts_of_its_own_vault_and_never_touches_a_private_fact(env: Env) -> None:
    token = grant(env, ["remember", "read"])["token"]
    s = env.d.connect(token=token)
    try:
        env.d.request("session.grant", {"token": token}, sock=s)
        # Everything but text, category, key and importance is dropped: no tags, no other vault, no record id.
        msg = env.d.request(
            "memory.remember",
            {"vault": env.b, "text": "The user keeps a paper notebook.", "tags": ["injected"], "id": env.note, "kind": "memory"},
            sock=s,
        )
        out = msg["result"]
        # The same key as the private fact: a new fact, never a revision (nor a view) of the private one.
        same_key = env.d.request(
            "memory.remember", {"text": "The user's home address is in Paris.", "category": "profile", "key": "address"}, sock=s
        )["result"]
    finally:
        s.close()
    assert out["action"] == "added" and out["id"] != env.note
    stored = env.d.call("memory.read", {"vault": env.a, "id": out["id"]})
    assert stored["kind"] == "fact" and stored["tags"] == []
    assert not facts(env, env.b)
    assert same_key["action"] == "added" and same_key["id"] != env.private_fact and same_key["previous"] is None
    private = env.d.call("memory.read", {"vault": env.a, "id": env.private_fact})
    assert private["revision"] == 2 and "CANARYADDR" in private["body"]  # 2: the update that made it private
    assert "CANARYADDR" not in repr(same_key)


def test_forget_all_is_refused_without_forget_all_and_forget_sees_only_visible_records(env: Env) -> None:
    forgetter = grant(env, ["forget", "read"])
    everything = grant(env, ["forget-all"])
    assert everything["scopes"] == ["forget", "forget-all"]  # forget-all implies forget
    temp = env.d.call("memory.remember", {"vault": env.a, "text": "The user is learning the cello.", "category": "fact"})

    async def limited(s: ClientSession) -> list[CallToolResult]:
        return [
            await call(s, "memory_forget", scope="all", dry_run=True),
            await call(s, "memory_forget", ids=[env.private_fact], dry_run=True),
            await call(s, "memory_forget", query="cello", scope="topic", dry_run=True),
            await call(s, "memory_forget", query="cello", scope="specific"),
        ]

    refused_all, hidden, dry, gone = with_mcp(env, forgetter["token"], limited)
    code, message = err(refused_all)
    assert code == "scope_denied" and "lacks the forget-all scope" in message
    assert "--scope read,forget,forget-all" in message
    code, message = err(hidden)
    assert code == "not_found" and env.private_fact in message  # like an id the vault does not hold
    listed = ok(dry)
    assert listed["dry_run"] is True and [r["id"] for r in listed["records"]] == [temp["id"]]
    assert listed["records"][0]["text"] == "The user is learning the cello."
    done = ok(gone)
    assert done["forgotten"] == 1 and [r["id"] for r in done["records"]] == [temp["id"]]
    with pytest.raises(DaemonError) as missing:
        env.d.call("memory.read", {"vault": env.a, "id": temp["id"]})
    assert missing.value.code == "not_found"

    async def all_facts(s: ClientSession) -> list[CallToolResult]:
        return [
            await call(s, "memory_forget", scope="all", dry_run=True),
            await call(s, "memory_forget", scope="all", kind="memory", dry_run=True),
        ]

    facts_dry, notes_dry = (ok(r) for r in with_mcp(env, everything["token"], all_facts))
    ids = {r["id"] for r in facts_dry["records"]}
    assert ids and env.private_fact not in ids and all(r["kind"] == "fact" for r in facts_dry["records"])
    assert all("text" not in r for r in facts_dry["records"])  # forget-all alone reads nothing
    assert env.note in {r["id"] for r in notes_dry["records"]}
    s = env.d.connect(token=everything["token"])
    try:
        env.d.request("session.grant", {"token": everything["token"]}, sock=s)
        msg = env.d.request("memory.forget", {"all": True, "kind": "credential", "dry_run": True}, sock=s)
        assert msg["error"]["code"] == "scope_denied" and "credentials or files" in msg["error"]["message"]
    finally:
        s.close()
    assert env.d.call("memory.read", {"vault": env.a, "id": env.note})["revision"] == 1  # dry runs changed nothing


def test_context_returns_a_pack_within_its_budget_profile_first(env: Env) -> None:
    token = grant(env, ["context"])["token"]

    async def go(s: ClientSession) -> CallToolResult:
        return await call(s, "memory_context", query="where is the editor config?", budget=200)

    out = ok(with_mcp(env, token, go))
    assert out["budget"] == 200 and 0 < out["used_tokens"] <= 200
    assert out["text"].startswith("## About the user\n")
    assert out["items"][0]["kind"] == "fact" and out["items"][0]["category"] == "profile" and out["items"][0]["label"] == "S1"
    assert any("Ada" in i["text"] for i in out["items"] if i["category"] == "profile")
    assert env.note in {i["record_id"] for i in out["items"]}
    assert "CANARYADDR" not in repr(out)  # the private fact is never in a pack
    assert "<<<PACK" in text_of(with_mcp(env, token, go))
    card = env.d.call("rag.ingest", {"vault": env.a, "text": "The editor theme is solarized.", "title": "Editor card"})["records"][0]["id"]
    cards_only = ok(with_mcp(env, grant(env, ["context"], cards_only=True)["token"], go))
    assert [(i["record_id"], i["kind"]) for i in cards_only["items"]] == [(card, "card")]  # no profile, no notes


def _wait_for(cond: Callable[[], bool], timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _used(e: Env, grant_id: str) -> bool:
    return any(g["grant_id"] == grant_id and g["last_used"] for g in e.d.call("grant.list", {"vault": e.a})["grants"])


def test_a_grant_revoked_while_its_write_waits_writes_nothing(env: Env) -> None:
    """The owner's forget holds the vault's facts lock (its search waits on the embedding service); the
    grants' writes pass their scope check and wait for it; both grants are revoked; then the owner's
    call ends and the writes go on: each is refused before its commit, and nothing changed."""
    marker = "zqxholdmarker"
    env.d.call("memory.add", {"vault": env.a, "title": "Hold", "body": f"{marker} a note the owner looks for"})
    keep = env.d.call("memory.remember", {"vault": env.a, "text": "The user bikes to work every day.", "category": "pattern"})
    writer = grant(env, ["remember"])
    forgetter = grant(env, ["forget"])
    before = {f["id"]: f["revision"] for f in facts(env)}
    env.svc.hold, owner = marker, {}
    env.svc.held.clear()
    env.svc.release.clear()
    t = threading.Thread(
        target=lambda: owner.update(out=env.d.request("memory.forget", {"vault": env.a, "query": marker, "kind": "memory", "dry_run": True})),
        daemon=True,
    )
    t.start()
    try:
        assert env.svc.held.wait(60), "the owner's forget never reached the embedding service"

        async def go(s: ClientSession) -> dict[str, CallToolResult]:
            out: dict[str, CallToolResult] = {}
            async with anyio.create_task_group() as tg:

                async def remember() -> None:
                    out["remember"] = await call(s, "memory_remember", text="The user bikes to CANARYLATE.", category="pattern")

                async def forget() -> None:
                    out["forget"] = await call(s, "memory_forget", query="bikes", scope="topic")

                tg.start_soon(remember)
                tg.start_soon(forget)
                for g in (writer, forgetter):
                    assert await anyio.to_thread.run_sync(lambda g=g: _wait_for(lambda: _used(env, g["grant_id"]))), "no call passed its check"
                for g in (writer, forgetter):
                    await anyio.to_thread.run_sync(lambda g=g: env.d.call("grant.revoke", {"grant_id": g["grant_id"]}))
                env.svc.release.set()  # the owner's call ends; the writes take the lock, then their commit is refused
            return out

        # Two grants, two connections in one MCP server? One server serves one grant: run two sessions.
        results = _two_sessions(env, writer["token"], forgetter["token"], go)
    finally:
        env.svc.release.set()
        env.svc.hold = None
        t.join(30)
    assert owner.get("out"), "the owner's forget never ended"  # it may end cancelled: the grants' calls changed the vault
    assert err(results["remember"])[0] == "grant_invalid"
    assert err(results["forget"])[0] == "grant_invalid"
    after = {f["id"]: f["revision"] for f in facts(env)}
    assert after == before and keep["id"] in after
    assert not [f for f in facts(env) if "CANARYLATE" in f["text"]]


def _two_sessions(e: Env, token_a: str, token_b: str, go: Callable[[ClientSession], Awaitable[T]]) -> T:
    """``go`` on a session whose memory_remember runs under ``token_a`` and memory_forget under ``token_b``."""

    class Pair:
        def __init__(self, a: ClientSession, b: ClientSession) -> None:
            self.a, self.b = a, b

        async def call_tool(self, name: str, args: dict[str, Any]) -> Any:
            return await (self.a if name == "memory_remember" else self.b).call_tool(name, args)

    def params(token: str) -> StdioServerParameters:
        return StdioServerParameters(
            command=sys.executable,
            args=["-c", BOOT, "--home", str(e.d.home), "mcp"],
            env={"MEMORIES_GRANT": token, "ORT_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(REPO)},
            cwd=str(REPO),
        )

    async def main() -> T:
        with open(e.tmp / "mcp-stderr.txt", "a") as errlog:
            async with stdio_client(params(token_a), errlog=errlog) as (ra, wa), stdio_client(params(token_b), errlog=errlog) as (rb, wb):
                async with ClientSession(ra, wa) as sa, ClientSession(rb, wb) as sb:
                    await sa.initialize()
                    await sb.initialize()
                    return await go(Pair(sa, sb))  # type: ignore[arg-type]

    return anyio.run(main)


def test_grant_create_and_list_show_the_write_scopes(env: Env) -> None:
    from .conftest import run_cli

    r = run_cli(env.d.home, "grant", "create", env.a, "--scope", "context,remember,forget-all", "--label", "assistant")
    assert r.returncode == 0, r.stderr
    assert "scopes context,remember,forget,forget-all" in r.stderr and "may change the vault" in r.stderr
    listed = run_cli(env.d.home, "grant", "list", env.a, env={"COLUMNS": "250"})
    assert listed.returncode == 0 and "context,remember,forget,forget-all" in listed.stdout
    bad = run_cli(env.d.home, "grant", "create", env.a, "--scope", "search,write")
    assert bad.returncode != 0 and "remember" in bad.stderr and "forget-all" in bad.stderr
    default = env.d.call("grant.create", {"vault": env.a})
    assert default["scopes"] == ["search", "read", "retrieve"]  # no write scope unless asked for by name
