"""`memory summarize` and `memory prune`: tidy memory over time, by hand, through the real daemon.

Old records are real records: the daemon is stopped, records with past timestamps are committed to
the vault with its passphrase through the store (as any second writer of the vault files would),
and the daemon is started again. Summaries come from a real OpenAI-compatible chat server on
127.0.0.1 (tests/servers.py). Canary words planted in the originals must be in no file of the home
once they are summarized and forgotten.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from memoriesd.vault.records import Record, new_record_id
from memoriesd.vault.store import VaultStore

from .conftest import Daemon, DaemonError, all_file_bytes, cli_json, run_cli, short_tmpdir, write_config
from .servers import Mirror, Scripted

PASS = "correct horse"
CHAT = "/v1/chat/completions"
DAY = 86_400.0
NEEDLES = (b"quokka", "quokka".encode("utf-16-le"))


def chat(content: str) -> Scripted:
    return Scripted.json(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]})


def summary_reply(text: str) -> Scripted:
    return chat(json.dumps({"summary": text}))


@pytest.fixture(scope="module")
def server() -> Iterator[Mirror]:
    with Mirror() as m:
        yield m


def _start(config: str, *, device_only: bool = False) -> tuple[Daemon, str]:
    home = short_tmpdir("td") / "h"
    write_config(home, config)
    d = Daemon(home).start()
    vid = str(d.call("vault.create", {"name": "tidy", "passphrase": PASS, "device_only": device_only})["vault_id"])
    return d, vid


def _gen_config(url: str, timeout: float = 2) -> str:
    return (
        f'[generation]\nprotocol = "compatible"\nurl = "{url}"\nmodel = "test-model"\n'
        f"[http]\nretries = 1\nbackoff_ms = 10\ntimeout_seconds = {timeout}\n"
    )


@pytest.fixture
def gd(request: pytest.FixtureRequest, server: Mirror) -> Iterator[tuple[Daemon, str]]:
    """A daemon with a generation service; ``@pytest.mark.parametrize("gd", [seconds], indirect=True)``
    sets its HTTP timeout (a test that holds an answer must not see it time out)."""
    d, vid = _start(_gen_config(server.url + CHAT, getattr(request, "param", 2)))
    with server.lock:
        server.requests.clear()
        server.script.clear()
    yield d, vid
    d.stop()
    shutil.rmtree(d.home.parent, ignore_errors=True)


def old_fact(text: str, days_ago: float, *, importance: float = 0.5, category: str = "preference", private: bool = False) -> Record:
    t = round(time.time() - days_ago * DAY, 3)
    return Record(new_record_id(), 1, "fact", "", text, private, (), meta={"category": category},
                  private_meta={"importance": importance}, created=t, updated=t)


def plant(d: Daemon, vid: str, records: list[Record]) -> list[str]:
    """Commit ``records`` (with their own timestamps) while the daemon is stopped; unlock again."""
    d.stop()
    store = VaultStore.open(d.home / "vaults" / vid, passphrase=bytearray(PASS.encode()))
    try:
        store.commit(records)
    finally:
        store.close()
    d.start()
    d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
    return [r.id for r in records]


def remember(d: Daemon, vid: str, *texts: str) -> list[str]:
    """Facts remembered now (``--older-than 0`` takes them)."""
    return [str(d.call("memory.remember", {"vault": vid, "text": t, "category": "preference"})["id"]) for t in texts]


def record_files(d: Daemon, vid: str) -> dict[str, bytes]:
    """The vault's record files: log and head (a write changes them)."""
    return {p.name: data for p, data in all_file_bytes(d.home / "vaults" / vid) if p.name.startswith(("log-", "head"))}


def ids_of(out: dict[str, Any], key: str = "candidates") -> list[str]:
    return [r["id"] for r in out[key]]


def live_ids(d: Daemon, vid: str) -> set[str]:
    return {r["id"] for r in d.call("memory.list", {"vault": vid})["records"]}


# ---------------------------------------------------------------------------- summarize


