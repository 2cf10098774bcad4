"""Building blocks of tests/support/make_format_vectors.py: the fixed vaults, the deterministic random
stream, byte edits and the case registry (see that script and docs/format.md).

Importing this module replaces ``os.urandom`` in the importing process by a fixed stream: import it
only from the generator, never from the daemon or the tests.
"""


from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

# ----------------------------------------------------------------------------- determinism


class _Stream:
    """``os.urandom`` stand-in: SHA-256(label || counter) blocks. Distinct labels never repeat a
    nonce under one key; test keys only, never use outside this generator."""

    def __init__(self) -> None:
        self.reseed("unseeded")

    def reseed(self, label: str) -> None:
        self._label = b"memories/format-vectors/v1|" + label.encode("utf-8") + b"|"
        self._counter = 0
        self._buf = b""

    def __call__(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._buf += hashlib.sha256(self._label + self._counter.to_bytes(8, "big")).digest()
            self._counter += 1
        out, self._buf = self._buf[:n], self._buf[n:]
        return out


STREAM = _Stream()
os.urandom = STREAM  # this process only (a generator, never the daemon)

import numpy as np  # noqa: E402

from memoriesd.config import CacheConfig  # noqa: E402
from memoriesd.index import snapshot as snapshot_mod  # noqa: E402
from memoriesd.index.caches import VaultIndex  # noqa: E402
from memoriesd.index.vectors.maintenance import live_fragment_keys, sidecar_id  # noqa: E402
from memoriesd.index.vectors.names import sidecar_path, write_spaces  # noqa: E402
from memoriesd.index.vectors.sidecar import VectorStore  # noqa: E402
from memoriesd.memory.recalls import Recalls  # noqa: E402
from memoriesd.vault import crypto  # noqa: E402
from memoriesd.vault import store as store_mod  # noqa: E402
from memoriesd.vault.format import (  # noqa: E402
    GROUP_END,
    LEN,
    Head,
    chain_start,
    entry_plaintext,
    log_name,
    next_hash,
    seal_entry,
    seal_head,
)
from memoriesd.vault.records import Record  # noqa: E402
from memoriesd.vault.store import KdfParams, Setting, VaultStore  # noqa: E402

PASSPHRASE = "format vectors"
NEW_PASSPHRASE = "format vectors, changed"
KDF = KdfParams(memory_kib=8, iterations=1, lanes=1)
VAULT_A = "fmtvaultaaaa"
VAULT_B = "fmtvaultbbbb"
T0 = 1767225600.0  # 2026-01-01T00:00:00Z
IDENTITY = "format-vectors/test-embedder:v1"
DIMS = 4
store_mod.now = lambda: T0  # the header's "created"

# ----------------------------------------------------------------------------- records


def _rec(rid: str, rev: int, kind: str, title: str, body: str, minute: int, **kw: Any) -> Record:
    t = T0 + 60 * minute
    created = T0 + 60 * int(kw.pop("created_minute", minute))
    return Record(rid, rev, kind, title, body, bool(kw.get("private", False)), tuple(kw.get("tags", ("vec",))),
                  meta=dict(kw.get("meta", {})), private_meta=dict(kw.get("pmeta", {})), created=created, updated=t)


ID = {
    "A": "recalpha22222222",
    "B": "recbravo22222222",
    "C": "reccharlie222222",
    "F": "recfact222222222",
    "P": "recprivate222222",
    "G": "recgolf222222222",
    "H": "rechotel22222222",
    "X": "recxray222222222",
    "BETA": "recbeta222222222",
    "BFACT": "recbfact22222222",
}
R: dict[str, Record] = {
    "A1": _rec(ID["A"], 1, "memory", "Alpha note", "The alpha lantern glows over the river.\n\nA second paragraph about copper meadows.", 1),
    "B1": _rec(ID["B"], 1, "memory", "Bravo note", "Bravo harvest in the orchard.", 1),
    "C1": _rec(ID["C"], 1, "card", "Charlie 卡片 ✓", "图书馆的古籍修复 and a glacier ember.", 2, meta={"source": "cards/charlie.md"}),
    "A2": _rec(ID["A"], 2, "memory", "Alpha note, revised", "The alpha lantern glows over the quiet river.", 3, created_minute=1),
    "B2": Record(ID["B"], 2, "memory", "", "", False, (), created=T0 + 60, updated=T0 + 300, deleted=True),
    "F1": _rec(ID["F"], 1, "fact", "", "The user prefers tabs over spaces", 6,
               meta={"category": "preference", "key": "preference:indentation"}, pmeta={"importance": 0.8}),
    "P1": _rec(ID["P"], 1, "memory", "Private note", "a private thought", 7, private=True),
    "P1fork": _rec(ID["P"], 1, "memory", "Private nota", "a private though!", 7, private=True),
    "G1": _rec(ID["G"], 1, "memory", "Golf note", "golf course by the lagoon", 8),
    "H1": _rec(ID["H"], 1, "memory", "Hotel note", "hotel by the quarry", 8),
    "X1": _rec(ID["X"], 1, "memory", "Xray note", "x-ray of the falcon", 9),
    "BETA1": _rec(ID["BETA"], 1, "memory", "Beta note", "another vault's river lantern", 1),
    "BFACT1": _rec(ID["BFACT"], 1, "fact", "", "The user drinks green tea", 2, meta={"category": "preference"},
                   pmeta={"importance": 0.5}),
}
DEVICE_ONLY = Setting("policy.device_only", True)
# The groups (one commit each, so one head write each) of vault A; G8 is written only by variants.
GROUPS_A: list[list[Record | Setting]] = [[R["A1"], R["B1"]], [R["C1"]], [R["A2"]], [DEVICE_ONLY], [R["B2"]], [R["F1"]], [R["P1"]]]
GROUP_8: list[Record | Setting] = [R["G1"], R["H1"]]
LATEST_A = ["A2", "C1", "F1", "P1"]


def summary(name: str) -> dict[str, Any]:
    r = R[name]
    return {"id": r.id, "revision": r.revision, "kind": r.kind, "title": r.title}


# ----------------------------------------------------------------------------- building


class Built:
    """A vault as the store wrote it: its files, its key, and the head/log after each group."""

    def __init__(self, vault_id: str) -> None:
        self.vault_id = vault_id
        self.files: dict[str, bytes] = {}
        self.key = b""
        self.heads: list[bytes] = []  # head.bin after creation (0) and after each group (1..)
        self.log_ends: list[int] = []  # log length at the same points
        self.frames: list[tuple[int, int]] = []  # (offset, framed length) of each log entry


def read_dir(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def write_dir(d: Path, files: dict[str, bytes]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
        os.chmod(d / name, 0o600)


def frames_of(raw: bytes) -> list[tuple[int, int]]:
    pos, out = 0, []
    while pos < len(raw):
        (n,) = LEN.unpack_from(raw, pos)
        out.append((pos, LEN.size + n))
        pos += LEN.size + n
    return out


def build_vault(work: Path, vault_id: str, name: str, groups: list[list[Record | Setting]], seed: str) -> Built:
    STREAM.reseed(seed)
    d = work / seed / vault_id
    d.parent.mkdir(parents=True)
    s = VaultStore.create(d, vault_id, name, PASSPHRASE.encode(), KDF)
    b = Built(vault_id)
    b.key = bytes(s.key)
    b.heads.append((d / "head.bin").read_bytes())
    b.log_ends.append(0)
    for ops in groups:
        s.commit(ops)
        b.heads.append((d / "head.bin").read_bytes())
        b.log_ends.append(s.head.log_bytes)
    s.close()
    b.files = read_dir(d)
    b.frames = frames_of(b.files[log_name(0)])
    return b


def continue_vault(work: Path, base: dict[str, bytes], vault_id: str, seed: str, fn: Callable[[VaultStore], object],
                   passphrase: str = PASSPHRASE) -> dict[str, bytes]:
    """A copy of ``base`` opened by the store, changed by ``fn``, closed: its files."""
    STREAM.reseed(seed)
    d = work / seed / vault_id
    write_dir(d, base)
    s = VaultStore.open(d, passphrase=passphrase.encode())
    try:
        fn(s)
    finally:
        s.close()
    return read_dir(d)


def add_sidecars(work: Path, files: dict[str, bytes], vault_id: str, seed: str, fact: str | None) -> dict[str, bytes]:
    """The vault's vector sidecar (two commits: a rewrite then an append), its space list and
    (with ``fact``) the recall counters of that fact, written by the real code."""

    def fn(s: VaultStore) -> None:
        sealer = crypto.Sealer(s.key, crypto.LABEL_VECTORS)
        keys = sorted({k for k, _ in live_fragment_keys(s)})
        vecs = {k: [float(i + 1), (i % 4) / 4, -0.5, 0.25] for i, k in enumerate(keys)}
        store = VectorStore(sidecar_path(s.dir, sidecar_id(s.keys, IDENTITY)), vault_id=s.vault_id, identity=IDENTITY,
                            dims=DIMS, seal=sealer.seal, open_=sealer.open, encoding="int8")  # the default precision
        half = len(keys) // 2
        store.rewrite({k: np.array(vecs[k], dtype=np.float32) for k in keys[:half]})
        store.append({k: np.array(vecs[k], dtype=np.float32) for k in keys[half:]})
        _SIDECAR_COUNTS[hashlib.sha256(store.path.read_bytes()).hexdigest()] = [half, len(keys) - half]
        # The same vectors as a version-1 sidecar (float32 rows, v1 AADs), as older versions wrote it.
        old = VectorStore(work / f"v1-{s.vault_id}.bin", vault_id=s.vault_id, identity=IDENTITY, dims=DIMS,
                          seal=sealer.seal, open_=sealer.open)
        old._rewrite({k: np.array(vecs[k], dtype=np.float32) for k in keys}, "float32", version=1)
        V1_SIDECARS[s.vault_id] = old.path.read_bytes()
        write_spaces(s.dir, {sidecar_id(s.keys, IDENTITY): {"identity": IDENTITY, "dims": DIMS, "used": T0}},
                     vault_id=s.vault_id, seal=sealer.seal)
        sealer.wipe()
        if fact is not None:
            r = Recalls(s)
            for n in range(3):
                r.note([fact], when=T0 + 3600 + n)
            r.flush()
            r.close()

    return continue_vault(work, files, vault_id, seed, fn)


V1_SIDECARS: dict[str, bytes] = {}


def add_snapshot(work: Path, files: dict[str, bytes], vault_id: str, seed: str) -> tuple[bytes, int]:
    """``lexical-index.bin`` of the vault as the index keeper writes it after a lexical query, and
    how many fragments it holds."""
    out: list[tuple[bytes, int]] = []

    def fn(s: VaultStore) -> None:
        idx = VaultIndex(s, CacheConfig())
        idx.refresh()
        assert idx.bm25 is not None and idx.keeper is not None
        idx.bm25.search("lantern")  # a lexical query fills the FTS5 tables
        assert idx.keeper.write("format-vectors")
        out.append(((s.dir / snapshot_mod.SNAPSHOT_NAME).read_bytes(), idx.n_fragments()))
        idx.close()

    continue_vault(work, files, vault_id, seed, fn)
    return out[0]


def sealed_log(key: bytes, vault_id: str, plaintexts: list[bytes], epoch: int = 0) -> tuple[bytes, bytes]:
    """A log of these entry plaintexts (sealed and chained exactly as the store does) and the head
    that covers all of it: for entries the store itself would refuse to write."""
    STREAM.reseed("sealed-log|" + hashlib.sha256(b"".join(plaintexts)).hexdigest())
    sealer = crypto.Sealer(key, crypto.LABEL_RECORDS)
    prev, out = chain_start(vault_id, epoch), b""
    for seq, plain in enumerate(plaintexts):
        framed = seal_entry(sealer, vault_id, epoch, seq, prev, plain)
        prev = next_hash(prev, framed[4:])
        out += framed
    head = seal_head(crypto.Sealer(key, crypto.LABEL_HEAD), vault_id, Head(epoch, len(plaintexts), len(out), prev))
    return out, head


def plain_of(ops: list[Record | Setting], mark_end: bool = True) -> list[bytes]:
    entries = [({"t": "set", "key": o.key, "value": o.value} if isinstance(o, Setting) else o.to_entry()) for o in ops]
    if mark_end:
        entries[-1] = {**entries[-1], GROUP_END: 1}
    return [entry_plaintext(e) for e in entries]


# ----------------------------------------------------------------------------- byte edits


def flip(data: bytes, pos: int, mask: int = 0x01) -> bytes:
    return data[:pos] + bytes([data[pos] ^ mask]) + data[pos + 1 :]


def header_doc(raw: bytes) -> dict[str, Any]:
    return dict(json.loads(raw))


def header_bytes(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")


def edit_header(raw: bytes, fn: Callable[[dict[str, Any]], None]) -> bytes:
    doc = header_doc(raw)
    fn(doc)
    return header_bytes(doc)


def edit_wrap(raw: bytes, fn: Callable[[bytes], bytes]) -> bytes:
    def change(doc: dict[str, Any]) -> None:
        doc["wrap"] = base64.b64encode(fn(base64.b64decode(doc["wrap"]))).decode("ascii")

    return edit_header(raw, change)


def set_kdf(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        doc["kdf"][field] = value

    return change


def set_field(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        doc[field] = value

    return change


def drop_field(field: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        del doc[field]

    return change


# ----------------------------------------------------------------------------- cases

CASES: list[dict[str, Any]] = []
MSG = {
    "header": "its header is invalid",
    "altered": "its header was altered",
    "head": "its head is invalid",
    "log_missing": "its log is missing",
    "short": "its log is shorter than its head records",
    "length": "a log entry has an invalid length",
    "auth": "a log entry failed authentication",
    "malformed_entry": "a log entry is malformed",
    "mismatch": "its log does not match its head",
    "record": "a record is malformed",
    "wrong": "wrong passphrase",
}


def case(name: str, group: str, what: str, files: dict[str, dict[str, bytes]], expect: dict[str, Any], *,
         passphrase: str = PASSPHRASE, vault: str = VAULT_A) -> None:
    assert not any(c["name"] == name for c in CASES), name
    CASES.append({"name": name, "group": group, "defect": what, "vault": vault, "passphrase": passphrase,
                  "expect": expect, "_files": files})


def opens(records: list[str] = LATEST_A, *, device_only: bool = True, log_bytes: int | None = None,
          add: tuple[str, ...] = (), remove: tuple[str, ...] = (), **more: Any) -> dict[str, Any]:
    """Unlock succeeds with exactly ``records`` (names in R); the files after unlock are the case's
    files plus ``add`` minus ``remove`` (temp files and the failure count go by themselves)."""
    out = {"unlock": "ok", "records": sorted((summary(n) for n in records), key=lambda r: r["id"]),
           "device_only": device_only, "log_bytes": log_bytes, "_add": add, "_remove": remove}
    out.update(more)
    return out


def refuses(code: str, message: str) -> dict[str, Any]:
    return {"unlock": code, "message": message}


_VEC_HEADER = 8 + 2 * 256


def _count_vectors(data: bytes, generation: int = 0) -> int:
    """Entries in a sidecar: the count prefix of each chunk the chosen generation covers (read from
    the plaintext the generator kept, see _SIDECAR_COUNTS)."""
    counts = _SIDECAR_COUNTS[hashlib.sha256(data).hexdigest()]
    return sum(counts) if generation == 0 else sum(counts[:1])


_SIDECAR_COUNTS: dict[str, list[int]] = {}
