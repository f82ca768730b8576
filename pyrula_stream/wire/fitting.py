"""Fitting records derived from outside bytes to the producer's limit before they are sent.

The broker takes a record batch up to its ``message.max.bytes``; a record that fitted there
can still be too large once we wrap it (a dead letter adds ``pyrula.dlq.*`` headers and a
``pyrula.original.`` prefix per header; a journal copy adds its envelope). librdkafka then
refuses it inside ``produce()`` (``MSG_SIZE_TOO_LARGE``), and the same input is read and
refused again forever. Sizes here count as librdkafka counts (``rd_kafka_msg_max_wire_size``:
the record's framing, key, value and serialized headers), with room for the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

RECORD_OVERHEAD = 36
"""librdkafka's largest framing of one record (``RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD``)."""

HEADER_OVERHEAD = 10
"""Two length varints per header, at most five bytes each."""

TRIMMED_HEADER = "pyrula.dlq.trimmed"
"""What fitting cut from a dead letter (absent when nothing was)."""

ORIGINAL_PREFIX = "pyrula.original."

KEY_KEPT = 256
"""The bytes of the key a reason-only dead letter keeps."""

REASON_KEPT = 1_000
"""The characters of the reason a reason-only dead letter keeps."""

_TRIMMED_ROOM = 160
"""Bytes set aside for the ``pyrula.dlq.trimmed`` header itself."""

Headers = Sequence[tuple[str, bytes]]


def record_room(message_max_bytes: int) -> int:
    """The bytes one record may take under a producer's ``message.max.bytes``: less the
    batch header (61 bytes) and what compressing an incompressible value may add (lz4,
    zstd: under 1 in 200), so that the broker's check of the batch passes too."""
    return message_max_bytes - message_max_bytes // 200 - 128


def wire_size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    """A record's size as librdkafka checks it against ``message.max.bytes``."""
    size = RECORD_OVERHEAD + len(key or b"") + len(value or b"")
    for name, data in headers:
        size += HEADER_OVERHEAD + len(name.encode()) + len(data or b"")
    return size


def fits(key: bytes | None, value: bytes | None, headers: Headers, max_bytes: int) -> bool:
    return wire_size(key, value, headers) <= max_bytes


def fit_letter(
    key: bytes,
    value: bytes | None,
    reason: Headers,
    original: Headers,
    max_bytes: int,
) -> tuple[bytes, bytes | None, list[tuple[str, bytes]]]:
    """A dead letter's key, value and headers cut to ``max_bytes``: the value first (its
    start is kept), then the original headers (the first are kept); if the ``reason``
    headers and key alone are still too large, a reason-only letter (no value, no original
    headers, the key and reason cut). What was cut is said in ``pyrula.dlq.trimmed``."""
    headers = [*reason, *original]
    size = wire_size(key, value, headers)
    if size <= max_bytes:
        return key, value, headers
    over = size + _TRIMMED_ROOM - max_bytes
    said: list[str] = []
    if value:
        kept = max(0, len(value) - over)
        said.append(f"value: kept {kept} of {len(value)} bytes")
        over -= len(value) - kept
        value = value[:kept]
    kept_headers = list(original)
    while over > 0 and kept_headers:
        name, data = kept_headers.pop()
        over -= HEADER_OVERHEAD + len(name.encode()) + len(data or b"")
    if len(kept_headers) < len(original):
        said.append(f"headers: kept {len(kept_headers)} of {len(original)}")
    if over <= 0:
        trimmed = (TRIMMED_HEADER, "; ".join(said).encode())
        return key, value, [*reason, trimmed, *kept_headers]
    return _reason_only(key, reason, original, max_bytes)


def _reason_only(
    key: bytes, reason: Headers, original: Headers, max_bytes: int
) -> tuple[bytes, bytes | None, list[tuple[str, bytes]]]:
    """Only why, where and who: the letter's key and reason headers were too large."""
    said = f"reason-only: value and {len(original)} original headers dropped"
    if len(key) > KEY_KEPT:
        said += f"; key: kept {KEY_KEPT} of {len(key)} bytes"
    budget = max(0, (max_bytes - RECORD_OVERHEAD - KEY_KEPT - _TRIMMED_ROOM) // max(1, len(reason)))
    cut = [(name, _cut_text(data, min(REASON_KEPT, budget))) for name, data in reason]
    return key[:KEY_KEPT], None, [*cut, (TRIMMED_HEADER, said.encode())]


def _cut_text(data: bytes, limit: int) -> bytes:
    """At most ``limit`` bytes of UTF-8 text, never half a character."""
    return data[:limit].decode("utf-8", "ignore").encode()
