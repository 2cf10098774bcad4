"""Rule-based extraction: preferences, decisions and habits people state about themselves, without a model.

The path :mod:`.extract` takes when no generation service may be used. Precision comes before recall:
a rule fires only on a plain first-person statement at the start of a sentence, in a turn of a
person (never an assistant), and everything doubtful is left out:

- **who**: chat roles of assistants (``assistant``, ``ai``, ``bot``, ``model``, ``system``...) are
  never read; ``user`` / ``human`` is "the user"; any other speaker (a transcript's named people)
  speaks for themself and the fact names them ("Caroline prefers ...");
- **what**: "I prefer / I'd rather / I'd prefer ...", "I decided to / we decided ...", "I
  always / usually / never <verb> ..." and the same in French ("je préfère", "j'aime mieux", "j'ai
  décidé de", "nous avons décidé", "je ... toujours / jamais", "d'habitude je"), Chinese (我更喜欢,
  我宁愿, 我决定, 我们决定, 我总是, 我通常, 我从不) and Japanese (〜の方が好き, 〜ことにしました,
  〜に決めました, いつも, 普段, 決して〜ない);
- **left out**: questions (a ``?`` anywhere after the rule), refusals ("I prefer not to say", "我宁愿不说",
  "言いたくない"), quoted speech (a quoted span holding a first-person statement is dropped before
  anything is read), code (fenced or inline), ``>`` quoted lines, markup blocks (``<tag>...</tag>``),
  past habits ("I always wanted", "I never went", 我从来没), objects that are only a pronoun ("I
  prefer that"), and statements longer than a fact may be.

Each hit is a :class:`PatternFact`: category (preference, decision, pattern), a key normalised by
:func:`memoriesd.memory.facts.normalise_key` (the thing preferred or decided, a habit's verb and
object; prefixed with the speaker's name when it is not the user, so two people's tastes never
revise each other), a text of 3 to 500 characters in the third person where the language allows a
safe rewrite (English; French preferences and decisions; Chinese and Japanese by naming the
subject), else the sentence prefixed with who said it, and the ids of the turns it came from.
Pure functions: no model, no I/O.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .facts import MAX_CHARS, MIN_CHARS, normalise_key

__all__ = ["ASSISTANT_ROLES", "USER_ROLES", "MAX_FACTS", "PatternFact", "extract_patterns", "is_assistant", "sentences"]

#: Speakers that are a model, not a person: their turns are never read.
ASSISTANT_ROLES = frozenset(
    {"assistant", "ai", "bot", "model", "system", "tool", "developer", "function", "chatbot", "gpt", "chatgpt",
     "claude", "gemini", "copilot", "llm", "agent", "ai assistant"}
)
#: Speakers that are "the user" of a chat.
USER_ROLES = frozenset({"user", "human", "me", "you"})
#: Most facts one conversation yields (the latest statements win when there are more).
MAX_FACTS = 100
#: A statement longer than this (characters) is not a fact but a story: left out.
MAX_SENTENCE = 400


class TurnLike(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def speaker(self) -> str: ...
    @property
    def text(self) -> str: ...


@dataclass(frozen=True)
class PatternFact:
    category: str  # preference | decision | pattern
    key: str  # normalised: "preference:typescript"
    text: str
    turns: tuple[str, ...]
    speaker: str


def is_assistant(speaker: str) -> bool:
    return " ".join(speaker.split()).casefold() in ASSISTANT_ROLES


def _is_user(speaker: str) -> bool:
    return " ".join(speaker.split()).casefold() in USER_ROLES


# ---------------------------------------------------------------------------- cleaning and sentences

_FENCE = re.compile(r"```.*?(?:```|\Z)|~~~.*?(?:~~~|\Z)", re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_MARKUP = re.compile(r"<([A-Za-z][\w-]{0,40})\b[^>]*>.*?</\1\s*>", re.DOTALL)
_TAG = re.compile(r"</?[A-Za-z][\w-]{0,40}\b[^>\n]{0,200}>")
_QUOTE_LINE = re.compile(r"^\s*>.*$", re.MULTILINE)
_QUOTED = re.compile(r"\"[^\"\n]{1,400}\"|“[^”\n]{1,400}”|«[^»\n]{1,400}»|「[^」\n]{1,400}」|『[^』\n]{1,400}』|‘[^’\n]{1,400}’")
_FIRST_PERSON = re.compile(r"(?i)\b(?:i|i'm|i'd|i've|i'll|we|we're|we've|je|j'|nous|on)\b|[我私僕俺]")
_LATIN_SPLIT = re.compile(r"(?<=[.!?…])\s+|\n+|;\s*")
_CJK_SPLIT = re.compile(r"(?<=[。！？!?；;…])|\n+")
_HAS_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]")


def _clean(text: str) -> str:
    """The turn's own words: no code, markup, quoted lines or quoted first-person speech."""
    t = unicodedata.normalize("NFKC", text).replace("’", "'")
    t = _FENCE.sub("\n", t)
    t = _MARKUP.sub("\n", t)
    t = _TAG.sub(" ", t)
    t = _INLINE_CODE.sub(" code ", t)
    t = _QUOTE_LINE.sub("\n", t)
    # NFKC made curly double quotes straight only in some fonts' forms: handle both kinds.
    return _QUOTED.sub(lambda m: "\n" if _FIRST_PERSON.search(m.group()[1:-1]) else m.group(), t)


