"""Folders kept in sync with a vault while it is unlocked (``[[watch.folder]]``, `memories rag watch`).

Importing this package does not import ``watchdog``: the observer is loaded when a folder is first watched.
"""

from __future__ import annotations

from .service import WatchService

__all__ = ["WatchService"]
