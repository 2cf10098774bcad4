"""What a protocol method is: one declaration per method, read by the daemon, its roles and grants.

Each family module in :mod:`memoriesd.server.methods` (and :mod:`memoriesd.workers.router` for the
router's own) exports ``METHODS``, a list of :class:`Method`; the composition root
(:mod:`memoriesd.main`) assembles them into one :class:`MethodTable`. Nothing registers itself on
import. Light on purpose (standard library only): the table's attributes are what the router, a
vault's process, grants and the client's routing (:mod:`memoriesd.workers.routes`) read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

if TYPE_CHECKING:
    from .context import Context

#: The application a handler is given (:class:`memoriesd.server.app.App`): a type parameter, so that
#: this module (read by app, grants and the roles) needs nothing above it.
AppT = TypeVar("AppT")
#: A method's implementation: the application and the request's context in, a JSON-able dict out.
Handler = Callable[[AppT, "Context"], dict[str, Any]]

#: Where a request for the method is served:
#: ``vault`` the process of the vault it names (the router when it names none);
#: ``router`` the main daemon only (it never carries vault plaintext);
#: ``both`` the main daemon, and a vault's process answers it too (nothing vault-wide only the router knows);
#: ``start`` a vault's process, started for it when its vault is locked (it carries a passphrase);
#: ``create`` a fresh vault process bound to a new vault id.
Route = Literal["vault", "router", "both", "start", "create"]
ROUTES: tuple[Route, ...] = ("vault", "router", "both", "start", "create")
#: Grant scopes a method may need (``forget-all`` is asked for by ``memory.forget`` with ``all``).
GRANT_SCOPES = ("search", "read", "retrieve", "ask", "context", "remember", "capture", "forget")


@dataclass(frozen=True)
class Method(Generic[AppT]):
    """One protocol method and everything the daemon must know about it.

    ``scope``: the grant scope a grant connection needs to call it, with ``grant_params`` the only
    parameters such a call may choose (everything else is dropped); ``owner_only``: no grant may call
    it (the person's own CLI only): exactly the methods without a scope. ``locked_ok``: the router
    answers it while the vault is locked. ``resend_safe``: a client may send it again when the vault's
    process ended under it (nothing of it ran, or running it twice is harmless).
    """

    name: str
    handler: Handler[AppT]
    scope: str | None = None
    route: Route = "vault"
    locked_ok: bool = False
    resend_safe: bool = False
    owner_only: bool = True
    grant_params: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.route not in ROUTES:
            raise ValueError(f"{self.name}: route {self.route!r} is not one of {ROUTES}")
        if self.owner_only != (self.scope is None):
            raise ValueError(f"{self.name}: a method is owner-only exactly when it has no grant scope")
        if self.scope is not None and self.scope not in GRANT_SCOPES:
            raise ValueError(f"{self.name}: unknown grant scope {self.scope!r}")
        if self.grant_params and self.scope is None:
            raise ValueError(f"{self.name}: grant_params without a grant scope")


class MethodTable(Generic[AppT]):
    """Every method the daemon serves, by name (a name declared twice is a bug, refused at start)."""

    def __init__(self, methods: Iterable[Method[AppT]]) -> None:
        self._methods: dict[str, Method[AppT]] = {}
        for m in methods:
            if m.name in self._methods:
                raise ValueError(f"method {m.name} is declared twice")
            self._methods[m.name] = m

    def get(self, name: str) -> Method[AppT] | None:
        return self._methods.get(name)

    def handler(self, name: str) -> Handler[AppT] | None:
        m = self._methods.get(name)
        return m.handler if m is not None else None

    def names(self, *, route: Route | None = None, locked_ok: bool | None = None, resend_safe: bool | None = None) -> frozenset[str]:
        """The names of the methods with the given attributes (None: any)."""
        return frozenset(
            m.name
            for m in self._methods.values()
            if (route is None or m.route == route)
            and (locked_ok is None or m.locked_ok == locked_ok)
            and (resend_safe is None or m.resend_safe == resend_safe)
        )

    def __iter__(self) -> Iterator[Method[AppT]]:
        return iter(self._methods.values())

    def __len__(self) -> int:
        return len(self._methods)

    def __contains__(self, name: object) -> bool:
        return name in self._methods


__all__ = ["Method", "MethodTable", "Handler", "AppT", "Route", "ROUTES", "GRANT_SCOPES"]
