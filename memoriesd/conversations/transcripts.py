"""Reading conversations from the formats people have: chat JSON Lines, Markdown transcripts, LoCoMo.

:func:`parse` turns the text of a file into :class:`~.model.Conversation` objects (one per session):

- ``jsonl``: one chat message per line, ``{"role": ..., "content": ...}`` (or ``{"message": {role,
  content}}``, or ``{"speaker", "text"}``); ``content`` a string or a list of parts (strings, or
  ``{"type": "text", "text": ...}``); a ``name`` names the speaker instead of the role; ``timestamp``
  / ``time`` / ``created_at`` (ISO 8601 or epoch seconds) gives the turn's time. System, developer
  and tool messages, and parts that are not text (images, tool calls), are left out. A JSON array of
  such messages, or ``{"messages": [...]}``, is read the same way.
- ``claude-code`` (detected inside ``jsonl``): a Claude Code session transcript. Lines of ``type``
  user/assistant with ``message: {role, content}``, ``timestamp`` and ``sessionId``; only text
  parts are kept (thinking, tool calls and tool results are not), meta lines, sub-agent
  (sidechain) lines and slash-command echoes are skipped, consecutive assistant lines (one reply
  split around tool calls) make one turn, and a ``summary`` line gives the title.
- ``markdown``: ``Speaker: text`` lines (``**Speaker:** text``, ``- Speaker: text`` and
  ``[2024-05-08 10:02] Speaker: text`` too); a turn goes on over the following lines until the next
  ``Name:`` line or heading. Optional front matter (``title``, ``date``, ``session_id``) and
  ``# Title``; a date in the title ("(8 May 2023)", an ISO date), else the first turn's time, is the
  session date when nothing else gives one.
- ``locomo``: the LoCoMo JSON (``speaker_a``, ``speaker_b``, ``session_N`` turn lists with
  ``dia_id`` and an optional ``blip_caption``, ``session_N_date_time`` like "1:56 pm on 8 May,
  2023"), one conversation per session; also a list of such samples (``{"conversation": ...}``).

Bad input is a :class:`~memoriesd.errors.UsageError` in one line saying what to do; so is a lone
UTF-16 surrogate (a JSON ``"\ud800"`` escape: half of a character, which no UTF-8 text can hold)
in anything that would be kept, named with its line. One in a part that is left out (a tool result)
is left out with it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from ..errors import UsageError
from ..text.files import parse_front_matter
from ..text.unicode import unpaired_surrogate
from .model import Conversation, derived_title, parse_iso, renumber, session_when

FORMATS = ("auto", "jsonl", "markdown", "locomo")
#: Most turns one conversation may have, and most conversations one capture may make.
MAX_TURNS = 20_000
MAX_CONVERSATIONS = 1_000
MAX_SPEAKER_CHARS = 100
#: A Markdown `Name:` label has at most this many words ("Dr. Jane Smith", "Speaker 1").
MAX_NAME_WORDS = 3
#: Roles of chat messages that are not part of the conversation itself.
SKIPPED_ROLES = frozenset({"system", "developer", "tool", "function", "ipython"})
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_TIME_KEYS = ("timestamp", "time", "created_at", "date")
_HINT = "see `memories memory capture --help` for the formats"

RawTurn = tuple[str, str, "str | None", "str | None"]  # speaker, text, time, ref


def parse(
    text: str,
    fmt: str = "auto",
    *,
    title: str | None = None,
    date: str | None = None,
    session_id: str | None = None,
) -> list[Conversation]:
    """The conversations in ``text`` (see the module docstring). ``title``, ``date`` (ISO) and
    ``session_id`` override what the source says (for LoCoMo: ``title``/``session_id`` are suffixed
    with the session number and ``date`` only fills sessions that have none)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    if date is not None and parse_iso(date) is None:
        raise UsageError(f"--date {date[:40]!r} is not an ISO date: use e.g. 2023-05-08 or 2023-05-08T13:56")
    text = text.lstrip("\ufeff").replace("\r\n", "\n")
    raw = unpaired_surrogate(text)  # in the text itself (a client sent it escaped): Markdown can hold one so
    if raw is not None:
        raise _surrogate_refused(text[raw], text.count("\n", 0, raw) + 1)
    if not text.strip():
        raise UsageError("the conversation is empty: give a file that holds its turns")
    kind, data = _detect(text)
    if fmt != "auto":
        kind = fmt
    if kind == "locomo":
        convs = _locomo(data if data is not None else _json_document(text, "LoCoMo"), title, date, session_id)
    elif kind == "jsonl":
        convs = [_chat(text, data, title, date, session_id)]
    else:
        convs = [_markdown(text, title, date, session_id, explicit=fmt == "markdown")]
    if len(convs) > MAX_CONVERSATIONS:
        raise UsageError(f"the file holds {len(convs):,} sessions, over {MAX_CONVERSATIONS:,} per capture: split it")
    for c in convs:
        if len(c.turns) > MAX_TURNS:
            raise UsageError(f"the conversation has {len(c.turns):,} turns, over {MAX_TURNS:,}: split it into several files")
    for c in convs:  # decoded from a JSON escape: refused before anything is stored
        for value in _kept_strings(c):
            at = unpaired_surrogate(value)
            if at is not None:
                raise _surrogate_refused(value[at], _escape_line(text, value[at]))
    return convs


