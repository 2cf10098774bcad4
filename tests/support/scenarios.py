"""Vault operations for the reliability engines, run through the daemon's own request dispatch.

A :class:`Harness` is the daemon's :class:`~memoriesd.server.app.App` in this process on a
temp home (cheap Argon2id parameters: the KDF is not what is tested here), with vault ``main``
(the one whose directory is recorded or failed) and vault ``other`` (which must keep working).
Each :class:`Scenario` has a ``setup`` (not recorded) and an ``action`` (recorded) that calls
``h.ack()`` after every step the daemon acknowledged; the end of the action is acknowledged too.

A :data:`View` of a vault is what a user can rely on: every current record (kind, title, body,
tags, private flag, revision) and setting, without random ids or timestamps, so two runs of a
scenario compare.

To add a scenario: append one to :data:`SCENARIOS`. To add a sealed derived file (checked in every
crash image): append one :class:`SealedFile` to :data:`SEALED_FILES`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memoriesd.config import WatchConfig, load_config
from memoriesd.home import Home
from memoriesd.index.snapshot import SnapshotRejected, read_snapshot, version_tag
from memoriesd.index.vectors.names import read_spaces, sidecar_opaque_id
from memoriesd.index.vectors.sidecar import VectorStore
from memoriesd.main import build_app
from memoriesd.memory.recalls import MAGIC as RECALLS_MAGIC
from memoriesd.memory.recalls import RECALLS_NAME
from memoriesd.memory.recalls import _aad as recalls_aad
from memoriesd.server.context import Context, Params
from memoriesd.text.segment import DEFAULT
from memoriesd.vault import crypto
from memoriesd.vault.format import read_header
from memoriesd.vault.records import Record, now
from memoriesd.vault.store import VaultStore, unwrap_key

REPO = Path(__file__).resolve().parents[2]
PW = "correct horse"
PW2 = "battery staple"
CHEAP = """
[vault]
kdf_memory_kib = 64
kdf_iterations = 1
kdf_lanes = 1
unlock_delay_step_ms = 1
unlock_delay_max_ms = 2
[index]
background = false
"""

View = tuple[tuple[Any, ...], tuple[Any, ...]]


def view_of(store: VaultStore, ids: bool = False) -> View:
    """``ids``: records keyed by id too (within one run; ids are random across runs)."""
    recs = sorted(((r.id,) if ids else ()) + (r.kind, r.title, r.body, tuple(r.tags), r.private, r.revision) for r in store.latest())
    sets = []
    for k, v in store.settings.items():
        if k.startswith("grant.") and isinstance(v, dict):
            sets.append(("grant", json.dumps([v.get("label"), v.get("scopes")], sort_keys=True)))
        else:
            sets.append((k, json.dumps(v, sort_keys=True)))
    return tuple(recs), tuple(sorted(sets))


def describe(v: View) -> str:
    return f"{len(v[0])} records, {len(v[1])} settings"


def lost_records(image: View, acked: View, nxt: View) -> int:
    """Records (views with ids) of the acknowledged view that the image lacks or holds at an older
    revision, except those the next acknowledged view deleted."""
    have = {r[0]: r[-1] for r in image[0]}
    later = {r[0] for r in nxt[0]}
    return sum(1 for r in acked[0] if have.get(r[0], -1) < r[-1] and not (r[0] not in have and r[0] not in later))


def per_record_ok(image: View, acked: View, nxt: View) -> bool:
    """Every record and setting (views with ids) is as acknowledged or as the next acknowledged
    state has it: for operations made of several commits, none of them acknowledged alone."""
    for part in (0, 1):
        a = {x[0]: x for x in acked[part]}
        b = {x[0]: x for x in nxt[part]}
        got = {x[0]: x for x in image[part]}
        for k in set(a) | set(b) | set(got):
            if got.get(k) not in (a.get(k), b.get(k)):
                return False
    return True


def open_view(vault_dir: Path, passphrases: tuple[str, ...], ids: bool = False) -> View:
    """Unlock a vault directory with the real code (passphrase, header, head, log, recovery)."""
    header = read_header(vault_dir, vault_dir.name)
    key: bytearray | None = None
    for pw in passphrases:
        try:
            key = unwrap_key(header, bytearray(pw.encode()))
            break
        except Exception:  # noqa: BLE001 - the next passphrase may be the one
            continue
    if key is None:
        key = unwrap_key(header, bytearray(passphrases[0].encode()))  # raises its bad_passphrase
    store = VaultStore.open(vault_dir, key=key)
    try:
        return view_of(store, ids)
    finally:
        store.close()


def vault_key(vault_dir: Path, passphrases: tuple[str, ...]) -> bytes:
    header = read_header(vault_dir, vault_dir.name)
    for pw in passphrases:
        try:
            return bytes(unwrap_key(header, bytearray(pw.encode())))
        except Exception:  # noqa: BLE001
            continue
    raise AssertionError("no passphrase opens the header")


# ----------------------------------------------------------------------------- sealed derived files


class Rejected(Exception):
    """The reader refused the file (derived data: it is then rebuilt)."""


@dataclass(frozen=True)
class SealedFile:
    """A sealed derived file: ``read(path, vault_dir, vault_id, key)`` returns what it accepts or
    raises :class:`Rejected`. ``atomic``: replaced whole, so a file it accepts must be byte for
    byte a version that was written; otherwise ``read`` returns a set of entries that must all
    have been written at some point."""

    pattern: str
    read: Callable[[Path, Path, str, bytes], Any]
    atomic: bool = True


def _read_lexical(path: Path, vault_dir: Path, vid: str, key: bytes) -> Any:
    try:
        return read_snapshot(vault_dir, vid, crypto.Sealer(bytearray(key), crypto.LABEL_LEXICAL_SNAPSHOT), version_tag(DEFAULT))
    except SnapshotRejected as exc:
        raise Rejected(str(exc)) from exc


def _read_spaces(path: Path, vault_dir: Path, vid: str, key: bytes) -> Any:
    got = read_spaces(vault_dir, vault_id=vid, open_=crypto.Sealer(bytearray(key), crypto.LABEL_VECTORS).open)
    if not got:
        raise Rejected("unreadable or empty")
    return got


def _read_sidecar(path: Path, vault_dir: Path, vid: str, key: bytes) -> Any:
    sealer = crypto.Sealer(bytearray(key), crypto.LABEL_VECTORS)
    spaces = read_spaces(vault_dir, vault_id=vid, open_=sealer.open)
    space = spaces.get(sidecar_opaque_id(path))
    if space is None:
        raise Rejected("no space names it")
    vs = VectorStore(path, vault_id=vid, identity=str(space["identity"]), dims=int(str(space["dims"])), seal=sealer.seal, open_=sealer.open)
    entries = vs.load()
    if not entries and not path.exists():
        raise Rejected("damaged (discarded)")
    return {(k, v.tobytes()) for k, v in entries.items()}


def _read_recalls(path: Path, vault_dir: Path, vid: str, key: bytes) -> Any:
    data = path.read_bytes()
    try:
        if not data.startswith(RECALLS_MAGIC):
            raise ValueError("magic")
        return json.loads(crypto.Sealer(bytearray(key), crypto.LABEL_RECALLS).open(data[len(RECALLS_MAGIC) :], recalls_aad(vid)))
    except Exception as exc:
        raise Rejected(type(exc).__name__) from exc


#: Every sealed derived file a crash image is checked for. One line per file.
SEALED_FILES: list[SealedFile] = [
    SealedFile("lexical-index.bin", _read_lexical),
    SealedFile("vector-spaces.bin", _read_spaces),
    SealedFile("vectors-*.bin", _read_sidecar, atomic=False),
    SealedFile(RECALLS_NAME, _read_recalls),
]


def sealed_entries(vault_dir: Path, vid: str, key: bytes) -> dict[str, Any]:
    """What the non-atomic sealed files hold (to collect what was ever written)."""
    out: dict[str, Any] = {}
    for sf in SEALED_FILES:
        if sf.atomic:
            continue
        for p in sorted(vault_dir.glob(sf.pattern)):
            try:
                out[p.name] = sf.read(p, vault_dir, vid, key)
            except Rejected:
                pass
    return out


# ----------------------------------------------------------------------------- harness


def _tmp_root() -> Path:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="rel", dir=base))


_model_lock = threading.Lock()
_model_dir: Path | None = None


def tiny_model() -> Path:
    """The tests' tiny real ONNX embedding model, written once per process."""
    global _model_dir
    with _model_lock:
        if _model_dir is None:
            from tests.tinymodel import make_tiny_model

            d = Path(tempfile.mkdtemp(prefix="reltiny"))
            make_tiny_model(d)
            _model_dir = d
        return _model_dir


