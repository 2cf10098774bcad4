"""The model process: the local embedding model, loaded once for every vault, holding no vault.

``python -I -c BOOT ROOT memoriesd.workers.model --home H --socket PATH --model-dir D ...`` (started by
the router on the first ``model.route``). Vault processes send it the texts to embed and get float32
vectors back; it keeps nothing between requests, but Python cannot wipe what it frees, so the router
ends it once a vault whose process used it locks (:class:`memoriesd.workers.model_host.ModelHost`): after
lock, no live process of the daemon holds any text of that vault, this one included. The next
request starts a fresh one.

Each connection is served by its own thread and onnxruntime's ``run`` is thread-safe, so one vault's
query never waits behind another vault's batch of documents. Batches of documents run one at a time,
in the order :class:`memoriesd.embed.schedule.EmbedQueue` decides (the fairness policy: the vault in
use, then small vaults before large ones).

It ends when its stdin closes (the router is gone), on SIGTERM, or after ``[embedding.local] idle_minutes``
without a request. Its stdout says ``ready`` once the model is loaded and self-checked, or
``failed CODE MESSAGE``; never content. Its socket is 0600 in ``run/`` and checks the peer's uid.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import socket
import struct
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")  # before onnxruntime can be imported

from ..config import LocalModelConfig  # noqa: E402
from ..embed.schedule import FOREGROUND, LANES, EmbedQueue, Hint  # noqa: E402
from ..errors import InvalidParams, MemoriesError, UnknownMethod  # noqa: E402
from ..server import protocol  # noqa: E402
from .process import bound_heap, harden  # noqa: E402

if TYPE_CHECKING:  # imported at run time only once ORT_DISABLE_TELEMETRY is set (main)
    import numpy.typing as npt

    from ..embed.local import LocalEmbedder

log = logging.getLogger("memoriesd.model")

#: Texts in one request at most (a batch of the vault's embedding pass is far smaller).
MAX_TEXTS = 4096
#: Tests only: the file this variable names gets one line per batch of documents as it starts
#: (``vault lane backlog``: no content), so a test reads the queue's order, not its timing.
ORDER_ENV = "MEMORIES_TEST_EMBED_ORDER"


def vectors_payload(vecs: npt.ArrayLike) -> dict[str, Any]:
    import numpy as np

    arr = np.ascontiguousarray(vecs, dtype="<f4")
    return {"rows": int(arr.shape[0]), "dims": int(arr.shape[1]), "vectors": base64.b64encode(arr.tobytes()).decode("ascii")}


def _hint(params: dict[str, Any]) -> tuple[str, Hint]:
    """The vault and the scheduling hint a request carries (see :mod:`memoriesd.embed.schedule`)."""
    lane = params.get("lane", FOREGROUND)
    backlog = params.get("backlog", 0)
    idle = params.get("idle_seconds", 0.0)
    return str(params.get("vault") or ""), Hint(
        lane if lane in LANES else FOREGROUND,
        backlog if isinstance(backlog, int) and not isinstance(backlog, bool) else 0,
        float(idle) if isinstance(idle, (int, float)) and not isinstance(idle, bool) else 0.0,
    )


def _record_order(vault: str, hint: Hint) -> None:
    path = os.environ.get(ORDER_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{vault} {hint.lane} {hint.backlog}\n")


def _texts(params: dict[str, Any], key: str) -> list[Any]:
    value = params.get(key)
    if not isinstance(value, list) or len(value) > MAX_TEXTS:
        raise InvalidParams(f"{key} must be a list of at most {MAX_TEXTS} items")
    return value


class ModelServer:
    """Serves ``model.info``, ``model.embed`` and ``model.count`` for one loaded :class:`LocalEmbedder`."""

    def __init__(self, embedder: LocalEmbedder, idle_seconds: float) -> None:
        self.embedder = embedder
        self.idle_seconds = idle_seconds
        self.last_used = time.monotonic()
        self.busy = 0
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self.uid = os.getuid()
        self.queue = EmbedQueue()

    def info(self) -> dict[str, Any]:
        e = self.embedder
        return {"identity": e.identity, "dimensions": e.dimensions, "is_gemma": e.is_gemma,
                "profile": asdict(e.profile), "weights_digest": e.weights_digest}

    def answer(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "model.info":
            return self.info()
        if method == "model.embed":
            vault, hint = _hint(params)
            if params.get("kind") == "query":  # never queued (the policy's first rule)
                texts = [str(t) for t in _texts(params, "texts")]
                if vault:
                    self.queue.used(vault)
                return vectors_payload(self.embedder.embed_queries(texts))
            items = [(None if it[0] is None else str(it[0]), str(it[1])) for it in _texts(params, "items")]
            with self.queue.turn(vault, hint):
                _record_order(vault, hint)
                return vectors_payload(self.embedder.embed_documents(items))
        if method == "model.count":
            return {"counts": [self.embedder.count_tokens(str(t)) for t in _texts(params, "texts")]}
        raise UnknownMethod(f"unknown method {method!r} for the model process")

    def serve(self, conn: socket.socket) -> None:
        with conn:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            if struct.unpack("3i", creds)[1] != self.uid:
                return
            while not self.stopping.is_set():
                try:
                    msg = protocol.recv_frame(conn)
                except (ConnectionError, OSError, MemoriesError):
                    return
                with self._lock:
                    self.busy += 1
                try:
                    reply: dict[str, Any] = {"id": msg.get("id"), "result": self.answer(str(msg.get("method")), msg.get("params") or {})}
                except MemoriesError as exc:  # the class travels too: one bad input is ModelInputFailed, not the batch's end
                    reply = {"id": msg.get("id"), "error": {**exc.to_dict(), "class": type(exc).__name__}}
                except Exception:  # noqa: BLE001 - one request's failure is never the process's
                    log.exception("model request failed")
                    reply = {"id": msg.get("id"), "error": {"code": "internal", "message": "the model process failed: see the daemon log"}}
                finally:
                    with self._lock:
                        self.busy -= 1
                        self.last_used = time.monotonic()
                try:
                    conn.sendall(protocol.encode(reply, 1 << 30))
                except OSError:
                    return

    def idle(self) -> bool:
        with self._lock:
            return self.idle_seconds > 0 and not self.busy and time.monotonic() - self.last_used > self.idle_seconds


def _say(word: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.write(word + "\n")
        sys.stdout.flush()


def _watch_stdin(server: ModelServer) -> None:
    with contextlib.suppress(OSError, ValueError):
        while sys.stdin.buffer.read(4096):
            pass
    server.stopping.set()  # the router is gone


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="memoriesd-model", description="The local embedding model's process (started by memoriesd).")
    parser.add_argument("--home", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=0)
    parser.add_argument("--overrides", default="{}", help="[embedding.local] as JSON")
    parser.add_argument("--idle-seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    harden()
    bound_heap()
    from ..home import resolve_home
    from .process import setup_logging

    home = resolve_home(args.home)
    setup_logging(home, "info")
    for h in logging.getLogger().handlers:
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [model]: %(message)s"))
    try:
        from ..embed.local import LocalEmbedder

        t0 = time.perf_counter()
        embedder = LocalEmbedder(Path(args.model_dir), threads=args.threads, max_tokens=args.max_tokens,
                                 overrides=LocalModelConfig(**json.loads(args.overrides)))
        log.info("local embedding model loaded in %.2f s (%d dims)", time.perf_counter() - t0, embedder.dimensions)
    except MemoriesError as exc:
        _say(f"failed {exc.code} {exc.message}".replace("\n", " "))
        os._exit(1)
    except Exception:  # noqa: BLE001 - said to the router, details in the log
        log.exception("the model process could not load the model")
        _say("failed internal the model process could not load the model: see the daemon log")
        os._exit(1)
    server = ModelServer(embedder, args.idle_seconds)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket)
    os.chmod(args.socket, 0o600)
    listener.listen(64)
    listener.settimeout(0.5)
    threading.Thread(target=_watch_stdin, args=(server,), daemon=True, name="memoriesd-model-stdin").start()
    _say("ready")
    while not server.stopping.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if server.idle():
                # The socket goes first: from now on the router starts a new model process for the
                # next request instead of routing it here (the client asks again when a connect fails).
                with contextlib.suppress(OSError):
                    os.unlink(args.socket)
                listener.close()
                log.info("local embedding model released (unused for %.1f minutes)", server.idle_seconds / 60)
                break
            continue
        conn.settimeout(None)
        threading.Thread(target=server.serve, args=(conn,), daemon=True, name="memoriesd-model-conn").start()
    with contextlib.suppress(OSError):
        os.unlink(args.socket)
    logging.shutdown()
    os._exit(0)  # connection threads end with the process; nothing is written to disk here


if __name__ == "__main__":
    main()
