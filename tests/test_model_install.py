"""model-install: pinned, resumable, verified downloads from real loopback mirrors."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memoriesd.config import HttpConfig
from memoriesd.embed.install import (
    Manifest,
    default_manifest_path,
    install_model,
    installed_files_match,
    load_manifest,
)
from memoriesd.errors import (
    Cancelled,
    DigestMismatch,
    HttpError,
    HttpTimeout,
    ModelInstallError,
    RedirectRefused,
    UrlRefused,
)
from memoriesd.net.download import redirect_target
from memoriesd.net.http_client import MAX_RETRY_AFTER_SECONDS
from tests.conftest import needs_shared
from tests.servers import ConnectProxy, LoopbackCA, Mirror, Scripted, make_test_ca

SHARED = Path(__file__).resolve().parents[2] / "shared"
REVISION = "5090578d9565bb06545b4552f76e6bc2c93e4a66"
GEMMA_LINE = "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms"
SIX = [
    "onnx/model_q4.onnx",
    "onnx/model_q4.onnx_data",
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "special_tokens_map.json",
]
FAST = HttpConfig(retries=2, backoff_ms=10, connect_timeout_seconds=2, timeout_seconds=5, download_timeout_seconds=30)
PROXY_VARS = ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"]


@pytest.fixture(autouse=True)
def clean_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def _files() -> dict[str, bytes]:
    rnd = os.urandom
    return {"onnx/model.onnx": rnd(40_000), "onnx/model.onnx_data": rnd(300_000), "tokenizer.json": rnd(70_000),
            "config.json": b'{"hidden_size": 8}'}


def _manifest(tmp: Path, files: dict[str, bytes]) -> Manifest:
    data = {
        "format": 1,
        "name": "Tiny test model",
        "repo": "test-org/tiny-model",
        "revision": REVISION,
        "model_card": "https://huggingface.co/test-org/tiny-model",
        "base_url": "https://models.example.invalid/test-org/tiny-model/resolve/{revision}",
        "license": {"notice": GEMMA_LINE, "links": [
            {"title": "Gemma Terms of Use", "url": "https://ai.google.dev/gemma/terms"},
            {"title": "Gemma Prohibited Use Policy", "url": "https://ai.google.dev/gemma/prohibited_use_policy"}]},
        "files": [{"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for p, b in files.items()],
    }
    path = tmp / "manifest.json"
    path.write_text(json.dumps(data))
    return load_manifest(path)


@pytest.fixture
def files() -> dict[str, bytes]:
    return _files()


@pytest.fixture
def manifest(tmp_path: Path, files: dict[str, bytes]) -> Manifest:
    return _manifest(tmp_path, files)


@pytest.fixture
def mirror(files: dict[str, bytes]) -> Iterator[Mirror]:
    with Mirror({f"/m/{p}": b for p, b in files.items()}) as m:
        yield m


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> LoopbackCA:
    return make_test_ca(tmp_path_factory.mktemp("ca"))


def _cfg(**kw: Any) -> HttpConfig:
    return HttpConfig(**{**FAST.__dict__, **kw})


def _install(manifest: Manifest, dest: Path, base: str | None, events: list[dict[str, Any]] | None = None,
             **kw: Any) -> Any:
    cancel = kw.pop("cancel", None)
    return install_model(manifest, dest, base_url=base, http=_cfg(**kw),
                         progress=events.append if events is not None else None, cancel=cancel)


def _assert_installed(dest: Path, files: dict[str, bytes]) -> None:
    for p, b in files.items():
        assert (dest / p).read_bytes() == b
        assert not (dest / (p + ".part")).exists()


# -- the real manifest -----------------------------------------------------------


def test_real_manifest_pins_exactly_the_six_files_totalling_218727651_bytes() -> None:
    m = load_manifest(default_manifest_path())
    assert [f.path for f in m.files] == SIX
    assert m.total_bytes == 218_727_651
    assert m.repo == "onnx-community/embeddinggemma-300m-ONNX" and m.revision == REVISION
    assert m.default_base_url == f"https://huggingface.co/onnx-community/embeddinggemma-300m-ONNX/resolve/{REVISION}"
    assert m.notice == GEMMA_LINE
    assert {link.url for link in m.links} == {"https://ai.google.dev/gemma/terms",
                                               "https://ai.google.dev/gemma/prohibited_use_policy"}


def test_real_manifest_agrees_with_the_shared_facts() -> None:
    facts = SHARED / "embeddinggemma.md"
    if not facts.exists():
        pytest.skip(needs_shared("embeddinggemma.md"))
    rows = dict(re.findall(r"^\| (\S+) \| [\d,]+ \| ([0-9a-f]{64}) \|$", facts.read_text(), re.M))
    sizes = {p: int(s.replace(",", "")) for p, s in re.findall(r"^\| (\S+) \| ([\d,]+) \|", facts.read_text(), re.M)}
    for f in load_manifest(default_manifest_path()).files:
        assert rows[f.path] == f.sha256 and sizes[f.path] == f.size
    assert GEMMA_LINE in facts.read_text()


def test_manifest_with_an_escaping_path_is_refused(tmp_path: Path) -> None:
    m = json.loads(default_manifest_path().read_text())
    m["files"][0]["path"] = "../outside.onnx"
    (tmp_path / "bad.json").write_text(json.dumps(m))
    with pytest.raises(ModelInstallError, match="not a plain relative path"):
        load_manifest(tmp_path / "bad.json")


# -- downloads -----------------------------------------------------------------


def test_full_download_installs_files_notice_and_upstream(
    tmp_path: Path, manifest: Manifest, mirror: Mirror, files: dict[str, bytes]
) -> None:
    events: list[dict[str, Any]] = []
    dest = tmp_path / "model"
    report = _install(manifest, dest, mirror.url + "/m/", events)
    _assert_installed(dest, files)
    assert report.downloaded == 4 and report.reused == 0 and report.downloaded_bytes == sum(map(len, files.values()))
    assert stat.S_IMODE((dest / "tokenizer.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((dest / "onnx").stat().st_mode) == 0o700
    notice = (dest / "NOTICE").read_text()
    assert GEMMA_LINE + "\n" in notice and "https://ai.google.dev/gemma/prohibited_use_policy" in notice
    assert f"test-org/tiny-model at revision {REVISION}" in notice
    upstream = json.loads((dest / "UPSTREAM.json").read_text())
    assert (upstream["repo"], upstream["revision"]) == ("test-org/tiny-model", REVISION)
    assert {"file": "onnx/model.onnx_data", "done": 300_000, "total": 300_000} in events
    assert [e["file"] for e in events if e.get("status") == "downloaded"] == list(files)
    assert installed_files_match(manifest, dest)
    assert all(r.headers.get("accept-encoding") == "identity" for r in mirror.seen())


def test_dropped_connection_resumes_with_range(tmp_path: Path, manifest: Manifest, mirror: Mirror,
                                               files: dict[str, bytes]) -> None:
    mirror.add("/m/onnx/model.onnx_data", Scripted(drop_after=123_456))
    _install(manifest, tmp_path / "model", mirror.url + "/m")
    _assert_installed(tmp_path / "model", files)
    first, second = mirror.seen("/m/onnx/model.onnx_data")
    assert "range" not in first.headers and second.headers["range"] == "bytes=123456-"


def test_server_ignoring_range_restarts_the_file(tmp_path: Path, manifest: Manifest, mirror: Mirror,
                                                 files: dict[str, bytes]) -> None:
    mirror.add("/m/onnx/model.onnx_data", Scripted(drop_after=50_000), Scripted(ignore_range=True))
    _install(manifest, tmp_path / "model", mirror.url + "/m")
    _assert_installed(tmp_path / "model", files)
    assert mirror.seen("/m/onnx/model.onnx_data")[1].headers["range"] == "bytes=50000-"


def test_503_then_success(tmp_path: Path, manifest: Manifest, mirror: Mirror, files: dict[str, bytes]) -> None:
    mirror.add("/m/tokenizer.json", Scripted(status=503), Scripted(status=503))
    _install(manifest, tmp_path / "model", mirror.url + "/m")
    _assert_installed(tmp_path / "model", files)
    assert len(mirror.seen("/m/tokenizer.json")) == 3


def test_503_beyond_the_retries_fails_and_installs_nothing_for_that_file(
    tmp_path: Path, manifest: Manifest, mirror: Mirror
) -> None:
    mirror.add("/m/tokenizer.json", *[Scripted(status=503)] * 3)
    with pytest.raises(HttpError, match="HTTP 503"):
        _install(manifest, tmp_path / "model", mirror.url + "/m", retries=1)
    assert not (tmp_path / "model" / "tokenizer.json").exists()


def test_429_retry_after_is_honoured(tmp_path: Path, manifest: Manifest, mirror: Mirror) -> None:
    mirror.add("/m/config.json", Scripted(status=429, headers={"Retry-After": "1"}))
    started = time.monotonic()
    _install(manifest, tmp_path / "model", mirror.url + "/m")
    assert time.monotonic() - started >= 0.95
    assert len(mirror.seen("/m/config.json")) == 2


def test_wrong_bytes_are_never_installed(tmp_path: Path, manifest: Manifest, mirror: Mirror) -> None:
    good = mirror.files["/m/tokenizer.json"]
    mirror.files["/m/tokenizer.json"] = bytes([good[0] ^ 1]) + good[1:]
    dest = tmp_path / "model"
    with pytest.raises(DigestMismatch, match="tokenizer.json") as info:
        _install(manifest, dest, mirror.url + "/m")
    assert "model-install" in info.value.message
    assert not (dest / "tokenizer.json").exists() and not (dest / "tokenizer.json.part").exists()
    assert not (dest / "NOTICE").exists()


def test_wrong_size_is_refused_before_downloading_the_body(tmp_path: Path, manifest: Manifest, mirror: Mirror) -> None:
    mirror.files["/m/onnx/model.onnx_data"] = b"x" * 10
    with pytest.raises(DigestMismatch, match="10 bytes"):
        _install(manifest, tmp_path / "model", mirror.url + "/m")
    assert not (tmp_path / "model" / "onnx" / "model.onnx_data").exists()


def test_wrong_digest_present_is_never_overwritten(tmp_path: Path, manifest: Manifest, mirror: Mirror) -> None:
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "tokenizer.json").write_bytes(b"my own tokenizer")
    with pytest.raises(DigestMismatch) as info:
        _install(manifest, dest, mirror.url + "/m")
    assert str(dest / "tokenizer.json") in info.value.message and "remove it" in info.value.message
    assert (dest / "tokenizer.json").read_bytes() == b"my own tokenizer"
    assert mirror.seen() == []  # checked before any download


def test_good_files_are_reused_without_network(tmp_path: Path, manifest: Manifest, files: dict[str, bytes]) -> None:
    dest = tmp_path / "model"
    with Mirror({f"/m/{p}": b for p, b in files.items()}) as m:
        _install(manifest, dest, m.url + "/m")
        url = m.url
    events: list[dict[str, Any]] = []
    report = _install(manifest, dest, url + "/m", events)  # the server is stopped now
    assert report.reused == 4 and report.downloaded_bytes == 0
    assert [e for e in events if "status" in e] == [{"file": p, "status": "reused"} for p in files]
    _assert_installed(dest, files)


def test_cancel_keeps_the_part_and_the_next_run_resumes(tmp_path: Path, manifest: Manifest, mirror: Mirror,
                                                        files: dict[str, bytes]) -> None:
    dest = tmp_path / "model"
    part = dest / "onnx" / "model.onnx_data.part"

    def cancel() -> None:  # the user presses Ctrl-C once the big file has begun
        if part.exists() and part.stat().st_size > 0:
            raise Cancelled("model-install was cancelled")

    mirror.add("/m/onnx/model.onnx_data", Scripted(trickle=(20_000, 0.01)))
    with pytest.raises(Cancelled):
        _install(manifest, dest, mirror.url + "/m", cancel=cancel)
    kept = part.stat().st_size
    assert 0 < kept < 300_000 and not (dest / "onnx" / "model.onnx_data").exists()
    _install(manifest, dest, mirror.url + "/m")
    _assert_installed(dest, files)
    assert mirror.seen("/m/onnx/model.onnx_data")[-1].headers["range"] == f"bytes={kept}-"


def test_stale_part_with_bad_bytes_is_restarted_once(tmp_path: Path, manifest: Manifest, mirror: Mirror,
                                                     files: dict[str, bytes]) -> None:
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "tokenizer.json.part").write_bytes(b"\0" * 1000)
    _install(manifest, dest, mirror.url + "/m")
    _assert_installed(dest, files)
    first, second = mirror.seen("/m/tokenizer.json")
    assert first.headers["range"] == "bytes=1000-" and "range" not in second.headers


def test_per_file_budget_stops_a_trickling_server(tmp_path: Path, manifest: Manifest, mirror: Mirror) -> None:
    mirror.add("/m/onnx/model.onnx_data", Scripted(trickle=(2000, 0.05)))
    with pytest.raises(HttpTimeout, match="download_timeout_seconds"):  # the budget ended it, not the file's end
        _install(manifest, tmp_path / "model", mirror.url + "/m", download_timeout_seconds=0.6)
    assert not (tmp_path / "model" / "onnx" / "model.onnx_data").exists()


# -- redirects -------------------------------------------------------------------


def test_redirect_rule() -> None:
    origin = "http://127.0.0.1:8000/m/x.onnx"
    signed = "https://cdn.example.com/blob/abc?X-Amz-Signature=ff&Expires=1"
    assert redirect_target(origin, signed, origin=origin, purpose="model download") == signed
    assert redirect_target(origin, "/blobs/1", origin=origin, purpose="model download") == "http://127.0.0.1:8000/blobs/1"
    for bad in ("http://cdn.example.com/blob", "http://127.0.0.1:8001/blob", "http://localhost:8000/blob",
                "//cdn.example.com/blob"):
        with pytest.raises(RedirectRefused, match="plain-HTTP"):
            redirect_target(origin, bad, origin=origin, purpose="model download")
    with pytest.raises(RedirectRefused):
        redirect_target("https://hf.example/x", "http://127.0.0.1/x", origin="https://hf.example/x",
                        purpose="model download")
    with pytest.raises(UrlRefused):
        redirect_target(origin, "https://user:pw@cdn.example.com/x", origin=origin, purpose="model download")


def test_redirect_to_plain_http_is_refused(tmp_path: Path, manifest: Manifest, mirror: Mirror) -> None:
    with Mirror({"/blob": b"x"}) as other:
        mirror.add("/m/onnx/model.onnx", Scripted(status=302, headers={"Location": other.url + "/blob"}))
        with pytest.raises(RedirectRefused, match="plain-HTTP"):
            _install(manifest, tmp_path / "model", mirror.url + "/m")
        assert other.seen() == []
    assert not (tmp_path / "model" / "onnx" / "model.onnx").exists()


def test_redirect_to_https_with_signed_query_is_followed(
    tmp_path: Path, manifest: Manifest, mirror: Mirror, files: dict[str, bytes], test_ca: LoopbackCA
) -> None:
    with Mirror({"/cdn/data": files["onnx/model.onnx_data"]}, tls=test_ca.server_context()) as cdn:
        target = cdn.url + "/cdn/data?X-Signature=abc123&Expires=99"
        mirror.add("/m/onnx/model.onnx_data", Scripted(status=302, headers={"Location": target}))
        mirror.add("/m/tokenizer.json", Scripted(status=307, headers={"Location": "/m/tokenizer.json"}))
        _install(manifest, tmp_path / "model", mirror.url + "/m", ca_bundle=str(test_ca.ca_file))
        assert [r.path for r in cdn.seen()] == ["/cdn/data?X-Signature=abc123&Expires=99"]
    _assert_installed(tmp_path / "model", files)
    assert len(mirror.seen("/m/tokenizer.json")) == 2  # same-mirror redirect followed


# -- URL rule and proxies ----------------------------------------------------------


def test_mirror_url_must_pass_the_url_rule(tmp_path: Path, manifest: Manifest) -> None:
    with pytest.raises(UrlRefused, match="model download URL"):
        _install(manifest, tmp_path / "model", "http://mirror.example.com/models")
    assert not (tmp_path / "model").exists()


def test_loopback_mirror_bypasses_proxies(tmp_path: Path, manifest: Manifest, mirror: Mirror,
                                          files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    with ConnectProxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        _install(manifest, tmp_path / "model", mirror.url + "/m", proxy_url=proxy.url)
        assert proxy.lines == []
    _assert_installed(tmp_path / "model", files)


def test_default_upstream_goes_through_the_env_proxy(tmp_path: Path, manifest: Manifest,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with ConnectProxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        with pytest.raises(HttpError, match="proxy"):
            _install(manifest, tmp_path / "model", None, retries=0)
        assert proxy.lines == ["CONNECT models.example.invalid:443 HTTP/1.1"]


def test_cancel_interrupts_a_long_retry_after_wait(tmp_path: Path, manifest: Manifest, mirror: Mirror) -> None:
    mirror.add("/m/onnx/model.onnx", Scripted(status=503, headers={"Retry-After": "30"}))
    started = time.monotonic()

    def cancel() -> None:  # the user's Ctrl-C, once the 503 came: during the wait it asks for
        if mirror.seen("/m/onnx/model.onnx"):
            raise Cancelled("model-install was cancelled")

    with pytest.raises(Cancelled):
        _install(manifest, tmp_path / "model", mirror.url + "/m", cancel=cancel, download_timeout_seconds=120)
    # Interrupted: waiting out the 30 s (MAX_RETRY_AFTER_SECONDS caps it there) would take at least that.
    assert time.monotonic() - started < MAX_RETRY_AFTER_SECONDS
    assert len(mirror.seen("/m/onnx/model.onnx")) == 1


def test_a_second_concurrent_install_is_refused(tmp_path: Path, manifest: Manifest, mirror: Mirror) -> None:
    import fcntl

    dest = tmp_path / "model"
    dest.mkdir()
    with open(dest / ".install.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ModelInstallError, match="another model-install"):
            _install(manifest, dest, mirror.url + "/m")
    assert mirror.seen() == []
