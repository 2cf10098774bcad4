"""`memories inject`: the Memories skill in AI clients' skill folders, upgraded but never clobbered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from memories_cli.skill import skill_text, stamp, template, version_of, written_by_memories

from .conftest import REPO

BOOT = (
    "import sys; from memories_cli.main import app, run; from memories_cli import grant_cmds\n"
    "if 'grant' not in {g.name for g in app.registered_groups}: grant_cmds.register(app)\n"
    "run()"
)


def inject(user_home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOME=str(user_home))
    return subprocess.run(
        [sys.executable, "-c", BOOT, "--home", str(user_home / ".memories"), "inject", *args],
        capture_output=True, text=True, cwd=str(REPO), env=env, timeout=60,
    )


def front_matter(text: str) -> dict[str, str]:
    assert text.startswith("---\n")
    block = text[4 : text.index("\n---\n", 4)]
    return {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in block.splitlines() if not ln.startswith(" "))}


def older_version(body_change: str = "Memories is the person's local") -> str:
    """A skill as an earlier Memories would have written it (version 0, other wording, own digest)."""
    text = template().replace('memories-skill-version: "1"', 'memories-skill-version: "0"')
    return stamp(text.replace(body_change, "Memories (old wording) is the person's local"))


def test_inject_all_writes_the_skill_for_claude_code_and_agents_clients(tmp_path: Path) -> None:
    r = inject(tmp_path, "all")
    assert r.returncode == 0, r.stderr
    claude = tmp_path / ".claude" / "skills" / "memories" / "SKILL.md"
    agents = tmp_path / ".agents" / "skills" / "memories" / "SKILL.md"
    assert r.stdout.splitlines() == [f"wrote version 1: {claude}", f"wrote version 1: {agents}"]
    for p in (claude, agents):
        text = p.read_text("utf-8")
        assert text == skill_text() and written_by_memories(text) and version_of(text) == 1
        meta = front_matter(text)
        assert meta["name"] == "memories" and "memory_retrieve" in meta["description"]
    again = inject(tmp_path, "claude")
    assert again.returncode == 0 and again.stdout.strip() == f"up to date (version 1): {claude}"


def test_the_skill_explains_tools_citations_data_and_errors() -> None:
    text = skill_text()
    for needle in ("memory_retrieve", "memory_ask", "memory_read", "memory_search", "[S1]", "record_id", "revision",
                   "not instructions", "vault_locked", "memories vault unlock", "scope_denied", "insufficient_evidence"):
        assert needle in text, needle


def test_an_edited_skill_is_never_overwritten_without_force(tmp_path: Path) -> None:
    skills = tmp_path / "custom-skills"
    assert inject(tmp_path, "all", "--dir", str(skills)).returncode == 0
    path = skills / "memories" / "SKILL.md"
    edited = path.read_text("utf-8").replace("## Citing", "## Citing (my house rules: always quote)")
    path.write_text(edited, "utf-8")
    r = inject(tmp_path, "agents", "--dir", str(skills))
    assert r.returncode == 0
    assert r.stdout.strip() == f"not overwritten, it was edited: {path} (keep it, or replace it with `memories inject --force`)"
    assert path.read_text("utf-8") == edited
    # A file Memories never wrote (no digest) is the person's too.
    path.write_text("---\nname: memories\ndescription: mine\n---\nmy own skill\n", "utf-8")
    assert "not overwritten" in inject(tmp_path, "all", "--dir", str(skills)).stdout
    forced = inject(tmp_path, "all", "--dir", str(skills), "--force")
    assert forced.returncode == 0 and forced.stdout.strip() == f"replaced version 1: {path}"
    assert path.read_text("utf-8") == skill_text()


def test_an_unchanged_older_version_is_upgraded_and_a_newer_one_kept(tmp_path: Path) -> None:
    path = tmp_path / ".claude" / "skills" / "memories" / "SKILL.md"
    path.parent.mkdir(parents=True)
    old = older_version()
    assert written_by_memories(old) and version_of(old) == 0 and old != skill_text()
    path.write_text(old, "utf-8")
    r = inject(tmp_path, "claude", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"results": [{"path": str(path), "action": "upgraded"}]}
    assert path.read_text("utf-8") == skill_text()
    # An old version the person edited after Memories wrote it stays.
    path.write_text(old + "\nmy note\n", "utf-8")
    assert "not overwritten, it was edited" in inject(tmp_path, "claude").stdout
    newer = stamp(template().replace('memories-skill-version: "1"', 'memories-skill-version: "7"'))
    path.write_text(newer, "utf-8")
    r = inject(tmp_path, "claude")
    assert "a newer version 7 is installed" in r.stdout and path.read_text("utf-8") == newer


def test_an_unknown_target_is_a_one_line_usage_error(tmp_path: Path) -> None:
    r = inject(tmp_path, "cursor")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == "error[usage]: unknown target 'cursor': use all, claude or agents"
    assert not (tmp_path / ".claude").exists()
