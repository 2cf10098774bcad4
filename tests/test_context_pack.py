"""`rag context`: a pack within a token budget, profile first, most relevant memories next, whole items.

Real daemons: with the small real model (tokens counted by its tokenizer, hybrid search) and
without one (the documented estimate, BM25). The priority rule is also checked on its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from memoriesd.embed.local import LocalEmbedder
from memoriesd.memory.packs import PackItem, TokenCounter, estimate_tokens, select

from .conftest import SHARED, Daemon, cli_json, create_vault, run_cli, running_daemon

MINILM = SHARED / "models" / "all-MiniLM-L6-v2-onnx"

NOTES = [
    ("Deploy runbook", "To deploy, run make release, then watch the dashboard for ten minutes."),
    ("Deploy calendar", "Deploys go out on Tuesdays and Thursdays, never on Fridays."),
    ("Garden", "The tomatoes by the south wall need water every evening in July."),
    ("Recipes", "Lentil soup: onions, carrots, red lentils, cumin, thirty minutes."),
]


@contextlib.contextmanager
def _daemon(model: bool) -> Iterator[tuple[Daemon, str]]:
    cfg = f'[embedding.local]\nmodel_dir = "{MINILM}"\nthreads = 2\n[index]\nbackground = false\n' if model else ""
    with running_daemon(cfg) as d:
        yield d, create_vault(d)


def _fill(d: Daemon, vid: str) -> dict[str, str]:
    ids = {}
    for text, cat, imp in [
        ("My name is Ada Lovelace.", "profile", "0.9"),
        ("The user is allergic to peanuts.", "profile", "0.7"),
        ("The user lives in Lyon.", "profile", "0.2"),
        ("The user prefers short answers with code.", "preference", "0.5"),
        ("We decided to deploy with blue-green releases.", "decision", "0.5"),
    ]:
        ids[text] = cli_json(d.home, "memory", "remember", vid, text, "--category", cat, "--importance", imp)["id"]
    for title, body in NOTES:
        ids[title] = d.call("memory.add", {"vault": vid, "title": title, "body": body})["id"]
    return ids


def _pack(d: Daemon, vid: str, query: str, budget: int) -> dict[str, Any]:
    return dict(cli_json(d.home, "rag", "context", vid, query, "--budget", str(budget)))


def test_the_pack_starts_with_the_profile_labels_whole_items_and_counts_with_the_model() -> None:
    with _daemon(model=True) as (d, vid):
        ids = _fill(d, vid)
        pack = _pack(d, vid, "how do we deploy a release?", 800)
        assert pack["budget"] == 800 and pack["tokenizer"] == "model" and 0 < pack["used_tokens"] <= 800
        items = pack["items"]
        assert [i["label"] for i in items] == [f"S{n}" for n in range(1, len(items) + 1)]
        profile = [i for i in items if i["block"] == "profile"]
        assert items[: len(profile)] == profile  # the profile block comes first
        assert [i["category"] for i in profile] == ["profile", "profile", "profile", "preference"]
        assert profile[0]["record_id"] == ids["My name is Ada Lovelace."]  # the most important first
        relevant = [i for i in items if i["block"] == "relevant"]
        assert {ids["Deploy runbook"], ids["Deploy calendar"]} <= {i["record_id"] for i in relevant}
        decision = next(i for i in relevant if i["kind"] == "fact")
        assert decision["category"] == "decision" and decision["score"] is not None
        text = pack["text"]
        assert text.startswith("## About the user\n[S1] (profile) My name is Ada Lovelace.\n")
        for i in items:  # whole items only, each under its label
            assert f"[{i['label']}] " in text and i["text"] in text
        assert sum(i["tokens"] for i in items) <= pack["used_tokens"]
        # The model's own tokenizer never counts more for the whole pack than was reported.
        counter = TokenCounter(LocalEmbedder(MINILM, threads=1))
        assert counter(text) <= pack["used_tokens"]
        # Every fact in a pack is a recall.
        facts = {f["id"]: f for f in d.call("memory.facts", {"vault": vid})["facts"]}
        assert facts[ids["My name is Ada Lovelace."]]["recalls"] == 1
        # Plain text on stdout, ready to paste; the count on stderr.
        human = run_cli(d.home, "rag", "context", vid, "how do we deploy a release?", "--budget", "800")
        assert human.returncode == 0 and human.stdout == text and "of 800 tokens" in human.stderr


def test_a_smaller_budget_drops_the_least_relevant_first_then_shortens_the_profile() -> None:
    with _daemon(model=False) as (d, vid):
        _fill(d, vid)
        for i in range(6):
            d.call("memory.add", {"vault": vid, "title": f"Deploy note {i}", "body": "deploy " * (i + 1) + "checklist item"})
        query = "deploy release"
        full = _pack(d, vid, query, 100_000)
        assert full["tokenizer"] == "estimate" and full["left_out"] == 0
        order_p = [i["record_id"] for i in full["items"] if i["block"] == "profile"]
        order_r = [i["record_id"] for i in full["items"] if i["block"] == "relevant"]
        assert len(order_r) >= 5
        need = full["used_tokens"]
        tokens = {i["record_id"]: i["tokens"] for i in full["items"]}
        for budget in range(32, need + 1, 7):  # through the protocol: the CLI is the same call
            pack = d.call("rag.context", {"vault": vid, "query": query, "budget": budget})
            assert pack["used_tokens"] <= budget
            got_p = [i["record_id"] for i in pack["items"] if i["block"] == "profile"]
            got_r = [i["record_id"] for i in pack["items"] if i["block"] == "relevant"]
            assert got_p == [r for r in order_p if r in got_p] and got_r == [r for r in order_r if r in got_r]
            profile_tokens = sum(i["tokens"] for i in pack["items"] if i["block"] == "profile")
            if got_p != order_p:  # the profile is shortened only over its share, with memories waiting
                missing = next(r for r in order_p if r not in got_p)
                heading = 6  # "## About the user" and its line break, estimated
                assert got_r and profile_tokens + heading + tokens[missing] > 0.3 * budget
        # Just under the full size: the whole profile stays, only memories go.
        pack = _pack(d, vid, query, need - 5)
        assert [i["record_id"] for i in pack["items"] if i["block"] == "profile"] == order_p
        assert pack["left_out"] >= 1


def test_estimates_and_the_priority_rule_on_their_own() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("hello world") == 3  # 11 characters / 4, rounded up
    assert estimate_tokens("你好") == 2 and estimate_tokens("ab你好cd") == 4

    def count(text: str) -> int:
        return len(text.split())

    def item(n: int, words: int, block: str) -> PackItem:
        it = PackItem(f"r{n}", 1, "memory", None, "", " ".join(["w"] * words), None, None, block)
        it.cost = count(it.body()) + 1
        return it

    profile = [item(1, 9, "profile"), item(2, 9, "profile"), item(3, 9, "profile")]  # 11 tokens each with its label
    relevant = [item(4, 9, "relevant"), item(5, 60, "relevant"), item(6, 9, "relevant")]  # 11, 62, 11
    # Room for everything: everything, in order.
    p, r, used = select(profile, relevant, 200, 0.3, count)
    assert (p, r) == (profile, relevant) and used <= 200
    # The profile within its share: only memories go, the least relevant first...
    p, r, used = select(profile, relevant, 126, 0.4, count)
    assert p == profile and r == relevant[:2] and used <= 126
    # ...and one that does not fit whole is left out while a smaller, less relevant one still fits.
    p, r, used = select(profile, relevant, 100, 0.4, count)
    assert p == profile and r == [relevant[0], relevant[2]] and used <= 100
    # The profile over its share while memories wait: shortened from its end (what is left over at
    # the end takes profile items back).
    p, r, used = select(profile, relevant, 60, 0.3, count)
    assert p == profile[:2] and r == [relevant[0], relevant[2]] and used <= 60
    p, r, used = select(profile, relevant, 45, 0.3, count)
    assert p == profile[:1] and r == [relevant[0], relevant[2]] and used <= 45
    # No memories: the profile may use the whole budget.
    p, r, used = select(profile, [], 40, 0.3, count)
    assert p == profile and used <= 40
