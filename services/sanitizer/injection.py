"""Input checks: SQL injection, XSS and prompt-injection payloads, judged by shape.

SQL: as libinjection does, the text is read as SQL from where a value would break out
of its context (the start of the text, or a quote that would close a string literal),
tokenized (strings, numbers, keywords, logic operators, functions, comments), and
the first tokens are matched against the shapes attacks need: a tautology after a
logic operator, a comment that truncates the query, UNION SELECT, a stacked query,
a time delay. A question that mentions SQL ("how do I write SELECT * FROM users
WHERE id = ? safely") breaks out of nothing, so it passes.

XSS: markup that executes: a tag after an attribute break (``">``), event-handler
attributes, ``<script>`` with a body, ``javascript:`` URLs in attributes, frames.
A mention of ``<script>`` in a question has no body and breaks nothing.

Prompt injection: instructions to ignore the instructions, chat-template role tags
smuggled into user text, jailbreak personas, requests for the system prompt.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from .normalize import decoded, without_inline_comments

Decision = Literal["block", "flag", "pass"]
Policy = Literal["block", "flag", "off"]


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str
    type: str
    """``sql_injection``, ``xss`` or ``prompt_injection``."""
    start: int
    end: int


# -- SQL ---------------------------------------------------------------------------------

_SQL_TOKEN = re.compile(
    r"""(?P<ws>\s+)
    |(?P<comment>--|\#|/\*)
    |(?P<string>'(?:[^'\\]|\\.|''){0,200}'?|"(?:[^"\\]|\\.|""){0,200}"?|`[^`]{0,200}`?)
    |(?P<number>0x[0-9a-fA-F]+|\d+(?:\.\d+)?)
    |(?P<word>[A-Za-z_@$][\w@$.]*)
    |(?P<op><=>|<>|!=|==|<=|>=|\|\||&&|[=<>+\-*/%^~|&!])
    |(?P<punct>[(),;])
    |(?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)
_LOGIC = {"or", "and", "xor", "||", "&&", "not"}
# a stacked statement: its keyword and what must follow for it to be SQL, not prose
_STACKED = re.compile(
    r";\s*(?:drop\s+(?:table|database|view|index|user|schema)\b|delete\s+from\b|"
    r"insert\s+into\b|update\s+\w+\s+set\b|select\s+(?:\*|@@|\d|null\b|\w+\s*\(|"
    r"[\w.,\s]{1,60}?\bfrom\b)|exec(?:ute)?\s+\w|declare\s+@|shutdown\b|"
    r"truncate\s+table\b|alter\s+(?:table|user|database)\b|create\s+(?:table|user|database|"
    r"procedure|function)\b|waitfor\s+delay\b)",
    re.IGNORECASE,
)
_TIME_FUNCS = {"sleep", "benchmark", "pg_sleep", "dbms_lock.sleep", "waitfor"}
_DANGER_FUNCS = _TIME_FUNCS | {
    "load_file",
    "extractvalue",
    "updatexml",
    "xp_cmdshell",
    "char",
    "concat",
    "version",
    "database",
    "user",
    "ascii",
    "substring",
    "substr",
    "if",
    "md5",
    "hex",
    "unhex",
    "exp",
    "utl_inaddr.get_host_name",
    "group_concat",
    "count",
}


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str
    text: str
    start: int
    end: int

    @property
    def low(self) -> str:
        return self.text.lower()

    @property
    def value(self) -> bool:
        return self.kind in ("string", "number", "word") and self.low not in _LOGIC


_WINDOW = 400
"""An attack's shape shows in its first tokens: read no further than this."""


