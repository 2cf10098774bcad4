"""Small human-readable renderings shared by the daemon's notices and the CLI (no heavy imports)."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """``42 s``, ``12 min``, ``1.5 h``: how long something still takes, for a person."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
