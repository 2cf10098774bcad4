"""The real `memories` CLI against a real daemon: output shapes, errors, exit codes, passphrases, keyring."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, Daemon, cli_json, run_cli, short_tmpdir, write_config


@pytest.fixture
def vault(daemon: Daemon) -> str:
    r = run_cli(daemon.home, "vault", "create", "personal", "--passphrase-stdin", input="pw one\n")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def test_vault_create_prints_id_alone_on_last_line(daemon: Daemon) -> None:
    r = run_cli(daemon.home, "vault", "create", "work", "--passphrase-stdin", input="pw\n")
    assert r.returncode == 0
    vid = r.stdout.strip().splitlines()[-1]
    assert len(vid) == 12 and vid.isalnum()
    assert cli_json(daemon.home, "vault", "list") == {"vaults": [{"vault_id": vid, "name": "work", "locked": False}]}


def test_json_shapes_are_stable(daemon: Daemon, vault: str) -> None:
    out = cli_json(daemon.home, "vault", "create", "second", "--passphrase-stdin", input="x\n")
    assert set(out) == {"vault_id", "name"}
    added = cli_json(daemon.home, "memory", "add", vault, "hello", "--title", "T", "--tag", "a", "--tag", "b")
    listed = cli_json(daemon.home, "memory", "list", vault)
    assert set(listed["records"][0]) >= {"id", "revision", "kind", "title", "tags", "private", "updated"}
    read = json.loads(run_cli(daemon.home, "memory", "read", vault, added["id"], "--json").stdout)  # --json after the command
    assert set(read) >= {"id", "revision", "kind", "title", "body", "tags", "private", "created", "updated"}
    assert read["body"] == "hello" and read["tags"] == ["a", "b"]


def test_errors_are_one_line_with_meaningful_exit_codes(daemon: Daemon, vault: str) -> None:
    cases = [
        (("memory", "read", vault, "nosuchid"), 4, "not_found"),
        (("memory", "list", "nosuchvault"), 4, "vault_not_found"),
        (("vault", "frobnicate"), 2, "usage"),
        (("memory", "add"), 2, "usage"),
    ]
    for args, code, err in cases:
        r = run_cli(daemon.home, *args)
        assert r.returncode == code, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"error[{err}]"), r.stderr
        assert "Traceback" not in r.stderr
    run_cli(daemon.home, "vault", "lock", vault)
    r = run_cli(daemon.home, "memory", "list", vault)
    assert r.returncode == 3 and "vault unlock" in r.stderr
    r = run_cli(daemon.home, "vault", "unlock", vault, "--passphrase-stdin", input="wrong\n")
    assert r.returncode == 3 and r.stderr.startswith("error[bad_passphrase]")
    r = run_cli(daemon.home, "--json", "vault", "unlock", vault, "--passphrase-stdin", input="wrong\n")
    assert r.returncode == 3 and json.loads(r.stderr)["error"]["code"] == "bad_passphrase"


def test_passphrase_file_and_passwd_with_two_lines(daemon: Daemon, vault: str, tmp_path: Path) -> None:
    run_cli(daemon.home, "vault", "lock", "--all")
    f = tmp_path / "pw"
    f.write_text("pw one\n")
    assert run_cli(daemon.home, "vault", "unlock", vault, "--passphrase-file", str(f)).returncode == 0
    r = run_cli(daemon.home, "vault", "passwd", vault, "--passphrase-stdin", input="pw one\npw two\n")
    assert r.returncode == 0, r.stderr
    run_cli(daemon.home, "vault", "lock", vault)
    assert run_cli(daemon.home, "vault", "unlock", vault, "--passphrase-stdin", input="pw one\n").returncode == 3
    assert run_cli(daemon.home, "vault", "unlock", vault, "--passphrase-stdin", input="pw two\n").returncode == 0
    r = run_cli(daemon.home, "vault", "passwd", vault, "--passphrase-stdin", input="wrong\nnew\n")
    assert r.returncode == 3


def test_no_terminal_and_no_flag_is_a_clear_error(daemon: Daemon) -> None:
    r = run_cli(daemon.home, "vault", "create", "x")
    assert r.returncode == 2 and "--passphrase-stdin" in r.stderr


def test_memory_update_history_delete_and_old_revisions(daemon: Daemon, vault: str) -> None:
    rid = cli_json(daemon.home, "memory", "add", vault, "v1 text", "--title", "first")["id"]
    assert run_cli(daemon.home, "memory", "update", vault, rid, "v2 text", "--tag", "t1").returncode == 0
    assert run_cli(daemon.home, "memory", "update", vault, rid, "--untag", "t1", "--private", "--title", "second").returncode == 0
    hist = cli_json(daemon.home, "memory", "history", vault, rid)
    assert [r["revision"] for r in hist["revisions"]] == [1, 2, 3]
    old = cli_json(daemon.home, "memory", "read", vault, rid, "--revision", "1")
    assert old["body"] == "v1 text" and old["title"] == "first"
    cur = cli_json(daemon.home, "memory", "read", vault, rid)
    assert cur["private"] is True and cur["tags"] == [] and cur["body"] == "v2 text"
    assert run_cli(daemon.home, "memory", "delete", vault, rid).returncode == 0
    assert run_cli(daemon.home, "memory", "read", vault, rid).returncode == 4


def test_stdin_text_and_file_resource_round_trip(daemon: Daemon, vault: str, tmp_path: Path) -> None:
    rid = run_cli(daemon.home, "memory", "add", vault, "-", "--title", "from stdin", input="piped 文本 ✓\n").stdout.strip()
    assert cli_json(daemon.home, "memory", "read", vault, rid)["body"] == "piped 文本 ✓\n"
    blob = bytes(range(256)) * 40
    src = tmp_path / "photo.bin"
    src.write_bytes(blob)
    fid = run_cli(daemon.home, "memory", "add", vault, "--kind", "file", "--file", str(src)).stdout.strip()
    out = tmp_path / "back.bin"
    r = run_cli(daemon.home, "memory", "read", vault, fid, "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == blob
    listed = cli_json(daemon.home, "memory", "list", vault, "--kind", "file")["records"]
    assert [x["id"] for x in listed] == [fid]


def test_remember_without_keyring_says_so_and_vault_still_works(daemon: Daemon) -> None:
    r = run_cli(daemon.home, "vault", "create", "k", "--passphrase-stdin", "--remember", input="pw\n")
    assert r.returncode == 0
    assert "no OS keyring" in r.stderr
    vid = r.stdout.strip().splitlines()[-1]
    run_cli(daemon.home, "vault", "lock", vid)
    assert run_cli(daemon.home, "vault", "unlock", vid).returncode == 2  # no passphrase remembered, no terminal
    assert run_cli(daemon.home, "vault", "unlock", vid, "--passphrase-stdin", input="pw\n").returncode == 0


def test_remember_with_in_memory_keyring_unlocks_without_passphrase(home: Path) -> None:
    env = {"PYTHON_KEYRING_BACKEND": "tests.memkeyring.FileKeyring", "PYTHONPATH": str(REPO),
           "MEMORIES_TEST_KEYRING": str(home.parent / "keyring.json")}
    d = Daemon(home, env=env).start()
    try:
        r = run_cli(home, "vault", "create", "k", "--passphrase-stdin", "--remember", input="pw\n")
        assert r.returncode == 0 and "keyring" not in r.stderr
        vid = r.stdout.strip().splitlines()[-1]
        run_cli(home, "vault", "lock", vid)
        r = run_cli(home, "vault", "unlock", vid)
        assert r.returncode == 0, r.stderr
    finally:
        d.stop()


def test_version_help_and_no_heavy_imports() -> None:
    r = subprocess.run([sys.executable, "-m", "memories_cli.main", "--version"], capture_output=True, text=True, cwd=REPO)
    assert r.stdout.strip() == "memories 0.1.0"
    code = (
        "import sys, memories_cli.main as m\n"
        "heavy = [n for n in ('numpy', 'onnxruntime', 'jieba', 'tokenizers', 'httpx') if n in sys.modules]\n"
        "print(heavy)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


def test_bad_config_stops_daemon_with_one_line_naming_key() -> None:
    root = short_tmpdir()
    home = root / "h"
    write_config(home, "[daemon]\nauto_lock_minutes = -3\n")
    r = subprocess.run([sys.executable, "-m", "memoriesd.main", "--home", str(home)], capture_output=True, text=True, cwd=REPO, timeout=30)
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "daemon.auto_lock_minutes" in r.stderr and "-3" in r.stderr
    r = run_cli(home, "vault", "list")
    assert r.returncode == 1 and "daemon.auto_lock_minutes" in r.stderr and r.stderr.count("\n") == 1
    write_config(home, "[daemon]\nbogus = 1\n")
    r = run_cli(home, "vault", "list")
    assert "unknown config key daemon.bogus" in r.stderr


def test_daemon_start_status_stop(home: Path) -> None:
    r = run_cli(home, "daemon", "start")
    assert r.returncode == 0, r.stderr
    assert run_cli(home, "daemon", "status").returncode == 0
    assert run_cli(home, "daemon", "stop").returncode == 0
    assert run_cli(home, "daemon", "status").returncode == 6
    write_config(home, "[daemon]\nautostart = false\n")
    r = run_cli(home, "vault", "list")
    assert r.returncode == 6 and "daemon start" in r.stderr


def test_vault_delete_needs_yes_off_a_terminal(daemon: Daemon, vault: str) -> None:
    r = run_cli(daemon.home, "vault", "delete", vault, input="y\n")  # a pipe is no answer (test_first_hour: a terminal is)
    assert r.returncode == 2 and "error[confirmation_required]" in r.stderr and "--yes" in r.stderr
    assert run_cli(daemon.home, "vault", "delete", vault, "--yes").returncode == 0
    assert cli_json(daemon.home, "vault", "list") == {"vaults": []}
    assert not any((daemon.home / "vaults").iterdir())


def test_home_from_environment_variable(tmp_path: Path) -> None:
    root = short_tmpdir()
    home = root / "envhome"
    write_config(home)
    env = dict(os.environ, MEMORIES_HOME=str(home))
    try:
        r = subprocess.run([sys.executable, "-m", "memories_cli.main", "vault", "list"], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        assert (home / "run" / "memoriesd.sock").exists()
    finally:
        subprocess.run([sys.executable, "-m", "memories_cli.main", "daemon", "stop"], env=env, cwd=REPO, capture_output=True, timeout=60)


# -------------------------------------------------------------------- daily-use display (issue 29, 7)

MARKDOWN_NOTE = """Compost guide
=============

