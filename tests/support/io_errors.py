"""``ENOSPC`` and ``EIO`` at every write step of every scenario (issue 18, item 2).

For each scenario, a clean run under a counting :class:`~.fsmodel.FailingFS` gives the number of
write steps on vault ``main``'s files and the views acknowledged along the way. Then, for each
step and each error, a fresh daemon App runs the scenario with that step failing. A case
*survives* when:

- the action either succeeds or fails with a one-line ``MemoriesError`` whose code is in
  :data:`ALLOWED` (never ``internal``, never a raw exception, never a traceback);
- vault ``other`` still takes a write and reads it back;
- while ``main`` is still unlocked and not refusing writes, its memory agrees with its disk;
- after a failed fsync of the log, ``main`` refuses writes (``io_error``) until lock and unlock;
- lock and unlock of ``main`` (the real re-read and recovery) give one of the views the clean run
  acknowledged, from the last one this run reached on: the old state is intact on disk.
"""

from __future__ import annotations

import errno
import random
import resource
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from memoriesd.errors import MemoriesError
from memoriesd.vault import fsio

from .fsmodel import FailingFS
from .scenarios import PW, PW2, Harness, Scenario, View, by_name, open_view, view_of

ALLOWED = {"io_error", "vector_store_failed"}
ERRORS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO}


@dataclass
class Outcome:
    steps: list[str]
    acks: list[View]
    error: MemoriesError | None = None
    crash: str | None = None
    failed: tuple[int, str] | None = None
    problems: list[str] = field(default_factory=list)


def _run(sc: Scenario, fail_at: int | None, err: int, clean: list[View] | None = None) -> Outcome:
    h = Harness(sc.config, model=sc.model)
    acks: list[View] = []
    try:
        sc.setup(h)

        def snap(label: str = "") -> None:
            live = h.app.vaults.live(h.vid)
            if live is not None:
                with live.store.lock:
                    acks.append(view_of(live.store))
            else:  # a copy: the vault's own unlock (and its recovery) is the action's
                d = h.root / f"copy{len(acks)}" / h.vid
                shutil.copytree(h.dir, d)
                acks.append(open_view(d, (PW, PW2)))
                shutil.rmtree(d.parent)

        snap()
        fs = FailingFS(h.dir, fail_at, err)
        h.ack_hook = snap
        out = Outcome(fs.steps, acks)
        with fsio.installed(fs):
            try:
                sc.action(h)
                snap()
            except MemoriesError as exc:
                out.error = exc
            except Exception as exc:  # noqa: BLE001 - anything else is a defect
                out.crash = f"{type(exc).__name__}: {exc}"
        out.failed = fs.failed
        if fail_at is None:
            return out
        _check_after(h, out, clean or [], sc.atomic)
        return out
    finally:
        h.close()


def _reopen_view(h: Harness) -> View:
    h.call("vault.unlock", vault=h.vid, passphrase=_pw(h))
    try:
        return view_of(h.store)
    finally:
        h.call("vault.lock", vault=h.vid)


def _pw(h: Harness) -> str:
    for pw in (PW2, PW):
        try:
            h.call("vault.unlock", vault=h.vid, passphrase=pw)
            h.call("vault.lock", vault=h.vid)
            return pw
        except MemoriesError as exc:
            if exc.code != "bad_passphrase":
                raise
    return PW


