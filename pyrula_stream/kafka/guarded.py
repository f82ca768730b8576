"""A consumer that cannot be closed under a thread that is still polling it.

librdkafka frees a consumer's queues on ``close()``; a ``poll()`` or ``consume()`` running
at that moment in another thread reads freed memory and the process dies (SIGSEGV or a
librdkafka assertion, SIGABRT; seen with confluent-kafka 2.12). It happens whenever an
asyncio task that awaits ``asyncio.to_thread(consumer.poll, ...)`` is cancelled: the task
ends, the thread keeps polling, and the code after the cancellation closes the consumer.

``GuardedConsumer`` counts the calls in flight; ``close()`` refuses new calls, waits for
the ones running (each is bounded by its own timeout), then closes. A call after close
raises ``RuntimeError("Consumer closed")``, as confluent-kafka's own closed consumer does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Consumer, Message

from pyrula_stream.errors import KafkaAuthenticationError


class GuardedConsumer(Consumer):
    """``Consumer`` whose ``close()`` waits for every ``poll``/``consume`` in flight."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self._guard = threading.Condition()
        self._in_flight: dict[int, int] = {}  # thread id -> calls in flight
        self._closing = False

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        with self._guard:
            if self._closing:
                raise RuntimeError("Consumer closed")
            me = threading.get_ident()
            self._in_flight[me] = self._in_flight.get(me, 0) + 1
        try:
            yield
        finally:
            with self._guard:
                self._in_flight[me] -= 1
                if not self._in_flight[me]:
                    del self._in_flight[me]
                self._guard.notify_all()

    def calls_in_flight(self) -> int:
        """How many ``poll``/``consume`` calls are running now, in any thread."""
        with self._guard:
            return sum(self._in_flight.values())

    def poll(self, timeout: float = -1) -> Message | None:
        with self._call():
            return super().poll(timeout)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        with self._call():
            return super().consume(num_messages, timeout)

    def close(self) -> None:
        """Refuse new polls, wait for the running ones, then close (once)."""
        with self._guard:
            if self._closing:
                return
            self._closing = True
            # A rebalance callback runs inside this thread's own poll: never wait on it.
            me = threading.get_ident()
            self._guard.wait_for(lambda: not (self._in_flight.keys() - {me}))
        # A refused login still queued is served by close(); the call that failed on it
        # has raised it already, and closing must not raise it again.
        with contextlib.suppress(KafkaAuthenticationError):
            super().close()
