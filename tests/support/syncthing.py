"""Two real Syncthing instances on 127.0.0.1 sharing one folder: the folder-sync tool the sync tests
run a target through (issue 30, item 7b).

Each instance has its own ``--home`` (keys, config, database), its GUI/REST API on a random loopback
port with its own API key, and listens for the sync protocol on ``tcp://127.0.0.1:PORT``. Everything
that would leave the machine or change it is off: global and local discovery, relays, NAT traversal,
STUN, usage and crash reporting, upgrades, the browser. The two are introduced by device id and
explicit address and share one send-receive folder (path A on the first, path B on the second) with
the file-system watcher on (1 s delay) and a short rescan interval.

Usage::

    with SyncthingPair(workdir, a, b) as pair:      # started and connected
        (a / "x").write_bytes(b"...")
        pair.scan()                                   # optional: the watcher sees it within ~1 s anyway
        pair.wait_until(lambda: (b / "x").exists(), what="x on B")
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: One line for a skip when Syncthing is absent (scripts/test.sh installs it where it can).
SYNCTHING_MISSING = "syncthing is not installed (apt-get install syncthing): the Syncthing sync tests skip"
#: Deadlines are generous: the machine running the suite is loaded.
DEADLINE = 120.0
FOLDER_ID = "memories-sync"


def syncthing_program() -> str | None:
    return shutil.which("syncthing")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    predicate: Callable[[], bool], timeout: float = DEADLINE, what: str = "a condition", step: float = 0.1
) -> None:
    """Poll ``predicate`` until it holds; TimeoutError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s")
        time.sleep(step)


def _set(parent: ET.Element, tag: str, text: str) -> None:
    node = parent.find(tag)
    if node is None:
        node = ET.SubElement(parent, tag)
    node.text = text


# Options of config.xml's <options>: nothing leaves 127.0.0.1, nothing upgrades, nothing phones home.
_OPTIONS = {
    "globalAnnounceEnabled": "false",
    "localAnnounceEnabled": "false",
    "relaysEnabled": "false",
    "natEnabled": "false",
    "announceLANAddresses": "false",
    "stunKeepaliveStartS": "0",  # 0 = no STUN
    "stunServer": "",
    "urAccepted": "-1",  # usage reporting declined (and never asked)
    "urSeen": "3",
    "crashReportingEnabled": "false",
    "autoUpgradeIntervalH": "0",
    "startBrowser": "false",
    "reconnectionIntervalS": "1",  # the peer may start later: dial again soon
    "setLowPriority": "false",
    "minHomeDiskFree": "0",
}


@dataclass
class Instance:
    """One running Syncthing."""

    name: str
    home: Path
    folder: Path
    device_id: str
    api_key: str
    gui_port: int
    listen_port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.listen_port}"

    def rest(self, method: str, path: str, body: object = None, timeout: float = 30.0) -> Any:
        """One REST API call (JSON in, JSON out; None for an empty reply)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.gui_port}{path}", data=data, method=method)
        req.add_header("X-API-Key", self.api_key)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback only
            raw = resp.read()
        return json.loads(raw) if raw.strip() else None

    def answers(self) -> bool:
        try:
            self.rest("GET", "/rest/system/ping", timeout=2)
            return True
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def connected_to(self, device_id: str) -> bool:
        conns = self.rest("GET", "/rest/system/connections")["connections"]
        return bool(conns.get(device_id, {}).get("connected"))

    def scan(self, folder: str = FOLDER_ID) -> None:
        """Ask for a rescan now (POST /rest/db/scan) instead of waiting for the watcher."""
        self.rest("POST", f"/rest/db/scan?folder={folder}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


def _generate(program: str, name: str, workdir: Path, folder: Path) -> Instance:
    home = workdir / name
    subprocess.run(
        [program, "generate", f"--home={home}", "--no-default-folder"],
        check=True,
        capture_output=True,
        timeout=DEADLINE,
        env=_env(workdir),
    )
    root = ET.parse(home / "config.xml").getroot()
    device = root.find("device")
    assert device is not None, "syncthing generate wrote no device"
    return Instance(
        name=name,
        home=home,
        folder=folder,
        device_id=device.attrib["id"],
        api_key=secrets.token_urlsafe(24),
        gui_port=0,
        listen_port=0,
        log=workdir / f"{name}.log",
    )


def _env(workdir: Path) -> dict[str, str]:
    """No upgrades, no restarting monitor, nothing written into the user's home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ST")}
    env.update(STNOUPGRADE="1", STNORESTART="1", STNODEFAULTFOLDER="1", HOME=str(workdir))
    return env


