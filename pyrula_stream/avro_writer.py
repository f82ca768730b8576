"""Avro's binary encoding of longs and strings, for the one record written on every step.

An event's first three fields (type, turn id, agent) are the same for many events, so
their bytes are built once and only the rest (seq, time, attempt, data) per event: less
than half the time of fastavro's schemaless writer, which walks the schema for every
record. The bytes are the same as fastavro's (``tests/test_avro_writer.py`` holds the two
against each other, and ``EVENT_FIELDS`` against ``schemas/event.avsc``).
"""

from __future__ import annotations

_ONE_BYTE = tuple(bytes((i,)) for i in range(128))

EVENT_FIELDS = ("type", "turn_id", "agent", "seq", "ts_ms", "attempt", "data")
"""The fields of ``schemas/event.avsc`` in their order, as ``event_value`` writes them."""


def avro_long(n: int) -> bytes:
    """An Avro ``int`` or ``long``: zigzag, then seven bits a byte, low bits first."""
    z = (n << 1) ^ (n >> 63)
    if z < 0x80:
        return _ONE_BYTE[z]
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def avro_string(text: str) -> bytes:
    """An Avro ``string``: its UTF-8 length as a long, then the bytes."""
    raw = text.encode()
    return avro_long(len(raw)) + raw


_last_ts: tuple[int, bytes] = (0, _ONE_BYTE[0])
"""The last event time encoded: events of one millisecond share it (a long of six bytes)."""


def event_value(head: bytes, seq: int, ts_ms: int, attempt: int, data: str) -> bytes:
    """An ``Event`` record; ``head`` is ``avro_string`` of its type, turn id and agent."""
    global _last_ts
    last = _last_ts  # one read: another thread's loop may replace it meanwhile
    if last[0] != ts_ms:
        last = _last_ts = (ts_ms, avro_long(ts_ms))
    raw = data.encode()
    return b"".join((head, avro_long(seq), last[1], avro_long(attempt), avro_long(len(raw)), raw))
