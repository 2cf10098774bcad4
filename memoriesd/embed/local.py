"""The local ONNX embedder: EmbeddingGemma-300M and models with the same graph signature.

Graph signature: inputs ``input_ids`` and ``attention_mask`` (int64 ``[batch, seq]``),
output ``sentence_embedding`` (float32 ``[batch, dims]``, pooled and L2-normalized
inside the graph). ``onnxruntime`` is imported lazily, after
``ORT_DISABLE_TELEMETRY=1`` is set, so importing this module is cheap and the
runtime never writes telemetry under ``~/.cache``. Nothing is written into the
model directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import LocalModelConfig
from ..errors import ModelInputFailed, ModelUnavailable
from .profile import (
    GEMMA_BOS_ID,
    GEMMA_EOS_ID,
    INSTALL_HINT,
    find_graph,
    format_document,
    format_query,
    read_json,
    resolve_profile,
    weight_files,
)
from .types import Check, SessionSetting

if TYPE_CHECKING:  # imported when a model loads (onnxruntime after ORT_DISABLE_TELEMETRY is set)
    from onnxruntime import InferenceSession
    from tokenizers import Tokenizer

# Must happen before onnxruntime is first imported anywhere in the process.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

OUTPUT_NAME = "sentence_embedding"
REQUIRED_INPUTS = ("input_ids", "attention_mask")
NORM_TOLERANCE = 0.01
AGREEMENT_MIN_COSINE = 0.9999
MAX_BATCH_ITEMS = 256
_SELF_CHECK_TEXTS = (
    "memories self check",
    "a somewhat longer self check sentence about personal notes, search and retrieval",
)


def plan_batches(lengths: Sequence[int], batch_tokens: int, *, max_items: int = MAX_BATCH_ITEMS) -> list[list[int]]:
    """Length-bucketed batches: indices sorted by token length (longest first), each batch
    holding similar lengths with ``rows x longest <= batch_tokens`` (a single over-long
    item still gets its own batch). Cuts padding compared with batches in input order."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        n = max(1, lengths[i])
        if current and (max(longest, n) * (len(current) + 1) > batch_tokens or len(current) >= max_items):
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


def product_setting(threads: int) -> SessionSetting:
    """The session options the product runs with: ``threads`` intra-op threads (capped at the core
    count), sequential execution, every graph optimisation, idle pool threads not spinning
    (measured in ``bench/bench_embed.py --sessions``: docs/benchmarks.md "Session options")."""
    return SessionSetting(intra_threads=max(1, min(threads, os.cpu_count() or 1)), spinning=False)