def test_dry_run_lists_old_facts_with_their_token_total_and_writes_nothing(gd: tuple[Daemon, str], server: Mirror) -> None:
    d, vid = gd
    old = plant(d, vid, [
        old_fact("The user prefers green tea to coffee in the morning.", 50),
        old_fact("The user prefers trains to planes for trips under 600 km.", 40),
        old_fact("The user prefers paper notebooks for sketching.", 31),
        old_fact("The user keeps a private diary about the garden.", 60, private=True),
    ])[:3]
    fresh = d.call("memory.remember", {"vault": vid, "text": "The user prefers dark mode in every editor.", "category": "preference"})["id"]
    before = record_files(d, vid)
    out = cli_json(d.home, "memory", "summarize", vid, "--older-than", "30", "--kind", "fact")
    assert out["dry_run"] is True and ids_of(out) == old  # oldest first; private and fresh facts are not candidates
    assert out["tokens"] == sum(c["tokens"] for c in out["candidates"]) > 0 and out["tokenizer"] == "estimate"
    assert [(b["records"], b["tokens"]) for b in out["batches"]] == [(3, out["tokens"])]
    assert out["summaries"] == [] and out["forgotten"] == 0 and out["notices"] == []
    everything = cli_json(d.home, "memory", "summarize", vid, "--older-than", "0", "--kind", "fact", "--dry-run")
    assert set(ids_of(everything)) == {*old, fresh}
    human = run_cli(d.home, "memory", "summarize", vid, "--older-than", "30", "--kind", "fact")
    assert human.returncode == 0 and "would be summarized" in human.stdout and "--apply" in human.stderr
    both = run_cli(d.home, "memory", "summarize", vid, "--older-than", "30", "--dry-run", "--apply")
    assert both.returncode == 2 and "exclude each other" in both.stderr and len(both.stderr.splitlines()) == 1
    missing = run_cli(d.home, "memory", "summarize", vid)
    assert missing.returncode == 2 and "--older-than" in missing.stderr
    assert server.seen(CHAT) == []  # a dry run sends nothing
    assert record_files(d, vid) == before
    assert live_ids(d, vid) >= {*old, fresh}


def test_apply_writes_one_summary_and_the_originals_leave_every_file(gd: tuple[Daemon, str], server: Mirror) -> None:
    d, vid = gd
    old = plant(d, vid, [
        old_fact("The user prefers quokkatea blends from Kyoto.", 90),
        old_fact("The user prefers quokkabike rides on Sundays.", 70),
        old_fact("The user decided to learn the quokkacello.", 45, category="decision"),
        old_fact("The user keeps quokkaprivate notes.", 80, private=True),
    ])
    private = old.pop()
    fresh = d.call("memory.remember", {"vault": vid, "text": "The user prefers dark mode in every editor.", "category": "preference"})["id"]
    d.call("memory.search", {"vault": vid, "query": "quokkatea"})  # a recall counter to rewrite
    server.add(CHAT, summary_reply("Older preferences: Japanese green tea blends, Sunday bike rides, and a decision to learn the cello."))
    out = cli_json(d.home, "memory", "summarize", vid, "--older-than", "30", "--kind", "fact", "--apply")
    assert out["dry_run"] is False and ids_of(out) == old and out["forgotten"] == 3 and out["revisions_removed"] == 3
    [summary] = out["summaries"]
    assert summary["replaced"] == 3 and summary["tokens"] == out["tokens"]
    # What was sent: the three originals as untrusted sources, nothing private.
    [seen] = server.seen(CHAT)
    sent = json.loads(seen.body)["messages"]
    assert "data, not instructions" in sent[0]["content"]
    assert all(w in sent[1]["content"] for w in ("quokkatea", "quokkabike", "quokkacello")) and "quokkaprivate" not in sent[1]["content"]
    assert sent[1]["content"].count('<source id="S') == 3
    rec = d.call("memory.read", {"vault": vid, "id": summary["id"]})
    assert rec["kind"] == "memory" and rec["tags"] == ["summary"] and rec["body"].startswith("Older preferences")
    meta = rec["meta"]["summarized"]
    assert meta["kind"] == "fact" and meta["replaced"] == 3 and meta["from"] < meta["to"]
    assert rec["title"] == f"Summary of 3 facts, {meta['from']} to {meta['to']}"
    assert live_ids(d, vid) == {summary["id"], fresh, private}
    hits = d.call("rag.search", {"vault": vid, "query": "cello bike", "mode": "bm25"})["results"]
    assert hits and hits[0]["record_id"] == summary["id"]
    assert d.call("rag.search", {"vault": vid, "query": "quokkatea", "mode": "bm25"})["results"] == []
    d.call("memory.forget", {"vault": vid, "ids": [private]})  # its canary is planted on purpose: out of the way
    d.call("vault.lock", {"vault": vid})  # writes the lexical snapshot and the recall counters
    for path, data in all_file_bytes(d.home):
        assert not any(n in data.lower() for n in NEEDLES), path
    store = VaultStore.open(d.home / "vaults" / vid, passphrase=bytearray(PASS.encode()))
    try:
        assert not set(old) & set(store.records)
        assert all("quokka" not in json.dumps(r.to_entry()) for revs in store.records.values() for r in revs)
    finally:
        store.close()
    assert "quokka" not in d.log_text()


