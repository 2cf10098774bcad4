"""Vectors keyed by content (what the model reads), not by byte offsets: a real daemon with the small
real model (all-MiniLM-L6-v2). An edit near the top of a note re-embeds only what changed, a passage
in two notes has one sealed vector, a sidecar of the old key scheme is re-keyed without re-embedding,
and re-ingesting an unchanged folder writes nothing."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memoriesd.index.vectors.maintenance import live_fragment_keys
from memoriesd.index.vectors.names import is_legacy_key, read_spaces, sidecar_opaque_id
from memoriesd.index.vectors.sidecar import VectorStore
from memoriesd.vault import crypto
from memoriesd.vault.store import VaultStore

from .conftest import SHARED, Daemon, all_file_bytes, cli_json, create_vault, needs_shared, running_daemon

MINILM = SHARED / "models" / "all-MiniLM-L6-v2-onnx"
PASS = "correct horse"


def _paragraphs(n: int) -> list[str]:
    """``n`` distinct paragraphs of real English text (SciFact abstracts), each under one fragment."""
    out = []
    with (SHARED / "eval" / "scifact" / "corpus.jsonl").open(encoding="utf-8") as f:
        for line in f:
            text = " ".join(json.loads(line)["text"].split())
            if 300 <= len(text) <= 600:
                out.append(text)
                if len(out) == n:
                    return out
    raise AssertionError("not enough SciFact abstracts")


@contextlib.contextmanager
def _daemon() -> Iterator[tuple[Daemon, str]]:
    """MiniLM, background indexing off: `rag index` says exactly how many fragments it embedded."""
    if not MINILM.is_dir():  # pragma: no cover - ../shared is beside the repo in CI
        raise AssertionError(needs_shared("models/all-MiniLM-L6-v2-onnx"))
    with running_daemon(f'[embedding.local]\nmodel_dir = "{MINILM}"\nthreads = 2\n[index]\nbackground = false\n') as d:
        yield d, create_vault(d, passphrase=PASS)


def _ingest(d: Daemon, vid: str, folder: Path) -> dict[str, Any]:
    return dict(cli_json(d.home, "rag", "ingest", vid, str(folder), "--recursive"))


def _index(d: Daemon, vid: str) -> dict[str, Any]:
    out = dict(d.call("rag.index", {"vault": vid}))
    assert out["remaining"] == 0 and out["skipped"] == 0, out
    return out


def _sidecar(d: Daemon, vid: str) -> Path:
    [path] = sorted((d.home / "vaults" / vid).glob("vectors-*.bin"))
    return path


def test_editing_the_top_of_a_card_re_embeds_only_the_changed_fragment(tmp_path: Path) -> None:
    paras = _paragraphs(32)  # about 20 fragments
    folder = tmp_path / "notes"
    folder.mkdir()
    note = folder / "long.md"
    note.write_text("# A long note\n\n" + "\n\n".join(paras) + "\n")
    with _daemon() as (d, vid):
        assert _ingest(d, vid, folder)["added"] == 1
        first = _index(d, vid)
        assert first["embedded"] == first["total"] >= 20
        # One line near the top gets longer: every later byte offset moves.
        edited = paras[0].replace(" ", " really ", 1)
        note.write_text("# A long note\n\n" + "\n\n".join([edited, *paras[1:]]) + "\n")
        assert _ingest(d, vid, folder)["updated"] == 1
        again = _index(d, vid)
        assert again["total"] == first["total"]
        assert 1 <= again["embedded"] <= 2, again  # the edited fragment (and a neighbour sharing its overlap)
        # Results still carry exact byte ranges into the edited text.
        res = d.call("rag.search", {"vault": vid, "query": paras[-1][:200], "mode": "vector", "limit": 3})
        assert res["missing_vectors"] == 0
        top = res["results"][0]
        body = note.read_bytes()
        assert body[top["start"] : top["end"]].decode("utf-8") == top["text"]
        assert paras[-1][:100] in top["text"]


def test_identical_fragments_in_two_cards_share_one_stored_vector(tmp_path: Path) -> None:
    text = "\n\n".join(_paragraphs(3)) + "\n"
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.md").write_text(text)  # no heading: both are untitled, so the model reads the same input
    with _daemon() as (d, vid):
        _ingest(d, vid, folder)
        first = _index(d, vid)
        assert first["embedded"] == first["total"] > 0
        size = _sidecar(d, vid).stat().st_size
        (folder / "b.md").write_text(text)
        assert _ingest(d, vid, folder)["added"] == 1
        second = _index(d, vid)
        assert second["total"] == 2 * first["total"]
        assert second["embedded"] == 0  # b's fragments reuse a's vectors
        assert _sidecar(d, vid).stat().st_size == size  # nothing new was sealed
        # After lock/unlock both cards get their vectors from the one sealed copy.
        d.call("vault.lock", {"vault": vid})
        d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        assert _index(d, vid)["embedded"] == 0
        emb = d.call("rag.status", {"vault": vid})["embedding"]
        assert emb["embedded"] == emb["total"] == second["total"]
        res = d.call("rag.search", {"vault": vid, "query": text[:120], "mode": "vector", "limit": 10})
        assert {r["source"].rsplit("/", 1)[-1] for r in res["results"][:2]} == {"a.md", "b.md"}


def _rewrite_with_old_keys(home: Path, vid: str) -> tuple[Path, int]:
    """Turn the vault's sidecar into what the previous key scheme wrote: the same vectors under
    ``entry_key(fingerprint, title)``. The vault is locked in the daemon; this opens it here."""
    store = VaultStore.open(home / "vaults" / vid, passphrase=PASS.encode())
    sealer = crypto.Sealer(store.key, crypto.LABEL_VECTORS)
    try:
        pairs = live_fragment_keys(store, legacy=True)
        spaces = read_spaces(store.dir, vault_id=vid, open_=sealer.open)
        [path] = sorted(store.dir.glob("vectors-*.bin"))
        entry = spaces[sidecar_opaque_id(path)]
        side = VectorStore(path, vault_id=vid, identity=str(entry["identity"]), dims=int(str(entry["dims"])),
                           seal=sealer.seal, open_=sealer.open)
        current = side.load()
        assert set(current) == {new for new, _ in pairs}
        side.rewrite({old: current[new] for new, old in pairs if old is not None})
        keys = side.peek_keys()
        assert keys and all(is_legacy_key(k) for k in keys)
        return path, len(keys)
    finally:
        sealer.wipe()
        store.close()


def _sealed_keys(home: Path, vid: str, path: Path) -> set[str]:
    store = VaultStore.open(home / "vaults" / vid, passphrase=PASS.encode())
    sealer = crypto.Sealer(store.key, crypto.LABEL_VECTORS)
    try:
        entry = read_spaces(store.dir, vault_id=vid, open_=sealer.open)[sidecar_opaque_id(path)]
        keys = VectorStore(path, vault_id=vid, identity=str(entry["identity"]), dims=int(str(entry["dims"])),
                           seal=sealer.seal, open_=sealer.open).peek_keys()
        assert keys is not None
        return keys
    finally:
        sealer.wipe()
        store.close()


def _old_scheme_vault(tmp_path: Path, d: Daemon, vid: str) -> tuple[Path, int]:
    folder = tmp_path / "notes"
    folder.mkdir()
    paras = _paragraphs(6)
    for i in range(3):
        (folder / f"n{i}.md").write_text(f"# Note {i}\n\n{paras[2 * i]}\n\n{paras[2 * i + 1]}\n")
    _ingest(d, vid, folder)
    total = _index(d, vid)["total"]
    d.call("vault.lock", {"vault": vid})
    path, n = _rewrite_with_old_keys(d.home, vid)
    assert n == total
    d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
    return path, total


def test_an_old_scheme_sidecar_is_rekeyed_on_attach_without_re_embedding(tmp_path: Path) -> None:
    with _daemon() as (d, vid):
        path, total = _old_scheme_vault(tmp_path, d, vid)
        # Before the vectors are loaded, status counts the old-scheme entries as the vectors they are.
        emb = d.call("rag.status", {"vault": vid})["embedding"]
        assert emb["vectors_loaded"] is False and emb["embedded"] == emb["total"] == total
        out = _index(d, vid)
        assert out["embedded"] == 0 and out["total"] == total
        d.call("vault.lock", {"vault": vid})
        keys = _sealed_keys(d.home, vid, path)
        assert len(keys) == total and not any(is_legacy_key(k) for k in keys)  # rewritten once, in the new scheme
        d.call("vault.unlock", {"vault": vid, "passphrase": PASS})
        assert _index(d, vid)["embedded"] == 0


def test_compaction_rekeys_an_old_scheme_sidecar_it_has_not_loaded(tmp_path: Path) -> None:
    with _daemon() as (d, vid):
        path, total = _old_scheme_vault(tmp_path, d, vid)
        out = d.call("vault.compact", {"vault": vid})
        assert out["vector_entries_kept"] == total and out["vector_entries_dropped"] == 0
        assert _index(d, vid)["embedded"] == 0
        d.call("vault.lock", {"vault": vid})
        assert not any(is_legacy_key(k) for k in _sealed_keys(d.home, vid, path))


def test_reingesting_an_unchanged_folder_writes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    paras = _paragraphs(40)
    for i, para in enumerate(paras):
        (folder / ("sub" if i % 2 else "") / f"n{i:02d}.md").write_text(f"---\ntags: [t{i % 3}]\n---\n# Note {i}\n\n{para}\n")
    with _daemon() as (d, vid):
        assert _ingest(d, vid, folder)["added"] == 40
        _index(d, vid)
        vault_dir = d.home / "vaults" / vid
        before = sorted(all_file_bytes(vault_dir))
        for _ in range(2):
            out = _ingest(d, vid, folder)
            assert (out["added"], out["updated"], out["unchanged"], out["refused"]) == (0, 0, 40, [])
        assert sorted(all_file_bytes(vault_dir)) == before  # no new revision, no rewritten card, no vector
        assert _index(d, vid)["embedded"] == 0


def test_content_keys_bind_exactly_the_model_input_under_the_vault_key() -> None:
    from memoriesd.index.vectors.names import content_key

    a, b = bytes(range(32)), bytes(32)
    assert content_key(a, "Title", "text") == content_key(bytearray(a), "Title", "text")
    assert content_key(a, "Title", "text") != content_key(b, "Title", "text")  # another vault
    assert content_key(a, None, "text") != content_key(a, "", "text")  # `title: none` is not an empty title
    assert content_key(a, "ab", "c") != content_key(a, "a", "bc")  # length-prefixed parts
    assert content_key(a, "Title", "text") != content_key(a, "Title", "text ")
    assert len(content_key(a, None, "")) == 32 and not is_legacy_key(content_key(a, None, ""))
