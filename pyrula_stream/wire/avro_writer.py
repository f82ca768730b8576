"""Avro's binary encoding by hand, for the records a worker writes on every turn.

Our schemas hold only strings, ints, longs, doubles and nullable strings, so a writer
built once per schema (``record_writer``) is one call of a small encoder per field: a
fraction of the time of fastavro's schemaless writer, which walks the schema and checks
each union for every record. An event's first three fields (type, turn id, agent) are
the same for many events, so their bytes are built once and only the rest (seq, time,
attempt, data) per event (``event_value``). The bytes are fastavro's:
``tests/wire/test_avro_writer.py`` holds the two against each other for every schema,
and ``EVENT_FIELDS`` against ``schemas/event.avsc``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

_ONE_BYTE = tuple(bytes((i,)) for i in range(128))

EVENT_FIELDS = ("type", "turn_id", "agent", "seq", "ts_ms", "attempt", "data")
"""The fields of ``schemas/event.avsc`` in their order, as ``event_value`` writes them."""


_CONTINUED = tuple(sum(0x80 << (8 * i) for i in range(k - 1)) for k in range(9))
"""For a long of ``k`` bytes, the continuation bit of each byte but the last."""


def _zigzag_long(n: int) -> bytes:
    """An Avro ``int`` or ``long``: zigzag, then seven bits a byte, low bits first.

    Up to 56 bits (a time in milliseconds has 41) the groups are spread into bytes by a
    fixed sum of shifts, not a loop over a ``bytearray``: a third of the time."""
    z = (n << 1) ^ (n >> 63)
    if z < 0x80:
        return _ONE_BYTE[z]
    if z >> 56:
        out = bytearray()
        while z > 0x7F:
            out.append((z & 0x7F) | 0x80)
            z >>= 7
        out.append(z)
        return bytes(out)
    spread = (
        (z & 0x7F)
        | ((z & 0x3F80) << 1)
        | ((z & 0x1FC000) << 2)
        | ((z & 0xFE00000) << 3)
        | ((z & 0x7F0000000) << 4)
        | ((z & 0x3F800000000) << 5)
        | ((z & 0x1FC0000000000) << 6)
        | ((z & 0xFE000000000000) << 7)
    )
    size = (z.bit_length() + 6) // 7
    return (spread | _CONTINUED[size]).to_bytes(size, "little")


SMALL_LONGS = 1024
_SMALL_LONGS = tuple(_zigzag_long(n) for n in range(SMALL_LONGS))
"""``avro_long`` of 0 to 1023, built once: seqs, attempts and most lengths of strings and
event data are among them, and a lookup is a fraction of the loop."""


def avro_long(n: int) -> bytes:
    """An Avro ``int`` or ``long`` (``_zigzag_long``; small ones from a table)."""
    if 0 <= n < SMALL_LONGS:
        return _SMALL_LONGS[n]
    return _zigzag_long(n)


def avro_string(text: str) -> bytes:
    """An Avro ``string``: its UTF-8 length as a long, then the bytes."""
    raw = text.encode()
    size = len(raw)
    return (_SMALL_LONGS[size] if size < SMALL_LONGS else _zigzag_long(size)) + raw


_last_ts: tuple[int, bytes] = (0, _ONE_BYTE[0])
"""The last event time encoded: events of one millisecond share it (a long of six bytes)."""


def event_value(head: bytes, seq: int, ts_ms: int, attempt: int, data: bytes) -> bytes:
    """An ``Event`` record; ``head`` is ``avro_string`` of its type, turn id and agent;
    ``data`` its JSON as UTF-8."""
    global _last_ts
    last = _last_ts  # one read: another thread's loop may replace it meanwhile
    if last[0] != ts_ms:
        last = _last_ts = (ts_ms, avro_long(ts_ms))
    size = len(data)
    return b"".join(
        (
            head,
            _SMALL_LONGS[seq] if 0 <= seq < SMALL_LONGS else avro_long(seq),
            last[1],
            _SMALL_LONGS[attempt] if 0 <= attempt < SMALL_LONGS else avro_long(attempt),
            _SMALL_LONGS[size] if size < SMALL_LONGS else avro_long(size),
            data,
        )
    )


_DOUBLE = struct.Struct("<d")


def _avro_double(x: float) -> bytes:
    return _DOUBLE.pack(x)


def _nullable_string(text: str | None) -> bytes:
    """The union ``["null", "string"]``: branch 0 (null) or branch 1 and the string."""
    if text is None:
        return b"\x00"
    return b"\x02" + avro_string(text)


_ENCODERS: dict[Any, Callable[[Any], bytes]] = {
    "string": avro_string,
    "int": avro_long,
    "long": avro_long,
    "double": _avro_double,
    ("null", "string"): _nullable_string,
}


def record_writer(schema: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bytes]:
    """A function writing a dict of ``schema``'s fields (a record of primitive and
    nullable-string fields) as schemaless Avro; ``ValueError`` for any other schema,
    whose records stay with fastavro.

    The function is one expression over the fields, compiled once per schema (as
    ``dataclasses`` builds ``__init__``): a loop over a list of encoders cost a third
    more for every record (a result record has 15 fields)."""
    namespace: dict[str, Any] = {}
    parts: list[str] = []
    for i, field in enumerate(schema["fields"]):
        kind = field["type"]
        encoder = _ENCODERS.get(tuple(kind) if isinstance(kind, list) else kind)
        if encoder is None:
            raise ValueError(f"field {field['name']!r} of type {kind!r} has no hand encoder")
        namespace[f"_e{i}"] = encoder
        parts.append(f"_e{i}(body[{str(field['name'])!r}])")
    source = f"def write(body):\n    return b''.join(({', '.join(parts)},))\n"
    exec(source, namespace)  # our own schemas' field names, as repr literals
    write: Callable[[Mapping[str, Any]], bytes] = namespace["write"]
    return write
