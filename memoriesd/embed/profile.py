"""Model profiles: what a local embedding model needs besides its graph.

A profile says how many dimensions the vectors have, how many tokens the model
reads, and which retrieval prompts wrap queries and documents. EmbeddingGemma
is built in (recognised from its ``config.json`` or its graph file name); any
other directory with the same graph signature gets its profile from
``[embedding.local]`` overrides, else from its own files (``sentence_bert_config.json``,
``config.json``) with no prompts.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..config import LocalModelConfig
from ..errors import ModelUnavailable

# Where a graph may live inside a model directory, in order of preference.
GRAPH_CANDIDATES: tuple[str, ...] = ("onnx/model_q4.onnx", "model.onnx", "onnx/model.onnx")
GEMMA_GRAPH = "onnx/model_q4.onnx"
DEFAULT_MAX_TOKENS = 512

INSTALL_HINT = "run `memories rag model-install` or set [embedding.local] model_dir in config.toml"


@dataclass(frozen=True)
class ModelProfile:
    """How to feed one embedding model.

    ``query_prompt`` is a prefix (or a template containing ``{text}``); "" = none.
    ``document_prompt`` is a template with ``{title}`` and ``{text}`` (title
    "none" when absent); ``None`` = no prompts: documents are embedded as
    ``"{title}\\n{fragment}"``, or the fragment alone when there is no title.
    """

    name: str
    dimensions: int
    max_tokens: int
    query_prompt: str
    document_prompt: str | None
    # Hybrid search default measured for this model (docs/benchmarks.md, "Quality and speed"): the vector
    # side's weight in the fusion, BM25's being 1 (convex: alpha = w / (1 + w)).
    vector_weight: float = 1.0
    # The relevance floor when a vault has too few vectors to calibrate its own (memoriesd.rag.floor), and for
    # `[search] min_cosine = 0` with no vault at hand: vector neighbours under this cosine are no match.
    ask_min_cosine: float = 0.25
    # Whether the light reranker (term coverage and phrases over the fused candidates) helps this model.
    light_rerank: bool = True
    # Facts (docs/memory.md, "Facts"; bench/calibrate_facts.py, defaults measured on all-MiniLM-L6-v2): two facts of
    # one category are one fact at this cosine, or at fact_revise_cosine when the new one says it replaces
    # the old ("actually", "now", "switched"...); `memory forget --scope topic` takes vector matches from
    # forget_min_cosine (query to fragment).
    fact_same_cosine: float = 0.70
    fact_revise_cosine: float = 0.66
    forget_min_cosine: float = 0.35
    # The writing systems the model reads (memoriesd.rag.language: a vault mostly in another one searches bm25 by
    # default): ("*",) = all; None = unknown (measured on first use).
    scripts: tuple[str, ...] | None = None


GEMMA_PROFILE = ModelProfile(
    name="embeddinggemma-300m",
    dimensions=768,
    max_tokens=2048,
    query_prompt="task: search result | query: ",
    document_prompt="title: {title} | text: {text}",
    # Convex fusion, measured through `rag ingest` (docs/benchmarks.md, "Fusion"): SciFact and XQuAD-zh are best near
    # alpha = 0.7, where BM25 adds what the much stronger vector side misses.
    vector_weight=2.5,
    # bench/calibrate_floor.py, SciFact and XQuAD-zh questions (off-topic: the other set's): 0.30 keeps
    # evidence for 99.2% of on-topic questions and sends 3.8% of off-topic ones on (0.25: 100% / 14.8%).
    ask_min_cosine=0.30,
    fact_same_cosine=0.80,
    fact_revise_cosine=0.65,
    forget_min_cosine=0.38,
    scripts=("*",),  # trained on 100+ languages
)
# EmbeddingGemma's special tokens (Gemma 3 vocabulary): every sequence is BOS ... EOS.
GEMMA_BOS_ID = 2
GEMMA_EOS_ID = 1

#: Models recognised by name (a lower-case part of their directory name or config ``_name_or_path``)
#: and the scripts they read ("*": all). Others are measured (memoriesd.rag.language.reads_script).
KNOWN_MODELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("multilingual", ("*",)),
    ("gemma", ("*",)),
    ("bge-m3", ("*",)),
    ("labse", ("*",)),
    ("all-minilm", ("Latin",)),
    ("all-mpnet", ("Latin",)),
    ("bge-small-en", ("Latin",)),
    ("bge-base-en", ("Latin",)),
    ("e5-small-v2", ("Latin",)),
    ("e5-base-v2", ("Latin",)),
    ("gte-small", ("Latin",)),
    ("nomic-embed-text", ("Latin",)),
)

_PLACEHOLDER = re.compile(r"\{(title|text)\}")


def _fill(template: str, values: dict[str, str]) -> str:
    """Substitute ``{title}``/``{text}`` in one pass, so braces inside user text stay literal."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def format_query(profile: ModelProfile, text: str) -> str:
    """The string the model reads for a search query."""
    prompt = profile.query_prompt
    if not prompt:
        return text
    if "{text}" in prompt:
        return _fill(prompt, {"text": text, "title": ""})
    return prompt + text