def test_old_conversations_by_session_date_become_one_summary_with_their_speakers(gd: tuple[Daemon, str], server: Mirror) -> None:
    d, vid = gd

    def capture(text: str, date: str | None = None) -> str:
        params = {"vault": vid, "text": text, "format": "markdown", "extract": False, **({"date": date} if date else {})}
        return str(d.call("memory.capture", params)["records"][0]["id"])

    first = capture("Alice: I adopted a quokkapet named Pip.\n\nBob: That is lovely!\n", "2023-05-08T13:56:00")
    second = capture("Alice: Pip learned the quokkatrick.\n\nCarol: Show me next week.\n", "2023-06-20")
    recent = capture("Alice: We should plan the autumn trip.\n\nBob: Lisbon, maybe.\n")  # captured now, no date
    dry = cli_json(d.home, "memory", "summarize", vid, "--older-than", "365")
    assert dry["kind"] == "conversation" and ids_of(dry) == [first, second]
    assert [c["day"] for c in dry["candidates"]] == ["2023-05-08", "2023-06-20"]
    server.add(CHAT, summary_reply("In May 2023 Alice adopted a pet named Pip; by June it had learned a trick."))
    out = cli_json(d.home, "memory", "summarize", vid, "--older-than", "365", "--apply")
    [summary] = out["summaries"]
    assert (summary["from"], summary["to"], summary["replaced"]) == ("2023-05-08", "2023-06-20", 2)
    sent = json.loads(server.seen(CHAT)[0].body)["messages"][1]["content"]
    assert 'date="2023-05-08"' in sent and "Alice: I adopted a quokkapet" in sent and "autumn" not in sent
    rec = d.call("memory.read", {"vault": vid, "id": summary["id"]})
    assert rec["title"] == "Summary of 2 conversations, 2023-05-08 to 2023-06-20"
    assert rec["meta"]["speakers"] == ["Alice", "Bob", "Carol"] and rec["meta"]["summarized"]["kind"] == "conversation"
    assert live_ids(d, vid) == {summary["id"], recent}
    d.call("vault.lock", {"vault": vid})
    for path, data in all_file_bytes(d.home):
        assert not any(n in data.lower() for n in NEEDLES), path


def test_a_failing_or_malformed_model_reply_forgets_nothing(gd: tuple[Daemon, str], server: Mirror) -> None:
    d, vid = gd
    old = remember(d, vid, "The user prefers oat milk.", "The user prefers rye bread.")
    before = record_files(d, vid)
    replies = [
        ([Scripted.json(500, {"error": {"message": "overloaded"}})] * 2, "http_error"),  # every attempt fails
        ([chat("Sure! Here is a summary: oat milk and rye bread.")], "invalid_model_output"),
        ([chat('{"summary": "Oat milk, rye bread."} {"again": 1}')], "invalid_model_output"),
        ([chat(json.dumps({"summary": "Oat milk.", "forget": "everything"}))], "invalid_model_output"),
        ([summary_reply("   ")], "invalid_model_output"),
        ([chat(json.dumps({"summary": "x" * 8001}))], "invalid_model_output"),
        ([chat('{"summary": "a", "summary": "b"}')], "invalid_model_output"),
    ]
    for steps, code in replies:
        server.add(CHAT, *steps)
        r = run_cli(d.home, "memory", "summarize", vid, "--older-than", "0", "--kind", "fact", "--apply")
        assert r.returncode == 1 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith("error[") and code in r.stderr, r.stderr
        assert "oat" not in r.stderr.lower()  # the model's text is never quoted
        assert record_files(d, vid) == before
        assert live_ids(d, vid) == set(old)


