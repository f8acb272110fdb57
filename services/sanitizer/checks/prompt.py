"""Prompt injection: instructions to ignore the instructions, "system override"
notices, chat-template role tags smuggled into user text, jailbreak personas,
requests for the system prompt.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from .finding import Finding, first_matches

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
        # the best-known jailbreak by name: "DAN, which stands for do anything now"
        "prompt.known-jailbreak",
        re.compile(
            r"\bdo\s+anything\s+now\b|\b(?:known|referred\s+to)\s+as\s+DAN\b"
            r"|\bDAN\s+mode\b|\b(?:stay|staying)\s+in\s+character\s+as\s+DAN\b",
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


# what each rule's every match holds (lower-cased)
_NEEDLES: dict[str, tuple[str, ...]] = {
    "prompt.ignore-instructions": ("ignore", "disregard", "forget", "override", "bypass"),
    "prompt.ignore-instructions-zh": ("忽略", "无视", "忘记", "忘掉", "不要理会", "绕过"),
    "prompt.role-tag": ("<|", "inst]", "<<sys>>", "<</sys>>"),
    "prompt.jailbreak-persona": ("now", "act", "pretend", "enable", "enter", "activate"),
    "prompt.known-jailbreak": ("anything", "dan"),
    "prompt.disable-safety": ("safety", "content", "moderation"),
    "prompt.exfiltrate-system": ("prompt", "instruction", "developer"),
    "prompt.system-override": ("override",),
    "prompt.instructions-void": (
        "void",
        "null",
        "cancel",
        "revoked",
        "obsolete",
        "overridden",
        "superseded",
        "longer",
    ),
    "prompt.restrictions-lifted": (
        "lifted",
        "removed",
        "disabled",
        "off",
        "suspended",
        "deactivated",
    ),
}


def prompt_findings(text: str) -> Iterator[Finding]:
    yield from first_matches(text, (*_PI_OVERRIDE, *_PI_RULES), "prompt_injection", _NEEDLES)
