"""A vault process's view of the model process: an embedder with :class:`LocalEmbedder`'s surface.

The vault's process asks the router where the model is served (``model.route``, which starts the
model process when none runs) and sends it texts over a Unix socket; vectors come back as float32.
When the model process went away (the router recycled it after another vault locked, or it was idle
too long), the next call asks for the route again and retries once on the fresh process.
"""

from __future__ import annotations

import base64
import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..embed.profile import ModelProfile
from ..embed.schedule import QUERY, Hint, current_hint
from ..embed.types import Check, DocumentItem
from ..errors import InvalidModelOutput, MemoriesError, ModelUnavailable
from ..home import Home
from ..server import protocol

#: A connection to the router or the model process is made within this.
CONNECT_SECONDS = 5.0
#: The router's answer to ``model.route`` may wait for a model to load (EmbeddingGemma fp32: seconds).
ROUTE_SECONDS = 300.0


def _error_classes() -> dict[str, type[MemoriesError]]:
    """Every error class by name and by code (a code names its first class)."""
    out: dict[str, type[MemoriesError]] = {}
    todo: list[type[MemoriesError]] = [MemoriesError]
    while todo:
        cls = todo.pop(0)
        todo.extend(cls.__subclasses__())
        out[cls.__name__] = cls
        code = getattr(cls, "code", None)
        if isinstance(code, str):
            out.setdefault(code, cls)
    return out


def raise_error(err: object) -> None:
    """Re-raise an error frame as the class it names (``ModelInputFailed`` stays one), else its code's."""
    frame: dict[str, Any] = err if isinstance(err, dict) else {}
    code = str(frame.get("code", "internal"))
    classes = _error_classes()
    cls = classes.get(str(frame.get("class")), classes.get(code, MemoriesError))
    exc = cls(str(frame.get("message", "unknown error")))
    exc.code = code
    raise exc


def ask(path: str | Path, method: str, params: dict[str, Any], timeout: float | None) -> object:
    """One request on a fresh connection to a socket of the daemon; the result, or its error raised."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(CONNECT_SECONDS)
        s.connect(str(path))
        s.settimeout(timeout)
        s.sendall(protocol.encode({"id": 1, "method": method, "params": params}, 1 << 30))
        while True:
            msg = protocol.recv_frame(s, 1 << 30)
            if "progress" in msg:
                continue
            if "error" in msg:
                raise_error(msg["error"])
            return msg.get("result")


def _object(result: object) -> dict[str, Any]:
    """A model process's or the router's result: every method of theirs answers an object."""
    if not isinstance(result, dict):
        raise InvalidModelOutput(f"the embedding model's process answered {type(result).__name__}, not an object")
    return result


class ModelClient:
    """An embedder served by the model process (see :mod:`memoriesd.workers.model`)."""

    remote = False  # on this device (memoriesd.embed.types.Embedder): no device policy, before_attempt unused
    #: The model process orders the work of every vault (memoriesd.embed.schedule): the vault's own
    #: embedding lock is not taken around these calls (a query would wait behind the vault's queued batch).
    queued = True

    def __init__(self, home: Home, vault_id: str) -> None:
        self.home = home
        self.vault_id = vault_id
        self._path: str | None = None
        self._lock = threading.Lock()
        info = self._call("model.info", {})
        p = dict(info["profile"])
        self.profile = ModelProfile(**p)
        self.identity = str(info["identity"])
        self.dimensions = int(info["dimensions"])
        self.is_gemma = bool(info["is_gemma"])
        self.weights_digest = str(info["weights_digest"])

    @property
    def max_tokens(self) -> int:
        return self.profile.max_tokens

    def _route(self, fresh: bool) -> str:
        with self._lock:
            if self._path is None or fresh:
                try:
                    out = ask(self.home.socket_path, "model.route", {"vault": self.vault_id}, ROUTE_SECONDS)
                except OSError as exc:
                    raise ModelUnavailable("the daemon could not be asked for the embedding model: run the command again") from exc
                self._path = str(_object(out)["socket"])
            return self._path

    def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        path = self._route(False)
        try:
            return _object(ask(path, method, params, None))
        except (ConnectionError, OSError):
            pass  # the model process ended (recycled after a lock, or idle): ask for it again, once
        try:
            return _object(ask(self._route(True), method, params, None))
        except (ConnectionError, OSError) as exc:
            raise ModelUnavailable("the embedding model's process ended during the request: run the command again") from exc

    @staticmethod
    def _vectors(out: dict[str, Any]) -> np.ndarray:
        raw = base64.b64decode(out["vectors"])
        return np.frombuffer(raw, dtype="<f4").reshape(int(out["rows"]), int(out["dims"])).astype(np.float32)

    def _hint(self, hint: Hint) -> dict[str, Any]:
        """What the model process's queue reads (memoriesd.embed.schedule): the vault, the lane, counts."""
        return {"vault": self.vault_id, "lane": hint.lane, "backlog": hint.backlog, "idle_seconds": hint.idle_seconds}

    def embed_queries(self, texts: Sequence[str], *, before_attempt: Check | None = None) -> np.ndarray:
        params = {"kind": "query", "texts": list(texts), **self._hint(Hint(QUERY))}
        return self._vectors(self._call("model.embed", params))

    def embed_documents(self, items: Sequence[DocumentItem], *, before_attempt: Check | None = None) -> np.ndarray:
        """Fragments (document prompt); the background indexer's hint (:func:`memoriesd.embed.schedule.hinted`)
        travels along, else the batch is foreground work."""
        pairs = [[title, text] for title, text in items]
        hint = current_hint() or Hint()
        return self._vectors(self._call("model.embed", {"kind": "document", "items": pairs, **self._hint(hint)}))

    def count_tokens(self, text: str) -> int:
        return int(self._call("model.count", {"texts": [text]})["counts"][0])

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]:
        """:meth:`count_tokens` of each text in one request (the background indexer groups fragments by it)."""
        return [int(n) for n in self._call("model.count", {"texts": list(texts)})["counts"]]


__all__ = ["ModelClient", "ask", "raise_error"]
