"""The tables of ``config.toml``: one frozen dataclass per table, with the rules of each key.

Tables, each one concern (``docs/config.md`` is the reference, ``config.example.toml`` shows every
key with its default):

``[daemon]`` the socket server · ``[vault]`` the encrypted store · ``[index]`` each unlocked vault's
search index (in-memory caps, what is embedded and when) · ``[embedding]`` which model embeds
(``[embedding.local]`` the local model, ``[embedding.service]`` a remote one) · ``[search]``
retrieval · ``[context]`` context packs · ``[watch]`` and ``[[watch.folder]]`` folders kept in sync
· ``[sync]`` how sync reaches its targets (the ``rclone`` program) · ``[http]`` the one HTTP client (model download and services) · ``[generation]`` and ``[rerank]``
remote services.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DaemonConfig:
    autostart: bool = True
    auto_lock_minutes: float = 15.0
    log_level: str = "info"
    max_frame_mib: int = 16
    # Resource bounds (issue 13; SECURITY.md "Resource bounds").
    max_connections: int = 256  # also capped below the open-file limit
    idle_timeout_seconds: float = 600.0  # 0 = never close an idle connection
    max_requests_per_connection: int = 32  # in flight; further frames are not read until one ends
    write_timeout_seconds: float = 30.0  # a client that does not read its replies this long is cut off
    keepalive_seconds: float = 10.0  # a keep-alive progress frame this often while a request runs


@dataclass(frozen=True)
class VaultConfig:
    kdf_memory_kib: int = 65536
    kdf_iterations: int = 3
    kdf_lanes: int = 4
    keep_revisions: int = 10
    unlock_delay_step_ms: int = 100
    unlock_delay_max_ms: int = 2000
    max_document_mib: float = 4.0  # the largest document `rag ingest` and a watched folder accept


@dataclass(frozen=True)
class IndexConfig:
    """``[index]``: the search index of each unlocked vault (memory only), and how it is filled."""

    # Sized from measured memory (docs/benchmarks.md "Memory and the cache caps"): a vault of 150,000 fragments
    # (192 MiB of text fits CJK notes; 768-dim int8 vectors take 110 MiB).
    max_fragments: int = 150000
    max_source_mib: float = 192.0
    max_vector_mib: float = 128.0
    # How vectors are held in memory, and sealed on disk (vector sidecar version 2): float32, float16, int8.
    vector_precision: str = "int8"
    background: bool = True  # embed missing fragments in the background (local model only)
    conversation_windows: bool = True  # a vector per two-turn window of conversation fragments
    budget_seconds: float = 300.0  # one embedding operation (`rag index`) stops after this, keeping finished batches


#: The old name of :class:`IndexConfig` (it was ``[rag.cache]``).
CacheConfig = IndexConfig


@dataclass(frozen=True)
class LocalModelConfig:
    """Profile overrides for a local model that is not EmbeddingGemma (0 / "" = infer).

    Not a table of its own: :attr:`EmbeddingConfig.overrides` builds it from ``[embedding]``
    ``max_tokens`` and ``[embedding.local]`` ``dimensions``, ``query_prompt``, ``document_prompt``.
    """

    dimensions: int = 0  # 0 = infer from the graph
    max_tokens: int = 0  # 0 = infer from the model files
    query_prompt: str = ""  # e.g. "task: search result | query: " ; "" = none
    document_prompt: str = ""  # may contain {title} and {text}; "" = none


@dataclass(frozen=True)
class LocalEmbeddingConfig:
    """``[embedding.local]``: the local ONNX model."""

    model_dir: str = ""  # "" = HOME/models/embeddinggemma; absolute after loading
    threads: int = 4  # onnxruntime intra-op threads (capped at the CPU count)
    idle_minutes: float = 10.0  # the model process ends after this long unused; 0 = keep it
    download_url: str = ""  # `rag model-install` mirror; "" = the pinned Hugging Face revision
    dimensions: int = 0  # not EmbeddingGemma: Matryoshka cut; 0 = the graph's width
    query_prompt: str = ""  # not EmbeddingGemma: prefix of a query
    document_prompt: str = ""  # not EmbeddingGemma: may contain {title} and {text}


@dataclass(frozen=True)
class ServiceConfig:
    """A remote model service: ``[embedding.service]``, ``[generation]`` or ``[rerank]``."""

    protocol: str = ""
    url: str = ""
    model: str = ""
    api_key_env: str = ""
    dimensions: int = 0  # embedding only; 0 = the service default

    @property
    def configured(self) -> bool:
        return bool(self.url)


@dataclass(frozen=True)
class EmbeddingConfig:
    """``[embedding]``: which model embeds, and its token cap."""

    # "local", "remote" or "auto" (the local model when installed, else the service);
    # "" (not set) = derived: "remote" when [embedding.service] is configured, else "local".
    source: str = ""
    max_tokens: int = 0  # tokens per fragment; 0 = the model's maximum (a model that is not Gemma: its maximum when set)
    local: LocalEmbeddingConfig = field(default_factory=LocalEmbeddingConfig)
    service: ServiceConfig = field(default_factory=ServiceConfig)

    @property
    def overrides(self) -> LocalModelConfig:
        """The profile overrides handed to a local model that is not EmbeddingGemma."""
        lo = self.local
        return LocalModelConfig(lo.dimensions, self.max_tokens, lo.query_prompt, lo.document_prompt)

    @property
    def effective_source(self) -> str:
        """``source`` with "not set" resolved: "local", "remote" or "auto"."""
        return self.source or ("remote" if self.service.configured else "local")


@dataclass(frozen=True)
class SearchConfig:
    candidates: int = 100  # candidates taken from each side (BM25, vectors) before fusion
    # Vector neighbours below this cosine are no match, in search, `rag ask` and `rag context`:
    # 0 = the model's calibrated floor, -1 = none.
    min_cosine: float = 0.0
    on_demand_embed_limit: int = 256  # a vector/hybrid search embeds at most this many missing fragments itself


@dataclass(frozen=True)
class ContextConfig:
    budget: int = 1000  # `rag context`: the pack's token budget when --budget is not given
    # "auto": with a [generation] service the vault's policy allows, the question is first rewritten into
    # a few search queries (memoriesd.memory.rewrite); "off" (the default): the question alone is searched.
    rewrite: str = "off"
    rewrite_timeout_seconds: float = 15.0  # the rewrite's whole wait; then the question alone is searched


@dataclass(frozen=True)
class WatchConfig:
    """One ``[[watch.folder]]`` table: a folder kept in sync with a vault while the vault is unlocked."""

    vault: str = ""  # vault id or name
    path: str = ""  # absolute after loading (~ expanded, relative = next to config.toml)
    recursive: bool = False
    include: tuple[str, ...] = ()  # file globs; () = *.md, *.markdown, *.txt
    prune: bool = False  # remove the card of a file deleted from the folder


@dataclass(frozen=True)
class WatchSettings:
    """``[watch]``: its ``debounce_seconds`` and the ``[[watch.folder]]`` tables (``folder`` in TOML)."""

    debounce_seconds: float = 1.0  # a watched folder syncs once no change came for this long
    folders: tuple[WatchConfig, ...] = ()


@dataclass(frozen=True)
class SyncConfig:
    """``[sync]``: how encrypted sync reaches its targets (docs/config.md "Sync targets")."""

    # The program behind `rclone:REMOTE:PATH` targets: a name looked up on the daemon's PATH, or a path.
    rclone_program: str = "rclone"
    rclone_config: str = ""  # rclone's config file; "" = rclone's own choice ($RCLONE_CONFIG, else its default)
    rclone_timeout_seconds: float = 120.0  # one rclone command (list, read, write, delete) is stopped after this
    debounce_seconds: float = 1.0  # a change is pushed once nothing changed for this long (at most 10x after the first)
    poll_seconds: float = 60.0  # how often a target is read when nothing says it changed (a watched folder: 5x this)
    device_days: float = 30.0  # a forget leaves the target once every device seen in these last days applied it
    watch: bool = True  # a folder target is watched (inotify); false: read only every poll_seconds (network mounts)


@dataclass(frozen=True)
class HttpConfig:
    use_env_proxy: bool = True
    proxy_url: str = ""
    retries: int = 2
    backoff_ms: int = 500
    connect_timeout_seconds: float = 10.0
    timeout_seconds: float = 60.0
    download_timeout_seconds: float = 1800.0
    ca_bundle: str = ""  # resolved to an absolute path, "" = system store only


@dataclass(frozen=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    vault: VaultConfig = field(default_factory=VaultConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    watch: WatchSettings = field(default_factory=WatchSettings)
    sync: SyncConfig = field(default_factory=SyncConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    generation: ServiceConfig = field(default_factory=ServiceConfig)
    rerank: ServiceConfig = field(default_factory=ServiceConfig)
    path: str = ""  # the file it came from, "" when absent
    deprecated: tuple[str, ...] = ()  # one line per old key still in the file (logged at start)
    # Where each key that the file set came from: "config.toml" or "deprecated key rag.x" (see config show).
    sources: tuple[tuple[str, str], ...] = ()


#: Fields of :class:`Config` that are not tables of the file.
META_FIELDS = ("path", "deprecated", "sources")

# ---------------------------------------------------------------------------
# Validation rules: (min, max) for numbers, choices for strings.
# ---------------------------------------------------------------------------

RANGES: dict[str, tuple[float, float]] = {
    "daemon.auto_lock_minutes": (0, 60 * 24 * 365),
    "daemon.max_frame_mib": (9, 256),
    "daemon.max_connections": (1, 65536),
    "daemon.idle_timeout_seconds": (0, 7 * 86400),
    "daemon.max_requests_per_connection": (1, 1024),
    "daemon.write_timeout_seconds": (0.05, 3600),
    # Below the CLI's 30 s silence timeout, so a running request never looks like a hung daemon.
    "daemon.keepalive_seconds": (0.05, 20),
    "vault.kdf_memory_kib": (8, 4 * 1024 * 1024),
    "vault.kdf_iterations": (1, 64),
    "vault.kdf_lanes": (1, 64),
    "vault.keep_revisions": (1, 10000),
    "vault.unlock_delay_step_ms": (0, 10000),
    "vault.unlock_delay_max_ms": (0, 60000),
    "vault.max_document_mib": (0.001, 64),
    "index.max_fragments": (1, 10_000_000),
    "index.max_source_mib": (0.001, 65536),
    "index.max_vector_mib": (0.001, 65536),
    "index.budget_seconds": (1, 86400),
    "embedding.max_tokens": (0, 1 << 20),
    "embedding.local.threads": (1, 256),
    "embedding.local.idle_minutes": (0, 60 * 24 * 365),
    "embedding.local.dimensions": (0, 65536),
    "embedding.service.dimensions": (0, 65536),
    "search.candidates": (10, 1000),
    "search.min_cosine": (-1, 1),
    "search.on_demand_embed_limit": (0, 100000),
    "context.budget": (32, 1_000_000),
    "context.rewrite_timeout_seconds": (0.5, 600),
    "watch.debounce_seconds": (0.05, 60),
    "sync.rclone_timeout_seconds": (1, 86400),
    "sync.debounce_seconds": (0.05, 600),
    "sync.poll_seconds": (1, 86400),
    "sync.device_days": (1, 3650),
    "http.retries": (0, 5),
    "http.backoff_ms": (0, 60000),
    "http.connect_timeout_seconds": (0.05, 600),
    "http.timeout_seconds": (0.05, 3600),
    "http.download_timeout_seconds": (0.05, 86400),
}

CHOICES: dict[str, tuple[str, ...]] = {
    "daemon.log_level": ("debug", "info", "warning", "error"),
    "index.vector_precision": ("float32", "float16", "int8"),
    "embedding.source": ("", "local", "remote", "auto"),
    "embedding.service.protocol": ("", "gemini", "compatible"),
    "generation.protocol": ("", "gemini", "compatible"),
    "context.rewrite": ("off", "auto"),
    "rerank.protocol": ("", "compatible"),
}

PATH_KEYS = {"embedding.local.model_dir", "http.ca_bundle", "sync.rclone_config"}

#: Programs: a bare name is looked up on PATH; one with a ``/`` (or ``~``) resolves like a path key.
PROGRAM_KEYS = {"sync.rclone_program"}

#: The remote services, by table.
SERVICE_TABLES = ("embedding.service", "generation", "rerank")
