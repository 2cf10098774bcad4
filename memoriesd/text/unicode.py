"""The one check for text that UTF-8 cannot hold: JSON can carry lone UTF-16 surrogates ("\\ud800").

A JSON string may spell half of a character (an emoji cut in two) as an escape; Python decodes it to
a lone surrogate, which no UTF-8 file, record or frame can hold. Request parameters
(:mod:`memoriesd.server.context`) and transcripts (:mod:`memoriesd.conversations.transcripts`) refuse
such text with this check, each naming where it is.
"""

from __future__ import annotations


def unpaired_surrogate(value: str) -> int | None:
    """The index of the first character of ``value`` that UTF-8 cannot encode (a lone surrogate), else None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


__all__ = ["unpaired_surrogate"]