class Harness:
    """The daemon's App on a temp home, with vaults ``main`` and ``other``."""

    def __init__(self, extra_config: str = "", *, model: bool = False) -> None:
        self.root = _tmp_root()
        home = Home(self.root / "h")
        home.root.mkdir(parents=True, mode=0o700)
        cfg = CHEAP
        if model:
            cfg = cfg.replace("[index]\n", f'[embedding.local]\nmodel_dir = "{tiny_model()}"\nthreads = 1\n[index]\n')
        (home.root / "config.toml").write_text(cfg + extra_config)
        home.ensure()
        self.home = home
        self.app = build_app(home, load_config(home.config_path))
        self.vid = self.call("vault.create", name="main", passphrase=PW)["vault_id"]
        self.other = self.call("vault.create", name="other", passphrase=PW)["vault_id"]
        self.dir = home.vaults / self.vid
        self.folder = self.root / "notes"
        self.ack_hook: Callable[[str], None] = lambda label: None
        self.passphrases: tuple[str, ...] = (PW,)
        self.ids: dict[str, str] = {}

    def call(self, method: str, **params: Any) -> Any:
        return self.app.dispatch(method, Context(Params(params)))

    def ack(self, label: str) -> None:
        self.ack_hook(label)

    @property
    def store(self) -> VaultStore:
        live = self.app.vaults.live(self.vid)
        assert live is not None, "vault main is locked"
        return live.store

    def add(self, name: str, body: str) -> str:
        rid = str(self.call("memory.add", vault=self.vid, title=name, body=body)["id"])
        self.ids[name] = rid
        return rid

    def close(self) -> None:
        try:
            self.app.vaults.lock_all("harness end")
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass
        shutil.rmtree(self.root, ignore_errors=True)


