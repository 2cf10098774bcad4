"""Simulated power loss at every sync point of every scenario (issue 18, item 1).

For each scenario (:mod:`.scenarios`): run its setup, then its action under a
:class:`~.fsmodel.RecordingFS` on vault ``main``'s directory. Replay the trace in a
:class:`~.fsmodel.DiskModel`; just before every fsync, rename and directory fsync (and after the
last operation), build ``seeds`` post-power-loss directories and open each with the real code
(passphrase unwrap with cheap Argon2id parameters, header MAC, head, log walk, tail recovery,
leftover cleaning), twice. A case *survives* when the vault opens to exactly the view
acknowledged last before the crash point or the one acknowledged next, opens to the same view
again, and every sealed derived file is either refused by its reader (then rebuilt) or byte for
byte a version that was written (entries that were written, for in-place files). Identical
directories are checked once (the verdict is cached by content and window).
"""

from __future__ import annotations

import random
import resource
import shutil
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memoriesd.errors import MemoriesError
from memoriesd.vault import fsio
from memoriesd.vault.recovery import REKEY_PREFIX

from .fsmodel import SYNC_KINDS, DiskModel, RecordingFS, digest, read_dir, write_dir
from .scenarios import (
    PW,
    PW2,
    SEALED_FILES,
    Harness,
    Rejected,
    Scenario,
    View,
    _tmp_root,
    by_name,
    describe,
    lost_records,
    open_view,
    per_record_ok,
    sealed_entries,
    vault_key,
)

PASSPHRASES = (PW, PW2)


