"""The process shape, measured: what a locked vault leaves in the daemon's processes, and what a
frozen vault process costs everyone else (issue 27).

- ``canaries``: distinctive strings given to one vault (title, body, tag, fact, ingested card,
  query, passphrase) while a second vault is unlocked and both use the local model; counted in
  ``/proc/PID/mem`` of every live process of the daemon (router, vault processes, spare, model
  process) while unlocked, after lock, and after the other vault made the model start again. The
  counts after lock must be 0 (``canary_copies_after_lock``).
- ``frozen``: one vault process stopped with SIGSTOP; how long ``vault list``, ``daemon status``
  and another vault's search take, and how long ``vault lock`` of the frozen vault takes to end it.

``tests/test_memory_after_lock.py`` and ``tests/test_process_shape.py`` assert the same properties;
this section reports the figures (docs/architecture.md "The process shape", SECURITY.md "What is wiped").
"""

from __future__ import annotations

import os
import secrets
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .live import CHEAP, LiveDaemon, new_home

_MAX_REGION = 1 << 30  # never read more than 1 GiB from one mapping (reserved address space)
_CHUNK = 16 << 20
KINDS = ("title", "body", "tag", "fact", "card", "query", "passphrase")


def count_region(read_at: Callable[[int, int], bytes], start: int, end: int, needles: dict[str, bytes],
                 chunk: int = _CHUNK) -> dict[str, int]:
    """Occurrences in ``[start, end)`` read in chunks that overlap by the longest needle less one
    byte: each occurrence is counted in the chunk where it starts, once."""
    counts = dict.fromkeys(needles, 0)
    overlap = max(len(n) for n in needles.values()) - 1
    pos = start
    while pos < end:
        n = min(chunk, end - pos)
        try:
            buf = read_at(pos, min(n + overlap, end - pos))
        except OSError:
            break  # an unreadable mapping (guard pages...)
        for key, needle in needles.items():
            # Occurrences lying wholly in the overlap start in the next chunk: counted there.
            counts[key] += buf.count(needle) - (buf[n:].count(needle) if len(buf) > n else 0)
        pos += n
    return counts


def count_in_memory(pid: int, needles: dict[str, bytes]) -> dict[str, int]:
    """Occurrences of each needle in every readable mapping of ``pid``."""
    counts = dict.fromkeys(needles, 0)
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:

        def read_at(pos: int, n: int) -> bytes:
            mem.seek(pos)
            return mem.read(n)

        for line in maps:
            fields = line.split()
            perms, name = fields[1], fields[5] if len(fields) > 5 else ""
            if not perms.startswith("r") or name in ("[vvar]", "[vsyscall]", "[vdso]"):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            for key, n in count_region(read_at, start, min(end, start + _MAX_REGION), needles).items():
                counts[key] += n
    return counts


def count_all(pids: list[int], needles: dict[str, bytes]) -> dict[str, int]:
    """:func:`count_in_memory` summed over ``pids`` (one that ended meanwhile took its memory with it)."""
    total = dict.fromkeys(needles, 0)
    for pid in pids:
        try:
            found = count_in_memory(pid, needles)
        except (FileNotFoundError, ProcessLookupError):
            continue
        for k, n in found.items():
            total[k] += n
    return total


def canaries() -> dict[str, str]:
    tok = secrets.token_hex(6)
    return {k: f"zq{k}canary{tok}" for k in KINDS}


def notes_with_card(root: Path, canary: dict[str, str]) -> Path:
    notes = root / "notes"
    notes.mkdir(parents=True, exist_ok=True)
    card = notes / "card.md"
    card.write_text(f"# Garden card\n\nThe garden {canary['card']} grows tomatoes and basil.\n")
    return card


def use_the_vault(call: Callable[[str, dict[str, Any]], Any], vid: str, canary: dict[str, str], card: Path) -> None:
    """Every kind of plaintext the vault gets: a note, a tag, a fact, an ingested card, queries."""
    call("vault.unlock", {"vault": vid, "passphrase": f"horse {canary['passphrase']}"})
    call("memory.add", {"vault": vid, "title": f"Note {canary['title']}", "body": f"cat kitten {canary['body']} fur",
                        "tags": [canary["tag"]]})
    call("memory.remember", {"vault": vid, "text": f"The user keeps a cat called {canary['fact']}"})
    call("rag.ingest", {"vault": vid, "paths": [str(card)]})
    for mode in ("bm25", "vector", "hybrid"):
        call("rag.search", {"vault": vid, "query": f"kitten {canary['query']}", "mode": mode, "min_score": -1})
    call("memory.search", {"vault": vid, "query": canary["body"]})


