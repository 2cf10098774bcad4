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
