"""The vault format through the vault module: crypto recipes, integrity, tamper detection."""

from __future__ import annotations

import json
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from memoriesd.errors import BadPassphrase, NotFound, UsageError, VaultCorrupt
from memoriesd.vault import crypto
from memoriesd.vault.format import HEAD_NAME, HEADER_NAME, LEN, log_name
from memoriesd.vault.records import Record, new_record_id, now
from memoriesd.vault.store import KdfParams, Setting, VaultStore

CHEAP = KdfParams(memory_kib=64, iterations=1, lanes=1)
PW = b"correct horse"


def rec(body: str, rid: str | None = None, rev: int = 1, title: str = "t", **kw: object) -> Record:
    t = now()
    return Record(rid or new_record_id(), rev, str(kw.get("kind", "memory")), title, body, bool(kw.get("private", False)), ("tag",), created=t, updated=t)


def make_vault(tmp_path: Path, n: int = 5, vid: str = "v0000001") -> tuple[Path, list[Record]]:
    d = tmp_path / vid
    s = VaultStore.create(d, vid, "test", PW, CHEAP)
    recs = []
    for i in range(n):
        r = rec(f"body {i} CANARY", title=f"title {i}")
        s.commit([r])
        recs.append(r)
    s.close()
    return d, recs


def snapshot(d: Path) -> dict[str, str]:
    s = VaultStore.open(d, passphrase=PW)
    try:
        return {r.id: r.body for r in s.latest()}
    finally:
        s.close()


# ----------------------------------------------------------------------------- crypto recipes


def test_seal_open_round_trip_and_changed_associated_data_fails() -> None:
    key = crypto.new_key()
    blob = crypto.seal(key, b"secret", b"aad-1")
    assert crypto.open_sealed(key, blob, b"aad-1") == b"secret"
    with pytest.raises(crypto.CryptoFailure):
        crypto.open_sealed(key, blob, b"aad-2")


@pytest.mark.parametrize("cut", [0, 1, 11, 12, 27, 28])
def test_open_rejects_every_short_length(cut: int) -> None:
    key = crypto.new_key()
    blob = crypto.seal(key, b"x" * 3, b"a")
    with pytest.raises(crypto.CryptoFailure):
        crypto.open_sealed(key, blob[:cut], b"a")


def test_open_rejects_wrong_types_and_key_lengths() -> None:
    key = crypto.new_key()
    blob = crypto.seal(key, b"x", b"a")
    for bad in (None, "text", 5, [1, 2]):
        with pytest.raises(crypto.CryptoFailure):
            crypto.open_sealed(key, bad, b"a")  # type: ignore[arg-type]
    with pytest.raises(crypto.CryptoFailure):
        crypto.open_sealed(key[:16], blob, b"a")


def test_every_bit_of_a_sealed_blob_is_authenticated() -> None:
    key = crypto.new_key()
    blob = crypto.seal(key, b"hello world", b"a")
    for i in range(len(blob)):
        for bit in (0, 7):
            t = bytearray(blob)
            t[i] ^= 1 << bit
            with pytest.raises(crypto.CryptoFailure):
                crypto.open_sealed(key, bytes(t), b"a")


def test_subkeys_are_purpose_labelled() -> None:
    key = crypto.new_key()
    a = crypto.subkey(key, crypto.LABEL_RECORDS)
    b = crypto.subkey(key, crypto.LABEL_HEAD)
    assert a != b and len(a) == 32
    assert crypto.subkey(key, crypto.LABEL_RECORDS) == a


def test_same_passphrase_and_header_decrypt_the_same_record(tmp_path: Path) -> None:
    d, recs = make_vault(tmp_path, 2)
    assert snapshot(d) == {r.id: r.body for r in recs}
    assert snapshot(d) == snapshot(d)


def test_wipe_overwrites_secret() -> None:
    b = bytearray(b"secret")
    crypto.wipe(b)
    assert b == bytearray(6)


# ----------------------------------------------------------------------------- records


def test_revisions_history_and_compaction(tmp_path: Path) -> None:
    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    rid = new_record_id()
    for i in range(1, 16):
        s.commit([rec(f"body {i}", rid, i)])
    gone = rec("to delete")
    s.commit([gone])
    s.commit([Record(gone.id, 2, "memory", "", "", False, (), created=now(), updated=now(), deleted=True)])
    s.commit([Setting("policy.device_only", True)])
    assert s.get(rid, 3).body == "body 3"
    stats = s.compact(keep_revisions=4)
    assert stats["revisions_after"] == 4
    with pytest.raises(NotFound):
        s.get(rid, 3)
    assert s.get(rid, 12).body == "body 12"
    s.close()
    s = VaultStore.open(d, passphrase=PW)
    assert [r.revision for r in s.history(rid)] == [12, 13, 14, 15]
    assert s.settings["policy.device_only"] is True
    with pytest.raises(NotFound):
        s.get(gone.id)
    assert sorted(p.name for p in d.iterdir()) == ["head.bin", "header.json", log_name(1)]
    s.close()


