"""The life of a batch at a local provider, the same for every wire format.

A batch is accepted with its calls (each logged at once, before the reply: the outside
witness of how many times a call was submitted, by custom id and by ``call_digest``),
runs for ``delay_s`` seconds, then ends ``completed`` with every call answered by the
responder, or ``expired`` (the first ``answered`` calls answered, the rest not run), or
``cancelled`` (asked to stop: the calls not yet answered never run). A batch advances
when someone looks at it, so a test that sets ``delay_s`` sees exactly the states it asks
for, and a batch survives the clients that submitted it: it lives as long as the server
process.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pyrula_stream.testing_servers._http import CallLog
from pyrula_stream.testing_servers.answers import Answer, CallError, Prompt, Responder


def call_digest(body: dict[str, Any]) -> str:
    """A short hash of a call's request body: the same call sent again (under another
    custom id, in another batch, or live: streaming is left out) has the same digest."""
    call = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    canonical = json.dumps(call, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


class Ending(StrEnum):
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    FAILED = "failed"


class CallResult(StrEnum):
    SUCCEEDED = "succeeded"
    ERRORED = "errored"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


@dataclass
class BatchedCall:
    custom_id: str
    body: dict[str, Any]
    result: CallResult | None = None
    answer: Answer | None = None
    error: CallError | None = None


@dataclass
class Batch:
    """One batch as the provider holds it; ``meta`` keeps the wire format's own fields."""

    id: str
    created_at: float
    due_at: float
    calls: list[BatchedCall]
    meta: dict[str, Any] = field(default_factory=dict)
    ending: Ending | None = None
    ended_at: float | None = None
    cancel_requested_at: float | None = None
    expire_answering: int | None = None
    """Set when the batch is to expire at its due time: how many calls it answers first."""
    failure: str | None = None

    def count(self, result: CallResult) -> int:
        return sum(1 for c in self.calls if c.result is result)

    @property
    def ended(self) -> bool:
        return self.ending is not None


