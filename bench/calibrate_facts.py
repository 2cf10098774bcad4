#!/usr/bin/env python3
"""Calibrate when two facts are "the same fact" (dedupe/supersede) and the topic floor of `forget`.

Prints one JSON object. For each model (``--model-dir``, repeatable):

- ``same``: cosine of document embeddings (the way fact records are embedded: no title) over
  hand-written pairs of facts in one category. Positives say the same thing or revise the same
  attribute ("prefers tabs" -> "switched to spaces"); negatives are other attributes of the same
  category, many of them hard ("allergic to peanuts" / "allergic to cats"). For each candidate
  threshold: true merges, false merges, and the threshold with no false merge and the most true
  ones (precision first: a false merge hides a fact behind another's revision).
- ``lexical``: the same pairs under the no-model rule (token-set Jaccard of :func:`fact_tokens`).
- ``topic``: cosine of query embeddings (short topic queries) to facts about the topic and to
  facts about something else: the floor of ``forget --scope topic`` for vector matches.

Only short texts (about 150 embeddings per model): cheap on a shared CPU.

Usage: .venv/bin/python -m bench.calibrate_facts --model-dir ../shared/models/all-MiniLM-L6-v2-onnx
       [--model-dir /work/egemma/out/embeddinggemma-300m-fp32] [--threads 2]
"""

from __future__ import annotations

import os