@dataclass
class PointResult:
    cases: int = 0
    distinct: int = 0
    refused: int = 0
    survived: int = 0
    lost: int = 0  # acknowledged records missing, summed over failing cases
    crashes: int = 0
    derived_rejected: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, other: PointResult) -> None:
        for k in ("cases", "distinct", "refused", "survived", "lost", "crashes", "derived_rejected"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.failures.extend(other.failures[: max(0, 5 - len(self.failures))])


@dataclass
class Recording:
    scenario: str
    vid: str
    fs: RecordingFS
    acks: list[tuple[int, View]]  # (position in the trace, view); the baseline is at -1
    key: bytes
    unrouted: list[str]
    atomic: bool


def record(sc: Scenario) -> Recording:
    """Run a scenario's action under the recorder; the acknowledged views along the way."""
    h = Harness(sc.config, model=sc.model)
    try:
        sc.setup(h)
        work = h.root / "views"
        work.mkdir()

        def copy_view() -> View:
            d = work / f"v{time.monotonic_ns()}" / h.vid
            shutil.copytree(h.dir, d)
            try:
                return open_view(d, PASSPHRASES, ids=True)
            finally:
                shutil.rmtree(d.parent, ignore_errors=True)

        acks: list[tuple[int, View]] = [(-1, copy_view())]
        fs = RecordingFS(h.dir)
        h.ack_hook = lambda label: acks.append((fs.ack(label), copy_view()))
        with fsio.installed(fs):
            sc.action(h)
            h.ack("end")
            model = DiskModel.of(fs)
            for op in fs.ops:
                model.step(op)
            real = read_dir(h.dir)
        vol = model.volatile()
        unrouted = sorted(n for n in set(real) | set(vol) if real.get(n) != vol.get(n))
        key = vault_key(h.dir, PASSPHRASES)
        return Recording(sc.name, h.vid, fs, acks, key, unrouted, sc.atomic)
    finally:
        h.close()


def _window(acks: list[tuple[int, View]], pos: int) -> tuple[View, View]:
    before = max((a for a in acks if a[0] < pos), key=lambda a: a[0])
    after = [a for a in acks if a[0] >= pos]
    return before[1], (min(after, key=lambda a: a[0])[1] if after else before[1])


def _check_image(rec: Recording, model: DiskModel, files: dict[str, bytes], window: tuple[View, View], work: Path, known: dict[str, set[Any]]) -> PointResult:
    out = PointResult(cases=1, distinct=1)
    d = work / rec.vid
    if d.exists():
        shutil.rmtree(d)
    write_dir(d, files)
    try:
        try:
            v = open_view(d, PASSPHRASES, ids=True)
        except MemoriesError as exc:
            out.refused = 1
            out.failures.append(f"refused: {exc.code}: {exc.message}")
            out.lost = len(window[0][0])
            return out
        except Exception as exc:  # noqa: BLE001 - any other exception is a crash of the reader
            out.crashes = 1
            out.failures.append(f"crash: {type(exc).__name__}: {exc}")
            return out
        if v not in window and (rec.atomic or not per_record_ok(v, *window)):
            out.lost = lost_records(v, *window)
            out.failures.append(f"opened to {describe(v)}; acknowledged {describe(window[0])} / next {describe(window[1])}")
            return out
        try:
            again = open_view(d, PASSPHRASES, ids=True)
        except Exception as exc:  # noqa: BLE001
            out.failures.append(f"a second unlock after recovery failed: {type(exc).__name__}: {exc}")
            out.crashes = 1
            return out
        if again != v:
            out.failures.append("a second unlock after recovery opened to another state")
            return out
        for sf in SEALED_FILES:
            for p in sorted(d.glob(sf.pattern)):
                try:
                    got = sf.read(p, d, rec.vid, rec.key)
                except Rejected:
                    out.derived_rejected += 1
                    continue
                except Exception as exc:  # noqa: BLE001 - a reader must refuse, never raise
                    out.crashes = 1
                    out.failures.append(f"{p.name}: reader raised {type(exc).__name__}: {exc}")
                    return out
                written = model.versions.get(p.name, set()) | model.versions.get(REKEY_PREFIX + p.name, set())
                if sf.atomic and p.read_bytes() not in written:
                    out.failures.append(f"{p.name}: accepted bytes that were never written as a whole")
                    return out
                if not sf.atomic and not set(got) <= known.get(p.name, set()):
                    out.failures.append(f"{p.name}: accepted entries that were never written")
                    return out
        out.survived = 1
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _as_finished(files: dict[str, bytes]) -> dict[str, bytes]:
    """The files with a key change's staged ones (``rekey-X``) in place of ``X``, as unlock would
    move them: so that what a key change wrote counts as written under the name it ends up with."""
    out = {n: b for n, b in files.items() if not n.startswith(REKEY_PREFIX)}
    out.update({n[len(REKEY_PREFIX) :]: b for n, b in files.items() if n.startswith(REKEY_PREFIX)})
    return out


def crash_points(rec: Recording) -> list[int]:
    """Trace positions of the sync points (crash just before each), plus the end."""
    return [i for i, op in enumerate(rec.fs.ops) if op.kind in SYNC_KINDS] + [len(rec.fs.ops)]


def run_scenario(sc: Scenario, seeds: int, *, points: int | None = None, seeds_sampled: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Crash ``sc`` at every sync point with ``seeds`` seeds each. ``points``/``seeds_sampled``:
    in short mode, ``seeds`` seeds at ``points`` points picked at random and ``seeds_sampled``
    seeds at every other point."""
    t0 = time.monotonic()
    rec = record(sc)
    cps = crash_points(rec)
    rng = random.Random(seed)
    full = set(cps) if points is None else set(rng.sample(cps, min(points, len(cps))))
    model = DiskModel.of(rec.fs)
    known: dict[str, set[Any]] = {}
    cache: dict[tuple[str, int], PointResult] = {}
    total = PointResult()
    by_kind: dict[str, int] = {}
    work = _tmp_root()
    try:
        for i in range(len(rec.fs.ops) + 1):
            if i in cps:
                kind = rec.fs.ops[i].kind if i < len(rec.fs.ops) else "end"
                by_kind[kind] = by_kind.get(kind, 0) + 1
                window = _window(rec.acks, i)
                wid = zlib.crc32(repr(window).encode())
                vol = _as_finished(model.volatile())
                if any(n for sf in SEALED_FILES if not sf.atomic for n in vol if Path(n).match(sf.pattern)):
                    vd = work / "vol" / rec.vid
                    write_dir(vd, vol)
                    for name, entries in sealed_entries(vd, rec.vid, rec.key).items():
                        known.setdefault(name, set()).update(entries)
                    shutil.rmtree(vd.parent)
                n = seeds if i in full else (seeds_sampled or seeds)
                for s in range(n):
                    files = model.crash(s, random.Random(f"{sc.name}:{i}:{s}:{seed}"))
                    key = (digest(files), wid)
                    got = cache.get(key)
                    if got is None:
                        got = _check_image(rec, model, files, window, work, known)
                        cache[key] = got
                        total.add(got)
                    else:
                        total.cases += 1
                        total.survived += got.survived
                        total.refused += got.refused
                        total.lost += got.lost
                        total.crashes += got.crashes
            if i < len(rec.fs.ops):
                model.step(rec.fs.ops[i])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if rec.unrouted:
        total.failures.insert(0, f"written outside the fsio seam: {rec.unrouted}")
    return {
        "crash_points": len(cps),
        "crash_points_by_kind": by_kind,
        "trace_ops": len(rec.fs.ops),
        "acknowledged_states": len(rec.acks),
        "cases": total.cases,
        "distinct_images": total.distinct,
        "refused": total.refused,
        "survived": total.survived,
        "acknowledged_records_lost": total.lost,
        "crashes": total.crashes,
        "derived_files_rejected_and_rebuilt": total.derived_rejected,
        "failed": total.cases - total.survived,
        "failures": total.failures[:5],
        "unrouted_writes": rec.unrouted,
        "seconds": round(time.monotonic() - t0, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run(short: bool = True, seeds: int | None = None, minutes: float | None = None, names: list[str] | None = None) -> dict[str, Any]:
    """The report section: every scenario, ``seeds`` per crash point (short: 100 at 2 random
    points, 3 at every other)."""
    out: dict[str, Any] = {}
    deadline = None if minutes is None else time.monotonic() + minutes * 60
    for sc in by_name(names):
        if deadline is not None and time.monotonic() > deadline:
            out[sc.name] = {"skipped": "out of time"}
            continue
        if short:
            out[sc.name] = run_scenario(sc, seeds or 100, points=2, seeds_sampled=3)
        else:
            out[sc.name] = run_scenario(sc, seeds or 100)
    return out
