"""The broker of a chaos run, and the thread that stops and restarts it mid-run.

With ``--broker-restarts N`` the harness runs its own broker on a fixed port and data
directory. The restarter stops it N times, spread over the submission window (the first
time with SIGKILL, then with SIGTERM for a clean shutdown), and starts it again on the same
port and data directory; workers and clients must reconnect by themselves.

The broker JVM is told to die with the thread that started it (``PR_SET_PDEATHSIG``), so
the restarter thread stays alive until ``stop()``, which the harness calls only once it has
read the topics back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pyrula_stream.errors import ConfigurationError
from pyrula_stream.kafka.local.broker import LocalBroker, free_port, start_local_broker
from pyrula_stream.kafka.local.cluster import LocalCluster, start_local_cluster
from pyrula_stream.testing import BOOTSTRAP_ENV, local_kafka


@dataclass
class BrokerRestart:
    at_s: float
    signal: str
    down_s: float


class OwnBroker:
    """A local broker on a fixed port and data directory; ``current`` after each restart."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.current: LocalBroker | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.current = start_local_broker(data_dir=self.data_dir, port=self.port)

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()


class BrokerRestarter(threading.Thread):
    """Runs a restart plan (seconds from its start) against an ``OwnBroker``."""

    def __init__(
        self,
        broker: OwnBroker,
        plan: list[float],
        all_done: Callable[[], bool],
        log: Callable[[str], None],
        *,
        outage_s: float = 2.0,
        min_up_s: float = 10.0,
    ) -> None:
        super().__init__(name="chaos-broker-restarter", daemon=True)
        self.broker = broker
        self.plan = plan
        self.all_done = all_done
        self.log = log
        self.outage_s = outage_s
        self.min_up_s = min_up_s
        """Up at least this long between restarts, so the workers do some work in between."""
        self.restarts: list[BrokerRestart] = []
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self._halt = threading.Event()
        self._busy = threading.Lock()

    def run(self) -> None:
        try:
            up_since = self.started
            for i, at in enumerate(self.plan):
                while (
                    time.monotonic() - self.started < at
                    or time.monotonic() - up_since < self.min_up_s
                ):
                    if self._halt.wait(0.05) or self.all_done():
                        break
                if self._halt.is_set() or self.all_done():
                    break
                self._restart(signal.SIGKILL if i == 0 else signal.SIGTERM)
                up_since = time.monotonic()
        except BaseException as exc:  # the harness reports it; the thread must stay alive
            self.error = exc
            self.log(f"  broker restart failed: {exc!r}")
        self._halt.wait()  # the broker dies with this thread: keep it until stop()

    def wait_idle(self) -> None:
        """Return once no restart is under way (the broker is up, or never went down)."""
        with self._busy:
            pass

    def _restart(self, sig: signal.Signals) -> None:
        with self._busy:
            self._restart_now(sig)

    def _restart_now(self, sig: signal.Signals) -> None:
        broker = self.broker.current
        assert broker is not None
        at = time.monotonic() - self.started
        self.log(f"  t={at:6.1f}s broker {sig.name} (pid {broker.pid})")
        down = time.monotonic()
        broker.halt(sig)
        self._halt.wait(self.outage_s)
        self.broker.start()
        down_s = round(time.monotonic() - down, 1)
        self.restarts.append(BrokerRestart(round(at, 1), sig.name, down_s))
        pid = self.broker.current.pid if self.broker.current else None
        self.log(f"  broker back on port {self.broker.port} after {down_s}s (pid {pid})")

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(60)


@contextlib.contextmanager
def run_broker(
    bootstrap_servers: str | None, *, restarts: int, brokers: int, run_dir: Path
) -> Iterator[tuple[str, OwnBroker | LocalCluster | None]]:
    """The given broker, else a local one; our own on a fixed port when it gets
    ``restarts``, our own cluster with ``brokers`` > 1."""
    if brokers > 1:
        if bootstrap_servers or os.environ.get(BOOTSTRAP_ENV):
            raise ConfigurationError(
                "--brokers needs the harness's own cluster: drop --bootstrap-servers "
                f"and ${BOOTSTRAP_ENV}"
            )
        cluster = start_local_cluster(brokers, data_dir=run_dir / "cluster")
        try:
            yield cluster.bootstrap_servers, cluster
        finally:
            cluster.stop()
    elif restarts:
        if bootstrap_servers or os.environ.get(BOOTSTRAP_ENV):
            raise ConfigurationError(
                "broker restarts need the harness's own broker: drop --bootstrap-servers "
                f"and ${BOOTSTRAP_ENV}"
            )
        own = OwnBroker(run_dir / "kafka")
        own.start()
        try:
            yield own.bootstrap_servers, own
        finally:
            own.stop()
    elif bootstrap_servers:
        yield bootstrap_servers, None
    else:
        with local_kafka() as bootstrap:
            yield bootstrap, None