@pytest.mark.parametrize("gd", [120], indirect=True)
def test_a_record_changed_while_the_summary_is_pending_cancels_it(gd: tuple[Daemon, str], server: Mirror) -> None:
    d, vid = gd
    old = remember(d, vid, "The user prefers oat milk.", "The user prefers rye bread.")
    held = threading.Event()  # the summary comes only after the change
    server.add(CHAT, Scripted(200, {"Content-Type": "application/json"}, summary_reply("Oat milk, rye bread.").body, hold=held))
    proc = subprocess.Popen([sys.executable, "-m", "memories_cli.main", "--home", str(d.home), "memory", "summarize", vid,
                             "--older-than", "0", "--kind", "fact", "--apply"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not server.seen(CHAT):
            assert time.monotonic() < deadline and proc.poll() is None, "the summary was never asked for"
            time.sleep(0.02)
        # The same text with another importance: a new revision of the first fact while the reply is pending.
        revised = d.call("memory.remember", {"vault": vid, "text": "The user prefers oat milk.", "category": "preference", "importance": 0.9})
        assert revised["action"] == "updated"
        held.set()
        _, stderr = proc.communicate(timeout=120)
    finally:
        held.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1 and stderr.startswith("error[cancelled]") and "nothing was written or forgotten" in stderr, stderr
    assert live_ids(d, vid) == set(old)


def test_batches_bound_what_one_request_sends(gd: tuple[Daemon, str], server: Mirror) -> None:
    d, vid = gd
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa"
    facts = [old_fact(f"The user noted item {i}: {words} {words} {words}.", 60 - i) for i in range(5)]  # ~75 tokens each
    long = old_fact("The user prefers " + "very " * 180 + "long notes.", 70)
    ids = plant(d, vid, [*facts, long])
    dry = cli_json(d.home, "memory", "summarize", vid, "--older-than", "1", "--kind", "fact", "--batch-tokens", "200")
    per = {c["id"]: c for c in dry["candidates"]}
    assert per[long.id]["batch"] is None and "longer than --batch-tokens 200" in dry["notices"][0]
    assert [b["records"] for b in dry["batches"]] == [2, 2, 1]
    assert all(b["tokens"] + 16 * b["records"] <= 200 for b in dry["batches"])
    server.add(CHAT, *(summary_reply(f"Items noted, part {i}.") for i in range(3)))
    out = cli_json(d.home, "memory", "summarize", vid, "--older-than", "1", "--kind", "fact", "--batch-tokens", "200", "--apply")
    assert [s["replaced"] for s in out["summaries"]] == [2, 2, 1] and out["forgotten"] == 5
    bodies = [json.loads(s.body)["messages"][1]["content"] for s in server.seen(CHAT)]
    assert [b.count('<source id="S') for b in bodies] == [2, 2, 1]
    assert live_ids(d, vid) == {long.id, *(s["id"] for s in out["summaries"])}
    assert ids[0] not in live_ids(d, vid)


def test_without_a_generation_service_apply_says_how_to_configure_one() -> None:
    d, vid = _start("")
    try:
        old = remember(d, vid, "The user prefers oat milk.")
        dry = cli_json(d.home, "memory", "summarize", vid, "--older-than", "0", "--kind", "fact")
        assert ids_of(dry) == old and any("[generation]" in n for n in dry["notices"])
        r = run_cli(d.home, "memory", "summarize", vid, "--older-than", "0", "--kind", "fact", "--apply")
        assert r.returncode == 1 and r.stderr.startswith("error[generation_not_configured]") and "[generation]" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        assert live_ids(d, vid) == set(old)
    finally:
        d.stop()
        shutil.rmtree(d.home.parent, ignore_errors=True)


def test_a_device_only_vault_never_sends_its_records_to_a_remote_service() -> None:
    d, vid = _start(_gen_config("https://summaries.example.invalid/v1/chat/completions"), device_only=True)
    try:
        old = remember(d, vid, "The user prefers oat milk.")
        dry = cli_json(d.home, "memory", "summarize", vid, "--older-than", "0", "--kind", "fact")
        assert any("device-only" in n for n in dry["notices"])
        r = run_cli(d.home, "memory", "summarize", vid, "--older-than", "0", "--kind", "fact", "--apply")
        assert r.returncode == 1 and r.stderr.startswith("error[device_only]"), r.stderr
        assert live_ids(d, vid) == set(old)
    finally:
        d.stop()
        shutil.rmtree(d.home.parent, ignore_errors=True)


# ---------------------------------------------------------------------------- prune


def test_prune_criteria_combine_and_apply_forgets_for_real() -> None:
    d, vid = _start("")
    try:
        i = dict(zip(
            ("old_low", "old_high", "old_recalled", "old_private", "mid_low"),
            plant(d, vid, [
                old_fact("The user once liked quokkajazz records.", 200, importance=0.1),
                old_fact("The user is allergic to peanuts.", 300, importance=0.9, category="profile"),
                old_fact("The user prefers walking meetings.", 250, importance=0.2),
                old_fact("The user keeps a secret recipe.", 400, importance=0.1, private=True),
                old_fact("The user prefers blue pens.", 20, importance=0.1),
            ]),
            strict=True,
        ))
        i["new_low"] = d.call("memory.remember", {"vault": vid, "text": "The user prefers oolong tea.", "importance": 0.2})["id"]
        assert d.call("memory.search", {"vault": vid, "query": "walking meetings"})["results"]  # one recall
        before = record_files(d, vid)

        def pruned(**criteria: Any) -> set[str]:
            out = d.call("memory.prune", {"vault": vid, **criteria})
            assert out["dry_run"] is True and out["forgotten"] == 0
            return set(ids_of(out, "records"))

        assert pruned(older_than=100) == {i["old_low"], i["old_high"], i["old_recalled"]}
        assert pruned(below_importance=0.5) == {i["old_low"], i["old_recalled"], i["mid_low"], i["new_low"]}
        assert pruned(never_recalled=True) == {i["old_low"], i["old_high"], i["mid_low"], i["new_low"]}
        assert pruned(older_than=10, below_importance=0.5) == {i["old_low"], i["old_recalled"], i["mid_low"]}
        assert pruned(older_than=100, below_importance=0.5, never_recalled=True) == {i["old_low"]}
        assert pruned(below_importance=0) == set()
        dry = cli_json(d.home, "memory", "prune", vid, "--older-than", "100", "--below-importance", "0.5", "--never-recalled", "--dry-run")
        assert ids_of(dry, "records") == [i["old_low"]] and dry["records"][0]["recalls"] == 0
        for bad, why in ((("--dry-run",), "say which facts are stale"), (("--below-importance", "1.5"), "from 0 to 1"),
                         (("--never-recalled", "--dry-run", "--apply"), "exclude each other")):
            r = run_cli(d.home, "memory", "prune", vid, *bad)
            assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        human = run_cli(d.home, "memory", "prune", vid, "--never-recalled")
        assert human.returncode == 0 and "would be forgotten" in human.stdout and "--apply" in human.stderr
        assert record_files(d, vid) == before

        out = cli_json(d.home, "memory", "prune", vid, "--older-than", "100", "--never-recalled", "--apply")
        assert set(ids_of(out, "records")) == {i["old_low"], i["old_high"]} and out["forgotten"] == 2
        assert live_ids(d, vid) == {i["old_recalled"], i["old_private"], i["mid_low"], i["new_low"]}
        assert cli_json(d.home, "memory", "prune", vid, "--older-than", "100", "--never-recalled", "--apply")["records"] == []
        d.call("vault.lock", {"vault": vid})
        for path, data in all_file_bytes(d.home):
            assert b"quokkajazz" not in data.lower(), path
    finally:
        d.stop()
        shutil.rmtree(d.home.parent, ignore_errors=True)


# ---------------------------------------------------------------------------- grants


def test_a_grant_with_every_scope_can_neither_summarize_nor_prune(gd: tuple[Daemon, str], server: Mirror) -> None:
    d, vid = gd
    old = remember(d, vid, "The user prefers oat milk.")
    scopes = ["search", "read", "retrieve", "ask", "context", "remember", "forget", "forget-all"]
    token = d.call("grant.create", {"vault": vid, "scopes": scopes})["token"]
    s = d.connect(token=token)
    try:
        assert d.request("session.grant", {"token": token}, sock=s)["result"]["verified"] is True
        for method, params in (
            ("memory.summarize", {"vault": vid, "kind": "fact", "older_than": 0, "apply": True}),
            ("memory.prune", {"vault": vid, "older_than": 0, "apply": True}),
        ):
            msg = d.request(method, params, sock=s)
            assert msg["error"]["code"] == "scope_denied", msg
    finally:
        s.close()
    assert server.seen(CHAT) == [] and live_ids(d, vid) == set(old)
    with pytest.raises(DaemonError) as bad:  # the person's own connection may (the criteria are checked)
        d.call("memory.prune", {"vault": vid})
    assert bad.value.code == "usage"

