"""Grounded ``ask``: prompt → generation service → strictly validated answer.

The daemon retrieves the fragments (hybrid search, rerank), checks the
device-only policy against ``generator.url`` and then calls :func:`grounded_answer`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .citations import ParsedAnswer, parse_answer
from .prompt import build_prompt, source_labels

__all__ = ["GroundedAnswer", "TextGenerator", "grounded_answer"]


class TextGenerator(Protocol):
    """What :func:`grounded_answer` needs (``memoriesd.rag.providers.Generator`` fits)."""

    def generate(self, system: str, user: str, before_attempt: Callable[[], None] | None = None) -> str: ...


@dataclass(frozen=True)
class GroundedAnswer:
    """A validated answer and the labels of the sources it was built from (S1 = sources[0] ...)."""

    parsed: ParsedAnswer
    labels: list[str]

    def cited_indices(self) -> list[int]:
        """Positions in the ``sources`` list of every cited source, in citation order."""
        return [self.labels.index(label) for label in self.parsed.citations]


def grounded_answer(
    generator: TextGenerator,
    question: str,
    sources: Sequence[tuple[str, str]],
    before_attempt: Callable[[], None] | None = None,
) -> GroundedAnswer:
    """Ask ``question`` over ``(title, text)`` sources; raises InvalidModelOutput on a bad answer."""
    labels = source_labels(len(sources))
    system, user = build_prompt(question, [(lab, t, x) for lab, (t, x) in zip(labels, sources, strict=True)])
    raw = generator.generate(system, user, before_attempt=before_attempt)
    return GroundedAnswer(parse_answer(raw, labels), labels)
