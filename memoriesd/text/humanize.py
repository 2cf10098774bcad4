"""Small human-readable renderings shared by the daemon's notices and the CLI (no heavy imports)."""

from __future__ import annotations

import time


def duration(seconds: float) -> str:
    """``42 s``, ``12 min``, ``1.5 h``: how long something still takes, for a person."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def ago(ts: float | None, now: float | None = None) -> str:
    """``just now``, ``42 s ago``, ``12 min ago``, ``3 h ago``, ``5 days ago``: when something last
    happened (a sync's push or pull, a device last seen); ``never`` without a time."""
    if not ts:
        return "never"
    seconds = (time.time() if now is None else now) - float(ts)
    if seconds < 5:
        return "just now"
    if seconds < 90:
        return f"{round(seconds)} s ago"
    if seconds < 5400:
        return f"{round(seconds / 60)} min ago"
    if seconds < 48 * 3600:
        return f"{round(seconds / 3600)} h ago"
    return f"{round(seconds / 86400)} days ago"
