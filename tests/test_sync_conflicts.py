"""Concurrent edits of one record on two devices (real daemons, a folder target): both are kept, the
same one is current on both, the other is a conflict revision that history and `sync status` show,
and an edit made after seeing both resolves it."""

from __future__ import annotations

import shutil

from .conftest import create_vault, running_daemon, short_tmpdir

# Only `sync.now` exchanges anything here (no debounced push, no poll, the folder not watched): edits
# made meanwhile are concurrent for sure, whatever the machine's load.
QUIET = "[sync]\ndebounce_seconds = 600\npoll_seconds = 86400\nwatch = false\n"


def test_edits_made_apart_are_both_kept_and_the_next_edit_resolves_them() -> None:
    root = short_tmpdir("sc")
    try:
        with running_daemon(QUIET) as a, running_daemon(QUIET) as b:
            vid = create_vault(a, "shared")
            rid = a.call("memory.add", {"vault": vid, "kind": "memory", "title": "plan", "body": "first"})["id"]
            a.call("sync.add", {"vault": vid, "target": str(root / "target")})
            a.call("sync.now", {"vault": vid})
            b.call("vault.join", {"target": str(root / "target"), "passphrase": "correct horse"})
            a.call("memory.update", {"vault": vid, "id": rid, "body": "edited on A"})
            b.call("memory.update", {"vault": vid, "id": rid, "body": "edited on B"})
            for _ in range(2):
                a.call("sync.now", {"vault": vid})
                b.call("sync.now", {"vault": vid})
            body_a = a.call("memory.read", {"vault": vid, "id": rid})["body"]
            assert body_a == b.call("memory.read", {"vault": vid, "id": rid})["body"]
            assert body_a in ("edited on A", "edited on B")
            for d in (a, b):
                assert d.call("sync.status", {"vault": vid})["conflicts"] == [rid]
                revs = d.call("memory.history", {"vault": vid, "id": rid})["revisions"]
                bodies = {r.get("body") for r in revs if r.get("conflict")} | {body_a}
                unresolved = [r for r in revs if r.get("unresolved")]
                assert len(unresolved) == 1, "the edit that did not win is an unresolved head"
                assert {"edited on A", "edited on B"} <= bodies | {r.get("body") for r in unresolved} | {
                    d.call("memory.read", {"vault": vid, "id": rid})["body"]
                } | _old_bodies(d, vid, rid)
            b.call("memory.update", {"vault": vid, "id": rid, "body": "merged by hand"})
            b.call("sync.now", {"vault": vid})
            a.call("sync.now", {"vault": vid})
            for d in (a, b):
                assert d.call("memory.read", {"vault": vid, "id": rid})["body"] == "merged by hand"
                assert d.call("sync.status", {"vault": vid})["conflicts"] == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _old_bodies(d, vid: str, rid: str) -> set[str]:  # type: ignore[no-untyped-def]
    """Bodies of the record's earlier revisions (memory.read of each)."""
    out = set()
    for r in d.call("memory.history", {"vault": vid, "id": rid})["revisions"]:
        if not r.get("conflict") and not r["deleted"]:
            out.add(d.call("memory.read", {"vault": vid, "id": rid, "revision": r["revision"]})["body"])
    return out