def _queued_while_locked(
    s: VaultStore, batches: list[list[Record]], then: Callable[[], None] | None = None
) -> dict[int, BaseException | None]:
    """Commit each batch from its own thread while the store lock is held, run ``then`` (still
    holding it), then release it."""
    results: dict[int, BaseException | None] = {}

    def run(i: int, ops: list[Record]) -> None:
        try:
            s.commit(ops)
            results[i] = None
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, b)) for i, b in enumerate(batches)]
    with s.lock:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(s._queue) < len(batches) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(s._queue) == len(batches)
        if then is not None:
            then()
    for t in threads:
        t.join(60)
    return results


def test_concurrent_commits_are_written_together_and_all_survive_reopen(tmp_path: Path) -> None:
    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    batches = [[rec(f"thread {i} note {j} CANARY") for j in range(3)] for i in range(16)]
    gen = s.generation
    results = _queued_while_locked(s, batches)
    assert results == {i: None for i in range(16)}
    assert s.generation == gen + 1  # one durable append and one head for all 16 callers
    s.close()
    s = VaultStore.open(d, passphrase=PW)
    assert sorted(r.body for r in s.latest()) == sorted(r.body for b in batches for r in b)
    s.close()


def test_a_bad_batch_in_a_group_fails_only_its_caller(tmp_path: Path) -> None:
    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    old = rec("first revision")
    s.commit([old])
    stale = Record(old.id, 1, "memory", "t", "a stale rewrite", False, (), created=now(), updated=now())
    unknown = Record(new_record_id(), 2, "memory", "", "", False, (), created=now(), updated=now(), deleted=True)
    good = [[rec("good one")], [rec("good two")]]
    results = _queued_while_locked(s, [good[0], [stale], [unknown], good[1]])
    assert results[0] is None and results[3] is None
    assert isinstance(results[1], ValueError) and "revision order" in str(results[1])
    assert isinstance(results[2], ValueError) and "unknown record" in str(results[2])
    s.close()
    s = VaultStore.open(d, passphrase=PW)
    assert sorted(r.body for r in s.latest()) == ["first revision", "good one", "good two"]
    s.close()


def test_the_lock_holders_batch_is_written_before_the_queued_ones(tmp_path: Path) -> None:
    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    r1 = rec("revision one")
    s.commit([r1])
    stale = Record(r1.id, 2, "memory", "t", "built from a stale read", False, (), created=now(), updated=now())

    def update() -> None:  # an update: read, then write, under the lock
        current = s.get(r1.id)
        s.commit([Record(r1.id, current.revision + 1, "memory", "t", "the real update", False, (), created=now(), updated=now())])

    result = _queued_while_locked(s, [[stale]], then=update)
    assert s.get(r1.id).body == "the real update"
    assert isinstance(result[0], ValueError)  # the stale writer fails, not the lock holder
    s.close()


def test_an_unencodable_batch_fails_alone_and_the_others_are_durable(tmp_path: Path) -> None:
    d = tmp_path / "v1"
    s = VaultStore.create(d, "v1", "t", PW, CHEAP)
    good = [[rec("good one")], [rec("good two")]]
    bad = [rec("fine body", title="\ud800")]
    results = _queued_while_locked(s, [good[0], bad, good[1]])
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], UsageError) and "Unicode" in str(results[1])
    s.close()
    s = VaultStore.open(d, passphrase=PW)
    assert sorted(r.body for r in s.latest()) == ["good one", "good two"]
    s.close()


def test_wrong_passphrase_is_bad_passphrase(tmp_path: Path) -> None:
    d, _ = make_vault(tmp_path, 1)
    with pytest.raises(BadPassphrase) as ei:
        VaultStore.open(d, passphrase=b"wrong")
    assert "\n" not in str(ei.value) and "wrong" in str(ei.value)


