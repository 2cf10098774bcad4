"""`memories rag model-install`: fetch the pinned local embedding model.

The pin (repository, revision, default mirror URL pattern, license notice and
every file's size and SHA-256) lives in the manifest ``models/embeddinggemma.json``;
no digest is written anywhere else. :func:`install_model`:

* reuses, without any network, every file already present with its digest;
* stops with :class:`DigestMismatch` — before downloading anything — when a
  present file has a wrong size or digest (it is never overwritten);
* downloads the missing files through the one HTTP client
  (:func:`memoriesd.net.download.download_file`: resumable, verified, atomic);
* writes ``NOTICE`` (the Gemma Terms of Use line and links) and
  ``UPSTREAM.json`` (repo, revision, files) beside the files.

The download happens on the user's machine; Memories does not redistribute
the weights.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import memoriesd

from ..config import HttpConfig
from ..errors import DigestMismatch, HttpError, ModelInstallError, UrlRefused
from ..net.download import MirrorUnreachable, download_file
from ..net.http_client import HttpClient
from ..urls import check_url, display_url

MANIFEST_NAME = "embeddinggemma.json"
_PATH_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_REV_RE = re.compile(r"^[0-9a-f]{40}$")
_REPO_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class ManifestFile:
    path: str  # relative, "/"-separated, as in the upstream repository
    size: int
    sha256: str


@dataclass(frozen=True)
class LicenseLink:
    title: str
    url: str


@dataclass(frozen=True)
class Manifest:
    name: str
    repo: str
    revision: str
    model_card: str
    base_url_pattern: str  # "{revision}" is replaced by the revision
    notice: str  # the license line written verbatim into NOTICE
    links: tuple[LicenseLink, ...]
    files: tuple[ManifestFile, ...]

    @property
    def default_base_url(self) -> str:
        return self.base_url_pattern.replace("{revision}", self.revision)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class InstalledFile:
    path: str
    size: int
    sha256: str
    status: str  # "reused" | "downloaded"


@dataclass(frozen=True)
class InstallReport:
    dest: Path
    source: str  # the mirror base URL as shown (no credentials or query)
    files: tuple[InstalledFile, ...]
    downloaded_bytes: int
    seconds: float

    @property
    def reused(self) -> int:
        return sum(1 for f in self.files if f.status == "reused")

    @property
    def downloaded(self) -> int:
        return sum(1 for f in self.files if f.status == "downloaded")

    def to_dict(self) -> dict[str, Any]:
        return {
            "dest": str(self.dest),
            "source": self.source,
            "files": [asdict(f) for f in self.files],
            "downloaded_bytes": self.downloaded_bytes,
            "reused": self.reused,
            "downloaded": self.downloaded,
            "seconds": round(self.seconds, 3),
        }


# ---------------------------------------------------------------------------
# The manifest
# ---------------------------------------------------------------------------


def default_manifest_path() -> Path:
    """``models/embeddinggemma.json`` at the repository root (a checkout), else ``memoriesd/data/``."""
    package = Path(memoriesd.__file__).resolve().parent
    candidates = [package.parent / "models" / MANIFEST_NAME, package / "data" / MANIFEST_NAME]
    for c in candidates:
        if c.is_file():
            return c
    return candidates[0]


def _bad(path: Path, what: str) -> ModelInstallError:
    return ModelInstallError(f"the model manifest {path} is invalid ({what}): reinstall Memories")


def load_manifest(path: Path) -> Manifest:
    """Read and validate a manifest file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelInstallError(f"the model manifest {path} is missing: reinstall Memories") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _bad(path, "not readable JSON") from exc
    if not isinstance(data, dict) or data.get("format") != 1:
        raise _bad(path, "unknown format")

    def text(key: str, table: dict[str, Any] = data) -> str:
        value = table.get(key)
        if not isinstance(value, str) or not value:
            raise _bad(path, f"{key} must be a non-empty string")
        return value

    repo, revision = text("repo"), text("revision")
    if not _REPO_RE.match(repo):
        raise _bad(path, "repo must be owner/name")
    if not _REV_RE.match(revision):
        raise _bad(path, "revision must be a 40-digit commit id")
    lic = data.get("license")
    if not isinstance(lic, dict) or not isinstance(lic.get("links"), list):
        raise _bad(path, "license must have notice and links")
    links = []
    for item in lic["links"]:
        if not isinstance(item, dict):
            raise _bad(path, "a license link must be a table")
        links.append(LicenseLink(title=text("title", item), url=text("url", item)))
    files: list[ManifestFile] = []
    raw_files = data.get("files")
    if not isinstance(raw_files, list) or not raw_files:
        raise _bad(path, "files must be a non-empty list")
    for item in raw_files:
        if not isinstance(item, dict):
            raise _bad(path, "a file entry must be a table")
        rel, sha, size = item.get("path"), item.get("sha256"), item.get("size")
        if not isinstance(rel, str) or not _PATH_RE.match(rel) or ".." in rel.split("/"):
            raise _bad(path, "a file path is not a plain relative path")
        if not isinstance(sha, str) or not _SHA_RE.match(sha):
            raise _bad(path, f"the sha256 of {rel} is not 64 lower-case hex digits")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise _bad(path, f"the size of {rel} is not a byte count")
        files.append(ManifestFile(path=rel, size=size, sha256=sha))
    if len({f.path for f in files}) != len(files):
        raise _bad(path, "a file is listed twice")
    manifest = Manifest(
        name=text("name"),
        repo=repo,
        revision=revision,
        model_card=text("model_card"),
        base_url_pattern=text("base_url"),
        notice=text("notice", lic),
        links=tuple(links),
        files=tuple(files),
    )
    try:
        check_url(manifest.default_base_url, purpose="default model download")
    except UrlRefused as exc:
        raise _bad(path, "base_url does not pass the URL rule") from exc
    return manifest


