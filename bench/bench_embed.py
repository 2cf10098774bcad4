#!/usr/bin/env python3
"""Benchmark the local embedder against bare onnxruntime, and the vector index; prints one JSON object.

Per set (``--set``: SciFact abstracts, XQuAD-zh Chinese paragraphs; the first ``--limit`` fragments
of the product's 768-character fragments, 128 overlap, embedded as ``(title, fragment)``):

- product vs bare: tokens/s and fragments/s of ``LocalEmbedder.embed_documents`` (prompt,
  tokenizer, padding, normalisation: all the daemon runs per batch) against a bare
  ``onnxruntime.InferenceSession`` on the same graph (``CPUExecutionProvider``, only
  ``intra_op_num_threads`` set, to the same value) fed the same token ids, attention masks and
  batches, built outside its timing. Paired call by call in the same run (each product call of a
  batch is timed right next to the bare run of it, order alternating; each call's median
  over ``--rounds``), so a busy machine slows both alike; ``ratio`` = product/bare throughput
  (target >= 0.95), ``cpu_ratio`` the same in process CPU seconds;
- ``--threads-sweep``: product and bare at ``local_threads`` 1, 2 and the core count (if > 2);
- ``--batch-sweep``: batch token budgets, and the daemon's own call sizes (background chunks of
  8 fragments, ``rag index`` batches of 32), each product vs bare;
  the rounds of all these settings interleave, so load that changes during the run hits all alike;
- length-bucketed vs naive fixed batches in input order (padding, speed-up, agreement);
- single-query embedding latency p50/p95 (the set's queries);
- exact top-100 cosine search over 10,000 x 768 random unit vectors, with and without a filter;
- ``--sessions``: bare sessions of every :class:`memoriesd.embed.types.SessionSetting` in
  ``bench/embed_sessions.py`` (threads, execution mode, optimisation level, spinning) on the same
  length-sorted batches, and the product's own setting; ``--model-process``: the daemon's path (a
  model process, one request per background chunk) against the best bare setting on the same
  batches; ``--ndcg DOCS``: SciFact-subset nDCG@10 of each ``--model-dir`` (repeatable: fp32 and Q4
  in one run, with the cosine agreement of their vectors). ``--skip-main`` runs only these.

Usage: .venv/bin/python -m bench.bench_embed [--model-dir DIR] [--set scifact|xquad-zh|both]
       [--limit 300] [--threads N] [--rounds 3] [--threads-sweep] [--batch-sweep] [--budgets 1024,...]
       [--sessions] [--model-process] [--ndcg 300] [--skip-main]
"""

from __future__ import annotations

import os

os.environ["ORT_DISABLE_TELEMETRY"] = "1"  # before onnxruntime is imported, here or by the product

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

from memoriesd.embed.local import OUTPUT_NAME, LocalEmbedder, fixed_batches, plan_batches  # noqa: E402
from memoriesd.embed.profile import find_graph, format_document  # noqa: E402
from memoriesd.index.vectors.matrix import VectorIndex  # noqa: E402
from memoriesd.text.fragments import split_fragments  # noqa: E402

SHARED = REPO.parent / "shared"
SETS = {
    "scifact": SHARED / "eval" / "scifact",
    "xquad-zh": SHARED / "eval" / "xquad-zh",
}
DEFAULT_BUDGETS = "1024,2048,4096,8192,16384"
TARGET_RATIO = 0.95

Plan = list[list[int]]


@dataclass
class Inputs:
    """One set's inputs, tokenized once by the product (the bare session reads the same ids)."""

    name: str
    items: list[tuple[str | None, str]]
    seqs: list[list[int]]
    queries: list[str]
    tokenize_s: float

    @property
    def lengths(self) -> list[int]:
        return [len(s) for s in self.seqs]

    @property
    def tokens(self) -> int:
        return sum(self.lengths)


