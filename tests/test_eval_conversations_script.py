"""scripts/eval_conversations.py: the issue-31 recall table of LoCoMo-format files, run by path from
the clone's root as a user would, against real daemons (BM25: no model), with one variant compared
to the default configuration; and the exact sign test and pairing it reports.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.conversation_report import paired, sign_test
from bench.eval_conversations import QuestionRow

from .conftest import REPO, SHARED, needs_shared, short_tmpdir

SCRIPT = REPO / "scripts" / "eval_conversations.py"
MINILM = SHARED / "models" / "all-MiniLM-L6-v2-onnx"


def _session(n: int, lines: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"speaker": who, "dia_id": f"D{n}:{i}", "text": text} for i, (who, text) in enumerate(lines, 1)]


#: Three sessions of Caroline and Melanie; each fact sits in one turn, with words no other turn has.
CONVERSATION: dict[str, Any] = {
    "speaker_a": "Caroline",
    "speaker_b": "Melanie",
    "session_1_date_time": "1:56 pm on 8 May, 2023",
    "session_1": _session(
        1,
        [
            ("Caroline", "Hi Melanie, how have you been lately?"),
            ("Melanie", "I finally finished painting the sunflower mural in my kitchen."),
            ("Caroline", "I went to the adoption agency meeting on Tuesday, it was moving."),
            ("Melanie", "That sounds wonderful, tell me everything."),
        ],
    ),
    "session_2_date_time": "10:37 am on 27 June, 2023",
    "session_2": _session(
        2,
        [
            ("Melanie", "We took the kids camping at Lake Tahoe last weekend."),
            ("Caroline", "Did they like sleeping in the tent?"),
            ("Melanie", "They loved the campfire and the marshmallows."),
        ],
    ),
    "session_3_date_time": "8:18 pm on 3 August, 2023",
    "session_3": _session(
        3,
        [
            ("Caroline", "After the adoption meeting I signed up for a parenting class at the library."),
            ("Melanie", "A pottery workshop is what I am doing next month."),
            ("Caroline", "Good luck with the pottery, send me pictures."),
        ],
    ),
    "qa": [
        {
            "question": "What did Melanie paint in her kitchen?",
            "answer": "a sunflower mural",
            "evidence": ["D1:2"],
            "category": 4,
        },
        {
            "question": "What did Caroline do after the adoption agency meeting?",
            "answer": "a parenting class",
            "evidence": ["D1:3", "D3:1"],
            "category": 1,
        },
        {
            "question": "When did Melanie go camping at Lake Tahoe?",
            "answer": "June 2023",
            "evidence": ["D2:1"],
            "category": 2,
        },
        {
            "question": "Would Melanie enjoy a pottery workshop?",
            "answer": "yes",
            "evidence": ["D3:2"],
            "category": 3,
        },
        {
            "question": "What did Melanie say about skydiving?",
            "answer": "nothing",
            "evidence": [],
            "category": 5,
        },
        {"question": "Which evidence is gone?", "answer": "-", "evidence": ["D9:9"], "category": 4},
    ],
}

#: The questions scored: categories 1-4 whose evidence turns are in the vault (not the category-5
#: one, nor the one whose only evidence id names no turn); one of them multi-hop.
SCORED, MULTI_HOP = 4, 1


@pytest.fixture()
def dev_dir() -> Iterator[Path]:
    tmp = short_tmpdir("mev")
    (tmp / "conv").mkdir()
    (tmp / "conv" / "tiny.json").write_text(json.dumps(CONVERSATION), encoding="utf-8")
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    """The script by path from the clone's root, as its --help says (bench/ is not installed)."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--quiet"],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _cells(table_row: str) -> list[str]:
    return [c.strip() for c in table_row.strip().strip("|").split("|")]


