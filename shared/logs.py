"""structlog JSON to stderr, with request ids bound through contextvars.

The standard library's loggers (nats-py, aiohttp, vLLM) go through the same renderer.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

_SECRET = re.compile(
    r"(?i)(bearer\s+|(?:authorization|x-api-key|api[-_]key)[\"']?\s*[:=]\s*[\"']?"
    r"(?:bearer\s+)?)[A-Za-z0-9._~+/=-]{6,}"
)


def redact(text: str) -> str:
    """``text`` with bearer tokens and API-key values written ``[redacted]``."""
    return _SECRET.sub(r"\1[redacted]", text)


def _redact_secrets(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """No line says a credential: every string field is redacted."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = redact(value)
    return event


class _NoRawRequests(logging.Filter):
    """aiohttp logs a request it cannot parse with the raw bytes in the exception (its
    headers, an API key among them, and its body); keep the kind and the status."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        # by module, not by class: logging stays free of the HTTP library
        if exc is not None and type(exc).__module__ == "aiohttp.http_exceptions":
            code = getattr(exc, "code", "")
            record.msg = f"{record.getMessage()}: {type(exc).__name__} ({code})"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


_SHARED: list[Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def configure(service: str, level: str = "info", instance_id: str = "") -> None:
    lvl = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    structlog.configure(
        processors=[
            *_SHARED,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            _redact_secrets,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(stdlib_formatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(lvl)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _NoRawRequests) for f in server.filters):
        server.addFilter(_NoRawRequests())
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service, instance=instance_id)


def stdlib_formatter(**fields: str) -> logging.Formatter:
    """The JSON formatter for standard-library records (nats-py, aiohttp, vLLM); ``fields``
    are added to each line (a process with no bound context: vLLM's engine core)."""

    def add_fields(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
        for k, v in fields.items():
            event.setdefault(k, v)
        return event

    return structlog.stdlib.ProcessorFormatter(
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.JSONRenderer(),
        ],
        foreign_pre_chain=[*_SHARED, add_fields, _redact_secrets],
    )


def vllm_logging_config(service: str, instance: str, level: str = "INFO") -> dict[str, Any]:
    """A logging dictConfig for vLLM (``VLLM_LOGGING_CONFIG_PATH``): its loggers write
    our JSON lines, in the worker and in the engine-core process vLLM spawns."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "inferbus": {
                "()": "inferbus.shared.logs.stdlib_formatter",
                "service": service,
                "instance": instance,
            }
        },
        "handlers": {
            "inferbus": {
                "class": "logging.StreamHandler",
                "formatter": "inferbus",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {"vllm": {"handlers": ["inferbus"], "level": level.upper(), "propagate": False}},
    }


def get(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger


def bind(**values: object) -> None:
    """Add fields to every later log line of this process (or task context)."""
    structlog.contextvars.bind_contextvars(**values)
