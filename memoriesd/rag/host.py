"""What the daemon's application and a request give the layers under ``server``.

:class:`memoriesd.server.app.App` and :class:`memoriesd.server.context.Context` are defined in
``server``, above memory, watch and rag: those name them by these Protocols (:class:`Host`,
:class:`Work`), which hold only what they use, so that no import runs upward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..config import Config
from ..home import Home
from ..vault.manager import VaultManager

if TYPE_CHECKING:
    from .engine import RagEngine


class Host(Protocol):
    """The application as a feature module sees it: home, config, vaults and the retrieval engine."""

    @property
    def home(self) -> Home: ...

    @property
    def config(self) -> Config: ...

    @property
    def vaults(self) -> VaultManager: ...

    @property
    def rag(self) -> RagEngine: ...



class Work(Protocol):
    """What long work (an ingest, a sync, an extraction, a summary) is given of what it runs for: a
    request's :class:`~memoriesd.server.context.Context`, or a folder sync's own stand-in."""

    def check_cancelled(self) -> None:
        """Raise when the work should stop (the client went away, the vault locked, the daemon stops)."""

    def send_progress(self, progress: dict[str, Any], /) -> None:
        """Tell the client how far the work got (a progress frame; a sync has no client)."""


__all__ = ["Host", "Work"]
