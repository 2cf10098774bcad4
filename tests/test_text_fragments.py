"""Fragments (byte offsets, sizes, overlap, fingerprints) and segmentation, with real jieba."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pytest

from memoriesd.errors import Internal, InvalidParams
from memoriesd.text import segment as seg
from memoriesd.text.fragments import Fragment, fingerprint, split_fragments
from tests.conftest import needs_shared

SHARED = Path(__file__).resolve().parents[2] / "shared"
KEY = b"k" * 32

MIXED = (
    "Memories is local-first. 本地优先的笔记库，加密保存！Emoji 😀👩‍👩‍👧 test? Yes.\n"
    "第二段：中华人民共和国成立了。Ünïcödé naïve café; done!\n\n"
)


@pytest.fixture(scope="module", autouse=True)
def _jieba(tmp_path_factory: pytest.TempPathFactory) -> None:
    seg.configure(tmp_path_factory.mktemp("jieba"))


def _roundtrip(body: str, frags: list[Fragment]) -> None:
    data = body.encode("utf-8")
    for f in frags:
        assert data[f.start : f.end].decode("utf-8") == f.text


def _random_text(rng: random.Random, n: int) -> str:
    pools = [
        "abcdefghij klmnop ",
        "中文文本测试数据库加密笔记",
        "😀🎉👍🏽🇨🇳",
        "。！？；.!? \n,，",
        "éüßøñ",
        "\u0301\u200d",
    ]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(n))


def test_byte_offsets_round_trip_on_mixed_scripts_and_emoji() -> None:
    body = MIXED * 40
    frags = split_fragments("r1", 3, body, KEY)
    assert len(frags) > 3
    _roundtrip(body, frags)
    assert [f.ordinal for f in frags] == list(range(len(frags)))
    assert all(f.record_id == "r1" and f.revision == 3 for f in frags)


def test_byte_offsets_round_trip_on_many_random_strings() -> None:
    rng = random.Random(20240601)
    for _ in range(400):
        body = _random_text(rng, rng.randint(0, 3000))
        size = rng.choice([16, 40, 100, 768])
        frags = split_fragments("r", 1, body, KEY, max_chars=size, overlap=size // 4)
        _roundtrip(body, frags)
        for f in frags:
            assert 0 < len(f.text) <= size
            assert f.text == f.text.strip()
        if body.strip():
            assert frags, "non-blank text must give fragments"
            # Every non-space character of the body is inside some fragment.
            data = body.encode()
            covered = bytearray(len(data))
            for f in frags:
                covered[f.start : f.end] = b"\x01" * (f.end - f.start)
            gaps = bytes(b for b, c in zip(data, covered, strict=True) if not c)
            assert gaps.decode("utf-8", "replace").strip() == ""


def test_fragments_are_at_most_768_characters_and_overlap_about_128() -> None:
    sentence = "The vault keeps notes encrypted at rest and decrypts them only in memory. "
    body = sentence * 60
    frags = split_fragments("r", 1, body, KEY)
    assert len(frags) >= 5
    for a, b in zip(frags, frags[1:], strict=False):
        assert len(a.text) <= 768
        shared = a.end - b.start  # ASCII: bytes == characters
        assert 96 <= shared <= 128
        assert a.text.endswith(".")  # cut after a sentence end


def test_chinese_text_is_cut_after_chinese_sentence_ends() -> None:
    body = "加密的笔记只在内存中解密。" * 200
    frags = split_fragments("r", 1, body, KEY)
    _roundtrip(body, frags)
    assert all(len(f.text) <= 768 for f in frags)
    assert all(f.text.endswith("。") for f in frags[:-1])


def test_text_without_any_break_is_cut_hard_at_the_limit() -> None:
    body = "x" * 2000
    frags = split_fragments("r", 1, body, KEY)
    assert len(frags[0].text) == 768
    _roundtrip(body, frags)


def test_blank_bodies_have_no_fragments() -> None:
    assert split_fragments("r", 1, "", KEY) == []
    assert split_fragments("r", 1, " \n\t\u3000 ", KEY) == []


def test_fingerprints_are_stable_and_depend_on_key_position_and_text() -> None:
    body = MIXED * 10
    a = split_fragments("r", 1, body, KEY)
    b = split_fragments("other", 9, body, KEY)
    assert [f.fingerprint for f in a] == [f.fingerprint for f in b]
    c = split_fragments("r", 1, body, b"another key")
    assert all(x.fingerprint != y.fingerprint for x, y in zip(a, c, strict=True))
    # Fixed vector: the same on every machine and run.
    # HMAC-SHA256(b"key", b"0:5:hello"), first 32 hex digits.
    assert fingerprint(b"key", 0, 5, b"hello") == "e577b98996c2483f68865551f0db8aa7"
    assert fingerprint(b"key", 0, 5, b"hello") != fingerprint(b"key", 1, 6, b"hello")
    f = a[0]
    assert f.fingerprint == fingerprint(KEY, f.start, f.end, f.text.encode())
    assert all(len(x.fingerprint) == 32 and int(x.fingerprint, 16) >= 0 for x in a)


def test_fingerprint_does_not_contain_the_text() -> None:
    frags = split_fragments("r", 1, "secret", KEY)
    assert "secret" not in frags[0].fingerprint
    assert frags[0].fingerprint != fingerprint(b"", frags[0].start, frags[0].end, b"secret")


def test_invalid_sizes_and_lone_surrogates_are_refused_with_one_line() -> None:
    with pytest.raises(InvalidParams):
        split_fragments("r", 1, "text", KEY, max_chars=100, overlap=60)
    with pytest.raises(InvalidParams) as exc:
        split_fragments("r", 1, "bad \ud800 text", KEY)
    assert "\ud800" not in exc.value.message and "\n" not in exc.value.message


@pytest.mark.skipif(not (SHARED / "eval" / "scifact").is_dir(), reason=needs_shared("eval/scifact"))
def test_scifact_abstracts_split_into_fragments() -> None:
    # (How fast is a benchmark's question, not a test's: a stopwatch here failed on a loaded machine.)
    lines = (SHARED / "eval" / "scifact" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    bodies = [json.loads(line)["text"] for line in lines]
    n = sum(len(split_fragments("r", 1, b, KEY)) for b in bodies)
    assert n > len(bodies)


# -- segmentation ---------------------------------------------------------------


def test_chinese_words_and_their_sub_words_are_segmented() -> None:
    out = seg.segment("中华人民共和国成立了").split()
    assert "中华人民共和国" in out and "中华" in out and "共和国" in out


def test_latin_text_is_left_whole_for_the_fts5_tokenizer() -> None:
    assert seg.segment("naïve café, local-first") == "naïve café, local-first"
    assert seg.segment("用Python写代码").split() == ["用", "Python", "写", "代码"]


def test_jieba_on_all_text_is_the_measured_alternative() -> None:
    # jieba splits accented words apart: one reason the default runs it on Han text only.
    assert "caf" in seg.segment("café", han_only=False).split()


def test_query_terms_drop_punctuation_emoji_and_control_characters() -> None:
    assert seg.query_terms('"local-first" title:foo NEAR(a b) a* ^x 😀 \x00y') == [
        "local", "first", "title", "foo", "NEAR", "a", "b", "a", "x", "y",
    ]  # fmt: skip
    assert seg.query_terms("😀 ？！ ...") == []


def test_exact_segmentation_spaces_every_han_character() -> None:
    assert seg.segment_chars("中华ab国").split() == ["中", "华", "ab", "国"]


def test_jieba_cache_is_written_only_to_the_private_directory(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    import jieba

    assert seg.is_configured()
    first = Path(jieba.dt.tmp_dir)
    assert first.resolve() != Path(tempfile.gettempdir()).resolve()
    assert list(first.glob("jieba*.cache")), "the dictionary cache belongs in the private directory"
    seg.configure(tmp_path_factory.mktemp("again"))  # idempotent: no second initialisation
    assert Path(jieba.dt.tmp_dir) == first


def test_segment_refuses_to_run_before_configure() -> None:
    saved = seg._jieba
    seg._jieba = None
    try:
        with pytest.raises(Internal) as exc:
            seg.segment("text")
        assert "configure" in exc.value.message
    finally:
        seg._jieba = saved


def test_last_break_equals_a_full_scan_on_random_text() -> None:
    # The fast path scans only the last 64 characters first; it must cut exactly where a scan of the
    # whole window does, or fragments (and their fingerprints) would change.
    import random

    from memoriesd.text import fragments as fr

    def full_scan(body: str, lo: int, hi: int) -> int | None:
        for pattern in (fr._STRONG, fr._WEAK):
            last = None
            for m in pattern.finditer(body, lo, hi):
                last = m.end()
            if last is not None and last > lo:
                return last
        return None

    rnd = random.Random(11)
    alphabet = list("ab d.!?。！？；\n\"'”’)]」』），、,;:： ") + ["x"] * 8
    for _ in range(4000):
        body = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 900)))
        lo = rnd.randint(0, len(body) - 1)
        hi = rnd.randint(lo, len(body))
        assert fr._last_break(body, lo, hi) == full_scan(body, lo, hi), (body, lo, hi)