def sentences(text: str) -> list[str]:
    """The sentences of a turn's cleaned text (Latin and CJK punctuation; line breaks end one too)."""
    out: list[str] = []
    for part in _LATIN_SPLIT.split(_clean(text)):
        pieces = _CJK_SPLIT.split(part) if _HAS_CJK.search(part) else [part]
        out.extend(s for p in pieces if (s := " ".join(p.split())))
    return out


# ---------------------------------------------------------------------------- keys

_WORDS = re.compile(r"[^\W_][\w+#.'-]*", re.UNICODE)
_EN_STOP = frozenset(
    """
    a an the and or but of to in on at by for with from as is are was were be been being it its this that these those
    there here i me my mine myself we our us ours you your he she they them their his her it's i'm i'd i've we've
    do does did doing have has had having will would should can could may might must not no so than then too very
    really just also still even more most less much many some any all every each other another new old one ones thing
    things stuff lot lots use using used go going get getting try trying make making keep start always usually never
    normally typically generally often sometimes instead rather prefer well quite pretty before after during around
    about into onto up down out off under again once twice
    """.split()
)
_FR_STOP = frozenset(
    """
    le la les l' un une des du de d' à au aux en et ou que qu' qui pour avec sur dans par plus moins mon ma mes ton ta
    tes son sa ses notre nos votre vos leur leurs ce cet cette ces ne n' pas y je j' me m' moi nous on se s' te t' très
    bien toujours jamais tout tous toute toutes autre être avoir faire plutôt est sont ça cela utiliser
    """.split()
)
_EN_CUT = re.compile(
    r"\b(?:over|than|instead|rather|versus|vs|because|since|unless|but|when|whenever|while|if|though|although|so that)\b|[,;:()—–]",
    re.IGNORECASE,
)
_FR_CUT = re.compile(r"\b(?:plutôt|au lieu|parce|car|quand|lorsque|si|mais|puisque|comme|sauf)\b|[,;:()—–]", re.IGNORECASE)
_CJK_CUT = re.compile(r"而不是|而非|胜过|胜于|多于|因为|所以|但是|不过|比较|比|，|,|、|より|ので|けど|けれど|が、|ため")
_CJK_LEAD = re.compile(r"^(?:用|使用|去|在|喝|吃|的|を|は|が|に|で)+")
_CJK_PUNCT = re.compile(r"[\s\W_]+", re.UNICODE)


def _latin_key(obj: str, stop: frozenset[str], cut: re.Pattern[str]) -> str:
    obj = re.sub(r"(?i)^(?:to|de|d'|à)\s+", "", obj.strip())
    m = cut.search(obj)
    head = obj[: m.start()] if m and m.start() > 0 else obj
    words = [w.strip(".'-").casefold() for w in _WORDS.findall(head)]
    content = [w for w in words if w and w not in stop and not w.startswith(("l'", "d'", "j'", "m'", "s'", "qu'", "n'"))]
    if not content:
        content = [w.split("'", 1)[-1] for w in words if "'" in w and w.split("'", 1)[-1] not in stop]
    return "-".join(content[:3])


