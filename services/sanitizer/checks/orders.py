"""Orders only an assistant is given, found in data: a sentence that opens as an order
(a verb, maybe after "please" or a label such as "TODO:") and asks the reader to shape or
garble its own answer, to hand over or destroy what an agent holds for its user (the
inbox, passwords, "the user's" things), or to do an assistant's stock task ("explain
... in simple terms", "write a poem") or answer a quiz question. People ask each other
for things in emails and pages too, so the verb alone is never enough."""

from __future__ import annotations

import re
from collections.abc import Iterator

from .finding import Finding

KIND = "indirect_injection"
_I = re.IGNORECASE

# the verbs an instruction to an agent opens with
ACT_VERBS = (
    r"send|forward|e-?mail|mail|transfer|wire|pay|post|upload|share|leak|copy|bcc|cc|"
    r"submit|invite|add|delete|remove|create|schedule|book|change|reset|update|grant|"
    r"give|write|reply|respond|tell|say|include|insert|append|visit|click|open|download|"
    r"install|run|execute|call|text|message|purchase|buy|order|cancel|approve|sign|"
    r"publish|print|output|repeat|answer|translate|summari[sz]e|recommend|list|provide|"
    r"concatenate|read|fetch|retrieve|find|search|move|rename|disable|enable|unsubscribe"
)

# an order opening a sentence: the verbs a goal given to an assistant starts with
_OPENING = (
    r"(?:^|(?<=[.!?])\s+|\n)[\s\W]{0,8}"
    # a label before it: "TODO:", "Note -", "Action item:"
    r"(?:[A-Za-z][\w.]*(?:\s+[\w.]+){0,2}\s*(?::|\s-|\u2014)\s*)?"
)
_ORDER = re.compile(
    rf"{_OPENING}(?:(?:please|now|also|and|then|just|kindly)\s*,?\s+)*"
    rf"(?P<verb>{ACT_VERBS}|enhance|modify|integrate|incorporate|combine|introduce|misspell|"
    r"rearrange|render|replace|use|make|explain|describe|compose|break\s+down|outline|"
    r"generate|draft|rewrite|convert|encode|spell|express|mention|suggest|promote|advertise|"
    r"claim|state|insist|emphasi[sz]e|highlight|praise|warn|urge|encourage|inform|notify|"
    r"remind|convince|persuade|embed|inject|erase|wipe|revoke|export|transcribe|"
    r"paraphrase|format|reverse|capitali[sz]e|alternate|swap|shuffle|scramble|augment|"
    r"substitute|jumble|anagram|group)\b"
    r"(?P<rest>(?:[^.!?\n]|[.!?](?=[^\s\"'\u201d])|[.!?][\"'\u201d](?=\s+[a-z])){0,400})",
    _I,
)
# what in such a sentence only an assistant is asked: to shape or garble its own answer
_SHAPES_ANSWER = re.compile(
    r"\byour\s+(?:answers?|responses?|outputs?|summary|summaries|completions?)\b"
    r"|^\s+(?:this|the)\s+(?:document|e-?mail|page|text|file|review|message|article)\s+as\b"
    r"|\bregardless\s+of\s+(?:its|the|their)\s+(?:actual\s+)?contents?\b"
    r"|\b(?:anagram\w*|homophon\w*|(?:alphanumeric|letter|character|symbol)\s+substitut\w*|"
    r"typos|misspell\w*|leetspeak|pig\s+latin|backwards|without\s+(?:any\s+)?spaces|"
    r"spaces\s+from|every\s+(?:\w+\s+)?(?:letter|word|character|vowel))\b"
    # the letters of the reader's own reply garbled, or swapped for symbols
    r"|\b(?:letters|vowels|consonants|characters|words)\b[^.!?\n]{0,40}\byour\s+"
    r"(?:reply|replies|message)\b"
    r"|\b(?:letters|vowels|consonants|characters)\s+with\s+(?:the\s+following\s+)?"
    r"(?:symbols|numbers|digits|emojis?)\b",
    _I,
)
# "reply" is a person's too: "please include your order number in your reply"
_REPLY_SHAPED = re.compile(
    r"^(?:enhance|modify|integrate|incorporate|add|render|rearrange|rewrite|combine|augment|"
    r"format|embed|inject|append|insert|use|end|begin|start)$",
    _I,
)
_YOUR_REPLY = re.compile(r"\byour\s+(?:reply|replies|message)\b", _I)
# or to hand over or destroy what an agent holds for its user
_AGENT_HELD = re.compile(
    r"\bthe\s+user'?s\b"
    r"|\b(?:in|from)\s+(?:the|my|your|this)\s+(?:inbox|mailbox|drive|calendar|contacts)\b"
    r"|\b(?:passwords?|passcodes?|credentials|api[\s_-]?keys?|security\s+codes?|"
    r"verification\s+codes?|one-time\s+codes?|2fa\s+codes?|saved\s+card|private\s+(?:channel|"
    r"messages?|files?|keys?))\b"
    r"|\ball\s+(?:of\s+)?(?:the\s+|my\s+|your\s+)?(?:e-?mails|messages|files|contacts|"
    r"documents|appointments|events|meetings|records|conversations)\b",
    _I,
)
_HAND_OVER = re.compile(
    r"\b(?:send|forward|e-?mail|mail|share|post|upload|leak|reveal|disclose|paste|copy|"
    r"transfer|delete|erase|wipe|cancel|reply|pay|book|purchase)\b",
    _I,
)
_TOLD_TO_THE_USER = re.compile(r"^(?:tell|convince|persuade)$", _I)
_THE_USER = re.compile(r"^\s+(?:the|your)\s+user\b", _I)


