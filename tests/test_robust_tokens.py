"""Text that names a model's control tokens is embedded as text, and no id reaches past the
embedding table (EmbeddingGemma's tokenizer has <image_soft_token> = 262144 on a 262,144-row table)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memoriesd.embed.local import LocalEmbedder

from .tinymodel import make_tiny_model

NASTY = [
    "coffee <image_soft_token> tea",
    "<start_of_turn>user hello <end_of_turn>",
    "<pad> <eos> <bos> <unk>",
    "   \n\t  ",
    "😀🎉🚀" * 20,
    "coffee " * 4000,
]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> LocalEmbedder:
    model = tmp_path_factory.mktemp("m") / "tiny"
    make_tiny_model(model, seed=4, beyond_table=("<image_soft_token>", "<start_of_turn>", "<end_of_turn>"))
    return LocalEmbedder(model, threads=1)


def test_a_token_past_the_embedding_table_never_reaches_the_graph(embedder: LocalEmbedder) -> None:
    rows = embedder._table_rows
    assert rows is not None
    for text in NASTY:
        assert all(0 <= i < rows for i in embedder.token_ids(text)), text


def test_every_hostile_fragment_and_query_embeds_to_a_unit_vector(embedder: LocalEmbedder) -> None:
    docs = embedder.embed_documents([(None, t) for t in NASTY])
    assert docs.shape == (len(NASTY), embedder.dimensions)
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-3)
    queries = embedder.embed_queries(["<image_soft_token><start_of_turn><pad><eos>", *NASTY])
    assert np.all(np.isfinite(queries))


def test_control_token_text_in_a_note_is_read_as_text(embedder: LocalEmbedder) -> None:
    # "<eos>" written in a note is not the end-of-sequence token: only the wrapping BOS/EOS are.
    ids = embedder.token_ids("before <eos> after")
    assert ids[0] == 2 and ids[-1] == 1 and 1 not in ids[1:-1]


def test_a_graph_failure_is_a_model_error_not_a_crash(embedder: LocalEmbedder, tmp_path: Path) -> None:
    from memoriesd.errors import InvalidModelOutput

    with pytest.raises(InvalidModelOutput):
        embedder._run([[10**9]])  # an id no table has: the runtime's own error is translated


def _model_that_fails_on(word: str, root: Path) -> Path:
    """A tiny model whose tokenizer maps ``word`` past the embedding table while config.json claims
    a larger table: the id guard cannot know, so the graph itself fails on that one fragment."""
    import json

    model = root / "failing"
    make_tiny_model(model, seed=6)
    tok = json.loads((model / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab[word] = max(vocab.values()) + 50
    (model / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((model / "config.json").read_text())
    cfg["vocab_size"] = cfg["vocab_size"] + 1000
    (model / "config.json").write_text(json.dumps(cfg))
    return model


@pytest.mark.parametrize("background", [False, True])
def test_a_fragment_the_model_cannot_embed_is_skipped_and_costs_the_vault_nothing(tmp_path: Path, background: bool) -> None:
    import time

    from .conftest import cli_json, create_vault, running_daemon

    model = _model_that_fails_on("zzcrash", tmp_path)
    cfg = f'[embedding.local]\nmodel_dir = "{model}"\n[index]\nbackground = {"true" if background else "false"}\n'
    with running_daemon(cfg) as d:
        vid = create_vault(d)
        for i in range(40):
            d.call("memory.add", {"vault": vid, "title": f"n{i}", "body": f"coffee tea mountain w{i:03d}"})
        bad = d.call("memory.add", {"vault": vid, "title": "bad", "body": "coffee zzcrash tea"})["id"]
        if background:
            deadline = time.monotonic() + 30
            while d.call("rag.status", {"vault": vid})["embedding"].get("state") != "done" and time.monotonic() < deadline:
                time.sleep(0.05)
        else:
            out = cli_json(d.home, "rag", "index", vid)
            assert out["embedded"] == 40
        emb = d.call("rag.status", {"vault": vid})["embedding"]
        assert emb["skipped"] == 1 and emb["embedded"] == 40 and emb["total"] == 41
        # Every later search works; the skipped note is still found by bm25.
        for mode in ("vector", "hybrid"):
            assert d.call("rag.search", {"vault": vid, "query": "coffee tea", "mode": mode})["results"]
        hits = d.call("rag.search", {"vault": vid, "query": "zzcrash", "mode": "bm25"})["results"]
        assert [h["record_id"] for h in hits] == [bad]
        # A query the model cannot read: hybrid answers from bm25 alone and says so.
        res = d.call("rag.search", {"vault": vid, "query": "zzcrash", "mode": "hybrid"})
        assert [h["record_id"] for h in res["results"]] == [bad] and any("lexical" in n for n in res["notices"])
        assert "zzcrash" not in d.log_text()  # the log never holds the text


def test_what_the_embedder_reads_no_file_name_title_and_no_repeated_h1() -> None:
    from memoriesd.index.docs import IndexedDoc, embed_input
    from memoriesd.text.fragments import Fragment

    def doc(title: str, source: str | None, kind: str = "card") -> IndexedDoc:
        return IndexedDoc("r", 1, kind, title, "", source, ())

    def frag(text: str, start: int = 0) -> Fragment:
        return Fragment("r", 1, 0, start, start + len(text.encode()), text, "f")

    # A title that is only the file name: the model card's "title: none".
    assert embed_input(doc("d000123", "sub/d000123.md"), frag("some text")) == (None, "some text")
    # A title from the H1: kept in the prompt, the H1 line not repeated in the first fragment.
    assert embed_input(doc("Backups", "notes/b.md"), frag("# Backups\n\nWe copy nightly.")) == ("Backups", "We copy nightly.")
    # Also when the H1 equals the file name (it is a real heading), and after front matter.
    assert embed_input(doc("todo", "a/todo.md"), frag("---\ntags: [x]\n---\n# todo\nbuy milk")) == ("todo", "---\ntags: [x]\n---\nbuy milk")
    # Later fragments and titles from elsewhere are unchanged; an untitled note has no title.
    assert embed_input(doc("Backups", "notes/b.md"), frag("# Backups again", start=700)) == ("Backups", "# Backups again")
    assert embed_input(doc("Ops", None, kind="memory"), frag("rotate keys")) == ("Ops", "rotate keys")
    assert embed_input(doc("", None, kind="memory"), frag("x")) == (None, "x")