def _sql_tokens(text: str, pos: int, limit: int = 12) -> list[_Tok]:
    out: list[_Tok] = []
    for m in _SQL_TOKEN.finditer(text, pos, pos + _WINDOW):
        kind = m.lastgroup or "other"
        if kind == "ws":
            continue
        tok = _Tok(kind, m.group(), m.start(), m.end())
        if kind == "word" and m.end() < len(text) and text[m.end()] == "(":
            tok = _Tok("func", tok.text, tok.start, tok.end)
        if kind == "op" and tok.text in ("||", "&&"):
            tok = _Tok("word", tok.text, tok.start, tok.end)
        out.append(tok)
        if kind == "comment" or len(out) >= limit:
            break
    return out


def _rest_is_blank(text: str, tok: _Tok) -> bool:
    """Nothing but filler follows the comment on its line ("--", "-- -", "#"): the
    query's end is cut off, which is what a truncation needs and prose never does."""
    line_end = text.find("\n", tok.end)
    rest = text[tok.end : len(text) if line_end < 0 else line_end]
    return tok.text == "/*" or not rest.strip(" \t-#;+")


def _literal(tok: _Tok) -> str | None:
    if tok.kind == "number":
        return tok.text
    if tok.kind == "string":
        return tok.text.strip("'\"`")
    return None


def _always_true(a: _Tok, op: _Tok, b: _Tok) -> bool:
    """``1=1``, ``'a'='a``, ``2>1``, ``x=x``: a comparison that holds whatever the row."""
    la, lb = _literal(a), _literal(b)
    if la is None or lb is None:
        return a.kind == b.kind == "word" and a.low == b.low and op.text == "="
    if b.kind == "string" and b.text[-1] != b.text[0] or len(b.text) == 1:
        # left open for the application's own closing quote: "' OR '1'='1"
        lb = lb[: len(la)] if lb.startswith(la) and not lb[len(la) : len(la) + 1].isalnum() else lb
    if op.text in ("=", "==", "<=>", ">=", "<=") and la == lb:
        return True
    try:
        x, y = float(la), float(lb)
    except ValueError:
        return op.text in ("<>", "!=") and la != lb
    return {"<": x < y, ">": x > y, "<>": x != y, "!=": x != y}.get(op.text, False)


def _ends_query(text: str, toks: list[_Tok], i: int, at_end: bool = True) -> bool:
    """Nothing SQL-like follows token ``i``: a comment cutting off the rest, or (when
    ``at_end``) the end of the text."""
    if i >= len(toks):
        return at_end
    nxt = toks[i]
    return nxt.kind == "comment" and _rest_is_blank(text, nxt)


def _sql_shape(text: str, toks: list[_Tok], broke_out: bool) -> str | None:
    """The rule an attack shape matches, reading ``toks`` as the SQL after a value."""
    shape = _shape(text, toks, broke_out)
    if shape or not broke_out or not toks or toks[0].low not in _LOGIC:
        return shape
    # "z'or email notnull--": a logic operator after the break-out, the rest cut off
    last = toks[-1]
    if (
        last.kind == "comment"
        and _rest_is_blank(text, last)
        and 3 <= len(toks) <= 8
        and "\n" not in text[toks[0].start : last.start]
        and not any(t.kind == "string" for t in toks)
    ):
        return "sqli.logic-truncation"
    return None


def _after_value(text: str, at: int) -> int:
    """Where the blank run before ``at`` starts."""
    while at and text[at - 1].isspace():
        at -= 1
    return at


def _subquery(toks: list[_Tok]) -> bool:
    """A parenthesised SELECT among ``toks``: "' AND 1 IN (SELECT ..."."""
    return any(a.text == "(" and b.low == "select" for a, b in zip(toks, toks[1:], strict=False))


