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
from dataclasses import dataclass
from typing import Iterator

ENTITY_TYPES = ("CREDIT_CARD", "CN_ID_CARD", "PHONE", "EMAIL", "IBAN", "IP_ADDRESS", "US_SSN")


@dataclass(frozen=True, slots=True)
class Entity:
    type: str
    start: int
    end: int
    masked: str


# -- candidates ---------------------------------------------------------------------------

# digit groups joined by single separators: cards, IDs, phones, SSNs
_DIGITS = r"(?:\+\s?)?(?:\(\d{1,4}\)\s?)?\d(?:[ \-.]?\d|\)\s?\d|\s?\(\d)*(?:(?<=\d)[Xx])?"
_CANDIDATE = re.compile(
    r"(?P<email>(?<![A-Za-z0-9._%+\-])[A-Za-z0-9][A-Za-z0-9._%+\-]{0,63}@"
    r"[A-Za-z0-9](?:[A-Za-z0-9\-]{0,62}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9\-]{0,62}"
    r"[A-Za-z0-9])?)*\.[A-Za-z]{2,24}(?![A-Za-z0-9\-]))"
    r"|(?P<iban>(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?"
    r"(?![A-Za-z0-9]))"
    r"|(?P<ip>(?<![A-Za-z0-9.\-])(?:\d{1,3}\.){3}\d{1,3}(?![0-9]|\.\d|-[A-Za-z0-9]))"
    r"|(?P<digits>(?<![A-Za-z0-9+\-.])" + _DIGITS + r"(?![A-Za-z0-9]|[\-.]\d))"
)

# Entities live inside "runs": characters that can be part of one, where a single
# space joins groups of digits and capitals ("4111 1111", "GB29 NWBK", "(415) 555").
# Anything else ends a run, so a stream can release a run once the character after
# it is known, and whole texts and streams split into the same runs.
_CH = r"[A-Za-z0-9@._%+\-()]"
_JOIN = r"(?<=[A-Z0-9)]) (?=[A-Z0-9(+])"
_RUN = re.compile(_CH + r"+(?:" + _JOIN + _CH + r"+)*")
_JOINS_AFTER = re.compile(r"[A-Z0-9)]")
_RUN_REST = re.compile(r"(?:" + _CH + r"|" + _JOIN + _CH + r")*")
_PIECE = 256
"""Runs are scanned in pieces of at most this many characters (no entity is longer),
which bounds what a stream holds back."""


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
    s = sum(int(c) * w for c, w in zip(text[:17], _GB11643_WEIGHTS))
    return _GB11643_CHECK[s % 11] == text[17].upper()


def _cn_id_shaped(digits: str) -> bool:
    """Region and birth date in place, whatever the check digit."""
    return cn_id_ok(digits[:17] + _GB11643_CHECK[
        sum(int(c) * w for c, w in zip(digits[:17], _GB11643_WEIGHTS)) % 11])


def iban_ok(text: str) -> bool:
    compact = text.replace(" ", "")
    if not 15 <= len(compact) <= 34:
        return False
    moved = compact[4:] + compact[:4]
    number = "".join(str(int(c, 36)) for c in moved)
    return int(number) % 97 == 1


def ssn_ok(area: str, group: str, serial: str) -> bool:
    return (area not in ("000", "666") and area[0] != "9" and group != "00"
            and serial != "0000")


def ipv4_ok(text: str) -> bool:
    parts = text.split(".")
    return all(len(p) == 1 or (p[0] != "0" and int(p) <= 255) for p in parts)


_IPV4 = re.compile(r"(?:\d{1,3}\.){3}\d{1,3}")
_CN_MOBILE = re.compile(r"(?:\+86[ \-]?)?(1[3-9]\d)[ \-]?(\d{4})[ \-]?(\d{4})")
_SSN = re.compile(r"(\d{3})-(\d{2})-(\d{4})")
_US_PHONE = re.compile(r"(?:\+1[ \-.]?)?(?:\(\d{3}\) ?|\d{3}[ \-.])\d{3}[ \-.]\d{4}"
                       r"|\+1\d{10}")