## Turning the heap ##

Turn the **compost heap** every _two weeks_; see [the soil notes](soil.md) and `pH 6.5`.

```sh
echo compost
```
"""


def test_piped_tables_keep_ids_and_scope_lists_whole_and_cut_only_free_text(daemon: Daemon, vault: str) -> None:
    label = "the assistant on the laptop in the kitchen, for recipes and the garden"
    gid = cli_json(daemon.home, "grant", "create", vault, "--label", label, "--scope", "search,read,context")["grant_id"]
    r = run_cli(daemon.home, "grant", "list", env={"COLUMNS": "60"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout  # the header and one row: nothing wrapped onto a second line
    row = lines[1].split()
    assert row[0] == gid and row[1] == vault, r.stdout
    assert any(set(part.split(",")) == {"search", "read", "context"} for part in row), r.stdout
    assert "\u2026" in lines[1] and label not in r.stdout  # the label (free text) is what gives way


def test_memory_list_shows_a_fact_by_its_text_and_csv_dates_are_iso_8601(daemon: Daemon, vault: str) -> None:
    import csv
    import datetime as dt
    import io

    fact = "The user prefers zsh over bash"
    cli_json(daemon.home, "memory", "remember", vault, fact)
    r = run_cli(daemon.home, "memory", "list", vault, env={"COLUMNS": "200"})  # wide enough: free text is cut to fit
    assert r.returncode == 0, r.stderr
    assert fact in r.stdout, r.stdout
    listed = cli_json(daemon.home, "memory", "list", vault)["records"]
    assert [x["text"] for x in listed if x["kind"] == "fact"] == [fact]
    rows = list(csv.DictReader(io.StringIO(run_cli(daemon.home, "memory", "list", vault, "--format", "csv").stdout)))
    when = dt.datetime.fromisoformat(rows[0]["updated"])
    assert when.tzinfo is not None and abs(when.timestamp() - listed[0]["updated"]) < 1, rows[0]
    assert rows[0]["text"] == fact


def test_search_shows_markdown_as_text_while_json_keeps_the_stored_text(daemon: Daemon, vault: str, tmp_path: Path) -> None:
    (tmp_path / "compost.md").write_text(MARKDOWN_NOTE)
    assert run_cli(daemon.home, "rag", "ingest", vault, str(tmp_path / "compost.md")).returncode == 0
    r = run_cli(daemon.home, "rag", "search", vault, "compost heap weeks", "--mode", "bm25")
    assert r.returncode == 0, r.stderr
    assert "Turn the compost heap every two weeks; see the soil notes and pH 6.5" in " ".join(r.stdout.split()), r.stdout
    for mark in ("===", "##", "**", "](", "```", "`pH"):
        assert mark not in r.stdout, (mark, r.stdout)
    found = cli_json(daemon.home, "rag", "search", vault, "compost heap weeks", "--mode", "bm25")["results"]
    assert any("**compost heap**" in x["text"] for x in found), found


def test_scripted_ingest_writes_progress_lines_only_when_asked(daemon: Daemon, vault: str, tmp_path: Path) -> None:
    for i in range(120):
        (tmp_path / f"n{i:03d}.md").write_text(f"# Note {i}\n\nabout item {i}\n")
    quiet = run_cli(daemon.home, "rag", "ingest", vault, str(tmp_path), "-r")
    assert quiet.returncode == 0 and quiet.stderr.splitlines() == ["added 120, updated 0, unchanged 0, refused 0"], quiet.stderr
    for i in range(120):
        (tmp_path / f"n{i:03d}.md").write_text(f"# Note {i}\n\nabout item {i}, revised\n")
    asked = run_cli(daemon.home, "rag", "ingest", vault, str(tmp_path), "-r", "--progress", "json")
    lines = [json.loads(x) for x in asked.stderr.splitlines() if x.startswith("{")]
    assert asked.returncode == 0 and lines and lines[-1] == {"progress": "ingest", "done": 120, "total": 120}, asked.stderr


def _default_sigint() -> None:
    """The CLI as a terminal starts it: a runner that started the suite in the background (a
    non-interactive shell's ``&``) hands its children SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler, so the signal would be lost (a loaded CI run under ``cmd &`` saw it)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_ingest_says_what_became_of_the_work_and_exits_130(daemon: Daemon, vault: str, tmp_path: Path) -> None:
    import signal

    for i in range(3000):
        (tmp_path / f"n{i:04d}.md").write_text(f"# Note {i}\n\n" + f"words about item {i} " * 100)
    proc = subprocess.Popen(
        [sys.executable, "-m", "memories_cli.main", "--home", str(daemon.home), "rag", "ingest", vault, str(tmp_path), "-r", "--progress", "json"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
        preexec_fn=_default_sigint,
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the first progress line: the ingest is under way
    assert first.startswith('{"progress": "ingest"'), first
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("interrupted: the daemon stops at its next file"), err
    assert "Traceback" not in err


def test_markdown_marks_are_dropped_for_display_and_line_breaks_kept() -> None:
    from memories_cli.render import plain

    shown = plain(MARKDOWN_NOTE)
    assert shown.count("\n") == MARKDOWN_NOTE.count("\n")  # line numbers still point into the file
    assert "Compost guide" in shown and "Turning the heap" in shown and "echo compost" in shown
    assert "Turn the compost heap every two weeks; see the soil notes and pH 6.5." in shown
    for mark in ("===", "#", "**", "_two", "](", "`"):
        assert mark not in shown, mark
    assert plain("snake_case_name and 2*3*4") == "snake_case_name and 2*3*4"


def _blocked_reading_stdin(pid: int) -> bool:
    """The process waits in read(0, ...) (x86-64 and arm64 number read 0 and 63), per /proc."""
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return len(fields) > 1 and fields[0] in ("0", "63") and int(fields[1], 16) == 0


def test_ctrl_c_in_any_command_is_one_line_and_exit_130(daemon: Daemon, vault: str) -> None:
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "memories_cli.main", "--home", str(daemon.home), "memory", "add", vault, "-", "--title", "t"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
        preexec_fn=_default_sigint,
    )
    deadline = time.monotonic() + 60
    while not _blocked_reading_stdin(proc.pid):  # a condition on the process, not a guess of time
        assert proc.poll() is None and time.monotonic() < deadline, "memory add never read stdin"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err == "error[aborted]: interrupted\n", err
