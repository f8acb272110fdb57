"""Questions and errands foreign to their data: a sentence in a tool result that asks
for general knowledge or a piece of writing ("What are the main exports of Chile?",
"Describe the life cycle of a frog.", "Draft a speech on ..."), names no one (no I,
we, you, this, the following: a person writing to a person does), and shares no
content word with the rest of the data. Such a sentence is an assistant's task set
down in a document that is about something else; a document's own questions are
about what the document is about (a README's "How does the cache work?" shares
"cache" with the page). Headings, bullets, quoted replies and code comments are
not read: pages ask questions in them. What it cannot tell: a trivia question that a
document quotes as its own content (an email announcing a quiz, with one of its
questions) is flagged as an injected one would be."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

from .finding import Finding
from .orders import KIND

_I = re.IGNORECASE

# what a request for knowledge or writing opens with
_ASK = re.compile(
    # maybe after a short label, as a to-do is written: "TODO:", "Action item -"
    r"^\W{0,4}(?:[A-Za-z][\w.]*(?:\s+[\w.]+){0,2}\s*(?::|\s-|\u2014)\s*)?(?:"
    r"(?:what|how|why|who|which|when|where)\b.*\?\W{0,2}$"
    r"|(?:can|could|would|will)\s+you\s+(?:please\s+)?(?:show|explain|tell|give|provide|"
    r"write|describe|list|recommend|suggest|outline)\b"
    r"|(?:please\s+)?(?:explain|describe|define|summari[sz]e|outline|compare|list|discuss|"
    r"draft|compose|write|develop|create|provide|give|translate|show|recommend|suggest|"
    r"name|identify|analy[sz]e|evaluate|predict|generate)\s+(?:me\s+)?"
    r"(?:a|an|the|how|why|what|which|some|three|five|ten|\d+)\b"
    r")",
    _I,
)
# a person writing to a person, or about the document itself
_NAMES_SOMEONE = re.compile(
    r"\b(?:i|i'm|i've|i'd|we|we're|we've|us|our|ours|my|mine|me|you'll|you're|you've|your|"
    r"yours|this|these|here|above|below|attached|following|enclosed|herein|"
    # a time of the writer's: "how was the offsite last week?"
    r"today|tonight|tomorrow|yesterday|last|next|recently|lately|soon|later)\b",
    _I,
)
# the asker's own words, which name no one in particular: "can you show me", "tell me",
# "how do I" (anyone's question)
_ADDRESSED = re.compile(
    r"^\W{0,4}(?:can|could|would|will)\s+you\s+(?:please\s+)?\w+\s+(?:me\s+)?"
    r"|^\W{0,4}(?:please\s+)?\w+\s+me\s+"
    r"|^\W{0,4}how\s+(?:do|can|should|would)\s+i\s+",
    _I,
)
# headings (markdown's, or a line in bold or italics), bullets, quoted replies, comments
_NOT_READ = re.compile(r"^\s*(?:#|//|>|[-*\u2022+]\s|\d+[.)]\s|\||[*_]{1,2}\S)")
_SENTENCE = re.compile(r"\S.*?(?:[.!?](?=\s|$)|$)")
_WORD = re.compile(r"[a-z][a-z']*")
_STOP = frozenset(
    """a an the and or but if then so of to in on at by for with from as is are was were
    be been being am do does did done have has had having i you he she it we they me him
    her us them my your his its our their this that these those there here what which who
    whom whose when where why how not no nor can could will would shall should may might
    must also just only very more most some any all each every other such than too own
    same please now into out up down over under about after before again further once
    both few like get got make made use used one two three five ten new show give tell
    explain describe define list write provide create draft compose develop outline
    compare discuss summarize summarise translate recommend suggest name identify analyze
    analyse evaluate predict generate difference differences between work works example
    examples way ways best main primary key important simple short brief""".split()
)


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def _content(text: str) -> list[str]:
    return [
        _stem(w.strip("'"))
        for w in _WORD.findall(text.lower())
        if len(w) > 2 and w.strip("'") not in _STOP
    ]


def foreign_asks(text: str) -> Iterator[Finding]:
    """A request for knowledge or writing that names no one and shares no content word
    with the rest of ``text``."""
    everywhere: Counter[str] | None = None
    offset = 0
    for line in text.split("\n"):
        if not _NOT_READ.match(line):
            for m in _SENTENCE.finditer(line):
                sentence = m.group()
                if len(sentence.split()) < 4 or not _ASK.search(sentence):
                    continue
                if _NAMES_SOMEONE.search(_ADDRESSED.sub("", sentence)):
                    continue
                words = Counter(_content(sentence))
                if len(words) < 2:
                    continue
                if everywhere is None:  # counted once, for the first candidate
                    everywhere = Counter(_content(text))
                if all(everywhere[w] == n for w, n in words.items()):
                    start = offset + m.start()
                    yield Finding("data.foreign-ask", KIND, start, start + len(sentence))
                    return
        offset += len(line) + 1
