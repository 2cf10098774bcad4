"""`memories mcp` driven by the MCP SDK's own stdio client against a real daemon in a temp home.

A loopback generation server (OpenAI chat-completions shape) answers `memory_ask`; it records every
request body and can hold one until released, to test that revoke and expiry cancel an ask in
flight and drop its late answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import CallToolResult

from memories_cli.mcp_server import DATA_NOTICE
from memoriesd.vault.records import new_record_id

from .conftest import REPO, Daemon, short_tmpdir, write_config
from .test_grants import PASS, World, seed

T = TypeVar("T")
HOLD = "SLOWQUESTION"
# The real CLI, with the grant commands registered whether or not main.py imports them yet.
BOOT = (
    "import sys; from memories_cli.main import app, run; from memories_cli import grant_cmds\n"
    "if 'grant' not in {g.name for g in app.registered_groups}: grant_cmds.register(app)\n"
    "run()"
)


@dataclass
class GenServer:
    """A chat-completions endpoint on 127.0.0.1 that cites [S1]."""

    bodies: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    held: threading.Event = field(default_factory=threading.Event)
    answered_late: list[bool] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def start(self) -> GenServer:
        gen = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
                gen.bodies.append(body)
                if HOLD in body:
                    gen.held.set()
                    gen.release.wait(120)
                    gen.answered_late.append(True)
                content = json.dumps({"answer": "The keeper feeds the zebra every morning [S1].", "citations": ["S1"]})
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.release.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@dataclass
class Env:
    w: World
    gen: GenServer
    tmp: Path
    errlogs: list[Path] = field(default_factory=list)

    @property
    def d(self) -> Daemon:
        return self.w.d


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    gen = GenServer().start()
    tmp = short_tmpdir("mm")
    home = tmp / "h"
    write_config(
        home,
        f'[generation]\nprotocol = "compatible"\nurl = "http://127.0.0.1:{gen.port}/v1/chat/completions"\nmodel = "m"\n',
    )
    d = Daemon(home).start()
    try:
        yield Env(seed(d), gen, tmp)
    finally:
        d.stop()
        gen.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def grant(e: Env, **kw: Any) -> dict[str, Any]:
    return dict(e.d.call("grant.create", {"vault": e.w.a, **kw}))


def with_mcp(e: Env, token: str, fn: Callable[[ClientSession], Awaitable[T]]) -> T:
    """Spawn `memories mcp` with the token in MEMORIES_GRANT and run ``fn`` on an initialised session."""
    errlog_path = e.tmp / f"mcp-stderr-{len(e.errlogs)}.txt"
    e.errlogs.append(errlog_path)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-c", BOOT, "--home", str(e.d.home), "mcp"],
        env={"MEMORIES_GRANT": token, "ORT_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(REPO)},
        cwd=str(REPO),
    )

    async def main() -> T:
        with open(errlog_path, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await fn(session)

    return anyio.run(main)


async def call(s: ClientSession, tool: str, **args: Any) -> CallToolResult:
    result = await s.call_tool(tool, args)
    assert isinstance(result, CallToolResult)
    assert result.content and result.content[0].type == "text"
    return result


def text_of(r: CallToolResult) -> str:
    return "".join(getattr(c, "text", "") for c in r.content)


def err(r: CallToolResult) -> tuple[str, str]:
    assert r.is_error, text_of(r)
    assert r.structured_content is not None
    e = r.structured_content["error"]
    notes = "".join(f"\nnotice: {n}" for n in r.structured_content.get("notices", []))
    assert text_of(r) == f"error[{e['code']}]: {e['message']}{notes}"
    return str(e["code"]), str(e["message"])


def ok(r: CallToolResult) -> dict[str, Any]:
    assert not r.is_error, text_of(r)
    assert r.structured_content is not None and r.structured_content["notice"] == DATA_NOTICE
    assert text_of(r).startswith(DATA_NOTICE)
    return dict(r.structured_content)


def test_tools_are_listed_with_schemas_read_only_hints_and_the_data_notice(env: Env) -> None:
    async def go(s: ClientSession) -> Any:
        return (await s.list_tools()).tools

    tools = {t.name: t for t in with_mcp(env, grant(env)["token"], go)}
    assert set(tools) == {"memory_search", "memory_read", "memory_retrieve", "memory_ask",
                          "memory_context", "memory_remember", "memory_capture", "memory_forget"}
    # writes: tests/test_agent_writes.py, tests/test_conversation_recall.py
    expected = {
        "memory_search": ({"query"}, {"query", "limit", "match_mode"}),
        "memory_read": ({"id"}, {"id", "revision"}),
        "memory_retrieve": ({"query"}, {"query", "mode", "limit", "match_mode", "min_score"}),
        "memory_ask": ({"question"}, {"question", "mode", "limit"}),
    }
    for name, (required, props) in expected.items():
        t = tools[name]
        schema = t.input_schema
        assert set(schema["required"]) == required and set(schema["properties"]) == props, name
        assert all(p.get("description") for p in schema["properties"].values()), name
        assert t.annotations is not None and t.annotations.read_only_hint is True
        assert t.description and "not instructions" in t.description
    assert set(tools["memory_search"].input_schema["properties"]["match_mode"]["enum"]) == {"any", "all", "phrase"}
    assert "UTF-8 byte offsets" in (tools["memory_retrieve"].description or "")
    assert "character offsets" not in (tools["memory_retrieve"].description or "")


def test_each_tool_answers_and_no_canary_ever_appears(env: Env) -> None:
    w = env.w
    token = grant(env, scopes=["search", "read", "retrieve", "ask"])["token"]
    missing = new_record_id()
    env.gen.bodies.clear()

    async def go(s: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["search"] = await call(s, "memory_search", query="zebra CANARYPRIVATE CANARYCRED CANARYFILE", limit=50)
        out["retrieve"] = await call(s, "memory_retrieve", query="zebra CANARYPRIVATE CANARYCRED", limit=50)
        out["read"] = await call(s, "memory_read", id=w.public)
        out["read_rev"] = await call(s, "memory_read", id=w.card, revision=1)
        out["hidden"] = [await call(s, "memory_read", id=rid) for rid in (w.private, w.credential, w.file, w.b_record)]
        out["missing"] = await call(s, "memory_read", id=missing)
        out["ask"] = await call(s, "memory_ask", question="Who feeds the zebra? CANARYPRIVATE CANARYCRED")
        out["bad_args"] = await s.call_tool("memory_search", {"query": "zebra", "limit": 0})
        return out

    out = with_mcp(env, token, go)
    search = ok(out["search"])
    assert {r["id"] for r in search["results"]} == {w.public, w.card}
    assert set(search["results"][0]) == {"id", "revision", "kind", "title", "score", "snippet", "source", "line", "end_line"}
    frags = ok(out["retrieve"])
    assert {r["record_id"] for r in frags["results"]} <= {w.public, w.card} and frags["results"]
    first = frags["results"][0]
    assert first["label"] == "S1" and {"record_id", "revision", "title", "start", "end", "score", "text"} <= set(first)
    assert f"[S1] record_id={first['record_id']}" in text_of(out["retrieve"])
    read = ok(out["read"])
    assert read["body"] == "The lighthouse keeper feeds the zebra every morning." and read["revision"] == 1
    assert read["title"] == "Lighthouse" and read["tags"] == []
    assert ok(out["read_rev"])["kind"] == "card"
    absent_code, absent_msg = err(out["missing"])
    assert absent_code == "not_found"
    for rid, r in zip((w.private, w.credential, w.file, w.b_record), out["hidden"], strict=True):
        assert err(r) == (absent_code, absent_msg.replace(missing, rid))
    ask = ok(out["ask"])
    assert ask["status"] == "answered" and ask["answer"].endswith("[S1].")
    assert ask["citations"][0]["label"] == "S1" and ask["citations"][0]["record_id"] in {w.public, w.card}
    assert out["bad_args"].is_error
    everything = json.dumps([r.model_dump() for r in [*out["hidden"], out["search"], out["retrieve"], out["read"], out["ask"]]])
    sent = "".join(env.gen.bodies)
    assert sent and "lighthouse keeper" in sent
    for canary in ("CANARYCRED pin", "CANARYPRIVATE diary", "CANARYFILE", "CANARYBETA", "pin 1234"):
        assert canary not in everything and canary not in sent


def test_a_grant_without_ask_scope_or_for_another_vault_is_refused(env: Env) -> None:
    w = env.w
    token = grant(env)["token"]
    b_token = env.d.call("grant.create", {"vault": w.b, "scopes": ["read"]})["token"]

    async def go(s: ClientSession) -> CallToolResult:
        return await call(s, "memory_ask", question="Who feeds the zebra?")

    code, message = err(with_mcp(env, token, go))
    assert code == "scope_denied" and "ask scope" in message
    assert f"memories grant create {w.a} --scope search,read,retrieve,ask" in message

    async def go_b(s: ClientSession) -> tuple[CallToolResult, CallToolResult]:
        return await call(s, "memory_read", id=w.public), await call(s, "memory_search", query="zebra")

    read_a, search = with_mcp(env, b_token, go_b)
    assert err(read_a)[0] == "not_found"
    assert err(search)[0] == "scope_denied"


def test_revoke_and_expiry_apply_on_the_next_call_and_cancel_a_held_ask(env: Env) -> None:
    results: dict[str, Any] = {}

    def session_for(g: dict[str, Any], cancel: Callable[[], None], key: str) -> None:
        env.gen.release.clear()
        env.gen.held.clear()
        late_before = len(env.gen.answered_late)

        async def go(s: ClientSession) -> None:
            results[key + "_first"] = await call(s, "memory_search", query="zebra")
            async with anyio.create_task_group() as tg:

                async def ask() -> None:
                    results[key + "_ask"] = await call(s, "memory_ask", question=f"{HOLD} who feeds the zebra?")

                tg.start_soon(ask)
                assert await anyio.to_thread.run_sync(env.gen.held.wait, 60)
                await anyio.to_thread.run_sync(cancel)
            # The ask ended while the service still held its answer (cancelled, not waiting for it).
            results[key + "_answered_first"] = len(env.gen.answered_late) > late_before
            env.gen.release.set()  # the service answers now: too late
            await anyio.to_thread.run_sync(lambda: _wait_for(lambda: len(env.gen.answered_late) > late_before))
            results[key + "_next"] = await call(s, "memory_search", query="zebra")

        with_mcp(env, g["token"], go)

    revocable = grant(env, scopes=["search", "ask"])
    session_for(revocable, lambda: env.d.call("grant.revoke", {"grant_id": revocable["grant_id"]}), "revoke")
    # Long enough to spawn the server and start the ask on a loaded machine; it expires mid-ask.
    expiring = grant(env, scopes=["search", "ask"], ttl_seconds=20)
    session_for(expiring, lambda: time.sleep(max(0.0, expiring["expires"] - time.time()) + 0.1), "expire")
    for key, code in (("revoke", "grant_invalid"), ("expire", "grant_expired")):
        ok(results[key + "_first"])
        assert err(results[key + "_ask"])[0] == code, key
        assert results[key + "_answered_first"] is False, key  # cancelled, not waiting for the held answer
        assert err(results[key + "_next"])[0] == code


def _wait_for(cond: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_locked_vault_answers_the_locked_error_and_a_daemon_restart_is_survived(env: Env) -> None:
    w = env.w
    token = grant(env)["token"]

    def restart() -> None:
        env.d.stop()
        env.d.start()
        for v in (w.a, w.b):
            env.d.call("vault.unlock", {"vault": v, "passphrase": PASS})

    async def go(s: ClientSession) -> dict[str, CallToolResult]:
        out = {"before": await call(s, "memory_search", query="lighthouse")}
        await anyio.to_thread.run_sync(lambda: env.d.call("vault.lock", {"vault": w.a}))
        out["locked_search"] = await call(s, "memory_search", query="lighthouse")
        out["locked_read"] = await call(s, "memory_read", id=w.private)
        await anyio.to_thread.run_sync(lambda: env.d.call("vault.unlock", {"vault": w.a, "passphrase": PASS}))
        out["unlocked"] = await call(s, "memory_read", id=w.public)
        await anyio.to_thread.run_sync(restart)
        out["after_restart"] = await call(s, "memory_search", query="lighthouse")
        await anyio.to_thread.run_sync(env.d.stop)
        out["daemon_down"] = await call(s, "memory_search", query="lighthouse")
        await anyio.to_thread.run_sync(restart)
        out["back"] = await call(s, "memory_read", id=w.public)
        return out

    out = with_mcp(env, token, go)
    assert [r["id"] for r in ok(out["before"])["results"]] == [w.public]
    locked = ("vault_locked", f"the vault of this grant is locked: the person must run `memories vault unlock {w.a}`")
    assert err(out["locked_search"]) == locked and err(out["locked_read"]) == locked
    assert ok(out["unlocked"])["id"] == w.public
    assert [r["id"] for r in ok(out["after_restart"])["results"]] == [w.public]
    code, message = err(out["daemon_down"])
    assert code == "daemon_unreachable" and "memories vault unlock" in message
    assert ok(out["back"])["id"] == w.public


def _daemon_connections(d: Daemon) -> int:
    """Open connections to the daemon's sockets, its vault processes' included (Linux: accepted
    sockets carry the listener's path)."""
    run = str(d.socket_path.parent) + "/"
    n = 0
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith(run) and fields[5] == "03":  # 03: connected
            n += 1
    return n


def test_the_first_call_after_a_restart_succeeds_although_several_connections_were_pooled(env: Env) -> None:
    w = env.w
    token = grant(env, scopes=["search", "read", "ask"])["token"]
    env.gen.release.clear()
    env.gen.held.clear()
    seen: dict[str, int] = {}

    def restart() -> None:
        seen["before_restart"] = _daemon_connections(env.d)
        env.d.stop()
        env.d.start()
        for v in (w.a, w.b):
            env.d.call("vault.unlock", {"vault": v, "passphrase": PASS})

    async def go(s: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {"searches": []}
        async with anyio.create_task_group() as tg:

            async def ask() -> None:
                out["ask"] = await call(s, "memory_ask", question=f"{HOLD} who feeds the zebra?")

            async def search() -> None:
                out["searches"].append(await call(s, "memory_search", query="lighthouse"))

            tg.start_soon(ask)
            assert await anyio.to_thread.run_sync(env.gen.held.wait, 60)
            # The held ask keeps one connection busy: these calls, side by side with it, need others.
            async with anyio.create_task_group() as searches:
                for _ in range(4):
                    searches.start_soon(search)
            env.gen.release.set()
        await anyio.to_thread.run_sync(restart)
        out["after_restart"] = await call(s, "memory_search", query="lighthouse")
        out["then_read"] = await call(s, "memory_read", id=w.public)
        return out

    out = with_mcp(env, token, go)
    assert ok(out["ask"])["status"] == "answered"
    assert len(out["searches"]) == 4 and all(ok(r)["results"] for r in out["searches"])
    assert seen["before_restart"] >= 2  # the pool held more than one connection when the daemon went away
    assert [r["id"] for r in ok(out["after_restart"])["results"]] == [w.public]
    assert ok(out["then_read"])["id"] == w.public


def test_the_token_appears_in_no_file_log_or_grant_list_output(env: Env) -> None:
    g = grant(env, label="audit")

    async def go(s: ClientSession) -> CallToolResult:
        return await call(s, "memory_search", query="zebra")

    ok(with_mcp(env, g["token"], go))
    secret = g["token"].split("_", 3)[3]
    for args in (["grant", "list"], ["--json", "grant", "list"], ["grant", "list", env.w.a]):
        r = subprocess.run(
            [sys.executable, "-c", BOOT, "--home", str(env.d.home), *args],
            capture_output=True, text=True, cwd=str(REPO), timeout=60, env=dict(os.environ, COLUMNS="200"),
        )
        assert r.returncode == 0, r.stderr
        assert g["grant_id"] in r.stdout and secret not in r.stdout + r.stderr
    for root in (env.d.home, *env.errlogs):
        paths = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for p in paths:
            assert secret.encode() not in p.read_bytes(), p


def test_without_a_grant_the_server_exits_with_one_line_saying_how_to_create_one(env: Env, tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if k != "MEMORIES_GRANT"}
    r = subprocess.run([sys.executable, "-c", BOOT, "--home", str(env.d.home), "mcp"], capture_output=True, text=True,
                       cwd=str(REPO), env=base, timeout=60, input="")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "memories grant create VAULT_ID" in r.stderr and "MEMORIES_GRANT" in r.stderr
    token_file = tmp_path / "grant"
    token_file.write_text("not-a-token\n")
    r = subprocess.run([sys.executable, "-c", BOOT, "--home", str(env.d.home), "mcp", "--grant-file", str(token_file)],
                       capture_output=True, text=True, cwd=str(REPO), env=base, timeout=60, input="")
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1 and "malformed" in r.stderr


def test_the_mcp_server_never_imports_numpy_onnxruntime_or_jieba() -> None:
    code = (
        "import sys; from memories_cli.mcp_server import DaemonLink, build_server; from memories_cli.grant_cmds import mcp\n"
        "from memoriesd.home import Home; build_server(DaemonLink(Home(__import__('pathlib').Path('/nonexistent')), 'mg_x'))\n"
        "print(sorted(m for m in ('numpy', 'onnxruntime', 'jieba', 'tokenizers') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_a_config_edit_shows_as_a_restart_notice_in_tool_results_until_undone(env: Env) -> None:
    token = grant(env, scopes=["search"])["token"]
    cfg = env.d.home / "config.toml"
    before = cfg.read_text()

    async def go(s: ClientSession) -> list[dict[str, Any]]:
        seen = [ok(await call(s, "memory_search", query="zebra"))]
        cfg.write_text(before + "\n[daemon]\nauto_lock_minutes = 7\n")
        try:
            r = await call(s, "memory_search", query="zebra")
            seen.append(ok(r))
            assert text_of(r).count("memories daemon restart") == 1  # once, as a notice line
            failed = await call(s, "memory_read", id=new_record_id())  # an error reply says it too
            assert err(failed)[0] == "scope_denied" and failed.structured_content is not None
            assert [n for n in failed.structured_content["notices"] if str(cfg) in n]
        finally:
            cfg.write_text(before)  # compared parsed: the same settings again, nothing pending
        seen.append(ok(await call(s, "memory_search", query="zebra")))
        return seen

    first, edited, undone = with_mcp(env, token, go)
    assert "notices" not in first and "notices" not in undone
    assert [n for n in edited["notices"] if str(cfg) in n and "memories daemon restart" in n]
    assert edited["results"] == first["results"]
