"""Wire protocol between `memories` and `memoriesd` over the Unix socket.

Frames: a 4-byte big-endian length, then that many bytes of UTF-8 JSON (``ensure_ascii=False``).

- request  ``{"id": N, "method": "vault.list", "params": {...}}``
- response ``{"id": N, "result": {...}}`` or ``{"id": N, "error": {"code": "...", "message": "..."}}``
- progress ``{"id": N, "progress": {...}}`` (any number, before the response, for long operations)

A frame longer than the cap is refused from its length prefix alone, before it is read.
This module is light on purpose: the CLI imports it.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

from ..errors import FrameTooLarge, ProtocolError

HEADER = struct.Struct(">I")
DEFAULT_MAX_FRAME = 16 * 1024 * 1024


def encode(message: dict[str, Any], max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if len(data) > max_frame:
        raise FrameTooLarge(
            f"the request is {len(data):,} bytes, over the {max_frame // (1024 * 1024)} MiB frame limit: send less at once"
        )
    return HEADER.pack(len(data)) + data


def decode(payload: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError("the frame is not valid UTF-8 JSON") from exc
    except RecursionError as exc:
        raise ProtocolError("the frame's JSON is nested too deeply") from exc
    except Exception as exc:  # whatever the parser raises, it is the sender's frame
        raise ProtocolError("the frame cannot be decoded as JSON") from exc
    if not isinstance(obj, dict):
        raise ProtocolError("the frame is not a JSON object")
    return obj


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, max_frame: int = DEFAULT_MAX_FRAME * 2) -> dict[str, Any]:
    """Blocking read of one frame (client side)."""
    (n,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if n > max_frame:
        raise FrameTooLarge(f"the daemon sent a frame of {n:,} bytes, over the limit")
    return decode(_recv_exact(sock, n))