class Bare:
    """A bare onnxruntime session on the product's graph: nothing set but the intra-op threads."""

    def __init__(self, graph: Path, threads: int) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(graph), sess_options=opts, providers=["CPUExecutionProvider"])
        self.token_types = "token_type_ids" in {i.name for i in self.session.get_inputs()}

    def feeds(self, seqs: list[list[int]], plan: Plan, pad_id: int) -> list[tuple[list[int], dict[str, np.ndarray]]]:
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
            if self.token_types:
                feed["token_type_ids"] = np.zeros_like(ids)
            out.append((batch, feed))
        return out

    def run(self, feeds: list[tuple[list[int], dict[str, np.ndarray]]]) -> list[np.ndarray]:
        return [self.session.run([OUTPUT_NAME], feed)[0] for _, feed in feeds]


def fragments(text: str) -> list[str]:
    """The product's own 768/128 fragments of one text (any fixed key: fingerprints are unused here)."""
    return [f.text for f in split_fragments("bench", 1, text, b"bench-embed") if f.text]


def load_items(corpus: Path, limit: int) -> list[tuple[str | None, str]]:
    items: list[tuple[str | None, str]] = []
    with corpus.open(encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)
            for frag in fragments(doc["text"]):
                items.append((doc.get("title") or None, frag))
                if len(items) >= limit:
                    return items
    return items


def load_queries(path: Path, count: int) -> list[str]:
    if not path.is_file():
        return []
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line)["text"] for _, line in zip(range(count), fh, strict=False)]


def prepare(emb: LocalEmbedder, name: str, limit: int, query_count: int) -> Inputs:
    items = load_items(SETS[name] / "corpus.jsonl", limit)
    texts = [format_document(emb.profile, t, f) for t, f in items]
    t0 = time.perf_counter()
    seqs = emb._encode(texts)  # what the model reads: prompt, BOS/EOS, truncation
    tokenize_s = time.perf_counter() - t0
    return Inputs(name, items, seqs, load_queries(SETS[name] / "queries.jsonl", query_count), tokenize_s)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def padded_tokens(lengths: list[int], batches: Plan) -> int:
    return sum(len(b) * max(lengths[i] for i in b) for b in batches)


def rate(inp: Inputs, seconds: float, cpu_seconds: float | None = None) -> dict[str, float]:
    out = {
        "seconds": round(seconds, 3),
        "fragments_per_s": round(len(inp.items) / seconds, 2),
        "tokens_per_s": round(inp.tokens / seconds, 1),
    }
    if cpu_seconds is not None:  # CPU seconds of the whole process (all its threads) during the calls
        out["cpu_seconds"] = round(cpu_seconds, 3)
        out["tokens_per_cpu_s"] = round(inp.tokens / max(1e-9, cpu_seconds), 1)
    return out


def budget_calls(lengths: list[int], budget: int) -> Plan:
    """One call per length-bucketed batch: embedding them one call each runs exactly these batches."""
    return plan_batches(lengths, budget)


def chunk_calls(count: int, chunk: int) -> Plan:
    """Consecutive slices of ``chunk`` fragments: how the daemon calls the embedder."""
    return [list(range(i, min(i + chunk, count))) for i in range(0, count, chunk)]


