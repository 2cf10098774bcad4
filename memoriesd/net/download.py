"""Download one pinned file: resumable, verified, atomic.

:func:`download_file` streams a URL into ``<final>.part`` while hashing it,
resumes with ``Range`` after a dropped connection (a server answering 200 to a
ranged request restarts the file; one answering with the wrong part or 416 is
asked once more for the whole file, without ``Range``, and every failed attempt
from then on counts against the retry limit, so a mirror that cannot resume
ends the download quickly), retries per :class:`HttpConfig`, follows
redirects under :func:`redirect_target`'s rule, enforces
``download_timeout_seconds`` as the budget of the whole file, checks size and
SHA-256, then fsyncs and renames into place (and fsyncs the directory).

A ``.part`` left by an interrupted run is resumed (its bytes are re-hashed
first); if the finished file then fails the digest, the download is restarted
from zero once before giving up. A file that fails its digest is removed:
nothing is ever left at the final path unless it matched.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urljoin, urlsplit

import httpx

from ..errors import DigestMismatch, HttpError, HttpTimeout, ModelInstallError, RedirectRefused, UrlRefused
from ..urls import display_url, host_of, parse_url
from .http_client import RETRY_STATUSES, HttpClient, describe_transport_error, retry_delay

log = logging.getLogger("memoriesd.net")

MAX_REDIRECTS = 10
_CONTENT_RANGE_RE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
_PROGRESS_STEP = 1 << 20

Progress = Callable[[dict[str, object]], None]


class MirrorUnreachable(HttpError):
    """The mirror could not be reached or dropped the exchange (no HTTP answer): the machine may be
    offline. The model installer adds what to do then (a local model folder, a mirror, a proxy)."""


def redirect_target(current: str, location: str, *, origin: str, purpose: str) -> str:
    """The absolute URL a download redirect leads to, if the rule allows following it.

    HTTPS targets may carry a query (signed CDN URLs). A plain-HTTP target is
    followed only when it stays on the same loopback mirror as ``origin`` (same
    scheme, host and port); any other is :class:`RedirectRefused`.
    """
    target = urljoin(current, location.strip())
    start = parse_url(origin, purpose=purpose, allow_query=True)
    if urlsplit(target).scheme.lower() == "http":
        try:
            same = start.scheme == "http" and parse_url(target, purpose=purpose, allow_query=True).origin == start.origin
        except UrlRefused:
            same = False
        if not same:
            raise RedirectRefused(
                f"the {purpose} was redirected to the plain-HTTP URL {display_url(target)}, which is refused: "
                "a mirror may redirect only to https:// URLs (or within the same loopback mirror)"
            )
    parse_url(target, purpose=f"{purpose} redirect", allow_query=True)
    return target


class _Retry(Exception):
    """Internal: this attempt failed in a way worth retrying."""

    def __init__(
        self, error: HttpError, retry_after: str | None = None, *, restart: bool = False, bad_resume: bool = False
    ) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after = retry_after
        self.restart = restart
        self.bad_resume = bad_resume  # the mirror answered a Range request wrongly (wrong part, 416)


@dataclass
class _State:
    """The ``.part`` file being written and the hash of what it holds."""

    fh: BinaryIO
    hasher: hashlib._Hash
    offset: int = 0
    resumed_from_disk: bool = False
    no_range: bool = False  # the mirror resumes wrongly: download the whole file, never send Range

    def restart(self) -> None:
        self.fh.seek(0)
        self.fh.truncate()
        self.hasher = hashlib.sha256()
        self.offset = 0
        self.resumed_from_disk = False


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_part(part: Path, size: int) -> _State:
    fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o600)
    fh = os.fdopen(fd, "r+b")
    hasher = hashlib.sha256()
    have = os.fstat(fd).st_size
    if have > size:
        fh.truncate(0)
        have = 0
    done = 0
    while done < have:
        block = fh.read(min(1 << 20, have - done))
        if not block:
            break
        hasher.update(block)
        done += len(block)
    fh.seek(done)
    fh.truncate()
    return _State(fh=fh, hasher=hasher, offset=done, resumed_from_disk=done > 0)


def download_file(
    http: HttpClient,
    url: str,
    final: Path,
    *,
    size: int,
    sha256: str,
    name: str,
    purpose: str = "model download",
    progress: Progress | None = None,
    cancel: Callable[[], None] | None = None,
) -> None:
    """Download ``url`` to ``final`` (see the module doc). ``name`` labels the file in messages."""
    cfg = http.cfg
    deadline = time.monotonic() + cfg.download_timeout_seconds
    part = final.with_name(final.name + ".part")
    parse_url(url, purpose=purpose)  # refuse before touching the disk
    try:
        state = _open_part(part, size)
    except OSError as exc:
        raise _write_error(final, exc) from None
    try:
        _fill(http, url, state, size=size, sha256=sha256, name=name, purpose=purpose, deadline=deadline,
              progress=progress, cancel=cancel)
    except DigestMismatch:
        state.fh.close()
        part.unlink(missing_ok=True)
        raise
    except OSError as exc:
        state.fh.close()
        raise _write_error(final, exc) from None
    except BaseException:
        state.fh.close()  # the .part stays: the next run resumes it
        raise
    _put_in_place(state, part, final)


def _fill(
    http: HttpClient,
    url: str,
    state: _State,
    *,
    size: int,
    sha256: str,
    name: str,
    purpose: str,
    deadline: float,
    progress: Progress | None,
    cancel: Callable[[], None] | None,
) -> None:
    """Attempt after attempt until the ``.part`` holds ``size`` bytes of digest ``sha256``."""
    cfg = http.cfg
    failures = 0
    while True:
        if cancel is not None:
            cancel()
        if state.offset < size or size == 0:
            if state.no_range and state.offset:
                state.restart()  # cannot resume from this mirror: the whole file again
            before = state.offset
            try:
                _attempt(http, url, state, size=size, name=name, purpose=purpose, deadline=deadline,
                         progress=progress, cancel=cancel)
            except _Retry as r:
                failures = _count_failure(r, state, before, failures, retries=cfg.retries, url=url, name=name)
                delay = retry_delay(max(0, failures - 1), cfg, r.retry_after)
                if time.monotonic() + delay > deadline:
                    raise _budget_error(name, cfg.download_timeout_seconds) from None
                log.info("GET %s retry %d in %.2fs", host_of(url), failures, delay)
                _sleep(delay, cancel)
                continue
        if state.offset != size or state.hasher.hexdigest() != sha256.lower():
            if state.resumed_from_disk:
                # The bytes kept from an earlier run may be the culprit: start over once.
                log.info("download of %s failed its digest after resuming; starting over", name)
                state.restart()
                continue
            raise DigestMismatch(
                f"the downloaded model file {name} does not match its pinned SHA-256 (the mirror serves "
                "different bytes); nothing was installed: check [embedding.local] download_url, then run "
                "`memories rag model-install` again"
            )
        return


def _count_failure(r: _Retry, state: _State, before: int, failures: int, *, retries: int, url: str, name: str) -> int:
    """The failures in a row after this one (an attempt that moved the file on resets them); raises
    when they are more than ``retries``."""
    if r.restart:
        state.restart()
    if r.bad_resume:
        if state.no_range:
            raise _bad_resume_error(url, name) from None
        # Fall back once to downloading the whole file without Range. From now on
        # received bytes are not progress (each attempt starts over), so every
        # failed attempt counts against the retry limit.
        state.no_range = True
        failures += 1
    else:
        failures = 0 if state.offset > before and not state.no_range else failures + 1
    if failures > retries:
        raise (_bad_resume_error(url, name, whole_failed=True) if state.no_range else r.error) from None
    return failures


def _put_in_place(state: _State, part: Path, final: Path) -> None:
    """Make the verified ``.part`` durable and rename it to ``final`` (then the directory durable)."""
    try:
        state.fh.flush()
        os.fsync(state.fh.fileno())
        state.fh.close()
        os.replace(part, final)
        _fsync_dir(final.parent)
    except OSError as exc:
        raise _write_error(final, exc) from None
    finally:
        if not state.fh.closed:
            state.fh.close()


def _write_error(final: Path, exc: OSError) -> ModelInstallError:
    return ModelInstallError(
        f"cannot write the model file {final} ({exc.strerror or 'I/O error'}): free disk space or fix the "
        "directory's permissions, then run `memories rag model-install` again"
    )


def _bad_resume_error(url: str, name: str, *, whole_failed: bool = False) -> HttpError:
    """The mirror cannot resume (wrong part or 416 for a Range request) and a whole download did not work."""
    again = ", and the whole file could not be downloaded either" if whole_failed else " twice"
    return HttpError(
        f"the mirror {host_of(url)} answered a resumed download (Range request) of the model file {name} with "
        f"the wrong part{again}; {name} was not installed: check [embedding.local] download_url or use another mirror"
    )


def _sleep(seconds: float, cancel: Callable[[], None] | None) -> None:
    """Sleep, letting ``cancel`` interrupt (Retry-After may ask for up to 30 s)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if cancel is not None:
            cancel()
        time.sleep(min(left, 0.1))


