"""One owner per unlocked vault: lock, eviction, passwd and compaction raced against work.

These run the daemon's own App in this process (real vault files, SQLite/FTS5, jieba, onnxruntime
on a tiny real model) and race real threads through its request dispatch, many times over, so
the interleavings that used to lose data or leak keys get a chance to happen.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memoriesd.config import load_config
from memoriesd.errors import MemoriesError
from memoriesd.home import Home
from memoriesd.index.vectors.names import list_sidecars
from memoriesd.index.vectors.sidecar import VectorStore
from memoriesd.main import build_app
from memoriesd.rag.background import HOLD_ENV
from memoriesd.server.app import App
from memoriesd.server.context import Context, Params
from memoriesd.vault import crypto
from memoriesd.vault.store import VaultStore

from .conftest import short_tmpdir, write_config
from .tinymodel import make_tiny_model

PW = "correct horse"
#: What a request racing a lock may answer besides success: nothing else (never `internal`).
RACE_CODES = {"vault_locked", "cancelled"}


def call(app: App, method: str, **params: Any) -> Any:
    return app.dispatch(method, Context(Params(params)))


def try_call(app: App, method: str, **params: Any) -> tuple[Any, str | None]:
    try:
        return call(app, method, **params), None
    except MemoriesError as exc:
        return None, exc.code


@pytest.fixture
def make_app() -> Iterator[Any]:
    roots: list[Path] = []
    apps: list[App] = []

    def make(extra: str = "") -> App:
        root = short_tmpdir("lv")
        roots.append(root)
        home = Home(root / "h")
        write_config(home.root, extra)
        home.ensure()
        app = build_app(home, load_config(home.config_path))
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.vaults.lock_all("test end")
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)


def _wait_for(what: str, cond: Any, timeout: float = 60.0) -> None:
    """Until ``cond()`` is true, or fail after a deadline generous for a loaded machine."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _notes(app: App, vault: str, n: int, words: int = 60) -> None:
    rnd = random.Random(n)
    vocab = "cat dog coffee tea mountain river piano guitar bank money doctor vault key search".split()
    for i in range(n):
        body = " ".join(rnd.choice(vocab) for _ in range(words))
        call(app, "memory.add", vault=vault, title=f"note {i}", body=f"{body} w{i:03d}")


def test_a_wiped_key_refuses_to_seal_open_or_derive() -> None:
    sealer = crypto.Sealer(crypto.new_key(), crypto.LABEL_VECTORS)
    blob = sealer.seal(b"x", b"aad")
    sealer.wipe()
    with pytest.raises(crypto.KeyWiped):
        sealer.seal(b"y", b"aad")
    with pytest.raises(crypto.KeyWiped):
        sealer.open(blob, b"aad")
    master = crypto.new_key()
    crypto.wipe(master)
    with pytest.raises(crypto.KeyWiped):
        crypto.subkey(master, crypto.LABEL_FINGERPRINT)
    with pytest.raises(crypto.KeyWiped):
        crypto.mac(master, b"data")


