"""``inferbus pii`` and ``inferbus sanitize``: the sanitizer's checks on JSON lines, offline."""

from __future__ import annotations

import json
import sys
from typing import Any, Literal

import click


def _json_lines(stream: Any) -> Any:
    """``{"text": ...}`` objects, one a line, read as UTF-8 whatever the locale (so
    offsets count characters); a blank line is an empty text, so output line N always
    answers input line N; a bad line stops with its number."""
    for text, _ in _json_objects(stream):
        yield text


def _json_objects(stream: Any) -> Any:
    """(text, the line's object) for ``_json_lines``'s lines."""
    for n, raw in enumerate(stream.buffer if hasattr(stream, "buffer") else stream, start=1):
        line = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
        if not line.strip():
            yield "", {}
            continue
        try:
            obj = json.loads(line)
            text = obj["text"]
            if not isinstance(text, str) or not isinstance(obj.get("user", ""), str):
                raise TypeError
        except (ValueError, KeyError, TypeError, AttributeError):
            raise click.ClickException(f'line {n}: want a JSON object {{"text": "..."}}') from None
        yield text, obj


def _write_json(obj: Any) -> None:
    """One JSON line on stdout as UTF-8 (escaped where a lone surrogate cannot be)."""
    try:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        data = json.dumps(obj).encode()
    out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else None
    if out is None:
        sys.stdout.write(data.decode() + "\n")
    else:
        out.write(data + b"\n")
        out.flush()


@click.group()
def pii() -> None:
    """PII detection and masking."""


@pii.command("scan")
def pii_scan() -> None:
    """Read {"text": ...} JSON lines on stdin; write {"masked", "entities": [{"type",
    "start", "end"}]} for each (character offsets into the input text). Works on log
    files converted to JSON lines as well:

        jq -Rc '{text: .}' app.log | inferbus pii scan
    """
    from inferbus.services.sanitizer.pii import mask

    for text in _json_lines(sys.stdin):
        masked, entities = mask(text)
        _write_json(
            {
                "masked": masked,
                "entities": [{"type": e.type, "start": e.start, "end": e.end} for e in entities],
            }
        )


@click.group()
def sanitize() -> None:
    """Input checks: SQL injection, XSS and prompt injection; in tool results, prompt
    injection and instructions aimed at the model."""


@sanitize.command("check")
@click.option(
    "--policy",
    type=click.Choice(["block", "flag"]),
    default="block",
    show_default=True,
    help="What a finding means (the platform's default: block).",
)
@click.option(
    "--role",
    type=click.Choice(["user", "tool"]),
    default="user",
    show_default=True,
    help="Whose text: the user's own words, or data an agent's tool returned (checked "
    'for instructions aimed at the model; a line\'s optional "user" field holds the '
    "user's words, whose addresses and accounts a send may name).",
)
def sanitize_check(  # click.Choice checked them
    policy: Literal["block", "flag"], role: Literal["user", "tool"]
) -> None:
    """Read {"text": ...} JSON lines on stdin; write {"decision": block|flag|pass,
    "findings": [{"rule", "type", "start", "end"}]} for each."""
    from inferbus.services.sanitizer.core import data_check
    from inferbus.services.sanitizer.injection import decide, findings

    for text, obj in _json_objects(sys.stdin):
        found = data_check(text, obj.get("user", "")) if role == "tool" else findings(text)
        _write_json(
            {
                "decision": decide(found, policy),
                "findings": [
                    {"rule": f.rule, "type": f.type, "start": f.start, "end": f.end} for f in found
                ],
            }
        )
