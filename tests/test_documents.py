"""parse_document (refusals, BOM, title, front matter) and discover()."""

from __future__ import annotations

import os
import struct
import zipfile
import zlib
from io import BytesIO
from pathlib import Path

import pytest

from memoriesd.errors import DocumentRefused
from memoriesd.text.files import PathKeys, discover, parse_document


def _png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00\x00"))
        + chunk(b"IEND", b"")
    )


def _docx() -> bytes:
    buf = BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", "<w:document>hello</w:document>")
    return buf.getvalue()


REFUSED = {
    "report.pdf": (b"%PDF-1.7\n1 0 obj\n<<>>\nendobj\n", "PDF"),
    "letter.docx": (_docx(), "ZIP"),
    "photo.png": (_png(), "PNG"),
    "photo.jpg": (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", "JPEG"),
    "anim.gif": (b"GIF89a\x01\x00\x01\x00", "GIF"),
    "pic.webp": (b"RIFF\x24\x00\x00\x00WEBPVP8 ", "WebP"),
    "blob.bin": (b"abc\x00def" * 10, "NUL"),
    "ctrl.txt": (b"text " + b"\x01\x02\x03\x04\x05" * 20, "control"),
    "latin1.txt": ("caf\u00e9 cr\u00e8me".encode("latin-1"), "UTF-8"),
    "wide.txt": ("hello".encode("utf-16"), "UTF-16"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_non_text_files_are_refused_naming_the_file_and_the_fix(name: str) -> None:
    data, kind = REFUSED[name]
    with pytest.raises(DocumentRefused) as exc:
        parse_document(data, f"/some/dir/{name}")
    msg = exc.value.message
    assert msg.startswith(name + " ")
    assert kind in msg
    assert "convert it to" in msg
    assert "\n" not in msg and "/some/dir" not in msg
    assert exc.value.code == "document_refused"


def test_pdf_message_reads_as_the_issue_describes() -> None:
    with pytest.raises(DocumentRefused) as exc:
        parse_document(b"%PDF-1.4 ...", "notes.pdf")
    assert (
        exc.value.message == "notes.pdf is a PDF file, not UTF-8 text: convert it to text or Markdown first"
    )


def test_oversized_files_are_refused_naming_size_and_limit() -> None:
    with pytest.raises(DocumentRefused) as exc:
        parse_document(b"a" * (2 * 1024 * 1024 + 1), "big.md", max_bytes=2 * 1024 * 1024)
    assert "big.md is 2.0 MiB" in exc.value.message and "limit of 2.0 MiB" in exc.value.message
    parse_document(b"a" * 1024, "ok.md", max_bytes=1024)  # exactly at the limit is fine


def test_utf8_bom_is_stripped_and_the_body_is_otherwise_untouched() -> None:
    text = "---\ntitle: T\n---\r\n# Heading\r\n\ttabs and 中文 😀\n"
    doc = parse_document(b"\xef\xbb\xbf" + text.encode(), "a.md")
    assert doc.body == text


def test_title_argument_wins_over_everything() -> None:
    doc = parse_document(b"---\ntitle: From FM\n---\n# From H1\n", "file.md", title="Given")
    assert doc.title == "Given"
    assert doc.meta == {"title": "From FM"}


def test_front_matter_title_then_first_h1_then_file_stem() -> None:
    assert parse_document(b"---\ntitle: 'From FM'\n---\n# From H1\n", "f.md").title == "From FM"
    assert parse_document(b"intro\n\n#  From H1  ##\n# Second\n", "f.md").title == "From H1"
    assert parse_document(b"no heading here\n#hashtag is not a heading\n", "my notes.md").title == "my notes"


def test_h1_inside_a_code_fence_is_not_the_title() -> None:
    text = b"```bash\n# not a title\n```\n~~~\n# nor this\n~~~\n## H2 is not H1\n# Real\n"
    assert parse_document(text, "f.md").title == "Real"


def test_front_matter_becomes_metadata_with_tag_lists() -> None:
    text = (
        "---\n"
        "title: Trip notes\n"
        "date: 2024-05-01\n"
        'author: "Ada L."\n'
        "tags: [travel, 'japan', 笔记]\n"
        "aliases:\n"
        "  - kyoto\n"
        "  - 京都\n"
        "empty:\n"
        "# a comment\n"
        "---\n"
        "Body text.\n"
    )
    doc = parse_document(text.encode(), "trip.md")
    assert doc.title == "Trip notes"
    assert doc.meta == {
        "date": "2024-05-01",
        "author": "Ada L.",
        "tags": ["travel", "japan", "笔记"],
        "aliases": ["kyoto", "京都"],
        "empty": "",
    }
    assert doc.body == text  # front matter stays in the body: offsets point into the file


@pytest.mark.parametrize(
    "front",
    [
        "---\nnested:\n  key: value\n---\n",  # a mapping
        "---\ntitle: x\n",  # never closed
        "---\n: no key\n---\n",
        "---\nblock: |\n  text\n---\n",
        "---\n{json: 1}\n---\n",
        "---\n" + "k: v\n" * 500 + "---\n",  # absurdly long
    ],
)
def test_odd_front_matter_is_plain_body_text(front: str) -> None:
    text = front + "# Heading\nbody\n"
    doc = parse_document(text.encode(), "odd.md")
    assert doc.meta == {}
    assert doc.body == text
    assert doc.title == "Heading"


def test_empty_and_plain_text_files_are_accepted() -> None:
    assert parse_document(b"", "empty.txt").body == ""
    doc = parse_document("纯文本笔记\n第二行".encode(), "中文.txt")
    assert doc.title == "中文" and doc.meta == {}


# -- discover ---------------------------------------------------------------------


def _tree(root: Path) -> None:
    (root / "notes" / "sub").mkdir(parents=True)
    (root / "notes" / ".hidden").mkdir()
    for rel in ["notes/b.md", "notes/a.txt", "notes/c.markdown", "notes/sub/d.MD", "notes/image.png",
                "notes/.secret.md", "notes/.hidden/e.md", "notes/readme"]:  # fmt: skip
        (root / rel).write_text("x", encoding="utf-8")


def test_directories_need_recursive(tmp_path: Path) -> None:
    _tree(tmp_path)
    files, problems = discover([tmp_path / "notes"], recursive=False)
    assert files == []
    assert problems == [(tmp_path / "notes", "is a directory: pass --recursive to import the files in it")]


def test_recursive_expansion_takes_text_files_sorted_and_skips_hidden(tmp_path: Path) -> None:
    _tree(tmp_path)
    files, problems = discover([tmp_path / "notes"], recursive=True)
    rel = [p.relative_to(tmp_path / "notes").as_posix() for p in files]
    assert rel == ["a.txt", "b.md", "c.markdown", "sub/d.MD"]
    assert problems == []


def test_named_files_of_any_extension_are_returned_once(tmp_path: Path) -> None:
    _tree(tmp_path)
    png = tmp_path / "notes" / "image.png"
    md = tmp_path / "notes" / "b.md"
    files, problems = discover([png, md, tmp_path / "notes"], recursive=True)
    assert files[:2] == [png, md]
    assert files.count(md) == 1
    assert problems == []


def test_missing_paths_and_broken_links_are_problems_not_crashes(tmp_path: Path) -> None:
    link = tmp_path / "dangling.md"
    os.symlink(tmp_path / "nowhere", link)
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    files, problems = discover([tmp_path / "missing.md", link, fifo], recursive=True)
    assert files == []
    reasons = dict(problems)
    assert reasons[tmp_path / "missing.md"] == "does not exist: check the path"
    assert "broken symbolic link" in reasons[link]
    assert "not a regular file" in reasons[fifo]


def test_symlinked_directories_are_not_followed(tmp_path: Path) -> None:
    _tree(tmp_path)
    os.symlink(tmp_path / "notes", tmp_path / "notes" / "sub" / "loop")
    files, _ = discover([tmp_path / "notes"], recursive=True)
    assert len(files) == 4


def test_path_keys_agree_with_resolve_for_links_dotdot_and_plain_files(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    note = real / "sub" / "note.md"
    note.write_text("# n\n")
    (tmp_path / "linkdir").symlink_to(real)
    (tmp_path / "linkfile.md").symlink_to(note)
    keys = PathKeys()
    for p in (note, tmp_path / "linkdir" / "sub" / "note.md", tmp_path / "linkfile.md",
              real / "sub" / ".." / "sub" / "note.md", tmp_path / "missing" / "x.md"):
        assert keys.key(p) == str(p.resolve()), p
    # The same file reached three ways is discovered once.
    files, _ = discover([note, tmp_path / "linkfile.md", tmp_path / "linkdir"], recursive=True, keys=keys)
    assert files == [note]