os.environ["ORT_DISABLE_TELEMETRY"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from memoriesd.memory.facts import jaccard, revision_cue  # noqa: E402

# (first, second): the second revises or restates the first.
SAME = [
    ("The user prefers tabs over spaces.", "Actually the user switched to spaces."),
    ("I prefer the quattro formaggi pizza.", "Actually I prefer the margherita now."),
    ("The user's favourite editor is Vim.", "The user now uses VS Code as their main editor."),
    ("The user lives in Berlin.", "The user moved to Munich last month."),
    ("My name is Alice Smith.", "Call me Alice."),
    ("The user works as a data engineer at Acme.", "The user is now a staff data engineer at Acme."),
    ("Prefers dark mode in every app.", "The user likes dark themes in applications."),
    ("The user drinks coffee black, no sugar.", "User takes coffee without milk or sugar."),
    ("We decided to use PostgreSQL for the main database.", "Decision: the main database will be SQLite instead of PostgreSQL."),
    ("The team deploys on Fridays.", "The team no longer deploys on Fridays; deploys happen on Tuesdays."),
    ("The user is allergic to peanuts.", "User has a peanut allergy."),
    ("User prefers TypeScript over JavaScript.", "The user prefers writing TypeScript rather than plain JavaScript."),
    ("The user's timezone is Europe/Paris.", "The user is in the Central European time zone."),
    ("User wants answers in French.", "Please reply to the user in French."),
    ("The user has two kids.", "The user has three children."),
    ("The user runs every morning before work.", "User goes for a run each morning."),
    ("Code reviews must be approved by two people.", "Two approvals are required before merging."),
    ("The user prefers short, concise answers.", "Keep replies brief for this user."),
    ("The user's birthday is on March 3rd.", "User was born on 3 March 1990."),
    ("The user uses Linux on their laptop.", "The user switched their laptop to macOS."),
    ("The user prefers metric units.", "Use kilometres and kilograms with this user."),
    ("User is vegetarian.", "The user doesn't eat meat."),
    ("The project uses Python 3.11.", "The project upgraded to Python 3.12."),
    ("User prefers email over phone calls.", "The user would rather be contacted by email than called."),
    ("The user's manager is Bob.", "The user now reports to Carol."),
    ("用户喜欢喝绿茶。", "用户现在更喜欢喝红茶。"),
]

# Different attributes of the same kind of fact: must stay two facts.
DIFFERENT = [
    ("The user prefers tabs over spaces.", "The user prefers dark mode."),
    ("User prefers TypeScript over JavaScript.", "The user prefers tabs over spaces."),
    ("The user lives in Berlin.", "The user works as a data engineer at Acme."),
    ("The user's favourite editor is Vim.", "The user's favourite colour is blue."),
    ("The user drinks coffee black, no sugar.", "User is vegetarian."),
    ("We decided to use PostgreSQL for the main database.", "We decided to deploy on Kubernetes."),
    ("The team deploys on Fridays.", "The team holds standups at 9am."),
    ("The user is allergic to peanuts.", "The user is allergic to cats."),
    ("User wants answers in French.", "User wants answers with code examples."),
    ("The user has two kids.", "The user has a dog named Rex."),
    ("The user runs every morning before work.", "The user reads before bed."),
    ("The user prefers short, concise answers.", "The user prefers metric units."),
    ("The user's birthday is on March 3rd.", "The user's wedding anniversary is in June."),
    ("The user uses Linux on their laptop.", "The user uses an Android phone."),
    ("User prefers email over phone calls.", "The user prefers meetings in the morning."),
    ("The user's manager is Bob.", "The user's brother is Tom."),
    ("User is vegetarian.", "User is left-handed."),
    ("The project uses Python 3.11.", "The project uses pytest for tests."),
    ("The user's timezone is Europe/Paris.", "The user speaks German and English."),
    ("Code reviews must be approved by two people.", "All commits must be signed."),
    ("My name is Alice Smith.", "My email is alice@example.com."),
    ("The user likes jazz music.", "The user likes Italian food."),
    ("The user prefers vim keybindings.", "The user prefers light mode."),
    ("The user prefers the window seat on flights.", "The user prefers tea to coffee."),
    ("用户喜欢喝绿茶。", "用户住在上海。"),
    ("The user prefers tabs over spaces.", "The user prefers TypeScript over JavaScript."),
]

# A new fact with a revision cue ("actually", "now", "switched"...) about another attribute than
# the existing one: the cue rule (a lower cosine when the new text says it replaces something)
# must not merge these.
CUE_DIFFERENT = [
    ("The user prefers tabs over spaces.", "Actually the user prefers dark mode now."),
    ("The user has two kids.", "The user now has a dog named Rex."),
    ("The user lives in Berlin.", "The user now works as a data engineer at Acme."),
    ("The user's favourite editor is Vim.", "The user's favourite colour is now green."),
    ("User is vegetarian.", "The user switched to drinking decaf coffee."),
    ("We decided to use PostgreSQL for the main database.", "We now deploy on Kubernetes instead of bare VMs."),
    ("The team deploys on Fridays.", "Standups now happen at 10am instead of 9am."),
    ("The user is allergic to peanuts.", "The user is no longer afraid of flying."),
    ("User wants answers in French.", "The user now wants code examples in every answer."),
    ("The user runs every morning before work.", "The user switched to reading before bed instead of watching TV."),
    ("The user uses Linux on their laptop.", "The user switched to an Android phone."),
    ("The user's manager is Bob.", "The user's brother Tom moved to Canada."),
    ("The project uses Python 3.11.", "The project switched from unittest to pytest."),
    ("User prefers email over phone calls.", "The user now prefers meetings in the morning."),
    ("The user prefers short, concise answers.", "Actually the user prefers metric units."),
    ("用户喜欢喝绿茶。", "用户现在住在上海。"),
    ("User prefers TypeScript over JavaScript.", "Actually the user switched to spaces."),
    ("The user prefers tabs over spaces.", "The user now prefers TypeScript over JavaScript."),
    ("The user's birthday is on March 3rd.", "The user's anniversary is now in July."),
    ("My name is Alice Smith.", "My email address changed to alice@newmail.example."),
    ("The user prefers dark mode.", "Actually the user switched to spaces."),
]

# (query, facts about it, facts about something else)
TOPICS = [
    ("tabs", ["The user prefers tabs over spaces.", "Indent with tabs in this user's code."],
     ["The user lives in Berlin.", "The user is allergic to peanuts."]),
    ("pizza", ["I prefer the quattro formaggi pizza.", "Actually I prefer the margherita now."],
     ["The user drinks coffee black, no sugar.", "The team deploys on Fridays."]),
    ("coffee", ["The user drinks coffee black, no sugar.", "User takes coffee without milk or sugar."],
     ["The user's manager is Bob.", "The user prefers metric units."]),
    ("where the user lives", ["The user lives in Berlin.", "The user moved to Munich last month."],
     ["User prefers TypeScript over JavaScript.", "The user has two kids."]),
    ("database choice", ["We decided to use PostgreSQL for the main database.", "Decision: the main database will be SQLite instead of PostgreSQL."],
     ["The user runs every morning before work.", "User wants answers in French."]),
    ("allergies", ["The user is allergic to peanuts.", "The user is allergic to cats."],
     ["The project uses Python 3.11.", "The user's timezone is Europe/Paris."]),
    ("editor", ["The user's favourite editor is Vim.", "The user now uses VS Code as their main editor."],
     ["The user has three children.", "User is vegetarian."]),
    ("family", ["The user has two kids.", "The user's brother is Tom."],
     ["Code reviews must be approved by two people.", "The user prefers dark mode."]),
]


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def sweep(pos: list[float], neg: list[float], steps: list[float]) -> dict[str, Any]:
    rows = [{"threshold": t, "true_merges": int(sum(s >= t for s in pos)), "false_merges": int(sum(s >= t for s in neg))} for t in steps]
    clean = [r for r in rows if r["false_merges"] == 0]
    best = max(clean, key=lambda r: (r["true_merges"], -r["threshold"])) if clean else None
    # The lowest threshold with no false merge, and the margin to the highest negative.
    return {
        "positives": len(pos),
        "negatives": len(neg),
        "pos_min": round(min(pos), 4),
        "pos_median": round(float(np.median(pos)), 4),
        "neg_max": round(max(neg), 4),
        "neg_median": round(float(np.median(neg)), 4),
        "best_no_false_merge": best,
        "sweep": rows,
    }


def calibrate(model_dir: Path, threads: int) -> dict[str, Any]:
    from memoriesd.embed.local import LocalEmbedder

    emb = LocalEmbedder(model_dir, threads=threads)
    texts = sorted({t for pair in SAME + DIFFERENT + CUE_DIFFERENT for t in pair})
    vecs = dict(zip(texts, emb.embed_documents([(None, t) for t in texts]), strict=True))
    pos = [_cos(vecs[a], vecs[b]) for a, b in SAME]
    neg = [_cos(vecs[a], vecs[b]) for a, b in DIFFERENT]
    steps = [round(float(x), 2) for x in np.arange(0.30, 0.96, 0.01)]
    out: dict[str, Any] = {"model": model_dir.name, "same": sweep(pos, neg, steps)}
    # The cue rule: pairs whose new text has a revision cue, against cue pairs about something else.
    cue_pos = [c for (a, b), c in zip(SAME, pos, strict=True) if revision_cue(b)]
    cue_neg = [_cos(vecs[a], vecs[b]) for a, b in CUE_DIFFERENT]
    out["revise"] = sweep(cue_pos, cue_neg, steps)
    out["revise"]["pairs"] = [{"a": a, "b": b, "cosine": round(_cos(vecs[a], vecs[b]), 4)} for a, b in CUE_DIFFERENT]
    out["revise"]["cue_positives"] = [{"a": a, "b": b, "cosine": round(c, 4)} for (a, b), c in zip(SAME, pos, strict=True) if revision_cue(b)]
    out["same"]["pairs"] = {
        "positive": [{"a": a, "b": b, "cosine": round(c, 4)} for (a, b), c in zip(SAME, pos, strict=True)],
        "negative": [{"a": a, "b": b, "cosine": round(c, 4)} for (a, b), c in zip(DIFFERENT, neg, strict=True)],
    }
    best_same = (out["same"]["best_no_false_merge"] or {"threshold": 1.0})["threshold"]
    best_revise = (out["revise"]["best_no_false_merge"] or {"threshold": 1.0})["threshold"]
    out["combined"] = [combined(pos, neg, cue_neg, best_same, best_revise), combined(pos, neg, cue_neg, best_same, 1.0)]
    qs = [q for q, _, _ in TOPICS]
    qv = dict(zip(qs, emb.embed_queries(qs), strict=True))
    facts = sorted({f for _, on, off in TOPICS for f in on + off})
    fv = dict(zip(facts, emb.embed_documents([(None, f) for f in facts]), strict=True))
    on_scores = [_cos(qv[q], fv[f]) for q, on, _ in TOPICS for f in on]
    off_scores = [_cos(qv[q], fv[f]) for q, _, off in TOPICS for f in off]
    out["topic"] = {
        "floor": sweep(on_scores, off_scores, steps)["best_no_false_merge"],
        "on_min": round(min(on_scores), 4),
        "on_median": round(float(np.median(on_scores)), 4),
        "off_max": round(max(off_scores), 4),
        "off_median": round(float(np.median(off_scores)), 4),
        "per_query": [
            {"query": q, "on": [round(_cos(qv[q], fv[f]), 4) for f in on], "off": [round(_cos(qv[q], fv[f]), 4) for f in off]}
            for q, on, off in TOPICS
        ],
    }
    return out


def combined(pos: list[float], neg: list[float], cue_neg: list[float], same: float, revise: float) -> dict[str, Any]:
    """The rule as the daemon applies it: cosine >= same, or a revision cue and cosine >= revise."""
    def merged(pairs: list[tuple[str, str]], scores: list[float]) -> int:
        return sum(1 for (_, b), c in zip(pairs, scores, strict=True) if c >= same or (revision_cue(b) and c >= revise))
    return {
        "same": same,
        "revise": revise,
        "true_merges": merged(SAME, pos),
        "of": len(SAME),
        "false_merges": merged(DIFFERENT, neg) + merged(CUE_DIFFERENT, cue_neg),
        "of_different": len(DIFFERENT) + len(CUE_DIFFERENT),
    }


def lexical() -> dict[str, Any]:
    pos = [jaccard(a, b) for a, b in SAME]
    neg = [jaccard(a, b) for a, b in DIFFERENT] + [jaccard(a, b) for a, b in CUE_DIFFERENT]
    steps = [round(float(x), 2) for x in np.arange(0.10, 0.91, 0.05)]
    return sweep(pos, neg, steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", action="append", default=[], type=Path)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    result: dict[str, Any] = {"lexical": lexical(), "models": [calibrate(d, args.threads) for d in args.model_dir]}
    print(json.dumps(result, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
