"""Loading many long-lived objects at once without the cyclic garbage collector walking them in vain.

Unlock creates an object or more per record (a vault's log), and restoring the lexical snapshot a
few hundred thousand more (documents, fragments); all of them stay alive until lock. While such a
load runs, automatic collection is off (:func:`bulk_load`): each collection would walk the growing
heap for nothing (measured: about 15 % of an unlock, a third of a restore). When it ends, the
objects are moved to the collector's permanent generation (``gc.freeze()``) instead of being walked
once more by the first collection after it (about 0.15 s per 100,000 fragments, on the way to the
first search result) and again when they age into the older generations.

Frozen objects are still freed by reference counting when their vault is locked (records,
documents and fragments hold no reference cycles). What freezing keeps is cyclic garbage that
existed at that moment (another thread's, not yet collected): :func:`thaw` (at lock) hands every
frozen object back to the oldest generation, where the next full collection finds it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0  # bulk loads running (two vaults may unlock or restore at once)
_was_enabled = True


@contextlib.contextmanager
def bulk_load() -> Iterator[None]:
    """No automatic collection while the block runs; afterwards every object is frozen (see the
    module docstring). Nested or concurrent blocks: the last one to end re-enables collection."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.freeze()
                if _was_enabled:
                    gc.enable()


def thaw() -> None:
    """Return frozen objects to the collector (at lock: the vault's own objects are freed by then or
    soon, and cyclic garbage frozen with them becomes collectable again)."""
    gc.unfreeze()
