"""Where kept spans go: the exporter the standard OpenTelemetry variables name."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from inferbus.shared import logs

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logs.get("inferbus.tracing")


def enabled_by_env(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter and exporter not in ("otlp", "console"):
        if exporter != "none":
            log.warning(
                "OTEL_TRACES_EXPORTER names an exporter inferbus does not ship; "
                "tracing stays off (otlp and console are supported)",
                exporter=exporter,
            )
        return False
    return bool(
        exporter
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def exporter_from_env() -> SpanExporter:
    """The exporter the standard variables name: OTLP (http/protobuf, or gRPC where
    its package is installed and OTEL_EXPORTER_OTLP_PROTOCOL says grpc) or console."""
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            return GrpcExporter()
        except ImportError:
            log.warning(
                "OTLP over gRPC needs opentelemetry-exporter-otlp-proto-grpc; "
                "exporting over HTTP instead"
            )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_* itself