def session_options(setting: SessionSetting) -> Any:
    """``onnxruntime.SessionOptions`` for ``setting`` (the benchmark's bare sessions use this too)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, setting.intra_threads)
    opts.inter_op_num_threads = max(1, setting.inter_threads)
    opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL if setting.parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = {
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    }.get(setting.optimization, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    spin = "1" if setting.spinning else "0"
    opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
    opts.add_session_config_entry("session.inter_op.allow_spinning", spin)
    opts.log_severity_level = 3
    return opts


def fixed_batches(count: int, size: int) -> list[list[int]]:
    """Naive batches of ``size`` items in input order (the baseline the benchmark compares with)."""
    return [list(range(i, min(i + size, count))) for i in range(0, count, size)]


def files_digest(paths: Sequence[Path]) -> str:
    """sha256 over the names, sizes and contents of ``paths`` (in order)."""
    outer = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as fh:
            inner = hashlib.file_digest(fh, "sha256").hexdigest()
        outer.update(f"{p.name}\0{p.stat().st_size}\0{inner}\n".encode())
    return outer.hexdigest()


def _unavailable(model_dir: Path, what: str) -> ModelUnavailable:
    return ModelUnavailable(f"the local embedding model in {model_dir} {what}: {INSTALL_HINT}")


def _int_or(value: object, default: int) -> int:
    if isinstance(value, list) and value:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else default


class LocalEmbedder:
    """Embeds queries and fragments with a local ONNX model (loaded eagerly, self-checked).

    Attributes: ``profile`` (with the effective ``max_tokens``), ``dimensions``,
    ``identity`` (changes with the weights, tokenizer, prompts, max tokens or
    dimensions — vectors of different identities are never mixed), ``is_gemma``.
    Safe to call from one worker thread at a time per method call; onnxruntime
    releases the GIL while it runs.
    """

    remote = False  # runs in this process (memoriesd.embed.types.Embedder)

    def __init__(
        self,
        model_dir: Path,
        *,
        threads: int = 4,
        max_tokens: int = 0,
        overrides: LocalModelConfig | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        graph = find_graph(self.model_dir)
        tok_path = self.model_dir / "tokenizer.json"
        if not self.model_dir.is_dir() or graph is None or not tok_path.is_file():
            raise ModelUnavailable(f"no local embedding model in {self.model_dir}: {INSTALL_HINT}")
        self._session = self._load_session(graph, threads)
        self._tokenizer = self._load_tokenizer(tok_path)
        config = read_json(self.model_dir / "config.json")

        padding = self._tokenizer.padding
        self._pad_id = _int_or((padding or {}).get("pad_id"), _int_or(config.get("pad_token_id"), 0))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        # Text is text: "<eos>" or "<start_of_turn>" written in a note is read as those characters,
        # never as the control token (BOS/EOS still come from the post-processor or _encode).
        self._tokenizer.encode_special_tokens = True
        # Ids past the embedding table (EmbeddingGemma's added <image_soft_token> is id 262144 of a
        # 262,144-row table) would crash the graph: they are read as the unknown token instead.
        rows = config.get("vocab_size")
        self._table_rows: int | None = rows if isinstance(rows, int) and not isinstance(rows, bool) and rows > 0 else None
        self._unk_id = self._find_unk_id(config)

        # Graph width from a probe run (the output shape may be symbolic).
        probe = self._run([self._tokenizer.encode(_SELF_CHECK_TEXTS[0]).ids or [self._pad_id]])
        graph_dims = int(probe.shape[1])
        self.profile, self.is_gemma = resolve_profile(
            self.model_dir, graph, graph_dims, overrides=overrides, rag_max_tokens=max_tokens
        )
        self._graph_dims = graph_dims
        self.dimensions = self.profile.dimensions
        self._configure_tokens(config)
        self.weights_digest = files_digest([*weight_files(graph), tok_path])
        self.identity = self._identity()
        self._self_check()

    # -- loading ---------------------------------------------------------------------------

    def _load_session(self, graph: Path, threads: int) -> InferenceSession:
        import onnxruntime as ort

        self.setting = product_setting(threads)
        try:
            session = ort.InferenceSession(str(graph), sess_options=session_options(self.setting), providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise _unavailable(self.model_dir, f"cannot be loaded ({type(exc).__name__})") from exc
        inputs = {i.name for i in session.get_inputs()}
        outputs = {o.name for o in session.get_outputs()}
        missing = [n for n in REQUIRED_INPUTS if n not in inputs]
        extra = inputs - set(REQUIRED_INPUTS) - {"token_type_ids"}
        if missing or extra or OUTPUT_NAME not in outputs:
            raise _unavailable(
                self.model_dir,
                "does not have the expected graph signature (inputs input_ids, attention_mask; "
                "output sentence_embedding)",
            )
        self._feed_token_types = "token_type_ids" in inputs
        return session

    def _load_tokenizer(self, path: Path) -> Tokenizer:
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_file(str(path))
        except Exception as exc:
            raise _unavailable(self.model_dir, f"has an unreadable tokenizer.json ({type(exc).__name__})") from exc

    def _configure_tokens(self, config: dict[str, Any]) -> None:
        """Explicit truncation; BOS/EOS wrapping for Gemma when the post-processor does not add them."""
        self._add_bos: int | None = None
        self._add_eos: int | None = None
        if self.is_gemma:
            bos = _int_or(config.get("bos_token_id"), GEMMA_BOS_ID)
            eos = _int_or(config.get("eos_token_id"), GEMMA_EOS_ID)
            ids = self._tokenizer.encode("x").ids
            if not ids or ids[0] != bos:
                self._add_bos = bos
            if not ids or ids[-1] != eos:
                self._add_eos = eos
        reserved = (self._add_bos is not None) + (self._add_eos is not None)
        # The tokenizer reserves room for the special tokens its own post-processor adds.
        self._tokenizer.enable_truncation(max_length=self.profile.max_tokens - reserved)

    def _find_unk_id(self, config: dict[str, Any]) -> int:
        for name in ("<unk>", "[UNK]"):
            tid = self._tokenizer.token_to_id(name)
            if tid is not None:
                return int(tid)
        return _int_or(config.get("unk_token_id"), self._pad_id)

    def _identity(self) -> str:
        spec = {
            # 2: documents without a title of their own read "title: none", and the first
            # fragment no longer repeats its "# H1" title line (see index.docs.embed_input).
            "v": 2,
            "weights": self.weights_digest,
            "query_prompt": self.profile.query_prompt,
            "document_prompt": self.profile.document_prompt,
            "max_tokens": self.profile.max_tokens,
            "dimensions": self.dimensions,
            "graph_dimensions": self._graph_dims,
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()

    def _self_check(self) -> None:
        seqs = self._encode(list(_SELF_CHECK_TEXTS))
        both = self._run(seqs)
        norms = np.linalg.norm(both, axis=1)
        if not np.all(np.isfinite(norms)) or np.any(np.abs(norms - 1.0) > NORM_TOLERANCE):
            raise _unavailable(self.model_dir, "does not output unit-length sentence embeddings")
        for row, seq in enumerate(seqs):
            single = self._run([seq])[0]
            cos = float(np.dot(single, both[row]) / (np.linalg.norm(single) * norms[row]))
            if cos < AGREEMENT_MIN_COSINE:
                raise _unavailable(self.model_dir, "gives different vectors batched and alone (padding is not masked)")

    # -- tokens ----------------------------------------------------------------------------

    def _encode(self, texts: list[str]) -> list[list[int]]:
        out: list[list[int]] = []
        for enc in self._tokenizer.encode_batch(texts, add_special_tokens=True):
            ids = list(enc.ids)
            if self._add_bos is not None:
                ids.insert(0, self._add_bos)
            if self._add_eos is not None:
                ids.append(self._add_eos)
            rows = self._table_rows
            if rows is not None and any(i >= rows or i < 0 for i in ids):
                ids = [self._unk_id if (i >= rows or i < 0) else i for i in ids]
            out.append(ids or [self._pad_id])
        return out

    def token_ids(self, text: str) -> list[int]:
        """The ids the model reads for ``text`` as given (no prompt added): wrapped and truncated."""
        return self._encode([text])[0]

    def count_tokens(self, text: str) -> int:
        """Tokens the model reads for ``text`` (after truncation to ``profile.max_tokens``)."""
        return len(self._encode([text])[0])

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]:
        """:meth:`count_tokens` of each text (one tokenizer batch)."""
        return [len(ids) for ids in self._encode(list(texts))]

    @property
    def max_tokens(self) -> int:
        return self.profile.max_tokens

    # -- running ---------------------------------------------------------------------------

    def _run(self, seqs: list[list[int]]) -> np.ndarray:
        """Raw graph output (batch, graph_dims) for token sequences, padded here with mask 0."""
        width = max(len(s) for s in seqs)
        ids = np.full((len(seqs), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(seqs), width), dtype=np.int64)
        for r, s in enumerate(seqs):
            ids[r, : len(s)] = s
            mask[r, : len(s)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if self._feed_token_types:
            feeds["token_type_ids"] = np.zeros_like(ids)
        try:
            out = self._session.run([OUTPUT_NAME], feeds)[0]
        except Exception as exc:  # onnxruntime's own error types: translated here, at the boundary
            raise ModelInputFailed(
                f"the local embedding model failed on an input ({type(exc).__name__}): the fragment is skipped"
            ) from exc
        return np.asarray(out, dtype=np.float32)

    def _finish(self, raw: np.ndarray) -> np.ndarray:
        vecs = raw[:, : self.dimensions]
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        if not np.all(np.isfinite(norms)) or np.any(norms < 1e-6):
            raise ModelInputFailed(
                "the local embedding model returned an invalid vector: reinstall it with `memories rag model-install`"
            )
        return np.ascontiguousarray(vecs / norms, dtype=np.float32)

    def _embed_texts(
        self,
        texts: list[str],
        batches: Callable[[list[int]], list[list[int]]],
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        result = np.empty((len(texts), self.dimensions), dtype=np.float32)
        if not texts:
            return result
        seqs = self._encode(texts)
        done = 0
        for batch in batches([len(s) for s in seqs]):
            result[batch] = self._finish(self._run([seqs[i] for i in batch]))
            done += len(batch)
            if on_batch is not None:
                on_batch(done)
        return result

    def embed_queries(self, texts: Sequence[str], *, before_attempt: Check | None = None) -> np.ndarray:
        """(n, dims) float32 unit vectors for search queries (query prompt applied).

        ``before_attempt`` is for remote services (:class:`memoriesd.embed.types.Embedder`): unused here."""
        prompted = [format_query(self.profile, t) for t in texts]
        return self._embed_texts(prompted, lambda lengths: plan_batches(lengths, 8192))

    def embed_documents(
        self,
        items: Sequence[tuple[str | None, str]],
        *,
        batch_tokens: int = 8192,
        on_batch: Callable[[int], None] | None = None,
        before_attempt: Check | None = None,
    ) -> np.ndarray:
        """(n, dims) float32 unit vectors for ``(title, fragment)`` items, in input order.

        Batches are length-bucketed (see :func:`plan_batches`); ``on_batch(n_done)``
        runs after each batch and may raise to cancel (the exception propagates).
        """
        texts = [format_document(self.profile, title, text) for title, text in items]
        return self._embed_texts(texts, lambda lengths: plan_batches(lengths, batch_tokens), on_batch)