def test_rewrap_changes_passphrase_without_reencrypting_records(tmp_path: Path) -> None:
    d, recs = make_vault(tmp_path, 3)
    log_before = (d / log_name(0)).read_bytes()
    s = VaultStore.open(d, passphrase=PW)
    s.rewrap(b"new pass", CHEAP)
    s.close()
    assert (d / log_name(0)).read_bytes() == log_before
    with pytest.raises(BadPassphrase):
        VaultStore.open(d, passphrase=PW)
    s = VaultStore.open(d, passphrase=b"new pass")
    assert len(s.latest()) == 3
    s.close()


def test_nothing_readable_on_disk(tmp_path: Path) -> None:
    d, _ = make_vault(tmp_path, 3)
    for p in d.iterdir():
        data = p.read_bytes()
        assert b"CANARY" not in data and b"title 1" not in data and b"tag" not in data
        assert (p.stat().st_mode & 0o777) == 0o600
    assert (d.stat().st_mode & 0o777) == 0o700


# ----------------------------------------------------------------------------- tamper detection


def _expect_detected(d: Path, original: dict[str, str]) -> str:
    """Open the tampered vault: it must fail, or (for bytes moved aside, never applied) be unchanged."""
    try:
        got = snapshot(d)
    except (VaultCorrupt, BadPassphrase):
        return "detected"
    assert got == original, "a tampered vault returned altered or fewer records"
    return "same"


def test_every_byte_flip_of_a_small_vault_is_detected(tmp_path: Path) -> None:
    d, _ = make_vault(tmp_path, 3)
    original = snapshot(d)
    pristine = tmp_path / "pristine"
    shutil.copytree(d, pristine)
    key_store = VaultStore.open(d, passphrase=PW)
    key = bytearray(key_store.key)
    key_store.close()
    outcomes = {"detected": 0, "same": 0}
    for name in (HEAD_NAME, log_name(0)):
        size = (pristine / name).stat().st_size
        for pos in range(size):
            data = bytearray((pristine / name).read_bytes())
            data[pos] ^= 0x01
            (d / name).write_bytes(bytes(data))
            # Most flips go through the module with the key already unwrapped (fast, no KDF).
            try:
                s = VaultStore.open(d, key=bytearray(key))
                got = {r.id: r.body for r in s.latest()}
                s.close()
                assert got == original
                outcomes["same"] += 1
            except VaultCorrupt:
                outcomes["detected"] += 1
            (d / name).write_bytes((pristine / name).read_bytes())
    assert outcomes["same"] == 0
    assert outcomes["detected"] > 500


def test_every_header_byte_flip_fails_unlock(tmp_path: Path) -> None:
    d, _ = make_vault(tmp_path, 1)
    original = snapshot(d)
    raw = (d / HEADER_NAME).read_bytes()
    for pos in range(len(raw)):
        data = bytearray(raw)
        data[pos] ^= 0x04
        (d / HEADER_NAME).write_bytes(bytes(data))
        # Whitespace flips in the JSON may leave an equal document: then the data must be unchanged.
        assert _expect_detected(d, original) in ("detected", "same")
        if json.loads(raw) != _safe_json(bytes(data)):
            with pytest.raises((VaultCorrupt, BadPassphrase)):
                snapshot(d)
    (d / HEADER_NAME).write_bytes(raw)
    assert snapshot(d) == original


def _safe_json(b: bytes) -> object:
    try:
        return json.loads(b)
    except ValueError:
        return None


def test_edited_header_name_is_corrupt_not_silently_accepted(tmp_path: Path) -> None:
    d, _ = make_vault(tmp_path, 1)
    doc = json.loads((d / HEADER_NAME).read_text())
    doc["name"] = "renamed"
    (d / HEADER_NAME).write_text(json.dumps(doc))
    with pytest.raises(VaultCorrupt):
        snapshot(d)


def test_edited_kdf_parameters_never_return_data(tmp_path: Path) -> None:
    d, _ = make_vault(tmp_path, 1)
    doc = json.loads((d / HEADER_NAME).read_text())
    doc["kdf"]["iterations"] = 2
    (d / HEADER_NAME).write_text(json.dumps(doc))
    with pytest.raises(BadPassphrase):
        snapshot(d)
    doc["kdf"]["memory_kib"] = 1 << 40
    (d / HEADER_NAME).write_text(json.dumps(doc))
    with pytest.raises(VaultCorrupt):
        snapshot(d)


def _entry_boundaries(data: bytes) -> list[int]:
    pos, out = 0, [0]
    while pos < len(data):
        (n,) = LEN.unpack_from(data, pos)
        pos += LEN.size + n
        out.append(pos)
    return out