def _check_after(h: Harness, out: Outcome, clean: list[View], atomic: bool) -> None:
    p = out.problems
    if out.error is not None:
        if out.error.code not in ALLOWED:
            p.append(f"answered {out.error.code}: {out.error.message}")
        if "\n" in out.error.message or "Traceback" in out.error.message:
            p.append("the error is not one line")
    # The other vault keeps working.
    try:
        rid = h.call("memory.add", vault=h.other, title="o", body="other vault still writes")["id"]
        if h.call("memory.read", vault=h.other, id=rid)["body"] != "other vault still writes":
            p.append("vault other read back something else")
    except MemoriesError as exc:
        p.append(f"vault other failed: {exc.code}: {exc.message}")
    live = h.app.vaults.live(h.vid)
    memory: View | None = None
    if live is not None and live.store._failed is None:
        with live.store.lock:
            memory = view_of(live.store)
    if live is not None and out.failed is not None and out.failed[1] == "fsync" and out.error is not None and out.error.code == "io_error":
        # Whatever the file, the daemon must not take another write on its trust.
        if live.store._failed is None and "log" in out.error.message:
            p.append("a failed fsync of the log left the vault taking writes")
    if live is not None and live.store._failed is not None:
        try:
            h.call("memory.add", vault=h.vid, title="x", body="must be refused")
            p.append("a vault in the failed state took a write")
        except MemoriesError as exc:
            if exc.code != "io_error":
                p.append(f"the refused write answered {exc.code}")
    try:
        if live is not None:
            h.call("vault.lock", vault=h.vid)
        disk = _reopen_view(h)
    except MemoriesError as exc:
        p.append(f"the vault did not reopen: {exc.code}: {exc.message}")
        return
    if memory is not None and memory != disk:
        p.append("memory and disk disagreed before the reopen")
    reached = max(0, len(out.acks) - 1)
    ok = out.acks[reached:] + clean[reached : reached + 2]
    if disk not in ok and not (not atomic and _between(disk, ok)):
        p.append(f"reopened to a state never acknowledged (reached ack {reached})")


def _between(disk: View, ok: list[View]) -> bool:
    """Several commits acknowledged together: every record as in one of the acceptable views, and
    every record all of them hold is there."""
    allowed = set().union(*(set(v[0]) for v in ok))
    needed = set.intersection(*(set(v[0]) for v in ok))
    return set(disk[0]) <= allowed and needed <= set(disk[0])


def run_scenario(sc: Scenario, *, steps: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Fail every write step of ``sc`` (or ``steps`` of them picked at random) with each error."""
    t0 = time.monotonic()
    clean = _run(sc, None, errno.EIO)
    n = len(clean.steps)
    chosen = list(range(n)) if steps is None or steps >= n else sorted(random.Random(seed).sample(range(n), steps))
    res: dict[str, Any] = {"write_steps": n, "step_kinds": {k: clean.steps.count(k) for k in sorted(set(clean.steps))}}
    for name, err in ERRORS.items():
        r = {"cases": 0, "reached": 0, "answered_error": 0, "succeeded": 0, "survived": 0, "crashes": 0, "acknowledged_records_lost": 0, "failures": []}
        for step in chosen:
            o = _run(sc, step, err, clean.acks)
            r["cases"] += 1
            r["reached"] += o.failed is not None
            r["answered_error"] += o.error is not None
            r["succeeded"] += o.error is None and o.crash is None
            if o.crash is not None:
                r["crashes"] += 1
                o.problems.insert(0, f"crash: {o.crash}")
            if any("never acknowledged" in x for x in o.problems):
                r["acknowledged_records_lost"] += 1
            if o.problems:
                if len(r["failures"]) < 5:
                    r["failures"].append(f"step {step} ({clean.steps[step]}): " + "; ".join(o.problems))
            else:
                r["survived"] += 1
        res[name] = r
    res["seconds"] = round(time.monotonic() - t0, 2)
    res["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return res


def run(short: bool = True, seeds: int | None = None, minutes: float | None = None, names: list[str] | None = None) -> dict[str, Any]:
    """The report section: every scenario; short mode fails 4 random steps of each (else all)."""
    out: dict[str, Any] = {}
    deadline = None if minutes is None else time.monotonic() + minutes * 60
    for sc in by_name(names):
        if deadline is not None and time.monotonic() > deadline:
            out[sc.name] = {"skipped": "out of time"}
            continue
        out[sc.name] = run_scenario(sc, steps=4 if short else None)
    return out
