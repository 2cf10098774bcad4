"""config.toml: the example and `config show` agree with the code table by table, strict types and
ranges, secrets refused, and every key of the old layout still read with a one-line notice."""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import pytest

from memoriesd.config import (
    DEPRECATED_KEYS,
    Config,
    ServiceConfig,
    WatchConfig,
    effective_options,
    load_config,
    option_keys,
    parse_config,
)
from memoriesd.errors import ConfigError

from .conftest import REPO, Daemon, run_cli, short_tmpdir, write_config

EXAMPLE = (REPO / "config.example.toml").read_text()


def _tables(doc: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    """``{"embedding.local": {...keys}}``: every table of a decoded document, by dotted name."""
    out: dict[str, dict[str, Any]] = {}
    leaves = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    if prefix:
        out[prefix] = leaves
    for k, v in doc.items():
        if isinstance(v, dict):
            out.update(_tables(v, f"{prefix}.{k}" if prefix else k))
    return out


def _code_tables() -> dict[str, dict[str, Any]]:
    """The defaults of the code, table by table (the file's tables only)."""
    out: dict[str, dict[str, Any]] = {}
    for key in option_keys():
        table, _, name = key.rpartition(".")
        out.setdefault(table, {})[name] = None
    plain = asdict(Config())
    for table, keys in out.items():
        node: Any = plain
        for part in table.split("."):
            node = node[part]
        for name in keys:
            keys[name] = list(node["folders"]) if (table, name) == ("watch", "folder") else node[name]
    return out


def _commented_tables() -> dict[str, dict[str, Any]]:
    """The example's commented-out tables (remote services, watched folders), uncommented."""
    lines = [ln[2:] for ln in EXAMPLE.splitlines() if re.match(r"# (\[|[a-z_]+ = )", ln)]
    return _tables(tomllib.loads("\n".join(lines)))


def test_the_example_shows_every_table_every_key_and_every_default_of_the_code() -> None:
    example = _tables(tomllib.loads(EXAMPLE))
    code = _code_tables()
    commented = _commented_tables()
    services = {"embedding.service", "generation", "rerank"}
    # Every table of the code is in the example (the services and [[watch.folder]] as commented examples).
    assert set(example) | services == set(code), (set(example), set(code))
    for table, keys in code.items():
        if table in services:
            continue
        shown = dict(example[table])
        if table == "watch":
            shown["folder"] = []  # no folder by default: shown as a commented [[watch.folder]] table
        assert shown == keys, table  # every key, every default, nothing else
    for table in services:
        assert set(commented[table]) == set(code[table]), table
        assert all(v == "" or v == 0 for v in code[table].values())  # not configured by default
    (folder,) = commented["watch"]["folder"]
    assert set(folder) == {f.name for f in fields(WatchConfig)}
    # The example parses to the defaults, with no notice.
    cfg = parse_config(tomllib.loads(EXAMPLE), REPO)
    assert cfg.deprecated == () and cfg == Config(sources=cfg.sources)


def test_config_show_lists_every_option_of_the_example_with_its_default() -> None:
    cfg = parse_config(tomllib.loads(EXAMPLE), REPO)
    rows = {o.key: o for o in effective_options(cfg)}
    code = _code_tables()
    assert set(rows) == {f"{t}.{k}" for t, keys in code.items() for k in keys}
    for key, o in rows.items():
        table, _, name = key.rpartition(".")
        assert o.default == code[table][name], key
        if key == "embedding.source":
            assert (o.value, o.source) == ("local", "derived: no [embedding.service] is configured")
        else:
            assert o.value == o.default, key
    assert {o.source for o in rows.values()} >= {"config.toml", "default"}


def test_config_show_on_the_command_line_reports_values_and_their_sources(tmp_path: Path) -> None:
    home = short_tmpdir()
    write_config(home, '[rag]\nlocal_threads = 2\n[search]\ncandidates = 50\n[generation]\nprotocol = "compatible"\n'
                       'url = "http://127.0.0.1:9/v1/chat/completions"\nmodel = "m"\n')
    r = run_cli(home, "config", "show", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = {o["key"]: o for o in out["options"]}
    expected = {asdict(o)["key"]: asdict(o) for o in effective_options(load_config(home / "config.toml"))}
    assert rows == expected
    assert rows["embedding.local.threads"] == {"key": "embedding.local.threads", "value": 2, "default": 4,
                                               "source": "deprecated key rag.local_threads"}
    assert rows["search.candidates"]["source"] == "config.toml" and rows["generation.model"]["value"] == "m"
    assert rows["daemon.autostart"]["source"] == "default"
    assert out["deprecated"] == ["config: [rag] local_threads is now [embedding.local] threads: rename it "
                                 "(read from the old place until the next release)"]
    text = run_cli(home, "config", "show")
    assert text.returncode == 0 and "threads = 2  # deprecated key rag.local_threads" in text.stdout
    assert "[embedding.local]" in text.stdout and "[embedding.local] threads" in text.stderr
    assert not (home / "run" / "memoriesd.sock").exists()  # a pure read: no daemon started


# Every key of the old layout at a value that is not its default, and where it must land.
OLD_LAYOUT = """
[daemon]
auto_lock_minutes = 5
test_allow_uid = 65534
vault_process = true
[rag]
local_model_dir = "models/mini"
embedding_source = "auto"
local_threads = 2
max_tokens = 256
model_download_base_url = "https://mirror.example/m"
operation_budget_seconds = 120
on_demand_embed_limit = 64
fusion = "rrf"
rrf_k = 30
candidates = 50
max_document_mib = 8
ask_min_cosine = 0.3
rerank_default = false
vector_weight = 2
background_index = false
conversation_windows = false
model_idle_minutes = 3
query_cache_items = 10
query_cache_seconds = 5
context_budget = 500
context_profile_share = 0.5
context_items = 10
watch_debounce_seconds = 2
[rag.http]
use_env_proxy = false
proxy_url = "http://proxy.example:3128"
retries = 4
backoff_ms = 100
connect_timeout_seconds = 3
timeout_seconds = 30
download_timeout_seconds = 600
ca_bundle = "ca.pem"
[rag.cache]
max_fragments = 1000
max_source_mib = 16
max_vector_mib = 32
vector_precision = "float16"
max_vaults = 1
[rag.local_model]
dimensions = 128
max_tokens = 512
query_prompt = "q: "
document_prompt = "d: {text}"
[rag.embedding]
protocol = "compatible"
url = "http://127.0.0.1:9/v1/embeddings"
model = "e"
dimensions = 64
[rag.generation]
protocol = "compatible"
url = "http://127.0.0.1:9/v1/chat/completions"
model = "g"
[rag.rerank]
protocol = "compatible"
url = "http://127.0.0.1:9/v1/rerank"
model = "r"
[[rag.watch]]
vault = "personal"
path = "notes"
prune = true
"""

NEW_VALUES = {
    "daemon.auto_lock_minutes": 5.0,
    "embedding.local.model_dir": "MODELS",
    "embedding.source": "auto",
    "embedding.local.threads": 2,
    "embedding.max_tokens": 256,  # [rag] max_tokens capped [rag.local_model] max_tokens = 512
    "embedding.local.download_url": "https://mirror.example/m",
    "index.budget_seconds": 120.0,
    "search.on_demand_embed_limit": 64,
    "search.candidates": 50,
    "vault.max_document_mib": 8.0,
    "search.min_cosine": 0.3,
    "index.background": False,
    "index.conversation_windows": False,
    "embedding.local.idle_minutes": 3.0,
    "context.budget": 500,
    "watch.debounce_seconds": 2.0,
    "http.use_env_proxy": False,
    "http.proxy_url": "http://proxy.example:3128",
    "http.retries": 4,
    "http.backoff_ms": 100,
    "http.connect_timeout_seconds": 3.0,
    "http.timeout_seconds": 30.0,
    "http.download_timeout_seconds": 600.0,
    "http.ca_bundle": "CA",
    "index.max_fragments": 1000,
    "index.max_source_mib": 16.0,
    "index.max_vector_mib": 32.0,
    "index.vector_precision": "float16",
    "embedding.local.dimensions": 128,
    "embedding.local.query_prompt": "q: ",
    "embedding.local.document_prompt": "d: {text}",
    "embedding.service.model": "e",
    "embedding.service.dimensions": 64,
    "generation.model": "g",
    "rerank.model": "r",
}


def test_a_config_of_the_old_layout_keeps_working_with_one_notice_per_old_key(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(OLD_LAYOUT)
    cfg = load_config(tmp_path / "config.toml")
    rows = {o.key: o for o in effective_options(cfg)}
    for key, value in NEW_VALUES.items():
        value = {"MODELS": str((tmp_path / "models" / "mini").resolve()), "CA": str((tmp_path / "ca.pem").resolve())}.get(
            str(value), value)
        assert rows[key].value == value, key
        if key != "daemon.auto_lock_minutes":
            assert rows[key].source.startswith("deprecated key rag."), key
    assert cfg.watch.folders == (WatchConfig("personal", str(tmp_path / "notes"), False, (), True),)
    assert cfg.embedding.overrides.max_tokens == 256 and cfg.embedding.overrides.dimensions == 128
    # One line per old key written (the [[rag.watch]] array counts once), each naming its new key or why it is gone.
    rag = tomllib.loads(OLD_LAYOUT)["rag"]
    assert len(cfg.deprecated) == 2 + sum(len(v) if isinstance(v, dict) else 1 for v in rag.values())
    assert all("\n" not in n and n.startswith("config: [") for n in cfg.deprecated)
    assert "config: [rag] candidates is now [search] candidates: rename it (read from the old place until the next release)" in cfg.deprecated
    assert any(n.startswith("config: [rag] rrf_k is gone:") and "--rrf-k" in n for n in cfg.deprecated)
    assert any(n.startswith("config: [daemon] test_allow_uid is gone:") for n in cfg.deprecated)
    assert any(n.startswith("config: [[rag.watch]] is now [[watch.folder]]") for n in cfg.deprecated)


def test_every_old_key_names_a_new_key_that_exists_or_a_reason() -> None:
    keys = set(option_keys())
    tables = {k.rpartition(".")[0] for k in keys}
    for old, dep in DEPRECATED_KEYS.items():
        if dep.new is None:
            assert dep.reason, old
        else:
            assert dep.new in keys or dep.new in tables, (old, dep.new)


def test_a_key_written_both_ways_takes_the_new_spelling_and_says_so() -> None:
    cfg = parse_config({"rag": {"candidates": 20}, "search": {"candidates": 40}}, Path("/tmp"))
    assert cfg.search.candidates == 40
    assert cfg.deprecated == ("config: [rag] candidates is ignored: [search] candidates is also set and wins; delete the old line",)


def test_a_bad_value_under_an_old_key_names_both_spellings() -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config({"rag": {"candidates": 5}}, Path("/tmp"))
    assert "search.candidates (written as rag.candidates) = 5 is out of range" in ei.value.message
    with pytest.raises(ConfigError) as ei:
        parse_config({"rag": {"bogus": 1}}, Path("/tmp"))
    assert "unknown config key rag.bogus" in ei.value.message and "docs/config.md" in ei.value.message


def test_a_daemon_started_with_an_old_config_starts_and_logs_one_notice_per_old_key() -> None:
    home = short_tmpdir()
    write_config(home, "[rag]\ncontext_budget = 500\nrrf_k = 30\n")
    d = Daemon(home).start()
    try:
        log = d.log_text()
        assert "[rag] context_budget is now [context] budget" in log and "[rag] rrf_k is gone" in log
    finally:
        d.stop()


@pytest.mark.parametrize(
    "toml,needle",
    [
        ("[daemon]\nbogus = 1\n", "unknown config key daemon.bogus"),
        ("[daemon]\nauto_lock_minutes = \"ten\"\n", "daemon.auto_lock_minutes"),
        ("[daemon]\nautostart = 1\n", "true or false"),
        ("[search]\ncandidates = 5\n", "search.candidates = 5 is out of range"),
        ("[http]\nretries = 9\n", "0 to 5"),
        ("[index]\nmax_fragments = 0\n", "index.max_fragments"),
        ("[embedding.service]\nprotocol = \"openai\"\nurl = \"https://x.example/v1\"\nmodel = \"m\"\n", "one of"),
        ("[generation]\nprotocol = \"compatible\"\nurl = \"https://x.example/v1\"\nmodel = \"m\"\napi_key = \"sk-1\"\n", "api_key_env"),
        ("[http]\nproxy_url = \"http://user:pw@proxy.example:3128\"\n", "credentials"),
        ("[http]\nproxy_url = \"ftp://proxy.example\"\n", "schemes"),
        ("[generation]\nmodel = \"m\"\n", "needs url"),
        ("search = 5\n", "must be a table"),
        ("rag = 5\n", "must be a table"),
        ("[generation]\nprotocol = \"compatible\"\nurl = \"https://x.example/v1\"\nmodel = \"m\"\n"
         "api_key_env = \"sk-1-proj-abc\"\n", "names an environment variable"),
        ("[generation]\nprotocol = \"compatible\"\nurl = \"https://x.example/v1\"\nmodel = \"m\"\n"
         "dimensions = 8\n", "for [embedding.service] only"),
        ("[embedding.service]\nprotocol = \"gemini\"\nurl = \"https://x.example/v1/m:embedContent?key=sk-1\"\n", "api_key_env"),
        ("[generation]\nprotocol = \"compatible\"\nurl = \"http://api.example/v1\"\nmodel = \"m\"\n", "generation.url"),
        ("[rag.generation]\nprotocol = \"compatible\"\nurl = \"https://x.example/v1\"\nmodel = \"m\"\napi_key = \"sk-1\"\n", "api_key_env"),
    ],
)
def test_bad_values_are_one_line_naming_key_value_and_allowed(toml: str, needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config(tomllib.loads(toml), Path("/tmp"))
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg
    assert "sk-1" not in msg and "pw@" not in msg


def test_relative_paths_resolve_next_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('[embedding.local]\nmodel_dir = "models/mini"\n[http]\nca_bundle = "ca.pem"\n')
    cfg = load_config(tmp_path / "config.toml")
    assert cfg.embedding.local.model_dir == str((tmp_path / "models" / "mini").resolve())
    assert cfg.http.ca_bundle == str((tmp_path / "ca.pem").resolve())


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    assert load_config(tmp_path / "absent.toml") == Config()
    (tmp_path / "config.toml").write_text("[daemon\nx=")
    with pytest.raises(ConfigError) as ei:
        load_config(tmp_path / "config.toml")
    assert "not valid TOML" in str(ei.value)


def test_fractional_auto_lock_and_strong_kdf_defaults() -> None:
    cfg = parse_config({"daemon": {"auto_lock_minutes": 0.01}}, Path("/tmp"))
    assert cfg.daemon.auto_lock_minutes == 0.01
    v = Config().vault
    assert (v.kdf_memory_kib, v.kdf_iterations, v.kdf_lanes) == (65536, 3, 4)


def test_service_tables_hold_the_service_keys_only() -> None:
    assert [f.name for f in fields(ServiceConfig)] == ["protocol", "url", "model", "api_key_env", "dimensions"]
    assert "generation.dimensions" not in option_keys() and "embedding.service.dimensions" in option_keys()


def test_rag_watch_edits_an_old_layout_file_finding_old_tables_and_writing_new_ones(tmp_path: Path) -> None:
    from memories_cli.watch_config import WatchEntry, remove_watch, set_watch

    config, lock = tmp_path / "config.toml", tmp_path / "edit.lock"
    config.write_text('# mine\n[rag]\nwatch_debounce_seconds = 2\n[[rag.watch]]\nvault = "v1"\npath = "old"\n')
    old = WatchEntry("v1", "v1", str(tmp_path / "old"))
    new = WatchEntry("v1", "v1", str(tmp_path / "new"), prune=True)
    assert set_watch(config, lock, old) == "unchanged"  # found under its old spelling
    assert set_watch(config, lock, new) == "added"
    doc = tomllib.loads(config.read_text())
    assert doc["watch"]["folder"] == [{"vault": "v1", "path": str(tmp_path / "new"), "recursive": False, "prune": True}]
    assert [w.path for w in load_config(config).watch.folders] == [str(tmp_path / "new"), str(tmp_path / "old")]
    assert remove_watch(config, lock, old) == 1 and remove_watch(config, lock, new) == 1
    text = config.read_text()
    assert "# mine" in text and "watch_debounce_seconds = 2" in text and "path" not in text
    assert load_config(config).watch.folders == ()


def test_doctor_says_an_old_spelling_is_read_and_where_to_find_the_new_key(tmp_path: Path) -> None:
    from memories_cli.doctor_checks import INFO, Context, check_config
    from memoriesd.home import Home

    home = Home(tmp_path)
    home.config_path.write_text("[rag]\ncontext_budget = 500\n")
    (finding,) = check_config(Context(home, deep=False, environ={}))
    assert finding.status == INFO and "1 key(s) the old way" in finding.message and "config show" in (finding.fix or "")
    assert finding.check == "config"
