"""The model directory's stamp notices added, removed and rewritten files without walking the
directory on every search (the embedder choice is made again only when the stamp changes)."""

from __future__ import annotations

import os
from pathlib import Path

from memoriesd.embed.stamp import DirStamp


def test_the_stamp_changes_with_the_model_files_and_only_then(tmp_path: Path) -> None:
    model = tmp_path / "model"
    stamp = DirStamp(model)
    assert stamp.current() == ()  # no directory yet
    (model / "onnx").mkdir(parents=True)
    (model / "tokenizer.json").write_text("{}", "utf-8")
    (model / "onnx" / "model.onnx").write_bytes(b"weights")
    (model / ".hidden").write_text("x", "utf-8")
    first = stamp.current()
    assert [rel for rel, _, _ in first] == ["onnx/model.onnx", "tokenizer.json"]  # hidden files aside
    assert stamp.current() == first  # nothing changed: the same stamp
    (model / "onnx" / "model.onnx").write_bytes(b"other weights")  # rewritten in place
    second = stamp.current()
    assert second != first and [rel for rel, _, _ in second] == ["onnx/model.onnx", "tokenizer.json"]
    (model / "onnx" / "model.onnx_data").write_bytes(b"more")  # added in a subdirectory
    assert [rel for rel, _, _ in stamp.current()] == ["onnx/model.onnx", "onnx/model.onnx_data", "tokenizer.json"]
    os.remove(model / "tokenizer.json")
    assert [rel for rel, _, _ in stamp.current()] == ["onnx/model.onnx", "onnx/model.onnx_data"]