def test_truncation_at_every_record_boundary_is_corrupt(tmp_path: Path) -> None:
    d, _ = make_vault(tmp_path, 6)
    raw = (d / log_name(0)).read_bytes()
    for cut in _entry_boundaries(raw)[:-1]:
        (d / log_name(0)).write_bytes(raw[:cut])
        with pytest.raises(VaultCorrupt):
            snapshot(d)
    for cut in range(0, len(raw), 7):
        (d / log_name(0)).write_bytes(raw[:cut])
        with pytest.raises(VaultCorrupt):
            snapshot(d)


def test_swapped_replayed_and_moved_records_are_corrupt(tmp_path: Path) -> None:
    d, _ = make_vault(tmp_path, 4)
    raw = (d / log_name(0)).read_bytes()
    b = _entry_boundaries(raw)
    entries = [raw[b[i] : b[i + 1]] for i in range(len(b) - 1)]
    swapped = entries[1] + entries[0] + b"".join(entries[2:])
    (d / log_name(0)).write_bytes(swapped)
    with pytest.raises(VaultCorrupt):
        snapshot(d)
    replayed = b"".join(entries[:3]) + entries[2]
    (d / log_name(0)).write_bytes(replayed)
    with pytest.raises(VaultCorrupt):
        snapshot(d)
    (d / log_name(0)).write_bytes(raw)
    # An entry from another vault (same passphrase) does not fit this one.
    d2, _ = make_vault(tmp_path, 4, vid="v0000002")
    other = (d2 / log_name(0)).read_bytes()
    (d / log_name(0)).write_bytes(other)
    with pytest.raises(VaultCorrupt):
        snapshot(d)
    # An old head with an old log (rollback of just the head) is caught by the head/log match.
    (d / log_name(0)).write_bytes(raw)
    assert len(snapshot(d)) == 4


def test_an_older_head_put_back_loses_no_acknowledged_record(tmp_path: Path) -> None:
    """Issue 13: an older head.bin (a rollback, or a backup tool restoring one file) used to cut
    acknowledged records off the log. The complete group after the head is rolled forward."""
    d, _ = make_vault(tmp_path, 2)
    head_before = (d / HEAD_NAME).read_bytes()
    s = VaultStore.open(d, passphrase=PW)
    s.commit([rec("late")])  # acknowledged
    s.close()
    log_after = (d / log_name(0)).read_bytes()
    (d / HEAD_NAME).write_bytes(head_before)
    got = snapshot(d)
    assert len(got) == 3 and "late" in got.values()
    assert (d / log_name(0)).read_bytes() == log_after  # not one byte removed
    assert (d / HEAD_NAME).read_bytes() != head_before  # a new head covers the recovered group
    assert snapshot(d) == got


def test_torn_tail_is_moved_aside_not_deleted(tmp_path: Path) -> None:
    d, _ = make_vault(tmp_path, 2)
    acknowledged = (d / log_name(0)).stat().st_size
    torn = struct.pack(">I", 500) + os.urandom(40)
    with open(d / log_name(0), "ab") as f:
        f.write(torn)
    assert len(snapshot(d)) == 2
    assert (d / log_name(0)).stat().st_size == acknowledged
    assert (d / f"preserved-tail-00000000-{acknowledged}.bin").read_bytes() == torn
    assert len(snapshot(d)) == 2
    assert (d / f"preserved-tail-00000000-{acknowledged}.bin").read_bytes() == torn  # kept by later unlocks


def test_larger_vault_2000_flips_and_every_boundary(tmp_path: Path) -> None:
    d = tmp_path / "v0000009"
    s = VaultStore.create(d, "v0000009", "big", PW, CHEAP)
    for i in range(60):
        s.commit([rec(("x" * 200) + str(i))])
    key = bytearray(s.key)
    original = {r.id: r.body for r in s.latest()}
    s.close()
    raw = (d / log_name(0)).read_bytes()
    positions = sorted(set(range(0, len(raw), max(1, len(raw) // 2000))) | set(_entry_boundaries(raw)[:-1]))
    assert len(positions) >= 2000
    for pos in positions:
        t = bytearray(raw)
        t[pos] ^= 0x80
        (d / log_name(0)).write_bytes(bytes(t))
        with pytest.raises(VaultCorrupt):
            st = VaultStore.open(d, key=bytearray(key))
            got = {r.id: r.body for r in st.latest()}
            st.close()
            assert got == original  # pragma: no cover - would mean an undetected flip
    (d / log_name(0)).write_bytes(raw)
