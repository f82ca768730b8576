"""The caps of ``wire/caps.py``, checked by the client before it produces.

A worker dead-letters a record whose ids are past their caps; its sender would learn why
only from the dead letter, which a client role cannot read. So ``submit``, ``signal``,
``approve`` and the rest refuse such ids at once, with the worker's own words, and write
nothing (``OverCapError``, a ``UserError``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyrula_stream.errors import MalformedRecordError, OverCapError
from pyrula_stream.wire import caps
from pyrula_stream.wire.serde import TurnRequest
from pyrula_stream.wire.signals import Signal

TENANT_HEADER = "pyrula-tenant"
"""Lineage's ``tenant`` header (``wire/lineage.py``): the tenant a sub-agent request
inherits, which a worker refuses past its cap (one an agent's ``tenant=`` source names is
cut instead, so no other header is checked)."""

MAX_KEY_CHARS = max(caps.MAX_TURN_ID_CHARS, caps.MAX_THREAD_ID_CHARS)
"""A signal's record key: its turn's request key, a turn id or a thread id."""


def _check(value: str, cap: int, what: str, name: str) -> None:
    try:
        caps.check_text(value, cap, what, name)
    except MalformedRecordError as exc:
        raise OverCapError(
            f"{exc.message}: a worker would dead-letter it, so nothing was sent"
        ) from None


def check_request(request: TurnRequest, headers: Sequence[tuple[str, str | bytes | None]]) -> None:
    """Refuse a turn request whose turn id, thread id, idempotency key, inherited tenant
    or header count a worker would refuse (``headers``: every header it is sent with)."""
    _check(request.turn_id, caps.MAX_TURN_ID_CHARS, "turn_id", "MAX_TURN_ID_CHARS")
    if request.thread_id is not None:
        _check(request.thread_id, caps.MAX_THREAD_ID_CHARS, "thread_id", "MAX_THREAD_ID_CHARS")
    if request.idempotency_key is not None:
        _check(
            request.idempotency_key,
            caps.MAX_IDEMPOTENCY_KEY_CHARS,
            "idempotency_key",
            "MAX_IDEMPOTENCY_KEY_CHARS",
        )
    for name, value in headers:
        if name == TENANT_HEADER:
            tenant = value.decode("utf-8", "replace") if isinstance(value, bytes) else value or ""
            _check(tenant, caps.MAX_TENANT_CHARS, f"tenant ({TENANT_HEADER})", "MAX_TENANT_CHARS")
    if len(headers) > caps.MAX_HEADERS:
        raise OverCapError(
            f"turn request has {len(headers)} headers, over the cap of {caps.MAX_HEADERS} "
            "(MAX_HEADERS): a worker would dead-letter it, so nothing was sent"
        )


def check_signal(signal: Signal, key: str) -> None:
    """Refuse a signal (or an answer) whose turn id, signal id or record key (its turn's
    request key) a worker would refuse."""
    _check(signal.turn_id, caps.MAX_TURN_ID_CHARS, "turn_id", "MAX_TURN_ID_CHARS")
    _check(signal.signal_id, caps.MAX_SIGNAL_ID_CHARS, "signal_id", "MAX_SIGNAL_ID_CHARS")
    _check(key, MAX_KEY_CHARS, "the turn's key", "MAX_THREAD_ID_CHARS")


def check_turn_id(turn_id: str) -> None:
    """Refuse a control record (cancel, terminate) for a turn id past its cap."""
    _check(turn_id, caps.MAX_TURN_ID_CHARS, "turn_id", "MAX_TURN_ID_CHARS")