def _cjk_key(obj: str) -> str:
    m = _CJK_CUT.search(obj)
    head = obj[: m.start()] if m and m.start() > 0 else obj
    head = _CJK_LEAD.sub("", _CJK_PUNCT.sub("", head))
    return head[:16].casefold()


def _key(category: str, who: str | None, words: str) -> str:
    if not words:
        return ""
    return normalise_key(category, f"{who} {words}" if who else words)


# ---------------------------------------------------------------------------- English

_EN_LEAD = (
    r"^(?:(?:well|honestly|personally|frankly|actually|ok(?:ay)?|so|and|but|also|yes|yeah|yep|no|nope|oh|hmm+|anyway|"
    r"to be honest|in general|generally|for the record|fwiw|tbh|these days|nowadays|now|for now|from now on)"
    r"\s*[,:!\-]?\s+)*(?:i (?:think|guess|suppose|believe|find|'d say|would say|must say)(?: that)?,?\s+)?"
)
_EN_PREFER = re.compile(
    _EN_LEAD + r"i(?:(?P<would>'d|\s+would)\s+(?:much\s+|really\s+|definitely\s+|still\s+)?(?P<verb>rather|prefer)"
    r"|\s+(?P<adv>really\s+|much\s+|definitely\s+|generally\s+|usually\s+|strongly\s+|still\s+|now\s+|always\s+|tend\s+to\s+)?"
    r"(?P<verb2>prefer))\s+(?P<obj>.+)$",
    re.IGNORECASE,
)
_EN_DECIDE = re.compile(
    _EN_LEAD + r"(?P<who>i|we)(?:'ve|\s+have|\s+had|'d)?\s+(?:just\s+|finally\s+|already\s+|now\s+|all\s+|jointly\s+)?"
    r"decided\s+(?P<obj>(?:to|that|on|against|not\s+to)\s+.+)$",
    re.IGNORECASE,
)
_EN_HABIT = re.compile(
    _EN_LEAD + r"i\s+(?P<adv>always|usually|never|normally|typically|generally)\s+(?P<verb>[a-z]+)\b(?P<rest>.*)$",
    re.IGNORECASE,
)
#: Verbs after "I always/never" that tell a past or a feeling, not a habit ("I never knew", "I always wanted").
_EN_NOT_HABIT = frozenset(
    """
    thought knew said was were had did got went felt saw told made wanted used liked loved been meant realized
    realised expected imagined dreamed dreamt understood heard found tried ate drank wrote read ran came took gave
    became began left lost met paid sat stood won bought brought caught taught fought sought would could should might
    must will shall can wish hoped believed figured guessed assumed suspected
    """.split()
)
_EN_IRREGULAR = {"am": "is", "have": "has", "do": "does", "go": "goes", "be": "is", "can": "can", "will": "will",
                 "would": "would", "should": "should", "must": "must", "may": "may", "might": "might", "could": "could"}
_EN_REFUSAL = re.compile(
    r"^not(?:\s+to)?(?:\s+(?:say|tell|answer|talk|discuss|comment|share|disclose|reveal|go\s+into|get\s+into|elaborate|"
    r"speculate|respond|reply|explain|mention|specify|bring\s+(?:it|that)\s+up|think\s+about\s+(?:it|that))\b.*)?[.!]*$",
    re.IGNORECASE,
)
_EN_PRONOUN_ONLY = re.compile(
    r"^(?:it|that|this|these|those|them|one|the\s+(?:first|second|former|latter|other)(?:\s+one)?|the\s+one|yours|mine|"
    r"both|either|neither|neither\s+one|so|not|that\s+one|this\s+one|the\s+same|something\s+else|whatever)[.!]*$",
    re.IGNORECASE,
)
_EN_PERSON = [
    (re.compile(r"\bI am\b"), "they are"), (re.compile(r"\bI was\b"), "they were"), (re.compile(r"\bI'm\b"), "they're"),
    (re.compile(r"\bI've\b"), "they've"), (re.compile(r"\bI'll\b"), "they'll"), (re.compile(r"\bI'd\b"), "they'd"),
    (re.compile(r"\bI\b"), "they"), (re.compile(r"\b[Mm]yself\b"), "themselves"), (re.compile(r"\b[Mm]ine\b"), "theirs"),
    (re.compile(r"\b[Mm]y\b"), "their"), (re.compile(r"\b[Mm]e\b"), "them"),
]