def test_lock_racing_searches_never_answers_internal_and_leaves_no_index(make_app: Any) -> None:
    app = make_app()
    vid = call(app, "vault.create", name="race", passphrase=PW)["vault_id"]
    _notes(app, vid, 40)
    stop = threading.Event()
    codes: list[str | None] = []
    crashes: list[BaseException] = []

    def searcher() -> None:
        while not stop.is_set():
            try:
                _, code = try_call(app, "rag.search", vault=vid, query="coffee mountain", mode="bm25")
                codes.append(code)
            except BaseException as exc:  # noqa: BLE001 - anything but a MemoriesError is a defect
                crashes.append(exc)
                return

    threads = [threading.Thread(target=searcher) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(25):
            # Lock while the searchers are at work: once one search of this unlock has succeeded.
            mark = len(codes)
            _wait_for("a search of the unlocked vault", lambda m=mark: crashes or None in codes[m:])
            live = app.vaults.live(vid)
            assert app.vaults.lock(vid)
            # Locked: its index is closed and unreachable, its keys wiped, its records gone.
            assert live is not None and live.peek("index") is None and live.state == "closed"
            assert live.store.key.wiped and not live.store.records
            assert vid not in app.rag.cache.cached_ids()
            call(app, "vault.unlock", vault=vid, passphrase=PW)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not crashes
    assert set(codes) - {None} <= RACE_CODES, set(codes)
    assert codes.count(None) >= 25


def test_an_index_evicted_during_rag_index_never_seals_under_a_wiped_key(make_app: Any, tmp_path: Path) -> None:
    model = tmp_path / "model"
    make_tiny_model(model, seed=3)
    app = make_app(f'[embedding.local]\nmodel_dir = "{model}"\nthreads = 1\n[index]\nbackground = false\n')
    app.rag.cache.max_vaults = 1  # one process serves both vaults here: each search of one evicts the other
    a = call(app, "vault.create", name="a", passphrase=PW)["vault_id"]
    b = call(app, "vault.create", name="b", passphrase=PW)["vault_id"]
    _notes(app, a, 150)
    _notes(app, b, 5)
    stop = threading.Event()
    other: list[str | None] = []

    def evictor() -> None:  # every search of b evicts a's index (max_vaults = 1)
        while not stop.is_set():
            other.append(try_call(app, "rag.search", vault=b, query="coffee", mode="bm25")[1])

    t = threading.Thread(target=evictor)
    t.start()
    try:
        result = call(app, "rag.index", vault=a)
    finally:
        stop.set()
        t.join(30)
    assert result["remaining"] == 0 and result["embedded"] > 0
    assert set(other) == {None}
    # Every sealed vector opens with a's real key; none opens with an all-zero key.
    store = app.vaults.store(a)
    real = crypto.Sealer(store.key, crypto.LABEL_VECTORS)
    zero = crypto.Sealer(bytes(32), crypto.LABEL_VECTORS)
    sidecars = list_sidecars(store.dir)
    assert len(sidecars) == 1
    copy = tmp_path / sidecars[0].name  # a damaged-looking file is discarded on load: try the zero key on a copy
    shutil.copy(sidecars[0], copy)
    assert VectorStore(copy, vault_id=a, identity=result["model"], dims=32, seal=zero.seal, open_=zero.open).load() == {}
    loaded = VectorStore(sidecars[0], vault_id=a, identity=result["model"], dims=32, seal=real.seal, open_=real.open).load()
    assert len(loaded) == result["total"]


def test_lock_during_rag_index_cancels_it_and_nothing_is_sealed_after(make_app: Any, tmp_path: Path) -> None:
    model = tmp_path / "model"
    make_tiny_model(model, seed=3)
    app = make_app(f'[embedding.local]\nmodel_dir = "{model}"\nthreads = 1\n[index]\nbackground = false\n')
    vid = call(app, "vault.create", name="a", passphrase=PW)["vault_id"]
    _notes(app, vid, 300)
    live = app.vaults.live(vid)
    assert live is not None
    out: dict[str, Any] = {}
    batches = threading.Event()

    def on_progress(_frame: dict[str, Any]) -> None:
        # After the first batch, hold the pass until the lock has begun: it is provably mid-way then.
        if not batches.is_set():
            batches.set()
            _wait_for("the lock to begin", lambda: not live.is_open)

    def indexer() -> None:
        ctx = Context(Params({"vault": vid}), send_progress=on_progress)
        try:
            out["result"], out["code"] = app.dispatch("rag.index", ctx), None
        except MemoriesError as exc:
            out["result"], out["code"] = None, exc.code

    t = threading.Thread(target=indexer)
    t.start()
    assert batches.wait(60), "rag index sent no progress"
    assert app.vaults.lock(vid)
    sizes = {p: p.stat().st_size for p in list_sidecars(app.home.vaults / vid)}
    t.join(60)
    assert not t.is_alive()
    assert out["code"] == "cancelled" and out["result"] is None
    assert sizes and {p: p.stat().st_size for p in list_sidecars(app.home.vaults / vid)} == sizes  # nothing written after lock
    call(app, "vault.unlock", vault=vid, passphrase=PW)
    status = call(app, "rag.status", vault=vid)
    # The batch sealed before the lock is kept; the rest of the pass was cancelled.
    assert 0 < status["embedding"]["embedded"] < status["embedding"]["total"]


def test_passwd_racing_writes_loses_nothing_and_never_reopens_the_log(make_app: Any) -> None:
    app = make_app()
    vid = call(app, "vault.create", name="pw", passphrase=PW)["vault_id"]
    acked: list[str] = []
    errors: list[str | None] = []
    stop = threading.Event()

    def writer(n: int) -> None:
        i = 0
        while not stop.is_set():
            res, code = try_call(app, "memory.add", vault=vid, title=f"w{n}-{i}", body="text")
            if code is None:
                acked.append(res["id"])
            else:
                errors.append(code)
            i += 1

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    phrases = [PW, "second phrase", "third phrase"]
    try:
        for i in range(12):
            # Each change races writes: it comes once a write after the previous one was acknowledged.
            mark = len(acked)
            _wait_for("an acknowledged write", lambda m=mark: errors or len(acked) > m)
            call(app, "vault.passwd", vault=vid, old=phrases[i % 3], new=phrases[(i + 1) % 3])
            if i % 4 == 3:
                call(app, "vault.compact", vault=vid)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors
    final = phrases[12 % 3]
    app.vaults.lock(vid)
    # A fresh open from disk: every acknowledged record is there and the log is whole.
    store = VaultStore.open(app.home.vaults / vid, passphrase=final.encode())
    try:
        assert {r.id for r in store.latest()} == set(acked)
        assert len(acked) >= 12
    finally:
        store.close()


def test_compaction_racing_updates_keeps_every_acknowledged_revision(make_app: Any) -> None:
    app = make_app()
    vid = call(app, "vault.create", name="cmp", passphrase=PW)["vault_id"]
    ids = [call(app, "memory.add", vault=vid, title=f"r{i}", body="v0")["id"] for i in range(5)]
    last: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    bad: list[str | None] = []

    def updater(rid: str) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            res, code = try_call(app, "memory.update", vault=vid, id=rid, body=f"v{n}")
            if code is not None:
                bad.append(code)
                continue
            with lock:
                last[rid] = max(last.get(rid, 0), res["revision"])

    threads = [threading.Thread(target=updater, args=(rid,)) for rid in ids]
    for t in threads:
        t.start()
    try:
        for _ in range(15):
            # Each compaction races updates: it comes once every record was updated since the previous one.
            with lock:
                seen = dict(last)
            _wait_for("an update of every record", lambda s=seen: bad or all(last.get(r, 0) > s.get(r, 0) for r in ids))
            call(app, "vault.compact", vault=vid)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not bad
    app.vaults.lock(vid)
    store = VaultStore.open(app.home.vaults / vid, passphrase=PW.encode())
    try:
        for rid in ids:
            assert store.get(rid).revision == last[rid]
    finally:
        store.close()


def test_concurrent_ingests_of_one_folder_make_one_card_per_file(make_app: Any, tmp_path: Path) -> None:
    app = make_app()
    vid = call(app, "vault.create", name="ing", passphrase=PW)["vault_id"]
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(30):
        (folder / f"n{i}.md").write_text(f"# Note {i}\n\ncoffee and tea {i}\n")
    codes: list[str | None] = []

    def ingest() -> None:
        codes.append(try_call(app, "rag.ingest", vault=vid, paths=[str(folder)], recursive=True)[1])

    threads = [threading.Thread(target=ingest) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert codes == [None] * 4
    cards = [r for r in call(app, "memory.list", vault=vid, kind="card")["records"]]
    assert len(cards) == 30


def test_an_update_between_reading_and_writing_an_ingested_card_is_not_an_internal_error(make_app: Any, tmp_path: Path) -> None:
    app = make_app()
    vid = call(app, "vault.create", name="ing2", passphrase=PW)["vault_id"]
    note = tmp_path / "n.md"
    note.write_text("# N\n\nfirst\n")
    card = call(app, "rag.ingest", vault=vid, paths=[str(note)])["records"][0]
    stop = threading.Event()
    codes: list[str | None] = []

    def updater() -> None:
        while not stop.is_set():
            codes.append(try_call(app, "memory.update", vault=vid, id=card["id"], tags=["t"], untag=["t"])[1])

    t = threading.Thread(target=updater)
    t.start()
    try:
        for i in range(20):
            note.write_text(f"# N\n\nversion {i}\n")
            codes.append(try_call(app, "rag.ingest", vault=vid, paths=[str(note)])[1])
    finally:
        stop.set()
        t.join(30)
    assert set(codes) == {None}
    cards = call(app, "memory.list", vault=vid, kind="card")["records"]
    assert len(cards) == 1


def test_auto_lock_never_closes_a_vault_in_use(make_app: Any) -> None:
    app = make_app("[daemon]\nauto_lock_minutes = 1\n")
    vid = call(app, "vault.create", name="idle", passphrase=PW)["vault_id"]
    live = app.vaults.live(vid)
    assert live is not None
    ctx = Context(Params({}))
    app.vaults.use(vid, ctx)
    live.last_used = time.monotonic() - 3600  # idle for an hour by the clock, but leased
    assert app.vaults.expire_idle() == []
    ctx.release()  # the end of the use counts as use
    assert app.vaults.expire_idle() == []
    live.last_used = time.monotonic() - 3600
    assert app.vaults.expire_idle() == [vid]


def test_lock_waits_for_a_leased_operation_and_refuses_new_ones(make_app: Any) -> None:
    app = make_app()
    vid = call(app, "vault.create", name="lease", passphrase=PW)["vault_id"]
    ctx = Context(Params({}))
    store = app.vaults.use(vid, ctx).store
    done = threading.Event()
    live = app.vaults.live(vid)
    assert live is not None
    t = threading.Thread(target=lambda: (app.vaults.lock(vid), done.set()))
    t.start()
    _wait_for("the lock to begin", lambda: not live.is_open)
    assert not done.is_set() and not store.closed  # waiting for the lease
    assert try_call(app, "memory.list", vault=vid)[1] == "vault_locked"  # no new work meanwhile
    with pytest.raises(MemoriesError) as err:
        ctx.check_cancelled()  # the leased operation is told to stop
    assert err.value.code == "cancelled"
    ctx.release()
    t.join(60)
    assert done.is_set() and store.closed and store.key.wiped


class _Embeddings:
    """A real OpenAI-compatible embeddings server on 127.0.0.1 (made-up vectors, answered at once)."""

    def __init__(self) -> None:
        import json
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                inputs = data["input"] if isinstance(data["input"], list) else [data["input"]]
                vecs = [[float(len(t) % 7 + 1), float(t.count("e") + 1), 1.0, float(i % 3)] for i, t in enumerate(inputs)]
                body = json.dumps({"object": "list", "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vecs)]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/embeddings"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_long_rag_index_lets_searches_of_other_vaults_embed_between_its_batches(make_app: Any) -> None:
    svc = _Embeddings()
    try:
        app = make_app(f'[embedding.service]\nprotocol = "compatible"\nurl = "{svc.url}"\nmodel = "m"\n')
        a = call(app, "vault.create", name="a", passphrase=PW)["vault_id"]
        b = call(app, "vault.create", name="b", passphrase=PW)["vault_id"]
        _notes(app, a, 200)  # 200 fragments: 7 batches
        _notes(app, b, 3)  # embedded by the search itself (on demand), then its query
        between = threading.Event()
        searched = threading.Event()
        waited: list[bool] = []

        def on_progress(_frame: dict[str, Any]) -> None:
            # After its first batch, the pass waits (between batches) for the search of b.
            if not between.is_set():
                between.set()
                waited.append(searched.wait(60))

        out: dict[str, Any] = {}

        def index() -> None:
            out["index"] = app.dispatch("rag.index", Context(Params({"vault": a}), send_progress=on_progress))

        t = threading.Thread(target=index)
        t.start()
        try:
            assert between.wait(60), "rag index sent no progress"
            res = call(app, "rag.search", vault=b, query="coffee", mode="vector")
        finally:
            searched.set()
            t.join(60)
        assert res["results"] and res["missing_vectors"] == 0
        assert waited == [True], "the search waited for the whole rag index pass"
        assert out["index"]["remaining"] == 0 and out["index"]["embedded"] == out["index"]["total"] == 200
    finally:
        svc.close()


def test_lock_during_background_indexing_pauses_it_and_nothing_is_sealed_after(
    make_app: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model"
    make_tiny_model(model, seed=3)
    hold = tmp_path / "hold-background"
    monkeypatch.setenv(HOLD_ENV, str(hold))  # while this file exists the worker holds before each chunk
    app = make_app(f'[embedding.local]\nmodel_dir = "{model}"\nthreads = 1\n')
    vid = call(app, "vault.create", name="bg", passphrase=PW)["vault_id"]
    background = app.rag.background

    def state() -> str | None:
        job = background.job(vid)
        return None if job is None else job.state

    for round_ in range(5):
        hold.touch()
        _notes(app, vid, 60)  # each add queues the vault for the background worker
        # The worker is mid-job (its chunk holds a lease), with these 60 notes still to embed.
        _wait_for("the background job to run", lambda: state() == "running")
        live = app.vaults.live(vid)
        assert app.vaults.lock(vid)
        assert live is not None and live.store.key.wiped
        assert state() == "paused", round_
        sizes = {p: p.stat().st_size for p in list_sidecars(app.home.vaults / vid)}
        # A barrier through the one worker: once it has handled the locked vault again, any step of
        # it that was under way at the lock is over too.
        hold.unlink()
        background.request(vid)
        assert background.wait(vid, 60) is not None and state() == "paused", round_
        assert {p: p.stat().st_size for p in list_sidecars(app.home.vaults / vid)} == sizes, round_
        call(app, "vault.unlock", vault=vid, passphrase=PW)  # resumes the job: it embeds until the next round's hold
    job = background.wait(vid, 120)
    assert job is not None and job.state == "done", job
    emb = call(app, "rag.status", vault=vid)["embedding"]
    assert emb["state"] == "done" and emb["embedded"] == emb["total"] == 300
