"""Raw frames fuzzed against a real daemon's socket: random bytes, wrong lengths, truncated frames,
invalid UTF-8 and JSON, deep nesting, and every method with wrong, huge and hostile values under every
parameter name. Each gets one error (or result) frame per well-formed request and a clean close, never
a crash, a hang or an internal error; a well-behaved client is served after, and an untouched vault
keeps its record.

The engine is ``tests/support/fuzz.py`` (``tests/support/reliability_report.py`` runs the long version,
with the full method x parameter x bad-value sweep).
"""

from __future__ import annotations

from .conftest import create_vault, running_daemon
from .support import fuzz


def test_fuzzed_frames_get_one_line_errors_or_a_clean_close_and_the_daemon_keeps_serving() -> None:
    out = fuzz.run(short=True)
    assert out["failures"] == [], out
    for zero in ("crashes", "hangs", "internal_errors", "bad_replies", "acknowledged_records_lost"):
        assert out[zero] == 0, (zero, out)
    assert out["cases"] == 150 and out["closed_cleanly"] == 150 and out["well_behaved_checks"] >= 15, out
    assert out["answered_error"] > 150 and out["answered_result"] > 0, out


def test_every_method_is_fuzzed_under_every_parameter_name_the_handlers_read() -> None:
    assert "memory.add" in fuzz.METHODS and "session.grant" in fuzz.METHODS and "daemon.stop" not in fuzz.METHODS
    assert {"vault", "body", "query", "ids", "scopes", "old", "new", "passphrase", "question", "token"} <= set(fuzz.PARAMS)


def test_ingest_of_a_path_name_too_long_is_refused_in_the_report_not_an_internal_error() -> None:
    """Found by the sweep: Path.is_dir raised ENAMETOOLONG out of rag.ingest (an internal error)."""
    with running_daemon() as d:
        vid = create_vault(d)
        r = d.request("rag.ingest", {"vault": vid, "paths": ["/nonexistent/" + "x" * 5000], "recursive": True})
        assert "result" in r, r
        assert r["result"]["added"] == 0 and len(r["result"]["refused"]) == 1, r
        assert "Traceback" not in d.log_text()