class Paired:
    """Product vs bare for one setting (threads, batch budget, call sizes), paired call by call.

    Each call is one ``embed_documents`` of those fragments (the product plans its batches with
    ``budget``); the bare session runs the same batches of the same ids right before or after it
    (the order alternates). :func:`run_rounds` interleaves the rounds of all settings, so a
    machine whose load changes during the run slows every setting and both sides alike. Each
    call's median over the rounds counts: on a shared machine a call's time varies by +-30% both
    ways, which the best round (the usual choice on an idle machine) turns into a biased sum of
    lucky outliers. ``cpu_ratio`` compares process CPU seconds (all threads) instead of wall time.
    """

    def __init__(self, emb: LocalEmbedder, bare: Bare, inp: Inputs, calls: Plan, budget: int) -> None:
        self.emb, self.bare, self.inp, self.calls, self.budget = emb, bare, inp, calls, budget
        lengths = inp.lengths
        self.plans = [[[c[i] for i in b] for b in plan_batches([lengths[i] for i in c], budget)] for c in calls]
        self.feeds = [bare.feeds(inp.seqs, plan, emb._pad_id) for plan in self.plans]
        self.wall: dict[str, list[list[float]]] = {"product": [[] for _ in calls], "bare": [[] for _ in calls]}
        self.cpu: dict[str, list[list[float]]] = {"product": [[] for _ in calls], "bare": [[] for _ in calls]}
        self.vecs = np.empty((len(inp.items), emb.dimensions), dtype=np.float32)
        self.bare_vecs = np.empty_like(self.vecs)

    def warm_up(self) -> None:
        """The widest call once per side, so neither grows its memory arena inside the timing."""
        lengths = self.inp.lengths
        k = max(range(len(self.calls)), key=lambda i: padded_tokens(lengths, self.plans[i]))
        self.emb.embed_documents([self.inp.items[i] for i in self.calls[k]], batch_tokens=self.budget)
        self.bare.run(self.feeds[k])

    def run_round(self, r: int) -> None:
        outs: list[np.ndarray] = []
        for k, call in enumerate(self.calls):
            for side in ("product", "bare") if (r + k) % 2 == 0 else ("bare", "product"):
                c0, t0 = time.process_time(), time.perf_counter()
                if side == "product":
                    self.vecs[call] = self.emb.embed_documents([self.inp.items[i] for i in call], batch_tokens=self.budget)
                else:
                    outs = self.bare.run(self.feeds[k])
                self.wall[side][k].append(time.perf_counter() - t0)
                self.cpu[side][k].append(time.process_time() - c0)
            for (batch, _), out in zip(self.feeds[k], outs, strict=True):
                raw = out[:, : self.emb.dimensions]
                self.bare_vecs[batch] = raw / np.linalg.norm(raw, axis=1, keepdims=True)

    def result(self) -> dict[str, Any]:
        inp, lengths = self.inp, self.inp.lengths
        p_s, b_s = (sum(statistics.median(t) for t in self.wall[side]) for side in ("product", "bare"))
        p_cpu, b_cpu = (sum(statistics.median(t) for t in self.cpu[side]) for side in ("product", "bare"))
        return {
            "calls": len(self.calls),
            "batches": sum(len(p) for p in self.plans),
            "padded_tokens": sum(padded_tokens(lengths, p) for p in self.plans),
            "product": rate(inp, p_s, p_cpu),
            "bare": rate(inp, b_s, b_cpu),
            "ratio": round(b_s / p_s, 3),
            "cpu_ratio": round(b_cpu / max(1e-9, p_cpu), 3),
            "min_cosine_product_vs_bare": round(float(np.min(np.sum(self.vecs * self.bare_vecs, axis=1))), 6),
        }


def run_rounds(settings: list[Paired], rounds: int) -> None:
    """All settings' rounds interleaved (the order rotating each round), after one warm-up each."""
    for p in settings:
        p.warm_up()
    for r in range(rounds):
        shift = r % len(settings)
        for p in settings[shift:] + settings[:shift]:
            p.run_round(r)


def naive_vs_bucketed(emb: LocalEmbedder, inp: Inputs, budget: int, naive_batch: int, rounds: int) -> dict[str, Any]:
    """The product's fixed batches in input order against its length-bucketed ones, whole passes
    alternating (median of ``rounds`` each)."""
    texts = [format_document(emb.profile, t, f) for t, f in inp.items]
    naive_plan = fixed_batches(len(texts), naive_batch)
    times: dict[str, list[float]] = {"naive": [], "bucketed": []}
    naive = bucketed = np.empty(0)
    for r in range(rounds):
        for side in ("naive", "bucketed") if r % 2 == 0 else ("bucketed", "naive"):
            t0 = time.perf_counter()
            if side == "naive":
                naive = emb._embed_texts(texts, lambda _lengths: naive_plan)
            else:
                bucketed = emb.embed_documents(inp.items, batch_tokens=budget)
            times[side].append(time.perf_counter() - t0)
    mid = {side: statistics.median(t) for side, t in times.items()}
    return {
        "naive_batch_size": naive_batch,
        "naive": {**rate(inp, mid["naive"]), "batches": len(naive_plan),
                  "padded_tokens": padded_tokens(inp.lengths, naive_plan)},
        "bucketed": {**rate(inp, mid["bucketed"]), "batch_tokens": budget},
        "speedup_bucketed_vs_naive": round(mid["naive"] / mid["bucketed"], 2),
        "min_cosine_bucketed_vs_naive": round(float(np.min(np.sum(naive * bucketed, axis=1))), 6),
    }


