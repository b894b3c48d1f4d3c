"""A small xDS (ADS, state of the world) server for the tests, behaving as go-control-plane's snapshot cache
serves envoyproxy/ratelimit: one snapshot of RateLimitConfigs whose versions count up ("1", "2" …); a new stream
gets the whole snapshot; a request whose nonce is not the last one sent on its stream is ignored; a version is
sent to a stream once (the next request, ACK or NACK, opens the watch for a newer one).

A threaded gRPC server, so that both the in-process tests (on their own event loop) and `slidegate serve` children
can reach it; it can be stopped and started again on the same port (a control plane going down and back).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import Message

from slidegate.config.from_xds import TYPE_URL
from slidegate.protos import ads_pb2_grpc, discovery_pb2, rls_conf_pb2


@dataclass
class Received:
    """A request as the server got it: on which stream (0, 1 … in opening order), with which gRPC metadata."""

    stream: int
    request: discovery_pb2.DiscoveryRequest
    metadata: dict[str, str] = field(default_factory=dict)


class AdsServer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """``set`` a snapshot; ``start``/``stop`` the listener; ``received`` holds every request; ``sent`` every
    response (stream, response)."""

    def __init__(self, credentials: grpc.ServerCredentials | None = None) -> None:
        self._credentials = credentials
        self._changed = threading.Condition()
        self._snapshot: list[Message] | None = None
        self._version = 0
        self._nonce = 0
        self._streams = 0
        self._server: grpc.Server | None = None
        self.port = 0
        self.received: list[Received] = []
        self.sent: list[tuple[int, discovery_pb2.DiscoveryResponse]] = []

    def set(self, configs: Sequence[rls_conf_pb2.RateLimitConfig], foreign: Sequence[Message] = ()) -> str:
        """A new snapshot (its version is the next number), with ``foreign`` resources of other types after the
        configs (a broken control plane); returns its version."""
        with self._changed:
            self._version += 1
            self._snapshot = [*configs, *foreign]
            self._changed.notify_all()
            return str(self._version)

    def start(self) -> int:
        """Listen (on the same port as before, after a ``stop``); returns the port."""
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(self, server)
        address = f"127.0.0.1:{self.port}"
        self.port = (server.add_secure_port(address, self._credentials) if self._credentials
                     else server.add_insecure_port(address))
        server.start()
        self._server = server
        return self.port

    def stop(self) -> None:
        """Stop listening and end every stream (as a control plane that goes away)."""
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        with self._changed:
            self._changed.notify_all()

    def requests(self, stream: int | None = None) -> list[discovery_pb2.DiscoveryRequest]:
        return [r.request for r in list(self.received) if stream is None or r.stream == stream]

    def StreamAggregatedResources(  # noqa: N802 - the generated servicer's name
        self, request_iterator: Iterator[discovery_pb2.DiscoveryRequest], context: grpc.ServicerContext
    ) -> Iterator[discovery_pb2.DiscoveryResponse]:
        with self._changed:
            stream = self._streams
            self._streams += 1
        metadata = {key: str(value) for key, value in context.invocation_metadata()}
        incoming: queue.Queue[discovery_pb2.DiscoveryRequest | None] = queue.Queue()

        def read() -> None:
            try:
                for request in request_iterator:
                    self.received.append(Received(stream, request, metadata))
                    incoming.put(request)
                    with self._changed:
                        self._changed.notify_all()
            except grpc.RpcError:
                pass
            incoming.put(None)

        threading.Thread(target=read, daemon=True).start()
        last_nonce, sent_version, waiting = "", 0, False
        while context.is_active() and self._server is not None:
            while not incoming.empty():
                request = incoming.get()
                if request is None:
                    return
                if request.type_url == TYPE_URL and request.response_nonce == last_nonce:
                    waiting = True  # a stale nonce answers an older response: ignored
            with self._changed:
                if not (waiting and self._snapshot is not None and self._version > sent_version):
                    self._changed.wait(0.05)
                    continue
                snapshot, version = list(self._snapshot), self._version
                self._nonce += 1
                nonce = str(self._nonce)
            response = discovery_pb2.DiscoveryResponse(version_info=str(version), type_url=TYPE_URL, nonce=nonce)
            for config in snapshot:
                response.resources.add().Pack(config)
            last_nonce, sent_version, waiting = nonce, version, False
            self.sent.append((stream, response))
            yield response
