"""config.toml validation: every key documented, strict types and ranges, secrets refused."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from memoriesd.config import Config, load_config, parse_config
from memoriesd.errors import ConfigError

from .conftest import REPO


def test_example_config_documents_every_key_with_its_default() -> None:
    data = tomllib.loads((REPO / "config.example.toml").read_text())
    cfg = parse_config(data, REPO)
    assert cfg.daemon == Config().daemon and cfg.vault == Config().vault
    assert cfg.rag.http == Config().rag.http and cfg.rag.cache == Config().rag.cache
    defaults = Config()

    def keys(obj: object, prefix: str = "") -> set[str]:
        out = set()
        for name, value in vars(obj).items():
            if name in ("path", "deprecated"):
                continue
            if hasattr(value, "__dataclass_fields__"):
                out |= keys(value, f"{prefix}{name}.")
            else:
                out.add(prefix + name)
        return out

    text = (REPO / "config.example.toml").read_text()
    for key in keys(defaults):
        assert key.rsplit(".", 1)[-1] in text, key


@pytest.mark.parametrize(
    "toml,needle",
    [
        ("[daemon]\nbogus = 1\n", "unknown config key daemon.bogus"),
        ("[daemon]\nauto_lock_minutes = \"ten\"\n", "daemon.auto_lock_minutes"),
        ("[daemon]\nautostart = 1\n", "true or false"),
        ("[rag]\nrrf_k = 0\n", "rag.rrf_k = 0 is out of range"),
        ("[rag.http]\nretries = 9\n", "0 to 5"),
        ("[rag.cache]\nmax_vaults = 0\n", "rag.cache.max_vaults"),
        ("[rag.embedding]\nprotocol = \"openai\"\nurl = \"https://x.example/v1\"\nmodel = \"m\"\n", "one of"),
        ("[rag.generation]\nprotocol = \"compatible\"\nurl = \"https://x.example/v1\"\nmodel = \"m\"\napi_key = \"sk-1\"\n", "api_key_env"),
        ("[rag.http]\nproxy_url = \"http://user:pw@proxy.example:3128\"\n", "credentials"),
        ("[rag.http]\nproxy_url = \"ftp://proxy.example\"\n", "schemes"),
        ("[rag.generation]\nmodel = \"m\"\n", "needs url"),
        ("rag = 5\n", "must be a table"),
        ("[rag.generation]\nprotocol = \"compatible\"\nurl = \"https://x.example/v1\"\nmodel = \"m\"\n"
         "api_key_env = \"sk-1-proj-abc\"\n", "names an environment variable"),
        ("[rag.generation]\nprotocol = \"compatible\"\nurl = \"https://x.example/v1\"\nmodel = \"m\"\n"
         "dimensions = 8\n", "for [rag.embedding] only"),
        ("[rag.embedding]\nprotocol = \"gemini\"\nurl = \"https://x.example/v1/m:embedContent?key=sk-1\"\n", "api_key_env"),
        ("[rag.generation]\nprotocol = \"compatible\"\nurl = \"http://api.example/v1\"\nmodel = \"m\"\n", "rag.generation.url"),
    ],
)
def test_bad_values_are_one_line_naming_key_value_and_allowed(toml: str, needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config(tomllib.loads(toml), Path("/tmp"))
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg
    assert "sk-1" not in msg and "pw@" not in msg


def test_relative_paths_resolve_next_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('[rag]\nlocal_model_dir = "models/mini"\n[rag.http]\nca_bundle = "ca.pem"\n')
    cfg = load_config(tmp_path / "config.toml")
    assert cfg.rag.local_model_dir == str((tmp_path / "models" / "mini").resolve())
    assert cfg.rag.http.ca_bundle == str((tmp_path / "ca.pem").resolve())


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