class BatchBook:
    """Every batch a server accepted, and the knobs a test turns.

    ``delay_s``: seconds from acceptance to the end. ``refuse_next``: refuse the next n
    batches as a whole. ``fail_ids``: custom ids answered
    with an error. ``expire_every``: every n-th accepted batch expires at its due time,
    half its calls answered. ``fail_every``: every n-th batched call is answered with an
    error. ``cancel_delay_s``: how long a cancelled batch stays "cancelling".
    """

    def __init__(
        self,
        provider: str,
        responder: Responder,
        *,
        delay_s: float = 0.2,
        id_prefix: str = "batch_",
        log: CallLog | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.provider = provider
        self.responder = responder
        self.delay_s = delay_s
        self.cancel_delay_s = 0.0
        self.expire_every = 0
        self.fail_every = 0
        self.fail_ids: set[str] = set()
        self.refuse_next = 0
        """How many of the next batches to refuse as a whole (see ``take_refusal``)."""
        self.submitted: list[tuple[str, str]] = []
        """(batch id, custom id) of every call ever accepted, in order."""
        self._id_prefix = id_prefix
        self._log = log
        self._clock = clock
        self._batches: dict[str, Batch] = {}
        self._lock = threading.RLock()
        self._answered = 0

    # -- what a wire format calls ---------------------------------------------------------

    def accept(self, calls: list[tuple[str, dict[str, Any]]], meta: dict[str, Any]) -> Batch:
        """A new batch of ``(custom_id, body)`` calls, logged before anyone learns its id."""
        now = self._clock()
        batch_id = f"{self._id_prefix}{uuid.uuid4().hex[:24]}"
        batch = Batch(
            batch_id,
            now,
            now + self.delay_s,
            [BatchedCall(cid, body) for cid, body in calls],
            dict(meta),
        )
        with self._lock:
            if self.expire_every and (len(self._batches) + 1) % self.expire_every == 0:
                batch.expire_answering = len(calls) // 2
            for cid, body in calls:
                self.submitted.append((batch_id, cid))
                if self._log is not None:
                    self._log.append(
                        {
                            "via": "batch",
                            "provider": self.provider,
                            "batch_id": batch_id,
                            "custom_id": cid,
                            "digest": call_digest(body),
                            "ts": now,
                            "pid": os.getpid(),
                        }
                    )
            self._batches[batch_id] = batch
        return batch

    def refuse(self, meta: dict[str, Any], reason: str) -> Batch:
        """A batch that failed as a whole (a bad input file): ended, no call run."""
        now = self._clock()
        batch = Batch(f"{self._id_prefix}{uuid.uuid4().hex[:24]}", now, now, [], dict(meta))
        batch.ending, batch.ended_at, batch.failure = Ending.FAILED, now, reason
        with self._lock:
            self._batches[batch.id] = batch
        return batch

    def take_refusal(self) -> bool:
        """Whether to refuse the batch being submitted (counts ``refuse_next`` down)."""
        with self._lock:
            if self.refuse_next > 0:
                self.refuse_next -= 1
                return True
            return False

    def get(self, batch_id: str) -> Batch | None:
        with self._lock:
            batch = self._batches.get(batch_id)
            if batch is not None:
                self._advance(batch)
            return batch

    def newest_first(self) -> list[Batch]:
        with self._lock:
            batches = sorted(self._batches.values(), key=lambda b: b.created_at, reverse=True)
            for batch in batches:
                self._advance(batch)
            return batches

    def cancel(self, batch_id: str) -> Batch | None:
        with self._lock:
            batch = self.get(batch_id)
            if batch is not None and not batch.ended and batch.cancel_requested_at is None:
                batch.cancel_requested_at = self._clock()
                self._advance(batch)
            return batch

    # -- what a test calls ---------------------------------------------------------------

    def expire(self, batch_id: str, *, answered: int = 0) -> None:
        """End the batch now as expired, its first ``answered`` calls answered."""
        with self._lock:
            batch = self._batches[batch_id]
            if not batch.ended:
                batch.expire_answering = answered
                batch.due_at = self._clock()
                self._advance(batch)

    def complete_now(self, batch_id: str | None = None) -> None:
        """End the batch (every running batch when ``None``) at the next look."""
        with self._lock:
            for batch in self._batches.values():
                if batch_id in (None, batch.id):
                    batch.due_at = min(batch.due_at, self._clock())

    def batch_ids(self) -> list[str]:
        with self._lock:
            return list(self._batches)

    # -- the life of a batch --------------------------------------------------------------

    def _advance(self, batch: Batch) -> None:
        if batch.ended:
            return
        now = self._clock()
        if batch.cancel_requested_at is not None:
            if now >= batch.cancel_requested_at + self.cancel_delay_s:
                self._end(batch, Ending.CANCELLED, answer=0, unanswered=CallResult.CANCELLED)
            return
        if now < batch.due_at:
            return
        if batch.expire_answering is not None:
            self._end(
                batch,
                Ending.EXPIRED,
                answer=batch.expire_answering,
                unanswered=CallResult.EXPIRED,
            )
        else:
            self._end(batch, Ending.COMPLETED, answer=len(batch.calls), unanswered=None)

    def _end(
        self, batch: Batch, ending: Ending, *, answer: int, unanswered: CallResult | None
    ) -> None:
        for index, call in enumerate(batch.calls):
            if index < answer:
                self._answer(call)
            elif unanswered is not None:
                call.result = unanswered
        batch.ending, batch.ended_at = ending, self._clock()

    def _answer(self, call: BatchedCall) -> None:
        self._answered += 1
        reply: Answer | CallError
        if call.custom_id in self.fail_ids or (
            self.fail_every and self._answered % self.fail_every == 0
        ):
            reply = CallError(500, "api_error", f"local server failed call {call.custom_id}")
        else:
            try:
                reply = self.responder(Prompt(self.provider, call.body, call.custom_id))
            except Exception as exc:  # a responder bug shows as that call's error
                reply = CallError(500, "api_error", f"responder raised {exc!r}")
        if isinstance(reply, CallError):
            call.result, call.error = CallResult.ERRORED, reply
        else:
            call.result, call.answer = CallResult.SUCCEEDED, reply
