"""Issue 13: defects found by attacking the daemon, each pinned with real processes and files.

1. file names that are not UTF-8, 2. a mirror that resumes with the wrong byte range,
3. FIFOs and other non-regular files, 4. huge files read whole, 5. terminal escape sequences in
titles and bodies, 6. the ``--revision 0`` message.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from memoriesd.config import HttpConfig
from memoriesd.embed.install import default_manifest_path, install_model, load_manifest
from memoriesd.errors import DocumentRefused, HttpError, InvalidParams
from memoriesd.server.context import Params
from memoriesd.text.files import discover, read_document
from tests.conftest import Daemon, create_vault, run_cli, running_daemon, short_tmpdir, write_config

ESC_TITLE = "T\x1b]0;pwned\x07\x1b[2J"
WIDE = {"COLUMNS": "400"}  # rich tables do not wrap the titles
CONTROLS = ("\x1b", "\x07", "\x9b", "\x08")


def _fs(raw: bytes) -> str:
    """A command-line argument made of these exact bytes."""
    return os.fsdecode(raw)


def _mkfifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


@pytest.fixture
def vault() -> Iterator[tuple[Daemon, str]]:
    with running_daemon() as d:
        yield d, create_vault(d)


# -- 1. names that are not UTF-8 ------------------------------------------------


def test_cli_refuses_a_named_path_that_is_not_utf8_in_one_line(tmp_path: Path) -> None:
    bad = os.fsencode(tmp_path) + b"/bad\xff.md"
    with open(bad, "wb") as fh:
        fh.write(b"# Bad\n\nsome text\n")
    root = short_tmpdir()
    try:
        write_config(root / "h")
        r = run_cli(root / "h", "rag", "ingest", "personal", _fs(bad))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error[usage]:") and "not valid UTF-8" in r.stderr and "rename" in r.stderr
    assert "bad\\xff.md" in r.stderr


def test_walk_refuses_only_the_undecodable_name_and_ingests_the_rest(vault: tuple[Daemon, str]) -> None:
    d, vid = vault
    docs = d.home.parent / "docs"
    docs.mkdir()
    for i in range(10):
        (docs / f"good{i:02d}.md").write_text(f"# Good {i}\n\nthe walk keeps note number {i}\n")
    with open(os.fsencode(docs) + b"/bad\xff.md", "wb") as fh:
        fh.write(b"# Bad\n\nundecodable name\n")
    os.mkdir(os.fsencode(docs) + b"/sub\xfe")
    with open(os.fsencode(docs) + b"/sub\xfe/inner.md", "wb") as fh:
        fh.write(b"# Inner\n\nunder a directory with a bad name\n")
    r = run_cli(d.home, "--json", "rag", "ingest", vid, str(docs), "--recursive")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["added"] == 10
    refused = {x["path"]: x["message"] for x in out["refused"]}
    assert set(refused) == {f"{docs}/bad\\xff.md", f"{docs}/sub\\xfe"}, refused
    assert all("not valid UTF-8" in m and "rename" in m for m in refused.values())
    titles = {rec["title"] for rec in json.loads(run_cli(d.home, "--json", "memory", "list", vid).stdout)["records"]}
    assert titles == {f"Good {i}" for i in range(10)}
    # Human output: one line per refused file, the bytes escaped.
    r = run_cli(d.home, "rag", "ingest", vid, str(docs), "--recursive")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"refused: {docs}/bad\\xff.md: its name is not valid UTF-8" in r.stderr


def test_discover_refuses_an_undecodable_named_path(tmp_path: Path) -> None:
    files, problems = discover([Path(_fs(os.fsencode(tmp_path) + b"/x\xff.md"))], recursive=False)
    assert files == [] and [str(p) for p, _ in problems] == [f"{tmp_path}/x\\xff.md"]
    json.dumps([str(p) for p, _ in problems]).encode("utf-8")  # sendable


def test_a_symlink_to_an_undecodable_path_is_refused_and_the_rest_ingested(vault: tuple[Daemon, str]) -> None:
    """A good name whose real path is not UTF-8 (the card's source) used to fail its whole group."""
    d, vid = vault
    docs = d.home.parent / "docs"
    docs.mkdir()
    for i in range(5):
        (docs / f"good{i}.md").write_text(f"# Good {i}\n\nkept {i}\n")
    real = os.fsencode(docs) + b"/.real\xff"  # hidden, inside docs: a link leading out of docs is skipped unread
    os.mkdir(real)
    with open(real + b"/t.md", "wb") as fh:
        fh.write(b"# Target\n\nbehind a link\n")
    os.symlink(real + b"/t.md", docs / "link.md")
    os.symlink(real, d.home.parent / "dirlink")
    for args in ((str(docs), "--recursive"), (str(docs / "link.md"),), (str(d.home.parent / "dirlink"), "--recursive")):
        r = run_cli(d.home, "--json", "rag", "ingest", vid, *args)
        assert r.returncode == 1, r.stderr
        out = json.loads(r.stdout)
        assert len(out["refused"]) == 1, out["refused"]
        msg = out["refused"][0]["message"]
        assert "real\\xff/t.md" in msg and "not valid UTF-8" in msg and "rename" in msg, msg
    titles = {rec["title"] for rec in json.loads(run_cli(d.home, "--json", "memory", "list", vid).stdout)["records"]}
    assert titles == {f"Good {i}" for i in range(5)}


# -- 2. a mirror that answers a resume with the wrong range -----------------------


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # clients that hang up are part of the test


class _BadResumeMirror:
    """A real HTTP server that never completes a file and answers Range requests wrongly.

    ``mode``: "wrong-range" (206 with a Content-Range starting at 0), "always-206" (every request,
    with or without Range, gets the first 1000 bytes as 206 0-999) or "416" (Range refused).
    Requests without Range get the headers of the whole file, then 1000 bytes and a closed connection.
    """

    def __init__(self, mode: str, sizes: dict[str, int]) -> None:
        self.mode, self.sizes = mode, sizes
        self.requests: list[tuple[str, str | None]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

            def do_GET(self) -> None:
                rng = self.headers.get("Range")
                with outer.lock:
                    outer.requests.append((self.path, rng))
                size = next((s for p, s in outer.sizes.items() if self.path.endswith("/" + p)), None)
                if size is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                part = b"x" * 1000
                if rng and outer.mode == "416":
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if rng or outer.mode == "always-206":
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes 0-999/{size}")
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(part)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                self.wfile.write(part)
                self.wfile.flush()
                self.close_connection = True

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/m"

    def __enter__(self) -> _BadResumeMirror:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("mode", ["wrong-range", "always-206", "416"])
def test_wrong_resume_counts_against_the_retries(tmp_path: Path, mode: str) -> None:
    data = {"config.json": b"y" * 50_000}
    manifest_path = tmp_path / "manifest.json"
    manifest = json.loads(default_manifest_path().read_text())
    manifest["files"] = [{"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for p, b in data.items()]
    manifest_path.write_text(json.dumps(manifest))
    cfg = HttpConfig(retries=2, backoff_ms=10, connect_timeout_seconds=2, timeout_seconds=5, download_timeout_seconds=20)
    with _BadResumeMirror(mode, {p: len(b) for p, b in data.items()}) as mirror:
        with pytest.raises(HttpError) as ei:
            install_model(load_manifest(manifest_path), tmp_path / "model", base_url=mirror.url, http=cfg)
        n = len(mirror.requests)
    # first try, one wrong resume, then the whole file at most retries + 1 times (ended by the count, not a timeout)
    assert n <= 2 + cfg.retries + 1, mirror.requests
    msg = ei.value.message
    assert "\n" not in msg and "wrong part" in msg and "config.json" in msg and "download_url" in msg
    assert not (tmp_path / "model" / "config.json").exists()


def test_model_install_cli_ends_quickly_against_a_mirror_that_resumes_wrongly() -> None:
    sizes = {f.path: f.size for f in load_manifest(default_manifest_path()).files}
    root = short_tmpdir()
    home = root / "h"
    with _BadResumeMirror("wrong-range", sizes) as mirror:
        write_config(home, f'[embedding.local]\ndownload_url = "{mirror.url}"\n\n[http]\nretries = 2\nbackoff_ms = 10\n')
        try:
            r = run_cli(home, "rag", "model-install", timeout=120)
        finally:
            run_cli(home, "daemon", "stop")
            shutil.rmtree(root, ignore_errors=True)
        n = len(mirror.requests)
    assert r.returncode == 1, r.stderr
    last = r.stderr.splitlines()[-1]  # before it: plain progress lines (stderr is not a terminal)
    assert "Traceback" not in r.stderr and last.startswith("error[http_error]: "), r.stderr
    assert "wrong part" in last and "download_url" in last
    assert n <= 5, mirror.requests


# -- 3. FIFOs and other non-regular files ------------------------------------------


def test_memory_add_file_refuses_a_fifo_a_directory_and_a_device(vault: tuple[Daemon, str], tmp_path: Path) -> None:
    d, vid = vault
    fifo = _mkfifo(tmp_path / "pipe")
    for target, kind in ((fifo, "FIFO"), (tmp_path, "directory"), (Path("/dev/null"), "device")):
        r = run_cli(d.home, "memory", "add", vid, "--kind", "file", "--file", str(target), timeout=30)
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and kind in r.stderr and "not a regular file" in r.stderr, r.stderr
    assert d.call("memory.list", {"vault": vid})["records"] == []
    ok = tmp_path / "ok.bin"
    ok.write_bytes(b"\x00\x01 bytes")
    r = run_cli(d.home, "memory", "add", vid, "--kind", "file", "--file", str(ok))
    assert r.returncode == 0, r.stderr


def test_memory_add_file_refuses_an_oversized_file_without_reading_it(vault: tuple[Daemon, str], tmp_path: Path) -> None:
    d, vid = vault
    big = tmp_path / "big.bin"
    with big.open("wb") as fh:
        fh.truncate(6 * 1024 * 1024 + 1)
    r = run_cli(d.home, "memory", "add", vid, "--kind", "file", "--file", str(big))
    assert r.returncode == 2 and "larger than 6 MiB" in r.stderr, r.stderr


def test_ingest_never_opens_fifos_named_or_in_a_walk(vault: tuple[Daemon, str]) -> None:
    d, vid = vault
    docs = d.home.parent / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\nalpha text\n")
    fifo = _mkfifo(docs / "pipe.md")
    r = run_cli(d.home, "--json", "rag", "ingest", vid, str(docs), "--recursive", timeout=30)
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["added"] == 1
    assert [(x["path"], "FIFO" in x["message"]) for x in out["refused"]] == [(str(fifo), True)]
    r = run_cli(d.home, "--json", "rag", "ingest", vid, str(fifo), str(docs / "a.md"), timeout=30)
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["unchanged"] == 1 and [x["path"] for x in out["refused"]] == [str(fifo)]
    assert "FIFO" in out["refused"][0]["message"]


def test_read_document_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = _mkfifo(tmp_path / "p.md")
    with pytest.raises(DocumentRefused, match="FIFO"):
        read_document(fifo, 1024)
    with pytest.raises(DocumentRefused, match="directory"):
        read_document(tmp_path, 1024)


# -- 4. huge files are refused from their size --------------------------------------


def test_read_document_reads_at_most_the_limit(tmp_path: Path) -> None:
    f = tmp_path / "n.md"
    f.write_bytes(b"a" * 100)
    assert read_document(f, 100) == b"a" * 100
    with pytest.raises(DocumentRefused, match=r"over the document limit of 99 bytes: split it"):
        read_document(f, 99)
    with pytest.raises(FileNotFoundError):
        read_document(tmp_path / "missing.md", 99)


def _rchar(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs /proc/PID/io")
def test_a_huge_file_is_refused_without_being_read(vault: tuple[Daemon, str]) -> None:
    d, vid = vault
    assert d.proc is not None
    docs = d.home.parent / "docs"
    docs.mkdir()
    huge = docs / "huge.md"
    with huge.open("wb") as fh:  # sparse: 256 MiB on paper, nothing on disk
        fh.truncate(256 * 1024 * 1024)
    (docs / "small.md").write_text("# Small\n\nkept\n")
    before = _rchar(d.proc.pid)
    r = run_cli(d.home, "--json", "rag", "ingest", vid, str(docs), "--recursive")
    read = _rchar(d.proc.pid) - before
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["added"] == 1
    assert [x["path"] for x in out["refused"]] == [str(huge)]
    assert "256.0 MiB, over the document limit of 4.0 MiB" in out["refused"][0]["message"]
    assert read < 16 * 1024 * 1024, read  # the daemon did not read the 256 MiB


# -- 5. terminal escape sequences never reach the terminal raw ------------------------


def _no_controls(text: str) -> None:
    for c in CONTROLS:
        assert c not in text, repr(text)


def test_titles_and_bodies_are_shown_with_control_characters_escaped(vault: tuple[Daemon, str]) -> None:
    d, vid = vault
    body = "line one\n\x1b[31mred\x1b[0m\there\x9b2J\r\nend\x08"
    rid = d.call("memory.add", {"vault": vid, "title": ESC_TITLE, "body": body, "tags": ["t\x1b[1m"]})["id"]
    r = run_cli(d.home, "memory", "list", vid, env=WIDE)
    assert r.returncode == 0, r.stderr
    _no_controls(r.stdout + r.stderr)
    assert "T\\x1b]0;pwned\\x07\\x1b[2J" in r.stdout
    r = run_cli(d.home, "memory", "read", vid, rid)
    assert r.returncode == 0, r.stderr
    _no_controls(r.stdout + r.stderr)
    assert "T\\x1b]0;pwned" in r.stderr
    # (run_cli reads text with universal newlines: the CRLF kept as it was arrives as \n)
    assert r.stdout == "line one\n\\x1b[31mred\\x1b[0m\there\\x9b2J\nend\\x08\n"
    r = run_cli(d.home, "memory", "history", vid, rid)
    _no_controls(r.stdout + r.stderr)
    r = run_cli(d.home, "memory", "search", vid, "red")
    assert r.returncode == 0, r.stderr
    _no_controls(r.stdout + r.stderr)
    # --json keeps the exact text
    out = json.loads(run_cli(d.home, "--json", "memory", "read", vid, rid).stdout)
    assert out["title"] == ESC_TITLE and out["body"] == body


def test_an_ingested_front_matter_title_is_escaped_in_search_output(vault: tuple[Daemon, str]) -> None:
    d, vid = vault
    docs = d.home.parent / "docs"
    docs.mkdir()
    text = "---\ntitle: \"" + ESC_TITLE + "\"\n---\n\n" + "zebrafish habitat notes and more words here. " * 20 + "\n"
    (docs / "esc.md").write_text(text)
    r = run_cli(d.home, "rag", "ingest", vid, str(docs / "esc.md"))
    assert r.returncode == 0, r.stderr
    for args in (("rag", "search", vid, "zebrafish", "--mode", "bm25"), ("memory", "search", vid, "zebrafish"),
                 ("memory", "list", vid)):
        r = run_cli(d.home, *args, env=WIDE)
        assert r.returncode == 0, r.stderr
        _no_controls(r.stdout + r.stderr)
        assert "\\x1b]0;pwned" in r.stdout, r.stdout
    out = json.loads(run_cli(d.home, "--json", "rag", "search", vid, "zebrafish", "--mode", "bm25").stdout)
    assert out["results"][0]["title"] == ESC_TITLE


def test_error_messages_are_one_line_without_controls(vault: tuple[Daemon, str]) -> None:
    d, _ = vault
    r = run_cli(d.home, "memory", "list", "no\x1b[2Jsuch\nvault")
    assert r.returncode != 0
    _no_controls(r.stderr)
    assert r.stderr.count("\n") == 1, r.stderr


# -- 6. the --revision 0 message ------------------------------------------------------


def test_params_integer_names_only_the_bound_it_has() -> None:
    with pytest.raises(InvalidParams, match=r"^parameter revision must be at least 1$"):
        Params({"revision": 0}).integer("revision", None, lo=1)
    with pytest.raises(InvalidParams, match=r"^parameter n must be at most 5$"):
        Params({"n": 6}).integer("n", hi=5)
    with pytest.raises(InvalidParams, match=r"^parameter n must be between 1 and 5$"):
        Params({"n": 0}).integer("n", lo=1, hi=5)


def test_read_revision_zero_says_at_least_one(vault: tuple[Daemon, str]) -> None:
    d, vid = vault
    rid = d.call("memory.add", {"vault": vid, "body": "x"})["id"]
    r = run_cli(d.home, "memory", "read", vid, rid, "--revision", "0")
    assert r.returncode == 2, r.stderr
    assert "must be at least 1" in r.stderr and "None" not in r.stderr, r.stderr


def test_safe_text_escapes_every_control_but_line_structure() -> None:
    from memories_cli.state import safe_text

    assert safe_text("a\rb\r\nc\td\x1b\x7f\x85\u200b") == "a\\x0db\\x0d\\x0ac\\x09d\\x1b\\x7f\\x85\u200b"
    assert safe_text("a\rb\r\nc\td\x0c\x00", multiline=True) == "a\\x0db\r\nc\td\\x0c\\x00"