def _configure(me: Instance, peer: Instance, folder_id: str, rescan_seconds: int) -> None:
    """Edit ``me``'s config.xml: loopback GUI and listener, everything external off, ``peer`` known
    at its address, and the shared folder."""
    path = me.home / "config.xml"
    tree = ET.parse(path)
    root = tree.getroot()
    gui = root.find("gui")
    assert gui is not None
    gui.set("tls", "false")
    _set(gui, "address", f"127.0.0.1:{me.gui_port}")
    _set(gui, "apikey", me.api_key)
    options = root.find("options")
    assert options is not None
    _set(options, "listenAddress", me.address)
    for tag, value in _OPTIONS.items():
        _set(options, tag, value)
    for dev in root.findall("device"):
        if dev.attrib["id"] == me.device_id:
            dev.set("name", me.name)
    for old in root.findall("device"):
        if old.attrib["id"] == peer.device_id:
            root.remove(old)
    peer_dev = ET.Element(
        "device",
        id=peer.device_id,
        name=peer.name,
        compression="metadata",
        introducer="false",
        skipIntroductionRemovals="false",
        introducedBy="",
    )
    _set(peer_dev, "address", peer.address)
    _set(peer_dev, "paused", "false")
    _set(peer_dev, "autoAcceptFolders", "false")
    root.insert(list(root).index(gui), peer_dev)
    for old in root.findall("folder"):
        root.remove(old)
    folder = ET.Element(
        "folder",
        id=folder_id,
        label=folder_id,
        path=str(me.folder),
        type="sendreceive",
        rescanIntervalS=str(rescan_seconds),
        fsWatcherEnabled="true",
        fsWatcherDelayS="1",
        ignorePerms="false",
        autoNormalize="true",
    )
    _set(folder, "filesystemType", "basic")
    for dev_id in (me.device_id, peer.device_id):
        ET.SubElement(folder, "device", id=dev_id, introducedBy="")
    min_free = ET.SubElement(folder, "minDiskFree", unit="%")
    min_free.text = "0"
    _set(folder, "markerName", ".stfolder")
    root.insert(list(root).index(peer_dev), folder)
    tree.write(path, encoding="utf-8", xml_declaration=False)


class SyncthingPair:
    """Two Syncthing instances sharing ``folder_a`` (on the first) and ``folder_b`` (on the second)."""

    def __init__(
        self,
        workdir: Path,
        folder_a: Path,
        folder_b: Path,
        *,
        folder_id: str = FOLDER_ID,
        rescan_seconds: int = 5,
    ) -> None:
        program = syncthing_program()
        assert program, SYNCTHING_MISSING
        self.program = program
        self.workdir = workdir
        self.folder_id = folder_id
        self.rescan_seconds = rescan_seconds
        workdir.mkdir(parents=True, exist_ok=True)
        self.a = _generate(program, "a", workdir, folder_a)
        self.b = _generate(program, "b", workdir, folder_b)

    def start(self, timeout: float = DEADLINE) -> SyncthingPair:
        """Start both, wait until both REST APIs answer and the two are connected."""
        for me in (self.a, self.b):
            me.folder.mkdir(parents=True, exist_ok=True)
            (me.folder / ".stfolder").mkdir(exist_ok=True)  # the marker Syncthing wants in a folder it syncs
            me.gui_port, me.listen_port = free_port(), free_port()
        for me, peer in ((self.a, self.b), (self.b, self.a)):
            _configure(me, peer, self.folder_id, self.rescan_seconds)
        try:
            for me in (self.a, self.b):
                self._launch(me)
            self.wait_until(
                lambda: self.a.answers() and self.b.answers(), timeout, "both Syncthing REST APIs answering"
            )
            self.wait_connected(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, me: Instance) -> None:
        cmd = [self.program, "serve", f"--home={me.home}", "--no-browser", "--no-restart", "--no-upgrade"]
        cmd += [f"--logfile={me.log}", "--logflags=3"]
        me.proc = subprocess.Popen(
            cmd,
            env=_env(self.workdir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _alive(self) -> None:
        for me in (self.a, self.b):
            if me.proc is not None and me.proc.poll() is not None:
                tail = me.log.read_text(errors="replace")[-800:] if me.log.exists() else ""
                raise RuntimeError(f"syncthing {me.name} exited with {me.proc.returncode}: {tail}")

    def wait_until(
        self, predicate: Callable[[], bool], timeout: float = DEADLINE, what: str = "a condition"
    ) -> None:
        """Poll ``predicate`` until it holds (or a Syncthing died, or ``timeout`` passed)."""

        def check() -> bool:
            self._alive()
            return predicate()

        wait_until(check, timeout, what, step=0.2)

    def wait_connected(self, timeout: float = DEADLINE) -> None:
        def connected() -> bool:
            try:
                return self.a.connected_to(self.b.device_id) and self.b.connected_to(self.a.device_id)
            except (OSError, urllib.error.URLError):
                return False

        self.wait_until(connected, timeout, "the two Syncthing instances connecting")

    def settled(self) -> bool:
        """Both idle with nothing left to pull, each seeing the other 100 % complete: quiescence
        (ask after :meth:`scan`, or a change the watcher has not noticed yet is not counted)."""
        for me, peer in ((self.a, self.b), (self.b, self.a)):
            status = me.rest("GET", f"/rest/db/status?folder={self.folder_id}")
            if (
                status.get("state") != "idle"
                or status.get("needTotalItems", 0)
                or status.get("pullErrors", 0)
            ):
                return False
            done = me.rest("GET", f"/rest/db/completion?folder={self.folder_id}&device={peer.device_id}")
            if done.get("completion") != 100 or done.get("needItems", 0) or done.get("needDeletes", 0):
                return False
        return True

    def scan(self) -> None:
        """Rescan the shared folder on both instances now."""
        for me in (self.a, self.b):
            me.scan(self.folder_id)

    def stop(self) -> None:
        for me in (self.a, self.b):
            me.stop()

    def __enter__(self) -> SyncthingPair:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
