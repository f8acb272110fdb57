"""XSS, judged by shape: markup that executes.

A tag after an attribute break (``">``), event-handler attributes, ``<script>`` with
a body, ``javascript:`` URLs (with the whitespace browsers drop inside a scheme),
frames and plugins, CSS that loads code, server-side includes, tag names spelled out
with spaces, UTF-7, JSFuck, tagged-template calls, break-outs of a JavaScript string,
XML that fetches or binds (external entities, XInclude, schemas from callback hosts,
XML Events), markup hidden in a data: URI's base64, sink names spelled in pieces.
A mention of ``<script>`` in a question has no body and breaks nothing.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator

from .finding import Finding, first_matches

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
            r"(?:\w\s*\(|=|;|[\w)]`|\b(?:document|window)\.)",  # [\w)]`: a tagged template
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
            r"(?:j\s*a\s*v\s*a|v\s*b|l\s*i\s*v\s*e)\s*s\s*c\s*r\s*i\s*p\s*t\s*:"
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
            r"<\s*(?:object|embed|base)\b[^>]{0,200}\b(?:src|data|href|classid|codebase)\s*=|"
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


_LOW_BYTE_BC = "".join(chr(cp) for cp in range(0x80, 0x800) if cp & 0x3F == 0x3C)
_LOW_BYTE_BE = "".join(chr(cp) for cp in range(0x80, 0x800) if cp & 0x3F == 0x3E)
"""The two-byte UTF-8 characters whose last byte is 0xBC ("<" in 7 bits), 0xBE (">")."""

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
    # client-side template injection: {{constructor.constructor('alert(1)')()}}
    (
        "xss.template-injection",
        re.compile(r"\{\{[^}]{0,200}?(?:\bconstructor\b|\$eval\b|\$on\b|\$emit\b|__proto__)"),
    ),
    # a global reached by a computed name: window['al'+'ert'], self["eval"]
    (
        "xss.global-access",
        re.compile(
            r"\b(?:window|self|top|parent|frames|globalThis|document|this)\s*\[\s*"
            r"(?:[\"'`][^\"'`\]]{0,20}[\"'`]\s*\+|[\"'`](?:alert|eval|prompt|confirm|"
            r"location|cookie|Function|constructor)[\"'`])"
        ),
    ),
    # "<" as a character whose UTF-8 form ends in the byte 0xBC (¼, м), which a server
    # reading bytes as 7-bit ASCII turns into 0x3C: "¼script¾", "мscriptо"
    (
        "xss.malformed-encoding",
        re.compile(
            # "¼" may stand apart from the name; a letter ("м") only glued to it and
            # closed, since a Russian sentence may say "Пишем script"
            r"\u00bc\s*/?\s*(?:script|img|svg|iframe)"
            f"|[{_LOW_BYTE_BC}]/?(?:script|img|svg|iframe)[{_LOW_BYTE_BE}]",
            re.I,
        ),
    ),
    # tags only old browsers run code from; IE's XML data islands, which load a file
    (
        "xss.legacy-tag",
        re.compile(
            r"<\s*\??(?:isindex|bgsound|ilayer|layer|import)\b|<\s*xml\b[^>]{0,200}\bsrc\s*=", re.I
        ),
    ),
    # an event handler set to a sink, inside a tag or not: " onfocus=alert(1)"
    (
        "xss.handler-sink",
        re.compile(
            r"(?<![\w.])on[a-z]{3,}\s*=\s*[\"'`]?\s*(?:alert|prompt|confirm|eval|"
            r"javascript:|document\.|window\.|top\.|self\.)",
            re.I,
        ),
    ),
    # executable tags glued together: "www.site.com<script><img><iframe>"
    (
        "xss.tag-run",
        re.compile(
            r"(?:<\s*(?:script|img|iframe|svg|object|embed|frame|body)\b[^<>]{0,80}>\s*){2}", re.I
        ),
    ),
    # attributes only old browsers had, each of which loaded code or data
    (
        "xss.obsolete-attribute",
        re.compile(r"\b(?:dynsrc|lowsrc|datasrc|datafld|dataformatas)\s*=", re.I),
    ),
    # a data: URI of a type that runs
    (
        "xss.data-executable",
        re.compile(
            r"\bdata\s*:\s*(?:text/html|(?:text|application)/(?:x-)?(?:java|ecma)script)\b", re.I
        ),
    ),
    # a scheme with code right after it: javascript:x=1, javascript:[], javascript:alert`1`
    ("xss.js-scheme-code", re.compile(r"\b(?:java|vb)script\s*:[^\s\"'<>]{0,40}?[(=\[`\\]", re.I)),
    # CSS expression() in any declaration
    ("xss.css-expression-any", re.compile(r":\s*expression\s*\(", re.I)),
    # an execution sink passed as a value: [1].find(alert), a=alert,a(1)
    (
        "xss.sink-reference",
        re.compile(
            r"\.\s*(?:find|map|filter|forEach|some|every|call|apply|then)\s*\(\s*"
            r"(?:alert|eval|prompt|confirm)\s*\)|(?<![=!<>])=\s*(?:alert|eval|prompt|confirm)\s*[,;]"
        ),
    ),
    # a global indexed by a regex's source or an escaped string: top[/al/.source+...]
    (
        "xss.global-obfuscated",
        re.compile(
            r"\b(?:top|window|self|parent|frames|globalThis)\s*\[\s*(?:/[^/\n]{1,20}/\s*\.\s*source|"
            r"[\"'`][^\"'`\]\n]{0,20}\\)"
        ),
    ),
    # SVG/XML animation that sets a link or markup: <set attributeName="xlink:href" to=
    (
        "xss.svg-set",
        re.compile(
            r"<\s*(?:[\w-]+:)?(?:set|animate)\b[^>]{0,200}\battributeName\s*=\s*[\"']?"
            r"(?:xlink:href|href|innerHTML|on[a-z]+)|<\s*handler\b[^>]{0,200}\bev:event\s*=",
            re.I,
        ),
    ),
    # a scheme that loads a document to run: mhtml:
    ("xss.mhtml", re.compile(r"\bmhtml\s*:\s*(?:https?:|//)", re.I)),
    # a style sheet that runs code
    (
        "xss.style-code",
        re.compile(
            # an at-rule's name escaped ("@\\69mport") is there only to hide it
            r"<\s*style\b[^>]{0,200}>[^<]{0,400}?(?:@import|@[\w-]*\\|expression\s*\(|"
            r"behaviou?r\s*:|-moz-binding|javascript\s*:)",
            re.I,
        ),
    ),
    # a document type that fetches an external entity, or gives every <img> a handler
    (
        "xss.xml-entity",
        re.compile(
            r"<!ENTITY\s+(?:%\s*)?[\w.-]+\s+(?:SYSTEM|PUBLIC)\s+[\"']"
            r"|<!ATTLIST\b[^>]{0,300}?\son[a-z]{3,}\s+CDATA\b"
            r"|<\s*xi\s*:\s*include\b[^>]{0,200}\bhref\s*=",  # XInclude: a file pulled in
            re.I,
        ),
    ),
    # an XML schema fetched from a callback host (a long random label, as out-of-band
    # probes use): not a project's pom.xml, whose schemas live at maven.apache.org
    (
        "xss.schema-callback",
        re.compile(
            r"\bxsi\s*:\s*(?:noNamespaceS|s)chemaLocation\s*=\s*[\"'][^\"']{0,200}?"
            r"\b(?:https?:)?//(?=[a-z0-9]{20,}\.)(?=(?:[a-z]*\d){3})(?=(?:\d*[a-z]){3})",
            re.I,
        ),
    ),
    # XML Events: a handler bound to an event by attributes, on any element
    ("xss.xml-events", re.compile(r"\bev:(?:event|handler)\s*=\s*[\"']?[\w#]", re.I)),
    # an HTML import: a document loaded, scripts and all, into the page
    ("xss.html-import", re.compile(r"<\s*link\b[^>]{0,200}\brel\s*=\s*[\"']?import\b", re.I)),
    # a name built from regular expressions' sources: a=/ev/.source, a+=/al/.source
    ("xss.regex-source", re.compile(r"(?:/[^/\s]{1,12}/+\s*\.\s*source\b[^\n]{0,60}?){2}")),
    # out of a JavaScript string into setting the page's location: x";location=...
    (
        "xss.js-breakout-location",
        re.compile(
            r"""["'`]\s*[;,+|&-]\s*(?:(?:window|self|top|document)\s*\.\s*)?location"""
            r"""(?:\s*\.\s*href)?\s*=\s*(?:["'`]|name\b|//)"""
        ),
    ),
    # out of a JavaScript string into a call, the rest commented out: x";alert(1)//
    (
        "xss.js-breakout",
        re.compile(  # the call's arguments may hold one: alert(String.fromCharCode(88))
            r"""["'][;)]+\s*[\w.$]+\s*\((?:[^()\n]|\([^()\n]{0,80}\)){0,80}\)\s*;?\s*(?://|<!--)"""
        ),
    ),
)


