"""The vault format vectors (tests/vectors, docs/format.md): every vector's bytes are exactly the
recorded ones, the generator reproduces them, and every vector opens (or is refused) exactly as
its manifest says, through a real daemon; sidecars and snapshots are also read in-process.

A change to the format fails here loudly: a writer change breaks the reproduction test, a reader
change breaks the outcomes. Regenerating tests/vectors (tests/support/make_format_vectors.py) is then a
deliberate act, with a version bump when old vaults no longer read the same.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from memoriesd.index.snapshot import SnapshotRejected, read_snapshot, version_tag
from memoriesd.index.vectors.names import read_spaces
from memoriesd.index.vectors.sidecar import VectorStore
from memoriesd.sync.engine import TargetRefused, TargetSync
from memoriesd.sync.segments import HEADER_FILE, Codec, Unreadable, bucket, read_target_header
from memoriesd.sync.stamps import Clock
from memoriesd.sync.state import StateFile, SyncState, TargetState
from memoriesd.sync.transport import parse_target
from memoriesd.text.segment import DEFAULT
from memoriesd.vault import crypto
from memoriesd.vault.format import read_header
from memoriesd.vault.keys import VaultKeys
from memoriesd.vault.live import LiveVault
from memoriesd.vault.store import VaultStore, unwrap_key

from .conftest import REPO, Daemon, short_tmpdir, write_config

VECTORS = REPO / "tests" / "vectors"
MANIFEST: dict[str, Any] = json.loads((VECTORS / "MANIFEST.json").read_text("utf-8"))
CASES: list[dict[str, Any]] = MANIFEST["cases"]
SYNC_CASES: list[dict[str, Any]] = MANIFEST["sync_cases"]
SNAPSHOT_FILE = "lexical-index.bin"
ENV = MANIFEST["snapshot_env"]
# The snapshot's version tag hashes its schema and the installed SQLite and jieba versions. With the
# same libraries the tag must match (else the schema changed: regenerate the vectors); with other
# libraries every snapshot vector is stale by design, and only the in-process read is checked.
SAME_SNAPSHOT_LIBS = ENV["sqlite"] == sqlite3.sqlite_version and ENV["jieba"] == metadata.version("jieba")
SAME_SNAPSHOT_ENV = SAME_SNAPSHOT_LIBS and ENV["version_tag"] == version_tag(DEFAULT)


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_the_vectors_are_byte_for_byte_the_recorded_ones() -> None:
    recorded = {f"{c['name']}/{rel}": digest for c in CASES + SYNC_CASES for rel, digest in c["files"].items()}
    on_disk = {str(p.relative_to(VECTORS)): sha(p) for p in VECTORS.rglob("*") if p.is_file() and p.name != "MANIFEST.json"}
    assert sorted(on_disk) == sorted(recorded), "files were added to or removed from tests/vectors"
    changed = sorted(k for k in recorded if on_disk[k] != recorded[k])
    assert changed == [], f"vector bytes differ from MANIFEST.json: {changed[:5]}"
    assert len(CASES) >= 100
    total = sum(p.stat().st_size for p in VECTORS.rglob("*") if p.is_file())
    assert total < 2 * 1024 * 1024, f"tests/vectors holds {total} bytes"


def test_the_snapshot_vectors_carry_the_current_snapshot_version() -> None:
    if not SAME_SNAPSHOT_LIBS:
        pytest.skip(f"the snapshot vectors were written with SQLite {ENV['sqlite']} and jieba {ENV['jieba']}")
    assert ENV["version_tag"] == version_tag(DEFAULT), (
        "the lexical snapshot's schema changed (memoriesd/index/snapshot.py SCHEMA): regenerate the vectors with "
        "tests/support/make_format_vectors.py and review the MANIFEST.json diff"
    )


def test_the_generator_reproduces_every_vector(tmp_path: Path) -> None:
    """The store still writes exactly these bytes (nonces and salts come from the generator's fixed
    stream): a change in what the writer produces fails here even while the reader accepts both."""
    out = tmp_path / "vectors"
    r = subprocess.run([sys.executable, "-m", "tests.support.make_format_vectors", "--out", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    fresh = json.loads((out / "MANIFEST.json").read_text("utf-8"))
    differ = []
    for old, new in zip(CASES, fresh["cases"], strict=True):
        assert old["name"] == new["name"]
        for rel, digest in old["files"].items():
            if new["files"].get(rel) != digest and not (rel.endswith(SNAPSHOT_FILE) and not SAME_SNAPSHOT_LIBS):
                differ.append(f"{old['name']}/{rel}")
        assert old["expect"] == new["expect"], old["name"]
    for old, new in zip(SYNC_CASES, fresh["sync_cases"], strict=True):
        assert old == new, old["name"]
    assert differ == [], f"the generator no longer writes the committed bytes: {differ[:5]}"
    if SAME_SNAPSHOT_LIBS:
        assert fresh["snapshot_env"] == ENV
    assert fresh["known_answers"] == MANIFEST["known_answers"]


# ----------------------------------------------------------------------------- through the daemon


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    root = short_tmpdir("fv")
    home = root / "h"
    write_config(home)
    (home / "vaults").mkdir(mode=0o700, exist_ok=True)
    d = Daemon(home).start()
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def _files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.is_file() and p.name != SNAPSHOT_FILE) if d.exists() else []


def _snapshot_outcome(d: Daemon, log_from: int) -> str | None:
    text = d.log_text()[log_from:]
    m = re.search(r"lexical index restored from its sealed snapshot \((.*?)\) in ", text)
    if m:
        return f"restored: {m.group(1)}"
    m = re.search(r"lexical snapshot not used \((.*)\): the index is rebuilt", text)
    return f"rejected: {m.group(1)}" if m else None


def run_case(d: Daemon, c: dict[str, Any]) -> list[str]:
    """Open one vector in the daemon; the differences from its manifest entry."""
    vaults = d.home / "vaults"
    src = VECTORS / c["name"]
    for vault_dir in sorted(src.iterdir()):
        shutil.copytree(vault_dir, vaults / vault_dir.name)
    vdir = vaults / c["vault"]
    exp = c["expect"]
    problems: list[str] = []
    log_from = len(d.log_text())
    try:
        msg = d.request("vault.unlock", {"vault": c["vault"], "passphrase": c["passphrase"]})
        if "error" in msg:
            got = msg["error"]["code"]
            if got != exp["unlock"] or exp.get("message", "\0") not in msg["error"]["message"]:
                problems.append(f"unlock: {got}: {msg['error']['message']!r}, expected {exp['unlock']} {exp.get('message')!r}")
            for rel, digest in c["files"].items():  # a refusal changes nothing on disk
                p = vaults / rel
                if p.exists() and sha(p) != digest:
                    problems.append(f"{rel} changed although unlock was refused")
        elif exp["unlock"] != "ok":
            problems.append(f"unlock succeeded, expected {exp['unlock']}")
        files = _files(vdir)  # what recovery kept aside, renamed or removed (before any other request)
        if files != exp["files_after_unlock"]:
            problems.append(f"files after unlock {files}, expected {exp['files_after_unlock']}")
        if "error" not in msg and exp["unlock"] == "ok":
            problems += _check_open(d, c, log_from)
    finally:
        d.request("vault.lock", {"all": True})
        for vault_dir in src.iterdir():
            shutil.rmtree(vaults / vault_dir.name, ignore_errors=True)
    return problems


def _check_open(d: Daemon, c: dict[str, Any], log_from: int) -> list[str]:
    exp, vid, problems = c["expect"], c["vault"], []
    status = d.call("vault.status", {"vault": vid})
    if status["log_bytes"] != exp["log_bytes"] or status["device_only"] != exp["device_only"]:
        problems.append(f"status {status}, expected log_bytes {exp['log_bytes']} device_only {exp['device_only']}")
    listed = d.call("memory.list", {"vault": vid})["records"]
    got = sorted(({k: r[k] for k in ("id", "revision", "kind", "title")} for r in listed), key=lambda r: r["id"])
    if got != exp["records"]:
        problems.append(f"records {got}, expected {exp['records']}")
    for rid, tags in exp.get("tags", {}).items():
        if [r["tags"] for r in listed if r["id"] == rid] != [tags]:
            problems.append(f"tags of {rid}")
    if "recalls" in exp:
        facts = {f["id"]: f["recalls"] for f in d.call("memory.facts", {"vault": vid})["facts"]}
        if facts != exp["recalls"]:
            problems.append(f"recalls {facts}, expected {exp['recalls']}")
    if "snapshot" in exp:
        d.call("rag.search", {"vault": vid, "query": "lantern", "mode": "bm25"})
        deadline = time.monotonic() + 60
        outcome = _snapshot_outcome(d, log_from)
        while outcome is None and time.monotonic() < deadline:
            time.sleep(0.05)
            outcome = _snapshot_outcome(d, log_from)
        if SAME_SNAPSHOT_ENV and outcome != exp["snapshot"]["daemon"]:
            problems.append(f"snapshot {outcome!r}, expected {exp['snapshot']['daemon']!r}")
    return problems


def test_every_vector_opens_exactly_as_its_manifest_says(daemon: Daemon) -> None:
    failures = {c["name"]: p for c in CASES if (p := run_case(daemon, c))}
    assert failures == {}, json.dumps(failures, indent=1, ensure_ascii=False)
    assert daemon.proc is not None and daemon.proc.poll() is None
    for secret in ("Alpha note", "lantern", "tabs over spaces", "Private note", "卡片"):
        assert secret not in daemon.log_text()


# ----------------------------------------------------------------------------- sidecars in-process


def _vault_copy(tmp_path: Path, c: dict[str, Any]) -> tuple[Path, bytes]:
    d = tmp_path / c["name"] / c["vault"]
    shutil.copytree(VECTORS / c["name"] / c["vault"], d)
    return d, bytes(unwrap_key(read_header(d, c["vault"]), c["passphrase"].encode()))


def test_vector_sidecars_load_or_are_discarded_as_the_manifest_says(tmp_path: Path) -> None:
    known = MANIFEST["known_answers"]["vector_sidecar"]
    cases = [c for c in CASES if "vectors" in c["expect"]]
    assert len(cases) >= 15
    for c in cases:
        d, key = _vault_copy(tmp_path, c)
        sealer = crypto.Sealer(key, crypto.LABEL_VECTORS)
        exp = c["expect"]["vectors"]
        assert sorted(read_spaces(d, vault_id=c["vault"], open_=sealer.open)) == exp["spaces"], c["name"]
        # The sidecar the space list names (after a key change it is named under the new key).
        path = d / (f"vectors-{exp['spaces'][0]}.bin" if exp["spaces"] else known["file"])
        store = VectorStore(path, vault_id=c["vault"], identity=known["identity"], dims=known["dims"],
                            seal=sealer.seal, open_=sealer.open)
        assert len(store.load()) == exp["entries"], c["name"]
        assert path.exists() == exp["kept"], c["name"]


def test_lexical_snapshots_read_as_the_manifest_says(tmp_path: Path) -> None:
    """read_snapshot with the version tag the vectors were written under (a machine with another
    SQLite or jieba would call them all stale, which the daemon test then does not check)."""
    version = MANIFEST["snapshot_env"]["version_tag"]
    cases = [c for c in CASES if "snapshot" in c["expect"]]
    assert len(cases) >= 12
    for c in cases:
        d, key = _vault_copy(tmp_path, c)
        try:
            read_snapshot(d, c["vault"], crypto.Sealer(key, crypto.LABEL_LEXICAL_SNAPSHOT), version)
            got = "ok"
        except SnapshotRejected as exc:
            got = exc.reason
        assert got == c["expect"]["snapshot"]["read"], c["name"]


def test_known_answers_derive_from_the_passphrase() -> None:
    """The manifest's intermediate values (for other implementations) follow from the passphrase."""
    ka = MANIFEST["known_answers"]
    kdf = MANIFEST["kdf"]
    kek = crypto.derive_kek(ka["passphrase_utf8"].encode(), bytes.fromhex(ka["salt"]), memory_kib=kdf["memory_kib"],
                            iterations=kdf["iterations"], lanes=kdf["lanes"])
    assert bytes(kek).hex() == ka["kek"]
    for sub in ka["subkeys"].values():
        assert bytes(crypto.subkey(bytes.fromhex(ka["vault_key"]), sub["label"].encode())).hex() == sub["key"]
    prev = bytes.fromhex(ka["chain_start_epoch_0"])
    log = (VECTORS / "valid-core" / ka["vault_id"] / "log-00000000.bin").read_bytes()
    for e in ka["entries"]:
        blob = log[e["offset"] + 4 : e["offset"] + 4 + e["length_prefix"]]
        prev = hashlib.sha256(prev + blob).digest()
        assert prev.hex() == e["chain_after"]
    assert prev.hex() == ka["head"]["last_hash"]


