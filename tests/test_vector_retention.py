"""Sealed vectors follow the records: compaction drops those of deleted records and old revisions,
and `rag status` counts sealed vectors before they are loaded (real daemon, tiny real ONNX model)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Daemon, cli_json, create_vault, run_cli, short_tmpdir, write_config
from .tinymodel import TOPIC_NOTES, two_tiny_models

NOTES = TOPIC_NOTES
CANARY = ("Canary", "zebra quokka axolotl narwhal canary")
PASS = "correct horse"


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return two_tiny_models(tmp_path_factory.mktemp("models"))


def _config(home: Path, model: Path) -> None:
    write_config(home, f'[embedding.local]\nmodel_dir = "{model}"\n[index]\nbackground = false\n')


@pytest.fixture
def home(model_dirs: dict[str, Path]) -> Iterator[Path]:
    root = short_tmpdir()
    h = root / "h"
    _config(h, model_dirs["a"])
    yield h
    shutil.rmtree(root, ignore_errors=True)


def _start(home: Path) -> Daemon:
    return Daemon(home, env={"HOME": str(home.parent)}).start()


def _fill(d: Daemon, vid: str, notes: list[tuple[str, str]]) -> dict[str, str]:
    return {t: d.call("memory.add", {"vault": vid, "title": t, "body": b})["id"] for t, b in notes}


def _sidecars(home: Path, vid: str) -> list[Path]:
    return sorted((home / "vaults" / vid).glob("vectors-*.bin"))


def _vector_hits(d: Daemon, vid: str, query: str) -> list[str]:
    res = d.call("rag.search", {"vault": vid, "query": query, "mode": "vector", "limit": 50})
    return [r["record_id"] for r in res["results"]]


def test_compaction_drops_sealed_vectors_of_deleted_records(home: Path) -> None:
    d = _start(home)
    try:
        vid = create_vault(d)
        ids = _fill(d, vid, [*NOTES, CANARY])
        assert d.call("rag.index", {"vault": vid})["embedded"] == 6
        d.call("memory.delete", {"vault": vid, "id": ids["Canary"]})
        # An update leaves the old revision's vector in the sidecar too (until compaction).
        d.call("memory.update", {"vault": vid, "id": ids["Music"], "body": "violin concert with drums"})
        assert d.call("rag.index", {"vault": vid})["embedded"] == 1
        size_before = _sidecars(home, vid)[0].stat().st_size

        out = cli_json(home, "vault", "compact", vid)
        assert out["vector_entries_kept"] == 5 and out["vector_entries_dropped"] == 2
        assert out["vector_files"] == 1 and out["vector_files_skipped"] == 0
        [side] = _sidecars(home, vid)
        assert side.stat().st_size < size_before
        assert side.stat().st_mode & 0o777 == 0o600
        assert not [p for p in side.parent.iterdir() if p.name.endswith(".tmp")]

        # The in-memory vectors still answer right after compaction, without re-embedding.
        assert ids["Canary"] not in _vector_hits(d, vid, "zebra quokka axolotl narwhal canary")
        assert _vector_hits(d, vid, "puppy vet food")[0] == ids["Pets"]
        assert d.call("rag.index", {"vault": vid})["embedded"] == 0
        again = d.call("vault.compact", {"vault": vid})
        assert again["vector_entries_kept"] == 5 and again["vector_entries_dropped"] == 0

        # Lock/unlock reloads exactly the 5 live vectors from the rewritten sidecar: nothing is re-embedded.
        mark = len(d.log_text())
        d.call("vault.lock", {"vault": vid})
        d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        assert d.call("rag.index", {"vault": vid})["embedded"] == 0
        log = d.log_text()[mark:]
        assert "loaded 5 sealed vectors" in log and "damaged" not in log
        assert ids["Canary"] not in _vector_hits(d, vid, "zebra quokka axolotl narwhal canary")
        human = run_cli(home, "vault", "compact", vid)
        assert human.returncode == 0 and "5 kept, 0 dropped" in human.stderr
    finally:
        d.stop()


def test_compaction_filters_sidecars_of_a_model_not_in_use(home: Path, model_dirs: dict[str, Path]) -> None:
    d = _start(home)
    vid = create_vault(d)
    ids = _fill(d, vid, [*NOTES, CANARY])
    d.call("rag.index", {"vault": vid})
    d.stop()
    _config(home, model_dirs["b"])
    d = _start(home)
    try:
        d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        assert d.call("rag.index", {"vault": vid})["embedded"] == 6
        assert len(_sidecars(home, vid)) == 2
        d.call("memory.delete", {"vault": vid, "id": ids["Canary"]})
        out = d.call("vault.compact", {"vault": vid})
        # Model b's sidecar (in use) and model a's (not loaded, known from the sealed space list).
        assert out["vector_files"] == 2 and out["vector_entries_kept"] == 10 and out["vector_entries_dropped"] == 2
    finally:
        d.stop()
    _config(home, model_dirs["a"])
    d = _start(home)
    try:
        mark = len(d.log_text())
        d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        assert d.call("rag.index", {"vault": vid})["embedded"] == 0
        assert "loaded 5 sealed vectors" in d.log_text()[mark:]
        assert ids["Canary"] not in _vector_hits(d, vid, "zebra quokka axolotl narwhal canary")
    finally:
        d.stop()


def test_compaction_keeps_a_sidecar_of_unknown_identity_and_says_so(home: Path) -> None:
    d = _start(home)
    vid = create_vault(d)
    ids = _fill(d, vid, [*NOTES, CANARY])
    d.call("rag.index", {"vault": vid})
    d.stop()
    (home / "vaults" / vid / "vector-spaces.bin").unlink()  # as written before the space list existed
    d = _start(home)
    try:
        d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        d.call("memory.delete", {"vault": vid, "id": ids["Canary"]})
        out = d.call("vault.compact", {"vault": vid})
        assert out["vector_files"] == 0 and out["vector_files_skipped"] == 1 and len(_sidecars(home, vid)) == 1
        # Once the model uses it again, it is known and the next compaction filters it.
        assert d.call("rag.index", {"vault": vid})["embedded"] == 0
        out = d.call("vault.compact", {"vault": vid})
        assert out["vector_files"] == 1 and out["vector_entries_kept"] == 5 and out["vector_entries_dropped"] == 1
    finally:
        d.stop()


def test_status_reports_embedded_count_after_restart_without_loading(home: Path) -> None:
    d = _start(home)
    vid = create_vault(d)
    _fill(d, vid, NOTES)
    d.call("rag.index", {"vault": vid})
    d.stop()
    d = _start(home)
    try:
        mark = len(d.log_text())
        d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        d.call("memory.add", {"vault": vid, "title": "Sea", "body": "ocean beach waves"})
        st = d.call("rag.status", {"vault": vid})
        emb = st["embedding"]
        assert emb["embedded"] == 5 and emb["total"] == 6 and emb["dimensions"] == 32
        assert emb["vectors_loaded"] is False and emb["vector_bytes"] == 5 * 32 * 4
        assert len(emb["model"]) == 64  # the local model's identity, as once loaded
        assert st["index"] == "none"  # no BM25 index was built for it
        human = run_cli(home, "rag", "status", vid, env={"COLUMNS": "300"})
        assert human.returncode == 0, human.stderr
        assert "5 of 6 fragments have vectors (83%); sealed on disk, loaded on the first vector search" in human.stdout
        log = d.log_text()[mark:]
        assert "local embedding model loaded" not in log and "sealed vectors" not in log
        # Loading gives the same identity and count.
        assert d.call("rag.index", {"vault": vid})["embedded"] == 1
        loaded = d.call("rag.status", {"vault": vid})["embedding"]
        assert loaded["model"] == emb["model"] and loaded["embedded"] == 6 and loaded["vectors_loaded"] is True
        # After lock/unlock (model loaded, vectors not): counted from the sealed sidecar again.
        d.call("vault.lock", {"vault": vid})
        d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        again = d.call("rag.status", {"vault": vid})["embedding"]
        assert again["vectors_loaded"] is False and again["embedded"] == 6 and again["total"] == 6
    finally:
        d.stop()


def test_status_of_a_vault_never_embedded_says_zero(home: Path) -> None:
    d = _start(home)
    try:
        vid = create_vault(d)
        _fill(d, vid, NOTES)
        emb = d.call("rag.status", {"vault": vid})["embedding"]
        assert emb["embedded"] == 0 and emb["total"] == 5 and emb["vectors_loaded"] is False
    finally:
        d.stop()