_E164 = re.compile(r"\+[1-9]\d{0,2}(?:[ \-.]?\(?\d{1,4}\)?){2,5}")


def _mask_alnum(text: str, keep_head: int, keep_tail: int) -> str:
    """Star every letter and digit but the first ``keep_head`` and last ``keep_tail``."""
    positions = [i for i, c in enumerate(text) if c.isalnum()]
    hidden = set(positions[keep_head:len(positions) - keep_tail])
    return "".join("*" if i in hidden else c for i, c in enumerate(text))


def _mask_digits(text: str, keep_head: int, keep_tail: int) -> str:
    """Star every digit but the first ``keep_head`` and last ``keep_tail``."""
    positions = [i for i, c in enumerate(text) if c.isdigit()]
    hidden = set(positions[keep_head:len(positions) - keep_tail])
    return "".join("*" if i in hidden else c for i, c in enumerate(text))


def _classify_digits(text: str) -> tuple[str, str] | None:
    """(type, mask) for a run of digit groups, or None when it is no entity."""
    digits = "".join(c for c in text if c.isdigit())
    plain = text.replace(" ", "").replace("-", "")
    if len(plain) == 18 and cn_id_ok(plain):
        return "CN_ID_CARD", plain[:3] + "*" * 11 + plain[-4:]
    if len(digits) == 18 and _cn_id_shaped(digits):
        return None  # an ID with a wrong check digit, not a card that happens to pass Luhn
    if text[-1] in "Xx" or "(" in text or text.startswith("+"):
        pass  # only phones (or IDs, above) take these shapes
    elif 13 <= len(digits) <= 19 and digits[0] in "23456" and luhn_ok(digits) \
            and _card_shape(text):  # issuers' numbers start 2-6 (ISO/IEC 7812)
        return "CREDIT_CARD", "****" + digits[-4:]
    elif (m := _SSN.fullmatch(text)) and ssn_ok(*m.groups()):
        return "US_SSN", "***-**-" + m.group(3)
    if text[-1] in "Xx":
        return None
    if _IPV4.fullmatch(text):
        return ("IP_ADDRESS", text.split(".")[0] + ".*.*.*") if ipv4_ok(text) else None
    if m := _CN_MOBILE.fullmatch(text):
        prefix = text[:text.index(m.group(1))]
        return "PHONE", prefix + m.group(1) + "****" + m.group(3)
    if _US_PHONE.fullmatch(text) or (_E164.fullmatch(text) and 8 <= len(digits) <= 15):
        # keep the country code and the national number's first 3 and last 4 digits
        country = max(1, len(digits) - 10) if text.startswith("+") else 0
        return "PHONE", _mask_digits(text, country + 3, 4)
    return None


def _card_shape(text: str) -> bool:
    """All digits, or groups of 4 (4-6-5 for Amex) with one kind of separator."""
    if text.isdigit():
        return True
    for sep in " -":
        groups = text.split(sep)
        if len(groups) > 1 and all(g.isdigit() for g in groups):
            sizes = [len(g) for g in groups]
            return sizes[:-1] == [4] * (len(sizes) - 1) and 1 <= sizes[-1] <= 4 \
                or sizes == [4, 6, 5] or sizes == [4, 6, 4]
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
        for j in range(n - 1, i - 1, -1):
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


def _entity(m: re.Match[str]) -> Entity | None:
    kind = m.lastgroup
    text = m.group()
    if kind == "email":
        local, _, domain = text.partition("@")
        return Entity("EMAIL", m.start(), m.end(), local[0] + "***@" + domain)
    if kind == "iban":
        while not iban_ok(text):  # a number after it may have been read as its last group
            if " " not in text:
                return None
            text = text.rsplit(" ", 1)[0]
        return Entity("IBAN", m.start(), m.start() + len(text), _mask_alnum(text, 4, 4))
    if kind == "ip":
        if not ipv4_ok(text):
            return None
        return Entity("IP_ADDRESS", m.start(), m.end(), text.split(".")[0] + ".*.*.*")
    return None


