"""The Memories skill (``SKILL.md``) and `memories inject`: write it, upgrade it, never clobber edits.

Every file Memories writes carries, in its YAML front matter, its version and a digest of its own
text (with the digest value blanked). A file whose digest checks out is one Memories wrote and
nobody edited since, whatever its version: it may be upgraded. Any other file is the person's
and is only replaced with ``--force``.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from memoriesd.errors import UsageError

SKILL_DIR_NAME = "memories"
SKILL_FILE = "SKILL.md"
TARGETS = ("all", "claude", "agents")

_VERSION = re.compile(r'^  memories-skill-version: "(\d+)"$', re.M)
_DIGEST = re.compile(r'^(  memories-skill-digest: ")([0-9a-f]*)(")$', re.M)


def template() -> str:
    """The shipped skill text (digest blank)."""
    return resources.files(__name__).joinpath(SKILL_FILE).read_text("utf-8")


def version_of(text: str) -> int | None:
    m = _VERSION.search(text)
    return int(m.group(1)) if m else None


def digest_of(text: str) -> str:
    """sha256 of the text with its digest value blanked."""
    return hashlib.sha256(_DIGEST.sub(r"\g<1>\g<3>", text, count=1).encode("utf-8")).hexdigest()


def stamp(text: str) -> str:
    """The text with its own digest filled in (what Memories writes)."""
    if not _DIGEST.search(text):
        raise ValueError("skill text has no digest line")
    return _DIGEST.sub(lambda m: m.group(1) + digest_of(text) + m.group(3), text, count=1)


def written_by_memories(text: str) -> bool:
    """True for an unedited file that Memories wrote (any version)."""
    m = _DIGEST.search(text)
    return bool(m and m.group(2) and version_of(text) is not None and m.group(2) == digest_of(text))


def skill_text() -> str:
    return stamp(template())


def target_dirs(target: str, directory: Path | None, user_home: Path | None = None) -> list[Path]:
    """Skills folders for a target: ~/.claude/skills, ~/.agents/skills, or --dir."""
    if target not in TARGETS:
        raise UsageError(f"unknown target {target!r}: use all, claude or agents")
    if directory is not None:
        return [directory]
    base = user_home or Path.home()
    dirs = {"claude": [base / ".claude" / "skills"], "agents": [base / ".agents" / "skills"]}
    return dirs["claude"] + dirs["agents"] if target == "all" else dirs[target]


@dataclass(frozen=True)
class InjectResult:
    path: Path
    action: str  # "written", "upgraded", "unchanged", "replaced", "skipped-edited", "skipped-newer"
    message: str


def inject_one(skills_dir: Path, *, force: bool = False, text: str | None = None) -> InjectResult:
    """Write ``skills_dir/memories/SKILL.md`` unless that would clobber the person's edits."""
    text = skill_text() if text is None else text
    path = skills_dir / SKILL_DIR_NAME / SKILL_FILE
    try:
        existing = path.read_text("utf-8") if path.exists() else None
    except (OSError, UnicodeDecodeError):
        existing = ""  # unreadable as ours: treat like an edited file
    ours = version_of(text) or 0
    action = "written"
    if existing is not None:
        if existing == text:
            return InjectResult(path, "unchanged", f"up to date (version {ours}): {path}")
        theirs = version_of(existing)
        if not force:
            if not written_by_memories(existing):
                return InjectResult(
                    path,
                    "skipped-edited",
                    f"not overwritten, it was edited: {path} (keep it, or replace it with `memories inject --force`)",
                )
            if theirs is not None and theirs > ours:
                return InjectResult(
                    path,
                    "skipped-newer",
                    f"not overwritten, a newer version {theirs} is installed: {path} (use --force to replace it)",
                )
            action = "upgraded"
        else:
            action = "replaced"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{SKILL_FILE}.tmp")
        tmp.write_text(text, "utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(f"cannot write the skill to {path} ({exc.strerror}): check the folder or pass --dir") from exc
    verb = {"written": "wrote", "upgraded": "upgraded", "replaced": "replaced"}[action]
    return InjectResult(path, action, f"{verb} version {ours}: {path}")


def inject(target: str, directory: Path | None = None, *, force: bool = False) -> list[InjectResult]:
    return [inject_one(d, force=force) for d in target_dirs(target, directory)]


__all__ = ["inject", "inject_one", "skill_text", "template", "stamp", "digest_of", "version_of", "written_by_memories", "InjectResult"]