def _kept_strings(c: Conversation) -> Iterator[str]:
    for t in c.turns:
        yield from (v for v in (t.speaker, t.text, t.time, t.ref) if v)
    yield from (v for v in (c.title, c.session_id, c.date) if v)


def _surrogate_refused(char: str, line: int | None) -> UsageError:
    where = f" at line {line}" if line is not None else ""
    return UsageError(
        f"the transcript holds an unpaired UTF-16 surrogate (\\u{ord(char):04x}){where}: half of a character "
        "(often an emoji cut in two by the program that wrote it), which UTF-8 text cannot hold; remove it or "
        "write the whole character, then capture again"
    )


def _escape_line(text: str, char: str) -> int | None:
    """The line of the first JSON escape of ``char`` (a surrogate) that is not half of a pair, if any.

    An escape counts when an even number of backslashes precedes it (``\\\\ud800`` is text); a first
    half is lone when no second half's escape follows it, a second half when no first half's precedes it.
    """
    code = rf"(?<!\\)(?:\\\\)*\\u(?i:{ord(char):04x})"
    if ord(char) < 0xDC00:
        pattern = code + r"(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    else:
        pattern = r"(?<!\\u[dD][89abAB][0-9a-fA-F]{2})" + code
    m = re.search(pattern, text)
    return None if m is None else text.count("\n", 0, m.start()) + 1


# ---------------------------------------------------------------------------- detection


def _detect(text: str) -> tuple[str, object]:
    """The format of ``text`` and, when it is one JSON document, that document."""
    s = text.lstrip()
    if s[:1] not in ("{", "["):
        return "markdown", None
    try:
        doc = json.loads(s)
    except RecursionError:
        raise UsageError("the JSON is nested too deeply to be a conversation") from None
    except ValueError:
        # Several JSON lines (the parser names a bad line), unless the first line is no JSON at all
        # ("[10:02] Alice: hi" is a transcript).
        first = s.split("\n", 1)[0].strip()
        try:
            json.loads(first)
        except (ValueError, RecursionError):
            return ("jsonl" if first.startswith("{") else "markdown"), None
        return "jsonl", None
    if _is_locomo(doc):
        return "locomo", doc
    return "jsonl", doc


def _is_locomo(doc: object) -> bool:
    if isinstance(doc, list):
        return bool(doc) and all(isinstance(d, dict) and _is_locomo(d) for d in doc)
    if not isinstance(doc, dict):
        return False
    conv = doc.get("conversation", doc)
    return isinstance(conv, dict) and any(re.fullmatch(r"session_\d+", k) and isinstance(v, list) for k, v in conv.items())


def _json_document(text: str, what: str) -> object:
    try:
        return json.loads(text)
    except RecursionError:
        raise UsageError("the JSON is nested too deeply to be a conversation") from None
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        raise UsageError(f"the file is not valid {what} JSON (line {line}): fix it, or give its --format") from None


# ---------------------------------------------------------------------------- chat JSON Lines


def _json_lines(text: str) -> list[tuple[int, dict[str, Any]]]:
    out: list[tuple[int, dict[str, Any]]] = []
    for n, line in enumerate(text.split("\n"), start=1):  # never splitlines(): U+2028 is valid inside JSON
        s = line.strip()
        if not s:
            continue
        try:
            obj = json.loads(s)
        except RecursionError:
            raise UsageError(f"line {n} is nested too deeply: fix or remove that line") from None
        except ValueError:
            raise UsageError(f"line {n} is not valid JSON: fix or remove that line (each line must be one JSON object)") from None
        if not isinstance(obj, dict):
            raise UsageError(f"line {n} is not a JSON object: each line must be a chat message like {{\"role\": ..., \"content\": ...}}")
        out.append((n, obj))
    return out


def _speaker(value: object) -> str:
    name = " ".join(str(value).split())[:MAX_SPEAKER_CHARS].rstrip(":").strip()
    return name or "unknown"


def _content_text(content: object) -> str:
    """The text of a message's content: a string, or the text parts of a list (others left out)."""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for p in content:
        if isinstance(p, str):
            t = p
        elif isinstance(p, dict) and isinstance(p.get("text"), str) and p.get("type", "text") in _TEXT_PARTS:
            t = p["text"]
        else:
            continue
        if t.strip():
            parts.append(t.strip())
    return "\n\n".join(parts)


def _time_of(obj: dict[str, Any]) -> str | None:
    for key in _TIME_KEYS:
        v = obj.get(key)
        if isinstance(v, str) and parse_iso(v) is not None:
            return v.strip()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e14:
            secs = v / 1000 if v > 1e11 else v  # epoch milliseconds or seconds
            return datetime.fromtimestamp(secs, tz=UTC).isoformat().replace("+00:00", "Z")
    return None


def _is_claude_code(objs: list[dict[str, Any]]) -> bool:
    return any(o.get("type") in ("user", "assistant") and isinstance(o.get("message"), dict) for o in objs)


def _chat(text: str, doc: object, title: str | None, date: str | None, session_id: str | None) -> Conversation:
    if isinstance(doc, dict) and isinstance(doc.get("messages"), list):
        doc = doc["messages"]
    if isinstance(doc, list):
        if not all(isinstance(m, dict) for m in doc):
            raise UsageError("the JSON array holds items that are not chat messages: each must be {\"role\": ..., \"content\": ...}")
        objs = list(enumerate(doc, start=1))
    elif isinstance(doc, dict):
        objs = [(1, doc)]
    else:
        objs = _json_lines(text)
    dicts = [o for _, o in objs]
    if _is_claude_code(dicts):
        return _claude_code(dicts, title, date, session_id)
    turns: list[RawTurn] = []
    for _, o in objs:
        msg = o.get("message") if isinstance(o.get("message"), dict) else o
        role = msg.get("role", o.get("role"))
        who = msg.get("name") or o.get("speaker") or role
        if who is None or (isinstance(role, str) and role.lower() in SKIPPED_ROLES):
            continue
        body = _content_text(msg["content"] if "content" in msg else o.get("text"))
        if body:
            turns.append((_speaker(who), body, _time_of(o) or _time_of(msg), None))
    if not turns:
        raise UsageError(
            "no chat messages with text were found: each line must be a JSON object like "
            "{\"role\": \"user\", \"content\": \"...\"} (or use --format markdown / locomo)"
        )
    sid = session_id or _first_str(dicts, ("session_id", "sessionId", "conversation_id"))
    return _finish(turns, "jsonl", title, date or turns[0][2], sid)


def _first_str(objs: list[dict[str, Any]], keys: tuple[str, ...]) -> str | None:
    for o in objs:
        for k in keys:
            v = o.get(k)
            if isinstance(v, str) and v.strip():
                return v.strip()[:200]
    return None


_COMMAND_ECHO = re.compile(r"^\s*<(?:command-name|command-message|command-args|local-command-stdout|local-command-stderr)>")
_INTERRUPTED = re.compile(r"^\[Request interrupted by user[^\]]*\]$")


def _claude_code(objs: list[dict[str, Any]], title: str | None, date: str | None, session_id: str | None) -> Conversation:
    turns: list[RawTurn] = []
    summary: str | None = None
    for o in objs:
        kind = o.get("type")
        if kind == "summary" and isinstance(o.get("summary"), str) and summary is None:
            summary = " ".join(o["summary"].split())[:300] or None
            continue
        msg = o.get("message")
        if kind not in ("user", "assistant") or not isinstance(msg, dict):
            continue
        if o.get("isSidechain") or o.get("isMeta") or o.get("isCompactSummary"):
            continue
        body = _content_text(msg.get("content"))
        if not body or _COMMAND_ECHO.match(body) or _INTERRUPTED.match(body):
            continue
        speaker = _speaker(msg.get("role") or kind)
        when = _time_of(o)
        if turns and turns[-1][0] == speaker and speaker == "assistant":
            # One reply, cut into several lines around tool calls (whose results are not kept).
            s, prev, t0, r = turns[-1]
            turns[-1] = (s, prev + "\n\n" + body, t0, r)
        else:
            turns.append((speaker, body, when, None))
    if not turns:
        raise UsageError("the Claude Code transcript holds no user or assistant text: nothing to capture")
    sid = session_id or _first_str(objs, ("sessionId",))
    return _finish(turns, "claude-code", title or summary, date or turns[0][2], sid)


def _finish(turns: list[RawTurn], fmt: str, title: str | None, date: str | None, session_id: str | None) -> Conversation:
    ts = renumber(turns)
    speakers = list(dict.fromkeys(t.speaker for t in ts))
    return Conversation(ts, title or derived_title(speakers, session_when(date)), date, session_id, fmt)


# ---------------------------------------------------------------------------- Markdown

# "Alice: text", "**Alice:** text", "**Alice**: text", "- Alice: text", "[2024-05-08 10:02] Alice: text"
# (a time in brackets: kept as the turn's time when it is ISO 8601). A name starts with a letter,
# holds at most MAX_NAME_WORDS words of letters, digits, spaces and . ' ’ - @ _, and the colon is followed by white
# space or the line's end (so "https://..." and "10:30" are not speakers).
_NAME_LINE = re.compile(
    r"^[ ]{0,3}(?:[-*+][ \t]+)?(?:\[(?P<time>[^\]\n]{1,40})\][ \t]*)?(?:\*\*|__)?(?P<name>[^\W\d_][\w .'’@-]{0,59}?)[ \t]*(?:\*\*|__)?:(?:\*\*|__)?(?:[ \t]+(?P<text>.*))?$"
)
_HEADING = re.compile(r"^[ ]{0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$")
_ISO_IN_TITLE = re.compile(r"\b(\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?)\b")


def _markdown(text: str, title: str | None, date: str | None, session_id: str | None, *, explicit: bool) -> Conversation:
    fm_title = fm_date = fm_session = None
    fm = parse_front_matter(text)
    if fm is not None:
        meta, end = fm
        text = text[end:]
        fm_title, fm_date, fm_session = (_str_or_none(meta.get(k)) for k in ("title", "date", "session_id"))
    h1: str | None = None
    turns: list[tuple[str, list[str], str | None]] = []  # (speaker, lines, time)
    fence = False
    for line in text.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        if not fence:
            h = _HEADING.match(line)
            if h is not None:
                if h.group(1) == "#" and h1 is None and not turns:
                    h1 = " ".join(h.group(2).split())
                if turns:
                    turns.append(("", [], None))  # a heading ends the turn (an empty turn is dropped below)
                continue
            m = _NAME_LINE.match(line)
            if m is not None and len(m.group("name").split()) <= MAX_NAME_WORDS:
                stamp = m.group("time")
                when = stamp.strip() if stamp and parse_iso(stamp.strip().replace(" ", "T")) is not None else None
                turns.append((_speaker(m.group("name")), [m.group("text") or ""], when))
                continue
        if turns:
            turns[-1][1].append(line)
    raw: list[RawTurn] = []
    for speaker, lines, when in turns:
        body = "\n".join(lines).strip()
        if speaker and body:
            raw.append((speaker, body, when, None))
    if not raw:
        if explicit:
            raise UsageError("no `Speaker: text` lines were found: write each turn as `Name: what they said` on its own line")
        raise UsageError(
            "cannot tell the format: no chat JSON Lines, LoCoMo JSON or Markdown `Speaker: text` lines were found; " + _HINT
        )
    title = title or fm_title or h1
    if date is None:
        date = fm_date if fm_date and parse_iso(fm_date) is not None else _date_in(title or "") or raw[0][2]
    return _finish(raw, "markdown", title, date, session_id or fm_session)


def _str_or_none(value: object) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _date_in(title: str) -> str | None:
    """A session date written in a title: "(1:56 pm on 8 May, 2023)" or an ISO date."""
    m = _ISO_IN_TITLE.search(title)
    if m is not None and parse_iso(m.group(1).replace(" ", "T")) is not None:
        return m.group(1).replace(" ", "T")
    for inner in re.findall(r"\(([^()]{4,60})\)", title):
        got = locomo_date(inner)
        if got is not None:
            return got
    return None


