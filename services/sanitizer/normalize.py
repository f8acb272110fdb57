"""Decoding before matching, as WAFs do (CRS applies URL and HTML-entity decoding and
Unicode normalisation before its rules), with every character of the decoded text
mapped back to where it came from, so findings point into the text the user sent.

``decoded(text)`` undoes, repeatedly (a payload encoded twice is decoded twice):
percent-encoding (``%27``, ``%u0027``, and ``+`` for a space in a form-encoded text),
HTML entities (``&lt;``, ``&#x3C``), ``\\uXXXX``, ``\\u{...}`` and ``\\xXX`` escapes
(runs of ``\\xXX`` and ``%XX`` bytes are read as UTF-8), CSS escapes where there is
CSS (``-mo\\z-b\\inding``), fullwidth and other compatibility forms (NFKC), and
removes invisible characters (zero-width spaces, joiners, soft hyphens, bidirectional
controls).
"""

from __future__ import annotations

import html
import html.entities
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

_ROUNDS = 3
"""Decoding passes at most: enough for a payload encoded twice, bounded for one
encoded a hundred times."""

_PERCENT = re.compile(r"(?:%[0-9A-Fa-f]{2})+|%[uU][0-9A-Fa-f]{4}")
_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});?")
_ESCAPE = re.compile(r"(?:\\x[0-9A-Fa-f]{2})+|\\u\{[0-9A-Fa-f]{1,6}\}|\\u[0-9A-Fa-f]{4}")
_WORD = re.compile(r"\S+")
_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")

INVISIBLE = frozenset(
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b\u200c\u200d\u200e\u200f"
    "\u202a\u202b\u202c\u202d\u202e\u2060\u2061\u2062\u2063\u2064\u2066\u2067\u2068\u2069"
    "\u206a\u206b\u206c\u206d\u206e\u206f\u3164\ufeff\uffa0"
)
"""Characters that render as nothing: a word split by them reads as one word."""


@dataclass(frozen=True, slots=True)
class Decoded:
    text: str
    starts: list[int]
    """``starts[i]``: where the character ``text[i]`` came from in the original;
    one more entry, the original's length, closes the last span."""

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original text's span that ``text[start:end]`` was decoded from."""
        return self.starts[start], self.starts[end]

    def changed(self, original: str, margin: int) -> list[tuple[int, int]]:
        """Windows of ``text`` around what decoding changed, ``margin`` characters on
        each side, overlapping ones merged: only there can a rule read something the
        original did not say."""
        s = self.starts
        at = [
            i
            for i, (ch, a, b) in enumerate(zip(self.text, s, s[1:], strict=False))
            if b - a != 1 or original[a] != ch
        ]
        if at[:1] != [0] and self.text and s[0] != 0:
            at.insert(0, 0)  # what was dropped before the first character
        windows: list[tuple[int, int]] = []
        for i in at:
            lo, hi = max(0, i - margin), min(len(self.text), i + margin + 1)
            if windows and lo <= windows[-1][1]:
                windows[-1] = (windows[-1][0], hi)
            else:
                windows.append((lo, hi))
        return windows


def _bytes_text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _percent(m: re.Match[str]) -> str:
    s = m.group()
    if s[1] in "uU":
        return chr(int(s[2:], 16))
    return _bytes_text(bytes(int(s[i + 1 : i + 3], 16) for i in range(0, len(s), 3)))


# names browsers know in one case only ("&NewLine;"), as attackers also write them
_ENTITY_ANY_CASE = {k.lower(): v for k, v in html.entities.html5.items() if k.endswith(";")}


def _entity(m: re.Match[str]) -> str:
    s = m.group()
    plain = html.unescape(s)
    if plain == s and s.endswith(";"):
        return _ENTITY_ANY_CASE.get(s[1:].lower(), s)
    return plain


def _escape(m: re.Match[str]) -> str:
    s = m.group()
    if s[1] == "x":
        return _bytes_text(bytes(int(s[i + 2 : i + 4], 16) for i in range(0, len(s), 4)))
    code = int(s[3:-1] if s[2] == "{" else s[2:], 16)
    return chr(code) if code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else s


def _sub(
    text: str, pattern: re.Pattern[str], repl: Callable[[re.Match[str]], str]
) -> tuple[str, list[int]] | None:
    """``pattern.sub(repl, text)`` and where each output character came from; ``None``
    when nothing changed."""
    out: list[str] = []
    starts: list[int] = []
    pos = 0
    changed = False
    for m in pattern.finditer(text):
        r = repl(m)
        if r == m.group():
            continue
        changed = True
        out.append(text[pos : m.start()])
        starts.extend(range(pos, m.start()))
        out.append(r)
        starts.extend([m.start()] * len(r))
        pos = m.end()
    if not changed:
        return None
    out.append(text[pos:])
    starts.extend(range(pos, len(text) + 1))
    return "".join(out), starts


