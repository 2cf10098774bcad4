"""The vault format vectors (tests/vectors, docs/format.md): every vector's bytes are exactly the
recorded ones, the generator reproduces them, and every vector opens (or is refused) exactly as
its manifest says, through a real daemon; sidecars and snapshots are also read in-process.

A change to the format fails here loudly: a writer change breaks the reproduction test, a reader
change breaks the outcomes. Regenerating tests/vectors (tests/support/make_format_vectors.py) is then a
deliberate act, with a version bump when old vaults no longer read the same.
"""

from __future__ import annotations

import hashlib
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
from memoriesd.text.segment import DEFAULT
from memoriesd.vault import crypto
from memoriesd.vault.format import read_header
from memoriesd.vault.store import unwrap_key

from .conftest import REPO, Daemon, short_tmpdir, write_config

VECTORS = REPO / "tests" / "vectors"
MANIFEST: dict[str, Any] = json.loads((VECTORS / "MANIFEST.json").read_text("utf-8"))
CASES: list[dict[str, Any]] = MANIFEST["cases"]
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
    recorded = {f"{c['name']}/{rel}": digest for c in CASES for rel, digest in c["files"].items()}
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
