"""JSON Schema of every event, for clients in other languages."""

from __future__ import annotations

from typing import Any

import msgspec

from . import subjects
from .events import ALL_EVENTS


def document() -> dict[str, Any]:
    (refs, components) = msgspec.json.schema_components(ALL_EVENTS, ref_template="#/$defs/{name}")
    events = {ev.__struct_config__.tag: ref for ev, ref in zip(ALL_EVENTS, refs, strict=True)}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "inferbus events",
        "description": "Events are JSON objects; the 'type' field names the event.",
        "events": events,
        "subjects": {
            "submit": subjects.SUBMIT,
            "accepted": subjects.ACCEPTED,
            "ended": subjects.ENDED,
            "cancel": subjects.CANCEL,
            "started": subjects.STARTED,
            "progress": subjects.progress_subject("<worker_id>"),
            "heartbeats": subjects.HEARTBEATS,
            "work": subjects.work_subject("<worker_id>"),
            "dead_letters": subjects.dead_letter_subject("<service>"),
        },
        "headers": {
            "submit": {subjects.HEADER_MSG_ID: "the request id (idempotent submission)"},
            "trace": subjects.HEADER_TRACEPARENT,
        },
        "$defs": components,
    }
