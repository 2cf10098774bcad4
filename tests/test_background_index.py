"""Background indexing through the real daemon: a vault finishes its vectors with no `rag index`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memoriesd.rag.background import HOLD_ENV

from .conftest import SHARED, Daemon, cli_json, create_vault, needs_shared, run_cli, running_daemon
from .tinymodel import make_tiny_model

MINILM = SHARED / "models" / "all-MiniLM-L6-v2-onnx"
WORDS = "cat dog coffee tea mountain river piano guitar bank money doctor vault key search".split()


def _folder(root: Path, n: int, words: int = 120) -> Path:
    folder = root / "notes"
    folder.mkdir()
    for i in range(n):
        body = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(words))
        (folder / f"n{i:04d}.md").write_text(f"# Note {i}\n\n{body}\n")
    return folder


@contextlib.contextmanager
def _minilm_vault(tmp_path: Path, notes: int, extra: str = "", threads: int = 2, hold: Path | None = None) -> Iterator[tuple[Daemon, str]]:
    """A daemon with the small real model and a vault that has just ingested ``notes`` Markdown files.

    ``hold``: a path for the test gate of the background worker (see ``HOLD_ENV``): while that file
    exists the worker holds its job "running" before each chunk, whatever the machine's speed.
    """
    if not MINILM.is_dir():  # pragma: no cover - ../shared is beside the repo in CI
        raise AssertionError(needs_shared("models/all-MiniLM-L6-v2-onnx"))
    env = {HOLD_ENV: str(hold)} if hold is not None else None
    with running_daemon(f'{extra}[embedding.local]\nmodel_dir = "{MINILM}"\nthreads = {threads}\n', env=env) as d:
        vid = create_vault(d)
        folder = _folder(tmp_path, notes)
        d.call("rag.ingest", {"vault": vid, "paths": [str(folder)], "recursive": True})
        yield d, vid


def _status(d: Daemon, vid: str) -> dict[str, Any]:
    return dict(d.call("rag.status", {"vault": vid})["embedding"])


def _wait_state(d: Daemon, vid: str, state: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        emb = _status(d, vid)
        if emb.get("state") == state:
            return emb
        time.sleep(0.1)
    raise AssertionError(f"background indexing did not reach {state}: {emb}")


def _wait_done(d: Daemon, vid: str, timeout: float = 120) -> dict[str, Any]:
    return _wait_state(d, vid, "done", timeout)


def test_ingest_alone_leaves_a_fully_embedded_vault(tmp_path: Path) -> None:
    model = tmp_path / "model"
    make_tiny_model(model, seed=1)
    with running_daemon(f'[embedding.local]\nmodel_dir = "{model}"\n') as d:
        vid = create_vault(d)
        folder = _folder(tmp_path, 40)
        d.call("rag.ingest", {"vault": vid, "paths": [str(folder)], "recursive": True})
        emb = _wait_done(d, vid)
        assert emb["embedded"] == emb["total"] > 0 and emb["skipped"] == 0 and emb["eta_seconds"] is None
        # min_score -1: the vector side's coverage is under test, not the relevance floor (word soup under the tiny model)
        res = d.call("rag.search", {"vault": vid, "query": "coffee", "mode": "vector", "min_score": -1})
        assert res["results"] and res["missing_vectors"] == 0 and not res["notices"]
        text = run_cli(d.home, "rag", "status", vid)
        assert text.returncode == 0 and "background" in text.stdout and "done" in text.stdout
        # rag index attaches to the finished job: nothing left to do.
        out = cli_json(d.home, "rag", "index", vid)
        assert out["total"] == emb["total"] and out["embedded"] == 0


def test_lock_pauses_background_indexing_and_unlock_resumes_it(tmp_path: Path) -> None:
    hold = tmp_path / "hold-background"
    hold.touch()  # the worker holds its job "running", before its first chunk, until this file goes
    with _minilm_vault(tmp_path, 60, hold=hold) as (d, vid):
        running = _wait_state(d, vid, "running")
        # A search meanwhile answers with what exists (it does not embed the vault itself), and says so.
        res = d.call("rag.search", {"vault": vid, "query": "coffee mountain", "mode": "hybrid"})
        assert res["results"]  # bm25 answers
        assert res["missing_vectors"] == running["total"] >= 60
        assert any("background" in n for n in res["notices"]), res["notices"]
        # So does `memory forget --query`: the fragments the job has not reached are matched by words only.
        dry = d.call("memory.forget", {"vault": vid, "query": "coffee mountain", "scope": "topic", "kind": "card", "dry_run": True})
        assert dry["records"] and dry["forgotten"] == 0
        assert any("still being embedded in the background and were matched by words only" in n for n in dry["notices"]), dry
        after = _status(d, vid)
        assert after["state"] == "running" and after["embedded"] == running["embedded"] == 0
        assert after["rate"] is None and after["eta_seconds"] is None  # no chunk done yet: no rate to guess from
        # Lock cancels the held chunk (it holds a lease) and pauses the job: the vault locks.
        d.call("vault.lock", {"vault": vid})
        assert d.call("vault.status", {"vault": vid})["locked"]
        hold.unlink()
        # Nothing resumes a paused job but unlock: unless unlock resumes it, it never gets done.
        d.call("vault.unlock", {"vault": vid, "passphrase": "correct horse"})
        emb = _wait_done(d, vid)
        assert emb["embedded"] == emb["total"] == running["total"]


def test_rag_index_follows_the_background_job_to_the_end(tmp_path: Path) -> None:
    with _minilm_vault(tmp_path, 120) as (d, vid):
        r = run_cli(d.home, "--json", "rag", "index", vid)
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
        status = _status(d, vid)
        assert status["embedded"] == status["total"] and status["state"] == "done"


def test_background_work_does_not_keep_a_vault_from_auto_locking(tmp_path: Path) -> None:
    hold = tmp_path / "hold-background"
    hold.touch()  # background work on this vault never ends by itself: only the auto-lock can end it
    with _minilm_vault(tmp_path, 40, extra="[daemon]\nauto_lock_minutes = 0.02\n", threads=1, hold=hold) as (d, vid):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not d.call("vault.status", {"vault": vid})["locked"]:
            time.sleep(0.2)
        assert d.call("vault.status", {"vault": vid})["locked"]


def test_background_index_off_keeps_the_foreground_behaviour(tmp_path: Path) -> None:
    model = tmp_path / "model"
    make_tiny_model(model, seed=1)
    with running_daemon(f'[embedding.local]\nmodel_dir = "{model}"\n[index]\nbackground = false\n') as d:
        vid = create_vault(d)
        d.call("memory.add", {"vault": vid, "title": "t", "body": "coffee tea"})
        emb = _status(d, vid)
        assert emb["state"] == "off"
        out = cli_json(d.home, "rag", "index", vid)
        assert out["embedded"] == 1


def test_rag_index_with_progress_json_writes_json_progress_lines(tmp_path: Path) -> None:
    import json

    with _minilm_vault(tmp_path, 120) as (d, vid):
        r = run_cli(d.home, "rag", "index", vid, "--progress", "json")
        assert r.returncode == 0, r.stderr
        lines = [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]
        assert lines and all(x["progress"] == "embed" and x["done"] <= x["total"] for x in lines)
        assert "Traceback" not in r.stderr
