"""The xDS client's settings (CONFIG_TYPE=GRPC_XDS_SOTW): which server slidegate asks for its limits, as what node,
over what TLS, and how it redials (slidegate.xds reads them)."""

from __future__ import annotations

from dataclasses import dataclass

from slidegate.setting_parsers import (
    parse_backoff_interval,
    parse_bool,
    parse_grpc_headers,
    parse_node_metadata,
    parse_random_factor,
    parse_xds_message_size,
)
from slidegate.setting_spec import SettingsError, setting


@dataclass(frozen=True, slots=True)
class XdsClientSettings:
    """The CONFIG_GRPC_XDS_* and XDS_CLIENT_* settings (a section with no prefix: each names its variable whole)."""

    node_id: str = setting("CONFIG_GRPC_XDS_NODE_ID", "default", str,
                           "GRPC_XDS_SOTW: the node id sent to the xDS server")
    node_metadata: tuple[tuple[str, str], ...] = setting(
        "CONFIG_GRPC_XDS_NODE_METADATA", "", parse_node_metadata,
        "GRPC_XDS_SOTW: the node's metadata, k=v,k2=v2 (string values)")
    server_url: str = setting("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000", str,
                              "GRPC_XDS_SOTW: the xDS server, host:port")
    additional_headers: tuple[tuple[str, str], ...] = setting(
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "", parse_grpc_headers,
        "GRPC_XDS_SOTW: gRPC metadata sent with the stream, k1:v1,k2:v2")
    server_use_tls: bool = setting("CONFIG_GRPC_XDS_SERVER_USE_TLS", "false", parse_bool,
                                   "GRPC_XDS_SOTW: talk TLS to the xDS server")
    client_tls_cert: str = setting("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "", str,
                                   "GRPC_XDS_SOTW: client certificate for mutual TLS with the xDS server")
    client_tls_key: str = setting("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "", str,
                                  "GRPC_XDS_SOTW: the client certificate's key")
    server_tls_cacert: str = setting("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "", str,
                                     "GRPC_XDS_SOTW: CA of the xDS server's certificate, trusted besides the system's "
                                     "CAs")
    server_tls_san: str = setting("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "", str,
                                  "GRPC_XDS_SOTW: the name the xDS server's certificate must carry; empty: the host "
                                  "of the URL")
    backoff_initial_interval: float = setting(
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s", parse_backoff_interval,
        "GRPC_XDS_SOTW: the wait before redialling a lost xDS server, doubled at each failure")
    backoff_max_interval: float = setting("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s", parse_backoff_interval,
                                          "GRPC_XDS_SOTW: the longest wait before redialling")
    backoff_random_factor: float = setting(
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.5", parse_random_factor,
        "GRPC_XDS_SOTW: with XDS_CLIENT_BACKOFF_JITTER, each wait is drawn within this share of it either way")
    backoff_jitter: bool = setting("XDS_CLIENT_BACKOFF_JITTER", "true", parse_bool,
                                   "GRPC_XDS_SOTW: randomize the waits (replicas do not redial together)")
    max_msg_size_in_bytes: int = setting(
        "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "0", parse_xds_message_size,
        "GRPC_XDS_SOTW: the largest xDS response accepted, in bytes; 0: gRPC's 4 MiB")

    def check(self) -> None:
        """Raise SettingsError for settings of this section that only make sense together."""
        if bool(self.client_tls_cert) != bool(self.client_tls_key):
            raise SettingsError("invalid settings:\n  CONFIG_GRPC_XDS_CLIENT_TLS_CERT and "
                                "CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together")
        if (self.client_tls_cert or self.server_tls_cacert or self.server_tls_san) and not self.server_use_tls:
            raise SettingsError("invalid settings:\n  CONFIG_GRPC_XDS_CLIENT_TLS_CERT, _SERVER_TLS_CACERT and "
                                "_SERVER_TLS_SAN need --config-grpc-xds-server-use-tls / "
                                "CONFIG_GRPC_XDS_SERVER_USE_TLS=true")
        if not self.server_url.strip():
            raise SettingsError("invalid settings:\n  --config-grpc-xds-server-url / CONFIG_GRPC_XDS_SERVER_URL "
                                "must name the xDS server (host:port) with CONFIG_TYPE=GRPC_XDS_SOTW")
        if self.backoff_max_interval < self.backoff_initial_interval:
            raise SettingsError("invalid settings:\n  --xds-client-backoff-max-interval / "
                                "XDS_CLIENT_BACKOFF_MAX_INTERVAL must be at least XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")
