"""Strict parsing of the model's grounded answer (the format is set in :mod:`.prompt`).

Accepted: one JSON object, optionally inside a single surrounding Markdown code
fence (```json … ```), and nothing else. Keys: ``answer`` (non-empty string),
``citations`` (list of labels such as "S1"), optionally ``insufficient`` (bool).
Every label, in the list or inline in the answer ([S1], [S1, S2], [S1][S2]),
must be one that was sent. A normal answer must cite at least one source; an
answer marked ``insufficient`` may cite none. Anything else raises
:class:`InvalidModelOutput` naming what was wrong — never a partial answer.

Messages never quote the model's text (it may echo note content); they name
labels, counts and keys only when those are in the expected shape.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidModelOutput
from .model_json import load_object

__all__ = ["ParsedAnswer", "parse_answer"]


@dataclass(frozen=True)
class ParsedAnswer:
    """A validated answer. ``citations``: every label cited, in order of first appearance."""

    answer: str
    citations: list[str] = field(default_factory=list)
    insufficient: bool = False


# A well-formed inline citation group: [S1], [S1, S2], [S1; S3], with optional spaces.
_GROUP = re.compile(r"\[\s*(S\d+(?:\s*[,;]\s*S\d+)*)\s*\]")
# Anything that starts like a citation but is not a well-formed group: [S 1], [S1-S3], [S1 and S2], [s1]...
_LOOKALIKE = re.compile(r"\[\s*[Ss]\s*\d[^\]]{0,40}\]")
_LABEL = re.compile(r"S[1-9][0-9]*")
_ALLOWED_KEYS = {"answer", "citations", "insufficient"}


def _fail(why: str) -> InvalidModelOutput:
    return InvalidModelOutput(f"the model's answer was rejected: {why}; ask again or try another model")


def _load_object(raw: str) -> dict[str, Any]:
    return load_object(raw, _fail)


def _check_label(label: str, sent: set[str], n_sent: int) -> None:
    if label not in sent:
        plural = "source" if n_sent == 1 else "sources"
        raise _fail(f"the model cited {label}, which was not among the {n_sent} {plural} sent")


def _inline_labels(answer: str) -> list[str]:
    labels: list[str] = []
    for m in _GROUP.finditer(answer):
        labels.extend(part.strip() for part in re.split(r"[,;]", m.group(1)))
    # A lookalike that is not inside a well-formed group is a malformed citation.
    stripped = _GROUP.sub(" ", answer)
    if _LOOKALIKE.search(stripped):
        raise _fail("its answer text has a malformed citation (write them as [S1] or [S1, S2])")
    return labels


def _listed_labels(citations: object) -> list[str]:
    if not isinstance(citations, list):
        raise _fail('"citations" is not a list of source labels')
    out: list[str] = []
    for item in citations:
        if not isinstance(item, str):
            raise _fail('"citations" holds something other than a source label string')
        label = item.strip()
        if label.startswith("[") and label.endswith("]"):
            label = label[1:-1].strip()
        if not _LABEL.fullmatch(label):
            raise _fail('"citations" holds a malformed source label (expected labels such as "S1")')
        out.append(label)
    return out


def parse_answer(raw: str, sent_labels: Sequence[str]) -> ParsedAnswer:
    """Parse and validate the model's reply against the labels that were sent (see module doc)."""
    sent = set(sent_labels)
    n_sent = len(sent)
    obj = _load_object(raw)
    missing = [k for k in ("answer", "citations") if k not in obj]
    if missing:
        raise _fail("its JSON has no " + " and no ".join(f'"{k}"' for k in missing))
    extra = set(obj) - _ALLOWED_KEYS
    if extra:
        raise _fail(f'its JSON has {len(extra)} unexpected key(s) besides "answer" and "citations"')
    answer = obj["answer"]
    if not isinstance(answer, str) or not answer.strip():
        raise _fail('"answer" is not a non-empty string')
    insufficient = obj.get("insufficient", False)
    if not isinstance(insufficient, bool):
        raise _fail('"insufficient" is not true or false')
    listed = _listed_labels(obj["citations"])
    inline = _inline_labels(answer)
    ordered: list[str] = []
    for label in inline + listed:
        _check_label(label, sent, n_sent)
        if label not in ordered:
            ordered.append(label)
    if not ordered and not insufficient:
        raise _fail("it cites none of the sources (a grounded answer must cite at least one)")
    return ParsedAnswer(answer=answer.strip(), citations=ordered, insufficient=insufficient)
