"""Sync transports: one contract, run against a folder and against the real ``rclone`` program talking
to a real ``rclone serve webdav`` and ``rclone serve sftp`` on 127.0.0.1; and what each failure says."""

from __future__ import annotations

import os
import re
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from memoriesd.config import Config, SyncConfig
from memoriesd.errors import ConfigError, UsageError, exit_code_for
from memoriesd.sync.rclone import summarize
from memoriesd.sync.transport import (
    REGISTRY,
    FolderTransport,
    RcloneTransport,
    TargetError,
    Transport,
    parse_target,
)
from tests.support import rclone_serve
from tests.support.rclone_serve import RCLONE_MISSING, RcloneServer

NAME = "0123456789abcdef0123456789abcdef"  # the engine's names: 32 lower-case hex characters
HEADER = "memories-sync.json"
needs_rclone = pytest.mark.skipif(rclone_serve.rclone_program() is None, reason=RCLONE_MISSING)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RcloneServer]]:
    """One webdav and one sftp server for the module's contract tests (started on first use)."""
    started: dict[str, RcloneServer] = {}
    base = tmp_path_factory.mktemp("rclone")

    class Lazy(dict[str, RcloneServer]):
        def __missing__(self, kind: str) -> RcloneServer:
            self[kind] = started[kind] = rclone_serve.start(kind, base / kind / "served", base / kind)
            return self[kind]

    yield Lazy()
    for server in started.values():
        server.stop()


class Target:
    """A transport under test and the folder where its files really land (to look behind its back)."""

    def __init__(self, transport: Transport, disk: Path) -> None:
        self.t = transport
        self.disk = disk


@pytest.fixture(
    params=["folder", pytest.param("webdav", marks=needs_rclone), pytest.param("sftp", marks=needs_rclone)]
)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    kind = request.param
    if kind == "folder":
        t = parse_target(str(tmp_path / "target"))
        t.ensure()
        return Target(t, tmp_path / "target")
    server: RcloneServer = request.getfixturevalue("servers")[kind]
    sub = request.node.name.replace("[", "-").replace("]", "")
    t = parse_target(server.target(f"vaults/{sub}"), rclone_config=str(server.config))
    t.ensure()
    return Target(t, server.root / "vaults" / sub)


# -- the contract -----------------------------------------------------------------------------------


def test_written_files_read_back_list_with_their_sizes_and_delete(target: Target) -> None:
    t = target.t
    assert t.list() == []
    blob = os.urandom(300_000)  # above rclone's 100 KiB streaming cutoff
    t.write(NAME, blob)
    t.write(HEADER, b'{"v": 1}')
    assert [(e.name, e.size) for e in t.list()] == [(NAME, len(blob)), (HEADER, 8)]
    assert t.read(NAME) == blob and t.read(HEADER) == b'{"v": 1}'
    assert (target.disk / NAME).read_bytes() == blob  # really there, under that name
    t.delete(NAME)
    assert [e.name for e in t.list()] == [HEADER]
    assert t.read(NAME) is None and not (target.disk / NAME).exists()


def test_a_write_replaces_the_whole_previous_file(target: Target) -> None:
    target.t.write(NAME, b"x" * 100_000)
    target.t.write(NAME, b"short")
    assert target.t.read(NAME) == b"short"
    assert [(e.name, e.size) for e in target.t.list()] == [(NAME, 5)]


def test_an_empty_file_is_a_file(target: Target) -> None:
    target.t.write(NAME, b"")
    assert target.t.read(NAME) == b"" and [(e.name, e.size) for e in target.t.list()] == [(NAME, 0)]


def test_a_missing_file_reads_as_none_and_deleting_it_is_fine(target: Target) -> None:
    assert target.t.read(NAME) is None
    target.t.delete(NAME)
    target.t.delete(NAME)
    assert target.t.list() == []


def test_the_listing_holds_plain_files_directly_in_the_root_only(target: Target) -> None:
    (target.disk / "sub").mkdir()
    (target.disk / "sub" / NAME).write_bytes(b"nested")
    (target.disk / ".syncthing.x.tmp").write_bytes(b"foreign")
    target.t.write(NAME, b"top")
    names = [e.name for e in target.t.list()]
    assert names == [".syncthing.x.tmp", NAME]  # any name (the engine filters), no folder, nothing below
    assert target.t.read(NAME) == b"top"


def test_names_that_could_leave_the_root_are_refused_by_every_operation(target: Target) -> None:
    for bad in ("", ".", "..", "../x", "a/b", "/etc/passwd", "-rf", "--config=x", "a\nb", "a*", "x" * 201):
        for op in (
            lambda n: target.t.read(n),
            lambda n: target.t.write(n, b"x"),
            lambda n: target.t.delete(n),
        ):
            with pytest.raises(ValueError):
                op(bad)
    assert not (target.disk.parent / "x").exists() and target.t.list() == []


