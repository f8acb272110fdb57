"""Public corpora for the input checks (bench/corpora/, README there), each split in
two by a hash of the text: ``dev``, which rules may be tuned on, and ``final``, read
only for the figures a change reports. A text stays in its split whatever is added."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Literal, TypedDict

Split = Literal["dev", "final", "all"]

CORPORA = Path(__file__).resolve().parents[2] / "bench" / "corpora"


class Line(TypedDict):
    text: str
    kind: str
    """``sqli``, ``xss``, ``prompt`` or ``benign``."""
    label: int
    """1: an attack, 0: benign."""


def split_of(text: str) -> Literal["dev", "final"]:
    return "dev" if hashlib.sha256(text.encode()).digest()[0] % 2 == 0 else "final"


def _take(lines: list[Line], split: Split) -> list[Line]:
    return [x for x in lines if split == "all" or split_of(x["text"]) == split]


def crs_attacks(split: Split) -> list[Line]:
    """OWASP CRS's regression payloads for its SQLi and XSS rules (all attacks)."""
    with open(CORPORA / "crs_attacks.jsonl", encoding="utf-8") as f:
        rows = [json.loads(x) for x in f if x.strip()]
    return _take([Line(text=r["text"], kind=r["kind"], label=1) for r in rows], split)


def chatgpt_prompts(split: Split) -> list[Line]:
    """awesome-chatgpt-prompts: ordinary prompts (role-play, "act as a SQL terminal"),
    its few jailbreaks labelled as attacks."""
    with gzip.open(CORPORA / "awesome_chatgpt_prompts.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(x) for x in f if x.strip()]
    return _take(
        [
            Line(text=r["text"], kind="prompt" if r["label"] else "benign", label=r["label"])
            for r in rows
        ],
        split,
    )


def short_inputs(split: Split) -> list[Line]:
    """Short benign inputs, most with no prose in them: SQL queries and the questions
    they answer (Spider's dev set), and shell commands (tldr-pages)."""
    with gzip.open(CORPORA / "short_inputs.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(x) for x in f if x.strip()]
    return _take([Line(text=r["text"], kind="benign", label=0) for r in rows], split)


def payloads_all_the_things(split: Split) -> list[Line]:
    """PayloadsAllTheThings' SQLi and XSS intruder lists (all attacks): a second
    source of payloads, by other authors than CRS's."""
    with gzip.open(CORPORA / "payloads_all_the_things.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(x) for x in f if x.strip()]
    return _take([Line(text=r["text"], kind=r["kind"], label=1) for r in rows], split)


def owasp_xss_evasion(split: Split) -> list[Line]:
    """The vectors of OWASP's XSS Filter Evasion Cheat Sheet (all attacks), one per code
    block: added on 2026-12-01 after the XSS rules of that day, its final half unread."""
    with open(CORPORA / "owasp_xss_evasion.jsonl", encoding="utf-8") as f:
        rows = [json.loads(x) for x in f if x.strip()]
    return _take([Line(text=r["text"], kind=r["kind"], label=1) for r in rows], split)


def seclists_xss(split: Split) -> list[Line]:
    """SecLists' XSS lists (all attacks): a fourth source, by still other authors, less
    the lines the other corpora hold. Added on 2026-12-03 after that day's XSS rules."""
    with gzip.open(CORPORA / "seclists_xss.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(x) for x in f if x.strip()]
    return _take([Line(text=r["text"], kind=r["kind"], label=1) for r in rows], split)


def crs_unseen(split: Split) -> list[Line]:
    """CRS's regression payloads that ``crs_attacks`` lacks: its tests as they are now
    and in every earlier version of each file (git history), the same extraction.
    Added on 2026-12-03, unread: a held-out set for the CRS goal, whose own final
    split is spent."""
    with open(CORPORA / "crs_unseen.jsonl", encoding="utf-8") as f:
        rows = [json.loads(x) for x in f if x.strip()]
    return _take([Line(text=r["text"], kind=r["kind"], label=1) for r in rows], split)
