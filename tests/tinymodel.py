"""A tiny embedding model with EmbeddingGemma's file layout and graph signature, for tests.

``make_tiny_model(dir)`` writes, deterministically for a given seed and in well
under a second, the six files the installer fetches for EmbeddingGemma:

    onnx/model_q4.onnx        graph: Gather -> masked mean -> L2 normalize
    onnx/model_q4.onnx_data   its weights (external data, as in the real export)
    tokenizer.json            WordLevel over a few hundred English words, BOS=2 ... EOS=1
    tokenizer_config.json, config.json (model_type gemma3_text), special_tokens_map.json

Texts that share words get similar vectors. ``layout="minilm"`` writes instead the
all-MiniLM-L6-v2 layout (``model.onnx`` + ``model.onnx_data``, ``config.json`` of a BERT model,
``sentence_bert_config.json`` with ``max_seq_length``) and a tokenizer.json that carries its own
fixed padding/truncation to 16, which an embedder must override.

The returned dict maps each relative path to ``{"size": bytes, "sha256": hex}`` so
model-install tests can serve the files from a mirror and build a manifest.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.normalizers import Lowercase
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.processors import TemplateProcessing

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]  # ids 0, 1, 2, 3 as in Gemma (pad 0, eos 1, bos 2)
_WORDS = """
the a an of to in on for with and or is are was be by at from as it this that not no yes
cat cats dog dogs kitten puppy pet pets animal animals fur tail paw bark meow vet food bowl leash
python code coding program programs programming function functions bug bugs compiler test tests
debug software developer library module variable loop class error errors syntax script
coffee tea espresso latte milk sugar cup mug bean beans roast brew morning breakfast cafe
bread butter cheese toast jam
mountain mountains hike hiking trail trails summit peak climb rope boots snow glacier valley
river lake forest tree trees camp tent
ocean sea beach wave waves surf sand shell boat sail sailing fish fishing island tide harbor
piano guitar music song songs melody chord chords violin drum drums concert band sing singer
rhythm note notes
bank money loan loans interest rate rates tax taxes budget invoice payment salary account
savings stock stocks market price prices
doctor nurse hospital patient patients medicine drug drugs clinic fever cough pain health
vaccine virus cell cells protein gene genes brain heart blood
car cars engine wheel wheels road roads drive driving fuel brake traffic truck bus train trains
station ticket flight airport plane
vault key keys password passphrase encrypt encrypted encryption secret secrets lock unlock
search query index vector vectors embedding embeddings model models token tokens fragment
memory memories record records title text document documents note
red blue green yellow black white small big large tiny fast slow old new good bad happy sad
one two three four five first last day week year time
""".split()
WORDS: list[str] = list(dict.fromkeys(_WORDS)) + [f"w{i:03d}" for i in range(100)]


def _tokenizer(*, post_processor: bool, baked_length: int | None, beyond_table: tuple[str, ...] = ()) -> str:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = Lowercase()
    tok.pre_tokenizer = Whitespace()
    tok.add_special_tokens(SPECIALS)
    # Added tokens whose ids lie past the embedding table, like EmbeddingGemma's <image_soft_token>.
    tok.add_special_tokens(list(beyond_table))
    if post_processor:
        tok.post_processor = TemplateProcessing(
            single="<bos> $A <eos>",
            pair="<bos> $A <eos> $B:1 <eos>:1",
            special_tokens=[("<bos>", 2), ("<eos>", 1)],
        )
    if baked_length is not None:
        tok.enable_padding(length=baked_length, pad_id=0, pad_token="<pad>")
        tok.enable_truncation(max_length=baked_length)
    # Canonical JSON so the bytes do not depend on hash-map order.
    return json.dumps(json.loads(tok.to_str()), sort_keys=True, ensure_ascii=False)


def _build_graph(
    weights: np.ndarray, data_name: str, *, normalize: bool, dims: int
) -> tuple[bytes, bytes]:
    vocab = weights.shape[0]
    raw = weights.astype("<f4").tobytes()
    table = TensorProto()
    table.name = "embed_tokens.weight"
    table.data_type = TensorProto.FLOAT
    table.dims.extend([vocab, dims])
    table.data_location = TensorProto.EXTERNAL
    for key, value in (("location", data_name), ("offset", "0"), ("length", str(len(raw)))):
        entry = table.external_data.add()
        entry.key, entry.value = key, value

    def const_i64(name: str, values: list[int]) -> TensorProto:
        return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)

    nodes = [
        helper.make_node("Gather", ["embed_tokens.weight", "input_ids"], ["hidden"], axis=0),
        helper.make_node("Identity", ["hidden"], ["last_hidden_state"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["hidden", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),
        helper.make_node("Max", ["count", "eps"], ["count_safe"]),
        helper.make_node("Div", ["summed", "count_safe"], ["mean"]),
    ]
    if normalize:
        nodes += [
            helper.make_node("ReduceL2", ["mean"], ["norm"], axes=[1], keepdims=1),
            helper.make_node("Max", ["norm", "eps"], ["norm_safe"]),
            helper.make_node("Div", ["mean", "norm_safe"], ["sentence_embedding"]),
        ]
    else:  # a broken export: mean pooling without normalization
        nodes.append(helper.make_node("Identity", ["mean"], ["sentence_embedding"]))
    graph = helper.make_graph(
        nodes,
        "tiny_embedder",
        inputs=[
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "sequence_length"]),
        ],
        outputs=[
            helper.make_tensor_value_info(
                "last_hidden_state", TensorProto.FLOAT, ["batch_size", "sequence_length", dims]
            ),
            helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch_size", dims]),
        ],
        initializer=[
            table,
            const_i64("axis1", [1]),
            const_i64("axis2", [2]),
            helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-9]),
        ],
    )
    model = helper.make_model(graph, producer_name="memories-tests", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString(), raw


def make_tiny_model(
    dir: Path,
    *,
    dims: int = 32,
    seed: int = 0,
    layout: str = "gemma",
    post_processor: bool = True,
    normalize: bool = True,
    beyond_table: tuple[str, ...] = (),
) -> dict[str, dict[str, int | str]]:
    """Write a tiny model into ``dir`` and return ``{relpath: {"size", "sha256"}}``.

    ``post_processor=False`` leaves BOS/EOS to the embedder; ``normalize=False``
    writes a broken export whose vectors are not unit length.
    """
    if layout not in ("gemma", "minilm"):
        raise ValueError("layout must be 'gemma' or 'minilm'")
    dir = Path(dir)
    vocab = len(SPECIALS) + len(WORDS)
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((vocab, dims)).astype(np.float32)
    weights[0] = 0.0  # pad
    weights[1:4] *= 0.1  # eos, bos, unk: small, shared by every text
    files: dict[str, bytes] = {}
    if layout == "gemma":
        graph, raw = _build_graph(weights, "model_q4.onnx_data", normalize=normalize, dims=dims)
        files["onnx/model_q4.onnx"] = graph
        files["onnx/model_q4.onnx_data"] = raw
        files["tokenizer.json"] = _tokenizer(post_processor=post_processor, baked_length=None, beyond_table=beyond_table).encode()
        files["config.json"] = json.dumps(
            {
                "architectures": ["Gemma3TextModel"],
                "model_type": "gemma3_text",
                "hidden_size": dims,
                "max_position_embeddings": 2048,
                "bos_token_id": 2,
                "eos_token_id": 1,
                "pad_token_id": 0,
                "vocab_size": vocab,
            },
            indent=2,
            sort_keys=True,
        ).encode()
        files["tokenizer_config.json"] = json.dumps(
            {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
             "model_max_length": 2048},
            sort_keys=True,
        ).encode()
        files["special_tokens_map.json"] = json.dumps(
            {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
            sort_keys=True,
        ).encode()
    else:
        graph, raw = _build_graph(weights, "model.onnx_data", normalize=normalize, dims=dims)
        files["model.onnx"] = graph
        files["model.onnx_data"] = raw
        files["tokenizer.json"] = _tokenizer(post_processor=post_processor, baked_length=16).encode()
        files["config.json"] = json.dumps(
            {"model_type": "bert", "hidden_size": dims, "max_position_embeddings": 512, "pad_token_id": 0},
            sort_keys=True,
        ).encode()
        files["sentence_bert_config.json"] = json.dumps({"max_seq_length": 64, "do_lower_case": False}).encode()
    out: dict[str, dict[str, int | str]] = {}
    for rel, data in files.items():
        path = dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        out[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return out


def check_graph(path: Path) -> None:
    """Validate a written graph with the ONNX checker (external data resolved beside it)."""
    onnx.checker.check_model(str(path))


#: Five short notes on distinct topics, for vector-search tests with a tiny model.
TOPIC_NOTES = [
    ("Pets", "my dog and cat love the vet and their food bowl"),
    ("Coffee", "morning espresso latte with milk and sugar in a mug"),
    ("Hiking", "mountain trail hike to the summit with snow and boots"),
    ("Music", "piano and guitar chords for a song melody"),
    ("Money", "bank loan interest rate and tax budget invoice"),
]


def two_tiny_models(base: Path) -> dict[str, Path]:
    """Two tiny models of the same shape but different weights (model "a" and model "b")."""
    a, b = base / "a", base / "b"
    make_tiny_model(a, seed=1)
    make_tiny_model(b, seed=2)
    return {"a": a, "b": b}
