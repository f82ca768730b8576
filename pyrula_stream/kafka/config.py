"""Client configuration shared by every producer, consumer and admin client we create.

librdkafka retries a lost broker connection every few tens of milliseconds and logs each
failed attempt; a worker holds several clients, so an outage used to print thousands of
``Connection refused`` lines. Here every client's log and error callbacks feed one
``BrokerConnectionLog`` per broker address for the whole process: one line when a broker
goes away, at most one reminder every ``REMINDER_S`` while it stays away, and one line when
it is back (seen in the clients' statistics, which report each broker's state).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from pyrula_stream.errors import BrokerUnavailableError

librdkafka_logger = logging.getLogger("pyrula_stream.librdkafka")

REMINDER_S = 10.0
"""At most one "still unreachable" line per broker this often."""

STATS_INTERVAL_MS = 2_000
"""How often clients report broker states: how soon "is back" is noticed."""

_CONNECTION_ERRORS = frozenset(
    {KafkaError._TRANSPORT, KafkaError._RESOLVE, KafkaError._ALL_BROKERS_DOWN}
)
_BROKER_PREFIX = re.compile(r"(?:^|: )([\w.\-]+:\d+)(?:/\w+)?: ")
"""``host:port/id: `` (a broker) or ``GroupCoordinator: host:port: `` (a coordinator)."""


class BrokerConnectionLog:
    """The reachability of one broker address as this process sees it, logged sparingly."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.down_since: float | None = None
        self.failures = 0
        self.last_detail = ""
        self._last_line = 0.0
        self._lock = threading.Lock()

    def failed(self, detail: str) -> None:
        with self._lock:
            now = time.monotonic()
            self.failures += 1
            self.last_detail = _short(detail)
            if self.down_since is None:
                self.down_since = self._last_line = now
                self.failures = 1
                librdkafka_logger.warning(
                    "Kafka broker %s is unreachable (%s); retrying with backoff, "
                    "a reminder every %.0fs until it is back",
                    self.address,
                    _short(detail),
                    REMINDER_S,
                )
            elif now - self._last_line >= REMINDER_S:
                self._last_line = now
                librdkafka_logger.warning(
                    "Kafka broker %s still unreachable after %.0fs (%d failed attempts; %s)",
                    self.address,
                    now - self.down_since,
                    self.failures,
                    _short(detail),
                )

    def reachable(self) -> None:
        with self._lock:
            if self.down_since is None:
                return
            librdkafka_logger.warning(
                "Kafka broker %s is reachable again after %.0fs",
                self.address,
                time.monotonic() - self.down_since,
            )
            self.down_since = None


_logs: dict[str, BrokerConnectionLog] = {}
_logs_lock = threading.Lock()


def connection_log(address: str) -> BrokerConnectionLog:
    """The process-wide connection log of one broker address (``host:port``)."""
    with _logs_lock:
        found = _logs.get(address)
        if found is None:
            found = _logs[address] = BrokerConnectionLog(address)
        return found


def unreachable_reason(bootstrap_servers: str) -> str | None:
    """Why the brokers of ``bootstrap_servers`` cannot be reached, when none of them can."""
    addresses = [a.strip() for a in bootstrap_servers.split(",") if a.strip()]
    with _logs_lock:
        logs = [_logs.get(a) for a in addresses]
    if not logs or any(log is None or log.down_since is None for log in logs):
        return None
    return "; ".join(sorted({log.last_detail for log in logs if log is not None}))


def is_connection_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says Kafka could not be reached (worth waiting for), not a bug."""
    if isinstance(exc, BrokerUnavailableError):
        return True
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return (
        isinstance(err, KafkaError)
        and not err.fatal()
        and (
            err.retriable()
            or err.code() in _CONNECTION_ERRORS
            or err.code() == KafkaError._TIMED_OUT
        )
    )


def _short(detail: str) -> str:
    """``Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms ...)`` → the
    reason, which is what a person needs."""
    text = detail.split(" (after ", 1)[0]
    return text.rsplit("failed: ", 1)[-1]


def _broker_of(text: str) -> str | None:
    match = _BROKER_PREFIX.search(text)
    return match.group(1) if match else None


class _ClientLogger:
    """What librdkafka calls with its log lines: connection failures go to the broker's
    connection log, everything else to ``pyrula_stream.librdkafka`` as it was."""

    def log(self, level: int, fmt: str, *args: Any) -> None:
        facility = str(args[0]) if args else ""
        text = str(args[-1]) if args else fmt
        if facility != "FAIL":
            librdkafka_logger.log(level, fmt, *args)
            return
        broker = _broker_of(text)
        if broker is not None:
            connection_log(broker).failed(text)
        else:  # a coordinator's copy of a broker's failure, without its address
            librdkafka_logger.debug(fmt, *args)


def _on_error(err: KafkaError) -> None:
    """librdkafka's error callback (without one, a consumer returns these as records)."""
    if err.code() in _CONNECTION_ERRORS:
        broker = _broker_of(err.str())
        if broker is not None:
            connection_log(broker).failed(err.str())
        return  # "1/1 brokers are down" adds nothing to the per-broker lines
    level = logging.ERROR if err.fatal() else logging.WARNING
    librdkafka_logger.log(level, "Kafka client error: %s", err.str())


def _on_stats(stats_json: str) -> None:
    """Marks brokers this client is connected to as reachable (only while one is down)."""
    if not any(log.down_since is not None for log in list(_logs.values())):
        return
    try:
        brokers = json.loads(stats_json).get("brokers", {})
    except ValueError:
        return
    for broker in brokers.values():
        if broker.get("state") == "UP" and broker.get("nodename") in _logs:
            _logs[broker["nodename"]].reachable()


def base_config(bootstrap_servers: str, **overrides: Any) -> dict[str, Any]:
    """Bootstrap, low-latency socket and retry settings, librdkafka's logs into Python's."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "logger": _ClientLogger(),
        "log_level": 3,
        "error_cb": _on_error,
        "stats_cb": _on_stats,
        "statistics.interval.ms": STATS_INTERVAL_MS,
        # Small requests (transaction control, offsets) must not wait on Nagle's algorithm,
        # and a transaction that follows another is retried at once while the previous
        # one's markers land (CONCURRENT_TRANSACTIONS); together ~114 ms -> ~14 ms a commit.
        "socket.nagle.disable": True,
        "retry.backoff.ms": 1,
        "retry.backoff.max.ms": 50,
    }
    conf.update({k.replace("_", "."): v for k, v in overrides.items()})
    return conf
