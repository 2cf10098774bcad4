"""A rate limit on repeated daemon log lines, so no flood (EMFILE accept errors, a misbehaving client)
can fill the disk: the same message template from the same logger is written at most ``per_window``
times per ``window`` seconds; the rest are counted and reported in one summary line when the window
ends (on the next log line, on :meth:`LogRateLimit.flush`, which the daemon calls every few seconds,
and at shutdown)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Numbers (fds, pids, counts, addresses) do not make a message different.
_VARYING = re.compile(r"0x[0-9a-fA-F]+|\d+")
#: Set on the summary records this filter writes itself (they always pass).
_SUMMARY_ATTR = "memories_rate_summary"
_OVERFLOW = "<many distinct messages>"


@dataclass
class _Window:
    start: float
    name: str
    template: str
    count: int = 0
    suppressed: int = 0


def _template(record: logging.LogRecord) -> str:
    msg = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
    first = msg.split("\n", 1)[0]
    return _VARYING.sub("#", first)[:200]


class LogRateLimit(logging.Filter):
    """Install on the log handler (handler filters also see records propagated from child loggers)."""

    def __init__(
        self,
        handler: logging.Handler,
        *,
        per_window: int = 10,
        window: float = 60.0,
        max_keys: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.handler = handler
        self.per_window = per_window
        self.window = window
        self.max_keys = max_keys
        self.clock = clock
        self._windows: dict[tuple[str, int, str], _Window] = {}
        self._lock = threading.Lock()
        self._last_sweep = clock()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _SUMMARY_ATTR, False):
            return True
        now = self.clock()
        key = (record.name, record.levelno, _template(record))
        with self._lock:
            due = self._sweep(now) if now - self._last_sweep >= 1.0 else []
            win = self._windows.get(key)
            if win is not None and now - win.start >= self.window:
                if win.suppressed:
                    due.append(win)
                del self._windows[key]
                win = None
            if win is None:
                if len(self._windows) >= self.max_keys:
                    key = (record.name, record.levelno, _OVERFLOW)
                    win = self._windows.get(key)
                if win is None:
                    win = self._windows[key] = _Window(now, record.name, key[2])
            win.count += 1
            allowed = win.count <= self.per_window
            if not allowed:
                win.suppressed += 1
        self._emit(due)
        return allowed

    def flush(self) -> None:
        """Write the summaries of every window that has ended."""
        with self._lock:
            due = self._sweep(self.clock())
        self._emit(due)

    def flush_all(self) -> None:
        """At shutdown: summarise every window, ended or not."""
        with self._lock:
            due = [w for w in self._windows.values() if w.suppressed]
            self._windows.clear()
        self._emit(due)

    def _sweep(self, now: float) -> list[_Window]:
        self._last_sweep = now
        due = []
        for key, win in list(self._windows.items()):
            if now - win.start >= self.window:
                if win.suppressed:
                    due.append(win)
                del self._windows[key]
        return due

    def _emit(self, due: list[_Window]) -> None:
        for win in due:
            rec = logging.LogRecord(
                win.name,
                logging.WARNING,
                __file__,
                0,
                "suppressed %d more log lines like %r (at most %d a minute are written per message)",
                (win.suppressed, win.template[:120], self.per_window),
                None,
            )
            setattr(rec, _SUMMARY_ATTR, True)
            self.handler.handle(rec)


def installed_limits() -> list[LogRateLimit]:
    out: list[LogRateLimit] = []
    for h in logging.getLogger().handlers:
        out.extend(f for f in h.filters if isinstance(f, LogRateLimit))
    return out


__all__ = ["LogRateLimit", "installed_limits"]