def test_the_script_prints_the_recall_table_and_a_sign_test_for_a_variant(dev_dir: Path) -> None:
    home = dev_dir / "h"
    variant = "nowin=[index]\\nconversation_windows = false"  # a literal \n, as typed in a shell's quotes
    saved = dev_dir / "run.json"
    out = _script(
        str(dev_dir / "conv"),
        "--mode",
        "bm25",
        "--home",
        str(home),
        "--variant",
        variant,
        "--save",
        str(saved),
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("### `tiny`: 10 turns captured in"), text
    header = next(
        line for line in text.splitlines() if line.startswith("| mode, variant | some evidence turn @5")
    )
    assert _cells(header)[1:8] == [
        "some evidence turn @5",
        "@10",
        "every evidence turn @10",
        "1,000-token pack: some / every",
        "multi-hop, some @10",
        "multi-hop, every @10",
        "questions (multi-hop)",
    ]
    figures = text.split("Against `default`")[0].splitlines()  # the first table, before the sign tests
    rows = {_cells(line)[0]: _cells(line) for line in figures if line.startswith("| bm25, ")}
    default, nowin = rows["bm25, default"], rows["bm25, nowin"]
    assert default[7] == nowin[7] == f"{SCORED} ({MULTI_HOP})"
    # Each figure is a share of the 4 questions (of the 1 multi-hop one).
    assert all(re.fullmatch(r"0\.000|0\.250|0\.500|0\.750|1\.000", x) for x in default[1:4])
    assert float(default[8]) > 0  # rag search p50 ms
    # Window vectors change nothing in BM25: the variant ties the reference on every question.
    assert nowin[1:8] == default[1:8]
    assert "Against `default`" in text
    sign = next(line for line in text.splitlines() if line.startswith("| bm25, nowin | +"))
    assert _cells(sign)[1:] == ["+0 / −0, p=1"] * 7
    last_config = (home / "config.toml").read_text()  # the variant's daemon ran last, on the same home
    assert "[index]" in last_config and "conversation_windows = false" in last_config

    doc = json.loads(saved.read_text())  # the same run as data, with its per-question rows
    assert doc["reference"] == "default" and doc["variants"] == ["default", "nowin"]
    assert doc["files"]["tiny"]["turns"] == 10
    fig = doc["figures"]["all"]["bm25, default"]
    assert (fig["questions"], fig["multi-hop questions"]) == (SCORED, MULTI_HOP)
    first = {(r["file"], r["index"]): r for r in doc["rows"] if r["variant"] == "default"}
    assert sorted(i for _f, i in first) == [0, 1, 2, 3]
    assert first[("tiny", 1)]["category"] == "multi-hop" and first[("tiny", 1)]["evidence"] == 2
    # The single-fact question whose words only its evidence turn has: BM25 puts that turn in the top 5.
    assert first[("tiny", 0)]["scores"]["recall_any@5"] == 1.0
    assert float(default[1]) == fig["some evidence turn @5"]
    assert doc["sign_tests"]["all"]["bm25, nowin"]["multi-hop, every @10"] == {
        "wins": 0,
        "losses": 0,
        "p": 1.0,
    }


@pytest.mark.skipif(not MINILM.is_dir(), reason=needs_shared("models/all-MiniLM-L6-v2-onnx"))
def test_a_variant_that_leaves_fragmenting_alone_embeds_nothing_again(dev_dir: Path) -> None:
    """Each variant's daemon loads the vectors the reference's daemon sealed on the same home: a
    search setting makes no vector, so its embedding cost is not counted twice nor its run slowed."""
    out = _script(
        str(dev_dir / "conv"),
        "--model-dir",
        str(MINILM),
        "--mode",
        "hybrid",
        "--variant",
        "cand=[search]\\ncandidates = 50",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    fig = json.loads(out.stdout)["figures"]["tiny"]
    assert fig["hybrid, default"]["vectors made"] >= 10  # a vector per fragment (and per turn window)
    assert fig["hybrid, cand"]["vectors made"] == 0
    assert fig["hybrid, cand"]["questions"] == SCORED


def test_a_variant_that_is_not_valid_config_stops_before_anything_runs(dev_dir: Path) -> None:
    bad_toml = _script(str(dev_dir / "conv"), "--variant", "x=[search\\ncandidates = 5")
    assert bad_toml.returncode == 2 and "variant x: not TOML" in bad_toml.stderr
    unknown = _script(str(dev_dir / "conv"), "--variant", "y=[search]\\ncandidate = 50")
    assert unknown.returncode == 2 and "variant y: unknown config key search.candidate" in unknown.stderr
    assert "Traceback" not in bad_toml.stderr + unknown.stderr


def test_sign_test_is_the_exact_two_sided_binomial() -> None:
    assert sign_test(8, 0) == sign_test(0, 8) == 0.0078125  # 2 / 2**8
    assert sign_test(10, 2) == 2 * (1 + 12 + 66) / 4096
    assert sign_test(5, 5) == sign_test(1, 0) == sign_test(0, 0) == 1.0


def _row(file: str, index: int, held: float, category: str = "single-hop") -> QuestionRow:
    scores = dict.fromkeys(("recall_any@5", "recall_any@10", "recall_all@10", "pack_any", "pack_all"), held)
    return QuestionRow(file, index, category, 1, scores, 100, 1.0)


def test_pairing_counts_wins_and_losses_per_question_and_drops_ties() -> None:
    ref = [_row("a", 0, 0.0), _row("a", 1, 1.0), _row("a", 2, 1.0), _row("b", 0, 0.0)]
    var = [_row("a", 0, 1.0), _row("a", 1, 0.0), _row("a", 2, 1.0), _row("b", 0, 1.0), _row("b", 9, 1.0)]
    got = paired(ref, var, "recall_any@5")
    assert (got.wins, got.losses) == (2, 1)  # a:0 and b:0 won, a:1 lost, a:2 tied, b:9 has no pair
    assert got.p == sign_test(2, 1) == 1.0
