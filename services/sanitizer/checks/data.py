"""Instructions inside data: text a tool returned to an agent (an email, a web page, a
file, a retrieved document) that speaks to the model and tells it what to do.

Data may ask its human reader for things ("please send the invoice by Friday"), so one
imperative is not enough. A finding needs either a sign that no ordinary document
gives (the model addressed by name, a claim to speak for the user or the system, a
forged conversation turn, a demand to keep it from the user, text hidden from a human
reader, instructions to ignore instructions, misspelt too, an order only an assistant
is given: orders.py; a question or errand foreign to the data: asks.py), or two of the weaker
signs together, one of them of a task taken over (a task switch: "before you answer,
do this first", "your new task is"; a to-do aimed at the reader; urgency aimed at
"you"), the other of that or of a request (an imperative sentence, words on the
reader's own reply, a send/forward/transfer to an address, account or site the
user's own words never named). Findings are of type ``indirect_injection``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator

from .asks import foreign_asks
from .finding import Finding
from .orders import ACT_VERBS, KIND, model_tasks

_I = re.IGNORECASE
_MODEL = (
    r"(?:ai|a\.i\.|llm|language\s+model|(?:ai\s+|virtual\s+|email\s+|personal\s+)?assistant|"
    r"chat\s?bot|(?:ai\s+)?agent|bot|model|gpt|chatgpt|claude|gemini|llama|copilot)"
)
_WHO = (
    r"(?:me|the\s+user|your\s+user|the\s+(?:account\s+)?owner|your\s+(?:owner|boss|principal)|"
    r"the\s+(?:system|administrator|admin|developer|operator|security\s+team)|"
    r"(?:system|admin|administrator|developer|operator))"
)

_NOTE = r"(?:message|prompt|instructions?|note|notice|update|command|override)s?"

# each alone is enough
_STRONG: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "data.addresses-model",
        re.compile(
            rf"\b(?:dear|hey|hi|hello|attention|note\s+(?:to|for)|message\s+(?:to|for)|"
            rf"instructions?\s+(?:to|for)|to)\s+(?:the\s+|any\s+|all\s+|my\s+|our\s+)?{_MODEL}s?\b"
            rf"\s*(?:[:,!\u2014]|[.\-](?!\w)|reading|processing|that|who|which)"
            rf"|\b(?:if|when|while)\s+you\s+are\s+(?:an?\s+)?{_MODEL}\b"
            rf"|\b{_MODEL}s?\s+(?:reading|processing|summari[sz]ing|parsing|reviewing)\s+"
            rf"(?:this|these)\b",
            _I,
        ),
    ),
    (
        "data.authority-claim",
        re.compile(
            rf"\b(?:important|urgent|critical|special|new|updated|additional|priority|official|"
            rf"private|personal|direct)\s+(?:message|instructions?|notice|directive|note|"
            rf"request|orders?|task)\s+(?:from|by|of)\s+{_WHO}\b"
            rf"|\b(?:message|instructions?|directive|orders?|request)\s+from\s+"
            rf"(?:the\s+|your\s+)?(?:user|system|administrator|admin|developer|operator|owner)\b"
            rf"|\b(?:the|your)\s+user\s+(?:(?:has|had|have)\s+)?(?:wants|would\s+like|asks|asked|"
            rf"requests|requested|instructed|needs|expects|authori[sz]ed|told|wanted)\s+"
            rf"(?:you\s+to|that\s+you|(?:that\s+)?you\s+(?:must|should|will|need\s+to)|"
            rf"me\s+to\s+(?:tell|ask)\s+you)\b"
            rf"|\bon\s+behalf\s+of\s+(?:the|your)\s+user\b"
            rf"|\bi\s+am\s+(?:the\s+|your\s+)(?:user|owner|developer|administrator|admin)\b"
            rf"|[\[<]\s*(?:system|admin|developer)(?:[\s_-]?{_NOTE})?\s*[\]>]"
            rf"|\(\s*(?:system|admin|developer)[\s_-]?{_NOTE}\s*\)"
            rf"|#{{2,}}\s*(?:[\[(]\s*(?:system|admin|developer)\b|(?:system|admin|developer)"
            rf"[\s_-]*(?:{_NOTE}|mode)\b)"
            rf"|\b(?:system|admin|developer)[\s_-]{_NOTE}\s*[:\])>]"
            rf"|<\s*/?\s*(?:information|instructions?|important|system|admin|inst|"
            rf"additional_instructions)\s*>"
            rf"|\bimportant\s*!{{2,}}|\battention\s*!{{2,}}",
            _I | re.MULTILINE,
        ),
    ),
    (
        "data.keep-from-user",
        re.compile(
            r"\b(?:do\s+not|don'?t|never|without)\s+(?:tell(?:ing)?|inform(?:ing)?|"
            r"mention(?:ing)?|notify(?:ing)?|alert(?:ing)?|ask(?:ing)?|let(?:ting)?|"
            r"show(?:ing)?|reveal(?:ing)?)\s+(?:(?:this|it|that|anything)\s+)?(?:(?:to|with)\s+)?"
            r"(?:the\s+|your\s+)?(?:user|owner|human)"
            r"\b(?!\s+(?:know\s+)?(?:about\s+)?(?:the\s+|this\s+|our\s+)?(?:offer|sale|deal|discount|gift|"
            r"surprise|party))",
            _I,
        ),
    ),
    (
        "data.ignore-rest",
        re.compile(
            r"\b(?:ignore|disregard|skip)\s+(?:the\s+)?(?:rest\s+of\s+)?(?:this|the)\s+"
            r"(?:data|document|text|email|page|file|content|article|input)\b",
            _I,
        ),
    ),
    (
        # a conversation turn written into data: "Assistant: [summary]\nUser: now ..."
        "data.forged-turn",
        re.compile(
            r"(?:^|\n)\s*(?:#+\s*)?(?:assistant|ai|model|system)\s*:[^\n]{0,200}\n+\s*"
            r"(?:#+\s*)?(?:user|human)\s*:"
            r"|(?:^|\n)\s*(?:#+\s*)?(?:system|assistant)\s*:\s*(?:new|updated|override|"
            r"important|you\s+(?:must|should|will|are))",
            _I,
        ),
    ),
    (
        # text a person reading the page does not see
        "data.hidden-text",
        re.compile(
            r"<!--(?:(?!-->).){0,400}?\b(?:assistant|ai|model|agent|llm|please|"
            r"ignore\s+(?:the|all|any|previous|prior|above|your|this)|"
            r"you\s+(?:must|should|need\s+to|have\s+to|will|are\s+to))\b"
            r"(?:(?!-->).){0,400}?-->"
            r"|[\U000e0020-\U000e007f]{4,}"
            r"|style\s*=\s*[\"'][^\"']*(?:display\s*:\s*none|font-size\s*:\s*0|"
            r"color\s*:\s*(?:white|#fff(?:fff)?\b)|opacity\s*:\s*0(?:\.0+)?\s*[;\"'])",
            _I | re.DOTALL,
        ),
    ),
)

_ACT = f"(?:{ACT_VERBS})"

# two different ones are enough
_WEAK: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "data.task-switch",
        re.compile(
            r"\bbefore\s+(?:you\s+)?(?:can\s+|do\s+|start\s+to\s+|go\s+on\s+to\s+)?"
            r"(?:solve|complete|finish|answer|respond|reply|summari[sz]e|carry\s+out|"
            r"work\s+on|get\s+to|do\s+(?:anything|what|the\s+task|as)|start\s+(?:the|your|on)|"
            r"(?:continue|proceed)\s+with\s+(?:the|your|my|this|that))\b"
            r"|\b(?:your\s+(?:new|real|actual|next|first|updated|true|only|main|primary|current)"
            r"|the\s+(?:new|real|actual|updated|true))\s+"
            r"(?:task|goal|instructions?|objective|job|priority|mission|assignment)s?"
            r"\s+(?:is|are|will\s+be|now)\b"
            r"|\b(?:do|complete|perform|carry\s+out|execute)\s+the\s+following\s+"
            r"(?:first|instead|now|task|steps?|actions?|instructions?)\b"
            r"|\binstead\s+of\s+(?:answering|summari[sz]ing|doing|what|the\s+(?:user|original))"
            r"|\b(?:task|instructions?|goal)s?\s+(?:has|have)\s+(?:been\s+)?(?:changed|updated)"
            r"|\b(?:after|once)\s+(?:you\s+(?:have\s+)?(?:done|completed|finished)|that|this)\s*,?"
            r"\s*(?:you\s+)?(?:can|may|should)\s+(?:solve|complete|continue|answer|go\s+back|"
            r"return|proceed)\b"
            r"|(?:^|[.!?\n]\s*)(?!(?:it|this|that|these|those|there|here|the|a|an|we|i|you|they|"
            r"he|she|its|our|my|your|their|his|her|one|which|what|but|and|or|so)\b)"
            r"(?:\w+\s+){1,12}instead\s*[.!]",
            _I,
        ),
    ),
    (
        "data.to-do",
        re.compile(rf"\b(?:TODO|TO-DO|ACTION\s+REQUIRED|TASK)\s*:\s*(?:please\s+)?{_ACT}\b", _I),
    ),
    (
        "data.imperative-opening",
        re.compile(
            rf"(?:^|[.!?]\s+|\n)\W{{0,8}}(?:please\s+|now\s+|first,?\s+|also,?\s+)?"
            rf"{_ACT}\b",
            _I,
        ),
    ),
    (
        # what the reader is to do with its own answer: "in your response, ..."
        "data.shapes-the-reply",
        re.compile(
            r"\b(?:in|to|into|with|within|throughout|for)\s+(?:your|the|all)\s+"
            r"(?:reply|replies|response|responses|answer|answers|output|summary|message)\b"
            r"|\b(?:modify|enhance|augment|format|begin|end|start|change|rewrite|write|"
            r"provide|make)\s+your\s+(?:reply|response|answer|output|summary)\b",
            _I,
        ),
    ),
    (
        "data.urgency",
        re.compile(
            r"(?:^|[.!?\n]\s*)(?:immediately|right\s+away|asap|without\s+delay)\b"
            r"|\b(?:do|act|complete|perform|execute|handle)\s+(?:(?:this|it|so|that)\s+)?"
            r"(?:immediately|right\s+away|right\s+now|asap|without\s+delay)\b"
            r"|\b(?:it\s+is\s+|this\s+is\s+)?(?:very\s+|extremely\s+)?(?:critical|crucial|"
            r"imperative|vital|essential|mandatory)\s+(?:that|to)\s+you\b"
            r"|\byou\s+must\s+(?:now|immediately|absolutely)\b",
            _I,
        ),
    ),
)

_SEND = re.compile(
    r"\b(?:send|sends|forward|e-?mail|mail|transfer|wire|pay|post|upload|share|leak|copy|"
    r"bcc|cc|submit|invite|add|exfiltrate|report)\b[^.!?\n]{0,160}?"
    r"\b(?:to|at|into|onto|on|with)\s+(?:the\s+)?(?:(?:e-?mail\s+)?address\s+|account\s+|"
    r"iban\s+|website\s+|site\s+|url\s+|number\s+|recipient\s+)?['\"`(<]?"
    r"(?P<target>[\w.+-]+@[\w-]+(?:\.[\w-]+)+|(?:https?://|www\.)[^\s'\"`)>]+|"
    r"[\w-]+(?:\.[\w-]+)*\.(?:com|net|org|io|co|info|biz|xyz|ru|cn)(?:/[^\s'\"`)>]*)?|"
    r"[A-Z]{2}\d{2}[A-Z0-9]{10,30}|\+?\d[\d ()-]{7,}\d)",
    _I,
)


def _exfiltration(text: str, user_text: str) -> Iterator[Finding]:
    """A send to a target the user's own words never named."""
    told = user_text.lower()
    for m in _SEND.finditer(text):
        target = m.group("target").rstrip(".,;:").lower()
        bare = target.removeprefix("https://").removeprefix("http://").removeprefix("www.")
        if bare and bare not in told:
            yield Finding("data.send-elsewhere", KIND, m.start(), m.end())
            return


