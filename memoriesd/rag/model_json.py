"""One strict reading of a model's JSON reply, shared by `rag ask`, extraction and summaries.

A reply must be exactly one JSON object, optionally inside one code fence (```json ... ```): no
text before or after it, no second object, no key given twice (the duplicate-key hook), no nesting
deep enough to exhaust the parser. Every failure is raised through the caller's ``fail`` so that
the message names what was rejected and what to do ("the model's answer was rejected: ...").
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_FENCE = re.compile(r"\A```[ \t]*(?:json|JSON)?[ \t]*\r?\n(?P<body>.*?)\r?\n?[ \t]*```\Z", re.DOTALL)


def load_object(raw: str, fail: Callable[[str], Exception]) -> dict[str, Any]:
    """The JSON object of ``raw``, or ``fail(why)`` raised."""
    text = raw.strip()
    if text.startswith("```"):
        m = _FENCE.match(text)
        if m is None:
            raise fail("it is not one JSON object (a code fence around it was not closed or had text after it)")
        text = m.group("body").strip()
    if not text:
        raise fail("it was empty")
    if not text.startswith("{"):
        raise fail("it is not one JSON object (there is text before the object)")

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise fail("its JSON repeats a key")
            out[key] = value
        return out

    try:
        obj, end = json.JSONDecoder(object_pairs_hook=no_duplicates).raw_decode(text)
    except RecursionError:
        raise fail("its JSON is nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise fail(f"it is not valid JSON ({exc.msg} at character {exc.pos})") from None
    if text[end:].strip():
        raise fail("it is not one JSON object (there is text or a second object after it)")
    if not isinstance(obj, dict):
        raise fail("it is not a JSON object")
    return obj


__all__ = ["load_object"]