# ----------------------------------------------------------------------------- scenarios


def _notes(h: Harness) -> None:
    for i, word in enumerate(("coffee mountain", "tea river", "piano guitar")):
        h.add(f"note {i}", f"{word} body {i} with enough words to index")


def _notes_indexed(h: Harness) -> None:
    _notes(h)
    h.call("rag.search", vault=h.vid, query="coffee", mode="bm25")


def _append(h: Harness) -> None:
    h.add("new", "a new note about the harbour")
    h.ack("add")
    h.call("memory.update", vault=h.vid, id=h.ids["note 0"], body="coffee mountain revised")
    h.ack("update")
    h.call("memory.delete", vault=h.vid, id=h.ids["note 1"])


def _group_commit(h: Harness) -> None:
    store = h.store
    errors: list[BaseException] = []

    def run(i: int) -> None:
        t = now()
        recs = [Record(f"grp{i:02d}{j}aaaaaaaaaa"[:16], 1, "memory", f"g{i}.{j}", f"group body {i} {j}", False, (), created=t, updated=t) for j in range(2)]
        try:
            store.commit(recs)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    with store.lock:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while len(store._queue) < len(threads) and time.monotonic() < deadline:
            time.sleep(0.002)
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]


def _compaction_setup(h: Harness) -> None:
    _notes_indexed(h)
    for i in range(3):
        h.call("memory.update", vault=h.vid, id=h.ids["note 0"], body=f"coffee mountain v{i}")
    h.call("memory.delete", vault=h.vid, id=h.ids["note 2"])


def _compact(h: Harness) -> None:
    h.call("vault.compact", vault=h.vid)


def _passwd(h: Harness) -> None:
    h.passphrases = (PW2, PW)
    h.call("vault.passwd", vault=h.vid, old=PW, new=PW2)


def _rekey_setup(h: Harness) -> None:
    """Every kind of sealed file a key change re-seals or drops: vectors, recall counters, the
    lexical snapshot, a grant; locked and unlocked so the counters and the snapshot are on disk."""
    _notes_indexed(h)
    h.call("rag.index", vault=h.vid)
    h.call("grant.create", vault=h.vid, scopes=["search"], label="tool")
    h.call("memory.remember", vault=h.vid, text="I live in Lisbon", category="fact", key="home city")
    h.call("rag.context", vault=h.vid, query="where do I live")  # counts a recall
    h.call("vault.lock", vault=h.vid)
    h.call("vault.unlock", vault=h.vid, passphrase=PW)


def _rekey(h: Harness) -> None:
    h.passphrases = (PW2, PW)
    h.call("vault.passwd", vault=h.vid, old=PW, new=PW2, rekey=True)


def _grants(h: Harness) -> None:
    g = h.call("grant.create", vault=h.vid, scopes=["search"], label="tool")
    h.ack("grant create")
    h.call("grant.revoke", grant_id=g["grant_id"])


def _facts(h: Harness) -> None:
    h.call("memory.remember", vault=h.vid, text="I live in Lisbon", category="fact", key="home city")
    h.ack("remember")
    h.call("memory.remember", vault=h.vid, text="I live in Porto", category="fact", key="home city")
    h.ack("revise")
    h.call("rag.context", vault=h.vid, query="where do I live")  # counts a recall
    h.ack("recall")
    h.call("vault.lock", vault=h.vid)  # writes the recall counters