# what each rule's every match holds (lower-cased)
_NEEDLES: dict[str, tuple[str, ...]] = {
    "xss.attribute-break": ("<",),
    "xss.event-handler": ("<",),
    "xss.script-body": ("script",),
    "xss.script-src": ("script",),
    "xss.js-url": (":", "url"),
    "xss.data-html": ("text/html",),
    "xss.frame": ("<",),
    "xss.meta-refresh": ("refresh",),
    "xss.css-expression": ("expression",),
    "xss.css-binding": ("binding", "behavio"),
    "xss.ssi": ("<!--",),
    "xss.spaced-tag": ("<",),
    "xss.utf7": ("adw-",),
    "xss.jsfuck": ("[",),
    "xss.template-call": ("`", "${"),
    "xss.template-injection": ("{{",),
    "xss.global-access": ("[",),
    "xss.malformed-encoding": ("script", "img", "svg", "iframe"),
    "xss.legacy-tag": ("<",),
    "xss.handler-sink": ("=",),
    "xss.tag-run": ("<",),
    "xss.obsolete-attribute": ("dynsrc", "lowsrc", "datasrc", "datafld", "dataformatas"),
    "xss.data-executable": ("data",),
    "xss.js-scheme-code": ("script",),
    "xss.css-expression-any": ("expression",),
    "xss.style-code": ("style",),
    "xss.js-breakout": ("//", "<!--"),
    "xss.sink-reference": ("alert", "eval", "prompt", "confirm"),
    "xss.global-obfuscated": ("[",),
    "xss.svg-set": ("attributename", "ev:event"),
    "xss.mhtml": ("mhtml",),
    "xss.xml-entity": ("<!entity", "<!attlist", "include"),
    "xss.schema-callback": ("schemalocation",),
    "xss.xml-events": ("ev:",),
    "xss.html-import": ("import",),
    "xss.regex-source": ("source",),
    "xss.js-breakout-location": ("location",),
}