def format_document(profile: ModelProfile, title: str | None, text: str) -> str:
    """The string the model reads for one fragment of a record titled ``title``."""
    if profile.document_prompt is None:
        return f"{title}\n{text}" if title else text
    template = profile.document_prompt
    if "{text}" not in template:
        template += "{text}"
    return _fill(template, {"title": title or "none", "text": text})


def find_graph(model_dir: Path) -> Path | None:
    """The ONNX graph of ``model_dir`` (first of :data:`GRAPH_CANDIDATES` present)."""
    for rel in GRAPH_CANDIDATES:
        p = model_dir / rel
        if p.is_file():
            return p
    return None


def weight_files(graph: Path) -> list[Path]:
    """The graph and its external-data files (``model.onnx_data``, ``model.onnx.data``, split parts)."""
    extra = sorted(
        p
        for p in graph.parent.iterdir()
        if p.is_file() and p != graph and (p.name.startswith(graph.name + "_data") or p.name.startswith(graph.name + ".data"))
    )
    return [graph, *extra]


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, or {} when absent or unreadable (the caller decides what is required)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@functools.lru_cache(maxsize=8)
def declared_scripts(model_dir: Path) -> tuple[str, ...] | None:
    """The scripts a model reads when it is known by name (:data:`KNOWN_MODELS`); None: unknown."""
    names = (model_dir.name.lower(), str(read_json(model_dir / "config.json").get("_name_or_path", "")).lower())
    for pattern, scripts in KNOWN_MODELS:
        if any(pattern in n for n in names):
            return scripts
    return None


def is_gemma(model_dir: Path, graph: Path) -> bool:
    """EmbeddingGemma: ``config.json`` says a Gemma model, or (without a model type) the q4 graph layout."""
    cfg = read_json(model_dir / "config.json")
    model_type = str(cfg.get("model_type", "")).lower()
    if model_type:
        archs = " ".join(str(a) for a in cfg.get("architectures") or []).lower()
        return model_type.startswith("gemma") or "gemma" in archs
    try:
        return graph.relative_to(model_dir).as_posix() == GEMMA_GRAPH
    except ValueError:
        return False


def inferred_max_tokens(model_dir: Path) -> int:
    """Max input tokens from the model's own files: sentence-transformers config, then config.json."""
    sbert = read_json(model_dir / "sentence_bert_config.json")
    value = sbert.get("max_seq_length")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    cfg = read_json(model_dir / "config.json")
    value = cfg.get("max_position_embeddings")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    tok_cfg = read_json(model_dir / "tokenizer_config.json")
    value = tok_cfg.get("model_max_length")
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 1 << 20:
        return value
    return DEFAULT_MAX_TOKENS


def effective_max_tokens(model_max: int, rag_max_tokens: int) -> int:
    """``[embedding] max_tokens``: 0 = the model's maximum; an explicit value is capped at it."""
    if rag_max_tokens <= 0:
        return model_max
    return min(rag_max_tokens, model_max)


def resolve_profile(
    model_dir: Path,
    graph: Path,
    graph_dims: int,
    *,
    overrides: LocalModelConfig | None = None,
    rag_max_tokens: int = 0,
) -> tuple[ModelProfile, bool]:
    """The profile to use for ``model_dir`` and whether it is EmbeddingGemma.

    ``graph_dims`` is the width of the graph's ``sentence_embedding`` output. The
    built-in Gemma profile ignores ``[embedding.local]`` (that table is for other
    models); a smaller ``dimensions`` override means Matryoshka truncation (the
    embedder cuts and re-normalizes), a larger one is refused.
    """
    gemma = is_gemma(model_dir, graph)
    if gemma:
        base = replace(GEMMA_PROFILE, dimensions=graph_dims)
    else:
        ov = overrides or LocalModelConfig()
        dims = ov.dimensions or graph_dims
        if dims > graph_dims:
            raise ModelUnavailable(
                f"[embedding.local] dimensions = {dims} is more than the model's {graph_dims}: "
                "set it to at most that, or 0 to use the model's width"
            )
        base = ModelProfile(
            name=model_dir.name or "local-model",
            dimensions=dims,
            max_tokens=ov.max_tokens or inferred_max_tokens(model_dir),
            query_prompt=ov.query_prompt,
            document_prompt=ov.document_prompt or None,
            scripts=declared_scripts(model_dir),
        )
    if base.max_tokens < 4:
        raise ModelUnavailable(
            f"the local model's max tokens ({base.max_tokens}) is too small: set [embedding] max_tokens"
        )
    return replace(base, max_tokens=effective_max_tokens(base.max_tokens, rag_max_tokens)), gemma
