"""TRACING_ENABLED: `slidegate serve` sends its spans over OTLP (gRPC and HTTP) to a real receiver in this test
process; a caller's trace context is continued; TRACING_SAMPLING_RATE=0 sends nothing; without the tracing extra
serve refuses to start."""

from __future__ import annotations

import gzip
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from slidegate import stack
from slidegate.settings import Settings, SettingsError
from slidegate.tracing import SERVER_SPAN, STORAGE_SPAN
from tests.helpers import OK, OVER_LIMIT, descriptor, request
from tests.served import Served, wait_for

CONFIG = "domain: d\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
SECRET = "203.0.113.7-secret"  # a client's value: it must appear in no span
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


@dataclass
class Received:
    """What the receiver was sent, from its threads."""

    requests: list[trace_service_pb2.ExportTraceServiceRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, body: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self.lock:
            self.requests.append(body)

    def spans(self) -> list[tuple[dict[str, str], Span]]:
        """Each span with its resource's string attributes."""
        with self.lock:
            return [({a.key: a.value.string_value for a in rs.resource.attributes}, span)
                    for body in self.requests for rs in body.resource_spans for ss in rs.scope_spans
                    for span in ss.spans]


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest,  # noqa: N802 - the proto's name
               context: grpc.ServicerContext) -> trace_service_pb2.ExportTraceServiceResponse:
        self.received.add(request)
        return trace_service_pb2.ExportTraceServiceResponse()


def _http_handler(received: Received) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_error(404)
                return
            received.add(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
            pass

    return Handler


@pytest.fixture(params=["grpc", "http"])
def otlp(request: pytest.FixtureRequest) -> Iterator[tuple[dict[str, str], Received]]:
    """An OTLP receiver of the parameter's protocol; the environment that points `slidegate serve` at it."""
    received = Received()
    protocol: str = request.param
    if protocol == "grpc":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(received), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()

        def stop() -> None:
            server.stop(0).wait()
    else:
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _http_handler(received))
        port = httpd.server_address[1]
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()

        def stop() -> None:
            httpd.shutdown()
            httpd.server_close()

    env = {"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": protocol,
           "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
           "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: the batch goes out at once, not after the default 5 s
           "TRACING_SERVICE_NAMESPACE": "edge", "TRACING_SERVICE_INSTANCE_ID": "replica-7"}
    yield env, received
    stop()


def _attributes(span: Span) -> dict[str, object]:
    def value(v: AnyValue) -> object:
        kind = v.WhichOneof("value")
        return getattr(v, kind) if kind else None

    return {a.key: value(a.value) for a in span.attributes}


def _all_text(spans: list[tuple[dict[str, str], Span]]) -> str:
    attributes: list[KeyValue] = [a for _, span in spans for a in span.attributes]
    return " ".join(str(a) for a in attributes) + " ".join(span.name for _, span in spans)