def _canary_run(model_dir: Path) -> dict[str, Any]:
    canary = canaries()
    needles = {k: v.encode("utf-8") for k, v in canary.items()}
    d = LiveDaemon(new_home(CHEAP.replace("[index]\nbackground = false", f'[embedding.local]\nmodel_dir = "{model_dir}"'))).start()
    try:
        router = d.processes()[0]
        vid = d.call("vault.create", {"name": "canaries", "passphrase": f"horse {canary['passphrase']}"})["vault_id"]
        other = d.call("vault.create", {"name": "other", "passphrase": "another one"})["vault_id"]
        d.call("memory.add", {"vault": other, "title": "dogs", "body": "dog puppy leash"})
        d.call("rag.search", {"vault": other, "query": "puppy", "mode": "hybrid", "min_score": -1})
        d.call("vault.lock", {"vault": vid})
        use_the_vault(d.call, vid, canary, notes_with_card(d.home.parent, canary))
        processes = len(d.processes())
        unlocked = count_all(d.processes(), needles)
        router_unlocked = count_in_memory(router, needles)
        d.call("vault.lock", {"vault": vid})
        after_lock = count_all(d.processes(), needles)
        d.call("rag.search", {"vault": other, "query": "leash", "mode": "hybrid", "min_score": -1})
        after_other = count_all(d.processes(), needles)
        in_log = sum(v in d.log_text() for v in canary.values())
    finally:
        d.remove()
    return {"processes_while_unlocked": processes, "unlocked_all_processes": unlocked,
            "router_while_unlocked": router_unlocked, "after_lock_all_processes": after_lock,
            "after_the_other_vault_searched": after_other, "in_the_log": in_log,
            "canary_copies_after_lock": sum(after_lock.values()) + sum(after_other.values()) + sum(router_unlocked.values()) + in_log}


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.monotonic()
    fn()
    return round(time.monotonic() - t0, 3)


def _frozen_run() -> dict[str, Any]:
    d = LiveDaemon(new_home(CHEAP)).start()
    try:
        frozen = d.call("vault.create", {"name": "frozen", "passphrase": "pw"})["vault_id"]
        kept = [d.call("memory.add", {"vault": frozen, "body": f"acknowledged {i}"})["id"] for i in range(5)]
        other = d.call("vault.create", {"name": "other", "passphrase": "pw"})["vault_id"]
        d.call("memory.add", {"vault": other, "body": "the other vault answers"})
        pid = {w["vault_id"]: w["pid"] for w in d.call("daemon.status")["vault_processes"]}[frozen]
        os.kill(pid, signal.SIGSTOP)
        try:
            out: dict[str, Any] = {
                "vault_list_seconds": _timed(lambda: d.call("vault.list")),
                "daemon_status_seconds": _timed(lambda: d.call("daemon.status")),
                "vault_status_all_seconds": _timed(lambda: d.call("vault.status")),
                "other_vault_search_seconds": _timed(lambda: d.call("memory.search", {"vault": other, "query": "answers"})),
                "lock_frozen_seconds": _timed(lambda: d.call("vault.lock", {"vault": frozen})),
            }
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        out["frozen_process_ended"] = not Path(f"/proc/{pid}").exists()
        d.call("vault.unlock", {"vault": frozen, "passphrase": "pw"})
        got = {r["id"] for r in d.call("memory.list", {"vault": frozen})["records"]}
        out["acknowledged_records_lost"] = sum(rid not in got for rid in kept)
    finally:
        d.remove()
    return out


def run(short: bool = True, seeds: int | None = None, minutes: float | None = None) -> dict[str, Any]:
    """The report section: ``seeds`` (default 1 short, 3 long) canary runs and frozen-process runs."""
    from tests.tinymodel import make_tiny_model  # the tiny real ONNX model the suite uses

    runs = seeds or (1 if short else 3)
    out: dict[str, Any] = {"runs": runs, "canaries": [], "frozen": []}
    with tempfile.TemporaryDirectory(prefix="mps") as tmp:
        model = Path(tmp) / "model"
        make_tiny_model(model, seed=3)
        for _ in range(runs):
            out["canaries"].append(_canary_run(model))
            out["frozen"].append(_frozen_run())
    out["canary_copies_after_lock"] = sum(r["canary_copies_after_lock"] for r in out["canaries"])
    out["acknowledged_records_lost"] = sum(r["acknowledged_records_lost"] for r in out["frozen"])
    return out


__all__ = ["count_in_memory", "count_region", "count_all", "canaries", "use_the_vault", "run"]
