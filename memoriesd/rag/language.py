"""Which writing system a vault is mostly in, and whether its embedding model reads it.

A model that cannot read a vault's language still returns vectors, and hybrid search fuses them:
with English-only all-MiniLM-L6-v2 on Chinese command pages, hybrid ranks ``unzip.md`` 4th where
BM25 alone ranks it 1st. So when a vault's text is mostly in a script its model does not cover,
the default search mode stays bm25 for that vault and ``rag status`` and searches say why
(:func:`memoriesd.rag.search._default_mode`).

- **The vault's script**: the share of each script (Han, Kana, Hangul, Cyrillic, Latin, Greek,
  Arabic, Hebrew, Devanagari, Thai) in a sample of its indexed prose, counted in words (characters
  for scripts written without spaces), code and URLs left out (:func:`script_shares`); the vault
  "is in" a script holding at least :data:`MAJORITY` of it. Kana with Han is Japanese: both count as Kana.
- **The model's scripts**: the profile's ``scripts`` when it names them (EmbeddingGemma: all;
  models known by name: :data:`memoriesd.embed.profile.KNOWN_MODELS`); otherwise measured once per model and process
  (:func:`reads_script`): a model that cannot read a script maps unrelated sentences of it to
  near-identical vectors, so their mean pairwise cosine stays high where a reading model spreads
  them out as it spreads unrelated English sentences.
"""

from __future__ import annotations

import math
import re
import threading
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..embed.profile import declared_scripts

if TYPE_CHECKING:
    from ..embed.service import EmbeddingService
    from ..embed.types import Embedder
    from ..index.caches import VaultIndex
    from ..vault.store import VaultStore

#: A script holding at least this share of a vault's letters is the vault's script.
MAJORITY = 0.6
#: Letters sampled from a vault's text (its fragments, evenly spread).
SAMPLE_FRAGMENTS = 400
SAMPLE_CHARS = 600
#: A model reads a script when unrelated sentences in it are spread at least this much like English
#: ones: mean pairwise cosine of the script's sentences <= English's + READ_MARGIN.
READ_MARGIN = 0.25

ALL = "*"

_RANGES: tuple[tuple[int, int, str], ...] = (
    (0x0041, 0x024F, "Latin"),
    (0x1E00, 0x1EFF, "Latin"),
    (0x0370, 0x03FF, "Greek"),
    (0x0400, 0x052F, "Cyrillic"),
    (0x0590, 0x05FF, "Hebrew"),
    (0x0600, 0x06FF, "Arabic"),
    (0x0900, 0x097F, "Devanagari"),
    (0x0E00, 0x0E7F, "Thai"),
    (0x1100, 0x11FF, "Hangul"),
    (0x3040, 0x30FF, "Kana"),
    (0x3400, 0x4DBF, "Han"),
    (0x4E00, 0x9FFF, "Han"),
    (0xAC00, 0xD7AF, "Hangul"),
    (0xF900, 0xFAFF, "Han"),
    (0x20000, 0x3FFFF, "Han"),
)

# Unrelated sentences per script (a model that reads the script spreads them apart).
_SAMPLES: dict[str, tuple[str, ...]] = {
    "Latin": (
        "The train to the coast leaves at seven.",
        "Add two cups of flour and stir slowly.",
        "The court rejected the appeal on Monday.",
        "My cat sleeps on the warm windowsill.",
        "Compile the project with optimisations turned on.",
        "Heavy rain flooded the village fields.",
    ),
    "Han": (
        "去海边的火车七点出发。",
        "加入两杯面粉慢慢搅拌。",
        "法院周一驳回了上诉。",
        "我的猫睡在温暖的窗台上。",
        "开启优化选项编译这个项目。",
        "大雨淹没了村庄的田地。",
    ),
    "Kana": (
        "海に行く電車は七時に出ます。",
        "小麦粉を二杯入れてゆっくり混ぜます。",
        "裁判所は月曜日に控訴を棄却した。",
        "猫は暖かい窓辺で眠っている。",
        "最適化を有効にしてビルドしてください。",
        "大雨で村の畑が水に浸かった。",
    ),
    "Hangul": (
        "해변으로 가는 기차는 일곱 시에 출발합니다.",
        "밀가루 두 컵을 넣고 천천히 저으세요.",
        "법원은 월요일에 항소를 기각했다.",
        "고양이가 따뜻한 창가에서 잔다.",
        "최적화를 켜고 프로젝트를 컴파일하세요.",
        "폭우로 마을의 밭이 물에 잠겼다.",
    ),
    "Cyrillic": (
        "Поезд к морю отправляется в семь.",
        "Добавьте две чашки муки и медленно мешайте.",
        "Суд отклонил апелляцию в понедельник.",
        "Моя кошка спит на тёплом подоконнике.",
        "Соберите проект с включённой оптимизацией.",
        "Ливень затопил поля деревни.",
    ),
}


