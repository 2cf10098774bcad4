"""The lease a request holds on an unlocked vault: its purpose keys, its named locks in one order,
and the store reads that replace taking the store's lock from outside ``vault/``.

Real vault files under a cheap Argon2id, real threads; waits are on events, never sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from memoriesd.errors import MemoriesError
from memoriesd.vault import crypto
from memoriesd.vault.live import LiveVault, VaultLock
from memoriesd.vault.records import Record, now
from memoriesd.vault.store import Setting, VaultStore

from .test_vault_store import CHEAP, PW, rec


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveVault]:
    vault = LiveVault(VaultStore.create(tmp_path / "v0000001", "v0000001", "lease", PW, CHEAP))
    yield vault
    vault.close(drain_seconds=1.0)


def test_the_keys_of_a_lease_seal_per_purpose_and_never_show_the_vault_key(live: LiveVault) -> None:
    vectors = live.keys.sealer(crypto.LABEL_VECTORS)
    recalls = live.keys.sealer(crypto.LABEL_RECALLS)
    blob = vectors.seal(b"plain", b"aad")
    assert vectors.open(blob, b"aad") == b"plain"
    with pytest.raises(crypto.CryptoFailure):
        recalls.open(blob, b"aad")  # another purpose, another subkey
    assert not hasattr(live.keys, "key") and "hidden" in repr(live.keys)
    assert bytes(live.keys.subkey(crypto.LABEL_FINGERPRINT)) != bytes(live.store.key)
    assert live.keys.mac(crypto.LABEL_VECTOR_NAMES, b"model") == live.keys.mac(crypto.LABEL_VECTOR_NAMES, b"model")
    vectors.wipe()
    recalls.wipe()


def test_the_keys_of_a_locked_vault_derive_nothing(live: LiveVault) -> None:
    keys = live.keys
    live.close(drain_seconds=1.0)
    assert keys.wiped
    with pytest.raises(crypto.KeyWiped):
        keys.sealer(crypto.LABEL_VECTORS)
    with pytest.raises(crypto.KeyWiped):
        keys.subkey(crypto.LABEL_FINGERPRINT)


def test_named_locks_are_taken_in_their_order_whatever_order_they_are_named_in(live: LiveVault) -> None:
    holding = threading.Event()
    release = threading.Event()
    got_facts = threading.Event()

    def first() -> None:
        with live.hold(VaultLock.FACTS, VaultLock.CAPTURE):  # named backwards, taken CAPTURE then FACTS
            holding.set()
            release.wait(60)

    def second() -> None:
        holding.wait(60)
        with live.hold(VaultLock.FACTS):
            got_facts.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    assert holding.wait(60)
    assert not got_facts.is_set()  # FACTS is held by the first thread
    with live.hold(VaultLock.INGEST):  # another lock of the vault stays free
        pass
    release.set()
    for t in threads:
        t.join(60)
    assert got_facts.is_set()


def test_taking_an_earlier_lock_while_holding_a_later_one_is_refused(live: LiveVault) -> None:
    with live.hold(VaultLock.FACTS):
        with pytest.raises(MemoriesError) as err:
            with live.hold(VaultLock.CAPTURE):
                pass
        assert err.value.code == "internal"
        with live.hold(VaultLock.INGEST):  # a later one is fine
            pass
    with live.hold(VaultLock.CAPTURE):  # everything was released
        pass


def test_a_background_wait_for_a_named_lock_ends_when_its_check_raises(live: LiveVault) -> None:
    stop = threading.Event()
    outcome: list[str] = []

    def check() -> None:
        if stop.is_set():
            raise MemoriesError("stopped", code="cancelled")

    def waiter() -> None:
        try:
            with live.hold(VaultLock.INGEST, check=check):
                outcome.append("held")
        except MemoriesError as exc:
            outcome.append(exc.code)

    with live.hold(VaultLock.INGEST):
        t = threading.Thread(target=waiter)
        t.start()
        stop.set()
        t.join(60)
    assert outcome == ["cancelled"]


def test_store_reads_see_revisions_tombstones_and_settings_without_its_lock(live: LiveVault) -> None:
    store = live.store
    a = rec("first", title="a")
    store.commit([a])
    a2 = Record(a.id, 2, a.kind, "a", "second", False, (), created=a.created, updated=now())
    b = rec("other", title="b")
    store.commit([a2, b])
    tomb = Record(b.id, 2, b.kind, "", "", False, (), created=b.created, updated=now(), deleted=True)
    store.commit([tomb])
    assert [r.revision for r in store.revisions(a.id)] == [1, 2]
    assert store.revisions("nope") == ()
    assert store.revision_of(a.id, 1) == a and store.revision_of(a.id, 3) is None
    assert store.revision_of(b.id, 2) is None  # a tombstone is no revision to read
    assert set(store.current([a.id, b.id, "nope"])) == {a.id}
    assert store.knows(b.id) and not store.knows("nope")
    assert set(store.histories()) == {a.id, b.id}
    store.commit([Setting("grant.g1", {"id": "g1"}), Setting("policy.x", True)])
    assert store.setting_items("grant.") == {"grant.g1": {"id": "g1"}}
    with store.exclusive():
        current = store.get(a.id)
        store.commit([Record(a.id, current.revision + 1, a.kind, "a", "third", False, (), created=a.created, updated=now())])
    assert store.get(a.id).body == "third"


def test_no_module_outside_the_vault_takes_the_store_lock_or_reads_the_vault_key() -> None:
    """The lease is the seam: code outside ``memoriesd/vault/`` asks the store for what it reads
    and the lease for purpose keys; the store's lock, records and key stay inside."""
    import re

    root = Path(__file__).resolve().parent.parent / "memoriesd"
    pattern = re.compile(r"\bstore\.(lock|records|key)\b|\.new_key\b|\blive_of\(")
    found = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        if "vault" not in path.relative_to(root).parts[:1]
        for n, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
