#!/usr/bin/env python3
"""The relevance floor per vault and model (:mod:`memoriesd.rag.floor`) against one constant per model.

For each set of ``bench/floor_sets.py`` (SciFact, XQuAD-zh, tldr pages, the Node.js API reference as
code-heavy Markdown) and each model, the documents are cut into fragments as ingest cuts them
(:func:`memoriesd.text.fragments.split_fragments`) and embedded with the product's embedder
(:class:`memoriesd.embed.local.LocalEmbedder`, document and query prompts as in search); vectors
are cached under ``--cache`` so a second run only scores. Three query groups meet each vault:

- *on-topic*: the set's own judged queries;
- *off-topic*: the queries of the sets of other domains (SciFact claims, Chinese questions, command
  descriptions and API headings; tldr and the Node.js reference are one domain, software);
- *random words*: deterministic nonsense strings (``zzqxv nonexistentword`` and its kind, seeded
  differently from the probes the floor itself is calibrated with).

For each floor (none, the model profile's constant, the calibrated one of this vault) it reports
the share of on-topic queries whose nearest fragment reaches the floor ("kept"), the share of
off-topic and random-word queries whose nearest fragment does not ("nothing relevant"), and the
vector-mode nDCG@10 (documents ranked by their best fragment, fragments under the floor dropped).
Vector mode is the floor's whole effect: hybrid keeps every BM25 match whatever its cosine.

    python -m bench.calibrate_floor --model ../shared/models/all-MiniLM-L6-v2-onnx
    python -m bench.calibrate_floor --model /work/egemma/out/embeddinggemma-300m-onnx --max-docs 300 --max-queries 100
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

from bench.floor_sets import EvalSet, load, subset  # noqa: E402
from memoriesd.embed.local import LocalEmbedder  # noqa: E402
from memoriesd.rag.floor import calibrate, probe_texts  # noqa: E402
from memoriesd.text.fragments import split_fragments  # noqa: E402

SETS = ("scifact", "xquad-zh", "tldr", "code-md")
#: Off-topic queries come from sets of another domain (tldr's commands and Node.js's API headings are both software).
DOMAIN = {"scifact": "science", "xquad-zh": "encyclopedia", "tldr": "software", "code-md": "software"}


def random_words(n: int, seed: int = 20261205) -> list[str]:
    """Nonsense queries unlike the floor's own probes (another seed, other shapes)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = ["zzqxv nonexistentword"]
    while len(out) < n:
        words = [
            "".join(rng.choice(letters) for _ in range(rng.randint(3, 11))) for _ in range(rng.randint(1, 4))
        ]
        out.append(" ".join(words))
    return out


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:16]


class Cache:
    def __init__(self, root: Path, model: LocalEmbedder) -> None:
        self.root = root
        self.model = model
        root.mkdir(parents=True, exist_ok=True)

    def _get(self, name: str, fn: Any) -> np.ndarray:
        path = self.root / f"{name}.npy"
        if path.is_file():
            return np.load(path)
        vecs = np.asarray(fn(), dtype=np.float32)
        np.save(path, vecs)
        return vecs

    def documents(self, s: EvalSet) -> tuple[np.ndarray, list[str]]:
        items: list[tuple[str | None, str]] = []
        owners: list[str] = []
        for did, title, text in s.docs:
            body = f"# {title}\n\n{text}" if title else text
            for frag in split_fragments(did, 1, body, bytes(32)) or []:
                items.append((title or None, frag.text))
                owners.append(did)
        key = _key(self.model.identity, s.name, len(items), owners[:3], owners[-3:])
        t = time.perf_counter()
        vecs = self._get(f"docs-{s.name}-{key}", lambda: self.model.embed_documents(items))
        print(
            f"# {s.name}: {len(items)} fragments of {len(s.docs)} documents ({time.perf_counter() - t:.0f} s)",
            file=sys.stderr,
        )
        return vecs, owners

    def queries(self, tag: str, texts: list[str]) -> np.ndarray:
        key = _key(self.model.identity, tag, len(texts), texts[:3], texts[-3:])
        return self._get(f"q-{tag}-{key}", lambda: self.model.embed_queries([t[:1000] for t in texts]))


def best(vecs: np.ndarray, qvecs: np.ndarray) -> np.ndarray:
    return np.asarray((qvecs @ vecs.T).max(axis=1)) if len(qvecs) else np.empty(0)


