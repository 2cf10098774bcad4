"""Remote embeddings ([embedding.service]) and generation ([generation]).

Two protocols:

* ``gemini`` — Google's Generative Language API. Auth header ``x-goog-api-key``.
  The configured URL is the full operation URL (``…/models/<m>:embedContent``
  or ``…:generateContent``); batches go to the ``:batchEmbedContents`` sibling.
* ``compatible`` — OpenAI-style ``/v1/embeddings`` and ``/v1/chat/completions``
  (llama.cpp, Ollama, vLLM, LM Studio…). ``Authorization: Bearer`` when a key
  is configured. Only standard fields are sent: many local servers reject
  unknown ones.

Every returned vector is checked before anything is stored (one per input,
indices complete and unique, the expected dimensions, finite values, not all
zero) and L2-normalised; any violation raises :class:`InvalidModelOutput` and
nothing is returned. Keys travel only in request headers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..config import ServiceConfig
from ..embed.profile import ModelProfile
from ..errors import ConfigError, GenerationNotConfigured, InvalidModelOutput
from ..net.http_client import HttpClient
from .remote_service import ServiceEndpoint

__all__ = ["Generator", "RemoteEmbedder", "check_vectors"]

BATCH_SIZE = 64
_PROTOCOLS = ("gemini", "compatible")
_ENUM = re.compile(r"[A-Za-z_]{1,40}")


def _bad(purpose: str, host: str, why: str) -> InvalidModelOutput:
    return InvalidModelOutput(
        f"the {purpose} service at {host} returned {why}: nothing was stored; check the model and its settings"
    )


def _is_number(value: object) -> bool:
    return (type(value) is float or type(value) is int) and not isinstance(value, bool)


def check_vectors(rows: Sequence[Any], n_expected: int, dims: int | None, *, host: str) -> np.ndarray:
    """Validate and L2-normalise ``rows`` (already in input order) into a float32 matrix.

    ``dims``: the required length (configured or learned earlier), None = all rows equal.
    """
    if len(rows) != n_expected:
        raise _bad("embedding", host, f"{len(rows)} vectors for {n_expected} inputs")
    if n_expected == 0:
        return np.zeros((0, dims or 0), dtype=np.float32)
    for row in rows:
        if not isinstance(row, list) or not row:
            raise _bad("embedding", host, "a vector that is not a non-empty list of numbers")
        if dims is None:
            dims = len(row)
        if len(row) != dims:
            raise _bad("embedding", host, f"a vector of {len(row)} dimensions where {dims} were expected")
        if not all(_is_number(v) for v in row):
            raise _bad("embedding", host, "a vector holding something other than numbers")
    mat = np.asarray(rows, dtype=np.float64)
    if not np.isfinite(mat).all():
        raise _bad("embedding", host, "a vector with non-finite values (NaN or infinity)")
    norms = np.linalg.norm(mat, axis=1)
    if (norms == 0).any() or not np.isfinite(norms).all():
        raise _bad("embedding", host, "an all-zero vector")
    return (mat / norms[:, None]).astype(np.float32)


def _gemini_model(svc: ServiceConfig, parsed_path: str, section: str) -> str:
    """``models/<name>``: from ``model`` when set, else from the ``/models/<name>:op`` URL path."""
    name = svc.model.strip()
    if not name:
        m = re.search(r"/models/([^/:]+):[A-Za-z]+$", parsed_path)
        if m is None:
            raise ConfigError(f"[{section}] needs model: the URL does not name one (…/models/<model>:operation)")
        name = m.group(1)
    return name if name.startswith(("models/", "tunedModels/")) else f"models/{name}"


class RemoteEmbedder:
    """Embeddings from a remote service; see the module doc for both protocols.

    ``identity`` names the vector space (protocol, host[:port], model, dimensions):
    vectors made under a different identity are not comparable and must be re-embedded.
    ``remote``: texts leave this device's process (:class:`memoriesd.embed.types.Embedder`);
    ``profile`` is None: a service's similarities are not calibrated here.
    """

    remote = True
    profile: ModelProfile | None = None

    def __init__(
        self,
        client: HttpClient,
        svc: ServiceConfig,
        env: Mapping[str, str],
        *,
        batch_size: int = BATCH_SIZE,
        section: str = "embedding.service",
    ) -> None:
        if svc.protocol not in _PROTOCOLS:
            raise ConfigError(f"[{section}] protocol must be one of {', '.join(_PROTOCOLS)}")
        self._client = client
        self._svc = svc
        self._ep = ServiceEndpoint(svc, env, section=section, purpose="embedding")
        self._batch = max(1, batch_size)
        self._dims: int | None = svc.dimensions or None
        self.url = svc.url
        if svc.protocol == "gemini":
            path = self._ep.parsed.path
            if path.endswith(":embedContent"):
                self._single_url = svc.url
                self._batch_url = svc.url[: -len(":embedContent")] + ":batchEmbedContents"
            elif path.endswith(":batchEmbedContents"):
                self._batch_url = svc.url
                self._single_url = svc.url[: -len(":batchEmbedContents")] + ":embedContent"
            else:
                raise ConfigError(
                    f"[{section}] url for protocol gemini must be the full operation URL ending in "
                    ":embedContent (…/v1beta/models/<model>:embedContent)"
                )
            self._model = _gemini_model(svc, path, section)
        else:
            self._model = svc.model
        dims = str(svc.dimensions) if svc.dimensions else "default"
        # ":d2": the document input format of index.docs.embed_input (no file-name titles, no repeated H1).
        self.identity = f"remote:{svc.protocol}:{self._ep.host}:{self._model}:{dims}:d2"

    @property
    def dimensions(self) -> int | None:
        """Configured dimensions, else those of the first answer (None before it)."""
        return self._dims

    # -- public API --------------------------------------------------------

    def embed_queries(self, texts: Sequence[str], before_attempt: Callable[[], None] | None = None) -> np.ndarray:
        """Normalised query vectors, one row per text."""
        items = [(None, t) for t in texts]
        return self._embed(items, "RETRIEVAL_QUERY", None, before_attempt)

    def embed_documents(
        self,
        items: Sequence[tuple[str | None, str]],
        on_batch: Callable[[int, int], None] | None = None,
        before_attempt: Callable[[], None] | None = None,
    ) -> np.ndarray:
        """Normalised document vectors for ``(title, text)`` items, in batches.

        ``on_batch(done, total)`` runs after each batch (progress; it may raise to stop).
        """
        return self._embed(list(items), "RETRIEVAL_DOCUMENT", on_batch, before_attempt)

    # -- internals ---------------------------------------------------------

    def _embed(
        self,
        items: Sequence[tuple[str | None, str]],
        task: str,
        on_batch: Callable[[int, int], None] | None,
        before_attempt: Callable[[], None] | None,
    ) -> np.ndarray:
        parts: list[np.ndarray] = []
        total = len(items)
        for start in range(0, total, self._batch):
            chunk = items[start : start + self._batch]
            if self._svc.protocol == "gemini":
                rows = self._gemini(chunk, task, before_attempt)
            else:
                rows = self._compatible(chunk, before_attempt)
            mat = check_vectors(rows, len(chunk), self._dims, host=self._ep.host)
            self._dims = mat.shape[1]
            parts.append(mat)
            if on_batch is not None:
                on_batch(min(start + len(chunk), total), total)
        if not parts:
            return np.zeros((0, self._dims or 0), dtype=np.float32)
        return np.concatenate(parts, axis=0)

    def _post(self, url: str, payload: dict[str, Any], before_attempt: Callable[[], None] | None) -> object:
        return self._client.post_json(
            url, payload, headers=self._ep.headers(), purpose="embedding", before_attempt=before_attempt
        )

    def _gemini_request(self, title: str | None, text: str, task: str) -> dict[str, Any]:
        req: dict[str, Any] = {"model": self._model, "content": {"parts": [{"text": text}]}, "taskType": task}
        if task == "RETRIEVAL_DOCUMENT" and title:
            req["title"] = title
        if self._svc.dimensions:
            req["outputDimensionality"] = self._svc.dimensions
        return req

    def _gemini(
        self, chunk: Sequence[tuple[str | None, str]], task: str, before_attempt: Callable[[], None] | None
    ) -> list[Any]:
        host = self._ep.host
        if len(chunk) == 1:
            body = self._post(self._single_url, self._gemini_request(chunk[0][0], chunk[0][1], task), before_attempt)
            emb = body.get("embedding") if isinstance(body, dict) else None
            if not isinstance(emb, dict):
                raise _bad("embedding", host, 'an answer without "embedding"')
            return [emb.get("values")]
        reqs = [self._gemini_request(title, text, task) for title, text in chunk]
        body = self._post(self._batch_url, {"requests": reqs}, before_attempt)
        embs = body.get("embeddings") if isinstance(body, dict) else None
        if not isinstance(embs, list):
            raise _bad("embedding", host, 'an answer without an "embeddings" list')
        rows: list[Any] = []
        for e in embs:
            if not isinstance(e, dict):
                raise _bad("embedding", host, "an embedding that is not an object")
            rows.append(e.get("values"))
        return rows

    def _compatible(
        self, chunk: Sequence[tuple[str | None, str]], before_attempt: Callable[[], None] | None
    ) -> list[Any]:
        host = self._ep.host
        payload: dict[str, Any] = {"model": self._svc.model, "input": [text for _, text in chunk]}
        if self._svc.dimensions:
            payload["dimensions"] = self._svc.dimensions
        body = self._post(self._svc.url, payload, before_attempt)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise _bad("embedding", host, 'an answer without a "data" list')
        n = len(chunk)
        if len(data) != n:
            raise _bad("embedding", host, f"{len(data)} vectors for {n} inputs")
        rows: list[Any] = [None] * n
        seen: set[int] = set()
        for item in data:
            index = item.get("index") if isinstance(item, dict) else None
            if not isinstance(index, int) or isinstance(index, bool):
                raise _bad("embedding", host, "a vector without an integer index")
            if not 0 <= index < n:
                raise _bad("embedding", host, f"a vector index out of range for {n} inputs")
            if index in seen:
                raise _bad("embedding", host, "two vectors for the same index")
            seen.add(index)
            rows[index] = item.get("embedding")
        return rows


def _strip_think(text: str) -> str:
    """Drop a leading ``<think>…</think>`` block that reasoning models put before the answer."""
    m = re.match(r"\s*<think>.*?</think>\s*", text, re.DOTALL)
    return text[m.end() :] if m else text


class Generator:
    """Answers from a remote chat/generation service (one prompt in, the raw text out).

    The text is returned as the model wrote it (minus a leading reasoning block);
    :func:`memoriesd.rag.citations.parse_answer` validates it.
    """

    def __init__(
        self, client: HttpClient, svc: ServiceConfig, env: Mapping[str, str], *, section: str = "generation"
    ) -> None:
        if not svc.configured:
            raise GenerationNotConfigured(
                "no generation service is configured: set url, protocol and model in the [generation] "
                "table of config.toml"
            )
        if svc.protocol not in _PROTOCOLS:
            raise ConfigError(f"[{section}] protocol must be one of {', '.join(_PROTOCOLS)}")
        self._client = client
        self._svc = svc
        self._ep = ServiceEndpoint(svc, env, section=section, purpose="generation")
        self.url = svc.url

    def generate(
        self, system: str, user: str, before_attempt: Callable[[], None] | None = None, *, timeout: float | None = None
    ) -> str:
        """The model's reply text for a system instruction and a user message.

        ``timeout``: each attempt's read timeout (None: ``[http] timeout_seconds``)."""
        if self._svc.protocol == "gemini":
            payload: dict[str, Any] = {
                "contents": [{"role": "user", "parts": [{"text": user}]}],
                "systemInstruction": {"parts": [{"text": system}]},
                "generationConfig": {"responseMimeType": "application/json"},
            }
        else:
            payload = {
                "model": self._svc.model,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            }
        body = self._client.post_json(
            self._svc.url, payload, headers=self._ep.headers(), purpose="generation", before_attempt=before_attempt,
            timeout=timeout,
        )
        text = self._gemini_text(body) if self._svc.protocol == "gemini" else self._compatible_text(body)
        if not text.strip():
            raise _gen_bad(self._ep.host, "an empty answer")
        return text

    def _gemini_text(self, body: object) -> str:
        host = self._ep.host
        cands = body.get("candidates") if isinstance(body, dict) else None
        if not isinstance(cands, list) or not cands:
            feedback = body.get("promptFeedback") if isinstance(body, dict) else None
            reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
            if isinstance(reason, str) and _ENUM.fullmatch(reason):
                raise _gen_bad(host, f"no answer (the prompt was blocked: {reason})")
            raise _gen_bad(host, 'an answer without "candidates"')
        first = cands[0]
        if not isinstance(first, dict):
            raise _gen_bad(host, "a candidate that is not an object")
        _check_finish(host, first.get("finishReason"), ok=("STOP", None), cut=("MAX_TOKENS",))
        content = first.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        if not isinstance(parts, list) or not parts:
            raise _gen_bad(host, "a candidate without text")
        texts: list[str] = []
        for part in parts:
            if not isinstance(part, dict):
                raise _gen_bad(host, "a content part that is not an object")
            if part.get("thought") is True:
                continue  # reasoning summary, not the answer
            text = part.get("text")
            if text is not None and not isinstance(text, str):
                raise _gen_bad(host, "a content part whose text is not a string")
            texts.append(text or "")
        return "".join(texts)

    def _compatible_text(self, body: object) -> str:
        host = self._ep.host
        choices = body.get("choices") if isinstance(body, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise _gen_bad(host, 'an answer without "choices"')
        first = choices[0]
        _check_finish(host, first.get("finish_reason"), ok=("stop", None), cut=("length",))
        message = first.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            raise _gen_bad(host, "a choice without message text")
        return _strip_think(content)


def _gen_bad(host: str, why: str) -> InvalidModelOutput:
    return InvalidModelOutput(f"the generation service at {host} returned {why}: ask again or check the model")


def _check_finish(host: str, reason: object, *, ok: tuple[str | None, ...], cut: tuple[str, ...]) -> None:
    """A truncated or refused answer is reported as such, rather than as broken JSON later."""
    if reason in ok:
        return
    if reason in cut:
        raise InvalidModelOutput(
            f"the generation service at {host} cut the answer off at its length limit: "
            "ask a narrower question or raise the model's output limit"
        )
    if isinstance(reason, str) and _ENUM.fullmatch(reason) and reason.upper() not in ("STOP", "END_TURN", "EOS"):
        raise _gen_bad(host, f"no usable answer (finish reason {reason})")

