"""Config edits that cannot take the daemon down (issue 29): an unknown key is answered with the
closest valid keys (never the whole table), an invalid edit is announced while the daemon runs,
`daemon restart` refuses a broken file and leaves the running daemon answering.

Real daemons started by the real CLI in subprocesses; the wording itself through the daemon's parser.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from memoriesd.config import parse_config
from memoriesd.errors import ConfigError
from memoriesd.server.config_watch import ConfigWatch, restart_notice

from .conftest import REPO, run_cli

PASS = "correct horse"


def message_of(toml: str) -> str:
    with pytest.raises(ConfigError) as ei:
        parse_config(tomllib.loads(toml), Path("/tmp"))
    return ei.value.message


@pytest.mark.parametrize(
    "toml,expected",
    [
        # a typo in its own table
        (
            "[daemon]\nauto_lock_minute = 5\n",
            "unknown config key daemon.auto_lock_minute: [daemon] has no key "
            "`auto_lock_minute`; did you mean `auto_lock_minutes`?",
        ),
        ("[http]\nretry = 3\n", "did you mean `retries`?"),
        (
            '[[watch.folder]]\nvault = "v"\npath = "/x"\nprun = true\n',
            "[[watch.folder]] number 1 has no key `prun`; did you mean `prune`?",
        ),
        # an old spelling names its new place (docs: the deprecated-key map)
        ('[embedding]\nlocal_model_dir = "/m"\n', "did you mean `model_dir` in [embedding.local]?"),
        ('[embedding.local]\nlocal_model_dir = "/m"\n', "did you mean `model_dir`?"),
        ('[rag]\nlocal_model_dirr = "/m"\n', "[rag] is gone; did you mean `model_dir` in [embedding.local]?"),
        ("[rag.cache]\nmax_fragment = 3\n", "did you mean `max_fragments` in [index]?"),
        # a removed key says why it is gone
        ("[search]\nrrf_k = 30\n", "unknown config key search.rrf_k: it is gone: a research knob"),
        # a line under the wrong header, or above every header
        ("[search]\nauto_lock_minutes = 3\n", "did you mean `auto_lock_minutes` in [daemon]?"),
        (
            '[embedding]\nurl = "https://x.example"\n',
            "did you mean `url` in [embedding.service], [generation] or [rerank]?",
        ),
        (
            "auto_lock_minutes = 3\n",
            "`auto_lock_minutes` is written above every [table] header; did you mean "
            "`auto_lock_minutes` in [daemon]?",
        ),
        # a misspelt table
        (
            "[serach]\ncandidates = 20\n",
            "unknown config key serach: there is no [serach] table; did you mean [search]?",
        ),
        ("[embedding.locl]\nthreads = 2\n", "did you mean [embedding.local]?"),
        # a value of a fixed set
        (
            '[daemon]\nlog_level = "warn"\n',
            "allowed is one of 'debug', 'info', 'warning', 'error' (did you mean 'warning'?)",
        ),
    ],
)
def test_an_unknown_key_is_answered_with_its_table_and_the_closest_valid_key(
    toml: str, expected: str
) -> None:
    msg = message_of(toml)
    assert expected in msg and "\n" not in msg, msg


def test_an_unknown_key_never_lists_the_table_and_a_stray_word_gets_the_reference() -> None:
    msg = message_of("[daemon]\nbogus = 1\n")
    assert (
        msg
        == "unknown config key daemon.bogus: [daemon] has no key `bogus` (docs/config.md lists every key and its table)"
    )
    for toml in ("[daemon]\nmax_conection = 3\n", "[vault]\nkdf_iteration = 2\n", "[index]\nmax_mib = 3\n"):
        msg = message_of(toml)
        assert len(re.findall(r"`[a-z_]+`", msg.split(";", 1)[-1])) <= 3, msg  # at most three candidates


@pytest.fixture
def cli_home(home: Path) -> Iterator[Path]:
    """A home whose daemon the CLI starts (and restarts); stopped after the test."""
    yield home
    run_cli(home, "daemon", "stop", timeout=60)


def test_a_typo_while_the_daemon_runs_is_announced_and_restart_refuses_it_until_it_is_fixed(
    cli_home: Path,
) -> None:
    home, config = cli_home, cli_home / "config.toml"
    good = config.read_text()
    r = run_cli(home, "vault", "create", "personal", "--passphrase-stdin", input=PASS + "\n")
    assert r.returncode == 0, r.stderr
    pid = json.loads(run_cli(home, "--json", "daemon", "status").stdout)["pid"]
    config.write_text(good + "\n[daemon]\nauto_lock_minute = 30\n")
    # Every reply says the edit is invalid, why, and the key meant; one line, once per command.
    r = run_cli(home, "vault", "list")
    assert r.returncode == 0
    (line,) = [ln for ln in r.stderr.splitlines() if "config.toml" in ln]
    assert (
        f"config.toml ({config}) was edited and is invalid" in line
        and "did you mean `auto_lock_minutes`?" in line
    )
    assert "keeps running with the settings it started with" in line
    status = json.loads(run_cli(home, "--json", "daemon", "status").stdout)
    assert status["restart_pending"] is True and "did you mean `auto_lock_minutes`?" in status["config_error"]
    # The restart refuses before it stops anything: one line with the cause and the fix, non-zero exit.
    r = run_cli(home, "daemon", "restart")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(
        "error[config_invalid]: config.toml is invalid: unknown config key daemon.auto_lock_minute"
    )
    assert "did you mean `auto_lock_minutes`?" in r.stderr and f"(config file {config})" in r.stderr
    assert "was not restarted" in r.stderr and f"memories --home {home} daemon restart" in r.stderr
    # The daemon still answers, the same process, the vault still unlocked.
    status = json.loads(run_cli(home, "--json", "daemon", "status").stdout)
    assert status["pid"] == pid and len(status["unlocked"]) == 1
    # Vault processes started after the edit run on the daemon's settings (not on the broken file):
    # a new vault, a lock and an unlock all work, and their replies carry the same notice.
    r = run_cli(home, "vault", "create", "second", "--passphrase-stdin", input=PASS + "\n")
    assert r.returncode == 0 and "did you mean `auto_lock_minutes`?" in r.stderr, r.stderr
    for name in ("personal", "second"):
        assert run_cli(home, "vault", "lock", name).returncode == 0
        r = run_cli(home, "vault", "unlock", name, "--passphrase-stdin", input=PASS + "\n")
        assert r.returncode == 0, r.stderr
    r = run_cli(home, "memory", "add", "second", "added while the file is broken", "--title", "Kept")
    assert r.returncode == 0 and "was edited and is invalid" in r.stderr, (
        r.stderr
    )  # said by the vault's own process
    # A valid edit: today's notice; the restart applies it.
    config.write_text(good + "\n[daemon]\nauto_lock_minutes = 30\n")
    r = run_cli(home, "vault", "list")
    assert r.stderr.count(restart_notice(config)) == 1 and "invalid" not in r.stderr, r.stderr
    r = run_cli(home, "--json", "daemon", "restart")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["stopped_pid"] == pid and out["pid"] != pid
    assert sorted(v["name"] for v in out["locked"]) == ["personal", "second"]
    status = json.loads(run_cli(home, "--json", "daemon", "status").stdout)
    assert status["restart_pending"] is False and status["config_error"] is None


def test_a_broken_file_with_no_daemon_running_is_one_line_from_start_restart_and_config_show(
    cli_home: Path,
) -> None:
    home, config = cli_home, cli_home / "config.toml"
    config.write_text(config.read_text() + '\n[embedding]\nlocal_model_dir = "/models/mini"\n')
    for args in (("daemon", "start"), ("daemon", "restart"), ("config", "show"), ("vault", "list")):
        r = run_cli(home, *args)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, (args, r.stderr)
        assert "unknown config key embedding.local_model_dir" in r.stderr, (args, r.stderr)
        assert "did you mean `model_dir` in [embedding.local]?" in r.stderr and str(config) in r.stderr, (
            args,
            r.stderr,
        )
    assert "cannot start with it" in run_cli(home, "daemon", "restart").stderr
    assert run_cli(home, "daemon", "status").returncode == 6


def test_an_invalid_edit_is_announced_even_in_the_tables_applied_live(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[vault]\nkeep_revisions = 5\n")
    watch = ConfigWatch(path)
    assert watch.notices() == [] and watch.problem() is None
    path.write_text(
        '[vault]\nkeep_revisions = 5\n[[watch.folder]]\nvault = "v"\npath = "/x"\nrecursiv = true\n'
    )
    assert not watch.changed()  # watch tables apply live: no restart needed ...
    (notice,) = watch.notices()  # ... but a restart would refuse the file: said
    assert "did you mean `recursive`?" in notice and "\n" not in notice
    path.write_text("[vault\nkeep_revisions = 6\n")
    (notice,) = watch.notices()
    assert "is not valid TOML" in notice
    path.write_text("[vault]\nkeep_revisions = 6\n")
    assert watch.notices() == [restart_notice(path)] and watch.problem() is None


def test_restart_validates_the_file_without_heavy_imports() -> None:
    code = (
        "import sys, memories_cli.vault_cmds, memoriesd.config\n"
        "from memoriesd.config import load_config\n"
        "from memoriesd.config.suggest import catalogue\n"
        "catalogue()\n"
        "print([n for n in ('numpy', 'onnxruntime', 'jieba', 'tokenizers', 'httpx') if n in sys.modules])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr
