"""Reading files for import: UTF-8 text and Markdown only, everything else refused.

:func:`parse_document` never changes the text it accepts (apart from a UTF-8
byte-order mark): the body is the file's text, so fragment byte offsets point
into the original. Markdown front matter is parsed for metadata but left in the
body; indexing starts after it (:func:`front_matter_end`), so no search result,
snippet, answer source or context pack shows it. The parser handles a small,
common subset (``key: value``, quoted values, ``tags: [a, b]`` and ``- item``
lists); anything else makes the whole block plain body text, never an error.

:func:`discover` turns command-line paths into the list of files to import;
:func:`read_document` reads one of them, refusing before reading anything that is
not a regular file or is over the size limit.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DocumentRefused

#: Extensions picked up when a directory is expanded.
TEXT_SUFFIXES = (".md", ".markdown", ".txt")
#: Longest title kept (characters).
MAX_TITLE_CHARS = 300
#: Share of control bytes above which a file counts as binary.
MAX_CONTROL_SHARE = 0.01
#: Front matter longer than this many lines is treated as body text.
_MAX_FRONT_MATTER_LINES = 200

_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"%PDF", "a PDF file"),
    (b"PK\x03\x04", "a ZIP archive or office document (DOCX, ODT, EPUB...)"),
    (b"PK\x05\x06", "a ZIP archive"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"II*\x00", "a TIFF image"),
    (b"MM\x00*", "a TIFF image"),
    (b"\x00\x00\x01\x00", "an icon image"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"\x7fELF", "a program (ELF binary)"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an old Microsoft Office document"),
    (b"{\\rtf", "an RTF document"),
    (b"\xff\xfe", "UTF-16 text"),
    (b"\xfe\xff", "UTF-16 text"),
    (b"SQLite format 3\x00", "an SQLite database"),
)
_BOM = b"\xef\xbb\xbf"
# Bytes that are normal in text: tab, line feed, form feed, carriage return.
_CONTROL_BYTES = bytes(b for b in range(32) if b not in (9, 10, 12, 13)) + b"\x7f"
_NON_CONTROL = bytes(b for b in range(256) if b not in _CONTROL_BYTES)

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_ATX_H1 = re.compile(r"^ {0,3}#[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_KEY_VALUE = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.\- ]*?)[ \t]*:(?:[ \t]+(.*?))?[ \t]*$")
_LIST_ITEM = re.compile(r"^[ \t]*-[ \t]+(.*?)[ \t]*$")


@dataclass
class ParsedDocument:
    """An accepted file: its title, its text, and the front matter's metadata."""

    title: str
    body: str
    meta: dict[str, str | list[str]] = field(default_factory=dict)


def _display_name(name: str) -> str:
    """The file's base name, printable and short, for one-line messages."""
    base = os.path.basename(name) or "the file"
    base = "".join(ch if ch.isprintable() else "?" for ch in base)
    return base if len(base) <= 80 else base[:77] + "..."


def _size(n: float) -> str:
    if n < 1024:
        return f"{int(n)} bytes"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"


def _too_big(shown: str, size: str, max_bytes: int) -> DocumentRefused:
    return DocumentRefused(
        f"{shown} is {size}, over the document limit of {_size(max_bytes)}: "
        "split it into smaller files or raise [vault] max_document_mib (up to 64) in config.toml"
    )