# ----------------------------------------------------------------------------- sync targets in-process

SYNC_KA: dict[str, Any] = MANIFEST["known_answers"]["sync"]
READER = "fmtreaderrrrrrrr"  # the device that joins from the vectors' target


def _sync_codec() -> Codec:
    return Codec(VaultKeys(bytes.fromhex(MANIFEST["known_answers"]["vault_key"])), MANIFEST["known_answers"]["vault_id"])


def test_sync_known_answers_follow_from_the_vault_key() -> None:
    """Names, buckets, the header file and the sealed plaintexts of vault A's target, recomputed
    from the vault key and the bytes (for another implementation: docs/format.md, "Sync")."""
    codec = _sync_codec()
    names = SYNC_KA["names"]
    dev = SYNC_KA["device"]
    assert codec.segment_name(dev, 0, 1) == names["segment_0_1"]["name"]
    assert codec.segment_name(dev, 0, 2) == names["segment_0_2"]["name"]
    assert codec.tip_name(dev) == names["tip"]["name"]
    assert codec.epoch_name(1, dev) == names["epoch_1"]["name"]
    names_key = bytes.fromhex(MANIFEST["known_answers"]["subkeys"]["LABEL_SYNC_NAMES"]["key"])
    for n in names.values():  # the name: the first 32 hex of HMAC(names subkey, canonical JSON list)
        assert hmac.new(names_key, n["input"].encode(), hashlib.sha256).hexdigest()[:32] == n["name"]
    assert {int(k): v for k, v in SYNC_KA["bucket"].items()} == {int(k): bucket(int(k)) for k in SYNC_KA["bucket"]}
    root = VECTORS / "sync-target-valid" / "target"
    assert (root / HEADER_FILE).read_text("utf-8") == SYNC_KA["header"]["file"]
    th = read_target_header((root / HEADER_FILE).read_bytes())
    assert codec.open_name(th.sealed_name) == SYNC_KA["header"]["name_plaintext"]
    for kind, ka in (("s", SYNC_KA["segment"]), ("t", SYNC_KA["tip"])):
        data = (root / ka["name"]).read_bytes()
        assert data[:9] == b"MEMSYNC1" + kind.encode() and data[9:21].hex() == ka["nonce"]
        assert len(data) == ka["file_length"] == 8 + 1 + 28 + ka["padded_length"]
        assert ka["padded_length"] == bucket(4 + ka["compressed_length"])
        opened = codec.open(ka["name"], data)
        assert opened.kind == kind and opened.digest == ka["sha256"]
        assert opened.doc == json.loads(ka["plaintext"])
    state_dir = VECTORS / "sync-target-valid" / "device-a"
    state = StateFile(state_dir, MANIFEST["known_answers"]["vault_id"], VaultKeys(bytes.fromhex(MANIFEST["known_answers"]["vault_key"]))).load()
    assert state is not None and state.to_bytes().decode("utf-8") == SYNC_KA["state"]["plaintext"]
    assert (state_dir / "sync-state.bin").read_bytes().startswith(SYNC_KA["state"]["magic"].encode())
    codec.wipe()


