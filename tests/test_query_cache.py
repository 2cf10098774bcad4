"""The query-vector cache: a bounded, time-limited LRU keyed by vault, model identity, prompt and
text, used by every vector search and cleared on lock (the daemon's own App in this process, with
the small real model)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from memoriesd.config import load_config
from memoriesd.embed.query_cache import QueryCache, cache_key
from memoriesd.home import Home
from memoriesd.main import build_app
from memoriesd.server.app import App
from memoriesd.server.context import Context, Params

from .conftest import SHARED, short_tmpdir, write_config

MINILM = SHARED / "models" / "all-MiniLM-L6-v2-onnx"
PW = "correct horse"


class _Embedder:
    """What the key reads off an embedder: its identity and its profile's query prompt."""

    def __init__(self, identity: str, prompt: str) -> None:
        self.identity = identity
        self.profile = type("P", (), {"query_prompt": prompt})()


def _vec(x: float) -> np.ndarray:
    return np.array([x, 1.0 - x], dtype=np.float32)


def test_lru_bound_time_limit_and_per_vault_forgetting() -> None:
    cache = QueryCache(2, 300)
    a, b, c = (cache_key("v1", _Embedder("m", "q: "), t) for t in ("a", "b", "c"))
    cache.put(a, _vec(0.1))
    cache.put(b, _vec(0.2))
    assert cache.get(a) is not None  # a is now the most recently used
    cache.put(c, _vec(0.3))
    assert cache.get(b) is None and cache.get(a) is not None and len(cache) == 2
    hit = cache.get(c)
    assert hit is not None and not hit.flags.writeable  # shared by every hit: read-only
    # Model identity and prompt are part of the key.
    assert cache.get(cache_key("v1", _Embedder("other", "q: "), "a")) is None
    assert cache.get(cache_key("v1", _Embedder("m", ""), "a")) is None
    cache.put(cache_key("v2", _Embedder("m", "q: "), "a"), _vec(0.5))
    cache.forget_vault("v1")
    assert cache.get(a) is None and cache.get(cache_key("v2", _Embedder("m", "q: "), "a")) is not None
    short = QueryCache(10, 0.05)
    short.put(a, _vec(0.1))
    time.sleep(0.1)
    assert short.get(a) is None and len(short) == 0
    off = QueryCache(0, 300)
    off.put(a, _vec(0.1))
    assert off.get(a) is None and not off.enabled


@pytest.fixture
def app() -> Iterator[App]:
    assert MINILM.is_dir(), f"{MINILM} is missing"
    root = short_tmpdir("qc")
    home = Home(root / "h")
    write_config(home.root, f'[embedding.local]\nmodel_dir = "{MINILM}"\nthreads = 2\n[index]\nbackground = false\n')
    home.ensure()
    application = build_app(home, load_config(home.config_path))
    yield application
    application.vaults.lock_all("test end")
    shutil.rmtree(root, ignore_errors=True)


def _call(app: App, method: str, **params: Any) -> Any:
    return app.dispatch(method, Context(Params(params)))


def test_a_repeated_search_reuses_the_query_vector_until_the_vault_locks(app: App) -> None:
    vid = _call(app, "vault.create", name="qc", passphrase=PW)["vault_id"]
    other = _call(app, "vault.create", name="other", passphrase=PW)["vault_id"]
    _call(app, "memory.add", vault=vid, title="Tea", body="Green tea in the afternoon, oolong on Sundays.")
    _call(app, "memory.add", vault=other, title="Coffee", body="Espresso after lunch.")
    cache = app.rag.embedding.query_cache
    first = _call(app, "rag.search", vault=vid, query="which tea on sunday", mode="vector")
    assert (cache.hits, cache.misses) == (0, 1)
    again = _call(app, "rag.search", vault=vid, query="which tea on sunday", mode="vector")
    assert (cache.hits, cache.misses) == (1, 1)
    assert [r["cosine"] for r in again["results"]] == [r["cosine"] for r in first["results"]]
    # The cached vector is the one the model computes.
    embedder = app.rag.embedding.embedder()
    cached = cache.get(cache_key(vid, embedder, "which tea on sunday"))
    assert cached is not None
    assert np.allclose(cached, embedder.embed_queries(["which tea on sunday"])[0], atol=1e-6)
    # Another vault never reads this vault's entries.
    _call(app, "rag.search", vault=other, query="which tea on sunday", mode="vector")
    assert cache.misses == 2 and len(cache) == 2
    # Lock forgets the vault's queries (only its own).
    app.vaults.lock(vid)
    assert len(cache) == 1 and cache.get(cache_key(vid, embedder, "which tea on sunday")) is None
