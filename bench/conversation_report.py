"""The tables of a conversation-recall run: averages per (mode, variant) and paired sign tests.

Made from the per-question rows of :func:`bench.eval_conversations.score_rows`, per conversation
file and over all files (every question counts once: a micro-average, as the issue's table). The
sign test pairs a variant's rows with the reference's by ``(file, question index)`` in the same
mode: a *win* is a question the variant gets (1) and the reference misses (0), a *loss* the other
way round, ties are dropped, and ``p`` is the exact two-sided binomial probability of a split at
least that uneven when both are equally likely (:func:`sign_test`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from bench.eval_conversations import QuestionRow

MULTI_HOP = "multi-hop"  # LoCoMo category 1

#: One column of the table: its header, the metric and which questions it averages over.
Column = tuple[str, str, Callable[[QuestionRow], bool]]


def _every(_r: QuestionRow) -> bool:
    return True


def _multi_hop(r: QuestionRow) -> bool:
    return r.category == MULTI_HOP


def columns(budget: int) -> list[Column]:
    """The issue's columns; the pack column is split in two for the sign test (see :func:`figure_cells`)."""
    return [
        ("some evidence turn @5", "recall_any@5", _every),
        ("@10", "recall_any@10", _every),
        ("every evidence turn @10", "recall_all@10", _every),
        (f"{budget:,}-token pack: some", "pack_any", _every),
        (f"{budget:,}-token pack: every", "pack_all", _every),
        ("multi-hop, some @10", "recall_any@10", _multi_hop),
        ("multi-hop, every @10", "recall_all@10", _multi_hop),
    ]


@dataclass
class Run:
    """Everything one run measured: the rows of every (variant, mode), the files' capture and each
    variant's embedding cost. ``variants`` is in run order; the first one is the reference."""

    budget: int
    modes: list[str]
    variants: list[str]
    rows: dict[tuple[str, str], list[QuestionRow]] = field(default_factory=dict)  # (variant, mode) -> rows
    turns: dict[str, int] = field(default_factory=dict)  # file -> captured turns
    capture_seconds: dict[str, float] = field(default_factory=dict)  # file -> seconds
    embed_seconds: dict[tuple[str, str], float] = field(default_factory=dict)  # (variant, file) -> seconds
    embedded: dict[tuple[str, str], int] = field(default_factory=dict)  # (variant, file) -> vectors made

    @property
    def files(self) -> list[str]:
        return list(self.turns)


@dataclass(frozen=True)
class Paired:
    """A variant against the reference on one metric: questions it wins and loses, and the sign test."""

    wins: int
    losses: int
    p: float


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided binomial sign test: the chance of a split at least as uneven as ``wins`` to
    ``losses`` when each non-tied question is a fair coin (ties are left out before calling)."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(
    ref: Iterable[QuestionRow],
    var: Iterable[QuestionRow],
    metric: str,
    keep: Callable[[QuestionRow], bool] = _every,
) -> Paired:
    """Wins and losses of ``var`` over ``ref`` on the questions both answered (paired by file and index)."""
    base = {(r.file, r.index): r.scores[metric] for r in ref if keep(r)}
    wins = losses = 0
    for r in var:
        if not keep(r) or (r.file, r.index) not in base:
            continue
        diff = r.scores[metric] - base[(r.file, r.index)]
        wins += diff > 0
        losses += diff < 0
    return Paired(wins, losses, sign_test(wins, losses))


def _mean(rows: list[QuestionRow], metric: str, keep: Callable[[QuestionRow], bool]) -> float | None:
    kept = [r.scores[metric] for r in rows if keep(r)]
    return statistics.fmean(kept) if kept else None


def _fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _of(rows: list[QuestionRow], file: str | None) -> list[QuestionRow]:
    return rows if file is None else [r for r in rows if r.file == file]


def figures(run: Run, variant: str, mode: str, file: str | None) -> dict[str, float | int | None]:
    """The row of the table as numbers (``--json``): each column, counts, latency, costs."""
    rows = _of(run.rows.get((variant, mode), []), file)
    files = run.files if file is None else [file]
    turns = sum(run.turns[f] for f in files)
    out: dict[str, float | int | None] = {}
    for header, metric, keep in columns(run.budget):
        out[header] = _mean(rows, metric, keep)
    out["questions"] = len(rows)
    out["multi-hop questions"] = sum(1 for r in rows if _multi_hop(r))
    out["rag search p50 ms"] = statistics.median(r.search_ms for r in rows) if rows else None
    out["mean pack tokens"] = statistics.fmean(r.pack_tokens for r in rows) if rows else None
    seconds = [run.embed_seconds[(variant, f)] for f in files if (variant, f) in run.embed_seconds]
    out["embedding s/turn"] = sum(seconds) / turns if seconds and turns else None
    out["vectors made"] = sum(run.embedded.get((variant, f), 0) for f in files) if seconds else None
    return out