def display_path(path: str | os.PathLike[str]) -> str:
    """A path as printable text: bytes of the name that are not UTF-8 are shown escaped (``\\xff``)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def is_undecodable(path: str | os.PathLike[str]) -> bool:
    """True when the path's bytes are not valid UTF-8 (Python holds them as lone surrogates)."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def non_regular_kind(mode: int) -> str | None:
    """What a file of this ``st_mode`` is when it is not a regular file ("a FIFO"...), else None."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


def _not_regular(shown: str, kind: str) -> DocumentRefused:
    return DocumentRefused(f"{shown} is {kind}, not a regular file: name a text or Markdown file")


def read_document(path: Path, max_bytes: int) -> bytes:
    """The bytes of a file to import, or :class:`DocumentRefused` when it cannot be one.

    Anything but a regular file (FIFO, device, socket, directory) is refused
    before it is opened (and again on the opened descriptor, should it have been
    swapped in between, which ``O_NONBLOCK`` keeps from blocking); a file over
    ``max_bytes`` is refused from its size, and at most ``max_bytes + 1`` bytes
    are ever read. :class:`OSError` (missing, unreadable) reaches the caller.
    """
    shown = _display_name(display_path(path))
    kind = non_regular_kind(os.stat(path).st_mode)
    if kind is not None:
        raise _not_regular(shown, kind)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        kind = non_regular_kind(st.st_mode)
        if kind is not None:
            raise _not_regular(shown, kind)
        if st.st_size > max_bytes:
            raise _too_big(shown, _size(st.st_size), max_bytes)
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            block = os.read(fd, min(left, 1 << 20))
            if not block:
                break
            chunks.append(block)
            left -= len(block)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:  # it grew after fstat
        raise _too_big(shown, f"more than {_size(max_bytes)}", max_bytes)
    return data


def _refuse_binary(data: bytes, shown: str) -> None:
    for magic, kind in _SIGNATURES:
        if data.startswith(magic):
            raise DocumentRefused(f"{shown} is {kind}, not UTF-8 text: convert it to text or Markdown first")
    if data[:12].startswith(b"RIFF") and data[8:12] == b"WEBP":
        raise DocumentRefused(
            f"{shown} is a WebP image, not UTF-8 text: convert it to text or Markdown first"
        )
    if data[4:8] == b"ftyp":
        raise DocumentRefused(
            f"{shown} is an image or video file (ISO media), not UTF-8 text: convert it to text or Markdown first"
        )
    if b"\x00" in data:
        raise DocumentRefused(
            f"{shown} is a binary file (it contains NUL bytes), not UTF-8 text: convert it to text or Markdown first"
        )
    if data:
        controls = len(data.translate(None, _NON_CONTROL))
        if controls > MAX_CONTROL_SHARE * len(data):
            raise DocumentRefused(
                f"{shown} looks like a binary file ({controls} control bytes), not UTF-8 text: "
                "convert it to text or Markdown first"
            )


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _inline_list(value: str) -> list[str]:
    inner = value[1:-1].strip()
    if not inner:
        return []
    return [_unquote(v.strip()) for v in inner.split(",") if v.strip()]


def parse_front_matter(text: str) -> tuple[dict[str, str | list[str]], int] | None:
    """Metadata of a leading ``---`` block and the character offset where the block ends.

    None when there is no block or it is outside the supported subset.
    """
    if not (text.startswith("---\n") or text.startswith("---\r\n")):
        return None
    lines = text.split("\n", _MAX_FRONT_MATTER_LINES + 1)
    meta: dict[str, str | list[str]] = {}
    pending: str | None = None  # a key whose value is a "- item" list
    bare: set[str] = set()  # keys written as "key:" with nothing after
    offset = len(lines[0]) + 1
    for line in lines[1 : _MAX_FRONT_MATTER_LINES + 1]:
        offset += len(line) + 1
        line = line.rstrip("\r")
        if line.rstrip() in ("---", "..."):
            for key in bare:
                if meta.get(key) == []:
                    meta[key] = ""
            return meta, min(offset, len(text))
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        item = _LIST_ITEM.match(line)
        if item and pending is not None:
            current = meta[pending]
            if isinstance(current, list):
                current.append(_unquote(item.group(1)))
                continue
        kv = None if line[:1].isspace() else _KEY_VALUE.match(line)
        if kv is None:
            return None
        key, value = kv.group(1).strip(), (kv.group(2) or "")
        if value.startswith("[") and value.endswith("]"):
            meta[key] = _inline_list(value)
            bare.discard(key)
            pending = None
        elif value == "":
            meta[key] = []
            pending = key
            bare.add(key)
        elif value[0] in "{[|>&*!":  # mappings, block scalars, anchors: not our subset
            return None
        else:
            meta[key] = _unquote(value)
            bare.discard(key)
            pending = None
    return None


def front_matter_end(text: str) -> int:
    """Character offset where the text after a leading front matter block starts (0: no block).

    Only a block :func:`parse_front_matter` accepts counts (its values are the card's metadata,
    searchable as such); any other leading ``---`` block is body text like the rest.
    """
    if not text.startswith("---"):
        return 0
    fm = parse_front_matter(text)
    return 0 if fm is None else fm[1]


def _first_h1(text: str) -> str | None:
    fence: str | None = None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence) and not line.strip()[len(mark) :].strip():
                fence = None
            continue
        if fence is not None:
            continue
        h = _ATX_H1.match(line)
        if h and h.group(1).strip():
            return h.group(1).strip()
    return None


def _clean_title(title: str) -> str:
    title = " ".join(title.split())
    return title[:MAX_TITLE_CHARS]


def parse_document(
    data: bytes, name: str, *, title: str | None = None, max_bytes: int = 4 * 1024 * 1024
) -> ParsedDocument:
    """Accept a UTF-8 text or Markdown file, or raise :class:`DocumentRefused`.

    Title: ``title`` if given, else the front matter's ``title:``, else the
    first ``# H1`` outside code fences, else the file name's stem.
    """
    shown = _display_name(name)
    if len(data) > max_bytes:
        raise _too_big(shown, _size(len(data)), max_bytes)
    _refuse_binary(data, shown)
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentRefused(
            f"{shown} is not valid UTF-8 text (bad byte at offset {exc.start}): "
            "convert it to UTF-8 text or Markdown first"
        ) from None
    meta: dict[str, str | list[str]] = {}
    rest_from = 0
    fm = parse_front_matter(text)
    if fm is not None:
        meta, rest_from = fm
    fm_title = meta.get("title") if "title" in meta else None
    chosen: str | None = title if title is not None and title.strip() else None
    if chosen is None and isinstance(fm_title, str) and fm_title.strip():
        chosen = fm_title
        del meta["title"]
    if chosen is None:
        chosen = _first_h1(text[rest_from:])
    if chosen is None:
        chosen = Path(name).stem or Path(name).name or "untitled"
    return ParsedDocument(title=_clean_title(chosen), body=text, meta=meta)


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


_UNDECODABLE_FILE = "its name is not valid UTF-8 (shown with \\x escapes): rename the file, then ingest it again"
_UNDECODABLE_DIR = (
    "its name is not valid UTF-8 (shown with \\x escapes), so the files under it were skipped: "
    "rename the directory, then ingest it again"
)


def _undecodable_target(resolved: str) -> str:
    return (
        f"its real path {display_path(resolved)} (reached through a symbolic link) is not valid UTF-8: "
        "rename the file or directory shown with \\x escapes, then ingest it again"
    )


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or under it (both absolute and resolved)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def leaves_folder(path: str, real_folder: str) -> bool:
    """Whether ``path`` is a symbolic link whose real path is outside ``real_folder`` (resolved).

    Such a link found in a folder is never read: a folder shared or synced from elsewhere must not
    pull ``../outside/secret.txt`` (or ``/home/me/.ssh``) into the vault. A link loop resolves to
    where it stands (``os.path.realpath`` stops), so it never hangs this.
    """
    return os.path.islink(path) and not _inside(os.path.realpath(path), real_folder)


def _expand_dir(root: Path, problems: list[tuple[Path, str]], outside: list[Path] | None = None) -> list[Path]:
    """The text files under ``root``; links (files or folders) that lead out of it go to ``outside``."""
    found: list[Path] = []
    real_root = os.path.realpath(root)

    def onerror(exc: OSError) -> None:
        where = Path(exc.filename) if exc.filename else root
        problems.append(
            (where, f"cannot read this directory ({exc.strerror or 'error'}): check its permissions")
        )

    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror):
        kept = []
        for d in sorted(dirnames):
            if _is_hidden(d):
                continue
            if is_undecodable(d):  # nothing under it could be named in a card or a message
                problems.append((Path(display_path(os.path.join(dirpath, d))), _UNDECODABLE_DIR))
                continue
            if leaves_folder(os.path.join(dirpath, d), real_root):  # never followed anyway: said so
                if outside is not None:
                    outside.append(Path(dirpath) / d)
                continue
            kept.append(d)
        dirnames[:] = kept
        for fn in sorted(filenames):
            if _is_hidden(fn) or not fn.lower().endswith(TEXT_SUFFIXES):
                continue
            p = Path(dirpath) / fn
            if is_undecodable(p):
                problems.append((Path(display_path(p)), _UNDECODABLE_FILE))
                continue
            if leaves_folder(str(p), real_root):
                if outside is not None:
                    outside.append(p)
                continue
            try:
                mode = p.stat().st_mode
            except OSError:
                continue  # a broken symbolic link, or gone: skipped as before
            kind = non_regular_kind(mode)
            if kind is None:
                found.append(p)
            elif not stat.S_ISDIR(mode):  # never opened: it could block or be a device
                problems.append((p, f"is {kind}, not a regular file: it was skipped"))
    return found


class PathKeys:
    """Resolved absolute paths (a file's identity), resolving each directory once.

    ``Path.resolve`` walks every component of every file with ``lstat``; on a
    folder of thousands of notes that was a third of the ingest time. A file
    that is not itself a symbolic link resolves to its resolved directory plus
    its name.
    """

    def __init__(self) -> None:
        self._dirs: dict[str, str] = {}

    def key(self, path: Path) -> str:
        try:
            if path.is_symlink():
                return str(path.resolve())
            parent = str(path.parent)
            real = self._dirs.get(parent)
            if real is None:
                real = self._dirs[parent] = os.path.realpath(parent)
            return os.path.join(real, path.name)
        except OSError:
            return str(path.absolute())


def discover(
    paths: list[Path], *, recursive: bool, keys: PathKeys | None = None, outside: list[Path] | None = None
) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Files to import from command-line paths, and (path, reason) for those that cannot be.

    Named files are taken whatever their extension (:func:`parse_document`
    judges them), and a named symbolic link is followed wherever it leads. A
    directory is expanded only with ``recursive`` into its ``*.md``,
    ``*.markdown`` and ``*.txt`` files, in sorted order, skipping hidden files
    and directories and not following symlinked directories; a symbolic link
    in it (file or directory) whose real path is outside the directory is
    skipped and listed in ``outside``. Each file appears once, in the order
    first seen.
    """
    files: list[Path] = []
    problems: list[tuple[Path, str]] = []
    seen: set[str] = set()
    resolver = keys if keys is not None else PathKeys()

    def add(p: Path) -> None:
        key = resolver.key(p)
        if is_undecodable(key):  # reached through a symbolic link: the card's source could not be stored
            problems.append((p, _undecodable_target(key)))
            return
        if key not in seen:
            seen.add(key)
            files.append(p)

    for p in paths:
        if is_undecodable(p):
            problems.append((Path(display_path(p)), _UNDECODABLE_FILE))
            continue
        try:
            if p.is_dir():
                if not recursive:
                    problems.append((p, "is a directory: pass --recursive to import the files in it"))
                    continue
                for f in _expand_dir(p, problems, outside):
                    add(f)
            elif p.is_file():
                add(p)
            elif p.exists():
                kind = non_regular_kind(p.stat().st_mode) or "a special file"
                problems.append((p, f"is {kind}, not a regular file: name a text or Markdown file"))
            elif p.is_symlink():
                problems.append((p, "is a broken symbolic link: fix or remove the link"))
            else:
                problems.append((p, "does not exist: check the path"))
        except OSError as exc:
            problems.append(
                (p, f"cannot be read ({exc.strerror or 'error'}): check the path and its permissions")
            )
    return files, problems