def _shape(text: str, toks: list[_Tok], broke_out: bool) -> str | None:
    i = 0
    while i < len(toks) and toks[i].text == ")":  # closing the query's own parentheses
        i += 1
    t = toks[i:]
    if not t:
        return None
    first = t[0]
    if (
        broke_out
        and first.kind == "comment"
        and _rest_is_blank(text, first)
        and "\n" not in text[_after_value(text, toks[0].start) : first.start]
    ):  # a quoted word, then a markdown rule on the next line, is prose
        return "sqli.comment-truncation"
    if first.low in _LOGIC and first.low != "not" and len(t) >= 2:
        j = 1
        while j < len(t) and t[j].text == "(":
            j += 1
        rest = t[j:]
        if (
            len(rest) >= 3
            and rest[1].kind == "op"
            and rest[0].value
            and (
                _always_true(rest[0], rest[1], rest[2])
                or rest[2].text == "("
                and len(rest) > 3
                and rest[3].low == "select"
            )
        ):
            return "sqli.tautology"
        if rest and rest[0].kind == "func" and rest[0].low in _DANGER_FUNCS:
            return "sqli.function"
        if _subquery(t[1:7]):
            return "sqli.subquery"
        if (
            rest
            and (rest[0].kind == "number" or rest[0].low == "true")
            and _ends_query(text, t, j + 1, at_end=not broke_out)
        ):
            return "sqli.tautology"  # "' OR 1 --", "1 or true"
        if (
            len(rest) >= 3
            and rest[0].value
            and rest[1].low in ("like", "is")
            and _literal(rest[0]) is not None
            and _literal(rest[2]) is not None
        ):
            return "sqli.tautology"  # "' OR 'x' LIKE 'x"
    if (
        first.low in ("order", "group")
        and len(t) >= 4
        and t[1].low == "by"
        and t[2].kind == "number"
    ):
        j = 3
        while j + 1 < len(t) and t[j].text == "," and t[j + 1].kind == "number":
            j += 2  # "GROUP BY 1,2,3"
        if _ends_query(text, t, j, at_end=broke_out):
            return "sqli.column-probe"  # "1' ORDER BY 3--": counting the query's columns
    if broke_out and first.low == "having" and len(t) >= 4 and _always_true(t[1], t[2], t[3]):
        return "sqli.tautology"
    if first.low == "union":
        words = [x.low for x in t[1:3]]
        if words[:1] == ["select"] or words[:2] in (["all", "select"], ["distinct", "select"]):
            return "sqli.union"
    if first.text == ";" and _STACKED.match(text, first.start):
        return "sqli.stacked"
    return None


_QUOTES = re.compile(r"['\"`]")
_LOGIC_AFTER = re.compile(r"(?:or|and|xor)\b\s*['\"(\d]", re.IGNORECASE)
# a numeric field's value: the text's start, or a label's ("id=", "username: ")
_BARE_VALUE = re.compile(r"\A[ \t]*(?:[\w.-]{1,30}[ \t]*[=:][ \t]*)?-?\d+(?:\.\d+)?[ \t)]*")
_UNION_SELECT = re.compile(r"\bunion(?:\s+(?:all|distinct|distinctrow))?\s+select\b", re.IGNORECASE)
_UNION_EXTRACT = re.compile(
    r"\bnull\b|@@\w+|information_schema|\bconcat(?:_ws)?\s*\(|\bgroup_concat\s*\(|"
    r"\bversion\s*\(|\bdatabase\s*\(|\buser\s*\(|(?:\b\d+\s*,\s*){2,}|"
    r"(?:--|#|/\*)[ \t\-#+]*$",
    re.IGNORECASE | re.MULTILINE,
)