def _budget_error(name: str, seconds: float) -> HttpTimeout:
    return HttpTimeout(
        f"downloading the model file {name} cannot finish within http.download_timeout_seconds ({seconds:g} s); "
        "the partial file is kept: run `memories rag model-install` again to resume, or raise the limit"
    )


def _attempt(
    http: HttpClient,
    url: str,
    state: _State,
    *,
    size: int,
    name: str,
    purpose: str,
    deadline: float,
    progress: Progress | None,
    cancel: Callable[[], None] | None,
) -> None:
    """One attempt: follow redirects, then stream the body into the part file."""
    current = url
    for _hop in range(MAX_REDIRECTS + 1):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _budget_error(name, http.cfg.download_timeout_seconds)
        headers = {"Accept-Encoding": "identity"}
        if state.offset and not state.no_range:
            headers["Range"] = f"bytes={state.offset}-"
        host = parse_url(current, purpose=purpose, allow_query=True).host
        try:
            with http.stream(
                "GET", current, purpose=purpose, headers=headers, timeout=http.timeout(budget=remaining),
                allow_query=current != url,
            ) as resp:
                status = resp.status_code
                log.log(logging.DEBUG if status in (200, 206) else logging.INFO, "GET %s -> %d", host, status)
                if 300 <= status < 400 and resp.headers.get("Location"):
                    current = redirect_target(current, resp.headers["Location"], origin=url, purpose=purpose)
                    continue
                if status == 416:
                    raise _Retry(HttpError(f"the mirror {host} refused to resume {name}: run `memories rag model-install` again"),
                                 restart=True, bad_resume=True)
                if status in RETRY_STATUSES:
                    raise _Retry(
                        HttpError(f"the mirror {host} failed with HTTP {status} while sending {name}: try again later"),
                        resp.headers.get("Retry-After"),
                    )
                if status not in (200, 206):
                    raise HttpError(
                        f"the mirror {host} answered HTTP {status} for the model file {name}: check "
                        "[embedding.local] download_url (it must hold the pinned revision's files)"
                    )
                _check_extent(resp, state, size=size, name=name, host=host)
                _stream_body(resp, state, size=size, name=name, deadline=deadline, progress=progress,
                             cancel=cancel, seconds=http.cfg.download_timeout_seconds)
        except httpx.TransportError as exc:
            if time.monotonic() >= deadline:
                raise _budget_error(name, http.cfg.download_timeout_seconds) from None
            reason, retryable = describe_transport_error(exc)
            err = MirrorUnreachable(
                f"downloading the model file {name} from {host} failed: {reason}; check the network and the "
                "proxy settings, then run `memories rag model-install` again (it resumes)"
            )
            if retryable:
                raise _Retry(err) from None
            raise err from None
        if state.offset < size:
            raise _Retry(HttpError(
                f"the mirror {host} closed the connection before the end of {name}: run "
                "`memories rag model-install` again (it resumes)"
            ))
        return
    raise RedirectRefused(f"the {purpose} of {name} was redirected more than {MAX_REDIRECTS} times: check the mirror")


