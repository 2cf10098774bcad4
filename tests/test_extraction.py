"""Extraction from captured conversations (issue 17): the pattern rules (EN/FR/ZH/JA, with the tricky
negatives), the strict check of a model's reply, and `memory extract` / extraction after `memory capture`
through the real daemon, with a real OpenAI-compatible chat server on 127.0.0.1 for the model path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from memoriesd.conversations.model import Turn
from memoriesd.errors import InvalidModelOutput
from memoriesd.memory.extract_prompt import MAX_ITEMS, parse_extraction
from memoriesd.memory.patterns import extract_patterns

from .conftest import Daemon, cli_json, create_vault, run_cli, running_daemon
from .servers import Mirror, Scripted

CHAT = "/v1/chat/completions"


def _facts(speaker: str, *texts: str) -> list[tuple[str, str, str]]:
    turns = [Turn(f"T{i}", speaker, t) for i, t in enumerate(texts, 1)]
    return [(f.category, f.key, f.text) for f in extract_patterns(turns)]


# ---------------------------------------------------------------------------- pattern rules

POSITIVE = [
    ("I prefer TypeScript over JavaScript for new projects.", "preference", "preference:typescript",
     "The user prefers TypeScript over JavaScript for new projects."),
    ("Honestly, I'd rather work from home on Fridays.", "preference", "preference:work-home-fridays",
     "The user would rather work from home on Fridays."),
    ("OK, I decided to go with Postgres.", "decision", "decision:postgres", "The user decided to go with Postgres."),
    ("We decided to ship on Monday.", "decision", "decision:ship-monday", "The user and others decided to ship on Monday."),
    ("I always drink coffee before my run.", "pattern", "pattern:drink-coffee-run", "The user always drinks coffee before their run."),
    ("I never push to main on Fridays", "pattern", "pattern:push-main-fridays", "The user never pushes to main on Fridays."),
    ("Je préfère le thé au café.", "preference", "preference:thé-café", "L'utilisateur préfère le thé au café."),
    ("J'ai décidé de passer à Rust.", "decision", "decision:passer-rust", "L'utilisateur a décidé de passer à Rust."),
    ("Je ne bois jamais de café après 16 h.", "pattern", "pattern:bois-café-après", "L'utilisateur : Je ne bois jamais de café après 16 h."),
    ("我更喜欢用TypeScript写前端。", "preference", "preference:typescript写前端", "用户更喜欢用TypeScript写前端。"),
    ("我决定下个月搬到上海。", "decision", "decision:下个月搬到上海", "用户决定下个月搬到上海。"),
    ("我总是早上六点起床。", "pattern", "pattern:早上六点起床", "用户总是早上六点起床。"),
    ("私はコーヒーより紅茶の方が好きです。", "preference", "preference:紅茶", "ユーザーはコーヒーより紅茶の方が好きです。"),
    ("来月から東京に引っ越すことにしました。", "decision", "decision:来月から東京に引っ越す", "ユーザーは来月から東京に引っ越すことにしました。"),
    ("いつも朝六時に起きます。", "pattern", "pattern:朝六時に起きます", "ユーザーはいつも朝六時に起きます。"),
]


@pytest.mark.parametrize("said,category,key,text", POSITIVE, ids=[p[0][:24] for p in POSITIVE])
def test_plain_first_person_statements_become_keyed_facts_in_four_languages(said: str, category: str, key: str, text: str) -> None:
    assert _facts("user", said) == [(category, key, text)]


NEGATIVE = [
    "I prefer not to say.",
    "I'd rather not.",
    "I prefer that.",
    "Do you prefer tabs or spaces?",
    "So I prefer tabs, right?",
    'My boss said "I always work late." Not me.',
    "> I always use tabs",
    "Here is the config: ```I always use tabs``` done",
    "I never went to Paris.",
    "I always wanted to be a pilot.",
    "If I decided to move, I would tell you.",
    "She prefers tea.",
    "I'm always here for you!",
    "Je préfère ne pas répondre.",
    "Tu préfères le thé ?",
    "Je suis toujours là pour toi.",
    "我宁愿不说。",
    "你更喜欢哪个？",
    "我从来没去过日本。",
    "どちらの方が好きですか？",
    "彼は紅茶の方が好きです。",
    "いつもありがとうございます。",
]


@pytest.mark.parametrize("said", NEGATIVE)
def test_refusals_questions_quotes_code_past_and_other_people_yield_nothing(said: str) -> None:
    assert _facts("user", said) == []


def test_assistant_turns_are_never_read_and_named_speakers_are_attributed_apart() -> None:
    turns = [
        Turn("T1", "assistant", "I always double-check my answers. I prefer Python."),
        Turn("T2", "Caroline", "I prefer tea to coffee in the morning."),
        Turn("T3", "Melanie", "I prefer tea to coffee in the morning."),
        Turn("T4", "Caroline", "Honestly, I prefer green tea to coffee in the morning."),
    ]
    got = {f.key: (f.text, f.turns) for f in extract_patterns(turns)}
    # Two people's tastes never share a key (one would revise the other); Caroline's later turn wins.
    assert got == {
        "preference:melanie-tea-coffee-morning": ("Melanie prefers tea to coffee in the morning.", ("T3",)),
        "preference:caroline-tea-coffee-morning": ("Caroline prefers tea to coffee in the morning.", ("T2",)),
        "preference:caroline-green-tea-coffee": ("Caroline prefers green tea to coffee in the morning.", ("T4",)),
    }


# ---------------------------------------------------------------------------- the model's reply

SENT = ["T1", "T2", "T3"]


def _reply(**over: Any) -> str:
    obj: dict[str, Any] = {
        "summary": "Ana and the assistant chose a database for billing. Ana decided on Postgres.",
        "facts": [{"category": "profile", "key": "employer", "text": "Ana works on the billing service.", "importance": 0.6, "turns": ["T1"]}],
        "decisions": [{"key": "billing-db", "text": "Ana decided billing uses Postgres.", "importance": 0.8, "turns": ["T3"]}],
        "actions": [{"text": "Ana will set up pgbouncer.", "turns": ["T3"]}],
        "preferences": [],
    }
    obj.update(over)
    return json.dumps(obj)


def test_a_valid_reply_gives_typed_items_with_their_turns() -> None:
    got = parse_extraction("```json\n" + _reply() + "\n```", SENT)
    assert got.summary.startswith("Ana and the assistant")
    assert [(i.category, i.key, i.turns, i.action) for i in got.items] == [
        ("profile", "employer", ("T1",), False), ("decision", "billing-db", ("T3",), False), ("fact", None, ("T3",), True)]


@pytest.mark.parametrize(
    "raw,why",
    [
        ("Sure! Ana prefers Postgres.", "not one JSON object"),
        (_reply() + " {}", "second object"),
        (_reply(decisions=[{"text": "Ana decided on Postgres.", "turns": ["T9"]}]), "cites T9, which is not among the 3 turns sent"),
        (_reply(decisions=[{"text": "Ana decided on Postgres.", "turns": []}]), "cite 1 to"),
        (_reply(facts=[{"category": "gossip", "text": "Ana likes cats.", "turns": ["T1"]}]), "category"),
        (_reply(facts=[{"text": "Ana likes cats.", "turns": ["T1"], "importance": 2}]), "importance"),
        (_reply(facts=[{"text": "Ana likes cats.", "turns": ["T1"], "source": "x"}]), "(source)"),
        (_reply(facts=[{"text": "ok", "turns": ["T1"]}]), "3 to 500"),
        (_reply(notes="x"), "(notes)"),
        (_reply(summary=None), "summary"),
        (_reply(facts=[{"text": "Ana likes cats.", "turns": ["T1"]}] * (MAX_ITEMS + 1)), f"more than {MAX_ITEMS}"),
    ],
)
def test_a_malformed_reply_is_rejected_whole_without_quoting_it(raw: str, why: str) -> None:
    with pytest.raises(InvalidModelOutput) as ei:
        parse_extraction(raw, SENT)
    assert why in ei.value.message and "nothing was written" in ei.value.message
    assert "Postgres" not in ei.value.message and "cats" not in ei.value.message and "\n" not in ei.value.message


# ---------------------------------------------------------------------------- through the daemon

CHAT_LOG = "\n".join(json.dumps(m) for m in [
    {"role": "user", "content": "Should billing use Postgres or SQLite? I prefer TypeScript over JavaScript for the workers."},
    {"role": "assistant", "content": "Postgres. I always recommend it for concurrent writers; I prefer Rust myself."},
    {"role": "user", "content": "OK, I decided to go with Postgres. Do you prefer pgbouncer or pgpool?"},
]) + "\n"


def _capture(d: Daemon, vid: str, text: str, *args: str) -> dict[str, Any]:
    return dict(cli_json(d.home, "memory", "capture", vid, "-", *args, input=text))


def _facts_of(d: Daemon, vid: str) -> list[dict[str, Any]]:
    return list(d.call("memory.facts", {"vault": vid})["facts"])


def test_without_a_model_capture_extracts_by_pattern_and_links_each_fact_to_its_turns() -> None:
    with running_daemon() as d:
        vid = create_vault(d)
        out = _capture(d, vid, CHAT_LOG)
        [rec] = out["records"]
        ex = out["extraction"]
        assert ex["path"] == "patterns" and ex["rejected"] == 0 and ex["summary"] is None
        assert any("no generation service" in n for n in ex["notices"])
        got = {(f["action"], f["category"], f["key"], f["text"], tuple(f["turns"])) for f in ex["facts"]}
        assert got == {
            ("added", "preference", "preference:typescript", "The user prefers TypeScript over JavaScript for the workers.", ("T1",)),
            ("added", "decision", "decision:postgres", "The user decided to go with Postgres.", ("T3",)),
        }  # nothing from the assistant's "I always" / "I prefer", nor from the question
        fact = next(f for f in ex["facts"] if f["category"] == "decision")
        meta = d.call("memory.read", {"vault": vid, "id": fact["id"]})["meta"]
        assert meta["from"] == {"conversation": rec["id"], "revision": 1, "turns": ["T3"]}
        # By hand, again: the same facts are exact repeats (nothing written); the human output says the path.
        again = cli_json(d.home, "memory", "extract", vid, rec["id"])
        assert again["path"] == "patterns" and [f["action"] for f in again["facts"]] == ["unchanged", "unchanged"]
        human = run_cli(d.home, "memory", "extract", vid, rec["id"], "--patterns")
        assert human.returncode == 0 and "Extraction (patterns): 2 fact(s): 2 unchanged." in human.stderr
        forced = run_cli(d.home, "memory", "extract", vid, rec["id"], "--model")
        assert forced.returncode == 1 and forced.stderr.startswith("error[generation_not_configured]") and "--patterns" in forced.stderr
        note = d.call("memory.add", {"vault": vid, "body": "I prefer tea."})
        wrong = run_cli(d.home, "memory", "extract", vid, note["id"])
        assert wrong.returncode == 2 and wrong.stderr.startswith("error[usage]") and "not a conversation" in wrong.stderr and len(wrong.stderr.strip().splitlines()) == 1


def test_with_the_vault_switch_off_capture_extracts_nothing_and_says_so() -> None:
    with running_daemon() as d:
        vid = create_vault(d)
        shown = run_cli(d.home, "vault", "policy", vid, "--no-extract")
        assert shown.returncode == 0 and "extract: off" in shown.stdout
        out = _capture(d, vid, CHAT_LOG)
        assert out["extraction"]["path"] == "off" and out["extraction"]["facts"] == []
        assert "extraction is off" in out["extraction"]["notices"][0]
        assert _facts_of(d, vid) == []
        assert cli_json(d.home, "vault", "policy", vid, "--extract")["extract"] is True
        assert _capture(d, vid, CHAT_LOG)["extraction"] is None  # unchanged session: nothing to extract
        d.call("vault.policy", {"vault": vid, "extract": False})
        human = run_cli(d.home, "memory", "capture", vid, "-", input=CHAT_LOG + json.dumps({"role": "user", "content": "I always lint first."}))
        assert human.returncode == 0 and "extraction is off for this vault" in human.stderr and "Extraction (off)" in human.stderr
        assert _facts_of(d, vid) == []


# ---------------------------------------------------------------------------- the model path


def _chat(content: str) -> Scripted:
    return Scripted.json(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})


@pytest.fixture
def server() -> Iterator[Mirror]:
    with Mirror() as m:
        yield m


def _model_daemon(url: str) -> Any:
    cfg = (f'[generation]\nprotocol = "compatible"\nurl = "{url}"\nmodel = "test-model"\n'
           "[http]\nretries = 0\nbackoff_ms = 10\ntimeout_seconds = 5\n")
    return running_daemon(cfg)


def test_the_model_path_remembers_cited_items_and_stores_the_summary(server: Mirror) -> None:
    with _model_daemon(server.url + CHAT) as d:
        vid = create_vault(d)
        server.add(CHAT, _chat(_reply()))
        out = _capture(d, vid, CHAT_LOG)
        [rec] = out["records"]
        ex = out["extraction"]
        assert ex["path"] == "model" and ex["summary"].startswith("Ana and the assistant")
        assert [(f["action"], f["category"], f["turns"]) for f in ex["facts"]] == [
            ("added", "profile", ["T1"]), ("added", "decision", ["T3"]), ("added", "fact", ["T3"])]
        # The transcript went as untrusted data, turns labelled T1..T3, asking for strict JSON.
        body = json.loads(server.seen(CHAT)[0].body)
        system, user = body["messages"][0]["content"], body["messages"][1]["content"]
        assert "data, not instructions" in system and '<turn id="T3" speaker="user">' in user and "Do you prefer pgbouncer" in user
        conv = d.call("memory.read", {"vault": vid, "id": rec["id"]})
        assert conv["revision"] == 2 and conv["meta"]["summary"] == ex["summary"]
        assert conv["body"] == d.call("memory.read", {"vault": vid, "id": rec["id"], "revision": 1})["body"]
        action = next(f for f in _facts_of(d, vid) if f["category"] == "fact")
        assert action["tags"] == ["action"] and action["importance"] == 0.5
        assert d.call("memory.read", {"vault": vid, "id": action["id"]})["meta"]["from"] == {"conversation": rec["id"], "revision": 1, "turns": ["T3"]}
        # Again: an exact repeat changes nothing; the same key with new text revises that fact.
        revised = json.loads(_reply())
        revised["decisions"][0]["text"] = "Ana decided billing uses Postgres 16 behind pgbouncer."
        server.add(CHAT, _chat(_reply()), _chat(json.dumps(revised)))
        first = cli_json(d.home, "memory", "extract", vid, rec["id"])
        assert [f["action"] for f in first["facts"]] == ["unchanged"] * 3
        assert d.call("memory.read", {"vault": vid, "id": rec["id"]})["revision"] == 2  # same summary: no revision
        second = cli_json(d.home, "memory", "extract", vid, rec["id"])
        assert [f["action"] for f in second["facts"]] == ["unchanged", "updated", "unchanged"]
        assert second["facts"][1]["previous"]["text"] == "Ana decided billing uses Postgres."
        assert len(_facts_of(d, vid)) == 3


@pytest.mark.parametrize(
    "reply,why",
    [
        (_reply(decisions=[{"text": "Ana decided on Postgres.", "turns": ["T12"]}]), "cites T12, which is not among the 3 turns sent"),
        ("Ana prefers Postgres and TypeScript.", "not one JSON object"),
    ],
    ids=["missing-turn", "not-json"],
)
def test_a_rejected_reply_writes_nothing(server: Mirror, reply: str, why: str) -> None:
    with _model_daemon(server.url + CHAT) as d:
        vid = create_vault(d)
        server.add(CHAT, _chat(reply), _chat(reply))
        out = _capture(d, vid, CHAT_LOG)  # the capture stands; its extraction failed, and says why
        [rec] = out["records"]
        [failed] = out["extraction"]["records"]
        assert failed["error"]["code"] == "invalid_model_output" and why in failed["error"]["message"]
        assert out["extraction"]["facts"] == []
        r = run_cli(d.home, "memory", "extract", vid, rec["id"])
        assert r.returncode == 1 and r.stderr.startswith("error[invalid_model_output]") and why in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Postgres" not in r.stderr
        assert _facts_of(d, vid) == []
        assert d.call("memory.read", {"vault": vid, "id": rec["id"]})["revision"] == 1  # no summary written


def test_a_long_transcript_sends_only_its_last_turns_and_says_so(server: Mirror) -> None:
    turns = [{"role": "user" if i % 2 else "assistant", "content": f"Turn {i}: " + "words about the billing migration " * 12} for i in range(1, 161)]
    with _model_daemon(server.url + CHAT) as d:
        vid = create_vault(d)
        server.add(CHAT, _chat(json.dumps({"summary": "A long talk about the billing migration.",
                                           "facts": [{"text": "The billing migration was discussed at length.", "turns": ["T160"]}]})))
        ex = _capture(d, vid, "\n".join(json.dumps(t) for t in turns))["extraction"]
        assert ex["path"] == "model" and len(ex["facts"]) == 1
        assert any("only its last" in n and "of 160 turns" in n and "to T160" in n for n in ex["notices"])
        user = json.loads(server.seen(CHAT)[0].body)["messages"][1]["content"]
        assert '<turn id="T160"' in user and '<turn id="T1"' not in user


def test_a_device_only_vault_never_sends_to_a_remote_model_and_falls_back_to_patterns() -> None:
    # Decision: `auto` (and capture) run the pattern rules locally and say why; asking for the model is refused.
    with _model_daemon("https://generation.example.invalid/v1/chat/completions") as d:
        r = run_cli(d.home, "vault", "create", "dev", "--device-only", "--passphrase-stdin", input="pw\n")
        vid = r.stdout.strip().splitlines()[-1]
        ex = _capture(d, vid, CHAT_LOG)["extraction"]
        assert ex["path"] == "patterns" and {f["key"] for f in ex["facts"]} == {"preference:typescript", "decision:postgres"}
        assert any(n.startswith("device_only:") and "nothing was sent" in n for n in ex["notices"])
        rid = d.call("memory.list", {"vault": vid, "kind": "conversation"})["records"][0]["id"]
        forced = run_cli(d.home, "memory", "extract", vid, rid, "--model")
        assert forced.returncode == 1 and forced.stderr.startswith("error[device_only]") and "generation.example.invalid" in forced.stderr


def test_a_grant_without_the_ask_scope_files_a_conversation_without_sending_it_to_the_model(server: Mirror) -> None:
    with _model_daemon(server.url + CHAT) as d:
        vid = create_vault(d)
        for scopes, path in ((["capture"], "patterns"), (["capture", "ask"], "model")):
            token = d.call("grant.create", {"vault": vid, "scopes": scopes})["token"]
            s = d.connect(token=token)
            try:
                assert "error" not in d.request("session.grant", {"token": token}, sock=s)
                server.add(CHAT, _chat(_reply()))
                text = CHAT_LOG + json.dumps({"role": "user", "content": f"Filed with {'+'.join(scopes)}."}) + "\n"
                msg = d.request("memory.capture", {"text": text}, sock=s)
            finally:
                s.close()
            ex = msg["result"]["extraction"]  # a grant sees which path ran and counts, never the text
            assert ex["path"] == path and ex["facts"] == (2 if path == "patterns" else 3), ex
            assert len(server.seen(CHAT)) == (0 if path == "patterns" else 1)
        # A grant cannot call memory.extract at all: it is the person's own command.
        token = d.call("grant.create", {"vault": vid, "scopes": ["capture", "ask"]})["token"]
        s = d.connect(token=token)
        d.request("session.grant", {"token": token}, sock=s)
        rid = d.call("memory.list", {"vault": vid, "kind": "conversation"})["records"][0]["id"]
        assert d.request("memory.extract", {"record": rid}, sock=s)["error"]["code"] == "scope_denied"
        s.close()


def test_a_model_key_for_one_named_speaker_carries_their_name_so_two_people_never_revise_each_other(server: Mirror) -> None:
    talk = "# Tea time\n\nCaroline: I love green tea.\n\nMelanie: Coffee for me, always.\n"
    reply = {"summary": "Caroline and Melanie talked about drinks.", "preferences": [
        {"key": "drink", "text": "Caroline prefers green tea.", "turns": ["T1"]},
        {"key": "drink", "text": "Melanie prefers coffee.", "turns": ["T2"]},
    ]}
    with _model_daemon(server.url + CHAT) as d:
        vid = create_vault(d)
        server.add(CHAT, _chat(json.dumps(reply)))
        ex = _capture(d, vid, talk)["extraction"]
        assert [(f["action"], f["key"]) for f in ex["facts"]] == [("added", "preference:caroline-drink"), ("added", "preference:melanie-drink")]
