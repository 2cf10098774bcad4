"""A built wheel carries everything the installed programs read at run time."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _tracked_copy(dest: Path) -> Path:
    """The repository's tracked files (as a clean clone has them), copied so the build writes nothing here."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, names.decode().split("\0")):
        src = REPO / name
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(src.readlink())
        elif src.is_file():
            shutil.copy2(src, target)
    return dest


def test_wheel_carries_the_model_manifest_the_skill_and_type_marker(tmp_path: Path) -> None:
    tree = _tracked_copy(tmp_path / "src")
    out = tmp_path / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(tree)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = out.glob("memories-*.whl")
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(unpacked)
    assert {"memoriesd/data/embeddinggemma.json", "memories_cli/skill/SKILL.md", "memoriesd/py.typed"} <= names
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "models/"))]
    packaged = unpacked / "memoriesd" / "data" / "embeddinggemma.json"
    assert packaged.read_bytes() == (REPO / "models" / "embeddinggemma.json").read_bytes()
    # An installed copy (no checkout around it) finds and accepts its own manifest.
    code = ("from memoriesd.embed.install import default_manifest_path, load_manifest; "
            "p = default_manifest_path(); m = load_manifest(p); print(p); print(len(m.files))")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(unpacked), "PATH": ""},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    where, count = run.stdout.split()
    assert Path(where) == packaged
    assert int(count) == 6
