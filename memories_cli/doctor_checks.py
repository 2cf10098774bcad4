"""The checks of `memories doctor` (:mod:`memories_cli.doctor`): each says what is wrong and the fix.

Checks, in order: the home's permissions (directories 0700, files 0600, owned by you), config.toml
(parsed and validated by the daemon's own code, :func:`memoriesd.config.load_config`), the daemon
(reachable, same version as this CLI, no restart pending), the local embedding model (files present
with the pinned sizes; their SHA-256 too with ``--deep``), the OS keyring, the cache caps against
each unlocked vault's size (asked of the daemon), and the proxy each remote endpoint would use.

config.toml comes before everything that depends on it. When it is invalid, that is the one cause
named: the checks that read it (model, caps, proxy) are skipped with an ``info`` line, since what
they would find follows from the broken file (an ignored ``model_dir`` is not missing model files),
and the daemon check does not send the person to a restart that would refuse the file.

The daemon is never started: what needs it is skipped when it is not running. Each check is
``ok``, ``info`` (a normal state worth knowing, e.g. no keyring) or ``action`` (something to fix);
the command exits 1 when any check needs action. Only the standard library and memoriesd's light
modules (config, net; keyring for its check) are imported, never numpy, onnxruntime or jieba.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memoriesd import __version__
from memoriesd.home import Home

from .state import cli_command

OK, INFO, ACTION = "ok", "info", "action"
MIB = 1024 * 1024
NEAR_CAP = 0.9  # a cap used to 90 % is reported (info) before it refuses an index
GRAPH_CANDIDATES = ("onnx/model_q4.onnx", "model.onnx", "onnx/model.onnx")  # as memoriesd.embed.profile
MANIFEST_NAME = "embeddinggemma.json"
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@dataclass
class Finding:
    check: str  # home, daemon, config, model, keyring, caps, proxy
    status: str  # ok | info | action
    message: str
    fix: str | None = None  # the command (or edit) that fixes it


@dataclass
class Context:
    home: Home
    deep: bool
    environ: Mapping[str, str]
    config: Any = None  # memoriesd.config.Config once parsed (defaults when invalid)
    config_error: str | None = None  # why config.toml is invalid; the checks that read it are skipped
    daemon: Any = None  # a connected Client, or None when the daemon is not running


# --------------------------------------------------------------------------- home


def _loose(mode: int) -> bool:
    return bool(mode & 0o077)  # any group/other bit: 0700 dirs and 0600 files (stricter is fine)


def check_home(ctx: Context) -> list[Finding]:
    root = ctx.home.root
    if not root.exists():
        return [Finding("home", INFO, f"{root} does not exist yet: the first command creates it",
                        cli_command("vault", "create", "NAME"))]
    uid = os.getuid()
    loose: list[Path] = []
    foreign: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            p = Path(dirpath) if name == "." else Path(dirpath) / name
            if name != "." and p == root:
                continue
            try:
                st = p.lstat()
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            if st.st_uid != uid:
                foreign.append(p)
            mode = stat.S_IMODE(st.st_mode)
            # config.toml holds no secret (keys are refused there) and editors write it 0644: only
            # others' write access matters for it.
            if (mode & 0o022) if p == ctx.home.config_path else _loose(mode):
                loose.append(p)
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
    out: list[Finding] = []
    if foreign:
        out.append(Finding("home", ACTION, f"{len(foreign)} path(s) in {root} belong to another user, e.g. {foreign[0]}",
                           f"chown -R $(id -un) {root}"))
    if loose:
        out.append(Finding("home", ACTION, f"{len(loose)} path(s) in {root} are open to other users "
                           f"(directories must be 0700, files 0600; config.toml not writable by others), e.g. {loose[0]}", f"chmod -R go-rwx {root}"))
    if not out:
        out.append(Finding("home", OK, f"{root}: directories 0700, files 0600"))
    return out


# --------------------------------------------------------------------------- daemon


def check_daemon(ctx: Context) -> list[Finding]:
    from memoriesd.errors import MemoriesError

    from .client import Client, daemon_alive

    home = ctx.home
    try:
        home.check_socket_path()
    except MemoriesError as exc:
        return [Finding("daemon", ACTION, exc.message, "choose a shorter --home or MEMORIES_HOME")]
    if not daemon_alive(home):
        if ctx.config_error is not None:
            return [Finding("daemon", INFO, "memoriesd is not running, and cannot start until config.toml is valid "
                            "(the config check above)")]
        return [Finding("daemon", INFO, "memoriesd is not running (the next command that needs it starts it); "
                        "checks that need it are skipped", cli_command("daemon", "start"))]
    client = Client(home, autostart=False)
    try:
        status = client.call("daemon.status")
    except MemoriesError as exc:
        return [Finding("daemon", ACTION, f"memoriesd does not answer: {exc.message}", cli_command("daemon", "restart"))]
    ctx.daemon = client
    out = []
    restart = cli_command("daemon", "restart")
    if ctx.config_error is not None:  # a restart would refuse the file: it comes first
        restart = f"fix {home.config_path} first (the config check above), then {restart}"
    version = str(status.get("version", "?"))
    if version != __version__:
        out.append(Finding("daemon", ACTION, f"memoriesd {version} (pid {status.get('pid')}) is not this CLI's "
                           f"version {__version__}: an upgrade is waiting for a restart", restart))
    if status.get("restart_pending") and ctx.config_error is None:
        out.append(Finding("daemon", ACTION, "config.toml changed since memoriesd started: the change is not in use yet",
                           cli_command("daemon", "restart")))
    if not out:
        unlocked = status.get("unlocked") or []
        out.append(Finding("daemon", OK, f"memoriesd {version} (pid {status.get('pid')}) answers; "
                           f"{len(unlocked)} vault(s) unlocked"))
    return out


# --------------------------------------------------------------------------- config


def check_config(ctx: Context) -> list[Finding]:
    from memoriesd.config import Config, load_config
    from memoriesd.errors import MemoriesError

    from .client import daemon_alive

    path = ctx.home.config_path
    try:
        ctx.config = load_config(path)
    except MemoriesError as exc:
        ctx.config = Config()
        ctx.config_error = exc.message
        then = cli_command("daemon", "restart") if daemon_alive(ctx.home) else "the command again"
        return [Finding("config", ACTION, exc.message, f"edit {path} as it says, then run {then}")]
    if not path.exists():
        return [Finding("config", OK, f"no {path}: every setting has its default")]
    if ctx.config.deprecated:
        return [Finding("config", INFO, f"{path} is valid but spells {len(ctx.config.deprecated)} key(s) the old way "
                        "(read until the next release)", f"{cli_command('config', 'show')} names the new key of each")]
    return [Finding("config", OK, f"{path} is valid")]


# --------------------------------------------------------------------------- model


def _manifest() -> dict[str, Any] | None:
    """The pinned manifest, read as `memoriesd.embed.install` finds it (without importing onnxruntime)."""
    import memoriesd

    package = Path(memoriesd.__file__).resolve().parent
    for c in (package.parent / "models" / MANIFEST_NAME, package / "data" / MANIFEST_NAME):
        try:
            data = json.loads(c.read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("files"), list):
            return data
    return None


def _sha256(path: Path) -> str:
    import hashlib

    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def check_model(ctx: Context) -> list[Finding]:
    emb = ctx.config.embedding
    default_dir = ctx.home.models / "embeddinggemma"
    model_dir = Path(emb.local.model_dir) if emb.local.model_dir else default_dir
    remote = emb.service.configured
    install = cli_command("rag", "model-install")
    if emb.effective_source == "remote":
        return [Finding("model", OK, "embeddings come from the [embedding.service] service; no local model is needed")]
    if not model_dir.is_dir():
        if emb.source == "local" or emb.local.model_dir:
            return [Finding("model", ACTION, f"no local model in {model_dir}, which config.toml asks for", install)]
        note = "the [embedding.service] service embeds meanwhile" if remote else "search is keyword-only (bm25) until one is installed"
        return [Finding("model", INFO, f"no local embedding model in {model_dir}: {note}", install)]
    manifest = _manifest()
    upstream = model_dir / "UPSTREAM.json"
    pinned = manifest is not None and (model_dir == default_dir or upstream.is_file())
    if not pinned:
        has_graph = any((model_dir / g).is_file() for g in GRAPH_CANDIDATES)
        if not has_graph or not (model_dir / "tokenizer.json").is_file():
            return [Finding("model", ACTION, f"{model_dir} has no ONNX graph ({', '.join(GRAPH_CANDIDATES)}) or no "
                            "tokenizer.json", f"fix [embedding.local] model_dir in {ctx.home.config_path}, or run {install}")]
        return [Finding("model", OK, f"custom model in {model_dir} (not the pinned one: its digests are not checked)")]
    assert manifest is not None
    bad: list[str] = []
    missing: list[str] = []
    for f in manifest["files"]:
        p = model_dir / str(f.get("path", ""))
        try:
            size = p.stat().st_size
        except OSError:
            missing.append(str(f.get("path")))
            continue
        if size != f.get("size") or (ctx.deep and _sha256(p) != f.get("sha256")):
            bad.append(str(f.get("path")))
    if bad:
        what = "SHA-256" if ctx.deep else "size"
        return [Finding("model", ACTION, f"{len(bad)} model file(s) in {model_dir} do not have the pinned {what}: "
                        f"{', '.join(bad)}", f"remove them, then run {install}")]
    if missing:
        return [Finding("model", ACTION, f"{len(missing)} model file(s) missing in {model_dir}: {', '.join(missing)}", install)]
    how = "sizes and SHA-256 digests" if ctx.deep else "sizes (--deep also checks the SHA-256 digests)"
    return [Finding("model", OK, f"{manifest.get('name', 'model')} in {model_dir}: {how} match the pinned manifest")]


# --------------------------------------------------------------------------- keyring


def check_keyring(ctx: Context) -> list[Finding]:
    try:
        import keyring
        from keyring.backends import fail

        backend = keyring.get_keyring()
    except Exception:  # a broken keyring install is the same state for us: not available
        backend = None
        fail = None  # type: ignore[assignment]
    none = backend is None or (fail is not None and isinstance(backend, fail.Keyring)) or (
        hasattr(backend, "backends") and not backend.backends
    )
    if none:
        return [Finding("keyring", INFO, "no OS keyring here: vaults unlock with their passphrase "
                        "(`vault unlock --remember` cannot keep it); this is a normal state")]
    return [Finding("keyring", OK, f"OS keyring available ({type(backend).__module__}.{type(backend).__name__})")]


# --------------------------------------------------------------------------- caps


def check_caps(ctx: Context) -> list[Finding]:
    from memoriesd.errors import MemoriesError

    if ctx.daemon is None:
        return [Finding("caps", INFO, "skipped: memoriesd is not running (caps are checked against unlocked vaults)")]
    try:
        vaults = ctx.daemon.call("vault.list")["vaults"]
    except MemoriesError as exc:
        return [Finding("caps", ACTION, f"memoriesd did not list the vaults: {exc.message}", cli_command("daemon", "restart"))]
    out: list[Finding] = []
    locked = [v for v in vaults if v.get("locked")]
    fix = f"raise the cap in [index] of {ctx.home.config_path}, then {cli_command('daemon', 'restart')}"
    for v in vaults:
        if v.get("locked"):
            continue
        try:
            st = ctx.daemon.call("rag.status", {"vault": v["vault_id"]})
        except MemoriesError as exc:
            out.append(Finding("caps", INFO, f"vault {v['name']}: not checked ({exc.message})"))
            continue
        cache = st.get("cache", {})
        if st.get("index") == "over_cap":
            out.append(Finding("caps", ACTION, f"vault {v['name']}: {st.get('cap_error', 'over a cache cap')}", fix))
            continue
        uses = [
            ("fragments", st.get("fragments") or 0, cache.get("max_fragments") or 0, "max_fragments"),
            ("source text", cache.get("source_bytes") or 0, (cache.get("max_source_mib") or 0) * MIB, "max_source_mib"),
            ("vectors", (st.get("embedding") or {}).get("vector_bytes") or 0, (cache.get("max_vector_mib") or 0) * MIB,
             "max_vector_mib"),
        ]
        near = [f"{what} {used / cap:.0%} of {key}" for what, used, cap, key in uses if cap and used >= NEAR_CAP * cap]
        if near:
            out.append(Finding("caps", INFO, f"vault {v['name']} is near its caps: {', '.join(near)}", fix))
        else:
            shares = ", ".join(f"{what} {used / cap:.0%}" for what, used, cap, _ in uses if cap)
            out.append(Finding("caps", OK, f"vault {v['name']}: within the caps ({shares})"))
    if locked:
        out.append(Finding("caps", INFO, f"{len(locked)} locked vault(s) not checked: unlock them to include them"))
    if not vaults:
        out.append(Finding("caps", OK, "no vaults yet"))
    return out


# --------------------------------------------------------------------------- proxy


def _endpoints(ctx: Context) -> list[tuple[str, str]]:
    from memoriesd.config import SERVICE_TABLES, service

    out = [(f"[{t}]", service(ctx.config, t).url) for t in SERVICE_TABLES if service(ctx.config, t).url]
    base = ctx.config.embedding.local.download_url
    if not base:
        manifest = _manifest()
        pattern = str((manifest or {}).get("base_url", ""))
        base = pattern.replace("{revision}", str((manifest or {}).get("revision", "")))
    if base:
        out.append(("model download", base))
    return out


def check_proxy(ctx: Context) -> list[Finding]:
    from memoriesd.errors import MemoriesError
    from memoriesd.net.proxy import proxy_for, proxy_label
    from memoriesd.urls import parse_url

    env = ctx.environ
    http = ctx.config.http
    out: list[Finding] = []
    for name in PROXY_VARS:
        low, up = env.get(name, "").strip(), env.get(name.upper(), "").strip()
        if low and up and low != up:
            out.append(Finding("proxy", ACTION, f"{name} and {name.upper()} differ: Memories uses {name} (lower case "
                               "first), other tools may use the other", f"unset {name.upper()} (or make them equal)"))
    set_vars = [n for n in PROXY_VARS[:3] if env.get(n, "").strip() or env.get(n.upper(), "").strip()]
    if set_vars and not http.use_env_proxy and not http.proxy_url:
        out.append(Finding("proxy", INFO, f"{', '.join(v.upper() for v in set_vars)} set, but [http] use_env_proxy "
                           "= false: Memories connects directly"))
    for label, url in _endpoints(ctx):
        try:
            route = proxy_label(proxy_for(parse_url(url, purpose=label), http, env))
        except MemoriesError as exc:
            out.append(Finding("proxy", ACTION, f"{label}: {exc.message}", "fix the proxy variable or [http] proxy_url"))
            continue
        shown = url.split("?", 1)[0]
        out.append(Finding("proxy", OK, f"{label} {shown}: {'direct' if route == 'direct' else 'via ' + route}"))
    if ctx.daemon is not None and any(env.get(k) for n in PROXY_VARS for k in (n, n.upper())):
        out.append(Finding("proxy", INFO, "the routes above use this shell's environment; memoriesd uses the one it "
                           "was started with", cli_command("daemon", "restart") + " (from this shell, to apply it)"))
    if not out:
        out.append(Finding("proxy", OK, "no proxy set and no remote endpoint configured"))
    return out


CHECKS: tuple[Callable[[Context], list[Finding]], ...] = (
    check_home, check_config, check_daemon, check_model, check_keyring, check_caps, check_proxy,
)
#: The checks that read config.toml's values: skipped while it is invalid (their findings would be its echo).
NEEDS_CONFIG = (check_model, check_caps, check_proxy)


def run_checks(home: Home, *, deep: bool = False, environ: Mapping[str, str] | None = None) -> list[Finding]:
    ctx = Context(home=home, deep=deep, environ=os.environ if environ is None else environ)
    findings: list[Finding] = []
    for check in CHECKS:
        if check in NEEDS_CONFIG and ctx.config_error is not None:
            name = check.__name__.removeprefix("check_")
            findings.append(Finding(name, INFO, "not checked: it depends on config.toml, which is invalid (the config "
                                    "check above); run doctor again once the file is fixed"))
            continue
        findings.extend(check(ctx))
    return findings
