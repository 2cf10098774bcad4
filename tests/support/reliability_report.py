#!/usr/bin/env python3
"""Reliability report (issues 18, 27): power loss at every sync point, I/O errors at every step, a
stateful model of any sequence of operations from concurrent clients, fuzzed socket frames and
MCP tool arguments, and the process shape (what a locked vault leaves in any live process, what a
frozen vault process costs), each against the real code (the last four against a real daemon).

Prints one JSON object: per section and scenario, the cases tried, refused, survived,
acknowledged records lost (must be 0), crashes (must be 0) and peak memory. ``--short`` is what
CI runs (the pytest tests run the same engines in short mode); the default runs every crash
point with ``--seeds`` seeds (default 100) and every write step with both errors.

    .venv/bin/python -m tests.support.reliability_report --short
    .venv/bin/python -m tests.support.reliability_report --seeds 1000 --minutes 60

A section is a module of ``tests/support/`` with ``run(short, seeds, minutes) -> dict``:
add one with one import and one entry in ``SECTIONS``. Exit status 1 when a zero is not zero.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
REPO = Path(__file__).resolve().parents[2]

from tests.support import fuzz, fuzz_mcp, io_errors, power_loss, process_shape, stateful  # noqa: E402

SECTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "power_loss": power_loss.run,
    "io_errors": io_errors.run,
    "stateful": stateful.run,
    "protocol_fuzz": fuzz.run,
    "mcp_fuzz": fuzz_mcp.run,
    "process_shape": process_shape.run,
}

#: Keys that must be 0 wherever they appear.
ZEROS = (
    "acknowledged_records_lost", "crashes", "refused", "failed", "hangs", "internal_errors", "bad_replies",
    "other_vault_leaks", "records_visible_while_locked", "canary_copies_after_lock",
)


def _bad(node: Any, path: str = "") -> list[str]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ZEROS and isinstance(v, int) and v:
                out.append(f"{path}/{k}={v}")
            elif k == "failures" and v:
                out.append(f"{path}/failures")
            else:
                out.extend(_bad(v, f"{path}/{k}"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="the CI run: 100 seeds at 2 points per scenario, 3 elsewhere; 4 steps per error")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per crash point (default 100); for stateful, protocol_fuzz and mcp_fuzz: examples or cases")
    ap.add_argument("--minutes", type=float, default=None, help="stop starting new scenarios after this long (per section)")
    ap.add_argument("--section", action="append", choices=sorted(SECTIONS), help="run only this section (repeatable)")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)  # recovery warnings are expected by the thousand
    t0 = time.monotonic()
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit,
        "mode": "short" if args.short else "long",
        "kdf": "power_loss and io_errors: Argon2id 64 KiB, 1 iteration, 1 lane (the KDF is not what is tested); "
        "stateful: the same, with some restarts switching to the default Argon2id and unlock+passwd pairs under it",
    }
    for name in args.section or list(SECTIONS):
        report[name] = SECTIONS[name](short=args.short, seeds=args.seeds, minutes=args.minutes)
    report["seconds"] = round(time.monotonic() - t0, 1)
    report["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    bad = _bad(report)
    report["zeros_hold"] = not bad
    if bad:
        report["not_zero"] = bad[:20]
    print(json.dumps(report, indent=2))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