# ---------------------------------------------------------------------------
# Installing
# ---------------------------------------------------------------------------


def _sha256_of(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _matches(path: Path, f: ManifestFile) -> bool | None:
    """None when absent, else whether the file has the pinned size and digest."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if not path.is_file() or st.st_size != f.size:
        return False
    return _sha256_of(path) == f.sha256


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def notice_text(manifest: Manifest) -> str:
    """The NOTICE written beside the model files."""
    lines = [
        f"{manifest.name}",
        "",
        manifest.notice,
        "",
        *(f"{link.title}: {link.url}" for link in manifest.links),
        "",
        f"Upstream: {manifest.repo} at revision {manifest.revision}",
        f"Model card: {manifest.model_card}",
        "",
        "These files were downloaded on this machine by `memories rag model-install`;",
        "Memories does not redistribute them. Files (path, bytes, SHA-256):",
        *(f"  {f.path}  {f.size}  {f.sha256}" for f in manifest.files),
    ]
    return "\n".join(lines) + "\n"


def upstream_record(manifest: Manifest) -> dict[str, Any]:
    """The content of ``UPSTREAM.json``: where the files came from."""
    return {
        "name": manifest.name,
        "repo": manifest.repo,
        "revision": manifest.revision,
        "model_card": manifest.model_card,
        "license": {"notice": manifest.notice, "links": [asdict(link) for link in manifest.links]},
        "files": [asdict(f) for f in manifest.files],
    }


def _lock(dest: Path) -> int:
    fd = os.open(dest / ".install.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ModelInstallError(
            f"another model-install is writing to {dest}: wait for it to finish, then run it again"
        ) from None
    return fd


#: What to do when the mirror cannot be reached (offline, a firewall, a proxy needed): appended to the error.
OFFLINE_HINT = (
    "Offline? Copy an installed model folder (e.g. HOME/models/embeddinggemma of another machine, all its files) "
    "to this machine and set [embedding.local] model_dir = \"FOLDER\" in config.toml: no download is needed then. "
    "Or download from a mirror of the files: [embedding.local] download_url = \"https://...\"; or through a "
    "proxy: [http] proxy_url (HTTPS_PROXY is used too)"
)


def install_model(
    manifest: Manifest,
    dest: Path,
    *,
    base_url: str | None,
    http: HttpConfig,
    progress: Callable[[dict[str, Any]], None] | None = None,
    cancel: Callable[[], None] | None = None,
) -> InstallReport:
    """Install the manifest's files into ``dest`` (see the module doc).

    ``base_url`` is a mirror (``[embedding.local] download_url``; None or "" = the
    manifest's default) holding the files at ``base + "/" + path``. ``cancel``
    is called between chunks and may raise (e.g. ``Cancelled``); a partial
    ``.part`` file is kept and resumed by the next run.
    """
    started = time.monotonic()
    base = base_url or manifest.default_base_url
    check_url(base, purpose="model download")
    base = base.rstrip("/")
    _make_dir(dest)
    try:
        lock_fd = _lock(dest)
    except OSError as exc:
        raise ModelInstallError(f"cannot use the model directory {dest} ({exc.strerror})") from None
    try:
        results = _present_files(manifest, dest, progress)
        downloaded_bytes = _download_missing(manifest, dest, base, http, results, progress, cancel)
        _write_upstream(manifest, dest)
    except MirrorUnreachable as exc:
        raise HttpError(f"{exc.message}. {OFFLINE_HINT}", code=exc.code) from None
    except OSError as exc:
        raise ModelInstallError(
            f"cannot read or write the model directory {dest} ({exc.strerror or 'I/O error'}): free disk space "
            "or fix its permissions, then run `memories rag model-install` again"
        ) from None
    finally:
        os.close(lock_fd)
    return InstallReport(
        dest=dest,
        source=display_url(base),
        files=tuple(results[f.path] for f in manifest.files),
        downloaded_bytes=downloaded_bytes,
        seconds=time.monotonic() - started,
    )


def _make_dir(dest: Path) -> None:
    old_umask = os.umask(0o077)
    try:
        dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelInstallError(f"cannot create the model directory {dest} ({exc.strerror})") from None
    finally:
        os.umask(old_umask)


def _present_files(
    manifest: Manifest, dest: Path, progress: Callable[[dict[str, Any]], None] | None
) -> dict[str, InstalledFile]:
    """The manifest files already in ``dest`` with their pinned digest. Every present file is checked
    first: a wrong one stops the install before any download."""
    results: dict[str, InstalledFile] = {}
    for f in manifest.files:
        state = _matches(dest / f.path, f)
        if state is False:
            raise DigestMismatch(
                f"the model file {dest / f.path} is already present but does not match the pinned SHA-256 "
                "(it was not overwritten): remove it and run `memories rag model-install` again"
            )
        if state:
            results[f.path] = InstalledFile(f.path, f.size, f.sha256, "reused")
            if progress is not None:
                progress({"file": f.path, "status": "reused"})
    return results


def _download_missing(
    manifest: Manifest,
    dest: Path,
    base: str,
    http: HttpConfig,
    results: dict[str, InstalledFile],
    progress: Callable[[dict[str, Any]], None] | None,
    cancel: Callable[[], None] | None,
) -> int:
    """Download the files not in ``results`` (adding them there); the bytes downloaded."""
    downloaded_bytes = 0
    missing = [f for f in manifest.files if f.path not in results]
    if not missing:
        return 0
    client = HttpClient(http)
    try:
        for f in missing:
            if cancel is not None:
                cancel()
            final = dest / f.path
            final.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            download_file(
                client, f"{base}/{f.path}", final, size=f.size, sha256=f.sha256, name=f.path,
                progress=progress, cancel=cancel,
            )
            downloaded_bytes += f.size
            results[f.path] = InstalledFile(f.path, f.size, f.sha256, "downloaded")
            if progress is not None:
                progress({"file": f.path, "status": "downloaded"})
    finally:
        client.close()
    return downloaded_bytes


def _write_upstream(manifest: Manifest, dest: Path) -> None:
    """NOTICE and UPSTREAM.json beside the files, then the directory made durable."""
    _write_atomic(dest / "NOTICE", notice_text(manifest))
    _write_atomic(dest / "UPSTREAM.json", json.dumps(upstream_record(manifest), indent=2) + "\n")
    fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def installed_files_match(manifest: Manifest, dest: Path) -> bool:
    """True when every manifest file is present in ``dest`` with its pinned size and digest."""
    return all(_matches(dest / f.path, f) for f in manifest.files)