def find(text: str) -> Iterator[Entity]:
    """Entities in a text, scanned run by run."""
    for start, end in _pieces(text):
        piece = text[start:end]
        for m in _CANDIDATE.finditer(piece):
            for e in _entities(m):
                yield Entity(e.type, e.start + start, e.end + start, e.masked)


def _pieces(text: str) -> Iterator[tuple[int, int]]:
    for m in _RUN.finditer(text):
        for s in range(m.start(), m.end(), _PIECE):
            yield s, min(s + _PIECE, m.end())


def _scan(piece: str, offset: int) -> tuple[str, list[Entity]]:
    """Mask one piece; entities get offsets from ``offset``."""
    out, at, found = [], 0, []
    for m in _CANDIDATE.finditer(piece):
        for e in _entities(m):
            out.append(piece[at:e.start])
            out.append(e.masked)
            at = e.end
            found.append(Entity(e.type, e.start + offset, e.end + offset, e.masked))
    if not found:
        return piece, found
    out.append(piece[at:])
    return "".join(out), found


def mask(text: str) -> tuple[str, list[Entity]]:
    """The text with every entity masked, and the entities (offsets into ``text``)."""
    out, entities, at = [], [], 0
    for start, end in _pieces(text):
        out.append(text[at:start])
        masked, found = _scan(text[start:end], start)
        out.append(masked)
        entities += found
        at = end
    out.append(text[at:])
    return "".join(out), entities


# -- streams ---------------------------------------------------------------------------


class StreamMasker:
    """Masks a text that arrives in chunks; ``feed`` returns what is final so far,
    ``flush`` the rest at the end of the stream. The concatenated output equals
    ``mask(whole text)`` however the text was split."""

    __slots__ = ("_buf", "_pos", "_offset", "_in_run", "_run_done", "entities")

    def __init__(self) -> None:
        self._buf = ""
        self._pos = 0
        """Where unreleased text starts in ``_buf`` (one character before it stays, for
        the join rule's look-behind)."""
        self._offset = 0
        """Offset of ``_buf[0]`` in the whole stream."""
        self._in_run = False
        """``_buf[_pos:]`` continues a run whose first pieces were released."""
        self._run_done = 0
        """Characters of that run released so far (a multiple of the piece size)."""
        self.entities: list[Entity] = []
        """Everything masked so far, with offsets into the unmasked stream."""

    @property
    def held(self) -> int:
        """Characters held back now."""
        return len(self._buf) - self._pos

    def feed(self, chunk: str) -> str:
        self._buf += chunk
        return self._release(final=False)

    def flush(self) -> str:
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        buf, pos, n = self._buf, self._pos, len(self._buf)
        out: list[str] = []
        while pos < n:
            if self._in_run:
                start, end = pos, _RUN_REST.match(buf, pos).end()  # type: ignore[union-attr]
            else:
                m = _RUN.search(buf, pos)
                if m is None:
                    out.append(buf[pos:])
                    pos = n
                    break
                out.append(buf[pos:m.start()])
                start, end = m.start(), m.end()
            # a run is over once the character after it cannot join it: anything but a
            # space, or a space that only joins after a capital, digit or ")"
            if final or end + 1 < n or (end < n and (
                    buf[end] != " " or not _JOINS_AFTER.match(buf, end - 1))):
                self._emit(out, start, end)
                self._in_run, self._run_done = False, 0
                pos = end
                continue
            # still open: release only whole pieces, as a whole text would split it
            whole = (self._run_done + end - start) // _PIECE * _PIECE - self._run_done
            if whole > 0:
                self._emit(out, start, start + whole)
                self._in_run, self._run_done = True, self._run_done + whole
                start += whole
            pos = start
            break
        keep = max(0, pos - 1)
        self._offset += keep
        self._buf, self._pos = buf[keep:], pos - keep
        return "".join(out)

    def _emit(self, out: list[str], start: int, end: int) -> None:
        """Release ``_buf[start:end]`` of a run, masked piece by piece."""
        at = start
        done = self._run_done if self._in_run else 0
        while at < end:
            step = min(end - at, _PIECE - done % _PIECE)
            masked, found = _scan(self._buf[at:at + step], self._offset + at)
            out.append(masked)
            self.entities += found
            at += step
            done += step
