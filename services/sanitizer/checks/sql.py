"""SQL injection, judged by shape.

As libinjection does, the text is read as SQL from where a value would break out of
its context (the start of the text, or a quote that would close a string literal),
tokenized (strings, numbers, keywords, logic operators, functions, comments), and the
first tokens are matched against the shapes attacks need: a tautology after a logic
operator, a comment that truncates the query, UNION SELECT, a stacked query, a time
delay. A question that mentions SQL ("how do I write SELECT * FROM users WHERE id = ?
safely") breaks out of nothing, so it passes. Then what only attacks send, anywhere:
delays in subqueries and concatenations, file access, xp_ commands, versioned
comments, what injection tools leave behind.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass

from .finding import Finding, first_matches

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
    if (b.kind == "string" and b.text[-1] != b.text[0]) or len(b.text) == 1:
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
    return any(a.text == "(" and b.low == "select" for a, b in itertools.pairwise(toks))


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
                or (rest[2].text == "(" and len(rest) > 3 and rest[3].low == "select")
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


_STATEMENT = re.compile(r"\A\s*(?:select|insert|update|delete|with|create)\s", re.IGNORECASE)


def _whole_statement(text: str) -> bool:
    """A query as someone writes it, not a value: it starts a statement and its string
    literals are closed ("SELECT name FROM t WHERE c = 'Asia' UNION SELECT ...")."""
    return bool(_STATEMENT.match(text)) and all(text.count(q) % 2 == 0 for q in "'\"`")


def sql_findings(text: str) -> Iterator[Finding]:
    seen: set[int] = set()
    statement = _whole_statement(text)
    # a value breaking out of a string literal at a quote
    for n, q in enumerate([] if statement else _QUOTES.finditer(text)):
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
        if _UNION_EXTRACT.search(tail) or (
            not statement and _before_is_value_break(text, u.start())
        ):
            yield Finding("sqli.union", "sql_injection", u.start(), min(len(text), u.end() + 40))
    yield from _delay_findings(text)
    yield from _self_equal_findings(text)
    yield from first_matches(text, _SQL_RULES, "sql_injection", _NEEDLES)
    # a value that is a logic operator and what follows ("and 1=1'"), or a value and a
    # stacked statement ("1;INSERT INTO ...", "mod(1,2);DROP TABLE t")
    if logic := _LEADING_LOGIC.match(text):
        toks = _sql_tokens(text, logic.end())
        rule = _sql_shape(text, toks, broke_out=False) if len(toks) > 2 else None
        if rule:  # "and 1=1'", not a reply such as "or 3"
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


# a random number compared with itself, as injection tools probe: "AND 6698=6698"
_SELF_EQUAL = re.compile(r"(?<![\w.])(\d{3,})\s*==?\s*(\d{3,})\b")
_SELF_EQUAL_BEFORE = re.compile(r"\b(?:where|and|or|having|elt)\s*\(?\s*\Z", re.I)


def _self_equal_findings(text: str) -> Iterator[Finding]:
    for m in _SELF_EQUAL.finditer(text):
        before = text[max(0, m.start() - 12) : m.start()]
        if m.group(1) == m.group(2) and _SELF_EQUAL_BEFORE.search(before):
            yield Finding("sqli.tool-signature", "sql_injection", m.start(), m.end())
            return


_NEEDLES: dict[str, tuple[str, ...]] = {
    "sqli.time-delay": ("waitfor", "dbms_", "randomblob", "benchmark"),
    "sqli.tool-signature": ("0x", "chr", "rand"),
    "sqli.file-access": ("load_file", "outfile", "dumpfile"),
    "sqli.command-exec": ("exec",),
    "sqli.versioned-comment": ("/*!",),
}
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
            r"\b(?:concat(?:_ws)?|char|chr)\s*\(\s*0x[0-9a-f]{6,}"
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