# -- the folder transport ---------------------------------------------------------------------------


def test_a_folder_write_never_shows_a_partial_file_under_its_complete_name(tmp_path: Path) -> None:
    t = FolderTransport(tmp_path / "t")
    t.ensure()
    size = 4 << 20
    seen: list[tuple[str, int]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.extend((e.name, e.size) for e in t.list())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(8):
            t.write(NAME, bytes([i]) * size)
    finally:
        done.set()
        watcher.join()
    assert seen, "the watcher listed nothing"
    tmp = re.compile(r"\." + NAME + r"\.[0-9a-f]{12}\.tmp")
    for name, n in seen:
        assert (name == NAME and n == size) or tmp.fullmatch(name), (name, n)
    assert [e.name for e in t.list()] == [NAME]  # no temporary file left behind
    assert t.read(NAME) == bytes([7]) * size


def test_folder_files_are_0600_and_a_created_folder_0700(tmp_path: Path) -> None:
    t = FolderTransport(tmp_path / "deep" / "target")
    t.ensure()
    t.write(NAME, b"sealed")
    assert stat.S_IMODE((tmp_path / "deep" / "target").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "deep" / "target" / NAME).stat().st_mode) == 0o600
    t.ensure()  # again: nothing changes
    assert t.read(NAME) == b"sealed"


def test_a_missing_sync_folder_is_reported_and_never_recreated_behind_the_users_back(tmp_path: Path) -> None:
    root = tmp_path / "usb" / "memories"
    t = parse_target(str(root))
    for op in (t.list, lambda: t.read(NAME), lambda: t.write(NAME, b"x"), lambda: t.delete(NAME)):
        with pytest.raises(TargetError) as ei:
            op()
        assert ei.value.code == "sync_target" and "\n" not in ei.value.message
        assert ei.value.message.startswith(f"the sync folder {root} is missing: is the drive mounted?")
    assert not root.exists()  # a write did not make a fresh empty target where the drive should be
    t.ensure()
    assert t.list() == []