def _table_rows(run: Run, file: str | None) -> list[str]:
    cols = columns(run.budget)
    head = [
        "mode, variant",
        cols[0][0],
        cols[1][0],
        cols[2][0],
        f"{run.budget:,}-token pack: some / every",
        cols[5][0],
        cols[6][0],
        "questions (multi-hop)",
        "rag search p50 ms",
        "capture / embedding s/turn",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    files = run.files if file is None else [file]
    turns = sum(run.turns[f] for f in files)
    capture = (
        _fmt(sum(run.capture_seconds[f] for f in files) / turns, 4) if turns else "—"
    )  # once, by the reference
    for mode in run.modes:
        for variant in run.variants:
            f = figures(run, variant, mode, file)
            vals = [f[c[0]] for c in cols]
            assert all(v is None or isinstance(v, float) for v in vals)
            cells = [
                f"{mode}, {variant}",
                _fmt(vals[0]),
                _fmt(vals[1]),
                _fmt(vals[2]),
                f"{_fmt(vals[3])} / {_fmt(vals[4])}",
                _fmt(vals[5]),
                _fmt(vals[6]),
                f"{f['questions']} ({f['multi-hop questions']})",
                _fmt(f["rag search p50 ms"], 1),
                f"{capture if variant == run.variants[0] else '(same)'} / {_fmt(f['embedding s/turn'], 4)}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def sign_tests(run: Run, file: str | None) -> dict[tuple[str, str], dict[str, Paired]]:
    """(mode, variant) -> column header -> :class:`Paired`, for every variant after the reference."""
    ref = run.variants[0]
    out: dict[tuple[str, str], dict[str, Paired]] = {}
    for mode in run.modes:
        base = _of(run.rows.get((ref, mode), []), file)
        for variant in run.variants[1:]:
            rows = _of(run.rows.get((variant, mode), []), file)
            out[(mode, variant)] = {
                h: paired(base, rows, metric, keep) for h, metric, keep in columns(run.budget)
            }
    return out


def _sign_rows(run: Run, file: str | None) -> list[str]:
    cols = columns(run.budget)
    head = ["mode, variant", *[c[0] for c in cols]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (mode, variant), by_col in sign_tests(run, file).items():
        cells = [f"{mode}, {variant}"]
        for header, _m, _k in cols:
            pr = by_col[header]
            cells.append(f"+{pr.wins} / −{pr.losses}, p={pr.p:.3g}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _capture_line(run: Run, files: list[str]) -> str:
    turns = sum(run.turns[f] for f in files)
    seconds = sum(run.capture_seconds[f] for f in files)
    per = f"{seconds / turns:.4f}" if turns else "—"
    return f"{turns} turns captured in {seconds:.1f} s ({per} s/turn)"


def markdown(run: Run) -> str:
    """The report: one section per file and one over all files, each a table of figures and (with
    more than one variant) a table of sign tests against the reference."""
    out: list[str] = []
    sections: list[tuple[str, str | None, list[str]]] = [(f"`{f}`", f, [f]) for f in run.files]
    if len(run.files) > 1:
        sections.append((f"all {len(run.files)} files", None, run.files))
    for title, file, files in sections:
        out.append(f"### {title}: {_capture_line(run, files)}")
        out.append("")
        out.extend(_table_rows(run, file))
        if len(run.variants) > 1:
            out.append("")
            out.append(
                f"Against `{run.variants[0]}` (questions the variant wins / loses, ties dropped; "
                "exact two-sided sign test):"
            )
            out.append("")
            out.extend(_sign_rows(run, file))
        out.append("")
    return "\n".join(out)


def as_json(run: Run) -> dict[str, object]:
    """The same figures as data, with the per-question rows (for a later, finer comparison)."""
    scopes: list[tuple[str, str | None]] = [(f, f) for f in run.files] + [("all", None)]
    return {
        "budget": run.budget,
        "modes": run.modes,
        "variants": run.variants,
        "reference": run.variants[0],
        "files": {
            f: {"turns": run.turns[f], "capture_seconds": round(run.capture_seconds[f], 3)} for f in run.files
        },
        "figures": {
            name: {
                f"{mode}, {variant}": figures(run, variant, mode, file)
                for mode in run.modes
                for variant in run.variants
            }
            for name, file in scopes
        },
        "sign_tests": {
            name: {
                f"{mode}, {variant}": {h: vars(p) for h, p in cols.items()}
                for (mode, variant), cols in sign_tests(run, file).items()
            }
            for name, file in scopes
        },
        "rows": [
            {"variant": variant, "mode": mode, **vars(r)}
            for (variant, mode), rows in run.rows.items()
            for r in rows
        ],
    }
