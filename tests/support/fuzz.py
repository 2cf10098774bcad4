"""Raw-frame fuzzing of the daemon's socket protocol (issue 18, item 3).

Against one real memoriesd process, hypothesis sends connections of frames: random bytes, wrong
length prefixes, truncated frames, invalid UTF-8 or JSON, JSON nested too deep, non-objects, and
requests for every method (and unknown ones) whose params carry wrong types, huge numbers, long
and odd Unicode strings, lone surrogates, NaN and nested values under every parameter name the
handlers read. Then the engine half-closes the connection and reads every reply until the daemon
closes it. A case survives when:

- each reply is one frame with an ``error`` (code and one-line message) or a ``result``, and a
  well-formed request frame gets exactly one reply; no error is ``internal``;
- the daemon closes the connection cleanly (no hang: :data:`.live.HANG_SECONDS`) and stays alive;
- a well-behaved client is served afterwards, and vault ``keep`` (never named by a case) still
  holds its record.

The long version also sweeps every method x every parameter name x :data:`BAD_VALUES`.
``run()`` is the report's section; tests/test_fuzz_protocol.py runs it in short mode.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from memoriesd.server import protocol

from .live import CHEAP, HANG_SECONDS, LiveDaemon, new_home

REPO = Path(__file__).resolve().parents[2]
PASS = "fuzz passphrase"
#: Never sent: it stops the daemon (tested elsewhere). ``rag.model_install`` downloads a model.
SKIP = {"daemon.stop", "rag.model_install"}
#: Methods that delete what a case names: a case never names vault ``keep``.
KEEP_RECORD = "the keep vault's record: kept through every case"


def _methods_and_params() -> tuple[list[str], list[str]]:
    """Every method the daemon serves and every parameter name its handlers read (from the source)."""
    from memoriesd.main import method_table  # noqa: PLC0415

    names: set[str] = set()
    sources = [*(REPO / "memoriesd" / "server").rglob("*.py"), *(REPO / "memoriesd" / "workers").glob("*.py")]
    for f in sources:
        text = f.read_text("utf-8")
        names.update(re.findall(r'\.(?:text|integer|number|flag|texts|choice)\(\s*"(\w+)"', text))
        names.update(re.findall(r'raw(?:\.get\(|\[)\s*"(\w+)"', text))
        names.update(re.findall(r'(?:_passphrase\(ctx,\s*|query_key=)"(\w+)"', text))
    return sorted({m.name for m in method_table()} - SKIP) + ["session.grant"], sorted(names)


METHODS, PARAMS = _methods_and_params()
BAD_VALUES: list[Any] = [
    None, True, 0, -1, 2**63, -(2**200), 1e308, -0.0, "", "x" * 100_000, "\x00\x1b[31m", "\u202e\u0000\ufeff",
    "'; DROP TABLE records; --", '" OR "1"="1', "NEAR(a b) * ^ AND OR NOT", "../../../../etc/passwd", [], [None],
    [1, "a"], {}, {"$gt": ""}, ["x" * 5000] * 50,
]
HOSTILE = st.sampled_from(
    ["'; DROP TABLE x; --", '"*"', "NEAR(", "a OR b AND NOT", "^", "{col}: x", "\x00", "\u0000\ud7ff", "🦓" * 300,
     "../../etc/passwd", "%s%n%x", "${jndi:x}", "<script>", "\r\n\r\n", "null", "[]", "{}"]
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
    st.text(max_size=50), st.text(st.characters(codec="utf-8"), max_size=20), HOSTILE,
    st.just("x" * 200_000), st.sampled_from(["alpha", "personal", "fuzz", "", " "]),
)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


class _Frames:
    """One case: the bytes to send and how many replies a well-formed run of them must get."""

    def __init__(self) -> None:
        self.data = b""
        self.replies: int | None = 0  # None: not counted (random bytes)

    def frame(self, payload: bytes, replies: int = 1) -> None:
        self.data += struct.pack(">I", len(payload)) + payload
        if self.replies is not None:
            self.replies += replies


@st.composite
def request(draw: st.DrawFn, vault: str) -> bytes:
    method = draw(st.sampled_from(METHODS) | st.text(max_size=20) | JSON)
    keys = draw(st.lists(st.sampled_from(PARAMS) | st.text(max_size=10), max_size=6, unique=True))
    params: Any = {k: draw(JSON | st.sampled_from(BAD_VALUES)) for k in keys}
    if draw(st.booleans()):
        params["vault"] = draw(st.sampled_from([vault, vault, "fuzz", "nope", 5, None]))
    if draw(st.integers(0, 9)) == 0:
        params = draw(JSON)  # params that are not an object
    msg: dict[str, Any] = {"id": draw(JSON), "method": method, "params": params}
    if draw(st.integers(0, 9)) == 0:
        del msg[draw(st.sampled_from(["id", "method", "params"]))]
    text = json.dumps(_tame(msg), ensure_ascii=draw(st.booleans()), allow_nan=True)
    if draw(st.integers(0, 14)) == 0:
        text = text.replace("1", "NaN", 1).replace("2", "Infinity", 1)  # Python's JSON reads these
    return text.encode("utf-8", "surrogatepass")


def _tame(msg: dict[str, Any]) -> dict[str, Any]:
    """Keep a case from doing what no hostile client can undo in this engine: delete the fuzz vault,
    ingest real folders of this machine, or name vault ``keep``."""
    params = msg.get("params")
    if isinstance(params, dict):
        if msg.get("method") == "vault.delete":
            params["vault"] = "no-such-vault"
        if isinstance(params.get("paths"), list):
            params["paths"] = ["/nonexistent-fuzz/" + str(p) for p in params["paths"]]
        for k, v in list(params.items()):
            if isinstance(v, str) and v.casefold() == "keep":
                params[k] = "kept"
    return msg


@st.composite
def case(draw: st.DrawFn, vault: str) -> _Frames:
    f = _Frames()
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["request", "request", "request", "json", "bytes", "deep", "utf8", "huge"]))
        if kind == "request":
            f.frame(draw(request(vault)))
        elif kind == "json":  # valid JSON that is no object, or no JSON at all
            f.frame(draw(st.sampled_from([b"[1,2]", b"1", b'"s"', b"null", b"{", b"{]", b"", b"{'a':1}", b"\xef\xbb\xbf{}"])))
        elif kind == "bytes":
            f.frame(draw(st.binary(max_size=300)))
        elif kind == "deep":
            n = draw(st.sampled_from([1000, 100_000]))
            f.frame(b'{"id":1,"method":"vault.list","params":' + b"[" * n + b"]" * n + b"}")
        elif kind == "utf8":
            f.frame(b'{"id":1,"method":"' + draw(st.binary(min_size=1, max_size=8)) + b'"}')
        else:  # a length over the limit: refused from the prefix, then the connection ends
            f.data += struct.pack(">I", draw(st.integers(16 * 1024 * 1024 + 1, 2**32 - 1)))
            f.replies = None if f.replies is None else f.replies + 1
            return f
    tail = draw(st.sampled_from(["", "", "truncated", "short-header", "random"]))
    if tail == "truncated":
        f.data += struct.pack(">I", draw(st.integers(7, 5000))) + b'{"id":'
    elif tail == "short-header":
        f.data += b"\x00\x00"
    elif tail == "random":
        f.data += draw(st.binary(min_size=1, max_size=64))
        f.replies = None  # random bytes may make frames of their own
    return f


class Fuzzer:
    """The daemon, its vaults and the counters of one run."""

    def __init__(self, daemon_config: str = "") -> None:
        """``daemon_config``: more ``[daemon]`` lines, e.g. ``auto_lock_minutes = 1``."""
        self.d = LiveDaemon(new_home(CHEAP + "\n[daemon]\nidle_timeout_seconds = 30\n" + daemon_config)).start()
        self.vault = self.d.call("vault.create", {"name": "fuzz", "passphrase": PASS})["vault_id"]
        self.keep = self.d.call("vault.create", {"name": "keep", "passphrase": PASS})["vault_id"]
        self.keep_record = self.d.call("memory.add", {"vault": self.keep, "body": KEEP_RECORD})["id"]
        for i in range(3):
            self.d.call("memory.add", {"vault": self.vault, "body": f"zebra lighthouse note {i}", "title": f"t{i}"})
        self.d.call("memory.remember", {"vault": self.vault, "text": "the user likes zebras"})
        self.stats: dict[str, Any] = {
            "cases": 0, "frames_sent_bytes": 0, "replies": 0, "answered_error": 0, "answered_result": 0,
            "closed_cleanly": 0, "hangs": 0, "crashes": 0, "internal_errors": 0, "bad_replies": 0,
            "acknowledged_records_lost": 0, "well_behaved_checks": 0, "to_vault_process": 0, "to_router": 0,
            "failures": [],
        }
        self._log_size = 0

    def fail(self, what: str) -> None:
        if len(self.stats["failures"]) < 20:
            self.stats["failures"].append(what[:500])

    def send_case(self, f: _Frames) -> None:
        """Send the case, half-close, read every reply until the daemon closes the connection."""
        st_ = self.stats
        st_["cases"] += 1
        st_["frames_sent_bytes"] += len(f.data)
        # Every other case goes to the fuzzed vault's own process (where its content is served), the
        # rest to the daemon's socket (the router); a vault a case locked answers on the router's.
        try:
            s = self.d.connect(self.vault if st_["cases"] % 2 else None)
            st_["to_vault_process" if st_["cases"] % 2 else "to_router"] += 1
        except OSError:
            s = self.d.connect()
            st_["to_router"] += 1
        replies: list[dict[str, Any]] = []
        def send() -> None:
            try:
                s.sendall(f.data)
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # refused from a length prefix and closed before we finished sending

        # Sent from another thread while this one reads: a client that reads none of its replies
        # for write_timeout_seconds is cut off by the daemon (rightly), which is not what is tested.
        sender = threading.Thread(target=send, daemon=True)
        try:
            s.settimeout(HANG_SECONDS)
            sender.start()
            while True:
                try:
                    msg = protocol.recv_frame(s)
                except (ConnectionError, OSError) as exc:
                    if isinstance(exc, TimeoutError):
                        st_["hangs"] += 1
                        self.fail(f"hang: no frame and no close for {HANG_SECONDS:g} s after {f.data[:200]!r}")
                    else:
                        st_["closed_cleanly"] += 1
                    break
                if "progress" in msg:
                    continue
                replies.append(msg)
        finally:
            s.close()
            sender.join(HANG_SECONDS)
        for msg in replies:
            st_["replies"] += 1
            if "result" in msg:
                st_["answered_result"] += 1
                continue
            err = msg.get("error")
            if not (isinstance(err, dict) and isinstance(err.get("code"), str) and isinstance(err.get("message"), str)
                    and "\n" not in err["message"] and "Traceback" not in err["message"]):
                st_["bad_replies"] += 1
                self.fail(f"malformed reply {str(msg)[:200]}")
                continue
            st_["answered_error"] += 1
            if err["code"] == "internal":
                st_["internal_errors"] += 1
                self.fail(f"internal error for {f.data[:300]!r}")
        if f.replies is not None and len(replies) != f.replies:
            st_["bad_replies"] += 1
            self.fail(f"{len(replies)} replies to {f.replies} frames: {f.data[:300]!r}")

    def check(self) -> None:
        """The daemon lives and serves a well-behaved client; vault keep holds its record."""
        self.stats["well_behaved_checks"] += 1
        if not self.d.alive():
            self.stats["crashes"] += 1
            self.fail("memoriesd died")
            self.d.start()
        for vid in (self.vault, self.keep):
            self.d.request("vault.unlock", {"vault": vid, "passphrase": PASS})  # a case may have locked them
        r = self.d.request("memory.read", {"vault": self.keep, "id": self.keep_record})
        if r.code is not None or r.result.get("body") != KEEP_RECORD:
            self.stats["acknowledged_records_lost"] += 1
            self.fail(f"vault keep lost its record: {dict(r)}")
        log = self.d.log_text()
        fresh, self._log_size = log[self._log_size :], len(log)
        if "ended unexpectedly" in fresh:  # a vault's process died (the router logs it)
            self.stats["crashes"] += fresh.count("ended unexpectedly")
            self.fail("a vault process died: " + fresh[fresh.index("ended unexpectedly") - 200 :][:400])
        if "Traceback" in fresh:
            self.stats["internal_errors"] += 1
            self.fail("the daemon logged a traceback: " + fresh[fresh.index("Traceback") :][:600])

    def sweep(self, deadline: float | None) -> int:
        """Every method x every parameter name x every bad value (one connection per method)."""
        sent = 0
        for method in METHODS:
            if deadline is not None and time.monotonic() > deadline:
                break
            f = _Frames()
            for name in PARAMS:
                for bad in BAD_VALUES:
                    msg = _tame({"id": sent, "method": method, "params": {"vault": self.vault, name: bad}})
                    f.frame(json.dumps(msg).encode())
                    sent += 1
            self.send_case(f)
            self.check()
        return sent

    def close(self) -> dict[str, Any]:
        self.d.sample_rss()
        out = dict(self.stats)
        out["crashes"] += self.d.crashes
        out["peak_daemon_rss_mib"] = round(self.d.peak_rss_kib / 1024, 1)
        self.d.remove()
        return out


def run(
    short: bool = True,
    seeds: int | None = None,
    minutes: float | None = None,
    examples: int | None = None,
    sweep: bool | None = None,
    daemon_config: str = "",
) -> dict[str, Any]:
    """The report section: ``examples`` hypothesis cases (default 150 short, ``seeds`` or 3000 long),
    then (long, or ``sweep``) the method x parameter x bad-value sweep."""
    examples = examples or (150 if short else seeds or 3000)
    t0 = time.monotonic()
    deadline = None if minutes is None else t0 + minutes * 60
    fz = Fuzzer(daemon_config)
    try:

        @settings(max_examples=examples, deadline=None, database=None, derandomize=short, print_blob=False,
                  suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
        @given(case(fz.vault))
        def one(f: _Frames) -> None:
            if deadline is not None and time.monotonic() > deadline:
                return
            fz.send_case(f)
            if fz.stats["cases"] % 10 == 0:
                fz.check()

        one()
        fz.check()
        swept = fz.sweep(deadline) if (sweep if sweep is not None else not short) else 0
    finally:
        out = fz.close()
    out.update(swept_frames=swept, methods=len(METHODS), parameter_names=len(PARAMS), seconds=round(time.monotonic() - t0, 1))
    return out


__all__ = ["BAD_VALUES", "METHODS", "PARAMS", "run"]