def test_a_file_where_the_sync_folder_should_be_is_named(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("not a folder")
    t = parse_target(str(tmp_path / "f"))
    for op in (t.ensure, t.list, lambda: t.write(NAME, b"x")):
        with pytest.raises(TargetError, match="is not a folder"):
            op()


def test_a_symbolic_link_in_the_folder_is_not_one_of_its_files(tmp_path: Path) -> None:
    t = FolderTransport(tmp_path / "t")
    t.ensure()
    (tmp_path / "secret").write_bytes(b"outside")
    (tmp_path / "t" / NAME).symlink_to(tmp_path / "secret")
    assert t.list() == [] and t.read(NAME) is None


# -- rclone failures --------------------------------------------------------------------------------


@needs_rclone
def test_a_stopped_rclone_server_is_a_one_line_target_error(tmp_path: Path) -> None:
    server = rclone_serve.start("webdav", tmp_path / "served", tmp_path / "work")
    try:
        t = parse_target(server.target("v"), rclone_config=str(server.config))
        t.ensure()
        t.write(NAME, b"sealed")
    finally:
        server.stop()
    ops = (t.list, lambda: t.read(NAME), lambda: t.write(NAME, b"x"), lambda: t.delete(NAME), t.ensure)
    for op in ops:
        with pytest.raises(TargetError) as ei:
            op()
        msg = ei.value.message
        assert ei.value.code == "sync_target" and exit_code_for(ei.value.code) == 6
        assert (
            "\n" not in msg
            and "rclone:dav:v" in msg
            and "connection refused" in msg
            and "rclone lsd dav:" in msg
        )
    assert (tmp_path / "served" / "v" / NAME).read_bytes() == b"sealed"


@needs_rclone
def test_a_server_that_never_answers_stops_rclone_at_the_deadline(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        conf = tmp_path / "r.conf"
        conf.write_text(f"[dav]\ntype = webdav\nurl = http://127.0.0.1:{port}/\nvendor = other\n")
        t = RcloneTransport("dav:v", config_file=str(conf), timeout=2)
        with pytest.raises(TargetError, match=r"rclone did not finish listing rclone:dav:v within 2 s"):
            t.list()


@needs_rclone
def test_a_remote_missing_from_rclones_config_says_to_add_it(tmp_path: Path) -> None:
    conf = tmp_path / "empty.conf"
    conf.write_text("")
    t = parse_target("rclone:work-s3:bucket/memories", rclone_config=str(conf))
    with pytest.raises(TargetError) as ei:
        t.list()
    assert ei.value.message == (
        f"the rclone remote 'work-s3' is not in {conf}: add it with `rclone config` "
        "(or point [sync] rclone_config at the file that has it)"
    )


@needs_rclone
def test_a_missing_rclone_folder_is_reported_by_list_and_made_by_ensure(
    servers: dict[str, RcloneServer],
) -> None:
    server = servers["webdav"]
    t = parse_target(server.target("not/yet"), rclone_config=str(server.config))
    with pytest.raises(TargetError, match="is missing"):
        t.list()
    t.ensure()
    assert t.list() == [] and (server.root / "not" / "yet").is_dir()


def test_without_rclone_installed_the_error_says_how_to_install_it(tmp_path: Path) -> None:
    t = parse_target("rclone:dav:v", rclone_program=str(tmp_path / "bin" / "rclone"))
    for op in (t.list, lambda: t.read(NAME), lambda: t.write(NAME, b"x"), lambda: t.delete(NAME), t.ensure):
        with pytest.raises(TargetError) as ei:
            op()
        assert ei.value.message == (
            f"the rclone program {tmp_path / 'bin' / 'rclone'} does not exist: install it "
            "(https://rclone.org/install/) or use a folder target, or fix [sync] rclone_program"
        )
    t = parse_target("rclone:dav:v", rclone_program="rclone-not-installed-here")
    with pytest.raises(TargetError) as ei:
        t.list()
    assert (
        ei.value.message
        == "rclone is not installed: install it (https://rclone.org/install/) or use a folder target"
    )


def test_rclone_messages_are_one_line_without_a_urls_credentials() -> None:
    stderr = (
        b"2026/12/05 09:27:41 ERROR : x: Failed to copy\n"
        b'2026/12/05 09:27:41 Failed to rcat: Put "https://alice:s3cret@dav.example/v/x": dial tcp: refused\n'
    )
    assert summarize(stderr) == 'Failed to rcat: Put "https://dav.example/v/x": dial tcp: refused'
    assert summarize(b"") == "no message" and len(summarize(b"e" * 5000)) == 240


# -- parsing what the user typed --------------------------------------------------------------------


def test_targets_parse_as_folders_or_rclone_remotes(tmp_path: Path) -> None:
    folder = parse_target(f"  {tmp_path}/a/../sync  ")
    assert isinstance(folder, FolderTransport) and folder.scheme == "folder"
    assert folder.describe() == f"{tmp_path}/sync"
    home = parse_target("~/Sync/memories")
    assert home.describe() == str(Path.home() / "Sync" / "memories")
    r = parse_target(
        "rclone:my s3:bucket/memories/", config=Config(sync=SyncConfig("/opt/rclone", "/etc/r.conf", 30))
    )
    assert isinstance(r, RcloneTransport) and r.scheme == "rclone"
    assert (r.describe(), r.program, r.config_file, r.timeout) == (
        "rclone:my s3:bucket/memories",
        "/opt/rclone",
        "/etc/r.conf",
        30,
    )
    assert parse_target("rclone:b2:", config=SyncConfig()).describe() == "rclone:b2:"
    assert set(REGISTRY) == {"rclone:"}


@pytest.mark.parametrize(
    ("text", "error", "says"),
    [
        ("", UsageError, "the sync target is empty"),
        ("notes/sync", UsageError, "is not understood: write an absolute folder path"),
        ("s3:bucket", UsageError, "rclone:REMOTE:PATH"),
        ("rclone:bucket", UsageError, "rclone:bucket names no remote: write rclone:REMOTE:PATH"),
        ("rclone::s3,access_key_id=AKIA:bucket", UsageError, "is an on-the-fly rclone remote"),
        ("rclone:-x:path", UsageError, "names no remote"),
    ],
)
def test_a_target_that_is_neither_form_says_how_to_write_one(
    text: str, error: type[Exception], says: str
) -> None:
    # Usage errors: what the user typed is wrong, nothing about a target's reachability.
    with pytest.raises(error, match=re.escape(says)) as ei:
        parse_target(text)
    assert "AKIA" not in str(ei.value)


def test_sync_config_keeps_a_program_name_and_resolves_paths_next_to_the_file(tmp_path: Path) -> None:
    from memoriesd.config import parse_config

    cfg = parse_config({"sync": {"rclone_config": "rclone.conf", "rclone_timeout_seconds": 5}}, tmp_path)
    assert cfg.sync == SyncConfig("rclone", str(tmp_path / "rclone.conf"), 5.0)
    assert parse_config({"sync": {"rclone_program": "bin/rclone"}}, tmp_path).sync.rclone_program == str(
        tmp_path / "bin" / "rclone"
    )
    assert (
        parse_config({"sync": {"rclone_program": "rclone-beta"}}, tmp_path).sync.rclone_program
        == "rclone-beta"
    )
    with pytest.raises(ConfigError, match="sync.rclone_timeout_seconds"):
        parse_config({"sync": {"rclone_timeout_seconds": 0}}, tmp_path)
    with pytest.raises(ConfigError, match="sync.rclone_program"):
        parse_config({"sync": {"rclone_program": " "}}, tmp_path)
