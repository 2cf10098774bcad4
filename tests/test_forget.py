"""`memory forget`: records go with every revision and everything derived from them, for real.

A real daemon with the small real model (all-MiniLM-L6-v2): canary words are planted in titles,
bodies, tags, an ingested card, a fact's current text and a fact's earlier revision; after
`memory forget --scope topic` none of them is in any file of the home, in the vault decrypted
with its passphrase (every revision, the lexical snapshot, the sealed vectors), or in any search.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import CallToolResult

from memoriesd.index.snapshot import SnapshotRejected, read_snapshot, version_tag
from memoriesd.index.vectors.maintenance import live_fragment_keys
from memoriesd.index.vectors.names import list_sidecars, read_spaces, sidecar_opaque_id
from memoriesd.index.vectors.sidecar import VectorStore
from memoriesd.memory.recalls import Recalls
from memoriesd.text.segment import DEFAULT
from memoriesd.vault import crypto
from memoriesd.vault.store import VaultStore

from .conftest import REPO, SHARED, Daemon, all_file_bytes, cli_json, create_vault, run_cli, running_daemon
from .test_mcp import BOOT, call, ok, text_of

MINILM = SHARED / "models" / "all-MiniLM-L6-v2-onnx"
PASS = "correct horse"
TOPIC = "xylophonist"
# Every canary starts with "quokka": the FTS5 tables hold stemmed, lower-cased terms, so the
# prefix is what a decrypted index would show.
CANARIES = ("quokkatitle", "quokkabody", "quokkatag", "quokkahist", "quokkacard", "quokkafact")
NEEDLES = (b"quokka", b"xylophon", "quokka".encode("utf-16-le"))


@contextlib.contextmanager
def _daemon(extra: str = "") -> Iterator[tuple[Daemon, str]]:
    assert MINILM.is_dir(), f"{MINILM} is missing"
    with running_daemon(f'[embedding.local]\nmodel_dir = "{MINILM}"\nthreads = 2\n[index]\nbackground = false\n{extra}') as d:
        yield d, create_vault(d, passphrase=PASS)


def _add(d: Daemon, vid: str, title: str, body: str, tags: list[str] | None = None) -> str:
    return str(d.call("memory.add", {"vault": vid, "title": title, "body": body, "tags": tags or []})["id"])


def _remember(d: Daemon, vid: str, text: str, **kw: Any) -> dict[str, Any]:
    return dict(d.call("memory.remember", {"vault": vid, "text": text, **kw}))


def _plant(d: Daemon, vid: str, folder: Path) -> tuple[set[str], dict[str, str]]:
    """The canary records (ids) and the survivors (name -> id)."""
    ids = {
        _add(d, vid, f"quokkatitle {TOPIC} notes", "Some ordinary words about a concert hall."),
        _add(d, vid, "Concert", f"The {TOPIC} quokkabody played at the harbour festival."),
        _add(d, vid, "Rehearsal", "A note about rehearsals on Thursday evenings.", [TOPIC, "quokkatag"]),
    }
    hist = _remember(d, vid, f"The user is a {TOPIC} quokkahist in an orchestra.", category="profile", key="instrument")
    assert _remember(d, vid, "The user switched to playing the cello.", category="profile", key="instrument")["action"] == "updated"
    ids.add(hist["id"])
    ids.add(_remember(d, vid, f"The user's {TOPIC} teacher quokkafact lives in Oslo.")["id"])
    folder.mkdir()
    (folder / "practice.md").write_text(f"# Practice\n\nThe {TOPIC} quokkacard tuned the bars before the show.\n")
    assert cli_json(d.home, "rag", "ingest", vid, str(folder / "practice.md"))["added"] == 1
    card = [r["id"] for r in d.call("memory.list", {"vault": vid, "kind": "card"})["records"]]
    ids.update(card)
    tea = _add(d, vid, "Tea", "The user likes green tea in the afternoon.")
    d.call("memory.update", {"vault": vid, "id": tea, "body": "The user likes green tea and oolong in the afternoon."})
    mode = _remember(d, vid, "The user prefers dark mode in every editor.", category="preference")["id"]
    return ids, {"tea": tea, "mode": mode}


def _found_anywhere(d: Daemon, vid: str, words: tuple[str, ...]) -> set[str]:
    """Record ids any search returns for any of ``words``."""
    found: set[str] = set()
    for w in words:
        found |= {r["id"] for r in d.call("memory.search", {"vault": vid, "query": w})["results"]}
        for mode in ("bm25", "vector", "hybrid"):
            # min_score -1: every vector neighbour, not only those above the relevance floor
            res = d.call("rag.search", {"vault": vid, "query": w, "mode": mode, "limit": 50, "min_score": -1})
            found |= {r["record_id"] for r in res["results"]}
    return found


def _has_needle(data: bytes) -> bool:
    low = data.lower()
    return any(n in low for n in NEEDLES)


def _snapshot_db(store: VaultStore) -> bytes | None:
    sealer = crypto.Sealer(store.key, crypto.LABEL_LEXICAL_SNAPSHOT)
    try:
        return read_snapshot(store.dir, store.vault_id, sealer, version_tag(DEFAULT)).db
    except SnapshotRejected:
        return None
    finally:
        sealer.wipe()


def _sealed_vector_keys(store: VaultStore) -> set[str]:
    sealer = crypto.Sealer(store.key, crypto.LABEL_VECTORS)
    try:
        spaces = read_spaces(store.dir, vault_id=store.vault_id, open_=sealer.open)
        keys: set[str] = set()
        for path in list_sidecars(store.dir):
            entry = spaces[sidecar_opaque_id(path)]  # every sidecar left is one the vault can name
            vs = VectorStore(path, vault_id=store.vault_id, identity=str(entry["identity"]), dims=int(str(entry["dims"])),
                             seal=sealer.seal, open_=sealer.open)
            got = vs.peek_keys()
            assert got is not None
            keys |= got
        return keys
    finally:
        sealer.wipe()


def _vault_dir(d: Daemon, vid: str) -> Path:
    return d.home / "vaults" / vid


def test_forgetting_a_topic_leaves_no_trace_in_files_decrypted_vault_or_search(tmp_path: Path) -> None:
    with _daemon() as (d, vid):
        canary_ids, keep = _plant(d, vid, tmp_path / "notes")
        assert len(canary_ids) == 6
        d.call("rag.index", {"vault": vid})
        assert canary_ids <= _found_anywhere(d, vid, (TOPIC, "quokkabody"))  # FTS5 rows exist, facts are recalled
        # Lock: the lexical snapshot is written; it holds the canaries (the check below can see them).
        d.call("vault.lock", {"vault": vid})
        store = VaultStore.open(_vault_dir(d, vid), passphrase=bytearray(PASS.encode()))
        try:
            db = _snapshot_db(store)
            assert db is not None and b"quokkabodi" in db.lower()
        finally:
            store.close()
        d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        assert canary_ids <= _found_anywhere(d, vid, (TOPIC,))  # the index came back from the snapshot

        everything = ("--kind", "fact", "--kind", "memory", "--kind", "card")  # a query alone takes facts and conversations
        out = cli_json(d.home, "memory", "forget", vid, "--query", TOPIC, "--scope", "topic", *everything, "--yes")
        assert {r["id"] for r in out["records"]} == canary_ids
        assert out["forgotten"] == 6 and out["revisions_removed"] == 7
        assert out["lexical_snapshot"] == "rewritten" and out["vector_entries_dropped"] >= 6
        assert {r["match"] for r in out["records"] if r["category"] == "profile"} == {"history"}

        # No search finds them, in any mode, by any canary.
        assert not _found_anywhere(d, vid, (TOPIC, *CANARIES)) & canary_ids
        vault = _vault_dir(d, vid)
        assert len(list(vault.glob("log-*.bin"))) == 1
        assert not list(vault.glob("preserved-*")) and not list(vault.glob(".*.tmp"))
        for path, data in all_file_bytes(d.home):
            assert not _has_needle(data), path
        survivors = d.call("memory.facts", {"vault": vid})["facts"]
        assert [f["id"] for f in survivors] == [keep["mode"]]
        assert d.call("rag.search", {"vault": vid, "query": "oolong tea", "mode": "bm25"})["results"][0]["record_id"] == keep["tea"]
        d.call("vault.lock", {"vault": vid})

        # Decrypted with the passphrase: no revision, setting, snapshot row or vector is left.
        store = VaultStore.open(vault, passphrase=bytearray(PASS.encode()))
        try:
            assert not canary_ids & set(store.records)
            for revs in store.records.values():
                for r in revs:
                    assert not _has_needle(json.dumps(r.to_entry(), ensure_ascii=False).encode())
            assert not _has_needle(json.dumps(store.settings).encode())
            assert len(store.history(keep["tea"])) == 2  # what was not forgotten keeps every revision
            db = _snapshot_db(store)
            assert db is None or not _has_needle(db)
            assert _sealed_vector_keys(store) == {k for k, _ in live_fragment_keys(store)}
            recalls = Recalls(store)
            assert all(recalls.get(rid) == (0, None) for rid in canary_ids)
            recalls.close()
        finally:
            store.close()
        assert not _has_needle(d.log_text().encode())


def test_dry_run_lists_without_changing_anything_and_off_a_terminal_it_needs_yes() -> None:
    with _daemon() as (d, vid):
        a = _add(d, vid, "Parrot", "The parrot called Kiwi talks every morning.")
        _add(d, vid, "Garden", "Tomatoes grow by the south wall.")
        # The records' files (a dry run may embed fragments: derived vectors are not records).
        files = {p.name: data for p, data in all_file_bytes(_vault_dir(d, vid)) if p.name.startswith(("log-", "head"))}
        dry = cli_json(d.home, "memory", "forget", vid, "--query", "parrot", "--kind", "memory", "--dry-run")
        assert dry["dry_run"] is True and [r["id"] for r in dry["records"]] == [a] and dry["forgotten"] == 0
        human = run_cli(d.home, "memory", "forget", vid, "--query", "parrot", "--kind", "memory", "--dry-run")
        assert human.returncode == 0 and "would be forgotten" in human.stdout and a in human.stdout
        refused = run_cli(d.home, "memory", "forget", vid, "--query", "parrot", "--kind", "memory")  # stdin is not a terminal
        assert refused.returncode == 2 and "--yes" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
        assert {p.name: data for p, data in all_file_bytes(_vault_dir(d, vid)) if p.name.startswith(("log-", "head"))} == files
        unknown = run_cli(d.home, "memory", "forget", vid, "--id", "nosuchrecord0000", "--yes")
        assert unknown.returncode == 4 and "error[not_found]" in unknown.stderr
        both = run_cli(d.home, "memory", "forget", vid, "--all", "--query", "x", "--yes")
        assert both.returncode == 2 and "say what to forget" in both.stderr
        named = run_cli(d.home, "memory", "forget", vid, "--id", a, "--kind", "card", "--yes")  # an id needs no kind
        assert named.returncode == 2 and "--kind goes with --query or --all" in named.stderr
        nothing = run_cli(d.home, "memory", "forget", vid, "--query", "submarine", "--scope", "topic", "--kind", "memory", "--yes")
        assert nothing.returncode == 0 and "nothing to forget" in nothing.stderr
        # On a terminal it lists what would go and asks: "n" keeps it, "y" forgets it.
        code, screen = _on_terminal(d.home, ["memory", "forget", vid, "--query", "parrot", "--kind", "memory"], b"n\n")
        assert code == 1 and a in screen and "nothing was forgotten" in screen
        assert [r["id"] for r in d.call("memory.search", {"vault": vid, "query": "parrot"})["results"]] == [a]
        code, screen = _on_terminal(d.home, ["memory", "forget", vid, "--query", "parrot", "--kind", "memory"], b"y\n")
        assert code == 0 and "Forgot 1 record(s)" in screen
        assert d.call("memory.search", {"vault": vid, "query": "parrot"})["results"] == []


def _on_terminal(home: Path, args: list[str], answer: bytes) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal, answer its question, return its exit code and screen."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "memories_cli.main", "--home", str(home), *args],
        stdin=slave, stdout=slave, stderr=slave, cwd=str(REPO), env=dict(os.environ, COLUMNS="200"),
    )
    os.close(slave)
    screen = b""
    answered = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            screen += chunk
            if not answered and b"[y/N]" in screen:
                os.write(master, answer)
                answered = True
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=30), screen.decode("utf-8", "replace")


def test_specific_forgets_only_the_best_match_and_all_takes_facts_or_one_kind() -> None:
    with _daemon() as (d, vid):
        best = _add(d, vid, "Espresso", "Espresso machine descaling: every month with citric acid.")
        other = _add(d, vid, "Kitchen", "The espresso cups live in the cupboard above the kettle.")
        out = cli_json(d.home, "memory", "forget", vid, "--query", "espresso machine descaling", "--kind", "memory", "--yes")
        assert [r["id"] for r in out["records"]] == [best] and out["forgotten"] == 1
        assert [r["id"] for r in d.call("memory.list", {"vault": vid})["records"]] == [other]

        f1 = _remember(d, vid, "The user is allergic to peanuts.", category="profile")["id"]
        f2 = _remember(d, vid, "We decided to ship on Tuesdays.", category="decision")["id"]
        deleted = _add(d, vid, "Old", "An old note that was deleted.")
        d.call("memory.delete", {"vault": vid, "id": deleted})
        out = cli_json(d.home, "memory", "forget", vid, "--all", "--yes")
        assert {r["id"] for r in out["records"]} == {f1, f2}
        assert d.call("memory.facts", {"vault": vid})["facts"] == []
        assert [r["id"] for r in d.call("memory.list", {"vault": vid})["records"]] == [other]
        # Forgetting compacts: a record deleted earlier is gone from the log too.
        gone = run_cli(d.home, "memory", "history", vid, deleted)
        assert gone.returncode == 4
        out = cli_json(d.home, "memory", "forget", vid, "--all", "--kind", "memory", "--yes")
        assert [r["id"] for r in out["records"]] == [other]
        assert d.call("memory.list", {"vault": vid})["records"] == []


# ---------------------------------------------------------------------------- what a query aims at

SHELL_NOTES = {
    "chsh.md": "# Change your login shell\n\nRun `chsh -s $(which zsh)` to make zsh your login shell; log out and back in.\n",
    "zshrc.md": "# zshrc\n\nThe zsh start-up file ~/.zshrc sets the prompt, aliases and completion for zsh.\n",
    "bash-history.md": "# Bash history\n\nHISTSIZE and HISTFILESIZE set how much bash history is kept.\n",
    "oh-my-zsh.md": "# Oh My Zsh\n\nA framework of zsh plugins and themes; install it after switching to zsh.\n",
    "fish.md": "# Fish\n\nThe fish shell has autosuggestions out of the box, unlike bash or zsh.\n",
}
ZSH_FACT = "The user prefers zsh over bash"


def _shell_vault(d: Daemon, vid: str, folder: Path, embed: bool = True) -> dict[str, str]:
    """The shell notes ingested from ``folder`` and one note added by hand: file stem or title -> record id."""
    folder.mkdir()
    for name, text in SHELL_NOTES.items():
        (folder / name).write_text(text)
    assert cli_json(d.home, "rag", "ingest", vid, str(folder), "--recursive")["added"] == len(SHELL_NOTES)
    cards = {Path(r["source"]).stem: r["id"] for r in d.call("memory.list", {"vault": vid, "kind": "card"})["records"]}
    cards["zsh aliases"] = _add(d, vid, "zsh aliases", "alias ll='ls -l' in zsh; reload with source ~/.zshrc")
    if embed:
        d.call("rag.index", {"vault": vid})
    return cards


def _remember_cli(d: Daemon, vid: str, text: str) -> str:
    out = run_cli(d.home, "memory", "remember", vid, text)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _all_kept(d: Daemon, vid: str, cards: dict[str, str]) -> None:
    for rid in cards.values():
        assert d.call("memory.read", {"vault": vid, "id": rid})["body"], rid


def test_forget_by_query_takes_the_remembered_fact_and_never_a_card_on_its_topic(tmp_path: Path) -> None:
    with _daemon() as (d, vid):
        cards = _shell_vault(d, vid, tmp_path / "shell")
        fact = _remember_cli(d, vid, ZSH_FACT)
        # The dry run shows the same choice as the forget: the fact; the cards on the topic are passed over.
        dry = cli_json(d.home, "memory", "forget", vid, "--query", "zsh", "--dry-run")
        assert [r["id"] for r in dry["records"]] == [fact] and dry["kinds"] == ["fact", "conversation"]
        assert cards["chsh"] in {r["id"] for r in dry["passed_over"]} and dry["passed_over_total"] >= 3
        human = run_cli(d.home, "memory", "forget", vid, "--query", "zsh", "--dry-run")
        assert human.returncode == 0 and fact in human.stdout and "passed over (kept)" in human.stdout
        assert "Also on the topic, kept:" in human.stderr and "--kind card" in human.stderr
        # Cards asked for too: facts and conversations still rank first, and specific takes the fact.
        mixed = cli_json(d.home, "memory", "forget", vid, "--query", "zsh", "--scope", "topic", "--kind", "card", "--kind", "fact", "--dry-run")
        assert mixed["records"][0]["id"] == fact and {r["kind"] for r in mixed["records"][1:]} == {"card"}
        assert [r["kind"] for r in mixed["passed_over"]] == ["memory"]
        one = cli_json(d.home, "memory", "forget", vid, "--query", "zsh", "--kind", "card", "--kind", "fact", "--dry-run")
        assert [r["id"] for r in one["records"]] == [fact]
        out = cli_json(d.home, "memory", "forget", vid, "--query", "zsh", "--yes")
        assert [r["id"] for r in out["records"]] == [fact] and out["forgotten"] == 1
        assert d.call("memory.facts", {"vault": vid})["facts"] == []
        _all_kept(d, vid, cards)

        # --scope topic: every fact and conversation on it, still no card.
        fact = _remember_cli(d, vid, ZSH_FACT)
        other = _remember_cli(d, vid, "The user keeps the zsh config in a dotfiles repo")
        unrelated = _remember_cli(d, vid, "The user drinks green tea in the afternoon")
        out = cli_json(d.home, "memory", "forget", vid, "--query", "zsh", "--scope", "topic", "--yes")
        assert {r["id"] for r in out["records"]} == {fact, other} and {r["kind"] for r in out["records"]} == {"fact"}
        _all_kept(d, vid, cards)
        assert [f["id"] for f in d.call("memory.facts", {"vault": vid})["facts"]] == [unrelated]

        # Nothing but cards match: nothing is chosen, and the answer says how to target them.
        before = {p.name: data for p, data in all_file_bytes(_vault_dir(d, vid)) if p.name.startswith(("log-", "head"))}
        none = run_cli(d.home, "memory", "forget", vid, "--query", "zsh", "--scope", "topic", "--yes")
        assert none.returncode == 0 and "Nothing was chosen: only" in none.stderr
        assert "--kind card" in none.stderr and "--kind memory" in none.stderr and "--id ID" in none.stderr
        assert "passed over (kept)" in none.stdout and cards["chsh"] in none.stdout
        after = {p.name: data for p, data in all_file_bytes(_vault_dir(d, vid)) if p.name.startswith(("log-", "head"))}
        assert after == before
        _all_kept(d, vid, cards)

        # An exact or near-exact fact is the target even among facts on the same topic.
        fact = _remember_cli(d, vid, ZSH_FACT)
        _remember_cli(d, vid, "The user switched the terminal font to a zsh-friendly nerd font")
        out = cli_json(d.home, "memory", "forget", vid, "--query", "the user prefers zsh over bash.", "--yes")
        assert [(r["id"], r["match"]) for r in out["records"]] == [(fact, "exact")]

        # With --kind card the card can be targeted, and only it goes.
        out = cli_json(d.home, "memory", "forget", vid, "--query", "change login shell chsh", "--kind", "card", "--yes")
        assert [r["id"] for r in out["records"]] == [cards["chsh"]]
        by_id = run_cli(d.home, "memory", "forget", vid, "--id", cards["fish"], "--yes").stderr
        assert "Forgot 1 record(s) and 1 revision(s) from vault personal;" in by_id and vid not in by_id  # by name
        _all_kept(d, vid, {k: v for k, v in cards.items() if k not in ("chsh", "fish")})
        assert len(d.call("memory.list", {"vault": vid, "kind": "card"})["records"]) == len(SHELL_NOTES) - 2



def test_forget_by_query_takes_the_conversation_a_turn_said_it_in_and_keeps_the_cards(tmp_path: Path) -> None:
    with _daemon() as (d, vid):
        cards = _shell_vault(d, vid, tmp_path / "shell")
        chat = tmp_path / "chat.md"
        chat.write_text(
            "# Terminal chat\n\nUser: I moved my login shell to fish last week, its autosuggestions are great.\n\n"
            "Assistant: Fish suggests commands from your history as you type.\n\n"
            "User: Remind me to renew the passport in May.\n"
        )
        captured = cli_json(d.home, "memory", "capture", vid, str(chat), "--no-extract")
        (talk,) = [r["id"] for r in captured["records"]]
        dry = cli_json(d.home, "memory", "forget", vid, "--query", "fish autosuggestions", "--dry-run")
        assert [(r["id"], r["kind"]) for r in dry["records"]] == [(talk, "conversation")]
        assert cards["fish"] in {r["id"] for r in dry["passed_over"]}
        out = cli_json(d.home, "memory", "forget", vid, "--query", "fish autosuggestions", "--yes")
        assert [r["id"] for r in out["records"]] == [talk] and out["forgotten"] == 1
        assert d.call("memory.list", {"vault": vid, "kind": "conversation"})["records"] == []
        _all_kept(d, vid, cards)
        # The same turn, asked for among cards only, is not there: the card on fish is the target.
        dry = cli_json(d.home, "memory", "forget", vid, "--query", "fish autosuggestions", "--kind", "card", "--dry-run")
        assert [r["id"] for r in dry["records"]] == [cards["fish"]]


def test_without_a_model_words_choose_the_restated_fact_and_still_never_a_card(tmp_path: Path) -> None:
    with running_daemon() as d:  # no embedding model: BM25 and token sets only
        vid = create_vault(d, passphrase=PASS)
        cards = _shell_vault(d, vid, tmp_path / "shell", embed=False)
        fact = _remember_cli(d, vid, ZSH_FACT)
        other = _remember_cli(d, vid, "The user runs zsh inside tmux")
        dry = cli_json(d.home, "memory", "forget", vid, "--query", "user prefers zsh to bash", "--dry-run")
        assert [(r["id"], r["match"]) for r in dry["records"]] == [(fact, "same")]  # token-set Jaccard 1.0
        topic = cli_json(d.home, "memory", "forget", vid, "--query", "zsh", "--scope", "topic", "--dry-run")
        assert {r["id"] for r in topic["records"]} == {fact, other}
        assert cards["chsh"] in {r["id"] for r in topic["passed_over"]}
        assert not {r["id"] for r in topic["records"]} & set(cards.values())

def _forget_over_mcp(d: Daemon, token: str, calls: list[dict[str, Any]], errlog: Path) -> list[CallToolResult]:
    """Each ``memory_forget`` call in turn through `memories mcp` and the MCP SDK's own stdio client."""
    params = StdioServerParameters(
        command=sys.executable, args=["-c", BOOT, "--home", str(d.home), "mcp"],
        env={"MEMORIES_GRANT": token, "ORT_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(REPO)}, cwd=str(REPO),
    )

    async def main() -> list[CallToolResult]:
        with open(errlog, "a") as err:
            async with stdio_client(params, errlog=err) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                tools = {t.name: t for t in (await session.list_tools()).tools}
                assert "never the person's notes or ingested cards" in (tools["memory_forget"].description or "")
                return [await call(session, "memory_forget", **c) for c in calls]

    return anyio.run(main)


def test_mcp_forget_takes_the_remembered_fact_and_a_card_only_when_its_kind_is_given(tmp_path: Path) -> None:
    with _daemon() as (d, vid):
        cards = _shell_vault(d, vid, tmp_path / "shell")
        fact = _remember(d, vid, ZSH_FACT + ".")["id"]
        token = d.call("grant.create", {"vault": vid, "scopes": ["forget", "read"]})["token"]
        dry, topic, only_cards, card = _forget_over_mcp(d, token, [
            {"query": "zsh", "dry_run": True},
            {"query": "zsh", "scope": "topic"},
            {"query": "zsh", "scope": "topic"},
            {"query": "change login shell chsh", "kind": "card"},
        ], tmp_path / "mcp-stderr.txt")
        listed = ok(dry)
        assert [r["id"] for r in listed["records"]] == [fact] and listed["dry_run"] is True
        assert cards["chsh"] in {r["id"] for r in listed["passed_over"]}
        assert "passed over and kept" in text_of(dry) and "kind card or memory" in text_of(dry)
        gone = ok(topic)
        assert gone["forgotten"] == 1 and [r["id"] for r in gone["records"]] == [fact]
        nothing = ok(only_cards)
        assert nothing["forgotten"] == 0 and nothing["records"] == [] and nothing["passed_over_total"] >= 3
        assert "nothing was chosen" in text_of(only_cards)
        assert [r["id"] for r in ok(card)["records"]] == [cards["chsh"]]
        _all_kept(d, vid, {k: v for k, v in cards.items() if k != "chsh"})
        assert d.call("memory.facts", {"vault": vid})["facts"] == []