def _en_third(text: str) -> str:
    for rx, repl in _EN_PERSON:
        text = rx.sub(repl, text)
    return text


def _en_conj(verb: str) -> str:
    v = verb.casefold()
    if v in _EN_IRREGULAR:
        return _EN_IRREGULAR[v]
    if re.search(r"(?:s|sh|ch|x|z|o)$", v):
        return v + "es"
    if re.search(r"[^aeiou]y$", v):
        return v[:-1] + "ies"
    return v + "s"


def _finish(text: str) -> str:
    t = text.strip().rstrip(",;:-—–")
    t = re.sub(r"[.!…]+$", "", t).strip()
    return t + "." if t and not re.search(r"[.!?。！？]$", t) else t


def _en(sentence: str, who: str, key_who: str | None) -> tuple[str, str, str] | None:
    if m := _EN_PREFER.match(sentence):
        obj = m.group("obj").strip()
        if _EN_REFUSAL.match(obj) or _EN_PRONOUN_ONLY.match(obj) or obj.casefold().startswith(("not say", "no comment")):
            return None
        verb = (m.group("verb") or m.group("verb2")).casefold()
        if m.group("would"):
            phrase = "would rather" if verb == "rather" else "would prefer"
        else:
            adv = (m.group("adv") or "").strip().casefold()
            phrase = "tends to prefer" if adv.startswith("tend") else f"{adv + ' ' if adv else ''}prefers"
        key = _latin_key(obj, _EN_STOP, _EN_CUT)
        return "preference", f"{who} {phrase} {_en_third(obj)}", _key("preference", key_who, key)
    if m := _EN_DECIDE.match(sentence):
        obj = m.group("obj").strip()
        rest = re.sub(r"(?i)^(?:to|that|on|against|not\s+to)\s+", "", obj)
        if _EN_PRONOUN_ONLY.match(rest):
            return None
        subject = who if m.group("who").casefold() == "i" else f"{who} and others"
        key = _latin_key(re.sub(r"(?i)^(?:go|going)\s+(?:with|for)\s+", "", rest), _EN_STOP, _EN_CUT)
        text = f"{subject} decided {_en_third(obj) if m.group('who').casefold() == 'i' else obj}"
        return "decision", text, _key("decision", key_who, key)
    if m := _EN_HABIT.match(sentence):
        verb = m.group("verb")
        if verb.casefold() in _EN_NOT_HABIT or verb.casefold().endswith("ed") or not m.group("rest").strip():
            return None
        adv = m.group("adv").casefold()
        text = f"{who} {adv} {_en_conj(verb)}{_en_third(m.group('rest'))}"
        key = _latin_key(f"{verb} {m.group('rest')}", _EN_STOP - {"go", "get", "make", "keep", "use", "start", "try"}, _EN_CUT)
        return "pattern", text, _key("pattern", key_who, key)
    return None


# ---------------------------------------------------------------------------- French

