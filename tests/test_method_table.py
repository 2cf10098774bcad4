"""The method table: every method declares every attribute once, and every served method is in it."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys

import pytest

from memoriesd.config import load_config
from memoriesd.home import Home
from memoriesd.main import build_app, method_table
from memoriesd.server.method import GRANT_SCOPES, ROUTES, Method, MethodTable
from memoriesd.workers import routes
from memoriesd.workers.router import Router

from .conftest import short_tmpdir, write_config

ATTRIBUTES = {f.name for f in dataclasses.fields(Method)}


def test_every_method_declares_every_attribute_with_a_valid_value() -> None:
    table = method_table()
    assert len(table) >= 38
    for m in table:
        assert {f.name for f in dataclasses.fields(m)} == ATTRIBUTES
        assert callable(m.handler), m.name
        assert m.route in ROUTES, m.name
        assert isinstance(m.locked_ok, bool) and isinstance(m.resend_safe, bool), m.name
        assert m.owner_only == (m.scope is None), m.name
        assert m.scope is None or m.scope in GRANT_SCOPES, m.name
        assert m.scope is None or m.grant_params, f"{m.name}: a granted method names the params a grant may choose"


def test_every_grant_scope_opens_exactly_one_method() -> None:
    scoped = [m.scope for m in method_table() if m.scope is not None]
    assert sorted(scoped) == sorted(GRANT_SCOPES)


def test_a_method_declared_twice_is_refused_at_start() -> None:
    m = next(iter(method_table()))
    with pytest.raises(ValueError, match="declared twice"):
        MethodTable([m, m])


def test_a_granted_method_cannot_also_be_owner_only() -> None:
    with pytest.raises(ValueError, match="owner-only"):
        Method("x.y", lambda app, ctx: {}, scope="search")


def test_the_clients_routing_copy_matches_the_table() -> None:
    """The CLI reads routes.py (it must not import the handlers): it says what the table says."""
    table = method_table()
    assert table.names(route="router") | table.names(route="both") == routes.ROUTER_METHODS
    assert table.names(route="start") == routes.START_METHODS
    assert table.names(route="create") == {routes.CREATE_METHOD, routes.JOIN_METHOD}
    assert table.names(locked_ok=True) == routes.LOCKED_OK_METHODS
    assert table.names(resend_safe=True) == routes.RESEND_WHEN_ENDED


def test_the_cli_reads_routing_without_importing_the_handlers() -> None:
    code = "import sys, memories_cli.client; print(sorted(m for m in sys.modules if m.startswith('memoriesd.server.methods') or m in ('numpy', 'onnxruntime', 'jieba')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_handler_the_daemon_and_a_vault_process_serve_is_in_the_table() -> None:
    """The router serves the table (plus its own side of some of its methods); nothing outside it."""
    root = short_tmpdir("mtab")
    try:
        home = Home(root / "h")
        write_config(home.root)
        home.ensure()
        app = build_app(home, load_config(home.config_path))
        names = {m.name for m in app.methods}
        assert names == {m.name for m in method_table()}
        router = Router(app)
        try:
            for name in names:
                assert router.handler(name) is not None, name
            assert set(router._overrides) <= names, "the router overrides only declared methods"
            assert router.handler("no.such") is None
        finally:
            router.close()
            app.vaults.lock_all("test end")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_handlers_register_nothing_on_import() -> None:
    """No decorator side effects: importing a family module does not change what the table holds."""
    before = {m.name for m in method_table()}
    import memoriesd.server.methods.search  # noqa: F401

    assert {m.name for m in method_table()} == before
