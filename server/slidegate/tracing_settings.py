"""The TRACING_* settings: whether OpenTelemetry spans are exported, naming what service, over what protocol, for
what share of traces (slidegate.tracing reads them; this module needs no OpenTelemetry)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from slidegate.setting_parsers import enum_choice, parse_bool, parse_sampling_rate
from slidegate.setting_spec import setting


class ExporterProtocol(enum.StrEnum):
    """TRACING_EXPORTER_PROTOCOL: how OTLP is sent."""

    HTTP = "http"  # protobuf over HTTP
    GRPC = "grpc"


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """A section under TRACING_."""

    enabled: bool = setting(
        "ENABLED", "false", parse_bool,
        "export OpenTelemetry spans (a span per ShouldRateLimit call, a child per storage call) over OTLP to "
        "OTEL_EXPORTER_OTLP_ENDPOINT; needs the tracing extra (pip install -e '.[tracing]' in a checkout)")
    service_name: str = setting("SERVICE_NAME", "RateLimit", str, "the spans' service.name")
    service_namespace: str = setting("SERVICE_NAMESPACE", "", str, "the spans' service.namespace")
    service_instance_id: str = setting("SERVICE_INSTANCE_ID", "", str,
                                       "the spans' service.instance.id; empty: a random UUID for each process")
    exporter_protocol: ExporterProtocol = setting(  # noqa: RUF009 - setting() is a dataclasses.field
        "EXPORTER_PROTOCOL", "http", enum_choice(ExporterProtocol), "OTLP over http (protobuf) or grpc")
    sampling_rate: float = setting(
        "SAMPLING_RATE", "1", parse_sampling_rate,
        "the share of traces started here that are sampled, 0 to 1; a caller's traceparent decides for its own")