# ---------------------------------------------------------------------------- LoCoMo

_MONTH = {m[:3].lower(): i for i, m in enumerate(
    ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november", "december"),
    start=1)}
_LOCOMO_DATE = re.compile(
    r"^\s*(?:(\d{1,2}):(\d{2})\s*([ap])\.?m\.?\s+on\s+)?(\d{1,2})\s+([A-Za-z]+)\.?,?\s+(\d{4})\s*$", re.IGNORECASE
)


def locomo_date(value: str) -> str | None:
    """"1:56 pm on 8 May, 2023" -> "2023-05-08T13:56"; "8 May 2023" -> "2023-05-08"; else None."""
    m = _LOCOMO_DATE.match(value)
    if m is None:
        return None
    hh, mm, ap, day, month, year = m.groups()
    mon = _MONTH.get(month[:3].lower())
    if mon is None:
        return None
    try:
        if hh is None:
            return datetime(int(year), mon, int(day)).date().isoformat()
        hour = int(hh) % 12 + (12 if ap.lower() == "p" else 0)
        return datetime(int(year), mon, int(day), hour, int(mm)).strftime("%Y-%m-%dT%H:%M")
    except ValueError:
        return None


def _locomo(doc: object, title: str | None, date: str | None, session_id: str | None) -> list[Conversation]:
    if not _is_locomo(doc):
        raise UsageError("the JSON is not LoCoMo: it needs session_N lists of {speaker, text} turns (or try --format jsonl)")
    samples = doc if isinstance(doc, list) else [doc]
    out: list[Conversation] = []
    for i, sample in enumerate(samples, start=1):
        prefix = None if len(samples) == 1 else str(sample.get("sample_id") or i)
        out += _locomo_sample(sample, title, date, session_id, prefix)
    if not out:
        raise UsageError("the LoCoMo file holds no session with turns: nothing to capture")
    return out


def _locomo_sample(sample: dict[str, Any], title: str | None, date: str | None, session_id: str | None,
                   prefix: str | None) -> list[Conversation]:
    conv = sample.get("conversation", sample)
    sessions = sorted(
        (int(m.group(1)), v) for k, v in conv.items() if (m := re.fullmatch(r"session_(\d+)", k)) and isinstance(v, list)
    )
    a, b = str(conv.get("speaker_a") or ""), str(conv.get("speaker_b") or "")
    first = next((t.get("text", "") for _, turns in sessions for t in turns if isinstance(t, dict)), "")
    ident = sample.get("sample_id") or hashlib.sha256(f"{a}\0{b}\0{first}".encode()).hexdigest()[:12]
    out: list[Conversation] = []
    for n, turns in sessions:
        raw: list[RawTurn] = []
        for j, t in enumerate(turns, start=1):
            if not isinstance(t, dict) or not isinstance(t.get("speaker"), str):
                raise UsageError(f"session_{n} turn {j} is not a {{speaker, text}} object: fix the LoCoMo file")
            body = " ".join(str(t.get("text") or "").split())
            caption = t.get("blip_caption")
            if isinstance(caption, str) and caption.strip():
                body = (body + " " if body else "") + f"[shares a photo: {' '.join(caption.split())}]"
            if body:
                ref = t.get("dia_id")
                raw.append((_speaker(t["speaker"]), body, None, str(ref) if ref is not None else None))
        if not raw:
            continue
        when_raw = conv.get(f"session_{n}_date_time")
        day = (locomo_date(when_raw) or (when_raw.strip() if parse_iso(when_raw) else None)) if isinstance(when_raw, str) else None
        day = day or date
        speakers = [s for s in (a, b) if s] or list(dict.fromkeys(s for s, _, _, _ in raw))
        label = f"session {n}" if prefix is None else f"sample {prefix}, session {n}"
        ttl = f"{title}, {label}" if title else derived_title(speakers, None, n) + ("" if prefix is None else f" ({prefix})")
        sid = f"{session_id}:session_{n}" if session_id else f"locomo:{ident}:session_{n}"
        out.append(Conversation(renumber(raw), ttl, day, sid, "locomo"))
    return out


__all__ = ["FORMATS", "MAX_CONVERSATIONS", "MAX_TURNS", "locomo_date", "parse"]
