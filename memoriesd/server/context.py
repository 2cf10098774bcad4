"""Request context and parameter access shared by every handler."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import Cancelled, InvalidParams
from ..text.unicode import unpaired_surrogate


class _Missing(enum.Enum):
    """No default given: the parameter is required."""

    MISSING = enum.auto()


_MISSING = _Missing.MISSING
#: A parameter's default: what the accessor returns (beside the parameter's own type) when it is absent.
D = TypeVar("D")


class Params:
    """Typed access to a request's params; wrong shapes are ``invalid_params``, never a crash."""

    def __init__(self, raw: object) -> None:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise InvalidParams("params must be a JSON object")
        self.raw = raw

    def _get(self, name: str, default: object) -> object:
        value = self.raw.get(name, default)
        if value is _MISSING:
            raise InvalidParams(f"missing parameter {name}")
        return value

    def text(
        self, name: str, default: D | _Missing = _MISSING, *, allow_empty: bool = True, max_len: int | None = None,
        allow_surrogates: bool = False,
    ) -> str | D:
        """A string parameter. ``allow_surrogates``: the caller refuses lone surrogates itself, saying
        where they are (a transcript's line)."""
        value = self._get(name, default)
        if value is None and default is None:
            return default
        if not isinstance(value, str):
            raise InvalidParams(f"parameter {name} must be a string")
        if not allow_empty and not value:
            raise InvalidParams(f"parameter {name} must not be empty")
        if max_len is not None and len(value) > max_len:
            raise InvalidParams(f"parameter {name} is too long (at most {max_len} characters)")
        if not allow_surrogates:
            _check_unicode(name, value)
        return value

    def integer(self, name: str, default: D | _Missing = _MISSING, *, lo: int | None = None, hi: int | None = None) -> int | D:
        value = self._get(name, default)
        if value is None and default is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidParams(f"parameter {name} must be an integer")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            if hi is None:
                raise InvalidParams(f"parameter {name} must be at least {lo}")
            if lo is None:
                raise InvalidParams(f"parameter {name} must be at most {hi}")
            raise InvalidParams(f"parameter {name} must be between {lo} and {hi}")
        return value

    def number(self, name: str, default: D | _Missing = _MISSING) -> float | D:
        value = self._get(name, default)
        if value is None and default is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidParams(f"parameter {name} must be a number")
        return float(value)

    def flag(self, name: str, default: D | _Missing = _MISSING) -> bool | D:
        value = self._get(name, default)
        if value is None and default is None:
            return default
        if not isinstance(value, bool):
            raise InvalidParams(f"parameter {name} must be true or false")
        return value

    def texts(self, name: str, default: list[str] | _Missing = _MISSING) -> list[str]:
        value = self._get(name, default)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidParams(f"parameter {name} must be a list of strings")
        for v in value:
            _check_unicode(name, v)
        return list(value)

    def choice(self, name: str, choices: tuple[str, ...], default: D | _Missing = _MISSING) -> str | D:
        value = self.text(name, default)
        if value is None and default is None:
            return default
        if value not in choices:
            raise InvalidParams(f"parameter {name} must be one of {', '.join(choices)}")
        return value


def _check_unicode(name: str, value: str) -> None:
    """JSON can carry lone surrogates ("\\ud800"), which no UTF-8 file can hold: refuse them here."""
    if unpaired_surrogate(value) is not None:
        raise InvalidParams(f"parameter {name} is not valid Unicode text (it holds a lone surrogate)")


@dataclass
class PresentedGrant:
    """What a connection presented (``session.grant``): the ids from the token, and the token to
    verify it with (:mod:`.grants` checks it at every request)."""

    vault_id: str
    grant_id: str
    token: str = field(repr=False)
    poisoned: bool = False  # the token did not verify: the connection is refused everything


@dataclass
class Context:
    """What a handler knows about the request it serves."""

    params: Params
    send_progress: Callable[[dict[str, Any]], None] = lambda _p: None
    cancelled: threading.Event = field(default_factory=threading.Event)
    grant: PresentedGrant | None = None  # when the connection presented one (MCP)
    # Extra checks run by check_cancelled(): each raises (e.g. Cancelled, VaultLocked) to stop work.
    checks: list[Callable[[], None]] = field(default_factory=list)
    # Releases of the vault leases this request took (see VaultManager.use); run when it ends.
    leases: list[Callable[[], None]] = field(default_factory=list)

    def release(self) -> None:
        """End of the request: give back every vault lease it holds."""
        while self.leases:
            self.leases.pop()()
        self.checks.clear()

    def check_cancelled(self) -> None:
        """Raise if the work should stop: the client went away, or a registered check fails."""
        if self.cancelled.is_set():
            raise Cancelled("the request was cancelled (the client went away)")
        for check in self.checks:
            check()