def sql_findings(text: str) -> Iterator[Finding]:
    seen: set[int] = set()
    # a value breaking out of a string literal at a quote
    for n, q in enumerate(_QUOTES.finditer(text)):
        at = q.start()
        prev = text[at - 1] if at else " "
        if (
            prev.isalpha()
            and at + 1 < len(text)
            and text[at + 1].isalpha()
            and not _LOGIC_AFTER.match(text, at + 1)
        ):
            continue  # an apostrophe inside a word ("don't"), not "a'or'a"
        if n > 1000 or prev in "'\"`":
            continue  # a run of quotes breaks out once; the rest is noise
        toks = _sql_tokens(text, q.end())
        rule = _sql_shape(text, toks, broke_out=True)
        if rule and at not in seen:
            seen.add(at)
            yield Finding(rule, "sql_injection", at, toks[-1].end)
    # a numeric field: a number where a value starts
    for m in _BARE_VALUE.finditer(text):
        toks = _sql_tokens(text, m.end())
        rule = _sql_shape(text, toks, broke_out=False)
        if rule:
            yield Finding(rule, "sql_injection", m.start(), toks[-1].end)
    # UNION-based extraction anywhere, when its select list reads like one
    for u in _UNION_SELECT.finditer(text):
        line_end = text.find("\n", u.end())
        tail = text[u.end() : min(u.end() + 160, len(text) if line_end < 0 else line_end)]
        if _UNION_EXTRACT.search(tail) or _before_is_value_break(text, u.start()):
            yield Finding("sqli.union", "sql_injection", u.start(), min(len(text), u.end() + 40))
    yield from _delay_findings(text)
    for rule, pattern in _SQL_RULES:
        if hit := pattern.search(text):
            yield Finding(rule, "sql_injection", hit.start(), hit.end())
    # a value that is a logic operator and what follows ("and 1=1'"), or a value and a
    # stacked statement ("1;INSERT INTO ...", "mod(1,2);DROP TABLE t")
    if logic := _LEADING_LOGIC.match(text):
        toks = _sql_tokens(text, logic.end())
        rule = _sql_shape(text, toks, broke_out=False)
        if rule:
            yield Finding(rule, "sql_injection", logic.start(), toks[-1].end)
    stacked = _LEADING_VALUE_STACKED.match(text)
    if stacked and _STACKED.match(text, stacked.end() - 1):
        yield Finding("sqli.stacked", "sql_injection", stacked.start(), stacked.end())


# A call to a delay function where SQL would evaluate it: after an operator, a quote,
# a parenthesis, SELECT or a logic word, or as the whole value; not a method
# ("time.sleep(5)") or a statement of its own in code ("    sleep(1);").
_DELAY_CALL = re.compile(r"\b(?:pg_)?sleep\s*\((?![^()]{0,20}\)\s*;)|\bbenchmark\s*\(", re.I)
_DELAY_CONTEXT = re.compile(
    r"(?:[(,'\"|+=&]|\$\{|\b(?:select|and|or|xor|not|if|then|else|when))\s*\Z", re.I
)


def _delay_findings(text: str) -> Iterator[Finding]:
    # the call first (rare), then what comes before it: cheaper than the other way round
    for m in _DELAY_CALL.finditer(text):
        before = text[max(0, m.start() - 12) : m.start()]
        if _DELAY_CONTEXT.search(before) or not text[: m.start()].strip():
            yield Finding("sqli.time-delay", "sql_injection", m.start(), m.end())
            return