def _check_extent(resp: httpx.Response, state: _State, *, size: int, name: str, host: str) -> None:
    """Make the part file agree with what this response carries (restart or resume)."""
    length = resp.headers.get("Content-Length")
    if resp.status_code == 200:
        if state.offset:
            log.info("mirror %s ignored Range for %s; restarting the file", host, name)
            state.restart()
        if length is not None and length.isdigit() and int(length) != size:
            raise DigestMismatch(
                f"the mirror {host} serves the model file {name} with {int(length)} bytes, the pinned file has "
                f"{size}; nothing was installed: check [embedding.local] download_url"
            )
        return
    m = _CONTENT_RANGE_RE.match(resp.headers.get("Content-Range", ""))
    if not m or int(m.group(1)) != state.offset:
        raise _Retry(HttpError(f"the mirror {host} sent the wrong part of {name}"), restart=True, bad_resume=True)
    if m.group(3) != "*" and int(m.group(3)) != size:
        raise DigestMismatch(
            f"the mirror {host} serves the model file {name} with {m.group(3)} bytes, the pinned file has "
            f"{size}; nothing was installed: check [embedding.local] download_url"
        )


def _stream_body(
    resp: httpx.Response,
    state: _State,
    *,
    size: int,
    name: str,
    deadline: float,
    progress: Progress | None,
    cancel: Callable[[], None] | None,
    seconds: float,
) -> None:
    last_reported = -_PROGRESS_STEP
    for chunk in resp.iter_raw():  # as received: a dropped connection loses nothing already read
        if cancel is not None:
            cancel()
        if state.offset + len(chunk) > size:
            raise DigestMismatch(
                f"the mirror sends more bytes than the pinned size of the model file {name}; nothing was "
                "installed: check [embedding.local] download_url"
            )
        state.fh.write(chunk)
        state.hasher.update(chunk)
        state.offset += len(chunk)
        if progress is not None and (state.offset - last_reported >= _PROGRESS_STEP or state.offset == size):
            progress({"file": name, "done": state.offset, "total": size})
            last_reported = state.offset
        if time.monotonic() > deadline and state.offset < size:
            raise _budget_error(name, seconds)
