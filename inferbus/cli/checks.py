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
    for n, raw in enumerate(stream.buffer if hasattr(stream, "buffer") else stream, start=1):
        line = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
        if not line.strip():
            yield ""
            continue
        try:
            obj = json.loads(line)
            text = obj["text"]
            if not isinstance(text, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise click.ClickException(f'line {n}: want a JSON object {{"text": "..."}}') from None
        yield text


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
    """Input checks: SQL injection, XSS and prompt injection."""


@sanitize.command("check")
@click.option(
    "--policy",
    type=click.Choice(["block", "flag"]),
    default="block",
    show_default=True,
    help="What a finding means (the platform's default: block).",
)
def sanitize_check(policy: Literal["block", "flag"]) -> None:  # click.Choice checked it
    """Read {"text": ...} JSON lines on stdin; write {"decision": block|flag|pass,
    "findings": [{"rule", "type", "start", "end"}]} for each."""
    from inferbus.services.sanitizer.injection import decide, findings

    for text in _json_lines(sys.stdin):
        found = findings(text)
        _write_json(
            {
                "decision": decide(found, policy),
                "findings": [
                    {"rule": f.rule, "type": f.type, "start": f.start, "end": f.end} for f in found
                ],
            }
        )
