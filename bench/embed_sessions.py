"""Bare onnxruntime session settings and the daemon's embedding path, for :mod:`bench.bench_embed`.

Two questions the product's throughput hangs on, answered on the same token ids and batches:

- which :class:`SessionSetting` (intra/inter-op threads, sequential or parallel execution, graph
  optimisation level, whether idle pool threads spin) runs a model fastest on this CPU: every
  setting is a bare ``InferenceSession`` fed the same length-sorted batches, rounds interleaved
  (median per batch), so load that changes during the run hits all alike;
- what a user's indexing gets through the real path: a model process
  (``memoriesd.workers.model``, started as the router starts it) reached over its socket by
  :class:`memoriesd.workers.model_client.ModelClient`-shaped requests in the background
  indexer's call sizes, against the best bare figure.
"""

from __future__ import annotations

import base64
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memoriesd.embed.local import OUTPUT_NAME, session_options
from memoriesd.embed.types import SessionSetting

Feed = dict[str, np.ndarray]


def bare_session(graph: Path, setting: SessionSetting) -> Any:
    """A bare ``InferenceSession`` with exactly ``setting`` (the product builds its options the same way)."""
    import onnxruntime as ort

    return ort.InferenceSession(
        str(graph), sess_options=session_options(setting), providers=["CPUExecutionProvider"]
    )


