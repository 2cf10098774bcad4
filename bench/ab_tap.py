"""What a daemon's model process embeds, counted from outside: a tap on its socket (bench/ab_recall.py).

The model process (:mod:`memoriesd.workers.model`) listens on ``run/m<hex>.sock``; vault processes
open a fresh connection to that path for every request. :meth:`EmbedTap.install` renames the model's
socket aside and listens at its path instead, forwarding every frame unchanged, so whatever code
the daemon runs (an older commit included) its document batches pass through here: the texts per
vault, and the seconds each ``model.embed`` took. Token counts are asked of the model process
itself (``model.count``) at the end, on the exact string the model reads (the profile's document
prompt), so they are deterministic where seconds are not.

Only for benchmarks: the tap holds the texts in memory until :meth:`EmbedTap.summary`.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memoriesd.embed.profile import ModelProfile, format_document
from memoriesd.errors import MemoriesError
from memoriesd.server import protocol
from memoriesd.workers.model_client import ask

FRAME = 1 << 30
MODEL_SOCKET = re.compile(r"m[0-9a-f]{8}\.sock")
KEEP_ALIVE_SECONDS = 60.0
COUNT_CHUNK = 1024  # texts per model.count request (the model process takes at most 4,096)


@dataclass
class VaultEmbeds:
    """One vault's document batches as the tap saw them."""

    texts: list[str] = field(default_factory=list)
    batches: int = 0
    seconds: float = 0.0


class EmbedTap:
    """Stands at the path of a daemon's model socket and forwards every request to the real one."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path: Path | None = None
        self.real: Path | None = None
        self.profile: ModelProfile | None = None
        self.pid: int | None = None
        self.vaults: dict[str, VaultEmbeds] = {}
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._closed = threading.Event()

    def install(self) -> None:
        """Take the place of the one model socket in ``run/`` (the model process must be running)."""
        socks = self._model_sockets()
        if len(socks) != 1:
            raise SystemExit(f"expected one model socket in {self.run_dir}, found {len(socks)}")
        self.path = socks[0]
        self.real = self.path.with_name(self.path.stem + "-real.sock")
        self.pid = _pid_serving(self.path)
        os.rename(self.path, self.real)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        os.chmod(self.path, 0o600)
        listener.listen(64)
        self._listener = listener
        info = ask(self.real, "model.info", {}, 60)
        if not isinstance(info, dict):
            raise SystemExit("model.info answered no object")
        self.profile = ModelProfile(**info["profile"])
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._keep_alive, daemon=True).start()

    def _keep_alive(self) -> None:
        """A cheap request every minute: the model process ends after ``idle_minutes`` without one, and a
        new one (while the other commit captures) would not pass through the tap."""
        while not self._closed.wait(KEEP_ALIVE_SECONDS):
            with contextlib.suppress(OSError, MemoriesError):
                ask(self.real or "", "model.count", {"texts": ["keep alive"]}, 60)

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        assert self.real is not None
        with conn, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as up:
            up.connect(str(self.real))
            while True:
                try:
                    msg = protocol.recv_frame(conn, FRAME)
                except (OSError, MemoriesError):
                    return
                t0 = time.perf_counter()
                up.sendall(protocol.encode(msg, FRAME))
                reply = protocol.recv_frame(up, FRAME)
                seconds = time.perf_counter() - t0
                conn.sendall(protocol.encode(reply, FRAME))
                params = msg.get("params") or {}
                if (
                    msg.get("method") == "model.embed"
                    and params.get("kind") == "document"
                    and "result" in reply
                ):
                    self._note(str(params.get("vault") or ""), params.get("items") or [], seconds)

    def _note(self, vault: str, items: list[Any], seconds: float) -> None:
        assert self.profile is not None
        texts = [format_document(self.profile, None if t is None else str(t), str(x)) for t, x in items]
        with self._lock:
            v = self.vaults.setdefault(vault, VaultEmbeds())
            v.texts.extend(texts)
            v.batches += 1
            v.seconds += seconds

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds of the model process so far (None once it is gone)."""
        if self.pid is None:
            return None
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def summary(self, vault: str) -> dict[str, Any]:
        """``texts``, ``tokens`` (as the model counts them, capped at its max_tokens), ``batches`` and
        ``model_seconds`` of what ``vault`` had embedded through the tap."""
        assert self.real is not None and self.profile is not None
        with self._lock:
            v = self.vaults.get(vault, VaultEmbeds())
            texts, batches, seconds = list(v.texts), v.batches, v.seconds
        cap = self.profile.max_tokens or None
        tokens = 0
        for i in range(0, len(texts), COUNT_CHUNK):
            out = ask(self.real, "model.count", {"texts": texts[i : i + COUNT_CHUNK]}, 600)
            counts = out["counts"] if isinstance(out, dict) else []
            tokens += sum(min(int(n), cap) if cap else int(n) for n in counts)
        return {"texts": len(texts), "tokens": tokens, "batches": batches, "model_seconds": round(seconds, 2)}

    def bypassed(self) -> bool:
        """Whether another model process was started (its requests did not pass through the tap)."""
        return any(p != self.path for p in self._model_sockets())

    def _model_sockets(self) -> list[Path]:
        """The model processes' sockets in ``run/`` (``m<8 hex>.sock``: not the daemon's ``memoriesd.sock``)."""
        return [p for p in self.run_dir.iterdir() if MODEL_SOCKET.fullmatch(p.name) and p.is_socket()]

    def close(self) -> None:
        self._closed.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        if self.path is not None and self.real is not None and self.real.exists():
            with contextlib.suppress(OSError):
                os.replace(self.real, self.path)  # the daemon removes its own socket on the way out


def _pid_serving(sock_path: Path) -> int | None:
    """The process whose command line names ``sock_path`` (the model process: ``--socket PATH``)."""
    needle = str(sock_path).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in argv and b"memoriesd.workers.model" in argv:
            return int(proc.name)
    return None


__all__ = ["EmbedTap", "VaultEmbeds"]
