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
from dataclasses import dataclass
from typing import Iterator, Literal

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
    |(?P<string>'(?:[^'\\]|\\.|'')*'?|"(?:[^"\\]|\\.|"")*"?|`[^`]*`?)
    |(?P<number>0x[0-9a-fA-F]+|\d+(?:\.\d+)?)
    |(?P<word>[A-Za-z_@$][\w@$.]*)
    |(?P<op><=>|<>|!=|<=|>=|\|\||&&|[=<>+\-*/%^~|&!])
    |(?P<punct>[(),;])
    |(?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)
_LOGIC = {"or", "and", "xor", "||", "&&", "not"}
_STACKABLE = {"drop", "delete", "insert", "update", "select", "exec", "execute", "shutdown",
              "truncate", "alter", "create", "declare", "waitfor", "grant", "rename", "set"}
_TIME_FUNCS = {"sleep", "benchmark", "pg_sleep", "dbms_lock.sleep", "waitfor"}
_DANGER_FUNCS = _TIME_FUNCS | {"load_file", "extractvalue", "updatexml", "xp_cmdshell",
                               "char", "concat", "version", "database", "user", "ascii",
                               "substring", "substr", "if", "md5", "hex", "unhex", "exp",
                               "utl_inaddr.get_host_name", "group_concat", "count"}


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


def _sql_tokens(text: str, pos: int, limit: int = 12) -> list[_Tok]:
    out: list[_Tok] = []
    for m in _SQL_TOKEN.finditer(text, pos):
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
    rest = text[tok.end: len(text) if line_end < 0 else line_end]
    return tok.text == "/*" or not rest.strip(" \t-#;+")


def _sql_shape(text: str, toks: list[_Tok], broke_out: bool) -> str | None:
    """The rule an attack shape matches, reading ``toks`` as the SQL after a value."""
    i = 0
    while i < len(toks) and toks[i].text == ")":  # closing the query's own parentheses
        i += 1
    t = toks[i:]
    if not t:
        return None
    first = t[0]
    if broke_out and first.kind == "comment" and _rest_is_blank(text, first):
        return "sqli.comment-truncation"
    if first.low in _LOGIC and first.low != "not" and len(t) >= 2:
        rest = t[1:]
        while rest and rest[0].text == "(":
            rest = rest[1:]
        if len(rest) >= 3 and rest[0].value and rest[1].kind == "op" and (
                rest[2].value or rest[2].text == "("):
            return "sqli.tautology"
        if rest and rest[0].kind == "func" and rest[0].low in _DANGER_FUNCS:
            return "sqli.function"
        if broke_out and len(rest) >= 2 and rest[0].value and (
                rest[1].kind == "comment" or rest[1].text == ";"):
            return "sqli.tautology"
        if len(rest) == 1 and (broke_out and rest[0].kind == "number" or
                               rest[0].low in ("true", "1")):
            return "sqli.tautology"
    if first.low == "union":
        nxt = t[1:3]
        words = [x.low for x in nxt]
        if words[:1] == ["select"] or words[:2] in (["all", "select"], ["distinct", "select"]):
            return "sqli.union"
    if first.text == ";" and len(t) >= 2 and t[1].low in _STACKABLE and (
            broke_out or t[1].low != "set"):
        return "sqli.stacked"
    return None


_QUOTES = re.compile(r"['\"`]")
# a numeric value where a field's value starts: the text's start, or after "=" / ":"
_BARE_VALUE = re.compile(r"(?:^|[=:])\s*-?\d+(?:\.\d+)?\s*\)*\s*(?=\S)")
_UNION_SELECT = re.compile(r"\bunion(?:\s+(?:all|distinct))?\s+select\b", re.IGNORECASE)
_UNION_EXTRACT = re.compile(
    r"\bnull\b|@@\w+|information_schema|\bconcat(?:_ws)?\s*\(|\bgroup_concat\s*\(|"
    r"\bversion\s*\(|\bdatabase\s*\(|\buser\s*\(|\bfrom\s+\w+\s*(?:--|#|/\*|;|$)|"
    r"(?:\b\d+\s*,\s*){2,}", re.IGNORECASE)


def sql_findings(text: str) -> Iterator[Finding]:
    seen: set[int] = set()
    # a value breaking out of a string literal at a quote
    for q in _QUOTES.finditer(text):
        at = q.start()
        prev = text[at - 1] if at else " "
        if prev.isalpha() and at + 1 < len(text) and text[at + 1].isalpha():
            continue  # an apostrophe inside a word: "don't"
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
        tail = text[u.end(): u.end() + 160]
        if _UNION_EXTRACT.search(tail) or _before_is_value_break(text, u.start()):
            yield Finding("sqli.union", "sql_injection", u.start(), min(len(text), u.end() + 40))
    # time delays after a logic operator: "1 AND SLEEP(5)"
    for t in re.finditer(r"\b(?:and|or)\s+(?:sleep|benchmark|pg_sleep)\s*\(|"
                         r";\s*waitfor\s+delay\b", text, re.IGNORECASE):
        yield Finding("sqli.time-delay", "sql_injection", t.start(), t.end())


def _before_is_value_break(text: str, at: int) -> bool:
    before = text[max(0, at - 6):at].rstrip()
    return bool(before) and before[-1] in "'\")0123456789"


