"""The ``--autoscale`` controller: KEDA's Kafka scaler and the HPA, as one thread.

Every ``poll_s`` it reads the lag KEDA's kafka scaler reads (``lag``: the consumer group's
committed offset against each partition's end, a partition without a commit counting
from its earliest offset, KEDA's ``offsetResetPolicy: earliest``), asks for
``desired_replicas`` (KEDA's rule), and changes the worker processes as a Deployment
would: up at once, down one worker per ``cooldown_s`` (the chart's scale-down policy,
the highest desire of the window winning, as the HPA's stabilization window does), with
SIGTERM, a worker counted gone only once its drain ended and it exited.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from pyrula_stream.chaos.processes import Worker
from pyrula_stream.kafka.config import new_consumer, reader_config
from pyrula_stream.kafka.offsets import committed_offset, watermarks


def desired_replicas(lag: int, threshold: int, partitions: int, low: int, high: int) -> int:
    """KEDA's rule: ``ceil(lag / threshold)`` workers, no more than the partitions (KEDA's
    ``allowIdleConsumers: false``) nor ``high``, no fewer than ``low``."""
    return max(low, min(math.ceil(lag / threshold), partitions, high))


def lag_reader(
    bootstrap: str, group_id: str, *, kafka_config: Mapping[str, Any] | None = None
) -> Consumer:
    """A consumer that asks as ``group_id`` (an OffsetFetch) but never joins or commits."""
    conf = reader_config(
        bootstrap,
        kafka_config=kafka_config,
        client_id=f"chaos-scaler-{uuid.uuid4().hex[:6]}",
        group_id=group_id,
    )
    return new_consumer(conf)


def lag(consumer: Consumer, topic: str, partitions: int, timeout_s: float = 10.0) -> int:
    """The sum over ``topic``'s partitions of end minus the group's committed offset
    (a coordinator still loading the group is asked again, as KEDA asks at its next poll)."""
    total = 0
    for p in range(partitions):
        low, high = watermarks(consumer, topic, p, timeout_s=timeout_s)
        committed = _committed(consumer, topic, p, timeout_s)
        total += max(0, high - (committed if committed is not None else low))
    return total


_COORDINATOR_MOVING = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)
"""Retriable in Kafka's protocol (a group's coordinator loading or moving), not flagged
so by librdkafka's ``committed``."""


def _committed(consumer: Consumer, topic: str, partition: int, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return committed_offset(consumer, topic, partition, timeout_s=timeout_s)
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is None or err.code() not in _COORDINATOR_MOVING:
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass
class ScaleEvent:
    at_s: float
    kind: str
    """``up`` (counted when started) or ``down`` (counted when the worker exited)."""
    replicas: int
    """Workers counted after the event."""
    lag: int
    detail: str = ""


class Scaler(threading.Thread):
    """Scales ``workers`` (a pool: index i is ``chaos-<i+1>``) on the lag ``read_lag`` gives."""

    def __init__(
        self,
        workers: list[Worker],
        read_lag: Callable[[], int],
        *,
        threshold: int,
        partitions: int,
        poll_s: float,
        cooldown_s: float,
        grace_s: float,
        say: Callable[[str], None],
    ) -> None:
        super().__init__(name="chaos-scaler", daemon=True)
        self.pool = workers
        self.read_lag = read_lag
        self.threshold = threshold
        self.partitions = partitions
        self.poll_s = poll_s
        self.cooldown_s = cooldown_s
        self.grace_s = grace_s
        self.say = say
        self.t0 = time.monotonic()
        self.running: list[Worker] = []
        """Counted workers, in start order (a scale-down stops the newest, as a
        StatefulSet does)."""
        self.leaving: list[Worker] = []
        self.events: list[ScaleEvent] = []
        self.samples: list[tuple[float, int, int]] = []
        """(monotonic time, lag, counted workers) at each poll."""
        self.pids: dict[int, str] = {}
        """Every worker process started: pid to worker id."""
        self.crashes: list[str] = []
        self.exit_codes: list[int | None] = []
        """Exit codes after the scale-down SIGTERMs (None: had to SIGKILL)."""
        self.errors: list[BaseException] = []
        self.read_errors: list[str] = []
        """Polls whose lag could not be read (KEDA's scaler then changes nothing)."""
        self.lock = threading.Lock()
        self._halt = threading.Event()
        self._last_change = 0.0
        self._leavers: list[threading.Thread] = []

    def at(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def start_worker(self) -> None:
        """Start the first pool worker neither counted nor leaving."""
        busy = {id(w) for w in self.running + self.leaving}
        w = next(w for w in self.pool if id(w) not in busy)
        w.start()
        assert w.pid is not None
        self.pids[w.pid] = w.worker_id
        self.running.append(w)

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                self.step()
                self._halt.wait(self.poll_s)
        except BaseException as exc:  # the harness reports it; the run then fails
            self.errors.append(exc)

    def step(self) -> None:
        now = time.monotonic()
        try:
            found = self.read_lag()
        except KafkaException as exc:  # KEDA keeps the replicas and asks at the next poll
            self.read_errors.append(f"t={self.at()}s {exc}")
            return
        with self.lock:
            self._restart_crashed()
            want = desired_replicas(found, self.threshold, self.partitions, 1, len(self.pool))
            self.samples.append((now, found, len(self.running)))
            window = [
                desired_replicas(lag, self.threshold, self.partitions, 1, len(self.pool))
                for t, lag, _ in self.samples
                if now - t <= self.cooldown_s
            ]
            have = len(self.running)
            if want > have:
                for _ in range(want - have):
                    self.start_worker()
                self._last_change = now
                self.events.append(ScaleEvent(self.at(), "up", want, found, f"{have} -> {want}"))
                self.say(f"  t={self.at():6.1f}s scale up {have} -> {want} (lag {found})")
            elif max(window) < have and now - self._last_change >= self.cooldown_s:
                self._last_change = now
                leaving = self.running.pop()
                self.leaving.append(leaving)
                self.say(
                    f"  t={self.at():6.1f}s scale down {have} -> {have - 1} (lag {found}): "
                    f"SIGTERM {leaving.worker_id} pid {leaving.pid}"
                )
                t = threading.Thread(target=self._drain, args=(leaving, found), daemon=True)
                self._leavers.append(t)
                t.start()

    def _drain(self, w: Worker, found: int) -> None:
        began = time.monotonic()
        code = w.stop(self.grace_s)
        with self.lock:
            self.leaving.remove(w)
            self.exit_codes.append(code)
            drained = round(time.monotonic() - began, 1)
            self.events.append(
                ScaleEvent(
                    self.at(),
                    "down",
                    len(self.running),
                    found,
                    f"{w.worker_id} exited {code} after {drained}s",
                )
            )
        self.say(f"  t={self.at():6.1f}s {w.worker_id} gone: exit {code} after {drained}s drain")

    def _restart_crashed(self) -> None:
        """A counted worker that exited on its own is a finding; restart it (as a pod)."""
        for w in self.running:
            if not w.alive():
                code = w.proc.returncode if w.proc is not None else None
                self.crashes.append(f"t={self.at()}s {w.worker_id} pid {w.pid} exited {code}")
                w.kill()
                w.start()
                assert w.pid is not None
                self.pids[w.pid] = w.worker_id

    def stop(self) -> None:
        """Stop polling and let the scale-downs under way finish."""
        self._halt.set()
        if self.is_alive():
            self.join(30)
        for t in self._leavers:
            t.join(self.grace_s + 30)
