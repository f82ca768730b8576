"""Caps on every id and count that comes from outside, in one place.

A record's size and nesting are checked by ``guard``; these bound what a readable record
may still claim: an id is a key on the journal, in a worker's memory and on its disk (a
70,000-character signal id once broke every restore of its partition), a header is
copied into every dead letter, a pending signal is held by its turn until a wait takes
it. Past a cap the
record is refused with ``MalformedRecordError`` whose message names the cap, so its dead
letter tells the sender what to change. ``docs/hostile-input.md`` lists them.
"""

from __future__ import annotations

from collections.abc import Sized

from pyrula_stream.errors import MalformedRecordError

MAX_TURN_ID_CHARS = 512
"""A turn id (a request's, a reply's parent or child, a signal's or control record's
turn): room for an id derived from a 249-character topic name and an offset."""

MAX_AGENT_NAME_CHARS = 249
"""An agent name in a reply (Kafka's own cap on a topic name, which holds it)."""

MAX_SIGNAL_ID_CHARS = 200
"""A signal's id (``new_signal`` writes 32 hex digits)."""

MAX_THREAD_ID_CHARS = 512
"""A request's thread id (with its principal, the key of its thread's record)."""

MAX_IDEMPOTENCY_KEY_CHARS = 512
"""A request's idempotency key (a journal key of its partition)."""

MAX_TENANT_CHARS = 200
"""A tenant id: a label and a key. One an agent's source names is cut to this; one a
sub-agent request inherits through ``pyrula-tenant`` is refused past it."""

MAX_HEADERS = 64
"""Headers on one record read from a turns, replies, signals or answers topic
(``call_agent`` writes under 20; every one is copied into the record's dead letter)."""

MAX_PENDING_SIGNALS = 256
"""Signals journaled for one turn that no wait has taken yet."""

MAX_PENDING_SIGNAL_BYTES = 1024 * 1024
"""The size of those pending signals' values together (each is rewritten with the turn's
journal while it is parked)."""


def check_text(value: str, cap: int, what: str, name: str) -> str:
    """``value`` when it is at most ``cap`` characters, else ``MalformedRecordError``
    naming the cap (``name``: the constant in this module)."""
    if len(value) > cap:
        raise MalformedRecordError(
            f"{what} is {len(value)} characters, over the cap of {cap} ({name})"
        )
    return value


def check_headers(headers: Sized, what: str) -> None:
    """Refuse a record with more than ``MAX_HEADERS`` headers."""
    if len(headers) > MAX_HEADERS:
        raise MalformedRecordError(
            f"{what} has {len(headers)} headers, over the cap of {MAX_HEADERS} (MAX_HEADERS)"
        )
