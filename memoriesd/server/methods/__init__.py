"""The protocol's methods, one module per family; each exports ``METHODS`` (see :mod:`memoriesd.server.method`).

- :mod:`.vaults`: ``daemon.*`` and ``vault.*``;
- :mod:`.records`: records by id (``memory.add``, ``read``, ``history``, ``list``, ``update``, ``delete``);
- :mod:`.search`: ``memory.search`` and ``rag.*`` (search, ingest, index, ask, status, model install);
- :mod:`.facts`: facts and recall (``memory.remember``, ``facts``, ``forget``, ``rag.context``);
- :mod:`.conversations`, :mod:`.extract`: ``memory.capture`` and ``memory.extract``;
- :mod:`.tidy`: ``memory.summarize`` and ``memory.prune``;
- :mod:`.grants`: ``grant.*`` (the owner's side; enforcement is :mod:`memoriesd.server.grants`);
- :mod:`.sync`: ``sync.*`` and ``vault.join`` (encrypted sync through folders and rclone).

The router's own methods (``vault.route``, ``model.route``) are in :mod:`memoriesd.workers.router`;
:mod:`memoriesd.main` puts them all in one table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..method import Method
from . import conversations, extract, facts, grants, records, search, sync, tidy, vaults

if TYPE_CHECKING:
    from ..app import App

#: Every family's methods, in the order above.
SERVER_METHODS: tuple[Method[App], ...] = (
    *vaults.METHODS,
    *records.METHODS,
    *search.METHODS,
    *facts.METHODS,
    *conversations.METHODS,
    *extract.METHODS,
    *tidy.METHODS,
    *grants.METHODS,
    *sync.METHODS,
)

__all__ = ["SERVER_METHODS"]
