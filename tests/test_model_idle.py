"""The local model is released after `[rag] model_idle_minutes` unused and loaded again on demand."""

from __future__ import annotations

import time
from pathlib import Path

from .conftest import create_vault, running_daemon
from .tinymodel import make_tiny_model


def test_an_idle_model_is_released_and_the_next_search_loads_it_again(tmp_path: Path) -> None:
    model = tmp_path / "model"
    make_tiny_model(model, seed=2)
    with running_daemon(f'[rag]\nlocal_model_dir = "{model}"\nmodel_idle_minutes = 0.01\n') as d:
        vid = create_vault(d)
        d.call("memory.add", {"vault": vid, "title": "cats", "body": "cat kitten fur tail"})
        assert d.call("rag.search", {"vault": vid, "query": "kitten", "mode": "vector"})["results"]
        deadline = time.monotonic() + 20
        while "local embedding model released" not in d.log_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "local embedding model released" in d.log_text()
        assert d.call("rag.search", {"vault": vid, "query": "kitten", "mode": "vector"})["results"]
        assert d.log_text().count("local embedding model loaded") == 2


def test_model_idle_minutes_zero_keeps_the_model(tmp_path: Path) -> None:
    model = tmp_path / "model"
    make_tiny_model(model, seed=2)
    with running_daemon(f'[rag]\nlocal_model_dir = "{model}"\nmodel_idle_minutes = 0\n') as d:
        vid = create_vault(d)
        d.call("memory.add", {"vault": vid, "title": "cats", "body": "cat kitten fur tail"})
        d.call("rag.search", {"vault": vid, "query": "kitten", "mode": "vector"})
        time.sleep(1.0)
        d.call("rag.search", {"vault": vid, "query": "kitten", "mode": "vector"})
        assert d.log_text().count("local embedding model loaded") == 1
        assert "released" not in d.log_text()
