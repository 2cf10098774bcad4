"""Stateful property testing of a real memoriesd against a model (issue 18, item 3).

A hypothesis :class:`~hypothesis.stateful.RuleBasedStateMachine` drives one real daemon process over
its real socket: create / unlock / lock / add / update / delete / ingest (a small Markdown folder) /
search / compact / passwd / remember / forget / restart (SIGTERM or SIGKILL, cheap or real Argon2id
parameters) / grant create + use + revoke, in any order, and pairs of them at once from two
connections (:meth:`Machine.pair`: add+add, update+update, lock+add, unlock+passwd, search+add,
remember+forget, compact+update, a SIGKILL while an add is in flight). A Python model
(:class:`VaultModel`) holds what the daemon acknowledged. After every step (:meth:`Machine.agree`):

- the daemon process is alive (0 crashes);
- a locked vault shows nothing: every list, read and search answers ``vault_locked``;
- an unlocked vault lists exactly the model's records at the model's revisions (records whose add
  was in flight at a SIGKILL may or may not be there); a deleted or forgotten record is ``not_found``.

``run()`` is the report's section (``tests/support/reliability_report.py``); tests/test_stateful.py runs
it in short mode. Each example works on vaults of its own in one shared daemon (deleted after it).
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky, FlakyStrategyDefinition, HypothesisException
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from .live import CHEAP, STRONG, LiveDaemon, Reply, new_home
from .stateful_model import Rec, Stats, VaultModel, both, token
from .stateful_pairs import PAIRS

_counter = itertools.count(1)  # vault names

WORDS = ("zebra", "lighthouse", "keeper", "morning", "orchard", "violin", "harbour", "lantern")
# Body text around the unique token: any printable text, no surrogates (JSON could not carry them to a file).
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
# File text: no control characters (a file with them is refused as binary, rightly).
FILE_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=30)
PASSPHRASE = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=16)


STATE: dict[str, Any] = {"daemon": None, "stats": Stats()}


def _daemon() -> LiveDaemon:
    d = STATE["daemon"]
    if d is None:
        d = LiveDaemon(new_home(CHEAP)).start()
        STATE["daemon"] = d
    return d


def recorded(fn: Callable[..., None]) -> Callable[..., None]:
    """Log the step; keep the first report of a failure (hypothesis replays a failing run, and a
    real daemon cannot replay exactly: the replay's own error would hide this one)."""

    @functools.wraps(fn)
    def step(self: Machine, **kw: Any) -> None:
        self.trail.append(fn.__name__ + "(" + ", ".join(f"{k}={v!r}" for k, v in kw.items() if k != "data") + ")")
        try:
            fn(self, **kw)
        except HypothesisException:
            raise  # hypothesis's own (a replay that drew differently): not a finding about the daemon
        except Exception as exc:
            msg = f"{type(exc).__name__}: {str(exc)[:1500]} [steps: {'; '.join(self.trail[-12:])}]"
            if len(self.stats.failures) < 10 and msg not in self.stats.failures:
                self.stats.failures.append(msg)
            raise

    return step


class Machine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.d = _daemon()
        self.stats: Stats = STATE["stats"]
        self.stats.examples += 1
        self.vaults: list[VaultModel] = []
        self.trail: list[str] = []

    # ------------------------------------------------------------------ plumbing

    def req(self, method: str, params: dict[str, Any] | None = None, sock: Any = None) -> Reply:
        self.stats.requests += 1
        r = self.d.request(method, params, sock)
        if r.code is not None:
            self.stats.answered_error += 1
            assert r.code != "internal", f"{method}: internal error {r['error']}"
        return r

    def expect(self, r: Reply, code: str | None, what: str) -> Reply:
        assert r.code == code, f"{what}: expected {code or 'a result'}, got {dict(r)}"
        return r

    def locked_or(self, v: VaultModel, r: Reply, what: str) -> bool:
        """True when the vault is unlocked and ``r`` is a result; a locked vault must answer vault_locked."""
        if not v.unlocked:
            self.expect(r, "vault_locked", what + " while locked")
            return False
        self.expect(r, None, what)
        return True

    def pick(self, data: st.DataObject, items: list[Any]) -> Any:
        return data.draw(st.sampled_from(items))

    def body(self, data: st.DataObject, tok: str) -> str:
        return f"{data.draw(TEXT)} {self.pick(data, list(WORDS))} {tok}"

    def teardown(self) -> None:
        d = STATE["daemon"]
        if d is None or not d.alive():
            return
        for v in self.vaults:
            try:
                d.request("vault.delete", {"vault": v.vid})
            except Exception:  # noqa: BLE001 - the next example starts fresh vaults anyway
                pass
        d.sample_rss()

    # ------------------------------------------------------------------ vault rules

    @initialize(passphrase=PASSPHRASE)
    @recorded
    def first(self, passphrase: str) -> None:
        self.create(passphrase=passphrase)

    @precondition(lambda self: len(self.vaults) < 3)
    @rule(passphrase=PASSPHRASE)
    @recorded
    def create(self, passphrase: str) -> None:
        name = f"v{next(_counter)}"
        r = self.expect(self.req("vault.create", {"name": name, "passphrase": passphrase}), None, "create")
        v = VaultModel(r.result["vault_id"], name, passphrase)
        v.folder = self.d.home.parent / f"docs-{v.vid}"
        v.folder.mkdir()
        for i in range(3):
            tok = token()
            v.files[f"note{i}.md"] = tok
            (v.folder / f"note{i}.md").write_text(f"# Note {i}\n\nThe {WORDS[i]} says {tok}.\n")
        self.vaults.append(v)

    @precondition(lambda self: self.vaults)
    @rule(data=st.data(), wrong=st.booleans())
    @recorded
    def unlock(self, data: st.DataObject, wrong: bool) -> None:
        v = self.pick(data, self.vaults)
        pw = v.passphrase + "x" if wrong else v.passphrase
        r = self.req("vault.unlock", {"vault": v.vid, "passphrase": pw})
        self.expect(r, "bad_passphrase" if wrong else None, "unlock")
        if not wrong:
            v.unlocked = True

    @precondition(lambda self: self.vaults)
    @rule(data=st.data())
    @recorded
    def lock(self, data: st.DataObject) -> None:
        v = self.pick(data, self.vaults)
        r = self.expect(self.req("vault.lock", {"vault": v.vid}), None, "lock")
        assert r.result["locked"] == ([v.vid] if v.unlocked else []), r
        v.unlocked = False

    @precondition(lambda self: self.vaults)
    @rule(data=st.data(), wrong=st.booleans(), new=PASSPHRASE)
    @recorded
    def passwd(self, data: st.DataObject, wrong: bool, new: str) -> None:
        v = self.pick(data, self.vaults)
        old = v.passphrase + "x" if wrong else v.passphrase
        r = self.req("vault.passwd", {"vault": v.vid, "old": old, "new": new})
        self.expect(r, "bad_passphrase" if wrong else None, "passwd")
        if not wrong:
            v.passphrase = new

    @precondition(lambda self: self.vaults)
    @rule(data=st.data())
    @recorded
    def compact(self, data: st.DataObject) -> None:
        v = self.pick(data, self.vaults)
        self.locked_or(v, self.req("vault.compact", {"vault": v.vid}), "compact")

    @rule(hard=st.booleans(), strong=st.sampled_from([False, False, False, True]))
    @recorded
    def restart(self, hard: bool, strong: bool) -> None:
        """SIGTERM or SIGKILL, then a fresh process; ``strong``: the real Argon2id defaults from now on."""
        self.d.set_config(STRONG if strong else CHEAP)
        self.stats.restarts += 1
        self.stats.kills += hard
        self.d.restart(hard=hard)
        for v in self.vaults:
            v.unlocked = False

    # ------------------------------------------------------------------ record rules

    @precondition(lambda self: self.vaults)
    @rule(data=st.data())
    @recorded
    def add(self, data: st.DataObject) -> None:
        v = self.pick(data, self.vaults)
        tok = token()
        tags = data.draw(st.lists(st.sampled_from(WORDS), max_size=2, unique=True))
        r = self.req("memory.add", {"vault": v.vid, "body": self.body(data, tok), "title": data.draw(TEXT), "tags": tags})
        if self.locked_or(v, r, "add"):
            v.records[r.result["id"]] = Rec("memory", 1, tok)

    @precondition(lambda self: any(v.of_kind("memory", "fact") for v in self.vaults))
    @rule(data=st.data())
    @recorded
    def update(self, data: st.DataObject) -> None:
        v = self.pick(data, [v for v in self.vaults if v.of_kind("memory", "fact")])
        rid = self.pick(data, v.of_kind("memory", "fact"))
        tok = token()
        r = self.req("memory.update", {"vault": v.vid, "id": rid, "body": self.body(data, tok)})
        if self.locked_or(v, r, "update"):
            rec = v.records[rid]
            assert r.result["revision"] == rec.revision + 1, (r, rec)
            rec.revision, rec.token = rec.revision + 1, tok

    @precondition(lambda self: any(v.records for v in self.vaults))
    @rule(data=st.data())
    @recorded
    def delete(self, data: st.DataObject) -> None:
        v = self.pick(data, [v for v in self.vaults if v.records])
        rid = self.pick(data, sorted(v.records))
        if self.locked_or(v, self.req("memory.delete", {"vault": v.vid, "id": rid}), "delete"):
            self._gone(v, rid, forgotten=False)

    def _gone(self, v: VaultModel, rid: str, *, forgotten: bool) -> None:
        rec = v.records.pop(rid)
        v.gone.add(rid)
        if forgotten:
            v.forgotten_tokens.add(rec.token)
        for name, (card, _) in list(v.ingested.items()):
            if card == rid:
                del v.ingested[name]

    @precondition(lambda self: self.vaults)
    @rule(data=st.data(), change=st.integers(-1, 2))
    @recorded
    def ingest(self, data: st.DataObject, change: int) -> None:
        """Ingest the vault's folder, after rewriting one of its files (``change`` >= 0) with a new token."""
        v = self.pick(data, self.vaults)
        assert v.folder is not None
        if change >= 0:
            name = f"note{change}.md"
            v.files[name] = tok = token()
            (v.folder / name).write_text(f"# Note {change}\n\n{data.draw(FILE_TEXT)} {tok}.\n")
        r = self.req("rag.ingest", {"vault": v.vid, "paths": [str(v.folder)], "recursive": True})
        if not self.locked_or(v, r, "ingest"):
            return
        want = {}
        for name, tok in v.files.items():
            known = v.ingested.get(name)
            want[name] = "added" if known is None else ("unchanged" if known[1] == tok else "updated")
        got = {Path(item["path"]).name: item for item in r.result["records"]}
        assert {n: s for n, s in want.items() if s != "unchanged"} == {n: i["status"] for n, i in got.items()}, (want, r)
        assert r.result["unchanged"] == sum(s == "unchanged" for s in want.values()) and not r.result["refused"], r
        for name, item in got.items():
            if item["status"] == "updated":
                card = v.ingested[name][0]
                assert item["id"] == card and item["revision"] == v.records[card].revision + 1, (item, v.records[card])
            v.records[item["id"]] = Rec("card", item["revision"], v.files[name])
            v.ingested[name] = (item["id"], v.files[name])
            # A forgotten card's file still holds its word: ingested again, the new card is found by it.
            v.forgotten_tokens.discard(v.files[name])

    @precondition(lambda self: self.vaults)
    @rule(data=st.data())
    @recorded
    def search(self, data: st.DataObject) -> None:
        """A live record is found by its unique word; a forgotten fact is not."""
        v = self.pick(data, self.vaults)
        live = sorted(v.records)
        if live and (not v.forgotten_tokens or data.draw(st.booleans())):
            rid = self.pick(data, live)
            r = self.req("memory.search", {"vault": v.vid, "query": v.records[rid].token})
            if self.locked_or(v, r, "search"):
                rec = v.records[rid]
                assert [x["id"] for x in r.result["results"]] == [rid], f"{rid} ({rec}) not found by {rec.token}: {r}"
        elif v.forgotten_tokens:
            tok = self.pick(data, sorted(v.forgotten_tokens))
            r = self.req("memory.search", {"vault": v.vid, "query": tok})
            if self.locked_or(v, r, "search forgotten"):
                assert r.result["results"] == [], f"forgotten {tok} found: {r}"

    @precondition(lambda self: self.vaults)
    @rule(data=st.data(), keyed=st.booleans())
    @recorded
    def remember(self, data: st.DataObject, keyed: bool) -> None:
        """A new fact (``action`` added), or with the key of a fact of the model its next revision."""
        v = self.pick(data, self.vaults)
        self._remember(v, data, keyed)

    def _remember(self, v: VaultModel, data: st.DataObject, keyed: bool, sock: Any = None) -> None:
        tok = token()
        params: dict[str, Any] = {"vault": v.vid, "text": f"the user {self.pick(data, list(WORDS))} {tok}"}
        if keyed:
            params["key"] = "k" + tok[-4:]  # rarely the same: a keyed fact of another key is added
        r = self.req("memory.remember", params, sock)
        if self.locked_or(v, r, "remember"):
            self._remembered(v, r, tok)

    def _remembered(self, v: VaultModel, r: Reply, tok: str) -> None:
        out = r.result
        if out["action"] == "added":
            assert out["id"] not in v.records and out["revision"] == 1, out
            v.records[out["id"]] = Rec("fact", 1, tok)
        else:
            assert out["action"] == "updated" and v.records[out["id"]].revision + 1 == out["revision"], out
            v.records[out["id"]] = Rec("fact", out["revision"], tok)

    @precondition(lambda self: any(v.records for v in self.vaults))
    @rule(data=st.data())
    @recorded
    def forget(self, data: st.DataObject) -> None:
        """Forget a fact (mostly) or any record, for good: every revision, every derived file."""
        v = self.pick(data, [v for v in self.vaults if v.records])
        facts = v.of_kind("fact")
        rid = self.pick(data, facts if facts and data.draw(st.booleans()) else sorted(v.records))
        r = self.req("memory.forget", {"vault": v.vid, "ids": [rid]})
        if self.locked_or(v, r, "forget"):
            assert r.result["forgotten"] == 1, r
            self._gone(v, rid, forgotten=True)
            self.expect(self.req("memory.history", {"vault": v.vid, "id": rid}), "not_found", "history of a forgotten record")

    @precondition(lambda self: self.vaults)
    @rule(data=st.data(), revoke=st.booleans())
    @recorded
    def grant(self, data: st.DataObject, revoke: bool) -> None:
        """Create a grant, search and read through it (never another vault's record), maybe revoke it;
        every older grant still works and every revoked one is refused."""
        v = self.pick(data, self.vaults)
        r = self.req("grant.create", {"vault": v.vid, "scopes": ["search", "read"]})
        if not self.locked_or(v, r, "grant create"):
            return
        v.grants[r.result["grant_id"]] = r.result["token"]
        for tok in [t for _, t in sorted(v.grants.items())]:
            s = self.d.connect(v.vid)  # a grant is presented to its vault's process (the MCP server asks vault.route)
            try:
                self.expect(self.req("session.grant", {"token": tok}, s), None, "present a live grant")
                mine = [rid for rid in v.of_kind("memory", "fact", "card")]
                if mine:
                    rid = self.pick(data, mine)
                    got = self.expect(self.req("memory.search", {"query": v.records[rid].token}, s), None, "granted search")
                    assert [x["id"] for x in got.result["results"]] == [rid], got
                for other in self.vaults:
                    if other is not v and other.records:
                        rid = sorted(other.records)[0]
                        self.expect(self.req("memory.read", {"id": rid}, s), "not_found", "another vault's record")
            finally:
                s.close()
        for tok in [t for _, t in sorted(v.revoked.items())]:
            s = self.d.connect(v.vid)
            try:
                got = self.req("session.grant", {"token": tok}, s)
                if got.code is None:
                    got = self.req("memory.search", {"query": "zebra"}, s)
                self.expect(got, "grant_invalid", "a revoked grant")
            finally:
                s.close()
        if revoke:
            gid = self.pick(data, sorted(v.grants))
            self.expect(self.req("grant.revoke", {"grant_id": gid}), None, "revoke")
            v.revoked[gid] = v.grants.pop(gid)

    # ------------------------------------------------------------------ two at once

    @precondition(lambda self: self.vaults)
    @rule(data=st.data(), kind=st.sampled_from(
        ["add+add", "update+update", "lock+add", "unlock+passwd", "search+add", "remember+forget", "compact+update", "kill+add"]
    ))
    @recorded
    def pair(self, data: st.DataObject, kind: str) -> None:
        """Two requests at once on two connections; the model accepts either order."""
        v = self.pick(data, self.vaults)
        self.stats.concurrent_pairs += 1
        PAIRS[kind](self, v, data)

    # ------------------------------------------------------------------ the invariants

    @invariant()
    @recorded
    def agree(self) -> None:
        self.stats.steps += 1
        if not self.d.alive():
            self.stats.crashes += 1
            self.d.start()
            raise AssertionError("memoriesd died")
        listed = {x["vault_id"]: x for x in self.d.call("vault.list")["vaults"]}
        for v in self.vaults:
            assert listed[v.vid]["locked"] is (not v.unlocked), (v.vid, listed[v.vid], v.unlocked)
            r = self.req("memory.list", {"vault": v.vid})
            if not v.unlocked:
                self._locked_shows_nothing(v, r)
                continue
            self.expect(r, None, "list")
            have = {x["id"]: x["revision"] for x in r.result["records"]}
            lost = [rid for rid in v.records if rid not in have]
            self.stats.acknowledged_records_lost += len(lost)
            assert not lost, f"acknowledged records lost: {lost}"
            for rid in [rid for rid in have if rid not in v.records]:
                body = self.expect(self.req("memory.read", {"vault": v.vid, "id": rid}), None, "read").result["body"]
                tok = next((t for t in v.maybe if t in body), None)
                assert tok is not None, f"record {rid} is not in the model"
                v.records[rid] = Rec("memory", have[rid], tok)
            v.maybe.clear()
            assert have == {rid: rec.revision for rid, rec in v.records.items()}, (have, v.records)
            if v.records:
                rid = sorted(v.records)[self.stats.steps % len(v.records)]
                got = self.expect(self.req("memory.read", {"vault": v.vid, "id": rid}), None, "read")
                assert v.records[rid].token in got.result["body"] and got.result["kind"] == v.records[rid].kind, got
            if v.gone:
                rid = sorted(v.gone)[self.stats.steps % len(v.gone)]
                self.expect(self.req("memory.read", {"vault": v.vid, "id": rid}), "not_found", "read a deleted record")

    def _locked_shows_nothing(self, v: VaultModel, listed: Reply) -> None:
        replies = [listed, self.req("memory.search", {"vault": v.vid, "query": "zebra"})]
        if v.records:
            replies.append(self.req("memory.read", {"vault": v.vid, "id": sorted(v.records)[0]}))
        for r in replies:
            self.stats.locked_reads_checked += 1
            if r.code != "vault_locked":
                self.stats.records_visible_while_locked += 1
                raise AssertionError(f"a locked vault answered {dict(r)}")


def _settings(examples: int, steps: int, derandomize: bool) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        derandomize=derandomize,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        report_multiple_bugs=False,
        # No shrinking: each step talks to a real daemon, and a shrink can take longer than the run.
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
    )


