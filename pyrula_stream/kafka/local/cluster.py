"""A real local Kafka cluster of several brokers (KRaft), for failures one node cannot show.

Brokers ``1..N`` each run in a JVM of their own, with their own port and data directory
under the cluster's, beside one controller (node ``N + 1``, controller only). A separate
controller keeps the metadata quorum up while brokers die, which is what a production
cluster's dedicated controllers do and what a test of brokers failing needs: with two of
three brokers down the controller still shrinks the in-sync replicas, so writes are
refused with ``NOT_ENOUGH_REPLICAS`` instead of hanging. The internal topics (consumer
offsets, transaction state) get ``min(3, N)`` replicas with ``min.insync.replicas`` one
less. Killing a broker moves the leadership of its partitions and the group and
transaction coordinators it held; restarting it brings it back on the same port, and it
catches up. Started again on a data directory it formatted before, the cluster comes back
as it was, as the single node does (``local_broker.py``).
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyrula_stream.errors import BrokerUnavailableError, ConfigurationError
from pyrula_stream.kafka.local.broker import (
    LocalBroker,
    check_java,
    fetch_jars,
    format_storage,
    free_port,
    jvm_command,
    launch_node,
    new_cluster_id,
    node_defaults,
    wait_until_ready,
)

CLUSTER_FILE = "cluster.json"
NODE_HEAP = "384m"
"""Three brokers beside the suite on 2 cores and 24 GiB: a broker's heap stays small."""
CONTROLLER_HEAP = "192m"


def _broker_properties(data: Path, node_id: int, port: int, controller: str, replicas: int) -> str:
    return f"""process.roles=broker
node.id={node_id}
controller.quorum.voters={controller}
listeners=PLAINTEXT://127.0.0.1:{port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=4000
replica.lag.time.max.ms=5000
{node_defaults(data, replicas=replicas)}"""


def _controller_properties(data: Path, node_id: int, port: int) -> str:
    return f"""process.roles=controller
node.id={node_id}
controller.quorum.voters={node_id}@127.0.0.1:{port}
listeners=CONTROLLER://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT
log.dirs={data / "log"}
"""


@dataclass
class LocalCluster:
    """A running local cluster; ``brokers[i]`` is broker id ``i + 1``."""

    brokers: list[LocalBroker]
    controller: LocalBroker
    data_dir: str
    owns_data_dir: bool = True
    heap: str = NODE_HEAP
    die_with_parent: bool = field(default=True, repr=False)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.bootstrap_servers for node in self.brokers)

    def broker(self, node_id: int) -> LocalBroker:
        if not 1 <= node_id <= len(self.brokers):
            raise ConfigurationError(f"no broker {node_id} in a cluster of {len(self.brokers)}")
        return self.brokers[node_id - 1]

    def running(self) -> list[int]:
        """The ids of the brokers whose process is alive."""
        return [i + 1 for i, node in enumerate(self.brokers) if node.is_running()]

    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        """End one broker's JVM (SIGKILL by default: no clean shutdown), keeping its data."""
        self.broker(node_id).halt(sig, grace_s=30.0)

    def restart(self, node_id: int, timeout_s: float = 90.0) -> None:
        """Start a broker that was killed or stopped again, on its port, and wait for it."""
        node = self.broker(node_id)
        if node.is_running():
            return
        _relaunch(node, self.heap, self.die_with_parent)
        _wait_for_node(node, timeout_s)

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop every broker, then the controller (SIGTERM, SIGKILL past the grace)."""
        for node in self.brokers:
            node.halt(signal.SIGTERM, grace_s)
        self.controller.halt(signal.SIGTERM, grace_s)
        if self.owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def halt(self) -> None:
        """Stop every node and keep the data: the next start brings the cluster back."""
        for node in [*self.brokers, self.controller]:
            node.halt(signal.SIGTERM)

    @classmethod
    def from_json(cls, text: str) -> LocalCluster:
        """The cluster a ``to_json`` described (its processes may have ended since)."""
        data = json.loads(text)
        return cls(
            [LocalBroker(**node) for node in data["brokers"]],
            LocalBroker(**data["controller"]),
            data["data_dir"],
            owns_data_dir=False,
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "bootstrap_servers": self.bootstrap_servers,
                "data_dir": self.data_dir,
                "brokers": [json.loads(node.to_json()) for node in self.brokers],
                "controller": json.loads(self.controller.to_json()),
            }
        )


def _relaunch(node: LocalBroker, heap: str, die_with_parent: bool) -> None:
    data = Path(node.data_dir)
    proc = launch_node(jvm_command(check_java(), fetch_jars(), heap, data), data, die_with_parent)
    node.pid, node.process = proc.pid, proc


def _wait_for_node(node: LocalBroker, timeout_s: float) -> None:
    try:
        wait_until_ready(node.bootstrap_servers, timeout_s, kafka_config={})  # PLAINTEXT
    except BrokerUnavailableError:
        tail = (Path(node.data_dir) / "broker.out").read_text(errors="replace")[-3000:]
        raise BrokerUnavailableError(
            f"broker at {node.bootstrap_servers} did not start:\n{tail}"
        ) from None


def _layout(data: Path, brokers: int) -> dict[str, Any]:
    """The cluster's id and ports: read back from a cluster formatted before, else new."""
    known = data / CLUSTER_FILE
    if known.exists():
        layout: dict[str, Any] = json.loads(known.read_text())
        if len(layout["brokers"]) != brokers:
            raise ConfigurationError(
                f"{data} holds a cluster of {len(layout['brokers'])} brokers, not {brokers}; "
                "start it with that many or use another data directory"
            )
        return layout
    return {
        "cluster_id": new_cluster_id(),
        "controller_port": free_port(),
        "brokers": [free_port() for _ in range(brokers)],
    }