_SQL_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "sqli.time-delay",
        re.compile(
            r"\bwaitfor\s+delay\s*['\"]|\bdbms_(?:pipe\.receive_message|lock\.sleep)\s*\("
            r"|\brandomblob\s*\(\s*\d{6,}|\bbenchmark\s*\(\s*\d{5,}\s*,",
            re.IGNORECASE,
        ),
    ),
    (
        # what automated injection tools send: a random number equal to itself,
        # marker strings built from hex or character codes, the duplicate-key error
        "sqli.tool-signature",
        re.compile(
            r"\b(?:where|and|or|having|elt)\s*\(?\s*(\d{3,})\s*==?\s*\1\b"
            r"|\b(?:concat(?:_ws)?|char|chr)\s*\(\s*0x[0-9a-f]{6,}"
            r"|(?:\bchr\s*\(\s*\d+\s*\)\s*\|\|\s*){2,}"
            r"|\bfloor\s*\(\s*rand\s*\(\s*0\s*\)\s*\*\s*2\s*\)",
            re.IGNORECASE,
        ),
    ),
    (
        "sqli.file-access",
        re.compile(
            r"\bload_file\s*\(\s*(?:['\"]|0x|char\s*\()|\binto\s+(?:out|dump)file\s*['\"]",
            re.IGNORECASE,
        ),
    ),
    (
        "sqli.command-exec",
        re.compile(r"\bexec(?:ute)?\s+(?:master\s*\.\.?\s*)?xp_\w+|\bexec\s+master\s*\.", re.I),
    ),
    (
        # MySQL's versioned comment, which runs its body: "/*!50000union*/"
        "sqli.versioned-comment",
        re.compile(r"/\*!\d{0,6}\s*(?:select|union|and|or|from|where|concat|sleep)\b", re.I),
    ),
    (
        # a text that opens with what only an injection sends: a UNION SELECT, or a
        # SELECT of a delay, a file or an error-based extraction
        "sqli.fragment",
        re.compile(
            r"\A[\s(]*(?:union(?:\s+(?:all|distinct))?\s+select\b|select\b[\s(*]*"
            r"(?:sleep|benchmark|pg_sleep|load_file|extractvalue|updatexml)\s*\()",
            re.IGNORECASE,
        ),
    ),
)
_LEADING_LOGIC = re.compile(r"\A\s*(?:[\w.-]{1,30}\s*=\s*)?(?=(?:and|or|xor)\b|&&|\|\|)", re.I)
_LEADING_VALUE_STACKED = re.compile(r"\A\s*[^\s;]{0,40};")


_VALUE_BEFORE = re.compile(r"(?:['\")]|(?:^|[\s=(])-?\d[\d\-:./]*)\s*$")


def _before_is_value_break(text: str, at: int) -> bool:
    """A quote, a parenthesis or a lone number ends right before: a value broke out
    ("1 UNION SELECT", "' UNION SELECT"), not a table name ("t1 UNION SELECT")."""
    return bool(_VALUE_BEFORE.search(text[max(0, at - 12) : at]))


# -- XSS -----------------------------------------------------------------------------------

_XSS_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # on one line: a quoted attribute ending a tag, then the next line's tag, is markup
    ("xss.attribute-break", re.compile(r"""["'`][ \t]*/?[ \t]*>[ \t]*<\s*[a-z!]""", re.I)),
    (
        "xss.attribute-handler",
        re.compile(  # out of one attribute, into an event handler
            r"""["'`]\s*/?\s*on[a-z]{3,}\s*=\s*["'`]?[^\s"'`>]*\(""", re.IGNORECASE
        ),
    ),
    (
        "xss.event-handler",
        re.compile(  # not JSX's onClick={handler}
            r"<\s*[a-z][\w:-]*\b[^>]{0,200}?[\s/\"']on[a-z]{3,}\s*=\s*(?:[^\s>{]|\Z)",
            re.IGNORECASE,
        ),
    ),
    (
        "xss.script-body",
        re.compile(  # a body that does something: a call, an assignment
            r"<\s*(?:[\w-]+\s*:\s*)?script\b[^>]{0,200}>[^<]{0,400}?"
            r"(?:\w\s*\(|=|;|\b(?:document|window)\.)",
            re.IGNORECASE,
        ),
    ),
    (
        "xss.script-src",
        re.compile(r"<\s*(?:[\w-]+\s*:\s*)?script\b[^>]{0,200}\bsrc\s*=", re.IGNORECASE),
    ),
    (
        "xss.js-url",
        re.compile(
            # browsers drop tabs and newlines inside a URL's scheme: "jav&#x09;ascript:"
            r"(?:\b(?:href|src|action|formaction|data|xlink:href)\s*=\s*[\"']?\s*|^\s*)"
            r"(?:j\s*a\s*v\s*a|v\s*b)\s*s\s*c\s*r\s*i\s*p\s*t\s*:"
            r"|\b(?:java|vb)script\s*:\s*[\w.]+\s*\(|\burl\s*\(\s*[\"']?\s*(?:java|vb)script\b",
            re.IGNORECASE,
        ),
    ),
    (
        "xss.data-html",
        re.compile(r"\b(?:href|src|data)\s*=\s*[\"']?\s*data\s*:\s*text/html", re.IGNORECASE),
    ),
    (
        "xss.frame",
        re.compile(  # an iframe showing a video is not one: srcdoc, plugins
            r"<\s*(?:iframe|frame)\b[^>]{0,200}\bsrcdoc\s*=|"
            r"<\s*(?:object|embed|base)\b[^>]{0,200}\b(?:src|data|href)\s*=|"
            r"<\s*(?:applet\b|v\s*:\s*\w*frame\b)",
            re.IGNORECASE,
        ),
    ),
    (
        "xss.meta-refresh",
        re.compile(r"<\s*meta\b[^>]{0,200}http-equiv\s*=\s*[\"']?refresh", re.IGNORECASE),
    ),
    ("xss.css-expression", re.compile(r"\bstyle\s*=\s*[\"'][^\"']*expression\s*\(", re.IGNORECASE)),
)


