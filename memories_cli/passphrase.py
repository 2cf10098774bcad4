"""Passphrases at the terminal: strength at `vault create` / `vault passwd`, tries at `vault unlock`.

The estimate is zxcvbn's (dictionaries, keyboard patterns, sequences, dates, l33t), imported only
here, when a passphrase is chosen (~20 ms): no other command pays for it. The warning says why the
passphrase is weak in zxcvbn's own fixed words and never repeats, logs or sends the passphrase.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import typer

from memoriesd.errors import MemoriesError

from .state import call, notice, prompt_secret

#: Passphrase tries of an interactive unlock (a terminal); a passphrase from stdin or a file gets one.
UNLOCK_TRIES = 3
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


def checked_new(passphrase: str, context: str, interactive: bool, prompt: str) -> str:
    """A new passphrase after its strength check: a weak one gets a one-line warning on stderr and, on
    a terminal, a question (no: ask for another). The passphrase itself is never shown or logged."""
    while True:
        weak = weakness(passphrase, [context])
        if weak is None:
            return passphrase
        notice(weak.line())
        if not interactive or typer.confirm("Use this passphrase anyway?", default=False, err=True):
            return passphrase
        passphrase = prompt_secret(prompt, confirm=True)


def unlock_asking(params: dict[str, Any], method: str = "vault.unlock") -> Any:
    """Unlock (or ``vault.join``) with a passphrase typed at the terminal: a wrong one is asked again,
    ``UNLOCK_TRIES`` in all (the daemon's slow-down after failures still applies to each)."""
    for attempt in range(UNLOCK_TRIES):
        params["passphrase"] = prompt_secret("Passphrase: ")
        try:
            return call(method, params)
        except MemoriesError as exc:
            left = UNLOCK_TRIES - 1 - attempt
            if exc.code != "bad_passphrase" or not left:
                raise
            notice(f"wrong passphrase, try again ({left} left)")
    raise AssertionError("unreachable")  # pragma: no cover


__all__ = ["Weakness", "weakness", "checked_new", "unlock_asking", "GOOD_SCORE", "UNLOCK_TRIES"]
