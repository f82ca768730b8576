"""A blocking librdkafka call with a deadline that holds, given up early once an outage
that stalled it is over.

librdkafka does not always honour the timeout of a transactional call: when the group or
transaction coordinator goes away under it (a broker restart, a network partition) the
call can block for good (librdkafka issues #5456, #5511), and when it does return, it is
often only after its full timeout, long after the broker came back. So each call runs in a
thread of its own while the caller watches: past ``watch_after_s`` it asks the cluster,
with a short metadata request, whether it answers. A call still pending ``heal_grace_s``
after the cluster answers again, having not answered before, is given up at once (the
request it waits on was lost with the outage); any call is given up at ``timeout_s``. The
thread of a call given up is left behind (a daemon, one per outage); the others are kept
and reused, since starting a thread per call cost ~70 µs of CPU, twice per commit.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

WATCH_AFTER_S = 1.0
"""A call pending this long has its cluster asked whether it answers (every ~second)."""

HEAL_GRACE_S = 1.0
"""How long a call may still take after the cluster answered again following an outage."""


class CallAbandoned(Exception):
    """The call did not return in time; its thread is still blocked inside librdkafka."""


Job = tuple[Callable[[], object], list[tuple[bool, object]], threading.Event]


class _Caller:
    """A daemon thread that runs one call at a time, handed to it through a queue."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            call, outcome, done = self.jobs.get()
            try:
                outcome.append((True, call()))
            except BaseException as exc:
                outcome.append((False, exc))
            finally:
                done.set()


_idle: list[_Caller] = []
_idle_lock = threading.Lock()


def _take_caller() -> _Caller:
    with _idle_lock:
        if _idle:
            return _idle.pop()
    return _Caller("pyrula-kafka-call")


def _give_back(caller: _Caller) -> None:
    with _idle_lock:
        _idle.append(caller)


def call_with_deadline(
    call: Callable[[], T],
    what: str,
    *,
    timeout_s: float,
    answers: Callable[[], bool],
    watch_after_s: float = WATCH_AFTER_S,
    heal_grace_s: float = HEAL_GRACE_S,
) -> T:
    """``call()``'s result or exception; ``CallAbandoned`` when it is given up.

    ``answers`` says whether the cluster answers now (it blocks up to its own short
    timeout, which paces the watching).
    """
    outcome: list[tuple[bool, object]] = []
    done = threading.Event()
    caller = _take_caller()
    caller.jobs.put((call, outcome, done))
    started = time.monotonic()
    outage_at: float | None = None
    healed_at: float | None = None
    while True:
        elapsed = time.monotonic() - started
        pause = watch_after_s - elapsed if elapsed < watch_after_s else 0.2
        if done.wait(max(0.0, min(pause, timeout_s - elapsed))):
            break
        if time.monotonic() - started >= timeout_s:
            raise CallAbandoned(f"{what} did not return within {timeout_s:g}s")
        if time.monotonic() - started < watch_after_s:
            continue
        if not answers():
            if outage_at is None:
                outage_at = time.monotonic()
                log.warning("%s is waiting on a Kafka that does not answer", what)
            healed_at = None
        elif outage_at is not None:
            healed_at = healed_at or time.monotonic()
            if done.wait(max(0.0, healed_at + heal_grace_s - time.monotonic())):
                break
            raise CallAbandoned(
                f"{what} still pending {time.monotonic() - healed_at:.1f}s after Kafka "
                f"answered again (it did not for {healed_at - outage_at:.1f}s)"
            )
        elif done.wait(1.0):  # it answers: the call is slow, not stuck; look again later
            break
    _give_back(caller)  # only a caller whose call returned: an abandoned one stays blocked
    ok, value = outcome[0]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]
