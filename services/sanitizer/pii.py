"""PII detection and masking, whole texts and token streams, with no I/O.

Candidates are found by a few compiled patterns, then validated the way the number
itself is defined (Luhn for cards, GB 11643 for Chinese resident IDs, mod 97 for
IBANs, SSA rules for SSNs, octet ranges for IPv4), so that order numbers, timestamps
and version strings stay as they are.

``StreamMasker`` masks a stream chunk by chunk. It holds back only the tail that
could still grow into an entity (a trailing run of digits and separators, a word
that could be an email's local part, an IBAN's start) and proves the rest final:
masking a text in any split gives the same output as masking it whole.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .normalize import INVISIBLE

ENTITY_TYPES = (
    "CREDIT_CARD",
    "CN_ID_CARD",
    "PHONE",
    "EMAIL",
    "IBAN",
    "IP_ADDRESS",
    "US_SSN",
    "SECRET",
)

_HIDDEN = "\x7f"
"""What an invisible character (a zero-width space, a soft hyphen) reads as: a mark
that can sit anywhere inside an entity and counts as nothing."""


def _fold_table() -> dict[int, str]:
    """One character for one, so offsets stay put: fullwidth forms read as ASCII
    ("４１１１" as "4111"), every script's decimal digits as 0-9, the ideographic
    space as a space, invisible characters as ``_HIDDEN``."""
    table = {cp: chr(cp - 0xFEE0) for cp in range(0xFF01, 0xFF5F)}
    table[0x3000] = " "
    for cp in range(0x80, 0x10000):
        ch = chr(cp)
        if ch.isdecimal() and cp not in table:
            table[cp] = str(unicodedata.decimal(ch))
    for ch in INVISIBLE:
        table[ord(ch)] = _HIDDEN
    return table


_FOLD = _fold_table()
_FOLDS = re.compile("[" + "".join(sorted(map(chr, _FOLD))) + "]")


def fold(text: str) -> str:
    # most text has nothing to fold; finding that out is cheaper than translating it
    if text.isascii() or not _FOLDS.search(text):
        return text
    return text.translate(_FOLD)


@dataclass(frozen=True, slots=True)
class Entity:
    type: str
    start: int
    end: int
    masked: str


# -- candidates ---------------------------------------------------------------------------

# digit groups joined by single separators: cards, IDs, phones, SSNs
_DIGITS = (
    r"(?:\+\s?)?(?:\(\d{1,4}\)\s?)?\d(?:(?:-\n|[ \-.\n\x7f])?\x7f*\d|\)\s?\d|\s?\(\d)*"
    r"(?:(?<=\d)[Xx])?"
)
# "bob [at] example [dot] com", "bob(at)example(dot)com", "bob@example[.]com"
_AT = r"(?: ?[\[({<] ?(?i:at|@) ?[\])}>] ?|@)"
_DOT = r"(?: ?[\[({<] ?(?i:dot|\.) ?[\])}>] ?|\.)"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9\-]{0,62}[A-Za-z0-9])?"
# API keys and access tokens in the formats their issuers publish, each with the
# prefix that says what it is (as gitleaks' rules read them); at most 128 characters,
# the windows' overlap
_SECRET = (
    r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}"  # AWS access key id
    r"|gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{82}"  # GitHub
    r"|glpat-[A-Za-z0-9_\-]{20}"  # GitLab
    r"|xox[abposr]-[A-Za-z0-9\-]{10,72}"  # Slack
    r"|[rs]k_(?:live|test)_[A-Za-z0-9]{24,99}"  # Stripe
    r"|AIza[A-Za-z0-9_\-]{35}"  # Google
    r"|hf_[A-Za-z0-9]{34}"  # Hugging Face
    r"|npm_[A-Za-z0-9]{36}"  # npm
    r"|sk-ant-[a-z]+\d\d-[A-Za-z0-9_\-]{80,100}"  # Anthropic
    r"|sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,120}"  # OpenAI
)
_CANDIDATE = re.compile(
    r"(?P<secret>(?<![A-Za-z0-9_\-])(?:" + _SECRET + r")(?![A-Za-z0-9_\-]))"
    r"|(?P<email>(?<![A-Za-z0-9_%+\-])[A-Za-z0-9][A-Za-z0-9._%+\-]{0,63}"
    + _AT
    + _LABEL
    + r"(?:"
    + _DOT
    + _LABEL
    + r")*"
    + _DOT
    + r"[A-Za-z]{2,24}(?![A-Za-z0-9\-]))"
    # (an IBAN in one piece wrapped onto two lines, or in groups with any break)
    r"|(?P<iban>(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?:[A-Z0-9]{1,30}\n[A-Z0-9]{1,30}(?![A-Za-z0-9 ])"
    r"|(?:[ \n]?[A-Z0-9]{4}){2,7}(?:[ \n]?[A-Z0-9]{1,4})?)"
    r"(?![A-Za-z0-9]))"
    r"|(?P<ip>(?<![A-Za-z0-9.\-])(?:\d{1,3}\.){3}\d{1,3}(?![0-9]|\.\d|-[A-Za-z0-9]))"
    r"|(?P<digits>(?<![0-9+])(?<![0-9][\-.])" + _DIGITS + r"(?![A-Za-z0-9]|[\-.]\d))"
)

# Entities live inside "runs": characters that can be part of one, where a single
# space joins groups of digits and capitals ("4111 1111", "GB29 NWBK", "(415) 555").
# Anything else ends a run, so a stream can release a run once the character after
# it is known, and whole texts and streams split into the same runs.
_CH = r"[A-Za-z0-9@._%+\-()\x7f]"
# a space between capitals and digits, a line break inside a number, an "at" or a
# "dot" written out in brackets
_OBFUSCATED = r" ?[\[({<] ?(?i:at|dot|@|\.) ?[\])}>] ?"
_JOIN = r"(?:(?<=[A-Z0-9)]) (?=[A-Z0-9(+])|(?<=[A-Z0-9\-])\n(?=[A-Z0-9])|" + _OBFUSCATED + ")"
_RUN = re.compile(_CH + r"+(?:" + _JOIN + _CH + r"+)*")
_JOINS_AFTER = re.compile(r"[A-Z0-9)]")
_WRAPS_AFTER = re.compile(r"[A-Z0-9\-]")


def _join_prefixes() -> frozenset[str]:
    """Every start of a written-out join ("", " [", " [at", ...), lower-cased: a stream
    holds a run back while what follows it could still be one."""
    out: set[str] = set()
    for s1, s2, s3, s4 in (
        (a, b, c, d) for a in ("", " ") for b in ("", " ") for c in ("", " ") for d in ("", " ")
    ):
        for o in "[({<":
            for w in ("at", "dot", "@", "."):
                for c in "])}>":
                    j = f"{s1}{o}{s2}{w}{s3}{c}{s4}"
                    out.update(j[:i] for i in range(1, len(j) + 1))
    return frozenset(out)


_JOIN_PREFIXES = _join_prefixes()
_JOIN_LOOKAHEAD = max(map(len, _JOIN_PREFIXES))
_WINDOW = 256
_OVERLAP = 128
"""Long runs are scanned in windows of ``_WINDOW`` characters, each read on for
``_OVERLAP`` more (longer than any entity) so that nothing is missed at a seam; a
window owns the entities that start in it. Whole texts and streams use the same
windows, and a stream never holds back more than one window and its overlap."""


# -- validation ------------------------------------------------------------------------


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


_GB11643_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_GB11643_CHECK = "10X98765432"
_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def cn_id_ok(text: str) -> bool:
    """GB 11643-1999: region, a real birth date, and the ISO 7064 MOD 11-2 check."""
    if len(text) != 18 or not text[:17].isdigit() or text[0] == "0":
        return False
    year, month, day = int(text[6:10]), int(text[10:12]), int(text[12:14])
    if not (1900 <= year <= 2099 and 1 <= month <= 12 and 1 <= day <= _DAYS[month - 1]):
        return False
    s = sum(int(c) * w for c, w in zip(text[:17], _GB11643_WEIGHTS, strict=True))
    return _GB11643_CHECK[s % 11] == text[17].upper()


def _cn_id_shaped(digits: str) -> bool:
    """Region and birth date in place, whatever the check digit."""
    return cn_id_ok(
        digits[:17]
        + _GB11643_CHECK[
            sum(int(c) * w for c, w in zip(digits[:17], _GB11643_WEIGHTS, strict=False)) % 11
        ]
    )


_IBAN_COUNTRIES = frozenset(
    "AD AE AL AT AZ BA BE BG BH BR BY CH CR CY CZ DE DK DO EE EG ES FI FO FR GB GE GI GL GR "
    "GT HR HU IE IL IQ IS IT JO KW KZ LB LC LI LT LU LV LY MC MD ME MK MR MT MU NI NL NO OM "
    "PK PL PS PT QA RO RS RU SA SC SD SE SI SK SM SO ST SV TL TN TR UA VA VG XK".split()
)


def iban_ok(text: str) -> bool:
    compact = text.replace(" ", "").replace("\n", "")
    if not 15 <= len(compact) <= 34:
        return False
    moved = compact[4:] + compact[:4]
    number = "".join(str(int(c, 36)) for c in moved)
    return int(number) % 97 == 1


def ssn_ok(area: str, group: str, serial: str) -> bool:
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def ipv4_ok(text: str) -> bool:
    parts = text.split(".")
    return all(len(p) == 1 or (p[0] != "0" and int(p) <= 255) for p in parts)


_SECRET_PREFIX = re.compile(
    r"AKIA|ASIA|ABIA|ACCA|AIza|gh[pousr]_|github_pat_|glpat-|xox[a-z]-|[rs]k_(?:live|test)_"
    r"|hf_|npm_|sk-ant-|sk-(?:proj-|svcacct-|admin-)?"
)


def secret_ok(text: str) -> bool:
    """Random past its prefix, as issued keys are: letters and digits both (a
    placeholder such as "sk-xxxxxxxxxxxxxxxxxxxxxxxx" is none), and no character
    making up half of it."""
    prefix = _SECRET_PREFIX.match(text)
    body = text[prefix.end() if prefix else 0 :]
    return (
        any(c.isdigit() for c in body)
        and any(c.isalpha() for c in body)
        and max(map(body.count, set(body))) * 2 < len(body)
    )


_IPV4 = re.compile(r"(?:\d{1,3}\.){3}\d{1,3}")
_CN_MOBILE = re.compile(r"(?:\+86[ \-]?)?(1[3-9]\d)[ \-]?(\d{4})[ \-]?(\d{4})")
_SSN = re.compile(r"(\d{3})-(\d{2})-(\d{4})")
_US_PHONE = re.compile(
    r"(?:\+1[ \-.]?)?(?:\(\d{3}\) ?|\d{3}[ \-.])\d{3}[ \-.]\d{4}"
    r"|\+1\d{10}"
)
_E164 = re.compile(r"\+[1-9]\d{0,2}(?:[ \-.]?(?:\(\d{1,4}\)|\d{1,4})){2,5}")


def _mask_alnum(text: str, keep_head: int, keep_tail: int) -> str:
    """Star every letter and digit but the first ``keep_head`` and last ``keep_tail``."""
    positions = [i for i, c in enumerate(text) if c.isalnum()]
    hidden = set(positions[keep_head : len(positions) - keep_tail])
    return "".join("*" if i in hidden else c for i, c in enumerate(text))


def _mask_digits(text: str, keep_head: int, keep_tail: int) -> str:
    """Star every digit but the first ``keep_head`` and last ``keep_tail``."""
    positions = [i for i, c in enumerate(text) if c.isdigit()]
    hidden = set(positions[keep_head : len(positions) - keep_tail])
    return "".join("*" if i in hidden else c for i, c in enumerate(text))


def _classify_digits(text: str) -> tuple[str, str] | None:
    """(type, mask) for a run of digit groups, or None when it is no entity."""
    text = text.replace(_HIDDEN, "")
    if not text:
        return None
    if "\n" in text:  # a line break inside a number separates like a space
        wrapped = _classify_digits(text.replace("-\n", "-").replace("\n", " "))
        if wrapped is not None and wrapped[0] != "CREDIT_CARD":
            return wrapped
    digits = "".join(c for c in text if c.isdigit())
    plain = text.replace(" ", "").replace("-", "")
    if len(plain) == 18 and cn_id_ok(plain):
        return "CN_ID_CARD", plain[:3] + "*" * 11 + plain[-4:]
    if len(digits) == 18 and _cn_id_shaped(digits):
        return None  # an ID with a wrong check digit, not a card that happens to pass Luhn
    if text[-1] in "Xx" or "(" in text or text.startswith("+"):
        pass  # only phones (or IDs, above) take these shapes
    elif (
        13 <= len(digits) <= 19 and digits[0] in "23456" and luhn_ok(digits) and _card_shape(text)
    ):  # issuers' numbers start 2-6 (ISO/IEC 7812)
        return "CREDIT_CARD", "****" + digits[-4:]
    elif (m := _SSN.fullmatch(text)) and ssn_ok(*m.groups()):
        return "US_SSN", "***-**-" + m.group(3)
    if text[-1] in "Xx":
        return None
    if _IPV4.fullmatch(text):
        return ("IP_ADDRESS", text.split(".")[0] + ".*.*.*") if ipv4_ok(text) else None
    if m := _CN_MOBILE.fullmatch(text):
        prefix = text[: text.index(m.group(1))]
        return "PHONE", prefix + m.group(1) + "****" + m.group(3)
    if _US_PHONE.fullmatch(text) or (_E164.fullmatch(text) and 8 <= len(digits) <= 15):
        # keep the country code and the national number's first 3 and last 4 digits
        country = max(1, len(digits) - 10) if text.startswith("+") else 0
        return "PHONE", _mask_digits(text, country + 3, 4)
    return None


def _card_shape(text: str) -> bool:
    """All digits, or groups of 4 (4-6-5 for Amex) with one kind of separator (a line
    break counts as the other separator), or one digit at a time ("4 1 1 1 ...")."""
    if "\n" in text:
        lines = text.split("\n")
        if all(line.isdigit() for line in lines) and (len(lines) == 2 or min(map(len, lines)) > 4):
            return True  # one number wrapped onto lines ("41111111\n11111111")
        text = text.replace("\n", "-" if "-" in text else " ")
    if text.isdigit():
        return True
    if all(len(g) == 1 for g in text.split(" ")):
        return True
    for sep in " -":
        groups = text.split(sep)
        if len(groups) > 1 and all(g.isdigit() for g in groups):
            sizes = [len(g) for g in groups]
            return (
                (sizes[:-1] == [4] * (len(sizes) - 1) and 1 <= sizes[-1] <= 4)
                or sizes == [4, 6, 5]
                or sizes == [4, 6, 4]
            )
    return False


_GROUP = re.compile(r"\d+(?:[Xx](?!\d))?")


def _digit_entities(text: str, offset: int) -> list[Entity]:
    """Entities in a run of digit groups: the whole run, else the longest spans of
    whole groups that are one ("Order 2 4111111111111111": the card after the 2)."""
    found = _classify_digits(text)
    if found:
        return [Entity(found[0], offset, offset + len(text), found[1])]
    groups, starts = [], []
    for g in _GROUP.finditer(text):
        start = g.start()
        while start and text[start - 1] in "(+":  # a phone's "(415)" or "+86"
            start -= 1
        groups.append((start, g.end()))
        starts.append(g.start())
    out: list[Entity] = []

    def dotted(a: int, b: int) -> bool:  # "1.2.3.4.5" is one version, not an address in it
        return "." in text[a:b]

    n = len(groups)
    i = 0
    while i < n:
        if i and dotted(groups[i - 1][1], groups[i][0]):
            i += 1
            continue
        hit = None
        if starts[i] + 1 == groups[i][1] and (
            i + 1 == n or not dotted(groups[i][1], groups[i + 1][0])
        ):
            i += 1  # no entity starts with a lone digit unless it is an address's octet
            continue
        # no entity has more than 19 digits or 32 characters: longer spans are not tried
        last, digits = i, 0
        while last < n and groups[last][1] - groups[i][0] <= 32:
            digits += groups[last][1] - starts[last]
            if digits > 19:
                break
            last += 1
        for j in range(last - 1, i - 1, -1):
            if j < n - 1 and dotted(groups[j][1], groups[j + 1][0]):
                continue
            end = groups[j][1]
            for start in dict.fromkeys((groups[i][0], starts[i])):  # with "(" / "+", without
                if text[start:end] != text:
                    hit = _classify_digits(text[start:end])
                    if hit:
                        out.append(Entity(hit[0], offset + start, offset + end, hit[1]))
                        break
            if hit:
                i = j
                break
        i += 1
    return out


def _entities(m: re.Match[str]) -> list[Entity]:
    if m.lastgroup == "digits":
        return _digit_entities(m.group(), m.start())
    e = _entity(m)
    return [e] if e else []


_LOCAL_PART = re.compile(r"[A-Za-z0-9._%+\-]+")


def _entity(m: re.Match[str]) -> Entity | None:
    kind = m.lastgroup
    text = m.group()
    if kind == "email":  # the local part starred, the rest as written: "b*** [at] x [dot] com"
        local = _LOCAL_PART.match(text)
        assert local is not None  # the candidate pattern starts with one
        return Entity("EMAIL", m.start(), m.end(), text[0] + "***" + text[local.end() :])
    if kind == "iban":
        while not iban_ok(text):  # a number after it may have been read as its last group
            cut = max(text.rfind(" "), text.rfind("\n"))
            if cut < 0:
                return None
            text = text[:cut]
        return Entity("IBAN", m.start(), m.start() + len(text), _mask_alnum(text, 4, 4))
    if kind == "secret":
        if not secret_ok(text):
            return None
        prefix = _SECRET_PREFIX.match(text)
        return Entity("SECRET", m.start(), m.end(), (prefix.group() if prefix else "") + "****")
    if kind == "ip":
        if not ipv4_ok(text):
            return None
        return Entity("IP_ADDRESS", m.start(), m.end(), text.split(".")[0] + ".*.*.*")
    return None


def _window_entities(window: str) -> Iterator[Entity]:
    pos = 0
    while (m := _CANDIDATE.search(window, pos)) is not None:
        found = _entities(m)
        if m.lastgroup == "digits" and m.start() and _after_version_mark(window, m.start()):
            # "IP123.95.89.52" is an address, "v1.2.3.4" a version
            found = [e for e in found if e.type != "IP_ADDRESS" or e.start != m.start()]
        yield from found
        if m.lastgroup == "digits":  # its spans were tried already
            pos = m.end()
        elif (
            not found
            and m.lastgroup == "iban"
            and m.group()[:2] in _IBAN_COUNTRIES
            and _written_as_iban(m.group())
        ):
            pos = m.end()  # a mistyped IBAN: its digits are not something else
        else:  # a failed email or IBAN-like word may have read over an entity: look inside
            pos = max([e.end for e in found], default=m.start() + 1)


def _written_as_iban(text: str) -> bool:
    """In one piece, or in groups of four with a shorter last one: "BA11 4660487647593"
    is a word and a number (a card), not an IBAN with a typo."""
    groups = text.replace("\n", " ").split(" ")
    return len(groups) == 1 or (all(len(g) == 4 for g in groups[:-1]) and 1 <= len(groups[-1]) <= 4)


_VERSION_MARK = re.compile(r"(?:\b|(?<=[^A-Za-z]))(?i:v|r|ver|version|rev|build|release)[.\-]?\Z")


def _after_version_mark(text: str, at: int) -> bool:
    return bool(_VERSION_MARK.search(text, max(0, at - 8), at))


_MAY_HOLD = re.compile(r"[0-9@\[({<]")


def _scan_run(
    run: str,
    shown: str,
    window: int,
    done: int,
    final: bool,
    out: list[str],
    found: list[tuple[int, int, str, str]],
) -> tuple[int, int]:
    """Mask ``run`` (folded; ``shown`` as it was written) window by window from window
    number ``window``, releasing text from ``done`` on; stops at a window not yet
    complete (unless ``final``). Returns the next window and how far the run is
    released."""
    n = len(run)
    if final and not _MAY_HOLD.search(run, done):
        out.append(shown[done:])  # no digit and no "at": no entity (most words)
        return window + (n - 1) // _WINDOW + 1, n
    while window * _WINDOW < n:
        s = window * _WINDOW
        if not final and n < s + _WINDOW + _OVERLAP:
            break
        for e in _window_entities(run[s : s + _WINDOW + _OVERLAP]):
            if e.start >= _WINDOW or s + e.start < done:
                continue  # the next window's, or over text already released
            out.append(shown[done : s + e.start])
            out.append(e.masked)
            found.append((s + e.start, s + e.end, e.type, e.masked))
            done = s + e.end
        release = max(done, min(s + _WINDOW, n))
        out.append(shown[done:release])
        done = release
        window += 1
    return window, done


def mask(text: str) -> tuple[str, list[Entity]]:
    """The text with every entity masked, and the entities (offsets into ``text``)."""
    out: list[str] = []
    entities: list[Entity] = []
    at = 0
    for m in _RUN.finditer(fold(text)):
        out.append(text[at : m.start()])
        found: list[tuple[int, int, str, str]] = []
        _scan_run(m.group(), text[m.start() : m.end()], 0, 0, True, out, found)
        entities += [Entity(t, m.start() + a, m.start() + b, mk) for a, b, t, mk in found]
        at = m.end()
    out.append(text[at:])
    return "".join(out), entities


# -- streams ---------------------------------------------------------------------------


def value_key(text: str) -> str:
    """An entity's value as compared across writings ("+1 415-555-0199" and
    "14155550199"): folded, lower-cased, letters and digits only."""
    return "".join(c for c in fold(text).lower() if c.isalnum())


def given_values(texts: Iterable[str]) -> frozenset[str]:
    """The ``value_key`` of every entity in ``texts``."""
    return frozenset(value_key(t[e.start : e.end]) for t in texts for e in mask(t)[1])


class StreamMasker:
    """Masks a text that arrives in chunks; ``feed`` returns what is final so far,
    ``flush`` the rest at the end of the stream. The concatenated output equals
    ``mask(whole text)`` however the text was split."""

    __slots__ = ("_buf", "_done", "_folded", "_offset", "_pos", "_resume", "_window", "entities")

    def __init__(self) -> None:
        self._buf = ""
        self._folded = ""
        """``_buf`` folded: what the patterns read (folding is one character for one)."""
        self._pos = 0
        """Where unreleased text starts in ``_buf``: the open run's start (whose first
        ``_done`` characters may be released already), or text not yet read."""
        self._resume = -1
        """The open run's last character, from which it is matched on (matching it again
        from its start at every chunk made a long run cost its length squared); -1
        when no run is open."""
        self._offset = 0
        """Offset of ``_buf[0]`` in the whole stream."""
        self._window = 0
        self._done = 0
        """The open run's next window and how much of it is released."""
        self.entities: list[Entity] = []
        """Everything masked so far, with offsets into the unmasked stream."""

    @property
    def held(self) -> int:
        """Characters held back now."""
        return len(self._buf) - self._pos - self._done

    def feed(self, chunk: str) -> str:
        self._buf += chunk
        self._folded += fold(chunk)
        return self._release(final=False)

    def flush(self) -> str:
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        buf, folded, pos, n = self._buf, self._folded, self._pos, len(self._buf)
        resume, self._resume = self._resume, -1
        out: list[str] = []
        while pos < n:
            if resume >= 0:
                # the open run: from inside its last segment the pattern reaches the same
                # end as from its start (a run ends in a run character)
                tail = _RUN.match(folded, resume)
                assert tail is not None
                start, end = pos, tail.end()
                resume = -1
            else:
                m = _RUN.search(folded, pos)
                if m is None:
                    out.append(buf[pos:])
                    pos = n
                    break
                out.append(buf[pos : m.start()])
                start, end = m.start(), m.end()
            over = final or _run_ends(folded, end)
            found: list[tuple[int, int, str, str]] = []
            self._window, self._done = _scan_run(
                folded[start:end], buf[start:end], self._window, self._done, over, out, found
            )
            base = self._offset + start
            self.entities += [Entity(t, base + a, base + b, mk) for a, b, t, mk in found]
            if over:
                self._window = self._done = 0
                pos = end
                continue
            pos = start  # the open run stays whole in the buffer, from its start
            resume = end - 1
            break
        keep = max(0, pos - 1)  # one character before it, for the join rule's look-behind
        self._offset += keep
        self._buf, self._folded, self._pos = buf[keep:], folded[keep:], pos - keep
        self._resume = resume - keep if resume >= 0 else -1
        return "".join(out)


def _run_ends(text: str, end: int) -> bool:
    """Whether a run that reaches ``end`` of what has arrived is over: it is, once what
    follows cannot join it (joins that could still complete hold it back)."""
    rest = text[end : end + _JOIN_LOOKAHEAD + 1]
    if not rest:
        return False
    if len(rest) > _JOIN_LOOKAHEAD:
        return True  # a whole join and a character after it would be in the run
    if rest == " " and _JOINS_AFTER.match(text, end - 1):
        return False  # "4111 " may go on with "1111"
    if rest == "\n" and _WRAPS_AFTER.match(text, end - 1):
        return False  # "4111 1111\n" or "GB29 NWBK\n" may go on on the next line
    return rest.lower() not in _JOIN_PREFIXES