def start_local_cluster(
    brokers: int = 3,
    *,
    data_dir: Path | None = None,
    heap: str = NODE_HEAP,
    die_with_parent: bool = True,
    timeout_s: float = 120.0,
) -> LocalCluster:
    """Start a controller and ``brokers`` brokers on loopback; return once each answers."""
    if brokers < 1:
        raise ConfigurationError("a cluster needs at least one broker")
    java, libs = check_java(), fetch_jars()
    owns = data_dir is None
    data = Path(data_dir or tempfile.mkdtemp(prefix="pyrula-cluster-"))
    data.mkdir(parents=True, exist_ok=True)
    layout = _layout(data, brokers)
    fresh = not (data / CLUSTER_FILE).exists()
    controller_id = brokers + 1
    voters = f"{controller_id}@127.0.0.1:{layout['controller_port']}"
    nodes: list[tuple[Path, str, int, str, str]] = [
        (
            data / "controller",
            _controller_properties(data / "controller", controller_id, layout["controller_port"]),
            layout["controller_port"],
            CONTROLLER_HEAP,
            "controller",
        )
    ]
    for i, port in enumerate(layout["brokers"]):
        folder = data / f"broker-{i + 1}"
        text = _broker_properties(folder, i + 1, port, voters, min(3, brokers))
        nodes.append((folder, text, port, heap, "broker"))
    started: list[LocalBroker] = []
    try:
        for folder, text, port, node_heap, _ in nodes:
            folder.mkdir(exist_ok=True)
            (folder / "server.properties").write_text(text)
            jvm = jvm_command(java, libs, node_heap, folder)
            if fresh:
                format_storage(
                    jvm, folder / "server.properties", cluster_id=str(layout["cluster_id"])
                )
            proc = launch_node(jvm, folder, die_with_parent)
            started.append(
                LocalBroker(
                    f"127.0.0.1:{port}",
                    proc.pid,
                    str(folder),
                    str(folder / "broker.log"),
                    False,
                    proc,
                )
            )
        (data / CLUSTER_FILE).write_text(json.dumps(layout))
        deadline = time.monotonic() + timeout_s
        for node in started[1:]:
            _wait_for_node(node, max(1.0, deadline - time.monotonic()))
    except BaseException:
        for node in started:
            node.halt(signal.SIGKILL)
        if owns:
            shutil.rmtree(data, ignore_errors=True)
        raise
    return LocalCluster(started[1:], started[0], str(data), owns, heap, die_with_parent)
