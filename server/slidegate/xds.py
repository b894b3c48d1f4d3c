"""Config over xDS (CONFIG_TYPE=GRPC_XDS_SOTW): an ADS client of the state-of-the-world protocol, as
envoyproxy/ratelimit's (go-control-plane's SotW client).

One bidirectional stream, ``StreamAggregatedResources``, asks for every ``RateLimitConfig`` (a wildcard request).
Each response is the whole config: it is built into the model, checked as files are (slidegate.config.from_xds) and,
when valid, swapped in whole and ACKed (its version and nonce); when not, the config in force stays, the response is
NACKed (the version in force, its nonce and why), and a load error is counted. When the stream ends, the config in
force keeps serving and the server is redialled after a backoff; a new stream asks afresh (no version), so that the
server sends its whole set again, whatever it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import ssl
from collections.abc import Callable
from pathlib import Path

import grpc
from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError

from slidegate._proto.envoy.config.core.v3 import base_pb2
from slidegate._proto.envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from slidegate._proto.google.rpc import status_pb2
from slidegate._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2
from slidegate.config import ConfigError, LoadOptions
from slidegate.config.from_xds import TYPE_URL, load_resources
from slidegate.metrics import Metrics
from slidegate.reload import ConfigHolder, Pacer, loading
from slidegate.settings import Settings

log = logging.getLogger(__name__)
KEEPALIVE_MS = 30_000  # a ping after 30 s of silence on the stream
KEEPALIVE_TIMEOUT_MS = 10_000  # and the connection given up 10 s later without its answer
_INVALID_ARGUMENT = 3  # google.rpc.Code: the code of a NACK's error_detail, as go-control-plane's client sends it


class InvalidResponse(Exception):
    """A response that cannot become the config; the message says why (it goes back in the NACK)."""


def backoff(failures: int, settings: Settings, draw: Callable[[], float] = random.random) -> float:
    """Seconds to wait before redialling after ``failures`` streams in a row that brought nothing: the initial
    interval doubled each time up to the most, then (with jitter) drawn within the random factor either way."""
    wait: float = min(settings.xds.backoff_initial_interval * 2 ** min(failures, 32),
                      settings.xds.backoff_max_interval)
    if settings.xds.backoff_jitter:
        wait *= 1 + settings.xds.backoff_random_factor * (2 * draw() - 1)
    return wait


def node(settings: Settings) -> base_pb2.Node:
    """The node the requests name: CONFIG_GRPC_XDS_NODE_ID and CONFIG_GRPC_XDS_NODE_METADATA (string values)."""
    metadata = struct_pb2.Struct()
    for key, value in settings.xds.node_metadata:
        metadata.fields[key].string_value = value
    return base_pb2.Node(id=settings.xds.node_id, metadata=metadata, user_agent_name="slidegate")


def channel_credentials(settings: Settings) -> grpc.ChannelCredentials:
    """TLS to the xDS server: CONFIG_GRPC_XDS_SERVER_TLS_CACERT added to the system's CAs (as the reference adds
    it), and the client certificate for mutual TLS. Raises OSError when a file cannot be read."""
    roots = None
    if settings.xds.server_tls_cacert:
        system = ssl.get_default_verify_paths().cafile
        roots = Path(settings.xds.server_tls_cacert).read_bytes()
        if system and Path(system).is_file():
            roots = Path(system).read_bytes() + b"\n" + roots
    key = chain = None
    if settings.xds.client_tls_cert:
        chain = Path(settings.xds.client_tls_cert).read_bytes()
        key = Path(settings.xds.client_tls_key).read_bytes()
    return grpc.ssl_channel_credentials(root_certificates=roots, private_key=key, certificate_chain=chain)


def parse_response(response: discovery_pb2.DiscoveryResponse) -> list[rls_conf_pb2.RateLimitConfig]:
    """The RateLimitConfigs of a response. Raises InvalidResponse."""
    if response.type_url != TYPE_URL:
        raise InvalidResponse(f"type_url {response.type_url!r} was not asked for (only {TYPE_URL})")
    configs = []
    for index, resource in enumerate(response.resources):
        if resource.type_url != TYPE_URL:
            raise InvalidResponse(f"resource {index}: type_url {resource.type_url!r} is not {TYPE_URL}")
        config = rls_conf_pb2.RateLimitConfig()
        try:
            config.ParseFromString(resource.value)
        except DecodeError as exc:
            raise InvalidResponse(f"resource {index}: not a RateLimitConfig: {exc}") from exc
        configs.append(config)
    return configs


class XdsConfigSource:
    """Keeps ``holder`` on the xDS server's config. ``first`` is set once a config has been accepted."""

    def __init__(self, settings: Settings, options: LoadOptions, holder: ConfigHolder, metrics: Metrics) -> None:
        self._settings = settings
        self._options = options
        self._holder = holder
        self._metrics = metrics
        self._node = node(settings)
        self.first = asyncio.Event()
        self.version = ""  # of the config in force
        self._resources: list[bytes] = []  # the resources of the config in force, as they came
        self._answered = False  # the stream in progress has brought a response

    def _channel(self) -> grpc.aio.Channel:
        target = self._settings.xds.server_url
        # keepalive pings: a server that went away without a word (a partition, a node gone) ends the stream
        # instead of leaving it open and the limits silently stale
        options: list[tuple[str, str | int]] = [("grpc.keepalive_time_ms", KEEPALIVE_MS),
                                                ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                                                ("grpc.keepalive_permit_without_calls", 1)]
        if self._settings.xds.max_msg_size_in_bytes:
            options.append(("grpc.max_receive_message_length", self._settings.xds.max_msg_size_in_bytes))
        if not self._settings.xds.server_use_tls:
            return grpc.aio.insecure_channel(target, options=options)
        if self._settings.xds.server_tls_san:
            # the certificate is checked for this name, not the URL's host (a server reached by address)
            options.append(("grpc.ssl_target_name_override", self._settings.xds.server_tls_san))
        return grpc.aio.secure_channel(target, channel_credentials(self._settings), options=options)

    async def first_config(self, stop: asyncio.Event) -> bool:
        """Wait until a config has been accepted (``run`` brings it): True, or False when ``stop`` came first."""
        # as envoyproxy/ratelimit: no listener until there is a config to answer with
        log.info("waiting for the first config from the xDS server %s before listening",
                 self._settings.xds.server_url)
        first = asyncio.create_task(self.first.wait())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait((first, stopping), return_when=asyncio.FIRST_COMPLETED)
        first.cancel()
        stopping.cancel()
        return not stop.is_set()

    def reload_now(self) -> None:
        # SIGHUP must not end the process either
        log.info("SIGHUP: the config comes over xDS, nothing to reload")

    def describe(self) -> str:
        config = self._holder.current
        return f"the xDS server {self._settings.xds.server_url}" + (
            f" (version {config.version})" if config.loaded else " (none yet: calls are refused until it comes)")

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the server until ``stop`` is set: stream, and redial after a backoff whenever the stream ends."""
        failures = 0
        url = self._settings.xds.server_url
        while not stop.is_set():
            self._answered = False
            stream = asyncio.create_task(self._stream())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait((stream, stopping), return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if stop.is_set():
                stream.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await stream
                return
            try:
                stream.result()
                reason = "the server ended the stream"
            except grpc.aio.AioRpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}"
            except Exception as exc:  # a certificate file gone, or anything unexpected: the config stays all the same
                reason = str(exc)
            # a stream that brought responses worked, however it ended: the waits start again from the first
            if self._answered:
                failures = 0
            wait = backoff(failures, self._settings)
            failures += 1
            log.warning("xDS server %s: %s; %s; dialling again in %.1f s", url, reason,
                        f"serving the config in force (version {self.version})" if self.first.is_set()
                        else "no config yet", wait)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    async def _stream(self) -> None:
        """One stream, until it ends. Raises grpc.aio.AioRpcError."""
        channel = self._channel()
        try:
            stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
            call = stub.StreamAggregatedResources(metadata=self._settings.xds.additional_headers)
            # no version: whatever the server holds, it sends its whole set to a new stream
            await call.write(discovery_pb2.DiscoveryRequest(node=self._node, type_url=TYPE_URL))
            log.info("xDS server %s: stream open, asking for %s", self._settings.xds.server_url, TYPE_URL)
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:  # type: ignore[attr-defined]  # grpc-stubs lacks it
                    return
                self._answered = True
                await call.write(await self._handle(response))
        finally:
            await channel.close(None)

    async def _handle(self, response: discovery_pb2.DiscoveryResponse) -> discovery_pb2.DiscoveryRequest:
        """Take ``response`` into force when it is valid; return its ACK, or its NACK."""
        try:
            resources = parse_response(response)
            raw = [r.value for r in response.resources]
            if self.first.is_set() and raw == self._resources:
                # the same resources under a new version (a server pushing as often as it likes): nothing to load,
                # only the version it is known by changes
                self.version = response.version_info
                self._holder.current = dataclasses.replace(self._holder.current, version=self.version)
                log.debug("xDS config version %s: the same resources, kept", self.version)
                return self._ack(response)
            # in a thread, paced: a large config must not stall decisions (slidegate.reload)
            with loading:
                config = await asyncio.to_thread(load_resources, resources, response.version_info, self._options,
                                                 Pacer())
        except (InvalidResponse, ConfigError) as exc:
            return self._refuse(response, str(exc))
        except Exception as exc:  # a bug of ours: NACKed all the same, or the server would resend it at every redial
            log.exception("xDS config version %s could not be loaded", response.version_info)
            return self._refuse(response, f"cannot load it: {exc!r}")
        self._holder.current = config
        self.version, self._resources = response.version_info, raw
        self._metrics.config_load_success.inc()
        self.first.set()
        log.info("xDS config version %s in force: %d domains, %d limits", self.version, len(config.domains),
                 config.limit_count())
        return self._ack(response)

    def _ack(self, response: discovery_pb2.DiscoveryResponse) -> discovery_pb2.DiscoveryRequest:
        return discovery_pb2.DiscoveryRequest(version_info=self.version, node=self._node, type_url=TYPE_URL,
                                              response_nonce=response.nonce)

    def _refuse(self, response: discovery_pb2.DiscoveryResponse, why: str) -> discovery_pb2.DiscoveryRequest:
        """Keep the config in force, count and log the load error; return the NACK of ``response``."""
        self._metrics.config_load_error.inc()
        log.error("xDS config version %s refused (NACK), keeping %s:\n%s", response.version_info,
                  f"version {self.version}" if self.first.is_set() else "no config", why)
        return discovery_pb2.DiscoveryRequest(
            version_info=self.version, node=self._node, type_url=TYPE_URL, response_nonce=response.nonce,
            error_detail=status_pb2.Status(code=_INVALID_ARGUMENT, message=why))
