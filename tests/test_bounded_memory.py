"""What the index holds is bounded by what is live: removed fragments are released, and spare
vectors (kept for a fragment that comes back) stay under their share of `max_vector_mib`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .test_live_vault import PW, call, make_app  # noqa: F401 - the fixture is used by name
from .tinymodel import make_tiny_model


def test_two_hundred_updates_and_a_delete_leave_no_fragment_held(make_app: Any) -> None:  # noqa: F811
    app = make_app()
    vid = call(app, "vault.create", name="upd", passphrase=PW)["vault_id"]
    rid = call(app, "memory.add", vault=vid, title="t", body="coffee first")["id"]
    call(app, "rag.search", vault=vid, query="coffee", mode="bm25")  # build the index
    for i in range(200):
        call(app, "memory.update", vault=vid, id=rid, body=f"coffee version w{i:03d} " * 3)
        if i % 20 == 0:
            assert call(app, "rag.search", vault=vid, query="coffee", mode="bm25")["results"]
    idx = app.rag.peek_index(app.vaults.store(vid))
    assert idx.bm25.held_fragments() == len(idx.live_frag_ids()) == 1
    call(app, "memory.delete", vault=vid, id=rid)
    assert call(app, "rag.search", vault=vid, query="coffee", mode="bm25")["results"] == []
    idx = app.rag.peek_index(app.vaults.store(vid))
    assert idx.bm25.held_fragments() == 0
    # The FTS5 rows are gone too: no old version is found.
    assert call(app, "rag.search", vault=vid, query="w150", mode="bm25")["results"] == []


def test_spare_vectors_stay_under_their_share_and_an_undone_edit_reuses_its_vector(make_app: Any, tmp_path: Path) -> None:  # noqa: F811
    model = tmp_path / "model"
    make_tiny_model(model, seed=5)
    # 0.05 MiB of vectors at 32 dims: spares may hold at most 0.0125 MiB = 102 vectors.
    app = make_app(f'[rag]\nlocal_model_dir = "{model}"\nbackground_index = false\n[rag.cache]\nmax_vector_mib = 0.05\n')
    vid = call(app, "vault.create", name="sp", passphrase=PW)["vault_id"]
    rid = call(app, "memory.add", vault=vid, title="t", body="coffee tea original")["id"]
    call(app, "rag.index", vault=vid)
    for i in range(300):
        call(app, "memory.update", vault=vid, id=rid, body=f"coffee w{i % 100:03d} edit {i}")
        call(app, "rag.index", vault=vid)
    space = app.rag.peek_index(app.vaults.store(vid)).vectors
    assert space.spare_count <= int(0.05 * 1024 * 1024 * 0.25) // (32 * 4)
    assert space.nbytes == len(space.index) * 32 * 4 + space.spare_count * 32 * 4
    # Back to the first text: its vector is still sealed on disk and is reused, not re-embedded.
    call(app, "memory.update", vault=vid, id=rid, body="coffee tea original")
    assert call(app, "rag.index", vault=vid)["embedded"] == 0
    assert call(app, "rag.search", vault=vid, query="coffee", mode="vector")["results"]
    # A recent edit undone is reused from the spares in memory.
    call(app, "memory.update", vault=vid, id=rid, body="coffee w099 edit 299")
    assert call(app, "rag.index", vault=vid)["embedded"] == 0
