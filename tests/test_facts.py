"""`memory remember`: facts are revised, not piled up (real daemon; the small real model where it matters).

Same key -> a revision; same meaning (cosine over the model's calibrated threshold, a lower one
when the new text says it replaces the old) -> a revision; an exact repeat -> nothing written;
another attribute -> a second fact. Without a model, the lexical rule decides.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from memoriesd.embed.profile import GEMMA_PROFILE, ModelProfile
from memoriesd.memory.facts import LEXICAL_SAME, jaccard, normalise, normalise_key, revision_cue

from .conftest import SHARED, Daemon, all_file_bytes, cli_json, create_vault, run_cli, running_daemon

MINILM = SHARED / "models" / "all-MiniLM-L6-v2-onnx"
PASS = "correct horse"


@contextlib.contextmanager
def _daemon(model: bool = True) -> Iterator[tuple[Daemon, str]]:
    assert MINILM.is_dir(), f"{MINILM} is missing"
    cfg = f'[embedding.local]\nmodel_dir = "{MINILM}"\nthreads = 2\n[index]\nbackground = false\n' if model else ""
    with running_daemon(cfg) as d:
        yield d, create_vault(d, passphrase=PASS)


def _remember(d: Daemon, vid: str, *args: str) -> dict[str, Any]:
    return dict(cli_json(d.home, "memory", "remember", vid, *args))


def test_the_same_key_makes_one_fact_with_two_revisions_and_history_keeps_the_first() -> None:
    with _daemon() as (d, vid):
        first = _remember(d, vid, "The user prefers tabs over spaces.", "--category", "preference", "--key", "indentation")
        assert first["action"] == "added" and first["revision"] == 1 and first["previous"] is None
        assert first["key"] == "preference:indentation"
        second = _remember(d, vid, "Actually the user switched to spaces.", "--category", "preference", "--key", "Indentation")
        assert (second["action"], second["id"], second["revision"]) == ("updated", first["id"], 2)
        assert second["previous"] == {"revision": 1, "text": "The user prefers tabs over spaces."}
        facts = cli_json(d.home, "memory", "list", vid, "--kind", "fact", "--category", "preference")["facts"]
        assert [(f["id"], f["revision"], f["text"]) for f in facts] == [(first["id"], 2, "Actually the user switched to spaces.")]
        hist = cli_json(d.home, "memory", "history", vid, first["id"])["revisions"]
        assert [r["text"] for r in hist] == ["The user prefers tabs over spaces.", "Actually the user switched to spaces."]
        human = run_cli(d.home, "memory", "history", vid, first["id"])
        assert human.returncode == 0 and "tabs over" in human.stdout and "TEXT" in human.stdout
        # A fact with another key is another fact, however close its meaning.
        other = _remember(d, vid, "The user prefers tabs over spaces in Makefiles.", "--category", "preference", "--key", "makefiles")
        assert other["action"] == "added" and other["id"] != first["id"]


def test_an_exact_repeat_writes_nothing_and_a_restatement_by_meaning_is_a_revision() -> None:
    with _daemon() as (d, vid):
        a = _remember(d, vid, "The team deploys on Fridays.", "--category", "pattern")
        log = next((d.home / "vaults" / vid).glob("log-*.bin"))
        size = log.stat().st_size
        again = _remember(d, vid, "the team deploys on fridays", "--category", "pattern")
        assert (again["action"], again["id"], again["revision"], again["previous"]) == ("unchanged", a["id"], 1, None)
        assert log.stat().st_size == size
        # MiniLM: cosine 0.86 over its 0.70 threshold.
        b = _remember(d, vid, "The team no longer deploys on Fridays; deploys happen on Tuesdays.", "--category", "pattern")
        assert (b["action"], b["id"], b["revision"], b["matched_by"]) == ("updated", a["id"], 2, "cosine")
        assert b["similarity"] >= ModelProfile("m", 1, 1, "", None).fact_same_cosine
        # Another attribute of the same category stays a fact of its own (MiniLM: cosine 0.67).
        p = _remember(d, vid, "The user is allergic to peanuts.", "--category", "profile")
        c = _remember(d, vid, "The user is allergic to cats.", "--category", "profile")
        assert p["action"] == c["action"] == "added"
        # The same text in another category is another fact.
        assert _remember(d, vid, "The team deploys on Fridays.", "--category", "decision")["action"] == "added"
        # Human output: a notice on stderr, the id alone on stdout.
        human = run_cli(d.home, "memory", "remember", vid, "The user is allergic to cats.", "--category", "profile")
        assert human.returncode == 0 and human.stdout.strip() == c["id"] and "Unchanged" in human.stderr
        assert len(cli_json(d.home, "memory", "list", vid, "--kind", "fact")["facts"]) == 4


def test_without_a_model_words_decide_and_facts_are_searchable() -> None:
    with _daemon(model=False) as (d, vid):
        a = _remember(d, vid, "The user drinks coffee black, no sugar.", "--category", "preference")
        b = _remember(d, vid, "No sugar: the user drinks black coffee.", "--category", "preference")
        assert (b["action"], b["id"], b["matched_by"]) == ("updated", a["id"], "lexical")
        assert _remember(d, vid, "The user is allergic to peanuts.", "--category", "profile")["action"] == "added"
        assert _remember(d, vid, "The user is allergic to cats.", "--category", "profile")["action"] == "added"
        res = d.call("rag.search", {"vault": vid, "query": "black coffee"})
        assert res["mode"] == "bm25" and res["results"][0]["record_id"] == a["id"] and res["results"][0]["kind"] == "fact"
        # Each fact found counts as a recall, kept sealed across lock and unlock.
        facts = {f["id"]: f for f in d.call("memory.facts", {"vault": vid})["facts"]}
        assert facts[a["id"]]["recalls"] == 1 and facts[a["id"]]["last_recall"] is not None
        d.call("vault.lock", {"vault": vid})
        recalls = d.home / "vaults" / vid / "recalls.bin"
        assert recalls.is_file() and recalls.stat().st_mode & 0o777 == 0o600
        assert a["id"].encode() not in recalls.read_bytes()
        d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        facts = {f["id"]: f for f in d.call("memory.facts", {"vault": vid})["facts"]}
        assert facts[a["id"]]["recalls"] == 1
        for _path, data in all_file_bytes(d.home):
            assert b"sugar" not in data and b"peanut" not in data


BAD = [
    (["ok"], "at least 3 characters"),
    (["x" * 501], "memory add"),
    (["A fact.", "--category", "hobby"], "--category takes"),
    (["A fact.", "--importance", "1.5"], "from 0 to 1"),
    (["A fact.", "--key", "!!!"], "--key needs letters"),
]


def test_bad_facts_are_refused_in_one_line(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    for args, needle in BAD:
        r = run_cli(daemon.home, "memory", "remember", vid, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert daemon.call("memory.list", {"vault": vid})["records"] == []


def test_a_fact_can_come_from_stdin(daemon: Daemon) -> None:
    vid = create_vault(daemon)
    out = json.loads(run_cli(daemon.home, "--json", "memory", "remember", vid, "-", input="The user lives in Lyon.\n").stdout)
    assert out["action"] == "added"
    assert daemon.call("memory.read", {"vault": vid, "id": out["id"]})["body"] == "The user lives in Lyon."


def test_rules_of_sameness() -> None:
    assert normalise("  The user  likes TEA. ") == normalise("the user likes tea")
    assert normalise_key("preference", "Type Script") == "preference:type-script"
    assert normalise_key("fact", "C++") == "fact:c++" and normalise_key("fact", "?!") == ""
    assert normalise_key("preference", "preference:typescript") == normalise_key("preference", "TypeScript")
    assert revision_cue("Actually the user switched to spaces.") and revision_cue("用户现在更喜欢喝红茶。")
    assert not revision_cue("The user knows Norwegian.")
    assert jaccard("The user drinks coffee black, no sugar.", "No sugar: the user drinks black coffee.") >= LEXICAL_SAME
    assert jaccard("The user is allergic to peanuts.", "The user is allergic to cats.") < LEXICAL_SAME
    # The calibrated thresholds (bench/calibrate_facts.py): a revision needs less than a restatement.
    for profile in (GEMMA_PROFILE, ModelProfile("m", 1, 1, "", None)):
        assert 0 < profile.fact_revise_cosine < profile.fact_same_cosine < 1