_FR_LEAD = (
    r"^(?:(?:bon|bref|alors|donc|et|mais|aussi|oui|non|franchement|honnêtement|personnellement|perso|en fait|"
    r"en tout cas|sinon|maintenant|désormais)\s*[,:!\-]?\s+)*(?:je (?:pense|crois|trouve) que\s+|(?:moi|perso),?\s+)?"
)
_FR_PREFER = re.compile(
    _FR_LEAD + r"(?:je\s+(?P<v1>préfère|préférerais|préfèrerais)|j'(?P<v2>aime(?:rais)?\s+mieux))\s+(?P<obj>.+)$",
    re.IGNORECASE,
)
_FR_DECIDE = re.compile(
    _FR_LEAD + r"(?:(?P<i>j'ai)\s+(?:(?:enfin|finalement|donc|déjà)\s+)?(?:décidé|pris\s+la\s+décision)|"
    r"(?P<we>nous\s+avons|on\s+a)\s+(?:(?:enfin|finalement|donc|déjà)\s+)?(?:décidé|pris\s+la\s+décision))\s+"
    r"(?P<obj>(?:de|d'|que|qu')\s*.+)$",
    re.IGNORECASE,
)
_FR_HABIT = re.compile(
    _FR_LEAD + r"(?:(?:d'habitude|en général|généralement|habituellement)\s*,?\s*(?P<s1>je|j')\s*(?P<o1>.+)"
    r"|(?P<s2>je|j')\s*(?P<v2>[\w]+)\s+(?P<a2>toujours|jamais|habituellement|généralement)\b(?P<o2>.*)"
    r"|(?P<s3>je\s+ne|je\s+n'|j'\s*ne)\s*(?P<v3>[\w]+)\s+jamais\b(?P<o3>.*))$",
    re.IGNORECASE,
)
_FR_NOT_HABIT = frozenset({"suis", "ai", "étais", "avais", "serai", "aurai", "serais", "aurais", "ne", "n"})
_FR_REFUSAL = re.compile(
    r"^(?:ne\s+(?:pas|rien)|pas|rien)\b(?:\s+(?:en\s+)?(?:dire|répondre|parler|commenter|préciser|m'étendre|"
    r"détailler|discuter|expliquer|révéler))?.{0,30}$",
    re.IGNORECASE,
)
_FR_PRONOUN_ONLY = re.compile(r"^(?:ça|cela|ceci|celui-ci|celle-ci|celui-là|celle-là|le\s+premier|la\s+première|les\s+deux|l'autre)[.!]*$", re.IGNORECASE)
_FR_PERSON = [(re.compile(r"\bmon\b"), "son"), (re.compile(r"\bma\b"), "sa"), (re.compile(r"\bmes\b"), "ses"),
              (re.compile(r"\bme\b"), "se"), (re.compile(r"\bm'"), "s'")]
_FR_WHO = {"user": "L'utilisateur"}


def _fr_third(text: str) -> str:
    for rx, repl in _FR_PERSON:
        text = rx.sub(repl, text)
    return text


def _fr(sentence: str, who: str, key_who: str | None) -> tuple[str, str, str] | None:
    if m := _FR_PREFER.match(sentence):
        obj = m.group("obj").strip()
        if _FR_REFUSAL.match(obj) or _FR_PRONOUN_ONLY.match(obj):
            return None
        verb = (m.group("v1") or "").casefold()
        phrase = "aimerait mieux" if (m.group("v2") or "").casefold().startswith("aimerais") else (
            "aime mieux" if m.group("v2") else ("préférerait" if verb.startswith(("préférerais", "préfèrerais")) else "préfère"))
        return "preference", f"{who} {phrase} {_fr_third(obj)}", _key("preference", key_who, _latin_key(obj, _FR_STOP, _FR_CUT))
    if m := _FR_DECIDE.match(sentence):
        obj = m.group("obj").strip()
        rest = re.sub(r"(?i)^(?:de|d'|que|qu')\s*", "", obj)
        if not rest or _FR_PRONOUN_ONLY.match(rest):
            return None
        key = _key("decision", key_who, _latin_key(rest, _FR_STOP, _FR_CUT))
        if m.group("i"):
            return "decision", f"{who} a décidé {_fr_third(obj)}", key
        return "decision", f"{who} : {_finish(sentence)}", key
    if m := _FR_HABIT.match(sentence):
        if m.group("o1") is not None:
            obj, verb = m.group("o1"), (m.group("o1").split() or [""])[0]
        elif m.group("v2") is not None:
            obj, verb = f"{m.group('v2')} {m.group('o2')}", m.group("v2")
        else:
            obj, verb = f"{m.group('v3')} {m.group('o3')}", m.group("v3")
        if verb.casefold() in _FR_NOT_HABIT or verb.casefold().endswith(("é", "ée", "és")) or len(obj.split()) < 2:
            return None
        return "pattern", f"{who} : {_finish(sentence)}", _key("pattern", key_who, _latin_key(obj, _FR_STOP, _FR_CUT))
    return None


