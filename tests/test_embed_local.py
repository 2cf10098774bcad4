"""The local ONNX embedder, run through real onnxruntime on a generated tiny model and,
when ../shared is present, on the real all-MiniLM-L6-v2 export."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memoriesd.config import LocalModelConfig
from memoriesd.embed import GEMMA_PROFILE, LocalEmbedder, format_document, format_query, plan_batches
from memoriesd.errors import ModelUnavailable
from tests.conftest import needs_shared
from tests.tinymodel import check_graph, make_tiny_model

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared"
MINILM = SHARED / "models" / "all-MiniLM-L6-v2-onnx"
BOS, EOS = 2, 1


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    made = {
        "gemma": make_tiny_model(root / "gemma"),
        "gemma_nopost": make_tiny_model(root / "gemma_nopost", post_processor=False),
        "gemma_seed1": make_tiny_model(root / "gemma_seed1", seed=1),
        "minilm": make_tiny_model(root / "minilm", layout="minilm"),
        "broken": make_tiny_model(root / "broken", normalize=False),
    }
    return {name: root / name for name in made}


@pytest.fixture(scope="module")
def gemma(models: dict[str, Path]) -> LocalEmbedder:
    return LocalEmbedder(models["gemma"], threads=2)


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


DOCS: list[tuple[str | None, str]] = [
    ("pets", "the cat and the kitten sleep on the bowl"),
    (None, "python code with a bug in the compiler"),
    ("coffee", "espresso latte milk sugar cup " * 12),
    ("music", "piano guitar"),
    (None, "the ocean wave and the beach sand " * 30),
    ("money", "bank loan interest rate"),
    (None, "x"),
]


def test_tiny_model_is_a_valid_onnx_graph_with_deterministic_bytes(tmp_path: Path) -> None:
    info = make_tiny_model(tmp_path / "a", seed=7)
    assert set(info) == {"onnx/model_q4.onnx", "onnx/model_q4.onnx_data", "tokenizer.json",
                         "tokenizer_config.json", "config.json", "special_tokens_map.json"}
    check_graph(tmp_path / "a" / "onnx" / "model_q4.onnx")
    code = (f"import json; from tests.tinymodel import make_tiny_model; "
            f"print(json.dumps(make_tiny_model(__import__('pathlib').Path({str(tmp_path / 'b')!r}), seed=7)))")
    other = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      check=True, cwd=REPO).stdout)
    assert other == info  # same bytes in another process (another hash seed)
    assert make_tiny_model(tmp_path / "c", seed=8)["onnx/model_q4.onnx_data"] != info["onnx/model_q4.onnx_data"]
    assert all(entry["size"] == (tmp_path / "a" / rel).stat().st_size for rel, entry in info.items())


def test_embeddings_have_the_model_shape_and_unit_norm(gemma: LocalEmbedder) -> None:
    docs = gemma.embed_documents(DOCS)
    queries = gemma.embed_queries(["cat", "the bank rate", ""])
    assert docs.shape == (len(DOCS), 32) and docs.dtype == np.float32
    assert queries.shape == (3, 32) and queries.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(queries, axis=1), 1.0, atol=1e-5)
    assert gemma.embed_documents([]).shape == (0, 32)


def test_batched_and_single_embeddings_agree_and_keep_input_order(gemma: LocalEmbedder) -> None:
    seen: list[int] = []
    batched = gemma.embed_documents(DOCS, batch_tokens=64, on_batch=seen.append)
    assert len(seen) > 2 and seen[-1] == len(DOCS) and seen == sorted(seen)
    for i, item in enumerate(DOCS):
        single = gemma.embed_documents([item])[0]
        assert cos(single, batched[i]) > 0.9999


def test_related_texts_score_above_unrelated_ones(gemma: LocalEmbedder) -> None:
    q = gemma.embed_queries(["cat kitten pet"])[0]
    docs = gemma.embed_documents([("pets", "my cat and her kitten are pets"), ("money", "bank loan and tax budget")])
    assert q @ docs[0] > q @ docs[1] + 0.2


def test_on_batch_may_raise_to_cancel(gemma: LocalEmbedder) -> None:
    class Stop(Exception):
        pass

    def stop(done: int) -> None:
        raise Stop

    with pytest.raises(Stop):
        gemma.embed_documents(DOCS, batch_tokens=32, on_batch=stop)


def test_batches_group_similar_lengths_under_the_token_cap() -> None:
    lengths = [5, 300, 7, 120, 6, 118, 299, 1, 2000]
    batches = plan_batches(lengths, 600)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 600
    assert batches[0] == [8]  # an over-long item gets a batch of its own
    assert {1, 6} in [set(b) for b in batches]  # 300 and 299 together


def test_gemma_sequences_are_wrapped_bos_eos_by_the_tokenizer_or_by_the_embedder(
    models: dict[str, Path], gemma: LocalEmbedder
) -> None:
    ids = gemma.token_ids("cat dog")
    assert ids[0] == BOS and ids[-1] == EOS and len(ids) == 4
    manual = LocalEmbedder(models["gemma_nopost"], threads=1)
    assert manual.token_ids("cat dog") == ids
    np.testing.assert_allclose(manual.embed_documents(DOCS), gemma.embed_documents(DOCS), atol=1e-6)
    assert manual.identity != gemma.identity  # another tokenizer file


@pytest.mark.parametrize("variant", ["gemma", "gemma_nopost"])
def test_truncation_to_max_tokens_keeps_bos_first_and_eos_last(models: dict[str, Path], variant: str) -> None:
    emb = LocalEmbedder(models[variant], threads=1, max_tokens=8)
    ids = emb.token_ids("cat " * 50)
    assert len(ids) == 8 and ids[0] == BOS and ids[-1] == EOS
    assert emb.max_tokens == 8 == emb.count_tokens("dog " * 50)
    assert emb.profile.max_tokens == 8


def test_gemma_profile_is_recognised_with_its_prompts_and_rag_max_tokens_is_capped(
    models: dict[str, Path], gemma: LocalEmbedder
) -> None:
    assert gemma.is_gemma
    assert gemma.profile.query_prompt == GEMMA_PROFILE.query_prompt == "task: search result | query: "
    assert gemma.profile.document_prompt == "title: {title} | text: {text}"
    assert gemma.profile.max_tokens == 2048 and gemma.dimensions == 32  # width from the graph
    assert format_document(gemma.profile, None, "body {text}") == "title: none | text: body {text}"
    assert format_document(gemma.profile, "T {title}", "b") == "title: T {title} | text: b"
    assert format_query(gemma.profile, "q") == "task: search result | query: q"
    capped = LocalEmbedder(models["gemma"], threads=1, max_tokens=1_000_000)
    assert capped.profile.max_tokens == 2048
    # [embedding.local] overrides are for other models: Gemma keeps its built-in prompts.
    ov = LocalEmbedder(models["gemma"], threads=1, overrides=LocalModelConfig(query_prompt="q: "))
    assert ov.profile.query_prompt == GEMMA_PROFILE.query_prompt and ov.identity == gemma.identity


def test_other_models_get_inferred_profiles_and_override_the_tokenizer_files_padding(
    models: dict[str, Path], tmp_path: Path
) -> None:
    emb = LocalEmbedder(models["minilm"], threads=1)
    assert not emb.is_gemma
    assert emb.profile.max_tokens == 64  # sentence_bert_config.json, not the file's baked-in 16
    assert emb.profile.query_prompt == "" and emb.profile.document_prompt is None
    assert len(emb.token_ids("cat")) == 3  # the file's fixed padding to 16 is not applied
    assert len(emb.token_ids("cat " * 40)) == 42  # nor its truncation to 16
    assert format_document(emb.profile, "Title", "body") == "Title\nbody"
    assert format_document(emb.profile, None, "body") == "body"
    # Without sentence_bert_config.json: config.json max_position_embeddings; graph in onnx/model.onnx.
    other = tmp_path / "plain"
    (other / "onnx").mkdir(parents=True)
    for name in ("model.onnx", "model.onnx_data"):
        shutil.copy(models["minilm"] / name, other / "onnx" / name)
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(models["minilm"] / name, other / name)
    plain = LocalEmbedder(other, threads=1)
    assert plain.profile.max_tokens == 512
    np.testing.assert_allclose(plain.embed_queries(["cat"]), emb.embed_queries(["cat"]), atol=1e-6)


def test_overrides_set_prompts_max_tokens_and_matryoshka_dimensions(models: dict[str, Path]) -> None:
    base = LocalEmbedder(models["minilm"], threads=1)
    ov = LocalEmbedder(
        models["minilm"],
        threads=1,
        overrides=LocalModelConfig(dimensions=16, max_tokens=12, query_prompt="search: ",
                                   document_prompt="doc {title}: {text}"),
    )
    assert ov.dimensions == 16 and ov.profile.max_tokens == 12
    q = ov.embed_queries(["cat dog"])
    assert q.shape == (1, 16)
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    assert format_query(ov.profile, "x") == "search: x"
    assert format_document(ov.profile, None, "t") == "doc none: t"
    assert len(ov.token_ids("cat " * 30)) == 12
    # The first 16 of the full vector, re-normalized (Matryoshka truncation).
    full = LocalEmbedder(models["minilm"], threads=1, overrides=LocalModelConfig(query_prompt="search: "))
    f = full.embed_queries(["cat dog"])[0][:16]
    np.testing.assert_allclose(q[0], f / np.linalg.norm(f), atol=1e-6)
    assert len({base.identity, ov.identity, full.identity}) == 3
    with pytest.raises(ModelUnavailable, match="dimensions"):
        LocalEmbedder(models["minilm"], threads=1, overrides=LocalModelConfig(dimensions=64))


def test_identity_changes_with_weights_prompts_and_max_tokens(models: dict[str, Path], gemma: LocalEmbedder,
                                                              tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(models["gemma"], copy)
    assert LocalEmbedder(copy, threads=1).identity == gemma.identity  # same files, another place
    others = {
        LocalEmbedder(models["gemma_seed1"], threads=1).identity,
        LocalEmbedder(models["gemma"], threads=1, max_tokens=100).identity,
        LocalEmbedder(models["minilm"], threads=1).identity,
        LocalEmbedder(models["minilm"], threads=1, overrides=LocalModelConfig(document_prompt="d: {text}")).identity,
    }
    assert len(others) == 4 and gemma.identity not in others


def test_missing_or_broken_model_files_raise_model_unavailable(models: dict[str, Path], tmp_path: Path) -> None:
    def unavailable(path: Path) -> str:
        with pytest.raises(ModelUnavailable) as err:
            LocalEmbedder(path, threads=1)
        msg = err.value.message
        assert "\n" not in msg and "memories rag model-install" in msg and "[embedding.local] model_dir" in msg
        return msg

    (tmp_path / "empty").mkdir()
    unavailable(tmp_path / "empty")
    unavailable(tmp_path / "absent")
    no_data = tmp_path / "no_data"
    shutil.copytree(models["gemma"], no_data)
    (no_data / "onnx" / "model_q4.onnx_data").unlink()
    assert "cannot be loaded" in unavailable(no_data)
    garbage = tmp_path / "garbage"
    shutil.copytree(models["gemma"], garbage)
    (garbage / "onnx" / "model_q4.onnx").write_bytes(b"not a graph" * 10)
    unavailable(garbage)
    bad_tok = tmp_path / "bad_tok"
    shutil.copytree(models["gemma"], bad_tok)
    (bad_tok / "tokenizer.json").write_text("{")
    assert "tokenizer" in unavailable(bad_tok)
    assert "unit-length" in unavailable(models["broken"])


# Variables whose presence makes onnxruntime skip its telemetry device id (read off its binary).
CI_MARKERS = ("CI", "TF_BUILD", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "TRAVIS", "JENKINS_URL",
              "CODEBUILD_BUILD_ID", "BUILDKITE", "TEAMCITY_VERSION", "APPVEYOR", "BITBUCKET_BUILD_NUMBER")


def test_loading_writes_no_telemetry_and_nothing_into_the_model_dir(models: dict[str, Path], tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    before = sorted((p.relative_to(models["gemma"]), p.stat().st_mtime_ns) for p in models["gemma"].rglob("*"))
    # onnxruntime stays quiet on its own when it sees a CI runner's variables; drop them so both runs
    # below behave as on a user's machine and the control can prove the check sees a write.
    env = {k: v for k, v in os.environ.items()
           if k not in ("ORT_DISABLE_TELEMETRY", "XDG_CACHE_HOME", *CI_MARKERS)}
    env.update(HOME=str(home), PYTHONPATH=str(REPO))
    code = ("import sys; from pathlib import Path; from memoriesd.embed.local import LocalEmbedder; "
            "e = LocalEmbedder(Path(sys.argv[1]), threads=1); print(e.embed_queries(['cat']).shape)")
    out = subprocess.run([sys.executable, "-c", code, str(models["gemma"])], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "(1, 32)"
    assert not [p for p in home.rglob("*") if "Microsoft" in p.parts or "DeveloperTools" in p.parts]
    after = sorted((p.relative_to(models["gemma"]), p.stat().st_mtime_ns) for p in models["gemma"].rglob("*"))
    assert after == before
    # Control: a bare import without the setting does write there, so the check above can see it.
    control = tmp_path / "control"
    control.mkdir()
    subprocess.run([sys.executable, "-c", "import onnxruntime"], env={**env, "HOME": str(control)}, check=True,
                   timeout=60)
    assert (control / ".cache" / "Microsoft" / "DeveloperTools").is_dir()


# ---------------------------------------------------------------------------------------------
# The real all-MiniLM-L6-v2 export from ../shared
# ---------------------------------------------------------------------------------------------

needs_minilm = pytest.mark.skipif(not MINILM.is_dir(), reason=needs_shared("models/all-MiniLM-L6-v2-onnx"))


@pytest.fixture(scope="module")
def minilm() -> LocalEmbedder:
    return LocalEmbedder(MINILM, threads=2)


@needs_minilm
def test_real_minilm_profile_comes_from_its_files(minilm: LocalEmbedder) -> None:
    assert not minilm.is_gemma
    assert minilm.dimensions == 384 and minilm.profile.max_tokens == 256
    assert minilm.profile.document_prompt is None and minilm.profile.query_prompt == ""
    ids = minilm.token_ids("word " * 400)
    assert len(ids) == 256 and ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP], not the file's 128
    assert len(minilm.token_ids("hello world")) == 4  # no fixed padding


@needs_minilm
def test_real_minilm_ranks_paraphrases_above_unrelated_text(minilm: LocalEmbedder) -> None:
    queries = minilm.embed_queries([
        "How do I reset my forgotten password?",
        "Which foods are high in protein?",
        "the weather will be rainy tomorrow",
    ])
    docs = minilm.embed_documents([
        (None, "Steps to recover access when you can't remember your login credentials."),
        ("Nutrition", "Eggs, lentils, chicken and tofu provide a lot of protein."),
        (None, "Forecast: showers expected throughout the next day."),
        (None, "The stock market closed higher on Friday."),
    ])
    scores = queries @ docs.T
    assert list(np.argmax(scores, axis=1)) == [0, 1, 2]
    assert all(scores[i, i] > scores[i, 3] + 0.15 for i in range(3))


@needs_minilm
def test_real_minilm_batched_and_single_runs_agree(minilm: LocalEmbedder) -> None:
    items: list[tuple[str | None, str]] = [
        ("Short", "one line"),
        (None, "A considerably longer fragment about retrieval, embeddings and encrypted vaults. " * 6),
        ("Mid", "Vectors are sealed at rest and reloaded on unlock."),
    ]
    batched = minilm.embed_documents(items)
    for i, item in enumerate(items):
        assert cos(minilm.embed_documents([item])[0], batched[i]) > 0.9999
