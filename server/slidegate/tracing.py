"""OpenTelemetry tracing (TRACING_ENABLED), as envoyproxy/ratelimit's: a server span for each ShouldRateLimit
call, continuing the caller's trace context (the ``traceparent`` gRPC metadata Envoy sends when it traces), and
a child span for each call to the storage. Spans go over OTLP (TRACING_EXPORTER_PROTOCOL: http or grpc) to
where the OpenTelemetry SDK's own variables say (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS …).

The SDK is an optional extra (``slidegate[tracing]``) and is imported at the top here: this module is loaded
only when tracing is on (slidegate.server loads it by name), so that a process without tracing neither needs
the SDK nor pays for it. Nothing here is on the path of a call when tracing is off: the traced handler and the
traced backend are put in place of the plain ones at start, only then.

Spans carry the request's shape (domain, number of descriptors) and the answer, never a descriptor's values:
those are the clients' data (addresses, headers, paths).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import grpc
from opentelemetry import propagate
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Tracer, get_current_span

from slidegate._proto.envoy.service.ratelimit.v3 import rls_pb2
from slidegate.backends.base import Backend, Check, Decision
from slidegate.decider import Prepared
from slidegate.service import METHOD, Context, RateLimitService
from slidegate.settings import Settings
from slidegate.tracing_settings import ExporterProtocol

# the RPC semantic conventions' span name: package.Service/Method
SERVER_SPAN = METHOD.removeprefix("/")
STORAGE_SPAN = "ratelimit storage"
_SERVICE, _, _METHOD = SERVER_SPAN.partition("/")


class Tracing:
    """The tracer provider ``settings`` describe, and what puts its spans in place: ``handler`` (the traced
    ShouldRateLimit), ``backend`` (the traced storage). ``shutdown`` sends the spans still held."""

    def __init__(self, settings: Settings) -> None:
        # as the reference: without an instance id each process gets its own, so that replicas stay apart
        self.instance_id = settings.tracing.service_instance_id or str(uuid.uuid4())
        resource = Resource.create({
            "service.name": settings.tracing.service_name,
            "service.namespace": settings.tracing.service_namespace,
            "service.instance.id": self.instance_id,
        })
        # a caller's sampling decision (traceparent's flag) is kept, or its trace would have holes; the rate
        # decides for traces that start here
        sampler = ParentBased(TraceIdRatioBased(settings.tracing.sampling_rate))
        self.provider = TracerProvider(resource=resource, sampler=sampler)
        exporter: SpanExporter = (GrpcSpanExporter() if settings.tracing.exporter_protocol is ExporterProtocol.GRPC
                                  else HttpSpanExporter())
        # spans are sent from a thread of the SDK's, in batches: a call never waits for the collector
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer: Tracer = self.provider.get_tracer("slidegate")
        self.protocol = settings.tracing.exporter_protocol

    def describe(self) -> str:
        return f"OTLP over {self.protocol}, service.instance.id {self.instance_id}"

    def handler(self, service: RateLimitService) -> grpc.GenericRpcHandler[Any, Any]:
        """``service``'s gRPC handler, each call in a server span (see the module docstring)."""
        tracer = self.tracer
        service.on_answer = _answered

        async def should_rate_limit(request: bytes, context: Context) -> rls_pb2.RateLimitResponse:
            # gRPC metadata keys arrive in lower case, as the W3C propagator looks them up; binary ones are skipped
            carrier = {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}
            with tracer.start_as_current_span(
                SERVER_SPAN, context=propagate.extract(carrier), kind=SpanKind.SERVER,
                attributes={"rpc.system": "grpc", "rpc.service": _SERVICE, "rpc.method": _METHOD},
            ):
                return await service.should_rate_limit(request, context)

        return service.handler(should_rate_limit)

    def backend(self, backend: Backend, kind: str) -> Backend:
        """``backend`` with a client span around each of its decisions; ``kind`` names it in the spans."""
        return TracedBackend(backend, self.tracer, kind)

    def shutdown(self) -> None:
        """Send the spans still held (blocks up to the exporter's timeout when the collector is away)."""
        self.provider.shutdown()


def _answered(prepared: Prepared, response: rls_pb2.RateLimitResponse) -> None:
    # runs within the call's server span (slidegate.service calls it as it answers)
    get_current_span().set_attributes({
        "ratelimit.domain": prepared.plan.domain,
        "ratelimit.descriptors": len(prepared.descriptors),
        "ratelimit.overall_code": rls_pb2.RateLimitResponse.Code.Name(response.overall_code),
    })


class TracedBackend:
    """A Backend whose decisions are each a span: the backend (``kind``), the number of limits, whether the
    request was admitted. Failures are recorded on the span by the SDK (an exception ends it with an error)."""

    def __init__(self, inner: Backend, tracer: Tracer, kind: str) -> None:
        self._inner = inner
        self._tracer = tracer
        self._kind = kind

    async def decide(
        self, checks: Sequence[Check], now_us: int | None = None, timeout: float | None = None
    ) -> Decision:
        with self._tracer.start_as_current_span(STORAGE_SPAN, kind=SpanKind.CLIENT, attributes={
            "ratelimit.storage.backend": self._kind, "ratelimit.storage.limits": len(checks),
        }) as span:
            decision = await self._inner.decide(checks, now_us, timeout)
            span.set_attribute("ratelimit.storage.admitted", decision.admitted)
            return decision

    async def ping(self) -> None:
        await self._inner.ping()

    async def close(self) -> None:
        await self._inner.close()

    def describe(self) -> str:
        return self._inner.describe()