def _capture(h: Harness) -> None:
    text = "user: I prefer green tea in the morning.\nassistant: Noted, green tea it is.\nuser: My dentist is Dr Smith."
    h.call("memory.capture", vault=h.vid, text=text, title="chat", session_id="s1")


def _watch(h: Harness) -> None:
    from memoriesd.watch.sync import sync

    h.folder.mkdir(exist_ok=True)
    for i in range(3):
        (h.folder / f"w{i}.md").write_text(f"# Watched {i}\n\nriver stone {i}\n")
    watch = WatchConfig(vault=h.vid, path=str(h.folder), prune=True)
    ctx = Context(Params({}))
    sync(h.store, watch, ctx, folders=[str(h.folder)], max_bytes=1 << 20, exclude=str(h.home.root))
    h.ack("sync")
    (h.folder / "w0.md").write_text("# Watched 0\n\nriver stone changed\n")
    (h.folder / "w1.md").unlink()
    sync(h.store, watch, ctx, folders=[str(h.folder)], max_bytes=1 << 20, exclude=str(h.home.root))


def _lexical(h: Harness) -> None:
    h.call("rag.search", vault=h.vid, query="coffee", mode="bm25")
    h.call("vault.lock", vault=h.vid)  # writes the due snapshot
    h.ack("lock")
    h.call("vault.unlock", vault=h.vid, passphrase=PW)
    h.add("later", "a later note about tea and coffee")
    h.ack("add")
    h.call("rag.search", vault=h.vid, query="tea", mode="bm25")
    h.call("vault.compact", vault=h.vid)  # rewrites the snapshot bound to the new head


def _vectors(h: Harness) -> None:
    h.call("rag.index", vault=h.vid)
    h.ack("index")
    h.add("dog", "the dog and the cat play")
    h.ack("add")
    h.call("rag.index", vault=h.vid)  # appends to the sidecar (commit slots)
    h.ack("index again")
    h.call("memory.delete", vault=h.vid, id=h.ids["note 1"])
    h.ack("delete")
    h.call("vault.compact", vault=h.vid)  # retains only live vectors (rewrite)


def _vectors_setup(h: Harness) -> None:
    _notes_indexed(h)


def _forget(h: Harness) -> None:
    h.call("memory.forget", vault=h.vid, ids=[h.ids["note 0"]])


def _forget_setup(h: Harness) -> None:
    _notes_indexed(h)
    h.call("rag.index", vault=h.vid)
    h.call("memory.update", vault=h.vid, id=h.ids["note 0"], body="coffee mountain secret revision")


def _recovery_setup(h: Harness) -> None:
    """A vault whose head.bin was rolled back and whose log ends in a torn write: unlock recovers."""
    _notes(h)
    h.call("vault.lock", vault=h.vid)
    old_head = (h.dir / "head.bin").read_bytes()
    h.call("vault.unlock", vault=h.vid, passphrase=PW)
    h.add("after", "written after the old head")
    h.add("after 2", "also written after the old head")
    h.call("vault.lock", vault=h.vid)
    (h.dir / "head.bin").write_bytes(old_head)
    log = next(h.dir.glob("log-*.bin"))
    with open(log, "ab") as f:
        f.write(b"\x00\x00\x01\x00" + os.urandom(300))  # a torn, never acknowledged frame


def _recovery(h: Harness) -> None:
    h.call("vault.unlock", vault=h.vid, passphrase=PW)


@dataclass(frozen=True)
class Scenario:
    name: str
    action: Callable[[Harness], None]
    setup: Callable[[Harness], None] = _notes
    model: bool = False
    config: str = ""
    # False: the action is several commits acknowledged together (capture then extraction; a
    # watched folder's ingest then prune): each record is then as before or as after.
    atomic: bool = True


SCENARIOS: list[Scenario] = [
    Scenario("append", _append),
    Scenario("group_commit", _group_commit),
    Scenario("compaction", _compact, _compaction_setup),
    Scenario("passwd", _passwd),
    Scenario("rekey", _rekey, _rekey_setup, model=True),
    Scenario("grants", _grants),
    Scenario("facts_and_recalls", _facts),
    Scenario("conversation_capture", _capture, atomic=False),
    Scenario("watched_folder", _watch, atomic=False),
    Scenario("lexical_snapshot", _lexical, _notes),
    Scenario("sealed_vectors", _vectors, _vectors_setup, model=True),
    Scenario("forget", _forget, _forget_setup, model=True),
    Scenario("unlock_recovery", _recovery, _recovery_setup),
]


def by_name(names: list[str] | None) -> list[Scenario]:
    if not names:
        return list(SCENARIOS)
    known = {s.name: s for s in SCENARIOS}
    return [known[n] for n in names]
