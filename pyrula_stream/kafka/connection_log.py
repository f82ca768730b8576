"""One connection log per broker address for the whole process, fed by every client.

librdkafka retries a lost broker connection every few tens of milliseconds and logs each
failed attempt; a worker holds several clients, so an outage used to print thousands of
``Connection refused`` lines. Here every client's log and error callbacks feed one
``BrokerConnectionLog`` per broker address: one line when a broker goes away, at most one
reminder every ``REMINDER_S`` while it stays away, and one line when it is back (a TCP
probe of the address, as librdkafka reports no recoveries).
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from pyrula_stream.errors import BrokerUnavailableError

librdkafka_logger = logging.getLogger("pyrula_stream.librdkafka")

REMINDER_S = 10.0
"""At most one "still unreachable" line per broker this often."""

PROBE_S = 1.0
"""How often an unreachable broker's address is tried: how soon "is back" is noticed."""

_CONNECTION_ERRORS = frozenset(
    {KafkaError._TRANSPORT, KafkaError._RESOLVE, KafkaError._ALL_BROKERS_DOWN}
)
_BROKER_PREFIX = re.compile(r"(?:^|: )(?:[a-z_]+://)?([\w.\-]+:\d+)(?:/\w+)?: ")
"""``host:port/id: `` (a broker) or ``GroupCoordinator: host:port: `` (a coordinator);
librdkafka writes ``sasl_ssl://`` (``ssl://``, ...) before any broker not on PLAINTEXT."""


class BrokerConnectionLog:
    """The reachability of one broker address as this process sees it, logged sparingly.

    Down: the first failure of any client. Back: a TCP connection to the address succeeds
    (a probe thread tries every ``PROBE_S`` while it is down), since librdkafka reports
    failures but not recoveries.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self.down_since: float | None = None
        self.failures = 0
        self.last_detail = ""
        self._announced = False
        self._last_line = -REMINDER_S
        self._lock = threading.Lock()

    def failed(self, detail: str) -> None:
        with self._lock:
            now = time.monotonic()
            self.failures += 1
            self.last_detail = _short(detail)
            if self.down_since is None:
                self.down_since, self.failures = now, 1
                threading.Thread(
                    target=self._probe, name=f"pyrula-probe-{self.address}", daemon=True
                ).start()
            if now - self._last_line < REMINDER_S:
                return
            self._last_line = now
            if not self._announced:
                self._announced = True
                librdkafka_logger.warning(
                    "Kafka broker %s is unreachable (%s); retrying with backoff, "
                    "a reminder every %.0fs until it is back",
                    self.address,
                    self.last_detail,
                    REMINDER_S,
                )
            else:
                librdkafka_logger.warning(
                    "Kafka broker %s still unreachable after %.0fs (%d failed attempts; %s)",
                    self.address,
                    now - self.down_since,
                    self.failures,
                    self.last_detail,
                )

    def _probe(self) -> None:
        host, _, port = self.address.rpartition(":")
        while True:
            time.sleep(PROBE_S)
            try:
                socket.create_connection((host, int(port)), timeout=PROBE_S).close()
            except (OSError, ValueError):
                continue
            self.reachable()
            return

    def reachable(self) -> None:
        with self._lock:
            if self.down_since is None:
                return
            if self._announced:
                librdkafka_logger.warning(
                    "Kafka broker %s is reachable again after %.0fs",
                    self.address,
                    time.monotonic() - self.down_since,
                )
            self.down_since, self._announced = None, False


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


class ClientLogger:
    """What librdkafka calls with its log lines: connection failures go to the broker's
    connection log, everything else to ``pyrula_stream.librdkafka`` as it was."""

    def log(self, level: int, fmt: str, *args: Any) -> None:
        facility = str(args[0]) if args else ""
        text = str(args[-1]) if args else fmt
        if facility != "FAIL":
            librdkafka_logger.log(level, fmt, *args)
            return
        broker = _broker_of(text)
        if broker is not None and not _is_login_refusal(text):
            connection_log(broker).failed(text)
        else:  # a coordinator's copy without an address, or a refused login (error_cb's)
            librdkafka_logger.debug(fmt, *args)


def _is_login_refusal(text: str) -> bool:
    """A broker that answers and refuses the credentials is reachable: the error callback
    reports it (``KafkaAuthenticationError``), the connection log must not."""
    return "SASL authentication error" in text or "Authentication failed" in text


def on_client_error(err: KafkaError) -> None:
    """librdkafka's error callback (without one, a consumer returns these as records)."""
    if err.code() in _CONNECTION_ERRORS:
        broker = _broker_of(err.str())
        if broker is not None:
            connection_log(broker).failed(err.str())
        return  # "1/1 brokers are down" adds nothing to the per-broker lines
    level = logging.ERROR if err.fatal() else logging.WARNING
    librdkafka_logger.log(level, "Kafka client error: %s", err.str())
