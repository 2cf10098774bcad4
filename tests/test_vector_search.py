"""Vector search through the real daemon with a tiny generated ONNX model (real onnxruntime)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import (
    Daemon,
    DaemonError,
    all_file_bytes,
    cli_json,
    create_vault,
    run_cli,
    short_tmpdir,
    write_config,
)
from .servers import Mirror
from .tinymodel import TOPIC_NOTES, make_tiny_model, two_tiny_models

NOTES = TOPIC_NOTES


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return two_tiny_models(tmp_path_factory.mktemp("models"))


# These tests follow the foreground paths (on-demand embedding, `rag index` passes); the background
# indexer is off here and tested in test_background_index.py.
def _home_with(model: Path, extra: str = "") -> Path:
    root = short_tmpdir()
    home = root / "h"
    write_config(home, f'[embedding.local]\nmodel_dir = "{model}"\n[index]\nbackground = false\n' + extra)
    return home


@pytest.fixture
def vdaemon(model_dirs: dict[str, Path]) -> Iterator[Daemon]:
    home = _home_with(model_dirs["a"])
    d = Daemon(home, env={"HOME": str(home.parent)}).start()
    yield d
    d.stop()
    shutil.rmtree(home.parent, ignore_errors=True)


def _fill(d: Daemon, vid: str) -> dict[str, str]:
    return {t: d.call("memory.add", {"vault": vid, "title": t, "body": b})["id"] for t, b in NOTES}


def test_index_then_vector_and_hybrid_search(vdaemon: Daemon) -> None:
    vid = create_vault(vdaemon)
    ids = _fill(vdaemon, vid)
    out = cli_json(vdaemon.home, "rag", "index", vid)
    assert out["embedded"] == 5 and out["total"] == 5
    res = cli_json(vdaemon.home, "rag", "search", vid, "puppy vet food", "--mode", "vector")
    assert res["mode"] == "vector" and res["results"][0]["record_id"] == ids["Pets"]
    assert res["results"][0]["cosine"] is not None and res["results"][0]["vector_rank"] == 1
    default = cli_json(vdaemon.home, "rag", "search", vid, "espresso mug")
    assert default["mode"] == "hybrid" and default["results"][0]["record_id"] == ids["Coffee"]
    r = default["results"][0]
    assert r["bm25_rank"] == 1 and r["vector_rank"] is not None and r["fused_score"] > 0
    st = cli_json(vdaemon.home, "rag", "status", vid)
    assert st["embedding"]["embedded"] == 5 and st["embedding"]["total"] == 5 and st["embedding"]["dimensions"] == 32
    # onnxruntime wrote no telemetry under the daemon's HOME.
    assert not list(vdaemon.home.parent.rglob("DeveloperTools"))


def test_sealed_vectors_survive_restart_without_reembedding(vdaemon: Daemon) -> None:
    vid = create_vault(vdaemon)
    _fill(vdaemon, vid)
    assert vdaemon.call("rag.index", {"vault": vid})["embedded"] == 5
    sidecars = list((vdaemon.home / "vaults" / vid).glob("vectors-*.bin"))
    assert len(sidecars) == 1
    for _, data in all_file_bytes(vdaemon.home / "vaults"):
        assert b"espresso" not in data and b"Coffee" not in data
    vdaemon.stop()
    d = Daemon(vdaemon.home, env={"HOME": str(vdaemon.home.parent)}).start()
    try:
        d.call("vault.unlock", {"vault": vid, "passphrase": "correct horse"})
        assert d.call("rag.index", {"vault": vid})["embedded"] == 0
        assert "loaded 5 sealed vectors" in d.log_text()
        assert d.call("rag.search", {"vault": vid, "query": "guitar", "mode": "vector"})["results"][0]["title"] == "Music"
    finally:
        d.stop()


def test_changes_embed_only_new_fragments_and_model_change_reembeds(vdaemon: Daemon, model_dirs: dict[str, Path]) -> None:
    vid = create_vault(vdaemon)
    ids = _fill(vdaemon, vid)
    vdaemon.call("rag.index", {"vault": vid})
    vdaemon.call("memory.update", {"vault": vid, "id": ids["Music"], "body": "violin concert with drums"})
    vdaemon.call("memory.add", {"vault": vid, "title": "Sea", "body": "ocean beach waves"})
    assert vdaemon.call("rag.index", {"vault": vid})["embedded"] == 2
    # Retitling changes the document prompt input: that record is re-embedded.
    vdaemon.call("memory.update", {"vault": vid, "id": ids["Money"], "title": "Finance"})
    assert vdaemon.call("rag.index", {"vault": vid})["embedded"] == 1
    vdaemon.stop()
    write_config(vdaemon.home, f'[embedding.local]\nmodel_dir = "{model_dirs["b"]}"\n[index]\nbackground = false\n')
    d = Daemon(vdaemon.home).start()
    try:
        d.call("vault.unlock", {"vault": vid, "passphrase": "correct horse"})
        out = d.call("rag.index", {"vault": vid})
        assert out["embedded"] == 6  # another model identity: never mix vector spaces
        assert len(list((d.home / "vaults" / vid).glob("vectors-*.bin"))) == 2
    finally:
        d.stop()


def test_damaged_sidecar_is_discarded_and_reembedded_not_corrupt(vdaemon: Daemon) -> None:
    vid = create_vault(vdaemon)
    _fill(vdaemon, vid)
    vdaemon.call("rag.index", {"vault": vid})
    vdaemon.call("vault.lock", {"vault": vid})
    side = next((vdaemon.home / "vaults" / vid).glob("vectors-*.bin"))
    raw = bytearray(side.read_bytes())
    raw[len(raw) - 40] ^= 0xFF  # inside the last sealed chunk (int8 rows: the middle may be slot padding)
    side.write_bytes(bytes(raw))
    vdaemon.call("vault.unlock", {"vault": vid, "passphrase": "correct horse"})
    assert vdaemon.call("rag.index", {"vault": vid})["embedded"] == 5
    assert "WARNING" in vdaemon.log_text()
    assert len(vdaemon.call("memory.list", {"vault": vid})["records"]) == 5


def test_on_demand_embedding_is_bounded_and_says_to_run_index(model_dirs: dict[str, Path]) -> None:
    home = _home_with(model_dirs["a"], "[search]\non_demand_embed_limit = 2\n")
    d = Daemon(home).start()
    try:
        vid = create_vault(d)
        _fill(d, vid)
        res = d.call("rag.search", {"vault": vid, "query": "piano", "mode": "vector"})
        assert res["missing_vectors"] == 3
        assert any("rag index" in n for n in res["notices"])
        assert d.call("rag.index", {"vault": vid})["embedded"] == 3
    finally:
        d.stop()
        shutil.rmtree(home.parent, ignore_errors=True)


def test_match_mode_cards_only_and_min_score_constrain_vector_candidates(vdaemon: Daemon, tmp_path: Path) -> None:
    vid = create_vault(vdaemon)
    ids = _fill(vdaemon, vid)
    doc = tmp_path / "pets.md"
    doc.write_text("# Pet card\n\ndog cat kitten puppy\n")
    vdaemon.call("rag.ingest", {"vault": vid, "paths": [str(doc)]})
    res = vdaemon.call("rag.search", {"vault": vid, "query": "dog vet", "mode": "vector", "match_mode": "all", "min_score": -1})
    assert [r["record_id"] for r in res["results"]] == [ids["Pets"]]
    res = vdaemon.call("rag.search", {"vault": vid, "query": "dog vet", "mode": "hybrid", "match_mode": "phrase"})
    assert res["results"] == []
    res = vdaemon.call("rag.search", {"vault": vid, "query": "dog", "mode": "vector", "cards_only": True})
    assert {r["kind"] for r in res["results"]} == {"card"}
    res = vdaemon.call("rag.search", {"vault": vid, "query": "dog", "mode": "vector", "min_score": 0.999})
    assert res["results"] == []  # nothing relevant is expressible
    r = run_cli(vdaemon.home, "rag", "search", vid, "w001 w002", "--mode", "vector", "--min-score", "0.99")
    assert r.returncode == 0 and "nothing relevant" in r.stderr


def test_vector_search_without_model_says_how_to_install(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    daemon.call("memory.add", {"vault": vid, "body": "x y"})
    with pytest.raises(DaemonError) as ei:
        daemon.call("rag.index", {"vault": vid})
    assert ei.value.code == "model_unavailable" and "model-install" in ei.value.message
    assert daemon.call("rag.search", {"vault": vid, "query": "x"})["mode"] == "bm25"


def test_model_install_through_cli_refuses_a_mirror_with_wrong_bytes() -> None:
    """The daemon's real manifest pins EmbeddingGemma; a mirror serving other bytes is refused."""
    root = short_tmpdir()
    home = root / "h"
    files = {f"/m/{p}": b"not the pinned bytes" for p in ("onnx/model_q4.onnx", "onnx/model_q4.onnx_data", "tokenizer.json", "tokenizer_config.json", "config.json", "special_tokens_map.json")}
    with Mirror(files) as mirror:
        write_config(home, f'[embedding.local]\ndownload_url = "{mirror.url}/m"\n')
        try:
            r = run_cli(home, "rag", "model-install")
            assert r.returncode == 1, r.stderr
            assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
            assert r.stderr.startswith("error[digest_mismatch]"), r.stderr
            assert not (home / "models" / "embeddinggemma" / "onnx" / "model_q4.onnx").exists()
            assert mirror.seen()  # it really went to the loopback mirror
        finally:
            run_cli(home, "daemon", "stop")
            shutil.rmtree(root, ignore_errors=True)


def test_changed_model_files_ask_for_a_restart(tmp_path_factory: pytest.TempPathFactory) -> None:
    model = tmp_path_factory.mktemp("m") / "tiny"
    make_tiny_model(model, seed=5)
    home = _home_with(model)
    d = Daemon(home).start()
    try:
        vid = create_vault(d)
        d.call("memory.add", {"vault": vid, "body": "dog cat"})
        d.call("rag.index", {"vault": vid})
        make_tiny_model(model, seed=6)  # new weights under the loaded model
        with pytest.raises(DaemonError) as ei:
            d.call("rag.search", {"vault": vid, "query": "dog", "mode": "vector"})
        assert ei.value.code == "model_unavailable" and "memories daemon restart" in ei.value.message
    finally:
        d.stop()
        shutil.rmtree(home.parent, ignore_errors=True)