_XSS_ANYWHERE: tuple[tuple[str, re.Pattern[str]], ...] = (
    # CSS that loads code: Firefox's XBL bindings, IE's behaviours
    (
        "xss.css-binding",
        re.compile(r"-moz-binding\s*:\s*url\s*\(|\bbehaviou?r\s*:\s*url\s*\(", re.I),
    ),
    # server-side includes: "<!--#exec cmd=...", "<!--#echo var=..."
    ("xss.ssi", re.compile(r"<!--\s*#\s*(?:exec|echo|include|set|config|printenv)\b", re.I)),
    # a tag name spelled out with spaces: "< s c r i p t", "<f o r m"
    (
        "xss.spaced-tag",
        re.compile(
            r"<\s*(?:s\s+c\s*r\s*i\s*p\s*t|f\s+o\s*r\s*m|d\s+i\s*a\s*l\s*o\s*g|"
            r"i\s+f\s*r\s*a\s*m\s*e|s\s+v\s*g|i\s+m\s*g|x\s*:\s*s\s*c\s*r\s*i\s*p\s*t)\b",
            re.I,
        ),
    ),
    # UTF-7 markup: "+ADw-script+AD4-"
    ("xss.utf7", re.compile(r"\+?ADw-\s*/?\s*(?:script|img|svg|iframe)", re.I)),
    # JSFuck: code spelled with []()!+ only
    ("xss.jsfuck", re.compile(r"(?:!\s*\[\s*\][^!]{0,24}){6}")),
    # a function called by a tagged template: alert`1`, [].sort.call`${alert}1337`
    (
        "xss.template-call",
        re.compile(
            r"\b(?:alert|eval|prompt|confirm|call|apply)`|\.\s*(?:call|apply)\s*`"
            r"|\$\{\s*(?:alert|eval|prompt|confirm|navigation\.navigate)\s*\}"
        ),
    ),
    # out of a JavaScript string into a call, the rest commented out: x";alert(1)//
    (
        "xss.js-breakout",
        re.compile(r"""["'][;)]+\s*[\w.$]+\s*\([^()\n]{0,80}\)\s*;?\s*(?://|<!--)"""),
    ),
)


# Short inputs with no prose in them (a form field's value, a fragment of a payload
# split across fields) are held to stricter rules, as CRS's higher paranoia levels do:
# naming an execution sink, or opening an SQL function call, is all they say.
_PROSE = re.compile(r"[^\W\d_]{2,}[ ,]+[^\W\d_]{2,}[ ,]+[^\W\d_]{2,}")
_FRAGMENT_CHARS = 80
_JS_SINK = re.compile(
    r"\b(?:alert|prompt|confirm|eval|atob|setTimeout|setInterval|Function|execScript)\s*\("
    r"|\b(?:document\s*\.\s*(?:cookie|write|domain)|window\s*\.\s*location)\b"
)
_SQL_OPENER = re.compile(
    r"\A\s*(?:ascii|benchmark|cast|char|chr|concat|concat_ws|convert|current_user|database|"
    r"elt|exp|extractvalue|floor|format|group_concat|hex|if|iif|insert|length|load_file|"
    r"ltrim|md5|mid|now|ord|pg_sleep|rand|rtrim|schema|sha1|sleep|substr|substring|"
    r"sysdate|trim|uncompress|unhex|updatexml|user|version|xmltype)\s*\(\s*\Z",
    re.IGNORECASE,
)