# ---------------------------------------------------------------------------- Chinese

_ZH_LEAD = r"^(?:其实|说实话|老实说|坦白说|不过|但是|所以|嗯|对|是的|好吧|现在|如今|我觉得|我想)?[，,\s]*"
_ZH_PREFER = re.compile(_ZH_LEAD + r"我(?:还是|现在|一直)?(?P<v>更喜欢|比较喜欢|更偏好|偏好|更倾向于|倾向于|宁愿|宁可|更愿意)(?P<obj>.+)$")
_ZH_DECIDE = re.compile(_ZH_LEAD + r"(?P<s>我们|我)(?:已经|最后|最终|终于|刚刚|还是)?(?:决定|下定决心)(?:了)?[，,]?(?P<obj>.+)$")
_ZH_HABIT = re.compile(_ZH_LEAD + r"我(?P<adv>总是|通常|一般都|一般|平时|平常|从不|从来不|向来|每次都)(?P<obj>.+)$")
_ZH_REFUSAL = re.compile(r"^(?:不说|不回答|不谈|不讲|不透露|不告诉|不评论|不提|保密|不了|不要说)")


def _zh(sentence: str, who: str, key_who: str | None) -> tuple[str, str, str] | None:
    s = sentence.rstrip("。！!…")
    if m := _ZH_PREFER.match(s):
        obj = m.group("obj").strip()
        if _ZH_REFUSAL.match(obj) or len(obj) < 2 or obj in ("这个", "那个", "这样", "那样"):
            return None
        return "preference", f"{who}{m.group('v')}{obj}。", _key("preference", key_who, _cjk_key(obj))
    if m := _ZH_DECIDE.match(s):
        obj = m.group("obj").strip()
        if _ZH_REFUSAL.match(obj) or len(obj) < 2:
            return None
        text = f"{who}决定{obj}。" if m.group("s") == "我" else f"{who}：{s}。"
        return "decision", text, _key("decision", key_who, _cjk_key(obj))
    if m := _ZH_HABIT.match(s):
        obj = m.group("obj").strip()
        if obj.startswith(("没", "是", "不知道")) or len(obj) < 2:
            return None
        return "pattern", f"{who}{m.group('adv')}{obj}。", _key("pattern", key_who, _cjk_key(obj))
    return None


# ---------------------------------------------------------------------------- Japanese

_JA_SUBJ = r"(?:(?P<subj>私|わたし|僕|ぼく|俺|おれ|あたし|自分)(?:は|も|としては)、?)?"
_JA_WE = r"(?:(?P<we>私たち|わたしたち|僕たち|僕ら|俺たち|我々|うち)(?:は|も)、?)"
_JA_LEAD = r"^(?:実は|正直|正直に言うと|やっぱり|やはり|でも|だから|まあ|今は|最近は|個人的には)?、?"
_JA_PREFER = re.compile(_JA_LEAD + _JA_SUBJ + r"(?P<obj>[^はが。]{1,80}?)(?:の方|のほう|方)が(?P<v>好き|いい|良い)(?P<tail>.*)$")
_JA_PREFER2 = re.compile(_JA_LEAD + _JA_SUBJ + r"(?P<obj>[^は。]{1,80}?)を好(?:みます|む|んでいます|んでいる)(?P<tail>.*)$")
_JA_DECIDE = re.compile(
    _JA_LEAD + r"(?:" + _JA_SUBJ + r"|" + _JA_WE + r")(?P<obj>[^は。]{1,120}?)"
    r"(?P<v>ことにしました|ことにした|ことに決めました|ことに決めた|に決めました|に決めた|と決めました|と決めた|ことにしています)(?P<tail>.*)$"
)
_JA_HABIT = re.compile(
    _JA_LEAD + _JA_SUBJ + r"(?P<adv>いつも|普段は|普段|たいてい|大抵|決して|絶対に)、?(?P<obj>[^は]{2,120}?)(?P<tail>)$"
)
_JA_VERB_END = re.compile(r"(?:ます|ません|ています|ている|てる|る|う|く|す|ぐ|む|ぶ|つ|ぬ|ない|です)$")
_JA_REFUSAL = re.compile(r"言いたくない|答えたくない|遠慮|控え|秘密|内緒|ありがとう|お世話")