def run(
    short: bool = True, seeds: int | None = None, minutes: float | None = None, examples: int | None = None, steps: int | None = None
) -> dict[str, Any]:
    """The report section: ``examples`` (default: 6 short, ``seeds`` or 200 long) sequences of up to
    ``steps`` (12 short, 40 long) steps; with ``minutes``, no new batch (of 20) starts after that time."""
    examples = examples or (6 if short else seeds or 200)
    steps = steps or (12 if short else 40)
    STATE["stats"] = stats = Stats()
    t0 = time.monotonic()
    deadline = None if minutes is None else t0 + minutes * 60
    batches = done = 0
    per_batch = examples if deadline is None else min(examples, 20)  # the time limit is checked between batches
    try:
        while done < examples and not stats.failures and (deadline is None or time.monotonic() < deadline):
            batches += 1
            n = min(per_batch, examples - done)
            try:
                run_state_machine_as_test(Machine, settings=_settings(n, steps, derandomize=short))
            except (Flaky, FlakyStrategyDefinition):
                # Hypothesis replayed a prefix and the real daemon (random ids, timing) led it elsewhere:
                # the batch ends there; any real failure was recorded by the step that saw it.
                stats.replays_abandoned += 1
            except Exception as exc:  # noqa: BLE001 - a falsified property is a finding, kept in the report
                if not stats.failures:  # else the steps' own reports say it (see recorded)
                    stats.failures.append(f"{type(exc).__name__}: {str(exc)[:1500]}")
            done += n
    finally:
        d: LiveDaemon | None = STATE["daemon"]
        if d is not None:
            d.sample_rss()
            stats.crashes += d.crashes
            peak = d.peak_rss_kib
            d.remove()
            STATE["daemon"] = None
        else:
            peak = 0
    out = {k: v for k, v in vars(stats).items()}
    out.update(batches=batches, seconds=round(time.monotonic() - t0, 1), peak_daemon_rss_mib=round(peak / 1024, 1))
    return out


__all__ = ["Machine", "Rec", "Stats", "VaultModel", "both", "run"]