def fragment_findings(text: str) -> Iterator[Finding]:
    if len(text.strip()) > _FRAGMENT_CHARS or _PROSE.search(text):
        return
    if m := _JS_SINK.search(text):
        yield Finding("xss.fragment-sink", "xss", m.start(), m.end())
    if m := _SQL_OPENER.match(text):
        yield Finding("sqli.fragment-call", "sql_injection", m.start(), m.end())


def xss_findings(text: str) -> Iterator[Finding]:
    for rule, pattern in _XSS_ANYWHERE:
        m = pattern.search(text)
        if m:
            yield Finding(rule, "xss", m.start(), m.end())
    if "<" not in text and ":" not in text and "=" not in text:
        return
    for rule, pattern in _XSS_RULES:
        m = pattern.search(text)
        if m:
            yield Finding(rule, "xss", m.start(), m.end())


# -- prompt injection ---------------------------------------------------------------------

_PI_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "prompt.ignore-instructions",
        re.compile(
            r"\b(?:ignore|disregard|forget|override|bypass)\s+(?:(?:all|any|the|your|of|my)\s+)*"
            r"(?:previous|prior|above|earlier|preceding|system|original|initial|these|those|all)"
            r"\s+(?:\w+\s+)?(?:instructions?|prompts?|rules|guidelines|directions|directives)\b"
            r"|\b(?:ignore|disregard|forget|override)\s+your\s+(?:\w+\s+)?(?:instructions|rules|"
            r"guidelines|programming|training|system\s+prompt)\b"
            r"|\b(?:ignore|disregard|forget)\s+(?:(?:the|everything|all|anything)\s+)?"
            r"(?:above|before this|said before)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "prompt.ignore-instructions-zh",
        re.compile(
            r"(?:忽略|无视|忘记|忘掉|不要理会|绕过)[^，。,.!！?？\n]{0,8}?"
            r"(?:指令|指示|提示词|系统提示|规则|设定)"
        ),
    ),
    (
        "prompt.role-tag",
        re.compile(
            r"<\|(?:im_start|im_end|system|user|assistant|begin_of_text|end_of_text|eot_id|"
            r"start_header_id|end_header_id)\|>|\[/?INST\]|<</?SYS>>",
            re.IGNORECASE,
        ),
    ),
    (
        "prompt.jailbreak-persona",
        re.compile(
            r"\b(?:you\s+are\s+now|act\s+as|pretend\s+(?:to\s+be|you\s+are)|from\s+now\s+on"
            r"\s+you\s+are)\s+(?:an?\s+|in\s+)?(?:DAN\b|jailbr(?:oken|eak)|unrestricted|unfiltered|"
            r"uncensored|developer\s+mode|(?:evil|rogue)\s+(?:AI|assistant|model)|"
            r"(?:AI|assistant|model|chatbot)\b[^.\n]{0,30}?\b(?:without|with\s+no)\s+(?:any\s+)?"
            r"(?:restrictions|filters|limits|rules|guidelines|censorship))"
            r"|\b(?:enable|enter|activate)\s+(?:the\s+)?(?:developer|god|jailbreak)\s+mode\b",
            re.IGNORECASE,
        ),
    ),
    (
        "prompt.disable-safety",
        re.compile(
            r"\b(?:override|disable|bypass|turn\s+off|ignore)\s+(?:your\s+|the\s+|all\s+)*"
            r"(?:safety|content|moderation)\s+(?:filters?|guidelines|policies|restrictions|rules)",
            re.IGNORECASE,
        ),
    ),
    (
        "prompt.exfiltrate-system",
        re.compile(
            r"\b(?:reveal|print|show|repeat|output|leak|display|tell\s+me|give\s+me)\s+(?:me\s+)?"
            r"(?:your|the\s+(?:above|original|initial|hidden))\s+(?:system\s+prompt|"
            r"(?:original\s+|initial\s+|hidden\s+)?instructions|hidden\s+prompt|initial\s+prompt|"
            r"developer\s+message)|\bwhat\s+(?:were|are)\s+your\s+(?:original|initial|system)\s+"
            r"(?:instructions|prompt)",
            re.IGNORECASE,
        ),
    ),
)


