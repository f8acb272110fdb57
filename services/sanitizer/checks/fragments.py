"""Short inputs with no prose in them: a form field's value, a fragment of a payload
split across fields. They are held to stricter rules, as CRS's higher paranoia levels
do: naming an execution sink, calling one of SQL's own functions, starting in the
middle of a statement (a closing parenthesis, a quote, a logic operator, a clause
keyword) with more SQL after it, naming the catalog tables. A prompt to a model has
words in it; these have none. A whole statement ("SELECT name FROM t WHERE id = 3")
starts at a statement's beginning and passes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from .finding import Finding

_PROSE = re.compile(r"[^\W\d_]{2,}[ ,]+[^\W\d_]{2,}[ ,]+[^\W\d_]{2,}")
_FRAGMENT_CHARS = 80
_JS_SINK = re.compile(
    r"\b(?:alert|prompt|confirm|eval|atob|setTimeout|setInterval|Function|execScript)\s*\("
    r"|\b(?:document\s*\.\s*(?:cookie|write|domain)|window\s*\.\s*location)\b"
    r"|\.\s*(?:inner|outer)HTML\s*=|<!\[CDATA\["
)
_SQL_OPENER = re.compile(
    r"\A\s*(?:ascii|benchmark|cast|char|chr|concat|concat_ws|convert|current_user|database|"
    r"elt|exp|extractvalue|floor|format|group_concat|hex|if|iif|insert|length|load_file|"
    r"ltrim|md5|mid|now|ord|pg_sleep|rand|rtrim|schema|sha1|sleep|substr|substring|"
    r"sysdate|trim|uncompress|unhex|updatexml|user|version|xmltype)\s*\(\s*\Z",
    re.IGNORECASE,
)
# SQL's own functions, called anywhere in the fragment; not those a Python or
# JavaScript one-liner also calls (max, sum, round, hex, ord ...) nor methods (x.trim())
_SQL_CALL = re.compile(
    r"(?<![\w.$])(?:benchmark|cast|char_length|charindex|coalesce|concat|concat_ws|"
    r"current_user|database|datediff|elt|extractvalue|find_in_set|group_concat|ifnull|iif|"
    r"instr|isnull|lcase|load_file|locate|make_set|md5|mid|name_const|nullif|nvarchar|"
    r"pg_sleep|rand|sha1|sleep|substr|substring|substring_index|sysdate|system_user|ucase|"
    r"uncompress|unhex|unistr|updatexml|utl_inaddr\.\w+|version|xmltype)\s*\(",
    re.IGNORECASE,
)
# where a fragment of a query starts: mid-statement, not at a statement's beginning
_SQL_MIDWAY = re.compile(
    r"\A\s*(?:[\w.-]{1,30}=)?(?:[)'\"`;]|&&|\|\||"  # "pay=and 1=(", not "x = 'a'"
    r"(?:and|or|xor|div|from|where|having|union|limit|into|as|in|like|"
    r"regexp|rlike|between|group\s+by|order\s+by)(?=[\s(]|\Z))",
    re.IGNORECASE,
)
# what makes the rest SQL: a comparison, a comment, a call, a keyword. Not a number or a
# quote alone: "#1", "'ok'", "in 5 minutes" are things people type to a model
_SQL_STRONG = re.compile(
    r"[=<>]|!=|--|#|/\*|\w\s*\(|"
    r"\b(?:select|from|where|null|exists|table|limit|having|union|like|regexp|is|not|as|in|"
    r"and|or|xor)\b",
    re.IGNORECASE,
)
_SCHEMA = re.compile(
    r"\b(?:information_schema|sysobjects|syscolumns|pg_catalog|pg_shadow|sqlite_master|"
    r"mysql\.(?:user|db)|all_tables|dba_users|msysaccessobjects)\b",
    re.IGNORECASE,
)


def fragment_findings(text: str) -> Iterator[Finding]:
    if len(text.strip()) > _FRAGMENT_CHARS or _PROSE.search(text):
        return
    if m := _JS_SINK.search(text):
        yield Finding("xss.fragment-sink", "xss", m.start(), m.end())
    if m := _SQL_OPENER.match(text) or _SQL_CALL.search(text):
        yield Finding("sqli.fragment-call", "sql_injection", m.start(), m.end())
    if (m := _SQL_MIDWAY.match(text)) and _SQL_STRONG.search(text, m.end()):
        yield Finding("sqli.fragment-midway", "sql_injection", m.start(), len(text.rstrip()))
    if m := _SCHEMA.search(text):
        yield Finding("sqli.schema-probe", "sql_injection", m.start(), m.end())
