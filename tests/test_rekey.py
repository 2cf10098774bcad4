"""`vault passwd --rekey`: a new vault key, the whole vault sealed again under it.

A plain passwd re-wraps the same vault key, so a copy of the old header.json put back opens the
vault with the old passphrase, records written after the change included (asserted below so that
README and SECURITY.md stay true). After a rekey the old header opens nothing: no file of the vault
opens under the old key, and unlock refuses it in one line. Sealed vectors are carried over (no
embedding again), and a power loss at any step leaves a vault that opens with the old passphrase or
the new one, every record and every vector in it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from memoriesd.index.vectors.names import list_sidecars, read_spaces, sidecar_opaque_id
from memoriesd.index.vectors.sidecar import VectorStore
from memoriesd.vault import crypto  # noqa: E402
from memoriesd.vault.format import decode_full_log, open_head, read_header  # noqa: E402
from memoriesd.vault.store import VaultStore, unwrap_key  # noqa: E402

from .conftest import (
    SHARED,
    Daemon,
    DaemonError,
    cli_json,
    create_vault,
    needs_shared,
    run_cli,
    running_daemon,
)
from .support import power_loss, scenarios
from .support.fsmodel import SYNC_KINDS, DiskModel, write_dir

OLD, NEW = "correct horse", "battery staple"
MINILM = SHARED / "models" / "all-MiniLM-L6-v2-onnx"
NOTES = [
    ("Pets", "my dog needs food from the vet every month"),
    ("Music", "a violin concert with piano and drums"),
    ("Travel", "the night train to Lisbon leaves in May"),
]


def _add(d: Daemon, vid: str, title: str, body: str) -> str:
    return str(d.call("memory.add", {"vault": vid, "title": title, "body": body})["id"])


def _titles(d: Daemon, vid: str) -> set[str]:
    return {r["title"] for r in d.call("memory.list", {"vault": vid})["records"]}


def _rekey(home: Path, vid: str, old: str = OLD, new: str = NEW) -> Any:
    r = run_cli(home, "--json", "vault", "passwd", vid, "--rekey", "--passphrase-stdin", input=f"{old}\n{new}\n")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _locked(d: Daemon, vid: str) -> bool:
    """From the daemon's own list (the vault's process may be ending: it is not asked)."""
    return bool(next(v for v in d.call("vault.list")["vaults"] if v["vault_id"] == vid)["locked"])


def _one_line_error(r: Any) -> str:
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return str(lines[0])


def _opens_under(vault_dir: Path, key: bytes) -> list[str]:
    """The vault files that open (authenticate) under ``key``: head, log, sealed vectors."""
    vid = vault_dir.name
    found = []
    try:
        open_head(crypto.Sealer(bytearray(key), crypto.LABEL_HEAD), vid, (vault_dir / "head.bin").read_bytes())
        found.append("head.bin")
    except Exception:  # noqa: BLE001 - any failure to open is what is wanted
        pass
    records = crypto.Sealer(bytearray(key), crypto.LABEL_RECORDS)
    for log in vault_dir.glob("log-*.bin"):
        epoch = int(log.name[4:12])
        if decode_full_log(records, vid, epoch, log.read_bytes()) not in (None, []):
            found.append(log.name)
    if read_spaces(vault_dir, vault_id=vid, open_=crypto.Sealer(bytearray(key), crypto.LABEL_VECTORS).open):
        found.append("vector-spaces.bin")
    return found


def test_an_old_header_put_back_after_rekey_opens_nothing_and_the_current_one_reads_every_record() -> None:
    with running_daemon() as d:
        vid = create_vault(d, passphrase=OLD)
        vdir = d.home / "vaults" / vid
        _add(d, vid, "before one", "written before the key change")
        _add(d, vid, "before two", "also written before the key change")
        old_header = (vdir / "header.json").read_bytes()
        old_key = bytes(unwrap_key(read_header(vdir, vid), bytearray(OLD.encode())))

        out = _rekey(d.home, vid)
        assert out["rekeyed"] is True and out["unlocked"] is True
        _add(d, vid, "after one", "zebra canary written after the key change")
        _add(d, vid, "after two", "quokka canary written after the key change")
        assert run_cli(d.home, "vault", "lock", vid).returncode == 0
        current_header = (vdir / "header.json").read_bytes()
        assert sorted(p.name for p in vdir.iterdir()) == ["head.bin", "header.json", "log-00000001.bin"]

        # The attack: the old header.json put back, unlocked with the old passphrase.
        (vdir / "header.json").write_bytes(old_header)
        line = _one_line_error(run_cli(d.home, "vault", "unlock", vid, "--passphrase-stdin", input=f"{OLD}\n"))
        assert line.startswith("error[vault_corrupt]:") and "header.json is older than the vault's last key change" in line
        # ... and the old key itself opens no file of the vault: nothing written before or after.
        assert _opens_under(vdir, old_key) == []
        # The old header does not take the new passphrase either.
        line = _one_line_error(run_cli(d.home, "vault", "unlock", vid, "--passphrase-stdin", input=f"{NEW}\n"))
        assert line.startswith("error[bad_passphrase]:")
        assert _locked(d, vid)

        # The current header with the new passphrase reads every record; the old passphrase is refused.
        (vdir / "header.json").write_bytes(current_header)
        line = _one_line_error(run_cli(d.home, "vault", "unlock", vid, "--passphrase-stdin", input=f"{OLD}\n"))
        assert line.startswith("error[bad_passphrase]:")
        assert run_cli(d.home, "vault", "unlock", vid, "--passphrase-stdin", input=f"{NEW}\n").returncode == 0
        assert _titles(d, vid) == {"before one", "before two", "after one", "after two"}


def test_plain_passwd_leaves_an_old_header_opening_the_vault_with_the_old_passphrase() -> None:
    """The documented limit of a plain passwd (README, SECURITY.md): the vault key does not change."""
    with running_daemon() as d:
        vid = create_vault(d, passphrase=OLD)
        vdir = d.home / "vaults" / vid
        _add(d, vid, "before", "written before the passphrase change")
        old_header = (vdir / "header.json").read_bytes()
        r = run_cli(d.home, "vault", "passwd", vid, "--passphrase-stdin", input=f"{OLD}\n{NEW}\n")
        assert r.returncode == 0 and "--rekey" in r.stderr, r.stderr
        _add(d, vid, "after", "written after the passphrase change")
        d.call("vault.lock", {"vault": vid})
        (vdir / "header.json").write_bytes(old_header)
        assert run_cli(d.home, "vault", "unlock", vid, "--passphrase-stdin", input=f"{OLD}\n").returncode == 0
        assert _titles(d, vid) == {"before", "after"}


def test_passwd_help_says_what_a_plain_passwd_leaves_open_and_what_rekey_costs() -> None:
    with running_daemon() as d:
        text = " ".join(run_cli(d.home, "vault", "passwd", "--help").stdout.split())
    assert "--rekey" in text and "header.json" in text
    assert "still opens the vault with the old passphrase" in text
    assert "rewrites the whole vault" in text


def test_rekey_of_a_locked_vault_leaves_it_locked_and_a_wrong_old_passphrase_changes_nothing() -> None:
    with running_daemon() as d:
        vid = create_vault(d, passphrase=OLD)
        vdir = d.home / "vaults" / vid
        _add(d, vid, "kept", "a record")
        d.call("vault.lock", {"vault": vid})
        before = {p.name: p.read_bytes() for p in vdir.iterdir()}
        with pytest.raises(DaemonError) as exc:
            d.call("vault.passwd", {"vault": vid, "old": "wrong", "new": NEW, "rekey": True})
        assert exc.value.code == "bad_passphrase"
        after = {p.name: p.read_bytes() for p in vdir.iterdir() if p.name != "unlock-failures"}
        assert after == before

        out = d.call("vault.passwd", {"vault": vid, "old": OLD, "new": NEW, "rekey": True})
        assert out["rekeyed"] is True and out["unlocked"] is False
        assert _locked(d, vid)
        assert (vdir / "header.json").read_bytes() != before["header.json"]
        assert not (vdir / "log-00000000.bin").exists() and (vdir / "log-00000001.bin").exists()
        d.call("vault.unlock", {"vault": vid, "passphrase": NEW})
        assert _titles(d, vid) == {"kept"}
        # A second key change in a row works the same way (a new epoch each time).
        d.call("vault.passwd", {"vault": vid, "old": NEW, "new": OLD, "rekey": True})
        assert _titles(d, vid) == {"kept"} and (vdir / "log-00000002.bin").exists()


@pytest.mark.skipif(not MINILM.is_dir(), reason=needs_shared("models/all-MiniLM-L6-v2-onnx"))
def test_rekey_keeps_every_sealed_vector_and_embeds_nothing_again() -> None:
    config = f'[embedding.local]\nmodel_dir = "{MINILM}"\n[index]\nbackground = false\n'
    with running_daemon(config) as d:
        vid = create_vault(d, passphrase=OLD)
        vdir = d.home / "vaults" / vid
        ids = {t: _add(d, vid, t, b) for t, b in NOTES}
        assert d.call("rag.index", {"vault": vid})["embedded"] == 3
        old_sidecars = {p.name for p in list_sidecars(vdir)}
        assert len(old_sidecars) == 1

        out = _rekey(d.home, vid)
        assert (out["vector_files"], out["vector_entries_kept"], out["vector_entries_dropped"]) == (1, 3, 0)
        new_sidecars = {p.name for p in list_sidecars(vdir)}
        assert len(new_sidecars) == 1 and new_sidecars.isdisjoint(old_sidecars)  # named for the new key
        assert not [p.name for p in vdir.iterdir() if p.name.startswith(("rekey-", "."))]

        status = cli_json(d.home, "rag", "status", vid)["embedding"]
        assert (status["embedded"], status["total"]) == (3, 3)
        assert d.call("rag.index", {"vault": vid})["embedded"] == 0
        hits = d.call("rag.search", {"vault": vid, "query": "puppy vet food", "mode": "vector"})["results"]
        assert hits[0]["record_id"] == ids["Pets"]

        d.call("vault.lock", {"vault": vid})
        d.call("vault.unlock", {"vault": vid, "passphrase": NEW})
        status = cli_json(d.home, "rag", "status", vid)["embedding"]
        assert (status["embedded"], status["total"]) == (3, 3)
        assert d.call("rag.index", {"vault": vid})["embedded"] == 0


def test_grants_and_a_remembered_key_keep_working_after_rekey(monkeypatch: pytest.MonkeyPatch) -> None:
    import keyring

    from memoriesd.server.context import Context, Params
    from memoriesd.server.grants import PresentedGrant, verify

    from .memkeyring import MemoryKeyring

    monkeypatch.setattr(keyring.core, "_keyring_backend", MemoryKeyring())
    logging.disable(logging.WARNING)
    h = scenarios.Harness()
    try:
        h.add("note", "the harbour pilot")
        g = h.call("grant.create", vault=h.vid, scopes=["search"], label="tool")
        h.call("vault.unlock", vault=h.vid, passphrase=scenarios.PW, remember=True)
        out = h.call("vault.passwd", vault=h.vid, old=scenarios.PW, new=scenarios.PW2, rekey=True)
        assert out["remembered"] is True and out["unlocked"] is True
        grant = PresentedGrant(h.vid, g["grant_id"], g["token"])
        store, rec = verify(h.app, grant)
        assert store is h.store and rec["label"] == "tool"
        assert h.app.dispatch("memory.search", Context(Params({"vault": h.vid, "query": "harbour"})))["results"]
        # A grant made after the key change is hashed under the new key and verifies too.
        g2 = h.call("grant.create", vault=h.vid, scopes=["search"], label="later")
        verify(h.app, PresentedGrant(h.vid, g2["grant_id"], g2["token"]))
        # The keyring holds the new key: unlock without a passphrase opens the re-keyed vault.
        h.call("vault.lock", vault=h.vid)
        h.call("vault.unlock", vault=h.vid)
        assert [r.title for r in h.store.latest()] == ["note"]
        verify(h.app, grant)
        with pytest.raises(Exception) as exc:
            verify(h.app, PresentedGrant(h.vid, g["grant_id"], g["token"][:-2] + "xx"))
        assert getattr(exc.value, "code", "") == "grant_invalid"
    finally:
        h.close()
        logging.disable(logging.NOTSET)


def test_a_power_loss_at_any_step_of_rekey_opens_with_one_passphrase_every_record_and_vector() -> None:
    """Every sync point of a rekey (log, vectors, counters, head staged; header switched; files moved),
    three disk images each: unlock (the real code, which finishes or removes a staged key change)
    opens with the old passphrase before the switch and the new one after, to the same records, with
    no staged file left and the sealed vectors whole under the key that opened it."""
    logging.disable(logging.WARNING)
    try:
        sc = scenarios.by_name(["rekey"])[0]
        rec = power_loss.record(sc)
        baseline = rec.acks[0][1]
        vectors = None
        model = DiskModel.of(rec.fs)
        seen: dict[str, int] = {}
        work = scenarios._tmp_root()
        try:
            for i, op in enumerate([*rec.fs.ops, None]):
                if op is None or op.kind in SYNC_KINDS:
                    for seed in range(3):
                        files = model.crash(seed, random.Random(f"rekey:{i}:{seed}"))
                        d = work / rec.vid
                        write_dir(d, files)
                        try:
                            pw, view, count = _open_image(d)
                        finally:
                            shutil.rmtree(d)
                        assert view == baseline, f"crash point {i} ({op.kind if op else 'end'}), seed {seed}"
                        vectors = count if vectors is None else vectors
                        assert count == vectors > 0, f"crash point {i}: {count} sealed vectors, expected {vectors}"
                        seen[pw] = seen.get(pw, 0) + 1
                if op is not None:
                    model.step(op)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        assert set(seen) == {scenarios.PW, scenarios.PW2}, seen  # both sides of the switch were reached
    finally:
        logging.disable(logging.NOTSET)


def _open_image(d: Path) -> tuple[str, Any, int]:
    """Which passphrase opens a crash image, its view, and how many sealed vectors it holds then."""
    header = read_header(d, d.name)
    for pw in (scenarios.PW, scenarios.PW2):
        try:
            key = unwrap_key(header, bytearray(pw.encode()))
        except Exception:  # noqa: BLE001 - the other passphrase is the one
            continue
        raw = bytes(key)
        store = VaultStore.open(d, key=key)
        try:
            view = scenarios.view_of(store, ids=True)
        finally:
            store.close()
        leftovers = [n for n in os.listdir(d) if n.startswith("rekey-") or n.endswith(".tmp")]
        assert leftovers == [], leftovers
        sealer = crypto.Sealer(bytearray(raw), crypto.LABEL_VECTORS)
        spaces = read_spaces(d, vault_id=d.name, open_=sealer.open)
        count = 0
        for path in list_sidecars(d):
            space = spaces[sidecar_opaque_id(path)]  # every sidecar left is one the key can open
            vs = VectorStore(path, vault_id=d.name, identity=str(space["identity"]), dims=int(str(space["dims"])),
                             seal=sealer.seal, open_=sealer.open)
            count += len(vs.load())
        return pw, view, count
    raise AssertionError("neither passphrase opens the header")