def script_of(ch: str) -> str | None:
    """The script of one letter (None: not a letter, or a script not listed)."""
    if not ch.isalpha():
        return None
    cp = ord(ch)
    for lo, hi, name in _RANGES:
        if lo <= cp <= hi:
            return name
    return "other" if unicodedata.category(ch).startswith("L") else None


#: Not language: fenced code, inline code and URLs (a Chinese command page is mostly Latin letters in its code).
_NOT_PROSE = re.compile(r"```.*?(?:```|$)|~~~.*?(?:~~~|$)|`[^`\n]*`|<?https?://\S+|\{\{.*?\}\}", re.S)
#: Scripts written without spaces: each character is a unit; in the others each word (a run of letters) is.
_PER_CHARACTER = frozenset({"Han", "Kana", "Thai"})


def _units(text: str) -> Counter[str]:
    """Words of each script in ``text`` (characters for Han, Kana and Thai), code and URLs left out."""
    counts: Counter[str] = Counter()
    prev: str | None = None
    for ch in _NOT_PROSE.sub(" ", text):
        script = script_of(ch)
        if script is not None and (script in _PER_CHARACTER or script != prev):
            counts[script] += 1
        prev = script
    return counts


def script_shares(texts: Iterable[str]) -> dict[str, float]:
    """Each script's share of the prose of ``texts``, counted in words (characters for scripts written
    without spaces); Han counts as Kana where Kana is present (Japanese); {} without letters."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(_units(text))
    if counts["Kana"] and counts["Han"] and counts["Kana"] >= 0.1 * counts["Han"]:
        counts["Kana"] += counts.pop("Han")
    total = sum(counts.values())
    return {k: round(v / total, 4) for k, v in counts.most_common() if v} if total else {}


def dominant(shares: dict[str, float]) -> tuple[str, float] | None:
    """The script holding :data:`MAJORITY` of the letters, with its share; None when mixed."""
    if not shares:
        return None
    name, share = max(shares.items(), key=lambda kv: kv[1])
    return (name, share) if share >= MAJORITY else None


def reads_script(embed_documents: Callable[[list[str]], np.ndarray], script: str) -> bool | None:
    """Whether a model spreads unrelated sentences of ``script`` apart as it does English ones
    (None: no sample sentences for that script)."""
    if script == "Latin":
        return True
    sample = _SAMPLES.get(script)
    if sample is None:
        return None
    vecs = np.asarray(embed_documents([*_SAMPLES["Latin"], *sample]), dtype=np.float32)
    n = len(_SAMPLES["Latin"])
    return _mean_pairwise(vecs[n:]) <= _mean_pairwise(vecs[:n]) + READ_MARGIN


def _mean_pairwise(vecs: np.ndarray) -> float:
    sims = vecs @ vecs.T
    k = len(vecs)
    return float((sims.sum() - np.trace(sims)) / (k * (k - 1)))


@dataclass(frozen=True)
class LanguageFit:
    """A vault's script and whether the model reads it (``reads`` None: not known yet)."""

    script: str | None
    share: float
    model: str
    reads: bool | None

    @property
    def mismatch(self) -> bool:
        return self.script is not None and self.reads is False

    def notice(self, mode: str) -> str:
        """What searches and `rag status` say of a mismatch (``mode``: the search's)."""
        what = (
            f"this vault's text is mostly in {self.script} script ({self.share:.0%} of its prose), which the embedding "
            f"model {self.model} does not read"
        )
        if mode == "bm25":
            return (
                f"{what}: it searches bm25 (by words) by default; `--mode hybrid` mixes in the model anyway"
            )
        return f"{what}: its {mode} results may rank worse than `--mode bm25`"

    def as_dict(self) -> dict[str, object]:
        return {"script": self.script, "share": self.share, "model_reads": self.reads}