# -- XSS -----------------------------------------------------------------------------------

_XSS_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("xss.attribute-break", re.compile(r"""["'`]\s*/?\s*>\s*<\s*[a-z!/]""", re.IGNORECASE)),
    ("xss.attribute-handler", re.compile(  # out of one attribute, into an event handler
        r"""["'`]\s*/?\s*on[a-z]{3,}\s*=\s*["'`]?[^\s"'`>]*\(""", re.IGNORECASE)),
    ("xss.event-handler", re.compile(
        r"<\s*[a-z][\w:-]*\b[^>]*?[\s/\"']on[a-z]{3,}\s*=\s*[^\s>]", re.IGNORECASE)),
    ("xss.script-body", re.compile(  # a body that does something: a call, an assignment
        r"<\s*script\b[^>]*>[^<]*?(?:\w\s*\(|=|;|\b(?:document|window)\.)", re.IGNORECASE)),
    ("xss.script-src", re.compile(r"<\s*script\b[^>]*\bsrc\s*=", re.IGNORECASE)),
    ("xss.js-url", re.compile(
        r"(?:\b(?:href|src|action|formaction|data|xlink:href)\s*=\s*[\"']?\s*|^\s*)"
        r"(?:java|vb)script\s*:|\b(?:java|vb)script\s*:\s*[\w.]+\s*\(", re.IGNORECASE)),
    ("xss.data-html", re.compile(
        r"\b(?:href|src|data)\s*=\s*[\"']?\s*data\s*:\s*text/html", re.IGNORECASE)),
    ("xss.frame", re.compile(
        r"<\s*(?:iframe|frame|object|embed|base)\b[^>]*\b(?:src|data|href|srcdoc)\s*=",
        re.IGNORECASE)),
    ("xss.meta-refresh", re.compile(r"<\s*meta\b[^>]*http-equiv\s*=\s*[\"']?refresh",
                                    re.IGNORECASE)),
    ("xss.css-expression", re.compile(r"\bstyle\s*=\s*[\"'][^\"']*expression\s*\(",
                                      re.IGNORECASE)),
)


def xss_findings(text: str) -> Iterator[Finding]:
    if "<" not in text and ":" not in text and "=" not in text:
        return
    for rule, pattern in _XSS_RULES:
        m = pattern.search(text)
        if m:
            yield Finding(rule, "xss", m.start(), m.end())


# -- prompt injection ---------------------------------------------------------------------

_PI_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("prompt.ignore-instructions", re.compile(
        r"\b(?:ignore|disregard|forget|override|bypass|skip)\b[^.\n]{0,40}?"
        r"\b(?:previous|prior|above|earlier|preceding|all|any|your|the|these|those|system)"
        r"\b[^.\n]{0,30}?\b(?:instructions?|prompts?|rules|guidelines|directions|directives"
        r"|system\s+(?:prompt|message)|context|constraints)\b", re.IGNORECASE)),
    ("prompt.ignore-instructions-zh", re.compile(
        r"(?:忽略|无视|忘记|忘掉|不要理会|绕过)(?:掉)?(?:你)?(?:之前|以上|上面|前面|先前|所有|全部|一切)"
        r"的?(?:所有)?(?:指令|指示|提示词?|规则|设定|要求|限制)")),
    ("prompt.role-tag", re.compile(
        r"<\|(?:im_start|im_end|system|user|assistant|begin_of_text|end_of_text|eot_id|"
        r"start_header_id|end_header_id)\|>|\[/?INST\]|<</?SYS>>|"
        r"(?m:^\s*(?:#{2,}\s*)?(?:system|developer)\s*(?:prompt|message)?\s*:\s*\S)",
        re.IGNORECASE)),
    ("prompt.jailbreak-persona", re.compile(
        r"\b(?:you\s+are\s+now|act\s+as|pretend\s+(?:to\s+be|you\s+are)|from\s+now\s+on\s+you"
        r"\s+are)\b[^.\n]{0,40}?\b(?:DAN|jailbr(?:oken|eak)|unrestricted|unfiltered|"
        r"developer\s+mode|without\s+(?:any\s+)?(?:restrictions|filters|limits|rules))",
        re.IGNORECASE)),
    ("prompt.exfiltrate-system", re.compile(
        r"\b(?:reveal|print|show|repeat|output|leak|display|tell\s+me)\b[^.\n]{0,25}?"
        r"\b(?:your\s+)?(?:system\s+prompt|hidden\s+(?:instructions|prompt)|"
        r"initial\s+(?:instructions|prompt)|developer\s+message)", re.IGNORECASE)),
)


def prompt_findings(text: str) -> Iterator[Finding]:
    for rule, pattern in _PI_RULES:
        m = pattern.search(text)
        if m:
            yield Finding(rule, "prompt_injection", m.start(), m.end())


# -- all of them -------------------------------------------------------------------------


def findings(text: str) -> list[Finding]:
    """Every rule that matched, once each (at its first place), in text order."""
    first: dict[str, Finding] = {}
    for f in (*sql_findings(text), *xss_findings(text), *prompt_findings(text)):
        first.setdefault(f.rule, f)
    return sorted(first.values(), key=lambda f: (f.start, f.rule))


def decide(found: list[Finding], policy: Policy) -> Decision:
    if not found or policy == "off":
        return "pass"
    return "block" if policy == "block" else "flag"
