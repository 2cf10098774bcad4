"""Passphrase strength at `vault create` and `vault passwd`: a one-line warning for a weak one.

The estimate is zxcvbn's (dictionaries, keyboard patterns, sequences, dates, l33t), imported only
here, when a passphrase is chosen (~20 ms): no other command pays for it. The warning says why the
passphrase is weak in zxcvbn's own fixed words and never repeats, logs or sends the passphrase.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: zxcvbn's scores run 0 (too guessable) to 4 (very unguessable); below this a warning is shown.
GOOD_SCORE = 3
#: zxcvbn's examples in quotes ('Sequences like "abc" or "6543"...'): left out, so that no line shows
#: text that could be the passphrase itself.
_QUOTED = re.compile(r'\s*(?:like|than)?\s*"[^"]*"(?:\s*or\s*"[^"]*")?')
#: zxcvbn's own cap (longer input raises ValueError): the first this many characters are judged.
MAX_LENGTH = 72


@dataclass(frozen=True)
class Weakness:
    """Why a passphrase is weak: zxcvbn's score (0-4) and its reason, in words that never quote it."""

    score: int
    reason: str

    def line(self) -> str:
        return (
            f"warning: this passphrase is weak ({self.reason}; strength {self.score} of 4): "
            "a longer passphrase, e.g. four or more uncommon words, is advised"
        )


def weakness(passphrase: str, context: list[str] | None = None) -> Weakness | None:
    """The passphrase's weakness, or None when it is strong enough. ``context`` (e.g. the vault's
    name) counts as known to an attacker."""
    from zxcvbn import zxcvbn

    result = zxcvbn(passphrase[:MAX_LENGTH], user_inputs=[c for c in (context or []) if c])
    score = int(result["score"])
    if score >= GOOD_SCORE:
        return None
    feedback = result.get("feedback") or {}
    reason = _QUOTED.sub("", str(feedback.get("warning") or "")).strip().rstrip(".")
    if not reason:
        reason = "it is short" if len(passphrase) < 12 else "it is easy to guess"
    else:
        reason = reason[:1].lower() + reason[1:]
    return Weakness(score, reason)


__all__ = ["Weakness", "weakness", "GOOD_SCORE"]
