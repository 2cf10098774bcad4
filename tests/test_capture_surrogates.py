"""A lone UTF-16 surrogate in a transcript (``"\\ud800"`` in JSON) is refused in one line, never `internal`.

JSON can spell half of a character (an emoji cut in two by an exporter) as an escape that no UTF-8
text can hold. Every transcript format refuses it as bad input naming the line, writes nothing and
logs no traceback: through the real daemon, the real CLI and the real MCP server.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from mcp.client.session import ClientSession

from memoriesd.server import protocol

from .conftest import Daemon, DaemonError, create_vault, run_cli, running_daemon, short_tmpdir, write_config
from .test_agent_writes import Env as WriteEnv
from .test_agent_writes import with_mcp
from .test_mcp import call, err

HIGH, LOW = "\ud83d", "\udc00"  # the first half of an emoji alone; a second half alone


def _lines(*objs: Any) -> str:
    return "\n".join(json.dumps(o) for o in objs) + "\n"  # json.dumps writes a lone surrogate as \\udXXX


def _cc(kind: str, content: Any, ts: str) -> dict[str, Any]:
    return {"type": kind, "sessionId": "s-1", "timestamp": ts, "uuid": f"u-{ts}", "message": {"role": kind, "content": content}}


VARIANTS: dict[str, str] = {
    "jsonl role and content": _lines(
        {"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}, {"role": "user", "content": f"cut {HIGH} here"}
    ),
    "jsonl speaker and text": _lines({"speaker": "Ana", "text": "hello"}, {"speaker": f"Bo{LOW}", "text": "hi"}),
    "jsonl message with text parts": _lines(
        {"message": {"role": "user", "content": [{"type": "text", "text": "hello"}]}},
        {"message": {"role": "assistant", "content": [{"type": "text", "text": f"hi {HIGH}"}]}},
    ),
    "JSON array of messages": "[\n" + ",\n".join(
        json.dumps(m) for m in ({"role": "user", "content": "hello"}, {"role": "assistant", "content": f"{LOW} hi"})
    ) + "\n]\n",
    "messages object": json.dumps({"messages": [{"role": "user", "content": f"hello {HIGH}"}]}),
    "Claude Code text": _lines(
        _cc("user", "Should billing use Postgres?", "2025-06-03T09:15:00Z"),
        _cc("assistant", [{"type": "text", "text": f"Postgres {HIGH}"}], "2025-06-03T09:15:05Z"),
    ),
    "Claude Code summary": _lines(
        {"type": "summary", "summary": f"Billing {HIGH}"}, _cc("user", "Should billing use Postgres?", "2025-06-03T09:15:00Z")
    ),
    "LoCoMo turn": json.dumps({
        "speaker_a": "Caroline", "speaker_b": "Melanie", "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "Caroline", "dia_id": "D1:1", "text": "I went hiking."},
                      {"speaker": "Melanie", "dia_id": "D1:2", "text": "Nice!", "blip_caption": f"a photo {LOW}"}],
    }, indent=1),
    "Markdown": f"# Call\n\nAna: hello\nBo: cut {HIGH} here\n",  # raw: only a client escaping it can send it
}


def _line_of(text: str, bad: str) -> int:
    """The one line of ``text`` holding the surrogate (raw, or as its JSON escape)."""
    escape = f"\\u{ord(bad):04x}"
    [n] = [i for i, line in enumerate(text.split("\n"), 1) if bad in line or escape in line]
    return n


def _ascii_encode(message: dict[str, Any], max_frame: int = protocol.DEFAULT_MAX_FRAME) -> bytes:
    """A frame as any JSON client may write it: non-ASCII escaped, so a lone surrogate can travel."""
    data = json.dumps(message, separators=(",", ":")).encode("ascii")
    return protocol.HEADER.pack(len(data)) + data


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as d:
        yield d


@pytest.fixture(scope="module")
def vid(daemon: Daemon) -> str:
    v = create_vault(daemon, "talks")
    daemon.call("memory.capture", {"vault": v, "text": "Ana: a first call\nBo: noted", "extract": False})
    return v


def _written(d: Daemon, vid: str) -> tuple[int, int]:
    info = d.call("vault.status", {"vault": vid})
    return int(info["records"]), int(info["log_bytes"])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_lone_surrogate_in_any_format_is_bad_input_naming_its_line(
    daemon: Daemon, vid: str, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = VARIANTS[variant]
    bad = HIGH if HIGH in text or "\\ud83d" in text else LOW
    monkeypatch.setattr(protocol, "encode", _ascii_encode)
    before = _written(daemon, vid)
    with pytest.raises(DaemonError) as refused:
        daemon.call("memory.capture", {"vault": vid, "text": text, "extract": False})
    code, message = refused.value.code, refused.value.message
    assert code == "usage" and "\n" not in message, message
    assert f"unpaired UTF-16 surrogate (\\u{ord(bad):04x}) at line {_line_of(text, bad)}" in message, message
    assert "capture" in message  # what to do
    assert _written(daemon, vid) == before
    assert "Traceback" not in daemon.log_text()


def test_surrogate_pairs_and_lone_surrogates_in_parts_left_out_are_captured(daemon: Daemon, vid: str) -> None:
    text = _lines(
        _cc("user", "Which emoji for the release notes?", "2025-06-03T09:15:00Z"),
        _cc("assistant", [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}], "2025-06-03T09:15:01Z"),
        _cc("user", [{"type": "tool_result", "tool_use_id": "t1", "content": f"truncated {HIGH}"}], "2025-06-03T09:15:02Z"),
        _cc("assistant", [{"type": "text", "text": "The party popper \U0001f389 it is."}], "2025-06-03T09:15:03Z"),
    )
    assert "\\ud83c\\udf89" in text  # the pair, escaped as JSON writes it
    out = daemon.call("memory.capture", {"vault": vid, "text": text, "extract": False})
    [rec] = out["records"]
    body = daemon.call("memory.read", {"vault": vid, "id": rec["id"]})["body"]
    assert "\U0001f389" in body and "truncated" not in body


def test_cli_capture_of_a_lone_surrogate_is_one_line_and_a_usage_exit(daemon: Daemon, vid: str, tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_text(VARIANTS["jsonl role and content"], encoding="ascii")
    before = _written(daemon, vid)
    r = run_cli(daemon.home, "memory", "capture", vid, str(path))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error[usage]: ") and "at line 3" in lines[0], r.stderr
    assert _written(daemon, vid) == before


def test_mcp_memory_capture_of_a_lone_surrogate_is_bad_input_not_internal() -> None:
    tmp = short_tmpdir("ms")
    home = tmp / "h"
    write_config(home)
    d = Daemon(home).start()
    try:
        v = create_vault(d, "talks")
        token = d.call("grant.create", {"vault": v, "scopes": ["capture"]})["token"]

        async def go(s: ClientSession) -> list[tuple[str, str]]:
            # An MCP client's own JSON cannot hold a lone surrogate (the SDKs refuse it): a transcript's can.
            return [err(await call(s, "memory_capture", text=VARIANTS[name])) for name in ("jsonl role and content", "Claude Code text")]

        got = with_mcp(WriteEnv(d, cast(Any, None), tmp, v, "", "", ""), token, go)
        for (code, message), where in zip(got, ("at line 3", "at line 2"), strict=True):
            assert code == "usage" and "unpaired UTF-16 surrogate" in message and where in message, message
        assert int(d.call("vault.status", {"vault": v})["records"]) == 0
        assert "Traceback" not in d.log_text()
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