def query_latency(emb: LocalEmbedder, queries: list[str]) -> dict[str, float]:
    queries = queries or ["what is the effect of a drug on blood pressure"] * 50
    emb.embed_queries(queries[:2])
    ms = []
    for q in queries:
        t0 = time.perf_counter()
        emb.embed_queries([q])
        ms.append((time.perf_counter() - t0) * 1000)
    return {"n": len(ms), "p50": round(statistics.median(ms), 2), "p95": round(pct(ms, 95), 2)}


def vector_search() -> dict[str, float]:
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((10_000, 768)).astype(np.float32)
    index = VectorIndex.build(list(range(10_000)), matrix)
    probes = rng.standard_normal((200, 768)).astype(np.float32)
    allowed = set(range(0, 10_000, 10))
    s_ms, f_ms = [], []
    for p in probes:
        t0 = time.perf_counter()
        index.search(p, 100)
        s_ms.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        index.search(p, 100, allowed=allowed)
        f_ms.append((time.perf_counter() - t0) * 1000)
    return {
        "p50": round(statistics.median(s_ms), 3),
        "p95": round(pct(s_ms, 95), 3),
        "filtered_1000_p50": round(statistics.median(f_ms), 3),
    }


def describe(inp: Inputs, emb: LocalEmbedder) -> dict[str, Any]:
    lengths = inp.lengths
    return {
        "fragments": len(inp.items),
        "tokens": inp.tokens,
        "mean_tokens_per_fragment": round(inp.tokens / max(1, len(lengths)), 1),
        "max_tokens_per_fragment": max(lengths, default=0),
        "truncated_fragments": sum(1 for n in lengths if n >= emb.max_tokens),
        "tokenize_seconds": round(inp.tokenize_s, 3),
    }


def load(model_dir: Path, threads: int) -> tuple[LocalEmbedder, Bare, float]:
    t0 = time.perf_counter()
    emb = LocalEmbedder(model_dir, threads=threads)
    load_s = time.perf_counter() - t0
    graph = find_graph(model_dir)
    assert graph is not None
    return emb, Bare(graph, threads), load_s


def daemon_call_sizes() -> list[tuple[int, str]]:
    """Fragments per embedder call in the daemon: background chunks, `rag index` batches.

    Imported lazily: those modules pull in the whole index stack, which this benchmark needs
    for nothing else (8 and 32 when it cannot be imported; the JSON says so)."""
    try:
        from memoriesd.index.vectors.space import BATCH_FRAGMENTS
        from memoriesd.rag.background import CHUNK_FRAGMENTS
    except ImportError:
        return [(8, "background indexing (assumed 8)"), (32, "rag index (assumed 32)")]
    return [(CHUNK_FRAGMENTS, "background indexing"), (BATCH_FRAGMENTS, "rag index")]


def sweep_threads(cores: int) -> list[int]:
    return sorted({1, min(2, cores), cores})


