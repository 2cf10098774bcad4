"""Embedding models: the local ONNX embedder and model profiles.

Importing this package is cheap: onnxruntime is loaded only when a
:class:`LocalEmbedder` is built.
"""

from .local import LocalEmbedder, plan_batches
from .profile import GEMMA_PROFILE, ModelProfile, format_document, format_query

__all__ = ["GEMMA_PROFILE", "LocalEmbedder", "ModelProfile", "format_document", "format_query", "plan_batches"]
