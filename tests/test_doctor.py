"""`memories doctor`: a broken set-up explained check by check, a healthy one passing, never a daemon started.

Real homes on disk, the real CLI in subprocesses, a real daemon for the checks that ask it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memories_cli.doctor_checks import _manifest

from .conftest import create_vault, run_cli, running_daemon, short_tmpdir, write_config

PASS = "correct horse"


@pytest.fixture
def home() -> Iterator[Path]:
    root = short_tmpdir("dr")
    h = root / "h"
    write_config(h)
    (h / "config.toml").chmod(0o600)
    yield h
    shutil.rmtree(root, ignore_errors=True)


def doctor(home: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    r = run_cli(home, "--json", "doctor", *args, env=env)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def by_check(report: dict[str, Any], check: str) -> list[dict[str, Any]]:
    return [c for c in report["checks"] if c["check"] == check]


def sparse_pinned_model(home: Path) -> Path:
    """The pinned model's files with their exact sizes but no content (sparse): sizes match, digests do not."""
    manifest = _manifest()
    assert manifest is not None
    d = home / "models" / "embeddinggemma"
    for f in manifest["files"]:
        p = d / f["path"]
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "wb") as fh:
            fh.truncate(f["size"])
    return d


def test_a_broken_home_names_each_problem_with_its_fix_and_never_starts_the_daemon(home: Path) -> None:
    (home / "config.toml").write_text("[search]\ncandidates = 50\n")
    (home / "vaults").mkdir(mode=0o755)
    (home / "vaults" / "stray").write_text("x")
    os.chmod(home / "vaults" / "stray", 0o644)
    model = sparse_pinned_model(home)
    (model / "tokenizer.json").unlink()
    env = {"HTTPS_PROXY": "ftp://proxy.example:21", "https_proxy": ""}
    code, report = doctor(home, env=env)
    assert code == 1 and report["needs_action"] is True
    (perm,) = by_check(report, "home")
    assert perm["status"] == "action" and "chmod -R go-rwx" in perm["fix"]
    (config,) = by_check(report, "config")
    assert config["status"] == "ok"
    (model_check,) = by_check(report, "model")
    assert model_check["status"] == "action" and "tokenizer.json" in model_check["message"]
    assert "model-install" in model_check["fix"]
    (daemon,) = by_check(report, "daemon")
    assert daemon["status"] == "info" and "not running" in daemon["message"]
    assert all(c["status"] != "action" for c in by_check(report, "keyring"))  # no keyring: a normal state
    assert by_check(report, "caps")[0]["message"].startswith("skipped")
    assert any(c["status"] == "action" and "ftp" in c["message"] for c in by_check(report, "proxy"))
    assert not (home / "run" / "memoriesd.sock").exists() and not (home / "run" / "memoriesd.pid").exists()
    # The text form: one line per finding, its fix below it, the count last.
    r = run_cli(home, "doctor", env=env)
    assert r.returncode == 1 and "fix: chmod -R go-rwx" in r.stdout and r.stdout.rstrip().endswith("need action.")


def test_an_invalid_config_is_named_first_and_alone_not_its_cascade_of_model_findings(home: Path) -> None:
    # The case: a typo leaves model_dir unread, so the model "is missing" from the default place.
    model = home.parent / "mini"
    model.mkdir()
    (home / "config.toml").write_text(f'[embedding]\nsource = "local"\n[embedding.local]\nlocal_model_dir = "{model}"\n')
    code, report = doctor(home)
    assert code == 1
    actions = [c for c in report["checks"] if c["status"] == "action"]
    assert [c["check"] for c in actions] == ["config"], actions
    (config,) = actions
    assert [c["check"] for c in report["checks"]].index("config") == 1  # right after the home, before the daemon
    assert "unknown config key embedding.local.local_model_dir" in config["message"]
    assert "did you mean `model_dir`?" in config["message"] and str(home / "config.toml") in config["message"]
    for check in ("model", "caps", "proxy"):
        (skipped,) = by_check(report, check)
        assert skipped["status"] == "info" and skipped["message"].startswith("not checked"), skipped
    assert "model-install" not in json.dumps(report)  # no download suggested for a file that was never read
    (daemon,) = by_check(report, "daemon")
    assert "cannot start until config.toml is valid" in daemon["message"] and not daemon["fix"]


def test_an_invalid_edit_under_a_running_daemon_is_one_finding_and_no_restart_advice() -> None:
    with running_daemon() as d:
        (d.home / "config.toml").chmod(0o600)
        cfg = d.home / "config.toml"
        cfg.write_text(cfg.read_text() + "\n[daemon]\nauto_lock_minute = 5\n")
        code, report = doctor(d.home)
        actions = [c for c in report["checks"] if c["status"] == "action"]
        assert code == 1 and [c["check"] for c in actions] == ["config"], actions
        assert "did you mean `auto_lock_minutes`?" in actions[0]["message"] and "daemon restart" in actions[0]["fix"]
        (daemon,) = by_check(report, "daemon")
        assert daemon["status"] == "ok" and "answers" in daemon["message"]


def test_model_sizes_are_checked_by_default_and_digests_with_deep(home: Path) -> None:
    sparse_pinned_model(home)
    code, report = doctor(home)
    (model,) = by_check(report, "model")
    assert model["status"] == "ok" and "sizes" in model["message"], model
    code, report = doctor(home, "--deep")
    (model,) = by_check(report, "model")
    assert code == 1 and model["status"] == "action" and "SHA-256" in model["message"]


def test_proxy_routes_follow_no_proxy_for_each_configured_endpoint(home: Path) -> None:
    (home / "config.toml").write_text(
        '[embedding.service]\nprotocol = "compatible"\nurl = "https://embed.internal.example/v1/embeddings"\nmodel = "m"\n'
    )
    env = {"HTTPS_PROXY": "http://proxy.example:3128", "https_proxy": "", "NO_PROXY": ".internal.example", "no_proxy": ""}
    _, report = doctor(home, env=env)
    routes = {c["message"].split(" ", 1)[0]: c["message"] for c in by_check(report, "proxy") if c["status"] == "ok"}
    assert routes["[embedding.service]"].endswith(": direct")
    assert routes["model"].endswith("via http://proxy.example:3128")


def test_a_healthy_setup_passes_and_caps_restart_and_version_are_asked_of_the_running_daemon() -> None:
    with running_daemon("[index]\nmax_fragments = 3\n") as d:
        (d.home / "config.toml").chmod(0o600)
        small = create_vault(d, "small", PASS)
        d.call("memory.add", {"vault": small, "title": "One", "body": "one short note"})
        code, report = doctor(d.home)
        assert code == 0, report
        (daemon,) = by_check(report, "daemon")
        assert daemon["status"] == "ok" and "0." in daemon["message"]
        assert [c["status"] for c in by_check(report, "caps")] == ["ok"]
        big = create_vault(d, "big", PASS)
        for i in range(5):
            d.call("memory.add", {"vault": big, "title": f"Note {i}", "body": f"note number {i}"})
        code, report = doctor(d.home)
        over = [c for c in by_check(report, "caps") if c["status"] == "action"]
        assert code == 1 and len(over) == 1 and "big" in over[0]["message"] and "max_fragments" in over[0]["message"]
        assert "daemon restart" in over[0]["fix"]
        cfg = d.home / "config.toml"
        cfg.write_text(cfg.read_text() + "\n[search]\ncandidates = 50\n")
        _, report = doctor(d.home)
        assert any(c["status"] == "action" and "daemon restart" in (c["fix"] or "") for c in by_check(report, "daemon"))