def _ja(sentence: str, who: str, key_who: str | None) -> tuple[str, str, str] | None:
    s = sentence.rstrip("。！!…")
    if s.endswith(("か", "かな", "かしら", "の")):
        return None  # a question without a question mark
    for rx in (_JA_PREFER, _JA_PREFER2):
        if m := rx.match(s):
            obj = m.group("obj").strip("、 ")
            if _JA_REFUSAL.search(s) or len(obj) < 2 or obj in ("こっち", "そっち", "あっち", "これ", "それ", "あれ"):
                return None
            text = f"{who}は{s[m.start('obj'):]}。"
            pref = obj.split("より")[-1] if "より" in obj else obj
            return "preference", text, _key("preference", key_who, _cjk_key(pref))
    if m := _JA_DECIDE.match(s):
        obj = m.group("obj").strip("、 ")
        if _JA_REFUSAL.search(s) or len(obj) < 2:
            return None
        text = f"{who}は{s[m.start('obj'):]}。" if m.group("we") is None else f"{who}：{s}。"
        return "decision", text, _key("decision", key_who, _cjk_key(obj))
    if m := _JA_HABIT.match(s):
        obj = m.group("obj").strip("、 ")
        adv = m.group("adv")
        if _JA_REFUSAL.search(s) or not _JA_VERB_END.search(obj) or "た" == obj[-1:]:
            return None
        if adv in ("決して", "絶対に") and not re.search(r"(?:ない|ません)$", obj):
            return None
        return "pattern", f"{who}は{s[m.start('adv'):]}。", _key("pattern", key_who, _cjk_key(obj))
    return None


# ---------------------------------------------------------------------------- all together

_KANA = re.compile(r"[\u3040-\u30ff]")
_HAN = re.compile(r"[\u4e00-\u9fff]")
_LABELS = {"en": "The user", "fr": "L'utilisateur", "zh": "用户", "ja": "ユーザー"}
_Rule = Callable[[str, str, "str | None"], "tuple[str, str, str] | None"]


def _rules(sentence: str) -> list[tuple[str, _Rule]]:
    if _KANA.search(sentence):
        return [("ja", _ja)]
    if _HAN.search(sentence):
        return [("zh", _zh), ("ja", _ja)]
    return [("en", _en), ("fr", _fr)]


def _one(sentence: str, speaker: str) -> tuple[str, str, str] | None:
    """``(category, text, key)`` of one sentence, or None."""
    if len(sentence) > MAX_SENTENCE or "?" in sentence or "？" in sentence:
        return None
    user = _is_user(speaker)
    name = " ".join(speaker.split())
    for lang, rule in _rules(sentence):
        who = _LABELS[lang] if user else name
        got = rule(sentence, who, None if user else name)
        if got is None:
            continue
        category, text, key = got
        text = _finish(text)
        if not key or not MIN_CHARS <= len(text) <= MAX_CHARS:
            return None
        return category, text[0].upper() + text[1:] if lang in ("en", "fr") else text, key
    return None


def extract_patterns(turns: Sequence[TurnLike]) -> list[PatternFact]:
    """The facts people state in ``turns`` (module docstring), one per key: a later statement of the
    same key replaces an earlier one (it is what the person said last), keeping both turns."""
    found: dict[str, PatternFact] = {}
    for turn in turns:
        if is_assistant(turn.speaker) or not turn.text.strip():
            continue
        for sentence in sentences(turn.text):
            got = _one(sentence, turn.speaker)
            if got is None:
                continue
            category, text, key = got
            prev = found.pop(key, None)
            ids = tuple(dict.fromkeys([*(prev.turns if prev else ()), turn.id]))
            found[key] = PatternFact(category, key, text, ids, turn.speaker)
    facts = list(found.values())
    return facts[-MAX_FACTS:]