def _compatibility_table() -> tuple[dict[str, str], re.Pattern[str]]:
    """Each BMP character that NFKC changes (or that is invisible) and what it becomes,
    and a pattern finding them: most text has few, and only those are visited."""
    table: dict[str, str] = {}
    for cp in range(0x80, 0x10000):
        ch = chr(cp)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        n = "" if ch in INVISIBLE else unicodedata.normalize("NFKC", ch)
        if n != ch:
            table[ch] = n
    ranges: list[tuple[int, int]] = []
    for cp in sorted(map(ord, table)):
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1] = (ranges[-1][0], cp)
        else:
            ranges.append((cp, cp))
    cls = "".join(re.escape(chr(a)) + ("-" + re.escape(chr(b)) if b > a else "") for a, b in ranges)
    return table, re.compile(f"[{cls}]|[^\\x00-\\uffff]")


_COMPAT, _COMPAT_CHARS = _compatibility_table()


def _compat(m: re.Match[str]) -> str:
    ch = m.group()
    found = _COMPAT.get(ch)
    return unicodedata.normalize("NFKC", ch) if found is None else found


def _unicode(text: str) -> tuple[str, list[int]] | None:
    """NFKC, character by character (fullwidth ``＜`` reads ``<``), invisibles dropped."""
    if text.isascii():
        return None
    return _sub(text, _COMPAT_CHARS, _compat)


def _form_word(m: re.Match[str]) -> str:
    """A form-encoded value ("id=1%27+OR+%271%27%3D%271", "1'+OR+1=1--"): no whitespace,
    a percent escape or a quote in it, "+" for its spaces."""
    word = m.group()
    if "+" in word and ("'" in word or _PERCENT_ESCAPE.search(word)):
        return word.replace("+", " ")
    return word


def _plus(text: str) -> tuple[str, list[int]] | None:
    # word by word: a pattern looking ahead for the escape from every position of a
    # long word took seconds on a 32K-character one
    return _sub(text, _WORD, _form_word) if "+" in text else None


_CSS_ESCAPE = re.compile(r"\\(?:([0-9A-Fa-f]{1,6})[ \t]?|([^\n0-9A-Fa-f]))")


def _css_escape(m: re.Match[str]) -> str:
    if m.group(2) is not None:  # "\\z" is "z"
        return m.group(2)
    code = int(m.group(1), 16)  # a NUL is dropped, as CRS's removeNulls does
    return "" if code == 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF else chr(code)


def _css(text: str) -> tuple[str, list[int]] | None:
    """CSS escapes ("-mo\\z-b\\i\\nding", "\\0"), where CSS is read: in a text with a
    style attribute or element. Elsewhere a backslash is a path's or an escape's."""
    if "\\" not in text or "style" not in text.lower():
        return None
    return _sub(text, _CSS_ESCAPE, _css_escape)


_STEPS: tuple[Callable[[str], tuple[str, list[int]] | None], ...] = (
    _plus,  # before percent-decoding, as a form is read: "%2B" is a plus, not a space
    lambda t: _sub(t, _PERCENT, _percent) if "%" in t else None,
    lambda t: _sub(t, _ENTITY, _entity) if "&" in t else None,
    lambda t: _sub(t, _ESCAPE, _escape) if "\\" in t else None,
    _css,  # after the JavaScript escapes, which it would misread
    _unicode,
)


def decoded(text: str) -> Decoded | None:
    """The text with every encoding above undone, or ``None`` when there was none."""
    current, starts = text, list(range(len(text) + 1))
    changed = False
    for _ in range(_ROUNDS):
        before = current
        for step in _STEPS:
            done = step(current)
            if done is not None:
                current, inner = done
                starts = [starts[i] for i in inner]
                changed = True
        if current == before:
            break
    return Decoded(current, starts) if changed and current != text else None


_INLINE_COMMENT = re.compile(r"/\*(!\d{0,6})?(.*?)\*/", re.DOTALL)


def _comment(m: re.Match[str]) -> str:
    # MySQL runs a "/*!50000 select*/" comment's body; any other comment is a space
    return f" {m.group(2)} " if m.group(1) is not None else " "


def without_inline_comments(text: str) -> Decoded | None:
    """SQL as the server reads it: ``UNION/**/SELECT`` is ``UNION SELECT``, and a
    versioned comment ``/*!00000select*/`` is its body."""
    if "/*" not in text:
        return None
    done = _sub(text, _INLINE_COMMENT, _comment)
    return Decoded(*done) if done else None


_JOIN = re.compile(r"""(["'])\s*\+\s*\1""")


def joined_literals(text: str) -> Decoded | None:
    """JavaScript as it runs: adjacent string literals joined, ``'java'+'script:'`` read
    as ``'javascript:'``, so that a name spelled in pieces is the name."""
    if "+" not in text:
        return None
    done = _sub(text, _JOIN, lambda m: "")
    return Decoded(*done) if done else None
