"""The local model is released after `[embedding.local] idle_minutes` unused and loaded again on demand."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from .conftest import Daemon, create_vault, running_daemon
from .tinymodel import make_tiny_model


@contextlib.contextmanager
def _vault_with_model(tmp_path: Path, idle_minutes: float) -> Iterator[tuple[Daemon, str]]:
    model = tmp_path / "model"
    make_tiny_model(model, seed=2)
    with running_daemon(f'[embedding.local]\nmodel_dir = "{model}"\nidle_minutes = {idle_minutes}\n') as d:
        vid = create_vault(d)
        d.call("memory.add", {"vault": vid, "title": "cats", "body": "cat kitten fur tail"})
        yield d, vid


def _search(d: Daemon, vid: str) -> list[dict[str, object]]:
    # min_score -1: the tiny model's cosines are not calibrated to the relevance floor
    return list(d.call("rag.search", {"vault": vid, "query": "kitten", "mode": "vector", "min_score": -1})["results"])


def test_an_idle_model_is_released_and_the_next_search_loads_it_again(tmp_path: Path) -> None:
    with _vault_with_model(tmp_path, 0.01) as (d, vid):
        assert _search(d, vid)
        deadline = time.monotonic() + 60
        while "local embedding model released" not in d.log_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "local embedding model released" in d.log_text()
        assert _search(d, vid)
        assert d.log_text().count("local embedding model loaded") == 2


def test_model_idle_minutes_zero_keeps_the_model(tmp_path: Path) -> None:
    with _vault_with_model(tmp_path, 0) as (d, vid):
        _search(d, vid)
        time.sleep(1.0)
        _search(d, vid)
        assert d.log_text().count("local embedding model loaded") == 1
        assert "released" not in d.log_text()
