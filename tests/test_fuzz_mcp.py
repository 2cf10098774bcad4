"""Every MCP tool's arguments fuzzed through a real `memories mcp` (the SDK's stdio client) and a real
daemon: wrong types, missing, huge, Unicode, control characters, injection strings and the other
vault's record ids get a tool error, never a server crash, never a byte of the other vault.

The engine is ``tests/support/fuzz_mcp.py`` (``tests/support/reliability_report.py`` runs the long version).
"""

from __future__ import annotations

from .support import fuzz_mcp


def test_fuzzed_tool_arguments_get_tool_errors_and_never_another_vaults_data() -> None:
    out = fuzz_mcp.run(short=True)
    assert out["failures"] == [], out
    assert out["crashes"] == 0 and out["internal_errors"] == 0 and out["other_vault_leaks"] == 0, out
    assert out["acknowledged_records_lost"] == 0, out
    assert out["calls"] == 80 and len(out["per_tool"]) == 8, out
    # Both kinds of refusal were reached, and some calls got through to the daemon's answers.
    assert out["validation_errors"] > 0 and out["structured_errors"] > 0 and out["answered_result"] > 0, out