_PI_OVERRIDE: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        # "SYSTEM OVERRIDE:", "[ADMIN OVERRIDE]", "developer override code 7731 accepted"
        "prompt.system-override",
        re.compile(
            r"\b(?:system|admin(?:istrator)?|developer|root|sudo|security|emergency|master)"
            r"\s+override\s*(?:[:\]*!\u2014-]|code\b|mode\b|(?:is\s+|has\s+been\s+)?"
            r"(?:enabled|activated|accepted|engaged|granted|in\s+effect))",
            re.IGNORECASE,
        ),
    ),
    (
        "prompt.instructions-void",
        re.compile(
            r"\b(?:previous|above|prior|earlier|original|old|initial|system)\s+"
            r"(?:instructions|rules|guidelines|directives|prompt)\s+(?:are|were|is|have\s+been)\s+"
            r"(?:now\s+)?(?:void|null|cancel+ed|revoked|obsolete|overridden|superseded|"
            r"no\s+longer\s+(?:valid|apply|applicable|in\s+effect))",
            re.IGNORECASE,
        ),
    ),
    (
        "prompt.restrictions-lifted",
        re.compile(
            r"\b(?:your|content|safety|ethical|moderation)\s+(?:restrictions|filters|limitations|"
            r"safeguards|guidelines|protocols)\s+(?:are\s+|have\s+been\s+|were\s+|now\s+)*"
            r"(?:lifted|removed|disabled|off|suspended|deactivated)\b",
            re.IGNORECASE,
        ),
    ),
)


def prompt_findings(text: str) -> Iterator[Finding]:
    for rule, pattern in _PI_OVERRIDE:
        m = pattern.search(text)
        if m:
            yield Finding(rule, "prompt_injection", m.start(), m.end())
    for rule, pattern in _PI_RULES:
        m = pattern.search(text)
        if m:
            yield Finding(rule, "prompt_injection", m.start(), m.end())


# -- all of them -------------------------------------------------------------------------


def _raw_findings(text: str) -> Iterator[Finding]:
    yield from sql_findings(text)
    sql = without_inline_comments(text)
    if sql is not None:  # "UNION/**/SELECT", "/*!00000select*/"
        for f in sql_findings(sql.text):
            yield Finding(f.rule, f.type, *sql.span(f.start, f.end))
    yield from xss_findings(text)
    yield from fragment_findings(text)
    yield from prompt_findings(text)


def findings(text: str) -> list[Finding]:
    """Every rule that matched, once each (at its first place), in text order: on the
    text as sent, and on the text decoded (offsets still into the text as sent)."""
    first: dict[str, Finding] = {}
    for f in _raw_findings(text):
        first.setdefault(f.rule, f)
    plain = decoded(text)
    if plain is not None:  # "%27%20OR%201%3D1--", "&lt;script&gt;", "ｉｇｎｏｒｅ ..."
        for f in _raw_findings(plain.text):
            first.setdefault(f.rule, Finding(f.rule, f.type, *plain.span(f.start, f.end)))
    return sorted(first.values(), key=lambda f: (f.start, f.rule))


def decide(found: Sequence[object], policy: Policy) -> Decision:
    """What ``policy`` makes of the findings (of a text, or of a request's fields)."""
    if not found or policy == "off":
        return "pass"
    return "block" if policy == "block" else "flag"
