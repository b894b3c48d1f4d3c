"""A Redis Cluster and a Sentinel group made of private redis-server processes, for the topology tests."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from slidegate.stack import free_port
from tests.redis_servers import RedisServer


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if condition():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.05)


class Cluster:
    """``masters`` masters with one replica each; a node not heard from for ``node_timeout_ms`` is failed over."""

    def __init__(self, masters: int = 3, password: str | None = None, node_timeout_ms: int = 1000,
                 tls: tuple[Path, Path, Path] | None = None) -> None:
        """``tls`` (certificate, key, CA): every node, the cluster bus and replication speak TLS only."""
        self.password = password
        self.tls = tls
        auth = ("--requirepass", password, "--masterauth", password) if password else ()
        if tls is not None:
            auth = (*auth, "--tls-cluster", "yes", "--tls-replication", "yes")
        self.nodes: list[RedisServer] = []
        for _ in range(masters * 2):
            node = RedisServer()
            # the bus port defaults to port + 10000, which is past 65535 for many free ports
            node.extra_args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                               "--cluster-port", str(free_port()),
                               "--cluster-node-timeout", str(node_timeout_ms), *auth)
            self.nodes.append(node)
        try:
            for node in self.nodes:
                node.start(password=password, tls=tls)
            addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
            subprocess.run(["redis-cli", *(["-a", password, "--no-auth-warning"] if password else []),
                            *(["--tls", "--cacert", str(tls[2])] if tls else []),
                            "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
            wait_for(self.healthy, 30, "the cluster to be ready")
        except BaseException:
            self.cleanup()
            raise

    @property
    def url(self) -> str:
        """REDIS_URL for REDIS_TYPE=cluster: two of the nodes are enough to find the rest."""
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:2])

    def client(self, node: RedisServer) -> redis.Redis:
        tls: dict[str, Any] = {"ssl": True, "ssl_ca_certs": str(self.tls[2])} if self.tls else {}
        return redis.Redis(port=node.port, password=self.password, socket_timeout=2, decode_responses=True, **tls)

    def live(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.process is not None]

    def healthy(self) -> bool:
        """Every live node says the cluster is ok, and every master has a replica in sync."""
        for node in self.live():
            with self.client(node) as c:
                info = c.execute_command("CLUSTER", "INFO")
                if "cluster_state:ok" not in info:
                    return False
                role = c.info("replication")
                if role["role"] == "slave" and role.get("master_link_status") != "up":
                    return False
        return True

    def master_of(self, key: str) -> RedisServer:
        """The live node serving ``key``'s slot as master."""
        with self.client(self.live()[0]) as c:
            slot = c.execute_command("CLUSTER", "KEYSLOT", key)
            for start, end, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    port = master[1]
                    return next(n for n in self.nodes if n.port == port)
        raise LookupError(key)

    def masters(self) -> list[RedisServer]:
        masters = []
        for node in self.live():
            with self.client(node) as c:
                if c.info("replication")["role"] == "master":
                    masters.append(node)
        return masters

    def move_slot(self, slot: int, source: RedisServer, target: RedisServer) -> None:
        """Reshard ``slot`` from ``source`` to ``target`` as redis-cli does: mark it migrating/importing,
        MIGRATE its keys (pausing so that clients meet ASK redirections), then give it to ``target``."""
        source_id, target_id = self.node_id(source), self.node_id(target)
        auth = ["AUTH", self.password] if self.password else []
        with self.client(source) as src, self.client(target) as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            time.sleep(0.1)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, *auth, "KEYS", *keys)
                time.sleep(0.1)
            for node in [target, source, *(m for m in self.masters() if m not in (source, target))]:
                with self.client(node) as c:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def node_id(self, node: RedisServer) -> str:
        with self.client(node) as c:
            return str(c.execute_command("CLUSTER", "MYID"))

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()


class SentinelGroup:
    """A master, one replica and one Sentinel watching them as ``mymaster`` (quorum 1)."""

    name = "mymaster"

    def __init__(self, password: str | None = None, sentinel_password: str | None = None,
                 tls: tuple[Path, Path, Path] | None = None) -> None:
        """``tls`` (certificate, key, CA): the master, the replica and the Sentinel speak TLS only."""
        self.password = password
        self.sentinel_password = sentinel_password
        self.tls = tls
        auth = ("--requirepass", password, "--masterauth", password) if password else ()
        if tls is not None:
            auth = (*auth, "--tls-replication", "yes")
        self.master = RedisServer()
        self.master.extra_args = auth
        self.replica = RedisServer()
        self.replica.extra_args = (*auth, "--replicaof", "127.0.0.1", str(self.master.port))
        self.dir = tempfile.mkdtemp(prefix="slidegate-sentinel-")
        self.port = free_port()
        self.sentinel: subprocess.Popen[bytes] | None = None
        try:
            self.master.start(password=password, tls=tls)
            self.replica.start(password=password, tls=tls)
            self._start_sentinel()
            wait_for(self.ready, 30, "the Sentinel to see the master and its replica")
        except BaseException:
            self.cleanup()
            raise

    def _start_sentinel(self) -> None:
        lines = [f"port {self.port}"]
        if self.tls is not None:
            cert, key, ca = self.tls
            lines = ["port 0", f"tls-port {self.port}", f"tls-cert-file {cert}", f"tls-key-file {key}",
                     f"tls-ca-cert-file {ca}", "tls-auth-clients no", "tls-replication yes"]
        lines += ["bind 127.0.0.1", f"dir {self.dir}",
                 f"sentinel monitor {self.name} 127.0.0.1 {self.master.port} 1",
                 f"sentinel down-after-milliseconds {self.name} 1000",
                 f"sentinel failover-timeout {self.name} 5000"]
        if self.password:
            lines.append(f"sentinel auth-pass {self.name} {self.password}")
        if self.sentinel_password:
            lines.append(f"requirepass {self.sentinel_password}")
        config = Path(self.dir, "sentinel.conf")
        config.write_text("\n".join(lines) + "\n")
        binary = shutil.which("redis-server") or "redis-server"
        self.sentinel = subprocess.Popen([binary, str(config), "--sentinel", "--logfile", f"{self.dir}/log"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @property
    def url(self) -> str:
        """REDIS_URL for REDIS_TYPE=sentinel."""
        return f"{self.name},127.0.0.1:{self.port}"

    def sentinel_client(self) -> redis.Redis:
        tls: dict[str, Any] = {"ssl": True, "ssl_ca_certs": str(self.tls[2])} if self.tls else {}
        return redis.Redis(port=self.port, password=self.sentinel_password, socket_timeout=2,
                           decode_responses=True, **tls)

    def master_port(self) -> int:
        with self.sentinel_client() as s:
            return int(s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)[1])

    def ready(self) -> bool:
        """The Sentinel knows a replica that is in sync and could be promoted."""
        with self.sentinel_client() as s:
            replicas = s.execute_command("SENTINEL", "REPLICAS", self.name)
        for fields in replicas:
            info = dict(zip(fields[::2], fields[1::2], strict=True)) if isinstance(fields, list) else fields
            if info.get("flags") == "slave" and info.get("master-link-status") == "ok":
                return True
        return False

    def failover(self) -> None:
        """SENTINEL FAILOVER: the replica becomes master, the master a replica."""
        with self.sentinel_client() as s:
            s.execute_command("SENTINEL", "FAILOVER", self.name)

    def cleanup(self) -> None:
        if self.sentinel is not None:
            self.sentinel.kill()
            self.sentinel.wait()
        self.master.cleanup()
        self.replica.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)
