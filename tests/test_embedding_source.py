"""[embedding] source: which embedder serves a vault (local model, remote service, or none), and why.

Real daemons on temp homes, the real MiniLM model from ../shared/models, and a real loopback
embeddings service (tests/embed_server.py) that records every request, so "the service was not
used" is a fact about the network, not about a flag.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from memoriesd.config import parse_config
from memoriesd.errors import ConfigError

from .conftest import SHARED, Daemon, DaemonError, create_vault, needs_shared, run_cli, running_daemon
from .embed_server import EmbeddingService

MINILM = SHARED / "models" / "all-MiniLM-L6-v2-onnx"
NOTE = "The lighthouse keeper feeds the zebra every morning before the ferry leaves."


@pytest.fixture(scope="module")
def svc() -> Iterator[EmbeddingService]:
    if not MINILM.is_dir():  # pragma: no cover - ../shared is beside the repo in CI
        raise AssertionError(needs_shared("models/all-MiniLM-L6-v2-onnx"))
    s = EmbeddingService()
    yield s
    s.close()


def _config(svc: EmbeddingService | None, source: str | None, model_dir: Path | str) -> str:
    rag = f'[embedding.local]\nmodel_dir = "{model_dir}"\n[index]\nbackground = false\n'
    if source is not None:
        rag += f'[embedding]\nsource = "{source}"\n'
    return rag + (svc.config() if svc is not None else "")


def _vault_with_note(d: Daemon, **kw: object) -> str:
    vid = create_vault(d, str(kw.pop("name", "v")))
    if kw.get("device_only"):
        d.call("vault.policy", {"vault": vid, "device_only": True})
    d.call("memory.add", {"vault": vid, "title": "Keeper", "body": NOTE})
    return vid


def test_the_setting_is_validated_when_the_config_is_read() -> None:
    base = Path("/tmp")
    assert parse_config({}, base).embedding.source == ""  # not set: a configured service wins, as before
    assert parse_config({}, base).embedding.effective_source == "local"
    for value in ("local", "remote", "auto"):
        data: dict[str, object] = {"embedding": {"source": value}}
        if value == "remote":
            data["embedding"] = {"source": value, "service": {"protocol": "compatible", "url": "http://127.0.0.1:9/v1/embeddings", "model": "m"}}
        assert parse_config(data, base).embedding.source == value
    with pytest.raises(ConfigError) as bad:
        parse_config({"embedding": {"source": "cloud"}}, base)
    assert "embedding.source" in bad.value.message and "'auto'" in bad.value.message
    with pytest.raises(ConfigError) as missing:
        parse_config({"embedding": {"source": "remote"}}, base)
    assert "needs an embedding service" in missing.value.message and "[embedding.service]" in missing.value.message


def test_not_set_a_configured_service_still_serves_although_a_local_model_is_installed(svc: EmbeddingService) -> None:
    with running_daemon(_config(svc, None, MINILM)) as d:
        vid = _vault_with_note(d)
        emb = d.call("rag.status", {"vault": vid})["embedding"]
        assert emb["served_by"] == "remote" and "[embedding] source is not set" in emb["reason"]
        before = svc.requests()
        out = d.call("rag.search", {"vault": vid, "query": "who feeds the zebra"})
        assert out["mode"] == "hybrid" and out["results"][0]["title"] == "Keeper"
        assert svc.requests() > before and any("zebra" in t for t in svc.texts())


def test_auto_uses_the_installed_local_model_and_sends_nothing_to_the_service(svc: EmbeddingService) -> None:
    with running_daemon(_config(svc, "auto", MINILM)) as d:
        vid = _vault_with_note(d)
        emb = d.call("rag.status", {"vault": vid})["embedding"]
        assert emb["served_by"] == "local"
        assert 'source = "auto" and a local model is installed' in emb["reason"] and str(MINILM.resolve()) in emb["reason"]
        before = svc.requests()
        out = d.call("rag.search", {"vault": vid, "query": "who feeds the zebra", "mode": "vector"})
        assert out["results"][0]["title"] == "Keeper"
        indexed = d.call("rag.index", {"vault": vid})
        assert not str(indexed["model"]).startswith("remote:")
        assert svc.requests() == before  # not one request reached the service
        r = run_cli(d.home, "rag", "status", vid, env={"COLUMNS": "300"})
        assert r.returncode == 0 and 'local: source = "auto" and a local model is installed' in r.stdout


def test_auto_without_a_local_model_uses_the_service_but_never_for_a_device_only_vault(svc: EmbeddingService, tmp_path: Path) -> None:
    empty = tmp_path / "no-model"
    empty.mkdir()
    with running_daemon(_config(svc, "auto", empty)) as d:
        vid = _vault_with_note(d, name="open")
        emb = d.call("rag.status", {"vault": vid})["embedding"]
        assert emb["served_by"] == "remote" and f"no local model is installed in {empty}" in emb["reason"]
        before = svc.requests()
        assert d.call("rag.search", {"vault": vid, "query": "zebra"})["mode"] == "hybrid"
        assert svc.requests() > before
        # A service on loopback is on this device: a device-only vault may use it.
        local_only = _vault_with_note(d, name="device", device_only=True)
        assert d.call("rag.status", {"vault": local_only})["embedding"]["served_by"] == "remote"

    # A service off this device: a device-only vault is served by none (bm25), another vault by the service.
    config = _config(None, "auto", empty) + (
        '[embedding.service]\nprotocol = "compatible"\nurl = "https://embed.example.invalid/v1/embeddings"\n'
        'model = "m"\napi_key_env = "EMBED_TEST_KEY"\n'
    )
    with running_daemon(config, env={"EMBED_TEST_KEY": "k-not-a-secret"}) as d:
        open_vault = _vault_with_note(d, name="open")
        private = _vault_with_note(d, name="device", device_only=True)
        assert d.call("rag.status", {"vault": open_vault})["embedding"]["served_by"] == "remote"
        emb = d.call("rag.status", {"vault": private})["embedding"]
        assert emb["served_by"] == "none" and "device-only" in emb["reason"] and "embed.example.invalid" in emb["reason"]
        assert "memories rag model-install" in emb["reason"]
        out = d.call("rag.search", {"vault": private, "query": "zebra"})
        assert out["mode"] == "bm25" and out["results"][0]["title"] == "Keeper"
        with pytest.raises(DaemonError) as refused:
            d.call("rag.search", {"vault": private, "query": "zebra", "mode": "vector"})
        assert refused.value.code == "device_only"


def test_local_never_falls_back_to_the_service(svc: EmbeddingService, tmp_path: Path) -> None:
    empty = tmp_path / "no-model"
    empty.mkdir()
    with running_daemon(_config(svc, "local", empty)) as d:
        vid = _vault_with_note(d)
        emb = d.call("rag.status", {"vault": vid})["embedding"]
        assert emb["served_by"] == "none" and 'source = "local" leaves the [embedding.service] service out' in emb["reason"]
        before = svc.requests()
        assert d.call("rag.search", {"vault": vid, "query": "zebra"})["mode"] == "bm25"
        with pytest.raises(DaemonError) as unavailable:
            d.call("rag.search", {"vault": vid, "query": "zebra", "mode": "hybrid"})
        assert unavailable.value.code == "model_unavailable"
        assert svc.requests() == before
        r = run_cli(d.home, "--json", "rag", "status", vid)
        assert json.loads(r.stdout)["embedding"]["served_by"] == "none"


def test_remote_uses_the_service_although_a_local_model_is_installed(svc: EmbeddingService) -> None:
    with running_daemon(_config(svc, "remote", MINILM)) as d:
        vid = _vault_with_note(d)
        emb = d.call("rag.status", {"vault": vid})["embedding"]
        assert (emb["served_by"], emb["reason"]) == ("remote", 'source = "remote"')
        before = svc.requests()
        assert d.call("rag.search", {"vault": vid, "query": "zebra", "mode": "vector", "min_score": -1})["results"]
        assert svc.requests() > before
