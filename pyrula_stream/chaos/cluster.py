"""Broker kills on a three-broker cluster (``--brokers 3 --broker-kills K``).

A thread SIGKILLs one broker at a time, spread over the submission window, and starts it
again on its port and data directory; the next kill waits until every partition of the
run is fully in sync again, so two brokers are never down (or behind) at once. The
victims are chosen to hurt: the leader of the transaction-state partition that
coordinates a worker's transactions, the leader of a turns partition in use, the
group coordinator, then any. After the kills, one rolling restart (SIGTERM) of every
broker. A watcher reads the cluster's metadata every second and counts leader changes of
the run's partitions and moves of the workers' transaction coordinators.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaException

from pyrula_stream.chaos.broker import BrokerRestart
from pyrula_stream.kafka.admin import admin_client
from pyrula_stream.kafka.local.cluster import LocalCluster

TRANSACTION_TOPIC = "__transaction_state"
OFFSETS_TOPIC = "__consumer_offsets"
IN_SYNC_WAIT_S = 90.0


def java_string_hash(text: str) -> int:
    """``String.hashCode()`` of the JVM, as the broker computes it."""
    data = text.encode("utf-16-be")  # Java hashes UTF-16 code units
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """The internal-topic partition whose leader coordinates ``key`` (a transactional id
    or a group id): ``Utils.abs(key.hashCode()) % partitions``."""
    return (java_string_hash(key) & 0x7FFFFFFF) % partitions


@dataclass
class ClusterWatch:
    leader_changes: int = 0
    coordinator_moves: int = 0


class ClusterKiller(threading.Thread):
    """Runs the kill plan against a ``LocalCluster``; ``restarts`` says what it did."""

    def __init__(
        self,
        cluster: LocalCluster,
        plan: list[float],
        *,
        topics: list[str],
        transactional_ids: list[str],
        group_id: str,
        all_done: Callable[[], bool],
        log: Callable[[str], None],
        rng: random.Random,
        outage_s: float = 3.0,
    ) -> None:
        super().__init__(name="chaos-cluster-killer", daemon=True)
        self.cluster = cluster
        self.plan = plan
        self.topics = topics
        self.transactional_ids = transactional_ids
        self.group_id = group_id
        self.all_done = all_done
        self.log = log
        self.rng = rng
        self.outage_s = outage_s
        self.restarts: list[BrokerRestart] = []
        self.watch = ClusterWatch()
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self._halt = threading.Event()
        self._busy = threading.Lock()
        self._admin = admin_client(cluster.bootstrap_servers, {})
        self._watcher = threading.Thread(
            target=self._watch, name="chaos-cluster-watch", daemon=True
        )

    # -- who leads what ---------------------------------------------------------------------

    def _leaders(self) -> dict[tuple[str, int], int]:
        meta = self._admin.list_topics(timeout=5)
        out: dict[tuple[str, int], int] = {}
        for name in [*self.topics, TRANSACTION_TOPIC, OFFSETS_TOPIC]:
            topic = meta.topics.get(name)
            if topic is None:
                continue
            for p, part in topic.partitions.items():
                out[(name, p)] = part.leader
        return out

    def _in_sync(self) -> bool:
        meta = self._admin.list_topics(timeout=5)
        for name in [*self.topics, TRANSACTION_TOPIC, OFFSETS_TOPIC]:
            topic = meta.topics.get(name)
            if topic is None:
                continue
            for part in topic.partitions.values():
                if len(part.isrs) < len(part.replicas) or part.leader < 0:
                    return False
        return True

    def _coordinator_keys(self) -> set[tuple[str, int]]:
        parts = (
            len(
                self._admin.list_topics(TRANSACTION_TOPIC, timeout=5)
                .topics[TRANSACTION_TOPIC]
                .partitions
            )
            or 1
        )
        return {
            (TRANSACTION_TOPIC, coordinator_partition(t, parts)) for t in self.transactional_ids
        }

    def _watch(self) -> None:
        before: dict[tuple[str, int], int] = {}
        coordinators: set[tuple[str, int]] = set()
        while not self._halt.wait(1.0):
            try:
                leaders = self._leaders()
                if not coordinators:
                    coordinators = self._coordinator_keys()
            except Exception:  # the cluster is mid-failover: look again in a second
                continue
            for key, leader in leaders.items():
                was = before.get(key)
                if was is not None and leader >= 0 and leader != was:
                    if key in coordinators:
                        self.watch.coordinator_moves += 1
                    elif key[0] in self.topics:
                        self.watch.leader_changes += 1
                if leader >= 0:
                    before[key] = leader

    # -- the kills ----------------------------------------------------------------------------

    def _victim(self, i: int) -> int:
        leaders = self._leaders()
        running = self.cluster.running()
        wanted: list[int] = []
        if i % 4 == 0:  # the transaction coordinator of a worker
            try:
                wanted = [leaders.get(k, -1) for k in sorted(self._coordinator_keys())]
            except (KeyError, KafkaException):
                wanted = []
        elif i % 4 == 1:  # the leader of a turns partition in use
            wanted = [leaders.get((self.topics[0], p), -1) for p in range(64)]
        elif i % 4 == 2:  # the group coordinator
            parts = sum(1 for k in leaders if k[0] == OFFSETS_TOPIC) or 1
            wanted = [leaders.get((OFFSETS_TOPIC, coordinator_partition(self.group_id, parts)), -1)]
        choices = [n for n in wanted if n in running] or running
        return self.rng.choice(choices)

    def run(self) -> None:
        self._watcher.start()
        try:
            for i, at in enumerate(self.plan):
                while time.monotonic() - self.started < at:
                    if self._halt.wait(0.1) or self.all_done():
                        break
                if self._halt.is_set() or self.all_done():
                    break
                with self._busy:
                    self._bounce(self._victim(i), signal.SIGKILL)
            if not self._halt.is_set() and not self.all_done():
                for node in list(self.cluster.running()):  # one rolling restart
                    with self._busy:
                        self._bounce(node, signal.SIGTERM)
        except BaseException as exc:  # the harness reports it; the thread must stay alive
            self.error = exc
            self.log(f"  broker kill failed: {exc!r}")
        self._halt.wait()  # the brokers die with this thread: keep it until stop()

    def _bounce(self, node: int, sig: signal.Signals) -> None:
        at = time.monotonic() - self.started
        self.log(f"  t={at:6.1f}s broker {node} {sig.name}")
        down = time.monotonic()
        self.cluster.kill(node, sig)
        self._halt.wait(self.outage_s)
        self.cluster.restart(node)
        deadline = time.monotonic() + IN_SYNC_WAIT_S
        while time.monotonic() < deadline and not self._halt.is_set():
            try:
                if self._in_sync():
                    break
            except Exception:
                pass
            self._halt.wait(0.5)
        down_s = round(time.monotonic() - down, 1)
        self.restarts.append(BrokerRestart(round(at, 1), f"{sig.name} broker {node}", down_s))
        self.log(f"  broker {node} back and in sync after {down_s}s")

    def wait_idle(self) -> None:
        """Return once no kill is under way (every broker up)."""
        with self._busy:
            pass

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(60)


def cluster_counts(killer: object) -> dict[str, int]:
    """``broker_kills``, ``leader_changes_seen``, ``coordinator_moves_seen`` of a cluster run."""
    if not isinstance(killer, ClusterKiller):
        return {}
    return {
        "broker_kills": sum(1 for r in killer.restarts if r.signal.startswith("SIGKILL")),
        "rolling_restarts": sum(1 for r in killer.restarts if r.signal.startswith("SIGTERM")),
        "leader_changes_seen": killer.watch.leader_changes,
        "coordinator_moves_seen": killer.watch.coordinator_moves,
    }
