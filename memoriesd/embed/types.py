"""What every embedder offers the daemon, whatever serves it.

Three classes satisfy :class:`Embedder`: the in-process ONNX model
(:class:`memoriesd.embed.local.LocalEmbedder`), the vault process's client of the shared model
process (:class:`memoriesd.workers.model_client.ModelClient`) and a remote embedding service
(:class:`memoriesd.rag.providers.RemoteEmbedder`). Callers read these members instead of sniffing
attributes: ``remote`` says whether text leaves this process for a service (its device policy and
``before_attempt`` checks apply), ``profile`` is None for a service (no calibrated thresholds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

    from .profile import ModelProfile

#: Run before each batch or remote attempt; raises to stop (lock, vault change, client gone).
Check = Callable[[], None]
#: ``(title, text)``: a fragment as it is embedded (the document prompt takes the title).
DocumentItem = tuple[str | None, str]


@dataclass(frozen=True)
class SessionSetting:
    """The onnxruntime session options the local model runs with (see ``bench/embed_sessions.py``).

    ``spinning``: whether idle intra-op pool threads busy-wait for the next piece of work. They
    spin on every run by default; on a machine shared with other work (or with a second vault's
    request in the model process) the spin burns the cores the model needs.
    ``optimization``: ``all`` (onnxruntime's default), ``extended``, ``basic`` or ``none``."""

    intra_threads: int = 2
    inter_threads: int = 1
    parallel: bool = False
    optimization: str = "all"
    spinning: bool = False


class Embedder(Protocol):
    """An embedding model: texts in, unit vectors out (one row per text)."""

    @property
    def identity(self) -> str:
        """Names the vector space: vectors of different identities are never compared."""
        ...

    @property
    def dimensions(self) -> int | None:
        """The vector width; None for a remote service before its first answer."""
        ...

    @property
    def profile(self) -> ModelProfile | None:
        """A local model's profile (prompts, calibrated floors); None for a remote service."""
        ...

    @property
    def remote(self) -> bool:
        """True when texts are sent to a service off this process (device policy applies)."""
        ...

    def embed_documents(self, items: Sequence[DocumentItem], *, before_attempt: Check | None = None) -> np.ndarray: ...

    def embed_queries(self, texts: Sequence[str], *, before_attempt: Check | None = None) -> np.ndarray: ...


class Tokenizing(Protocol):
    """A local model's tokenizer: what context packs count tokens with."""

    @property
    def max_tokens(self) -> int: ...

    def count_tokens(self, text: str) -> int: ...


class LocalModel(Embedder, Tokenizing, Protocol):
    """A model on this device (in process, or in the model process): an embedder with its tokenizer."""


class Cancellable(Protocol):
    """A request context: raises :class:`memoriesd.errors.Cancelled` once its client went away."""

    def check_cancelled(self) -> None: ...


__all__ = ["Cancellable", "Check", "DocumentItem", "Embedder", "LocalModel", "SessionSetting", "Tokenizing"]