def test_spans_go_to_the_collector_with_the_callers_trace_continued(
    write_config: Callable[..., Path], serve: Callable[..., Served], otlp: tuple[dict[str, str], Received],
) -> None:
    env, received = otlp
    # the SDK's own resource variables add to TRACING_SERVICE_*, and do not override them
    served = serve(write_config(CONFIG), env={**env, "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
                                              "OTEL_SERVICE_NAME": "other"})
    stub = served.stub()
    call = request("d", descriptor(("client", SECRET)))
    traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    assert stub.ShouldRateLimit(call, metadata=(("traceparent", traceparent),)).overall_code == OK
    assert stub.ShouldRateLimit(call).overall_code == OVER_LIMIT  # Redis says so
    assert stub.ShouldRateLimit(call).overall_code == OVER_LIMIT  # the over-limit cache says so: no storage call
    with pytest.raises(grpc.RpcError) as refused:
        stub.ShouldRateLimit(request("", descriptor(("client", SECRET))))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert wait_for(lambda: len(received.spans()) >= 6, timeout=10), received.spans()
    spans = received.spans()
    assert len(spans) == 6
    for resource, _ in spans:
        assert resource["service.name"] == "RateLimit"
        assert resource["service.namespace"] == "edge"
        assert resource["service.instance.id"] == "replica-7"
        assert resource["deployment.environment"] == "test"
    calls = sorted((s for _, s in spans if s.name == SERVER_SPAN), key=lambda s: s.start_time_unix_nano)
    storage = sorted((s for _, s in spans if s.name == STORAGE_SPAN), key=lambda s: s.start_time_unix_nano)
    assert (len(calls), len(storage)) == (4, 2)
    assert [s.status.code for s in calls] == [Status.STATUS_CODE_UNSET] * 3 + [Status.STATUS_CODE_ERROR]
    assert all(s.kind == Span.SPAN_KIND_SERVER for s in calls)
    assert all(s.kind == Span.SPAN_KIND_CLIENT for s in storage)
    # the first call continues the client's trace; the others start their own
    assert (calls[0].trace_id.hex(), calls[0].parent_span_id.hex()) == (TRACE_ID, PARENT_ID)
    assert calls[1].trace_id.hex() != TRACE_ID and not calls[1].parent_span_id
    assert calls[1].trace_id != calls[2].trace_id
    for parent, child in zip(calls, storage, strict=False):
        assert (child.trace_id, child.parent_span_id) == (parent.trace_id, parent.span_id)
    assert [_attributes(s) for s in calls[:3]] == [
        {"rpc.system": "grpc", "rpc.service": "envoy.service.ratelimit.v3.RateLimitService",
         "rpc.method": "ShouldRateLimit", "ratelimit.domain": "d", "ratelimit.descriptors": 1,
         "ratelimit.overall_code": code} for code in ("OK", "OVER_LIMIT", "OVER_LIMIT")]
    assert [_attributes(s) for s in storage] == [
        {"ratelimit.storage.backend": "redis single", "ratelimit.storage.limits": 1,
         "ratelimit.storage.admitted": admitted} for admitted in (True, False)]
    assert SECRET not in _all_text(spans)
    assert "tracing: OTLP over" in served.output()


def test_sampling_rate_zero_exports_nothing(
    write_config: Callable[..., Path], serve: Callable[..., Served], otlp: tuple[dict[str, str], Received],
) -> None:
    env, received = otlp
    served = serve(write_config(CONFIG), env={**env, "TRACING_SAMPLING_RATE": "0"})
    stub = served.stub()
    for _ in range(5):
        stub.ShouldRateLimit(request("d", descriptor(("client", "a"))))
    stack.stop(served.process)  # its shutdown sends every span it holds
    assert served.process.returncode == 0, served.output()
    assert received.spans() == []


def test_serve_refuses_to_start_without_the_tracing_extra(write_config: Callable[..., Path], tmp_path: Path) -> None:
    # a package of the SDK's name that cannot be imported, ahead of the installed one
    shadow = tmp_path / "shadow" / "opentelemetry"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'opentelemetry'\")\n")
    path = os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "slidegate", "serve", "--config", str(write_config(CONFIG)),
                           "--grpc-port", str(stack.free_port())],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": path, "TRACING_ENABLED": "true"})
    assert done.returncode == 2
    assert "TRACING_ENABLED=true needs the OpenTelemetry SDK" in done.stderr
    assert "pip install -e '.[tracing]' in a checkout" in done.stderr


@pytest.mark.parametrize(("variable", "value"), [
    ("TRACING_SAMPLING_RATE", "1.5"), ("TRACING_SAMPLING_RATE", "-0.1"), ("TRACING_EXPORTER_PROTOCOL", "zipkin"),
])
def test_tracing_settings_are_checked(variable: str, value: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        Settings.load({variable: value})
    settings = Settings.load({})
    assert (settings.tracing.enabled, settings.tracing.service_name, settings.tracing.exporter_protocol,
            settings.tracing.sampling_rate) == (False, "RateLimit", "http", 1.0)
