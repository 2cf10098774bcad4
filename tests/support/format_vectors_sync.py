"""Sync vectors for tests/support/make_format_vectors.py: what a sync target holds after vault A's first
push, known answers for its names, padding and plaintexts, and one target per refusal a reader must
make (docs/format.md, "Sync"; checked by tests/test_format_vectors.py).

The target is written by the real engine (:class:`memoriesd.sync.engine.TargetSync` pushing vault A
of the vectors to an in-memory target) with the generator's fixed random stream (nonces) and a fixed
clock (the segment's, the tip's and the header's times), so it is reproduced byte for byte. Only the
defects are made here. Each case is ``tests/vectors/<case>/target/<files>``, listed under
``sync_cases`` in ``MANIFEST.json``.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any
from unittest import mock

from memoriesd.sync.engine import TargetSync
from memoriesd.sync.merge import to_wire
from memoriesd.sync.segments import (
    HEADER_FILE,
    MAGIC,
    SEGMENT,
    TIP,
    Codec,
    Unreadable,
    bucket,
    digest,
    whole_size,
)
from memoriesd.sync.stamps import Clock
from memoriesd.sync.state import MAGIC as STATE_MAGIC
from memoriesd.sync.state import StateFile, SyncState, TargetState
from memoriesd.sync.transport import Entry
from memoriesd.vault.format import canonical
from memoriesd.vault.live import LiveVault
from memoriesd.vault.store import VaultStore
from memoriesd.vault.versions import derived_stamp
from tests.support.format_vectors_lib import (
    LATEST_A,
    PASSPHRASE,
    STREAM,
    T0,
    VAULT_A,
    VAULT_B,
    R,
    flip,
    read_dir,
    summary,
    write_dir,
)

DEVICE_A = "fmtdeviceaaaaaaa"  # 16 characters of base32, as new_device_id makes them
DEVICE_B = "fmtdevicebbbbbbb"
LABEL_A = "laptop-a"
T_SYNC = T0 + 86400  # the clock while the generator pushes: 2026-01-02T00:00:00Z
TARGET_TEXT = "/srv/memories-sync/notes"  # what the user typed (kept in sync-state.bin only)
BUCKET_SIZES = [
    0,
    1,
    1000,
    1024,
    1025,
    4096,
    8192,
    8193,
    9000,
    9217,
    16384,
    16385,
    100000,
    1 << 20,
    (1 << 20) + 1,
    4 << 20,
]

SYNC_CASES: list[dict[str, Any]] = []
SYNC_KNOWN: dict[str, Any] = {}


class MemoryTarget:
    """A target held in a dict (the generator's only; the tests read the vectors through the real
    folder transport)."""

    scheme = "folder"

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def describe(self) -> str:
        return TARGET_TEXT

    def list(self) -> list[Entry]:
        return [Entry(n, len(b)) for n, b in sorted(self.files.items())]

    def read(self, name: str) -> bytes | None:
        return self.files.get(name)

    def write(self, name: str, data: bytes) -> None:
        self.files[name] = bytes(data)

    def delete(self, name: str) -> None:
        self.files.pop(name, None)

    def ensure(self) -> None:
        return None


def _no_purge(ids: list[str], stamps: dict[str, str]) -> None:  # pragma: no cover - a push never purges
    raise AssertionError("the vectors' push forgets nothing")


def push_target(
    work: Path, files: dict[str, bytes], vault_id: str, seed: str, device: str, label: str
) -> tuple[dict[str, bytes], bytes, bytes]:
    """The target after the vault's first push (header, one segment, tip), the vault's
    ``sync-state.bin`` after it, and the vault key."""
    STREAM.reseed(seed)
    d = work / seed / vault_id
    write_dir(d, files)
    store = VaultStore.open(d, passphrase=PASSPHRASE.encode())
    key = bytes(store.key)
    vault = LiveVault(store)
    state = SyncState(device=device, label=label)
    state.targets["t1"] = TargetState(target=TARGET_TEXT, added=T_SYNC)
    clock = Clock(device)
    store.stamper = clock
    codec = Codec(vault.keys, vault_id)
    target = MemoryTarget()
    state_file = StateFile(d, vault_id, vault.keys)
    try:
        with mock.patch("time.time", return_value=T_SYNC):
            sync = TargetSync(vault, state, "t1", target, codec, clock, lambda: None, _no_purge)
            out = sync.push()
            assert out.segments == 1, out
            state_file.save(state)
        state_bin = (d / "sync-state.bin").read_bytes()
        assert read_dir(d).keys() - {"sync-state.bin"} == files.keys(), (
            "a push must not change the vault's files"
        )
        assert all(read_dir(d)[k] == v for k, v in files.items()), "a push must not change the vault's files"
    finally:
        codec.wipe()
        state_file.wipe()
        store.close()
    return target.files, state_bin, key


def _reason(codec: Codec, name: str, data: bytes) -> str:
    try:
        opened = codec.open(name, data)
    except Unreadable as exc:
        return f"refused: {exc.args[0]}"
    return opened.kind


def _seal_raw(key: bytes, vault_id: str, kind: str, padded: bytes) -> bytes:
    """A target file sealed exactly as Codec.seal does, around a padded plaintext made here."""
    from memoriesd.vault import crypto

    sealer = crypto.Sealer(key, crypto.LABEL_SYNC)
    aad = b"memories/sync/v1|" + vault_id.encode("ascii") + b"|" + kind.encode("ascii")
    return MAGIC + kind.encode("ascii") + sealer.seal(padded, aad)


def _padded(plain: bytes) -> tuple[bytes, int]:
    body = zlib.compress(plain, 6)
    framed = struct.pack(">I", len(body)) + body
    return framed + bytes(bucket(len(framed)) - len(framed)), len(body)


def sync_case(
    name: str,
    what: str,
    files: dict[str, bytes],
    expect: dict[str, Any],
    more: dict[str, dict[str, bytes]] | None = None,
) -> None:
    assert not any(c["name"] == name for c in SYNC_CASES), name
    # A file of a whole sealed size that does not open is damaged, not arriving: reported at once.
    if any(str(why).startswith("refused") and whole_size(len(files.get(n, b""))) for n, why in expect["open"].items()):
        expect = {**expect, "problems": sorted({*expect["problems"], "unreadable"})}
    SYNC_CASES.append(
        {"name": name, "defect": what, "expect": expect, "_files": {"target": files, **(more or {})}}
    )


def build_sync_cases(work: Path, core_a: dict[str, bytes], files_b: dict[str, bytes]) -> None:
    """Vault A pushed to a target (and vault B to another, for its files), the known answers, the cases."""
    from memoriesd.vault.keys import VaultKeys

    target, state_bin, key = push_target(work, core_a, VAULT_A, "sync-a", DEVICE_A, LABEL_A)
    target_b, _state_b, key_b = push_target(work, files_b, VAULT_B, "sync-b", DEVICE_B, "laptop-b")
    codec = Codec(VaultKeys(key), VAULT_A)
    seg, tip = codec.segment_name(DEVICE_A, 0, 1), codec.tip_name(DEVICE_A)
    assert sorted(target) == sorted([HEADER_FILE, seg, tip]), sorted(target)
    seg_b = Codec(VaultKeys(key_b), VAULT_B).segment_name(DEVICE_B, 0, 1)
    _record_known_answers(codec, key, target, state_bin)
    records = sorted((summary(n) for n in LATEST_A), key=lambda r: r["id"])
    valid_files = {n: _reason(codec, n, b) for n, b in target.items() if n != HEADER_FILE}

    def expect(
        files: dict[str, str], recs: list[dict[str, Any]], problems: tuple[str, ...] = (), pull: str = "ok"
    ) -> dict[str, Any]:
        return {"open": files, "pull": pull, "records": recs, "problems": sorted(problems)}

    def with_segment(data: bytes | None, name: str = seg, drop: str | None = seg) -> dict[str, bytes]:
        out = dict(target)
        if drop is not None:
            out.pop(drop)
        if data is not None:
            out[name] = data
        return out

    s = target[seg]
    sync_case(
        "sync-target-valid",
        "none: the target after vault A's first push (memories-sync.json, one segment, the tip), "
        "and device A's sync-state.bin after it (in device-a/)",
        target,
        expect(valid_files, records),
        more={"device-a": {"sync-state.bin": state_bin}},
    )
    seg2 = codec.segment_name(DEVICE_A, 0, 2)
    sync_case(
        "sync-segment-renamed",
        "segment 1 put under the name of segment 2 (the name is checked against "
        "the fields inside): refused, nothing applied",
        with_segment(s, seg2),
        expect({tip: TIP, seg2: "refused: misplaced"}, []),
    )
    sync_case(
        "sync-segment-as-tip",
        "segment 1 put under the device's tip name (the tip removed): refused",
        with_segment(s, tip, drop=None),
        expect({seg: SEGMENT, tip: "refused: misplaced"}, records),
    )
    sync_case(
        "sync-segment-of-other-vault",
        "vault B's first segment under the name of vault A's: refused (another key, another AAD)",
        with_segment(target_b[seg_b]),
        expect({seg: "refused: does not open", tip: TIP}, []),
    )
    sync_case(
        "sync-segment-truncated",
        "segment 1 without its last byte (a partial upload): refused until complete",
        with_segment(s[:-1]),
        expect({seg: "refused: does not open", tip: TIP}, []),
    )
    sync_case(
        "sync-segment-cut-short",
        "segment 1 cut to 20 bytes (shorter than magic, kind and seal overhead)",
        with_segment(s[:20]),
        expect({seg: "refused: not a sync file", tip: TIP}, []),
    )
    sync_case(
        "sync-segment-empty",
        "segment 1 is an empty file (a sync tool's placeholder)",
        with_segment(b""),
        expect({seg: "refused: not a sync file", tip: TIP}, []),
    )
    sync_case(
        "sync-segment-magic-changed",
        'segment 1 with magic "MEMSYNC2"',
        with_segment(b"MEMSYNC2" + s[8:]),
        expect({seg: "refused: not a sync file", tip: TIP}, []),
    )
    sync_case(
        "sync-segment-kind-changed",
        "segment 1's kind byte changed from s to t (the kind is in the AAD)",
        with_segment(s[:8] + b"t" + s[9:]),
        expect({seg: "refused: does not open", tip: TIP}, []),
    )
    sync_case(
        "sync-segment-unknown-kind",
        "segment 1's kind byte changed to x",
        with_segment(s[:8] + b"x" + s[9:]),
        expect({seg: "refused: kind", tip: TIP}, []),
    )
    sync_case(
        "sync-segment-bit-flipped",
        "a bit of segment 1's ciphertext flipped",
        with_segment(flip(s, len(MAGIC) + 1 + 12 + 5)),
        expect({seg: "refused: does not open", tip: TIP}, []),
    )
    plain = json.loads(SYNC_KNOWN["segment"]["plaintext"])
    padded, _ = _padded(SYNC_KNOWN["segment"]["plaintext"].encode("utf-8"))
    STREAM.reseed("sync-defects")
    sync_case(
        "sync-segment-padding-not-zero",
        "segment 1 sealed with the right key and AAD, one padding byte not zero",
        with_segment(_seal_raw(key, VAULT_A, SEGMENT, padded[:-1] + b"\x01")),
        expect({seg: "refused: padding", tip: TIP}, []),
    )
    other_vault = {**plain, "vault": VAULT_B}
    sync_case(
        "sync-segment-names-other-vault",
        f'segment 1 sealed with vault A\'s key and AAD but "vault": "{VAULT_B}" inside',
        with_segment(_seal_raw(key, VAULT_A, SEGMENT, _padded(_js(other_vault))[0])),
        expect({seg: "refused: misplaced", tip: TIP}, []),
    )
    # Chain rules (the engine's): a second segment whose "prev" is not segment 1's digest is a fork.
    x1 = R["X1"]
    wire = to_wire(x1, derived_stamp(x1, DEVICE_A), [])
    seg2_doc = {
        "device": DEVICE_A,
        "epoch": 0,
        "seq": 2,
        "prev": "0" * 64,
        "time": T_SYNC,
        "versions": [wire],
        "kind": SEGMENT,
        "vault": VAULT_A,
    }
    sync_case(
        "sync-segment-chain-broken",
        "a sealed segment 2 (a new record) whose prev is not segment 1's digest: "
        "segment 1 applied, segment 2 refused as a fork",
        {**target, seg2: _seal_raw(key, VAULT_A, SEGMENT, _padded(_js(seg2_doc))[0])},
        expect({**valid_files, seg2: SEGMENT}, records, ("fork",)),
    )
    seg2_doc = {**seg2_doc, "prev": digest(s)}
    next2 = _seal_raw(key, VAULT_A, SEGMENT, _padded(_js(seg2_doc))[0])
    sync_case(
        "sync-segment-chain-next",
        "none: a sealed segment 2 (a new record) that follows segment 1 (prev = its digest): both applied",
        {**target, seg2: next2},
        expect({**valid_files, seg2: SEGMENT}, sorted([*records, summary("X1")], key=lambda r: r["id"])),
    )
    only_second = {**target, seg2: _seal_raw(key, VAULT_A, SEGMENT, _padded(_js(seg2_doc))[0])}
    only_second.pop(seg)
    # Segment 1 may still be arriving: reported as missing, not as a fork.
    sync_case(
        "sync-segment-dropped",
        "segment 1 missing, segment 2 present: segment 2 waits (nothing applied); reported as missing",
        only_second,
        expect({tip: TIP, seg2: SEGMENT}, [], ("missing",)),
    )
    seg3 = codec.segment_name(DEVICE_A, 0, 3)
    h1 = R["H1"]
    seg3_doc = {
        **seg2_doc,
        "seq": 3,
        "prev": digest(next2),
        "versions": [to_wire(h1, derived_stamp(h1, DEVICE_A), [])],
    }
    sync_case(
        "sync-segment-gap",
        "segments 1 and 3 present, 2 (that 3 follows) missing: 1 applied, 3 waits; reported as missing",
        {**target, seg3: _seal_raw(key, VAULT_A, SEGMENT, _padded(_js(seg3_doc))[0])},
        expect({**valid_files, seg3: SEGMENT}, records, ("missing",)),
    )
    sync_case(
        "sync-header-of-other-vault",
        "vault B's memories-sync.json in vault A's target: the pull is refused",
        {**target, HEADER_FILE: target_b[HEADER_FILE]},
        expect(valid_files, [], ("header",), pull="refused"),
    )


def _js(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _record_known_answers(codec: Codec, key: bytes, target: dict[str, bytes], state_bin: bytes) -> None:
    from memoriesd.vault import crypto

    seg, tip = codec.segment_name(DEVICE_A, 0, 1), codec.tip_name(DEVICE_A)
    sealer = crypto.Sealer(key, crypto.LABEL_SYNC)

    def opened(name: str, kind: str) -> dict[str, Any]:
        data = target[name]
        aad = b"memories/sync/v1|" + VAULT_A.encode() + b"|" + kind.encode()
        padded = sealer.open(data[len(MAGIC) + 1 :], aad)
        (n,) = struct.unpack(">I", padded[:4])
        plain = zlib.decompress(padded[4 : 4 + n])
        return {
            "name": name,
            "aad": aad.decode(),
            "nonce": data[9:21].hex(),
            "compressed_length": n,
            "padded_length": len(padded),
            "file_length": len(data),
            "sha256": digest(data),
            "plaintext": plain.decode("utf-8"),
        }

    from memoriesd.sync.segments import read_target_header

    th = read_target_header(target[HEADER_FILE])
    state_sealer = crypto.Sealer(key, crypto.LABEL_SYNC_STATE)
    state_aad = b"memories/sync-state/v1|" + VAULT_A.encode()
    SYNC_KNOWN.update(
        {
            "device": DEVICE_A,
            "label": LABEL_A,
            "time": T_SYNC,
            "names": {
                "segment_0_1": {"input": canonical([SEGMENT, DEVICE_A, 0, 1]).decode(), "name": seg},
                "segment_0_2": {
                    "input": canonical([SEGMENT, DEVICE_A, 0, 2]).decode(),
                    "name": codec.segment_name(DEVICE_A, 0, 2),
                },
                "tip": {"input": canonical([TIP, DEVICE_A]).decode(), "name": tip},
                "epoch_1": {
                    "input": canonical(["e", 1, DEVICE_A]).decode(),
                    "name": codec.epoch_name(1, DEVICE_A),
                },
            },
            "bucket": {str(n): bucket(n) for n in BUCKET_SIZES},
            "segment": opened(seg, SEGMENT),
            "tip": opened(tip, TIP),
            "header": {
                "file": target[HEADER_FILE].decode("utf-8"),
                "name_aad": "memories/sync/v1|" + VAULT_A + "|name",
                "name_plaintext": codec.open_name(th.sealed_name),
            },
            "state": {
                "magic": STATE_MAGIC.decode(),
                "aad": state_aad.decode(),
                "plaintext": state_sealer.open(state_bin[len(STATE_MAGIC) :], state_aad).decode("utf-8"),
                "file_sha256": digest(state_bin),
            },
        }
    )
    sealer.wipe()
    state_sealer.wipe()


def finish_sync_case(c: dict[str, Any]) -> dict[str, Any]:
    import hashlib

    out = {k: v for k, v in c.items() if not k.startswith("_")}
    out["files"] = {
        f"{sub}/{name}": hashlib.sha256(data).hexdigest()
        for sub, files in sorted(c["_files"].items())
        for name, data in sorted(files.items())
    }
    return out


__all__ = ["DEVICE_A", "SYNC_CASES", "SYNC_KNOWN", "build_sync_cases", "finish_sync_case"]