# a sentence about the reader's answer, an assistant's stock task, a quiz question
_MODEL_SENTENCE = re.compile(
    rf"{_OPENING}(?P<task>"
    r"(?:in|within|throughout|for)\s+(?:your|the|all)\s+(?:responses?|answers?|outputs?|"
    r"summary|summaries)\s*,"
    r"|(?:please\s+)?(?:explain|describe|compose|write|outline|break\s+down|summari[sz]e|"
    r"elaborate\s+on|tell\s+me\s+about)\s+(?:[^.!?\n]{0,80}?\b(?:in\s+simple\s+terms|"
    r"in\s+layman'?s\s+terms|step[\s-]by[\s-]step|to\s+a\s+(?:child|beginner|five-year-old))"
    r"|(?:the|a|an)\s+(?:process|plot|history|concept|meaning|origins?|theory|principles?|"
    r"causes|benefits|importance|significance)\s+of"
    r"|(?:a|an)\s+(?:\w+\s+)?(?:poem|story|essay|haiku|limerick|song|sonnet|joke|speech|"
    r"tweet|blog\s+post|riddle|rap|letter\s+to\s+an?|short\s+story))\b"
    r"|(?:what(?:'s|\s+is|\s+does)|how\s+do\s+(?:you|i)\s+say)\s+[\"'\u2018\u201c][^\"'\u2019\u201d\n]"
    r"{1,60}[\"'\u2019\u201d]\s+(?:mean\s+)?in\s+[A-Z][a-z]+\s*\?"
    r"|who\s+(?:wrote|painted|composed|invented|discovered|directed|sculpted)\s+(?:the\s+"
    r"(?:\w+\s+)?)?[\"'\u2018\u201c]"
    r"|what\s+is\s+the\s+capital\s+(?:city\s+)?of\s+[A-Z]"
    r")",
    _I,
)


def model_tasks(text: str) -> Iterator[Finding]:
    """A sentence that opens as an order and asks what only an assistant is asked."""
    for m in _ORDER.finditer(text):
        verb, rest = m.group("verb"), m.group("rest")
        if (
            _SHAPES_ANSWER.search(rest)
            or (_REPLY_SHAPED.match(verb) and _YOUR_REPLY.search(rest))
            or (_AGENT_HELD.search(rest) and _HAND_OVER.search(m.group()))
            or (_TOLD_TO_THE_USER.match(verb) and _THE_USER.match(rest))
        ):
            yield Finding("data.model-task", KIND, m.start("verb"), m.end())
            return
    if sentence := _MODEL_SENTENCE.search(text):
        yield Finding("data.model-task", KIND, sentence.start("task"), sentence.end())