def extras(args: argparse.Namespace, model_dir: Path, threads: int, cores: int) -> dict[str, Any]:
    """``--sessions``, ``--model-process`` and ``--ndcg`` for one model directory (SciFact fragments)."""
    from bench import embed_sessions as es

    emb = LocalEmbedder(model_dir, threads=threads)
    graph = find_graph(model_dir)
    assert graph is not None
    out: dict[str, Any] = {"model_dir": str(model_dir), "product_setting": es.asdict(emb.setting)}
    inp = prepare(emb, "scifact", args.limit, 0)
    lengths = inp.lengths
    best = emb.setting
    if args.sessions:
        plan = plan_batches(lengths, args.batch_tokens)
        feeds = es.feeds_for(inp.seqs, plan, emb._pad_id, emb._feed_token_types)
        settings = es.default_settings(cores)
        rows = es.sweep_sessions(graph, settings, feeds, len(inp.items), inp.tokens, max(1, args.rounds))
        top = max(rows, key=lambda r: r.fragments_per_s)
        best = top.setting
        out["sessions"] = {"fragments": len(inp.items), "tokens": inp.tokens, "batch_tokens": args.batch_tokens,
                           "rows": [es.row_view(r) for r in rows], "best": es.row_view(top),
                           "best_vs_first": round(top.fragments_per_s / rows[0].fragments_per_s, 3)}
    if args.model_process:
        chunk = daemon_call_sizes()[0][0]
        calls = chunk_calls(len(inp.items), chunk)
        by_length = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        sorted_calls = [by_length[i : i + chunk] for i in range(0, len(by_length), chunk)]
        call_feeds = [es.feeds_for(inp.seqs, [[c[i] for i in b] for b in plan_batches([lengths[i] for i in c], 8192)],
                                   emb._pad_id, emb._feed_token_types) for c in calls]
        sorted_feeds = [es.feeds_for(inp.seqs, [c], emb._pad_id, emb._feed_token_types) for c in sorted_calls]
        bare = es.bare_session(graph, best)
        rounds = max(1, args.rounds)
        out["model_process"] = {
            "bare_setting": es.asdict(best), "chunk_fragments": chunk, "tokens": inp.tokens,
            # the chunks as the background indexer took them before (fragment order) and now (like lengths)
            "in_order": {"padded_tokens": padded_tokens(lengths, calls),
                         **es.process_path(model_dir, threads, inp.items, calls, bare, call_feeds, rounds)},
            "length_sorted": {"padded_tokens": padded_tokens(lengths, sorted_calls),
                              **es.process_path(model_dir, threads, inp.items, sorted_calls, bare, sorted_feeds, rounds)},
        }
    if args.ndcg:
        subset = es.scifact_subset(SETS["scifact"], args.ndcg)
        got = es.ndcg_of(emb, subset, fragments)
        out["ndcg"] = {k: v for k, v in got.items() if k != "vectors"}
        out["_vectors"] = got["vectors"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, action="append",
                    help="a model directory (repeatable with --skip-main: each gets --sessions/--model-process/--ndcg)")
    ap.add_argument("--set", choices=["scifact", "xquad-zh", "both"], default="both", dest="which")
    ap.add_argument("--limit", type=int, default=300, help="fragments per set (default 300)")
    cores = os.cpu_count() or 1
    ap.add_argument("--threads", type=int, default=min(4, cores),
                    help="local_threads for the main comparison (default: the product's, min(4, cores))")
    ap.add_argument("--batch-tokens", type=int, default=8192, help="batch token budget (the product's default)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per side and setting (median counts)")
    ap.add_argument("--threads-sweep", action="store_true", help="also local_threads 1, 2 and the core count")
    ap.add_argument("--batch-sweep", action="store_true", help="also --budgets and the daemon's call sizes")
    ap.add_argument("--budgets", default=DEFAULT_BUDGETS, help=f"batch token budgets to sweep ({DEFAULT_BUDGETS})")
    ap.add_argument("--naive-batch", type=int, default=32)
    ap.add_argument("--query-count", type=int, default=50)
    ap.add_argument("--sessions", action="store_true", help="bare session settings sweep (SciFact fragments)")
    ap.add_argument("--model-process", action="store_true", help="the daemon's path vs the best bare setting")
    ap.add_argument("--ndcg", type=int, default=0, help="SciFact-subset nDCG@10 over this many documents")
    ap.add_argument("--skip-main", action="store_true", help="only --sessions / --model-process / --ndcg")
    args = ap.parse_args()
    dirs = args.model_dir or [SHARED / "models" / "all-MiniLM-L6-v2-onnx"]
    args.model_dir = dirs[0]
    if args.skip_main:
        t0, load0 = time.perf_counter(), os.getloadavg()[0]
        cores = os.cpu_count() or 1
        runs = [extras(args, d, max(1, min(args.threads, cores)), cores) for d in dirs]
        vecs = [r.pop("_vectors", None) for r in runs]
        report: dict[str, Any] = {"cores": cores, "threads": args.threads, "rounds": args.rounds, "models": runs}
        if len(vecs) > 1 and vecs[0] is not None and vecs[1] is not None:
            cos = np.sum(vecs[0] * vecs[1], axis=1)
            report["vector_agreement_first_two"] = {"mean_cosine": round(float(np.mean(cos)), 4),
                                                    "min_cosine": round(float(np.min(cos)), 4)}
        report["load_average_before_after"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
        report["wall_seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(report, indent=2))
        return
    threads = max(1, min(args.threads, cores))
    rounds = max(1, args.rounds)
    names = list(SETS) if args.which == "both" else [args.which]
    started = time.perf_counter()
    load_before = os.getloadavg()

    emb, bare, load_s = load(args.model_dir, threads)
    # Thread sweep: one product embedder and one bare session per thread count, all loaded at
    # once so their rounds interleave (EmbeddingGemma fp32: about 1.2 GB per session).
    by_threads = {threads: (emb, bare)}
    if args.threads_sweep:
        for t in sweep_threads(cores):
            if t not in by_threads:
                by_threads[t] = load(args.model_dir, t)[:2]
    budgets = sorted({int(b) for b in args.budgets.split(",") if b.strip()} - {args.batch_tokens})
    inputs = {name: prepare(emb, name, args.limit, args.query_count) for name in names}
    sets: dict[str, dict[str, Any]] = {}
    for name, inp in inputs.items():
        main_run = Paired(emb, bare, inp, budget_calls(inp.lengths, args.batch_tokens), args.batch_tokens)
        settings: list[tuple[dict[str, Any], Paired]] = [({"batch_tokens": args.batch_tokens}, main_run)]
        if args.batch_sweep:
            for budget in budgets:
                settings.append(({"batch_tokens": budget}, Paired(emb, bare, inp, budget_calls(inp.lengths, budget), budget)))
            for chunk, who in daemon_call_sizes():
                calls = chunk_calls(len(inp.items), chunk)
                label = {"calls_of_fragments": chunk, "as_in": who, "batch_tokens": args.batch_tokens}
                settings.append((label, Paired(emb, bare, inp, calls, args.batch_tokens)))
        if args.threads_sweep:
            for t, (t_emb, t_bare) in sorted(by_threads.items()):
                if t != threads:
                    calls = budget_calls(inp.lengths, args.batch_tokens)
                    settings.append(({"threads": t}, Paired(t_emb, t_bare, inp, calls, args.batch_tokens)))
        run_rounds([p for _, p in settings], rounds)
        results = [(label, p.result()) for label, p in settings]
        res: dict[str, Any] = {**describe(inp, emb), "batch_tokens": args.batch_tokens, **results[0][1]}
        res["bucketed_vs_naive"] = naive_vs_bucketed(emb, inp, args.batch_tokens, args.naive_batch, rounds)
        if args.batch_sweep:
            sweep = [{"batch_tokens": args.batch_tokens, **results[0][1]}]
            sweep += [{**label, **r} for label, r in results if "threads" not in label][1:]
            res["batch_sweep"] = sorted(sweep, key=lambda r: (r.get("calls_of_fragments", 0), r["batch_tokens"]))
        if args.threads_sweep:
            rows = [{"threads": threads, **results[0][1]}] + [{**label, **r} for label, r in results if "threads" in label]
            rows.sort(key=lambda r: r["threads"])
            one = rows[0]
            for row in rows:
                row["product_speedup_vs_1"] = round(row["product"]["tokens_per_s"] / one["product"]["tokens_per_s"], 2)
                row["bare_speedup_vs_1"] = round(row["bare"]["tokens_per_s"] / one["bare"]["tokens_per_s"], 2)
            res["threads_sweep"] = rows
        res["query_latency_ms"] = query_latency(emb, inp.queries)
        sets[name] = res

    ratios = [sets[n]["ratio"] for n in names]
    print(json.dumps({
        "model_dir": str(args.model_dir),
        "identity": emb.identity[:16],
        "dimensions": emb.dimensions,
        "max_tokens": emb.max_tokens,
        "cores": cores,
        "threads": threads,
        "rounds": rounds,
        "nice": os.nice(0),
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "load_seconds": round(load_s, 3),
        "sets": sets,
        "product_vs_bare": {
            "target_ratio": TARGET_RATIO,
            "min_ratio": min(ratios),
            "min_cpu_ratio": min(sets[n]["cpu_ratio"] for n in names),
            "meets_target": min(ratios) >= TARGET_RATIO,
        },
        "vector_search_10000x768_top100_ms": vector_search(),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }, indent=2))


if __name__ == "__main__":
    main()