def ndcg10(
    vecs: np.ndarray, owners: list[str], qvecs: np.ndarray, rels: list[set[str]], floor: float | None
) -> float:
    owner_arr = np.asarray(owners)
    total = 0.0
    for q, rel in zip(qvecs, rels, strict=True):
        scores = vecs @ q
        order = np.argsort(-scores)
        seen: list[str] = []
        for i in order:
            if floor is not None and scores[i] < floor:
                break
            d = str(owner_arr[i])
            if d not in seen:
                seen.append(d)
                if len(seen) == 10:
                    break
        dcg = sum(1 / math.log2(r + 2) for r, d in enumerate(seen) if d in rel)
        idcg = sum(1 / math.log2(r + 2) for r in range(min(10, len(rel))))
        total += dcg / idcg if idcg else 0.0
    return round(total / max(1, len(rels)), 4)


def share(values: np.ndarray, floor: float | None, above: bool) -> float:
    if floor is None:
        return 1.0 if above else 0.0
    hit = values >= floor if above else values < floor
    return round(float(np.mean(hit)), 4) if len(values) else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--set", action="append", choices=SETS, help="default: all four")
    ap.add_argument("--max-docs", type=int, default=0, help="cut each set to this many documents (0: whole)")
    ap.add_argument(
        "--whole", action="append", default=[], choices=SETS, help="a set --max-docs does not cut"
    )
    ap.add_argument("--max-queries", type=int, default=300)
    ap.add_argument("--random-queries", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "memories-bench" / "floor"))
    args = ap.parse_args()
    model = LocalEmbedder(Path(args.model), threads=args.threads)
    cache = Cache(Path(args.cache) / model.identity[:16], model)
    names = args.set or list(SETS)
    sets = {n: load(n, args.max_queries) for n in names}
    if args.max_docs:
        sets = {
            n: s if n in args.whole else subset(s, args.max_docs, args.max_queries) for n, s in sets.items()
        }
    # Off-topic queries are drawn from all four sets, whichever are measured.
    pools = {n: [q[1] for q in (sets[n] if n in sets else load(n, args.max_queries)).queries] for n in SETS}
    nonsense = random_words(args.random_queries)
    rand_vecs = cache.queries("random", nonsense)
    probes = cache.queries("probes", probe_texts())
    profile_floor = float(model.profile.ask_min_cosine)
    report: dict[str, Any] = {
        "model": model.profile.name,
        "profile_floor": profile_floor,
        "probes": len(probe_texts()),
        "sets": {},
    }
    for name, s in sets.items():
        vecs, owners = cache.documents(s)
        on_vecs = cache.queries(f"on-{name}", [q[1] for q in s.queries])
        off_pairs = [
            (t, other)
            for other, qs in pools.items()
            if other != name
            for t in qs[: max(1, args.max_queries // 3)]
        ]
        off_texts = [t for t, _ in off_pairs]
        off_vecs = cache.queries(f"off-{name}", off_texts)
        rels = [q[2] for q in s.queries]
        other_domain = np.asarray([DOMAIN[other] != DOMAIN[name] for _, other in off_pairs])
        on, off, rnd = best(vecs, on_vecs), best(vecs, off_vecs)[other_domain], best(vecs, rand_vecs)
        t = time.perf_counter()
        cal = calibrate(probes, vecs)
        cal_ms = (time.perf_counter() - t) * 1000
        base = ndcg10(vecs, owners, on_vecs, rels, None)
        row: dict[str, Any] = {
            "documents": len(s.docs),
            "fragments": len(vecs),
            "on_topic": len(on),
            "off_topic": len(off),
            "random": len(rnd),
            "nearest_cosine_median": {
                "on": round(float(np.median(on)), 3),
                "off": round(float(np.median(off)), 3),
                "random": round(float(np.median(rnd)), 3),
            },
            "calibration": cal.as_dict() | {"ms": round(cal_ms, 1)},
            "ndcg10_no_floor": base,
        }
        for label, floor in (("profile", profile_floor), ("calibrated", cal.floor)):
            nd = ndcg10(vecs, owners, on_vecs, rels, floor)
            row[label] = {
                "floor": round(floor, 4),
                "on_topic_kept": share(on, floor, True),
                "ndcg10": nd,
                "ndcg10_delta": round(nd - base, 4),
                "off_topic_nothing": share(off, floor, False),
                "random_nothing": share(rnd, floor, False),
            }
        report["sets"][name] = row
        print(json.dumps({name: row}), file=sys.stderr)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
