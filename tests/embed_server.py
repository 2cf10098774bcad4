"""A real OpenAI-compatible embeddings service on 127.0.0.1 for daemon tests.

``POST /v1/embeddings {"model", "input": [..]}`` answers ``{"data": [{"index", "embedding"}]}`` with
a deterministic bag-of-words vector per input (texts that share words are close). Every request is
recorded; while ``hold`` names a marker, a request whose inputs contain it waits until ``release``
is set (``held`` says it arrived), so a test can act while the daemon is inside that request.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DIMS = 32
_WORD = re.compile(r"\w+")


def bag_vector(text: str, dims: int = DIMS) -> list[float]:
    v = [0.0] * dims
    for w in _WORD.findall(text.lower()):
        h = int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], "big")
        v[h % dims] += 1.0
    v[0] += 0.01  # never the zero vector
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


class EmbeddingService:
    def __init__(self, dims: int = DIMS) -> None:
        self.dims = dims
        self.inputs: list[list[str]] = []
        self.hold: str | None = None
        self.held = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                inputs = data["input"] if isinstance(data["input"], list) else [data["input"]]
                with outer.lock:
                    outer.inputs.append(list(inputs))
                    marker = outer.hold
                if marker is not None and any(marker in t for t in inputs):
                    outer.held.set()
                    outer.release.wait(55)  # under the daemon's 60 s HTTP timeout: a test releases it sooner
                body = json.dumps(
                    {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": bag_vector(t, outer.dims)} for i, t in enumerate(inputs)]}
                ).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/embeddings"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def config(self, model: str = "bag") -> str:
        """The ``[embedding.service]`` table naming this service."""
        return f'[embedding.service]\nprotocol = "compatible"\nurl = "{self.url}"\nmodel = "{model}"\n'

    def requests(self) -> int:
        with self.lock:
            return len(self.inputs)

    def texts(self) -> list[str]:
        with self.lock:
            return [t for batch in self.inputs for t in batch]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


__all__ = ["EmbeddingService", "bag_vector", "DIMS"]
