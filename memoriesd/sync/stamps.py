"""A hybrid logical clock: stamps that follow causality even when device clocks disagree.

A stamp is ``"<hlc>-<device>"``: ``hlc`` is 16 hex digits, the wall clock in milliseconds shifted
left 16 bits plus a counter, and ``device`` the 16-character id of the device that made it. Stamps
compare as strings (fixed width), so the merge rule "highest stamp wins" is the hybrid clock first,
then the device id. The clock never goes back: it starts above every stamp the vault holds and moves
past every stamp it receives (:meth:`Clock.observe`), so an edit made after seeing a version always
has a higher stamp than that version, whatever the two devices' clocks say.
"""

from __future__ import annotations

import base64
import re
import secrets
import threading
import time

STAMP_RE = re.compile(r"^[0-9a-f]{16}-[a-z2-7]{16}$")
DEVICE_RE = re.compile(r"^[a-z2-7]{16}$")


def new_device_id() -> str:
    """A device id: 16 base32 characters (80 random bits)."""
    return base64.b32encode(secrets.token_bytes(10)).decode("ascii").lower()


def valid_stamp(text: object) -> bool:
    return isinstance(text, str) and STAMP_RE.match(text) is not None


def stamp_hlc(stamp: str) -> int:
    return int(stamp[:16], 16)


class Clock:
    """The hybrid logical clock of one device for one vault (thread-safe)."""

    def __init__(self, device: str, floor: int = 0, origin: str = "") -> None:
        if not DEVICE_RE.match(device):
            raise ValueError("invalid device id")
        self._device = device
        self._origin = origin or device
        self._last = floor
        self._lock = threading.Lock()
        self._published: dict[str, str] = {}  # target id -> highest own stamp published there

    @property
    def device(self) -> str:
        return self._device

    @property
    def origin(self) -> str:
        """The id that derives stamps of revisions older than sync: the device's first id (a home
        copied and forked keeps it, so those revisions keep the stamps already published)."""
        return self._origin

    def next(self) -> str:
        """A new stamp, higher than every stamp this clock made or observed."""
        with self._lock:
            wall = int(time.time() * 1000) << 16
            self._last = max(wall, self._last + 1)
            return f"{self._last:016x}-{self._device}"

    def mark_published(self, target: str, upto: str | None) -> None:
        """This device's versions up to ``upto`` are on ``target`` (None: the target is gone)."""
        with self._lock:
            if upto is None:
                self._published.pop(target, None)
            else:
                self._published[target] = upto

    @property
    def published_upto(self) -> str:
        """The highest own stamp every target has ("" when one has none, or there is no target)."""
        with self._lock:
            return min(self._published.values()) if self._published else ""

    def observe(self, stamp: str) -> None:
        """A stamp received from another device: later stamps of this clock are higher."""
        with self._lock:
            self._last = max(self._last, stamp_hlc(stamp))


__all__ = ["Clock", "DEVICE_RE", "STAMP_RE", "new_device_id", "stamp_hlc", "valid_stamp"]
