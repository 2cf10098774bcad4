"""Stateful property tests: a hypothesis state machine drives a real daemon over its socket with
create / unlock / lock / add / update / delete / ingest / search / compact / passwd / remember /
forget / restart / grant, and pairs of them at once from two connections, against a model: 0
crashes, 0 records visible while locked, model and daemon agree after every step.

The engine is ``tests/support/stateful.py``; ``tests/support/reliability_report.py`` runs it with many
more examples. The second test exercises the real Argon2id parameters where they matter: an unlock
and a passphrase change of one vault at once (the daemon's KDF lock serialises the derivations).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .support import stateful
from .support.stateful_pairs import PAIRS, unlock_passwd


def test_any_sequence_of_operations_from_concurrent_clients_agrees_with_the_model() -> None:
    out = stateful.run(short=True)
    assert out["failures"] == [], out["failures"]
    assert out["crashes"] == 0 and out["acknowledged_records_lost"] == 0, out
    assert out["records_visible_while_locked"] == 0 and out["locked_reads_checked"] > 0, out
    assert out["steps"] >= 40, out  # (how many pairs the draws chose varies: every pair runs in the next test)


def test_every_pair_of_requests_at_once_agrees_with_the_model() -> None:
    """Each kind of concurrent pair once, in a fixed order, against the vault processes of a real daemon."""
    ran: list[str] = []

    @settings(max_examples=1, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def every_pair(data: st.DataObject) -> None:
        m = stateful.Machine()
        try:
            m.create(passphrase="pairs passphrase")
            v = m.vaults[0]
            m.add(data=_Data([v, [], "zebra notes", "zebra", "title"]))
            for kind in PAIRS:
                m.pair(data=data, kind=kind)
                m.agree()
                ran.append(kind)
        finally:
            m.teardown()
            stateful.STATE["daemon"].remove()
            stateful.STATE["daemon"] = None

    every_pair()
    assert ran == list(PAIRS)  # a step that disagreed with the model raised


class _Data:
    """Stands in for hypothesis's ``data`` when the machine's steps are called in a fixed order."""

    def __init__(self, values: list[object]) -> None:
        self.values = values

    def draw(self, strategy: st.SearchStrategy[object]) -> object:
        return self.values.pop(0)


def test_unlock_and_passwd_at_once_with_real_argon2id_agree_with_the_model() -> None:
    m = stateful.Machine()
    try:
        m.restart(hard=False, strong=True)  # the real Argon2id defaults from now on
        m.create(passphrase="first passphrase")
        v = m.vaults[0]
        m.add(data=_Data([v, [], "zebra notes", "zebra", "title"]))  # vault, tags, text, word, title
        for i, locked in enumerate((True, False, True)):
            if locked:
                m.lock(data=_Data([v]))
            unlock_passwd(m, v, _Data([f"passphrase {i}"]))
            m.agree()
        assert m.stats.strong_kdf_ops >= 2 and v.passphrase == "passphrase 2"
        m.unlock(data=_Data([v]), wrong=False)
        m.agree()
    finally:
        m.teardown()
        d = stateful.STATE["daemon"]
        d.remove()
        stateful.STATE["daemon"] = None
