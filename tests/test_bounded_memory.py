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
    app = make_app(f'[embedding.local]\nmodel_dir = "{model}"\n[index]\nbackground = false\nmax_vector_mib = 0.05\n')
    vid = call(app, "vault.create", name="sp", passphrase=PW)["vault_id"]
    rid = call(app, "memory.add", vault=vid, title="t", body="coffee tea original")["id"]
    call(app, "rag.index", vault=vid)
    for i in range(300):
        call(app, "memory.update", vault=vid, id=rid, body=f"coffee w{i % 100:03d} edit {i}")
        call(app, "rag.index", vault=vid)
    space = app.rag.peek_index(app.vaults.store(vid)).vectors
    assert space.spare_count <= int(0.05 * 1024 * 1024 * 0.25) // (32 * 4)
    # The index holds int8 rows (the default precision: 32 bytes + a 4-byte scale); spares float32.
    assert space.nbytes == len(space.index) * (32 + 4) + space.spare_count * 32 * 4
    # Back to the first text: its vector is still sealed on disk and is reused, not re-embedded.
    call(app, "memory.update", vault=vid, id=rid, body="coffee tea original")
    assert call(app, "rag.index", vault=vid)["embedded"] == 0
    assert call(app, "rag.search", vault=vid, query="coffee", mode="vector")["results"]
    # A recent edit undone is reused from the spares in memory.
    call(app, "memory.update", vault=vid, id=rid, body="coffee w099 edit 299")
    assert call(app, "rag.index", vault=vid)["embedded"] == 0


def test_trimmed_spares_reread_the_sidecar_only_for_a_key_it_may_hold(make_app: Any, tmp_path: Path) -> None:  # noqa: F811
    model = tmp_path / "model"
    make_tiny_model(model, seed=6)
    app = make_app(f'[embedding.local]\nmodel_dir = "{model}"\n[index]\nbackground = false\nmax_vector_mib = 0.01\n')
    vid = call(app, "vault.create", name="rr", passphrase=PW)["vault_id"]
    rid = call(app, "memory.add", vault=vid, title="t", body="coffee tea original")["id"]
    call(app, "rag.index", vault=vid)
    for i in range(60):  # 0.0025 MiB of spares = 20 vectors: the first texts are trimmed
        call(app, "memory.update", vault=vid, id=rid, body=f"coffee edit {i}")
        call(app, "rag.index", vault=vid)
    space = app.rag.peek_index(app.vaults.store(vid)).vectors
    loads = 0
    real_load, real_scan, real_chunks = space.sidecar.load, space.sidecar.scan, space.sidecar.scan_chunks

    def counting_load() -> Any:
        nonlocal loads
        loads += 1
        return real_load()

    def counting_scan(take: Any) -> Any:  # the sidecar read a chunk at a time (what attach uses)
        nonlocal loads
        loads += 1
        return real_scan(take)

    def counting_chunks(take: Any) -> Any:  # the same, chunk records as stored (int8 rows)
        nonlocal loads
        loads += 1
        return real_chunks(take)

    space.sidecar.load = counting_load
    space.sidecar.scan = counting_scan
    space.sidecar.scan_chunks = counting_chunks
    # New text: nothing on disk can match it, so the sidecar is not read again.
    for i in range(5):
        call(app, "memory.update", vault=vid, id=rid, body=f"coffee brand new {i}")
        assert call(app, "rag.index", vault=vid)["embedded"] == 1
    assert loads == 0
    # A recent text: reused from the spares in memory.
    call(app, "memory.update", vault=vid, id=rid, body="coffee edit 59")
    assert call(app, "rag.index", vault=vid)["embedded"] == 0 and loads == 0
    # A trimmed text: read back from the sidecar once, not re-embedded.
    call(app, "memory.update", vault=vid, id=rid, body="coffee tea original")
    assert call(app, "rag.index", vault=vid)["embedded"] == 0 and loads == 1
    assert space.spare_count <= int(0.01 * 1024 * 1024 * 0.25) // (32 * 4)


def test_the_vector_index_gives_capacity_back_after_most_rows_are_removed() -> None:
    import numpy as np

    from memoriesd.index.vectors.matrix import VectorIndex

    ix = VectorIndex(8)
    rng = np.random.default_rng(0)
    ix.add(list(range(1000)), rng.normal(size=(1000, 8)).astype(np.float32))
    keep = ix.get(7)
    assert ix.capacity >= 1000
    ix.remove(range(10, 1000))
    assert len(ix) == 10 and ix.capacity <= 64
    got = ix.get(7)
    assert keep is not None and got is not None and np.array_equal(got, keep)
    assert [k for k, _ in ix.search(keep, 1)] == [7]


def test_a_vector_added_for_a_fragment_released_meanwhile_is_swept_by_attach(make_app: Any, tmp_path: Path) -> None:  # noqa: F811
    model = tmp_path / "model"
    make_tiny_model(model, seed=7)
    app = make_app(f'[embedding.local]\nmodel_dir = "{model}"\n[index]\nbackground = false\n')
    vid = call(app, "vault.create", name="race", passphrase=PW)["vault_id"]
    rid = call(app, "memory.add", vault=vid, title="t", body="coffee first")["id"]
    call(app, "rag.index", vault=vid)
    idx = app.rag.peek_index(app.vaults.store(vid))
    space = idx.vectors
    old = idx.live_frag_ids()
    # As an embed pass that raced the change would: the old fragment's vector lands after its drop.
    vec = space.index.get(old[0])
    call(app, "memory.update", vault=vid, id=rid, body="coffee second")
    call(app, "rag.index", vault=vid)
    space.index.add(old, vec[None, :])
    call(app, "memory.update", vault=vid, id=rid, body="coffee third")
    call(app, "rag.index", vault=vid)
    assert sorted(space.index.keys()) == sorted(idx.live_frag_ids())
