"""Turn windows: a conversation fragment also gets a vector per two consecutive turns, and its
vector score is lifted by the window that matches best (memoriesd.index.vectors.windows).

The pure parts (which windows a fragment has, how scores combine over a real VectorIndex) are
tested directly; the rest through a real memoriesd with a real loopback embedding service
(tests/embed_server.py): what the model is asked to embed, what `rag status` counts, the lift
seen in `rag search --mode vector`, `[index] conversation_windows = false`, a restart that finds the
sealed window vectors, and a forgotten conversation whose windows leave with it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memoriesd.index.vectors.matrix import VectorIndex
from memoriesd.index.vectors.windows import (
    MAX_WINDOWS,
    combine,
    search_with_windows,
    window_id,
    window_parent,
)
from memoriesd.kinds.turns import split_conversation, turn_windows
from memoriesd.memory.excerpt import excerpts
from memoriesd.memory.packs import WHOLE_SHARE, PackItem, select
from memoriesd.text import segment
from memoriesd.vault.records import Record

from .conftest import Daemon, cli_json, create_vault, run_cli, short_tmpdir, write_config
from .embed_server import EmbeddingService

PASS = "correct horse"
# One fragment of five short turns (four windows); the third turn alone is about the pottery class.
CLASS_TALK = "\n".join(
    [
        "Mel: the weather was grey all week and the garden is soaked",
        "Caro: same here, the garden path flooded twice",
        "Mel: I signed up for a pottery class on Tuesday evenings",
        "Caro: the garden shop had a sale on rain boots",
        "Mel: the garden needs new boots and a new path",
    ]
)
# Two turns: one fragment without windows.
SHORT_TALK = "Caro: the pottery kiln is hot\nMel: careful with the kiln"


def _record(turns: list[tuple[str, str]]) -> Record:
    """A conversation record as capture writes one: ``speaker: text`` blocks and their byte ranges."""
    body = ""
    spans: list[list[Any]] = []
    for speaker, text in turns:
        if body:
            body += "\n\n"
        start = len(body.encode("utf-8"))
        body += f"{speaker}: {text}"
        spans.append([start, len(body.encode("utf-8")), speaker, None, None])
    return Record("r1", 1, "conversation", "talk", body, False, (), {"conversation": {"turns": spans}})


# ---------------------------------------------------------------------------- which windows


def test_each_fragment_of_three_or_more_turns_has_a_window_per_two_consecutive_turns() -> None:
    rec = _record([("A", f"turn {i} " + "word " * 60) for i in range(14)])  # ~330 bytes a turn: 3 a fragment
    frags = split_conversation(rec, bytes(32))
    wins = turn_windows(rec, frags)
    assert len(wins) == len(frags) > 1
    data = rec.body.encode("utf-8")
    spans = [(t[0], t[1]) for t in rec.meta["conversation"]["turns"]]
    for frag, ws in zip(frags, wins, strict=True):
        inside = [s for s in spans if frag.start <= s[0] and s[1] <= frag.end]
        assert len(ws) == (len(inside) - 1 if len(inside) >= 3 else 0)
        for j, w in enumerate(ws):
            assert (w.start, w.end) == (inside[j][0], inside[j + 1][1])  # two whole, consecutive turns
            assert w.text == data[w.start : w.end].decode("utf-8") and w.ordinal == frag.ordinal


def test_a_fragment_of_two_turns_or_of_one_long_turn_has_no_window() -> None:
    rec = _record([("A", "hello"), ("B", "hi")])
    assert turn_windows(rec, split_conversation(rec, bytes(32))) == ((),)
    long = _record([("A", "word " * 900)])  # one turn split into pieces
    frags = split_conversation(long, bytes(32))
    assert len(frags) > 1 and all(w == () for w in turn_windows(long, frags))


def test_a_record_whose_turns_do_not_fit_its_body_has_no_windows() -> None:
    rec = _record([("A", "one"), ("B", "two"), ("A", "three")])
    broken = Record(rec.id, 1, rec.kind, rec.title, rec.body + "!", False, (),
                    {"conversation": {"turns": [[0, 5, "Z", None, None]]}})
    assert turn_windows(broken, split_conversation(broken, bytes(32))) == ()


def test_window_keys_are_negative_and_name_their_fragment_and_index() -> None:
    for fid in (0, 1, 7, 123_456_789):
        for j in (0, 1, MAX_WINDOWS - 1):
            key = window_id(fid, j)
            assert key < 0 and window_parent(key) == (fid, j)
    assert len({window_id(f, j) for f in range(50) for j in range(MAX_WINDOWS)}) == 50 * MAX_WINDOWS
    with pytest.raises(ValueError):
        window_id(1, MAX_WINDOWS)
    with pytest.raises(ValueError):
        window_id(-1, 0)


# ---------------------------------------------------------------------------- scores


def _unit(*xs: float) -> np.ndarray:
    v = np.zeros(4, dtype=np.float32)
    v[: len(xs)] = xs
    return v / np.linalg.norm(v)


def _index() -> tuple[VectorIndex, np.ndarray]:
    """Fragment 1 is far from the query but one of its windows is close; fragment 2 is middling
    with no windows; fragment 3 is middling and its only window is farther than itself."""
    q = _unit(1, 0, 0, 0)
    idx = VectorIndex(4)
    idx.add([1, window_id(1, 0), window_id(1, 1)], [_unit(0.3, 1, 0, 0), _unit(1, 0.1, 0, 0), _unit(0, 0, 1, 0)])
    idx.add([2], [_unit(0.6, 0.8, 0, 0)])
    idx.add([3, window_id(3, 0)], [_unit(0.6, 0, 0.8, 0), _unit(0, 0, 0, 1)])
    return idx, q


def test_a_fragment_is_scored_by_its_own_cosine_lifted_halfway_to_its_best_window() -> None:
    idx, q = _index()
    own1, best1 = float(_unit(0.3, 1, 0, 0) @ q), float(_unit(1, 0.1, 0, 0) @ q)
    got = dict(search_with_windows(idx, q, 10))
    assert set(got) == {1, 2, 3}  # fragments only: never a window key
    assert got[1] == pytest.approx(own1 + (best1 - own1) / 2, abs=1e-6)
    assert got[2] == pytest.approx(0.6, abs=1e-6)
    assert got[3] == pytest.approx(0.6, abs=1e-6)  # a window farther than its fragment never lowers it
    best: dict[int, int] = {}
    ranked = search_with_windows(idx, q, 10, best_windows=best)
    assert [s for _, s in ranked] == sorted((s for _, s in ranked), reverse=True)
    assert best == {1: 0, 3: 0}  # each fragment's closest window (2 has none): what a pack excerpts
    assert ranked[0][0] == 1  # 0.29 alone, 0.64 with its close window: past the two at 0.6


def test_windowed_search_keeps_k_the_allowed_fragments_and_the_floor() -> None:
    idx, q = _index()
    everything = search_with_windows(idx, q, 10)
    assert search_with_windows(idx, q, 1) == everything[:1]
    assert {f for f, _ in search_with_windows(idx, q, 10, allowed={2, 3})} == {2, 3}  # 1's windows stay out too
    assert [f for f, _ in search_with_windows(idx, q, 10, min_score=0.62)] == [1]  # 0.64 only: on the lifted score
    assert len(search_with_windows(idx, q, 10, min_score=0.6)) == 3
    assert search_with_windows(idx, q, 0) == [] and search_with_windows(idx, q, 5, allowed=set()) == []


@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_a_plain_search_never_returns_a_window_key_and_the_index_counts_them(precision: str) -> None:
    idx, q = _index()
    narrow = VectorIndex(4, precision=precision)
    narrow.add_encoded(idx.keys(), "float32", idx.matrix.copy(), None)
    for index in (idx, narrow):
        assert index.negative_keys == 3
        assert {k for k, _ in index.search(q, 10, skip_negative=True)} == {1, 2, 3}
        assert {k for k, _ in index.search(q, 10, allowed={1, window_id(1, 0)}, skip_negative=True)} == {1}
        assert window_id(1, 0) in {k for k, _ in index.search(q, 10)}  # only when asked to skip them
        index.remove([window_id(1, 0), 2])
        assert index.negative_keys == 2 and len(index) == 4
        index.clear()
        assert index.negative_keys == 0


def test_combine_takes_either_score_alone_when_the_other_is_missing() -> None:
    assert combine(None, None) is None
    assert combine(0.4, None) == 0.4 and combine(None, 0.7) == 0.7
    assert combine(0.4, 0.8) == pytest.approx(0.6) and combine(0.6, 0.2) == 0.6


# ---------------------------------------------------------------------------- excerpts in packs


@pytest.fixture(scope="module")
def segmented(tmp_path_factory: pytest.TempPathFactory) -> None:
    segment.configure(tmp_path_factory.mktemp("jieba"))  # excerpts rank turns with the real BM25 index


def _turns_of(rec: Record, rng: tuple[int, int]) -> list[int]:
    return [i for i, t in enumerate(rec.meta["conversation"]["turns"]) if rng[0] <= t[0] and t[1] <= rng[1]]


def test_an_excerpt_chosen_by_a_window_narrows_from_four_turns_to_the_one_that_answers(segmented: None) -> None:
    rec = _record([("A", "hello there"), ("B", "hi, how was the week"), ("A", "what did you sign up for"),
                   ("B", "a pottery class on tuesdays"), ("A", "nice, the garden is wet"), ("B", "so is mine")])
    whole = (0, len(rec.body.encode("utf-8")))
    cut = excerpts("pottery class", [(rec, *whole)], [2])[0]  # window 2: turns 2 and 3
    assert cut is not None and cut.by_window
    assert [_turns_of(rec, f) for f in cut.forms] == [[1, 2, 3, 4], [2, 3, 4], [2, 3], [3]]
    # A query no turn matches lexically: the window alone says where; the single turn is the answer.
    cut = excerpts("ceramics lessons", [(rec, *whole)], [2])[0]
    assert cut is not None and [_turns_of(rec, f) for f in cut.forms][-2:] == [[2, 3], [3]]
    # No window (bm25 mode, windows off) or one that is not this fragment's: BM25 chooses, as before.
    for window in (None, 5, -1):
        cut = excerpts("pottery class", [(rec, *whole)], [window])[0]
        assert cut is not None and not cut.by_window
        assert [_turns_of(rec, f) for f in cut.forms] == [[2, 3, 4], [3]]
    assert excerpts("ceramics lessons", [(rec, *whole)], [None]) == [None]  # nothing says which turns


def _conv(n: int, cost: int, excerpt_cost: int, first: bool) -> PackItem:
    it = PackItem(f"c{n}", 1, "conversation", None, "", "x", None, None, "relevant", cost=cost)
    it.alt = PackItem(f"c{n}", 1, "conversation", None, "", "y", None, None, "relevant", cost=excerpt_cost)
    it.excerpt_first = first
    return it


def test_past_half_the_room_conversation_hits_come_as_their_window_excerpts_so_more_fit() -> None:
    assert WHOLE_SHARE == 0.5
    items = [_conv(n, 250, 80, True) for n in range(6)]
    _, chosen, used = select([], items, 1000, 0.3, lambda text: 1)
    # Whole while less than half the room is used (two), then the windows' excerpts.
    assert [c.text for c in chosen] == ["x", "x", "y", "y", "y", "y"] and used == 3 + 2 * 251 + 4 * 81
    # Excerpts BM25 chose (no window) stay a fallback: whole items while they fit (three), then what fits.
    items = [_conv(n, 250, 80, False) for n in range(6)]
    _, chosen, used = select([], items, 1000, 0.3, lambda text: 1)
    assert [c.text for c in chosen] == ["x", "x", "x", "y", "y", "y"] and used == 3 + 3 * 251 + 3 * 81


# ---------------------------------------------------------------------------- through the daemon


def _config(svc: EmbeddingService, windows: bool) -> str:
    # No evidence floor, so that the bag-of-words scores show on both sides of the switch.
    return svc.config() + f"\n[search]\nmin_cosine = -1\n[index]\nconversation_windows = {'true' if windows else 'false'}\n"


@dataclass
class Env:
    d: Daemon
    svc: EmbeddingService
    tmp: Path
    v: str
    talk: str
    short: str

    def cli(self, *args: str) -> Any:
        return cli_json(self.d.home, *args)

    def restart(self, windows: bool) -> None:
        self.d.stop()
        write_config(self.d.home, _config(self.svc, windows))
        self.d = Daemon(self.d.home).start()
        self.d.call("vault.unlock", {"vault": self.v, "passphrase": PASS})

    def pack_scores(self) -> dict[str, float]:
        """Vector scores as `rag context` ranks (with windows when on)."""
        out = self.cli("rag", "context", self.v, "pottery class", "--mode", "vector")
        return {i["record_id"]: float(i["score"]) for i in out["items"]}

    def search_scores(self) -> dict[str, float]:
        """Vector scores as `rag search` ranks (each fragment's own vector)."""
        out = self.cli("rag", "search", self.v, "pottery class", "--mode", "vector", "--limit", "10")
        return {r["record_id"]: float(r["score"]) for r in out["results"]}

    def embedding(self) -> dict[str, Any]:
        return dict(self.cli("rag", "status", self.v)["embedding"])


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    svc = EmbeddingService()
    tmp = short_tmpdir("cw")
    home = tmp / "h"
    write_config(home, _config(svc, True))
    d = Daemon(home).start()
    e = Env(d, svc, tmp, "", "", "")
    try:
        e.v = create_vault(d, "talks", PASS)
        cap = {"vault": e.v, "format": "markdown", "extract": False}
        e.talk = d.call("memory.capture", {**cap, "text": CLASS_TALK, "title": "Rainy week", "date": "2023-05-08"})["records"][0]["id"]
        e.short = d.call("memory.capture", {**cap, "text": SHORT_TALK, "title": "Kiln", "date": "2023-05-09"})["records"][0]["id"]
        e.cli("rag", "index", e.v)
        yield e
    finally:
        e.d.stop()
        svc.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_model_is_asked_for_each_two_turn_window_and_status_counts_them(env: Env) -> None:
    texts = env.svc.texts()
    turns = CLASS_TALK.split("\n")
    for i in range(len(turns) - 1):
        pair = f"{turns[i]}\n\n{turns[i + 1]}"
        others = [t for n, t in enumerate(turns) if n not in (i, i + 1)]
        assert any(pair in t and not any(o in t for o in others) for t in texts), pair
    assert any(all(t in x for t in turns) for x in texts)  # and the whole fragment, as before
    assert not any(SHORT_TALK.split("\n")[0] in x and SHORT_TALK.split("\n")[1] not in x for x in texts)
    emb = env.embedding()
    assert env.cli("rag", "status", env.v)["fragments"] == 2  # one fragment per conversation
    assert emb["total"] == 2 + 4 and emb["embedded"] == emb["total"]  # and the 4 windows of the longer one


def test_the_exchange_that_answers_lifts_its_fragment_in_packs_and_the_setting_turns_it_off(env: Env) -> None:
    on, search_on = env.pack_scores(), env.search_scores()
    assert on[env.talk] > search_on[env.talk] + 0.01  # the pack: lifted by "I signed up for a pottery class"
    assert on[env.short] == pytest.approx(search_on[env.short], abs=1e-6)  # two turns: no window, same score
    before = len(env.svc.texts())
    env.restart(windows=False)
    assert env.embedding()["total"] == env.cli("rag", "status", env.v)["fragments"]
    assert env.pack_scores() == pytest.approx(search_on, abs=1e-6) == env.search_scores()  # own vectors only
    env.restart(windows=True)
    sealed = env.embedding()  # before any search: counted from the sealed file, nothing loaded
    assert (sealed["vectors_loaded"], sealed["embedded"], sealed["total"]) == (False, 6, 6)
    assert env.pack_scores() == pytest.approx(on, abs=1e-6)
    assert env.search_scores() == pytest.approx(search_on, abs=1e-6)  # search ranks by the fragment's own vector
    # Both restarts found every vector sealed: the service embedded queries, no turn of the vault.
    assert not [t for t in env.svc.texts()[before:] if "Mel:" in t or "Caro:" in t]
    assert env.embedding()["embedded"] == env.embedding()["total"] == 6


def test_a_pack_too_small_for_the_fragment_shows_the_window_that_answers(env: Env) -> None:
    pack = env.cli("rag", "context", env.v, "pottery class", "--mode", "vector", "--budget", "48")
    items = [i for i in pack["items"] if i["record_id"] == env.talk]
    assert items and pack["used_tokens"] <= 48, pack["text"]
    turns = items[0]["conversation"]["turns"]
    assert "T3" in turns and len(turns) < 5  # "I signed up for a pottery class", not the whole fragment
    assert "pottery class" in items[0]["text"]



def test_rag_index_and_status_count_window_vectors_apart_from_fragments(env: Env) -> None:
    r = run_cli(env.d.home, "rag", "index", env.v)
    assert r.returncode == 0, r.stderr
    shown = " ".join((r.stdout + r.stderr).split())
    assert "skipped 0. 6 of 6 vectors made: one per fragment (2) and 4 for conversation turn windows." in shown
    assert env.cli("rag", "index", env.v)["fragments"] == 2
    r = run_cli(env.d.home, "rag", "status", env.v)
    shown = " ".join(r.stdout.split())  # rows wrap at the terminal's width
    assert "6 of 6 vectors made (100%): one per fragment and 4 for conversation turn windows" in shown, r.stdout


def test_a_forgotten_conversation_takes_its_window_vectors_with_it(env: Env) -> None:
    before = env.embedding()
    out = env.cli("memory", "forget", env.v, "--id", env.talk, "--yes")
    # The sealed file too: its fragment's vector and its 4 windows' are dropped, the other kept.
    assert (out["vector_entries_dropped"], out["vector_entries_kept"]) == (5, 1)
    after = env.embedding()
    assert after["total"] == after["embedded"] == before["total"] - 5  # its fragment and its 4 windows
    assert env.talk not in env.pack_scores() and env.talk not in env.search_scores()