_IGNORE = re.compile(
    r"\b(?:ignore|disregard|forget|skip|override|abandon|drop)\s+(?:(?:all|any|the|your|of|my|"
    r"these|those|every|other|previous|prior|above|earlier|preceding|original|initial|current|"
    r"old|former|existing|user'?s?)\s+){1,4}(?P<what>[a-z]{4,16})\b",
    _I,
)
_ORDERS = (
    "instructions",
    "instruction",
    "directives",
    "guidelines",
    "commands",
    "prompts",
    "rules",
)


def _ignore_orders(text: str) -> Iterator[Finding]:
    """ "Ignore your previous instructions", misspelt too ("iunstructions")."""
    for m in _IGNORE.finditer(text):
        what = m.group("what").lower()
        if any(difflib.SequenceMatcher(None, what, w).ratio() >= 0.85 for w in _ORDERS):
            yield Finding("data.ignore-instructions", KIND, m.start(), m.end())
            return


_ASKS = frozenset({"data.imperative-opening", "data.shapes-the-reply", "data.send-elsewhere"})
"""Signs of a request to the reader, which documents make to people too ("please send
the form to hr@..."): they count only beside a sign of a task taken over."""


def data_findings(text: str, user_text: str = "") -> list[Finding]:
    """The findings in one piece of data (``user_text``: the user's own words in the
    request, whose addresses and accounts are not elsewhere)."""
    found = [
        Finding(rule, KIND, m.start(), m.end())
        for rule, pattern in _STRONG
        if (m := pattern.search(text))
    ]
    found += _ignore_orders(text)
    found += model_tasks(text)
    found += foreign_asks(text)
    weak = [
        Finding(rule, KIND, m.start(), m.end())
        for rule, pattern in _WEAK
        if rule not in _ASKS and (m := pattern.search(text))
    ]
    if found or weak:  # the requests count only beside one of these: else not read
        weak += [
            Finding(rule, KIND, m.start(), m.end())
            for rule, pattern in _WEAK
            if rule in _ASKS and (m := pattern.search(text))
        ]
        weak += _exfiltration(text, user_text)
    takeover = sum(f.rule not in _ASKS for f in weak)
    if found or takeover >= 2 or (takeover and len(weak) > takeover):
        found += weak
    return sorted(found, key=lambda f: (f.start, f.rule))