class _NoIndex:
    rag = None


def _no_purge(ids: list[str], stamps: dict[str, str]) -> None:
    raise AssertionError("no vector forgets anything")


def _pull_case(tmp: Path, c: dict[str, Any]) -> dict[str, Any]:
    """A device joins from the valid target's header, then pulls the case's target through the real
    folder transport: what it refused, what it holds."""
    vid = MANIFEST["known_answers"]["vault_id"]
    th = read_target_header((VECTORS / "sync-target-valid" / "target" / HEADER_FILE).read_bytes())
    (tmp / "home").mkdir(parents=True)
    store = VaultStore.join(tmp / "home" / vid, th.header, MANIFEST["cases"][0]["passphrase"].encode(),
                            lambda keys: json.loads(Codec(keys, vid).open_name(th.sealed_name))["name"])
    vault = LiveVault(store)
    codec = Codec(vault.keys, vid)
    target = tmp / "target"
    shutil.copytree(VECTORS / c["name"] / "target", target)
    state = SyncState(device=READER)
    state.targets["t1"] = TargetState(target=str(target), added=0.0)
    clock = Clock(READER)
    store.stamper = clock
    sync = TargetSync(vault, state, "t1", parse_target(str(target)), codec, clock, lambda: None, _no_purge)
    try:
        sync.pull()
        pull = "ok"
    except TargetRefused:
        pull = "refused"
    opened = {}
    for p in sorted(target.iterdir()):
        if p.name != HEADER_FILE:
            try:
                opened[p.name] = codec.open(p.name, p.read_bytes()).kind
            except Unreadable as exc:
                opened[p.name] = f"refused: {exc.args[0]}"
    records = sorted(({"id": r.id, "revision": r.revision, "kind": r.kind, "title": r.title} for r in store.latest()),
                     key=lambda r: r["id"])
    out = {"open": opened, "pull": pull, "records": records, "problems": sorted(state.targets["t1"].problems)}
    codec.wipe()
    store.close()
    return out


def test_sync_targets_open_or_are_refused_as_the_manifest_says(tmp_path: Path) -> None:
    """Every sync vector read by the real Codec and engine: each file opens as its kind or is refused
    for the recorded reason, and a device pulling the target holds exactly the recorded records (a
    refused file never shows a record)."""
    assert len(SYNC_CASES) >= 10
    got = {c["name"]: _pull_case(tmp_path / c["name"], c) for c in SYNC_CASES}
    want = {c["name"]: c["expect"] for c in SYNC_CASES}
    assert got == want
