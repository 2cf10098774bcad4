"""`rag context` with query rewriting, through the real daemon and a real chat server on 127.0.0.1.

The vault is built so that the question's own words find neither piece of its answer: only the two
queries the (scripted) model writes do. So a pack holding both pieces is the rewrite at work, and
a pack without them is the question searched alone.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from memoriesd.memory.rewrite import SYSTEM

from .conftest import Daemon, cli_json, create_vault, run_cli, short_tmpdir, write_config
from .servers import ConnectProxy, Mirror, Scripted

KEY = "sk-rewrite-5b2e9c41d7a0-TOPSECRET"
CHAT = "/v1/chat/completions"
QUESTION = "What happened after the hearing, and when?"
QUERIES = ["pottery class enrolment", "kiln workshop date"]
ENROLMENT = "Pottery class enrolment confirmed for Mel."
WORKSHOP = "Kiln workshop scheduled: Saturday 14 June, nine sharp."
DISTRACTORS = [
    "The hearing ran late; after it the lawyers argued about what happened.",
    "After the hearing we walked to the station; nothing else happened.",
    "When the hearing ended, everyone asked what happened next.",
    "The hearing transcript says what happened, and when.",
]
BUDGET = 120  # room for about five items


def chat(content: str) -> Scripted:
    return Scripted.json(
        200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
    )


def rewritten(*queries: str) -> Scripted:
    return chat(json.dumps({"queries": list(queries)}))


def _daemon(url: str, extra: str = "", retries: int = 2, http: str = "") -> Daemon:
    home = short_tmpdir() / "h"
    write_config(
        home,
        f'[generation]\nprotocol = "compatible"\nurl = "{url}"\nmodel = "test-model"\napi_key_env = "MEM_TEST_KEY"\n'
        f"[http]\nretries = {retries}\nbackoff_ms = 10\ntimeout_seconds = 30\n{http}" + extra,
    )
    return Daemon(home, env={"MEM_TEST_KEY": KEY}).start()


@pytest.fixture
def server() -> Iterator[Mirror]:
    with Mirror() as m:
        yield m


@pytest.fixture
def gdaemon(server: Mirror) -> Iterator[Daemon]:
    """Generation configured, [context] rewrite left at its default ("off")."""
    d = _daemon(server.url + CHAT)
    yield d
    d.stop()
    shutil.rmtree(d.home.parent, ignore_errors=True)


@pytest.fixture
def auto(server: Mirror) -> Iterator[Daemon]:
    """[context] rewrite = "auto", with a short wait for the rewrite."""
    d = _daemon(server.url + CHAT, '[context]\nrewrite = "auto"\nrewrite_timeout_seconds = 3\n')
    yield d
    d.stop()
    shutil.rmtree(d.home.parent, ignore_errors=True)


def seed(d: Daemon, **vault: Any) -> tuple[str, str, str]:
    vid = create_vault(d)
    if vault:
        d.call("vault.policy", {"vault": vid, **vault})
    enrolment = d.call("memory.add", {"vault": vid, "title": "Studio", "body": ENROLMENT})["id"]
    workshop = d.call("memory.add", {"vault": vid, "title": "Calendar", "body": WORKSHOP})["id"]
    for i, body in enumerate(DISTRACTORS):
        d.call("memory.add", {"vault": vid, "title": f"Hearing {i}", "body": body})
    return vid, enrolment, workshop


def pack(d: Daemon, vid: str, **kw: Any) -> dict[str, Any]:
    return dict(d.call("rag.context", {"vault": vid, "query": QUESTION, "budget": BUDGET, **kw}))


def ids(out: dict[str, Any]) -> set[str]:
    return {i["record_id"] for i in out["items"]}


def test_rewritten_queries_bring_both_pieces_of_the_answer_into_the_pack(
    gdaemon: Daemon, server: Mirror
) -> None:
    vid, enrolment, workshop = seed(gdaemon)
    plain = pack(gdaemon, vid)  # the default: rewriting off, nothing sent
    assert server.seen() == [] and "queries" not in plain
    assert not ids(plain) & {enrolment, workshop} and plain["items"]
    server.add(CHAT, rewritten(*QUERIES))
    out = pack(gdaemon, vid, rewrite=True)
    assert out["queries"] == [QUESTION, *QUERIES]
    assert {enrolment, workshop} <= ids(out), out["text"]
    assert out["used_tokens"] <= BUDGET and out["notices"] == []
    # Asked not to, the pack is the question's own, unchanged, and nothing is sent.
    assert pack(gdaemon, vid, rewrite=False) == plain
    assert len(server.seen(CHAT)) == 1


def test_the_request_carries_the_question_and_no_vault_text(gdaemon: Daemon, server: Mirror) -> None:
    vid, _, _ = seed(gdaemon)
    server.add(CHAT, rewritten(*QUERIES))
    pack(gdaemon, vid, rewrite=True)
    (seen,) = server.seen(CHAT)
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    body = json.loads(seen.body)
    assert body["model"] == "test-model" and [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][1]["content"] == f"<question>{QUESTION}</question>"
    assert body["messages"][0]["content"] == SYSTEM  # a fixed instruction: nothing of the vault
    sent = seen.body.decode().casefold()
    for word in (
        "pottery",
        "enrolment",
        "kiln",
        "saturday",
        "lawyers",
        "station",
        "transcript",
        "studio",
        "calendar",
    ):
        assert word not in sent, word
    log = gdaemon.log_text()
    assert QUESTION not in log and not any(q in log for q in QUERIES) and KEY not in log


def test_auto_rewrites_every_pack_and_the_cli_flags_choose(auto: Daemon, server: Mirror) -> None:
    vid, enrolment, workshop = seed(auto)
    server.add(CHAT, rewritten(*QUERIES), rewritten(*QUERIES))
    out = pack(auto, vid)
    assert out["queries"] == [QUESTION, *QUERIES] and {enrolment, workshop} <= ids(out)
    got = cli_json(auto.home, "rag", "context", vid, QUESTION, "--budget", str(BUDGET))
    assert got["queries"] == out["queries"] and got["items"] == out["items"]
    off = cli_json(auto.home, "rag", "context", vid, QUESTION, "--budget", str(BUDGET), "--no-rewrite")
    assert "queries" not in off and not ids(off) & {enrolment, workshop}
    assert len(server.seen(CHAT)) == 2
    server.add(CHAT, rewritten(*QUERIES))
    r = run_cli(auto.home, "rag", "context", vid, QUESTION, "--budget", str(BUDGET))
    assert r.returncode == 0 and ENROLMENT in r.stdout and "3 queries searched" in r.stderr, r.stderr


def test_repeated_and_duplicate_queries_are_searched_once(auto: Daemon, server: Mirror) -> None:
    vid, enrolment, _ = seed(auto)
    server.add(CHAT, rewritten(QUESTION.upper(), QUERIES[0], f"  {QUERIES[0]} "))
    out = pack(auto, vid)
    assert out["queries"] == [QUESTION, QUERIES[0]] and enrolment in ids(out), out["notices"]


@pytest.mark.parametrize(
    "reply,code,requests",
    [
        (chat("Sure! Search for pottery and the kiln."), "invalid_model_output", 1),
        (chat(json.dumps({"queries": []})), "invalid_model_output", 1),
        (chat(json.dumps({"queries": ["a", "b", "c", "d", "e"]})), "invalid_model_output", 1),
        (chat(json.dumps({"queries": ["pottery"], "answer": "June"})), "invalid_model_output", 1),
        (chat(json.dumps({"queries": [7]})), "invalid_model_output", 1),
        (Scripted.json(500, {"error": "boom"}), "", 3),  # retried by the HTTP client, then given up
    ],
    ids=["prose", "empty", "five", "extra-key", "not-a-string", "500"],
)
def test_a_failed_rewrite_falls_back_to_the_question_with_one_notice(
    auto: Daemon, server: Mirror, reply: Scripted, code: str, requests: int
) -> None:
    vid, _, _ = seed(auto)
    plain = pack(auto, vid, rewrite=False)
    server.add(CHAT, *[reply] * requests)
    out = pack(auto, vid)
    assert out["queries"] == [QUESTION]
    assert out["items"] == plain["items"] and out["text"] == plain["text"]
    (notice,) = out["notices"]
    assert "searched as given" in notice and "at 127.0.0.1 " in notice and code in notice, notice
    assert "\n" not in notice and QUESTION not in notice
    assert len(server.seen(CHAT)) == requests
    assert QUESTION not in auto.log_text()


def test_a_slow_service_is_given_up_after_the_rewrite_timeout(auto: Daemon, server: Mirror) -> None:
    vid, _, _ = seed(auto)
    held = threading.Event()
    server.add(
        CHAT,
        Scripted.json(
            200, {"choices": [{"message": {"content": json.dumps({"queries": QUERIES})}}]}, hold=held
        ),
    )
    try:
        t0 = time.monotonic()
        out = pack(auto, vid)
        waited = time.monotonic() - t0
    finally:
        held.set()
    assert out["queries"] == [QUESTION] and out["items"]
    assert any("(timeout)" in n for n in out["notices"]), out["notices"]
    assert 3 <= waited < 15, waited  # rewrite_timeout_seconds = 3, not [http] timeout_seconds = 30


def test_a_device_only_vault_sends_nothing_to_a_remote_service() -> None:
    with ConnectProxy() as proxy:  # every connection to a remote host would go through it
        d = _daemon(
            "https://generation.example.invalid/v1/chat/completions",
            '[context]\nrewrite = "auto"\n',
            retries=0,
            http=f'proxy_url = "{proxy.url}"\n',
        )
        try:
            vid, _, _ = seed(d, device_only=True)
            out = pack(d, vid)
            assert "queries" not in out and out["items"]
            (notice,) = out["notices"]
            assert notice.startswith("device_only:") and "generation.example.invalid" in notice
            assert proxy.lines == []  # no connection attempt, no name lookup
            out = pack(d, vid, rewrite=True)  # asking for it changes nothing
            assert "queries" not in out and proxy.lines == []
        finally:
            d.stop()
            shutil.rmtree(d.home.parent, ignore_errors=True)


def test_a_grant_needs_the_ask_scope_for_its_query_to_be_rewritten(auto: Daemon, server: Mirror) -> None:
    vid, enrolment, workshop = seed(auto)

    def grant_pack(scopes: list[str]) -> dict[str, Any]:
        token = auto.call("grant.create", {"vault": vid, "scopes": scopes})["token"]
        s = auto.connect(token=token)
        try:
            assert "result" in auto.request("session.grant", {"token": token}, sock=s)
            msg = auto.request("rag.context", {"query": QUESTION, "budget": BUDGET}, sock=s)
        finally:
            s.close()
        assert "result" in msg, msg
        return dict(msg["result"])

    out = grant_pack(["context"])
    assert "queries" not in out and server.seen() == []
    assert any("lacks the ask scope" in n for n in out["notices"])
    server.add(CHAT, rewritten(*QUERIES))
    out = grant_pack(["context", "ask"])
    assert out["queries"] == [QUESTION, *QUERIES] and {enrolment, workshop} <= ids(out)


def _wait(what: str, cond: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_lock_while_the_rewrite_is_pending_cancels_the_pack(gdaemon: Daemon, server: Mirror) -> None:
    vid, _, _ = seed(gdaemon)
    held = threading.Event()  # the reply comes only after the lock
    server.add(
        CHAT,
        Scripted.json(
            200, {"choices": [{"message": {"content": json.dumps({"queries": QUERIES})}}]}, hold=held
        ),
    )
    result: dict[str, Any] = {}
    params = {"vault": vid, "query": QUESTION, "budget": BUDGET, "rewrite": True}
    t = threading.Thread(target=lambda: result.update(msg=gdaemon.request("rag.context", params)))
    t.start()
    try:
        _wait("the rewrite request", lambda: server.seen(CHAT))
        gdaemon.call("vault.lock", {"vault": vid})  # does not wait for the held reply
        t.join(60)
        assert not t.is_alive(), "the pack waited for the held reply"
    finally:
        held.set()
        t.join(60)
    assert result["msg"]["error"]["code"] in ("cancelled", "vault_locked"), (
        result
    )  # never a pack of a locked vault


FILLER = [
    "Ana: The tomatoes finally turned red this week, after a month of waiting in the greenhouse.",
    "Mel: Mine are still green; the basil is taking over the whole balcony planter again.",
    "Ana: Try pinching the basil tops, it grows bushier and leaves room for the peppers.",
    "Mel: Good tip. The neighbour's cat keeps digging in the planter too, which is annoying.",
    "Ana: A few citrus peels on the soil usually keep cats away from the pots for a while.",
]


def test_a_conversation_found_by_a_rewritten_query_comes_as_the_turns_that_match_it(
    gdaemon: Daemon, server: Mirror
) -> None:
    vid = create_vault(gdaemon)
    for i, body in enumerate(DISTRACTORS):
        gdaemon.call("memory.add", {"vault": vid, "title": f"Hearing {i}", "body": body})
    turns = [*FILLER, "Mel: " + WORKSHOP, *FILLER]
    gdaemon.call(
        "memory.capture", {"vault": vid, "text": "\n".join(turns), "extract": False, "title": "Garden chat"}
    )
    plain = pack(gdaemon, vid)
    assert WORKSHOP not in plain["text"]
    server.add(CHAT, rewritten(QUERIES[1]))
    out = pack(gdaemon, vid, rewrite=True)
    (conv,) = [i for i in out["items"] if i["kind"] == "conversation"]
    # The whole fragment does not fit: the excerpt is the turns around the one the query matched.
    assert WORKSHOP in conv["text"] and len(conv["conversation"]["turns"]) < len(turns), conv


def test_gemini_protocol_rewrites_with_a_json_reply(server: Mirror) -> None:
    path = "/v1beta/models/gemini-2.5-flash:generateContent"
    home = short_tmpdir() / "h"
    write_config(
        home,
        f'[generation]\nprotocol = "gemini"\nurl = "{server.url}{path}"\napi_key_env = "MEM_TEST_KEY"\n'
        '[http]\nretries = 0\n[context]\nrewrite = "auto"\n',
    )
    d = Daemon(home, env={"MEM_TEST_KEY": KEY}).start()
    try:
        vid, enrolment, workshop = seed(d)
        text = "```json\n" + json.dumps({"queries": QUERIES}) + "\n```"
        server.add(
            path,
            Scripted.json(200, {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]}}]}),
        )
        out = pack(d, vid)
        assert out["queries"] == [QUESTION, *QUERIES] and {enrolment, workshop} <= ids(out)
        (seen,) = server.seen(path)
        body = json.loads(seen.body)
        assert (
            seen.headers["x-goog-api-key"] == KEY
            and body["generationConfig"]["responseMimeType"] == "application/json"
        )
        assert body["contents"][0]["parts"][0]["text"] == f"<question>{QUESTION}</question>"
    finally:
        d.stop()
        shutil.rmtree(home.parent, ignore_errors=True)
