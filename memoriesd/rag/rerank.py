"""The optional trained reranker service ([rerank], protocol "compatible").

Request (the de-facto ``/v1/rerank`` shape of Jina, Cohere-compatible and
llama.cpp servers)::

    {"model": ..., "query": ..., "documents": [...], "top_n": len(documents)}

Response: ``{"results": [{"index": i, "relevance_score": s}, ...]}`` with
exactly one entry per document sent. Anything else — an unknown, out-of-range,
duplicate or missing index, a score that is not a finite JSON number, a
malformed body — raises :class:`RerankFailed`: a broken reranker must never
silently reorder results. HTTP failures keep their own codes (auth_failed,
timeout, http_error...) so the caller can tell them apart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TypeGuard

from ..config import ServiceConfig
from ..errors import ConfigError, InvalidModelOutput, RerankFailed
from ..net.http_client import HttpClient
from .remote_service import ServiceEndpoint

__all__ = ["remote_rerank", "parse_rerank_response"]

_SECTION = "rerank"


def _fail(why: str) -> RerankFailed:
    return RerankFailed(
        f"the rerank service returned an unusable answer ({why}); results were not reordered by it: "
        "check the [rerank] service, or remove that table to use the light reranker"
    )


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_rerank_response(body: object, n_documents: int) -> list[float]:
    """Scores aligned with the documents sent, or :class:`RerankFailed`."""
    if not isinstance(body, dict) or not isinstance(body.get("results"), list):
        raise _fail('no "results" list')
    results: list[object] = body["results"]
    scores: list[float | None] = [None] * n_documents
    for item in results:
        if not isinstance(item, dict):
            raise _fail("a result is not an object")
        index = item.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            raise _fail("a result has no integer index")
        if not 0 <= index < n_documents:
            shown = f"index {index}" if abs(index) < 10**9 else "an index"
            raise _fail(f"{shown} is out of range for {n_documents} documents")
        if scores[index] is not None:
            raise _fail(f"index {index} appears twice")
        score: object = item.get("relevance_score")
        if not _is_number(score):
            raise _fail(f"the score of index {index} is not a number")
        value = float(score)
        if not math.isfinite(value):
            raise _fail(f"the score of index {index} is not finite")
        scores[index] = value
    missing = [i for i, s in enumerate(scores) if s is None]
    if missing:
        raise _fail(f"{len(missing)} of {n_documents} documents have no score (first missing index {missing[0]})")
    return [s for s in scores if s is not None]


def remote_rerank(
    client: HttpClient,
    svc: ServiceConfig,
    query: str,
    documents: list[str],
    env: Mapping[str, str],
    before_attempt: Callable[[], None] | None = None,
) -> list[float]:
    """Score ``documents`` against ``query`` with the configured service (scores aligned with documents)."""
    if svc.protocol != "compatible":
        raise ConfigError('[rerank] protocol must be "compatible"')
    endpoint = ServiceEndpoint(svc, env, section=_SECTION, purpose="rerank")
    if not documents:
        return []
    payload = {"model": svc.model, "query": query, "documents": list(documents), "top_n": len(documents)}
    try:
        body = client.post_json(
            endpoint.url, payload, headers=endpoint.headers(), purpose="rerank", before_attempt=before_attempt
        )
    except InvalidModelOutput as exc:  # not JSON at all
        raise _fail("the body is not JSON") from exc
    return parse_rerank_response(body, len(documents))