class LanguageKeeper:
    """What this process knows: each vault's script (by index generation) and each model's reading."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._vaults: dict[str, tuple[object, str | None, float]] = {}
        self._models: dict[tuple[str, str], bool | None] = {}

    def vault_script(
        self, vault_id: str, stamp: object, texts: Callable[[], Iterable[str]]
    ) -> tuple[str | None, float]:
        """The vault's dominant script and share, recomputed when ``stamp`` (e.g. the fragment count
        bucket) changes."""
        with self._lock:
            got = self._vaults.get(vault_id)
        if got is not None and got[0] == stamp:
            return got[1], got[2]
        dom = dominant(script_shares(texts()))
        script, share = dom if dom is not None else (None, 0.0)
        with self._lock:
            self._vaults[vault_id] = (stamp, script, share)
        return script, share

    def known(self, model: str, script: str) -> bool | None:
        with self._lock:
            return self._models.get((model, script))

    def reads(
        self,
        model: str,
        script: str,
        declared: tuple[str, ...] | None,
        measure: Callable[[str], bool | None] | None,
    ) -> bool | None:
        """Whether ``model`` reads ``script``: declared, else measured (once) when ``measure`` is given."""
        if declared is not None:
            return ALL in declared or script in declared
        with self._lock:
            if (model, script) in self._models:
                return self._models[(model, script)]
        if measure is None:
            return None
        result = measure(script)
        with self._lock:
            self._models[(model, script)] = result
        return result


KEEPER = LanguageKeeper()


def _stamp(n: int) -> int:
    """A vault's fragment count in steps of ~25%: its script is sampled again past each step."""
    return int(math.log(n + 1, 1.25))


def fragment_sample(idx: VaultIndex) -> list[str]:
    """Up to :data:`SAMPLE_FRAGMENTS` of the index's fragments (evenly spread), each cut to :data:`SAMPLE_CHARS`."""
    ids = idx.live_frag_ids()
    step = max(1, len(ids) // SAMPLE_FRAGMENTS)
    out = []
    for fid in ids[::step][:SAMPLE_FRAGMENTS]:
        got = idx.get_fragment(fid)
        if got is not None:
            out.append(got[1].text[:SAMPLE_CHARS])
    return out


def vault_fit(
    service: EmbeddingService,
    store: VaultStore,
    idx: VaultIndex | None,
    embedder: Embedder | None,
    *,
    texts: Callable[[], Iterable[str]] | None = None,
    count: int = 0,
) -> LanguageFit | None:
    """The vault's script against its model's (None: no model, no majority script, or Latin, which every
    model reads). The vault's text comes from ``idx`` (else ``texts``, ``count`` records). With ``embedder``
    (loaded) a model its profile says nothing about is measured once; without, only what is known counts."""
    if not service.available():
        return None
    if idx is not None and idx.bm25 is not None:
        n = idx.n_fragments()
        script, share = KEEPER.vault_script(store.vault_id, _stamp(n), lambda: fragment_sample(idx))
    elif texts is not None:
        script, share = KEEPER.vault_script(store.vault_id, ("records", _stamp(count)), texts)
    else:
        return None
    if script is None or script == "Latin":
        return None
    key = service.describe()
    if embedder is not None:
        profile = embedder.profile
        declared = profile.scripts if profile is not None else None
        name = profile.name if profile is not None else key

        def measure(sc: str) -> bool | None:
            return reads_script(lambda t: service.probe(store, embedder, t, queries=False), sc)

        reads = KEEPER.reads(key, script, declared, measure)
    else:
        model_dir = None if service.remote() else service.model_dir()
        declared = declared_scripts(model_dir) if model_dir is not None else None
        name = model_dir.name if model_dir is not None else key
        reads = KEEPER.reads(key, script, declared, None)
    return LanguageFit(script, share, name, reads)


__all__ = [
    "KEEPER",
    "LanguageFit",
    "LanguageKeeper",
    "dominant",
    "fragment_sample",
    "reads_script",
    "script_of",
    "script_shares",
    "vault_fit",
]