_ALL_RULES = (*_XSS_ANYWHERE, *_XSS_RULES)


def xss_findings(text: str) -> Iterator[Finding]:
    yield from first_matches(text, _ALL_RULES, "xss", _NEEDLES)
    if "base64" in text.lower():
        yield from _base64_findings(text)


_BASE64_BODY = re.compile(r"base64\s*,\s*([A-Za-z0-9+/]{16,}={0,2})", re.I)
_BASE64_READ = 4096
"""Characters of a body decoded at most: markup that runs starts near its beginning, and
a pasted image's megabytes are not read."""


def _base64_findings(text: str) -> Iterator[Finding]:
    """A data: URI's base64 body that is markup which runs ("data:...;base64,PHNjcmlwdD4...",
    any type named): its span in the text."""
    for m in _BASE64_BODY.finditer(text):
        body = m.group(1)[:_BASE64_READ]
        try:
            plain = base64.b64decode(body + "=" * (-len(body) % 4)).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            continue
        if next(first_matches(plain, _ALL_RULES, "xss", _NEEDLES), None):
            yield Finding("xss.base64-markup", "xss", m.start(1), m.end(1))
            return


# a sink's name as one literal: read in the text with its pieces joined ('ev'+'al')
_JOINED_SINK = re.compile(
    r"""["'](?:eval|alert|prompt|confirm|(?:java|vb)script:|location|cookie|fromCharCode|"""
    r"""constructor|inner(?:HTML|Text)|outerHTML|unescape|atob|setTimeout|execScript)["']"""
)


def joined_findings(joined: str) -> Iterator[Finding]:
    """On a text whose adjacent string literals were joined: the XSS rules, and a
    sink's name spelled in pieces (which no one writes but to hide it)."""
    yield from xss_findings(joined)
    if m := _JOINED_SINK.search(joined):
        yield Finding("xss.joined-sink", "xss", m.start(), m.end())