def feeds_for(seqs: list[list[int]], plan: list[list[int]], pad_id: int, token_types: bool) -> list[Feed]:
    """Padded int64 ids and masks per batch (mask 0 on padding), as the product builds them."""
    out = []
    for batch in plan:
        width = max(len(seqs[i]) for i in batch)
        ids = np.full((len(batch), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for r, i in enumerate(batch):
            ids[r, : len(seqs[i])] = seqs[i]
            mask[r, : len(seqs[i])] = 1
        feed = {"input_ids": ids, "attention_mask": mask}
        if token_types:
            feed["token_type_ids"] = np.zeros_like(ids)
        out.append(feed)
    return out


def default_settings(cores: int) -> list[SessionSetting]:
    """What the sweep tries: the product's old options first, then one change at a time."""
    two = min(2, cores)
    return [
        SessionSetting(intra_threads=two, spinning=True),  # the product before issue 29
        SessionSetting(intra_threads=two, spinning=False),
        SessionSetting(intra_threads=1, spinning=False),
        SessionSetting(intra_threads=cores * 2, spinning=False),
        SessionSetting(intra_threads=1, inter_threads=two, parallel=True, spinning=False),
        SessionSetting(intra_threads=two, spinning=False, optimization="extended"),
        SessionSetting(intra_threads=two, spinning=False, optimization="basic"),
    ]


@dataclass
class SweepRow:
    setting: SessionSetting
    seconds: float
    fragments_per_s: float
    tokens_per_s: float


def sweep_sessions(
    graph: Path, settings: list[SessionSetting], feeds: list[Feed], fragments: int, tokens: int, rounds: int
) -> list[SweepRow]:
    """Each setting's median time per batch over ``rounds`` interleaved rounds, summed."""
    sessions = [bare_session(graph, s) for s in settings]
    widest = max(range(len(feeds)), key=lambda k: feeds[k]["input_ids"].size)
    for sess in sessions:  # warm-up: arenas grown outside the timing
        sess.run([OUTPUT_NAME], feeds[widest])
    times = [[[] for _ in feeds] for _ in settings]  # type: list[list[list[float]]]
    for r in range(rounds):
        order = list(range(len(settings)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for k, feed in enumerate(feeds):
            for j in order:
                t0 = time.perf_counter()
                sessions[j].run([OUTPUT_NAME], feed)
                times[j][k].append(time.perf_counter() - t0)
        done = [round(sum(min(t) for t in per_batch), 2) for per_batch in times]
        print(f"sessions round {r + 1}/{rounds}: seconds so far {done}", file=sys.stderr, flush=True)
    rows = []
    for s, per_batch in zip(settings, times, strict=True):
        total = sum(statistics.median(t) for t in per_batch)
        rows.append(SweepRow(s, round(total, 3), round(fragments / total, 2), round(tokens / total, 1)))
    return rows


def row_view(row: SweepRow) -> dict[str, Any]:
    return {
        **asdict(row.setting),
        "seconds": row.seconds,
        "fragments_per_s": row.fragments_per_s,
        "tokens_per_s": row.tokens_per_s,
    }


class ModelProcess:
    """The product's model process, started as the router starts it (``python -I``, ``--socket``)."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="bench-embed-"))
        (self.dir / "run").mkdir()
        (self.dir / "logs").mkdir()
        self.socket = self.dir / "run" / "m.sock"
        from memoriesd.workers.process import child_command

        cmd = child_command(
            "memoriesd.workers.model",
            "--home",
            str(self.dir),
            "--socket",
            str(self.socket),
            "--model-dir",
            str(model_dir),
            "--threads",
            str(threads),
        )
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr)
        assert self.proc.stdout is not None
        said = self.proc.stdout.readline().decode().strip()
        if said != "ready":
            raise RuntimeError(f"the model process said {said!r}")

    def embed(
        self, items: list[tuple[str | None, str]], *, vault: str = "bench", backlog: int = 0
    ) -> np.ndarray:
        from memoriesd.workers.model_client import ask

        out = ask(
            self.socket,
            "model.embed",
            {
                "kind": "document",
                "items": [list(it) for it in items],
                "vault": vault,
                "lane": "background",
                "backlog": backlog,
            },
            None,
        )
        assert isinstance(out, dict)
        raw = base64.b64decode(out["vectors"])
        return np.frombuffer(raw, dtype="<f4").reshape(int(out["rows"]), int(out["dims"]))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def process_path(
    model_dir: Path,
    threads: int,
    items: list[tuple[str | None, str]],
    calls: list[list[int]],
    bare: Any,
    call_feeds: list[list[Feed]],
    rounds: int,
) -> dict[str, Any]:
    """The daemon's path against a bare session, paired call by call: each call is one request to a
    model process (``ModelClient``'s frame, the background indexer's hint) and, right before or after
    it (the order alternating), the bare session's run of the batches the model process plans for
    it. Median per call over ``rounds``; ``ratio`` = product / bare fragments per second."""
    mp = ModelProcess(model_dir, threads)
    try:
        widest = max(range(len(calls)), key=lambda k: len(calls[k]))
        mp.embed([items[i] for i in calls[widest]])  # warm-up, both sides
        for feed in call_feeds[widest]:
            bare.run([OUTPUT_NAME], feed)
        times: dict[str, list[list[float]]] = {"product": [[] for _ in calls], "bare": [[] for _ in calls]}
        for r in range(rounds):
            for k, call in enumerate(calls):
                for side in ("product", "bare") if (r + k) % 2 == 0 else ("bare", "product"):
                    t0 = time.perf_counter()
                    if side == "product":
                        mp.embed([items[i] for i in call], backlog=len(items))
                    else:
                        for feed in call_feeds[k]:
                            bare.run([OUTPUT_NAME], feed)
                    times[side][k].append(time.perf_counter() - t0)
    finally:
        mp.close()
    p_s, b_s = (sum(statistics.median(t) for t in times[side]) for side in ("product", "bare"))
    return {
        "calls": len(calls),
        "fragments": len(items),
        "product_fragments_per_s": round(len(items) / p_s, 2),
        "bare_fragments_per_s": round(len(items) / b_s, 2),
        "ratio": round(b_s / p_s, 3),
    }


@dataclass
class Subset:
    """A SciFact subset: ``docs`` documents (every one judged relevant to a kept query, then others)
    and the test queries whose relevant documents are all inside."""

    docs: list[dict[str, Any]]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def scifact_subset(root: Path, docs: int) -> Subset:
    from bench.eval_beir import load_jsonl, load_qrels

    corpus = {str(d["_id"]): d for d in load_jsonl(root / "corpus.jsonl")}
    qrels = load_qrels(root / "qrels" / "test.tsv")
    queries = {str(q["_id"]): str(q["text"]) for q in load_jsonl(root / "queries.jsonl")}
    keep: dict[str, dict[str, int]] = {}
    chosen: list[str] = []
    for qid, rel in qrels.items():  # half the subset: documents some query is judged against
        need = [d for d in rel if d not in chosen and d in corpus]
        if qid not in queries or len(chosen) + len(need) > docs // 2:
            continue
        chosen += need
        keep[qid] = rel
    for did in corpus:  # the other half: documents no kept query is about
        if len(chosen) >= docs:
            break
        if did not in chosen:
            chosen.append(did)
    return Subset([corpus[d] for d in chosen], {q: queries[q] for q in keep}, keep)


def ndcg_of(emb: Any, subset: Subset, fragments: Any) -> dict[str, Any]:
    """nDCG@10 of ``emb`` (a LocalEmbedder) on ``subset``: each document split into the product's
    fragments, a document scored by its best fragment (as `rag search` ranks documents)."""
    from bench.eval_beir import ndcg_at

    items: list[tuple[str | None, str]] = []
    owner: list[str] = []
    for d in subset.docs:
        for frag in fragments(str(d["text"])):
            items.append((str(d.get("title") or "") or None, frag))
            owner.append(str(d["_id"]))
    t0 = time.perf_counter()
    vecs = emb.embed_documents(items)
    doc_s = time.perf_counter() - t0
    qids = list(subset.queries)
    qvecs = emb.embed_queries([subset.queries[q] for q in qids])
    scores = qvecs @ vecs.T
    ids = sorted(set(owner))
    col = {d: i for i, d in enumerate(ids)}
    best = np.full((len(qids), len(ids)), -2.0, dtype=np.float32)
    for j, did in enumerate(owner):
        best[:, col[did]] = np.maximum(best[:, col[did]], scores[:, j])
    ndcgs = []
    for r, q in enumerate(qids):
        ranked = [ids[i] for i in np.argsort(-best[r])[:10]]
        ndcgs.append(ndcg_at(ranked, subset.qrels[q]))
    return {
        "ndcg@10": round(float(np.mean(ndcgs)), 4),
        "documents": len(subset.docs),
        "fragments": len(items),
        "queries": len(qids),
        "document_fragments_per_s": round(len(items) / doc_s, 2),
        "vectors": vecs,
    }
