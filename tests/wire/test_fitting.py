"""Dead letters cut to the producer's room: value first, then headers, else reason-only;
what was cut is said in ``pyrula.dlq.trimmed``."""

from __future__ import annotations

from pyrula_stream.errors import ErrorCode
from pyrula_stream.wire.fitting import TRIMMED_HEADER, record_room, wire_size
from pyrula_stream.wire.records import OutRecord, dead_letter

ROOM = 10_000


def _letter(key: bytes, value: bytes | None, headers: list[tuple[str, bytes]]) -> OutRecord:
    return dead_letter(
        "a.dlq",
        "value does not decode",
        ErrorCode.INVALID_REQUEST,
        worker="w1",
        key=key,
        value=value,
        headers=headers,
        max_bytes=ROOM,
        source="a.turns[0]@7",
    )


def _size(rec: OutRecord) -> int:
    return wire_size(rec.key, rec.value, rec.headers)


def test_a_letter_that_fits_is_kept_whole_and_says_nothing_was_cut() -> None:
    letter = _letter(b"k", b"v" * 100, [("h", b"1")])
    assert letter.value == b"v" * 100
    assert ("pyrula.original.h", b"1") in letter.headers
    assert TRIMMED_HEADER not in dict(letter.headers)


def test_the_value_is_cut_first_and_its_start_kept() -> None:
    value = bytes(range(256)) * 100
    letter = _letter(b"k", value, [("h", b"1")])
    said = dict(letter.headers)[TRIMMED_HEADER].decode()
    assert _size(letter) <= ROOM
    assert letter.value is not None and value.startswith(letter.value)
    assert said == f"value: kept {len(letter.value)} of {len(value)} bytes"
    assert ("pyrula.original.h", b"1") in letter.headers  # headers kept while the value gives


def test_then_the_last_headers_are_dropped() -> None:
    headers = [(f"h{i:03d}", b"x" * 40) for i in range(300)]
    letter = _letter(b"k", b"v" * 1_000, headers)
    meta = dict(letter.headers)
    kept = [k for k, _ in letter.headers if k.startswith("pyrula.original.")]
    assert _size(letter) <= ROOM
    assert letter.value == b""
    assert 0 < len(kept) < 300
    assert kept == [f"pyrula.original.h{i:03d}" for i in range(len(kept))]
    assert meta[TRIMMED_HEADER].decode() == (
        f"value: kept 0 of 1000 bytes; headers: kept {len(kept)} of 300"
    )
    assert meta["pyrula.dlq.reason"] == b"value does not decode"


def test_a_key_too_large_leaves_a_reason_only_letter() -> None:
    letter = _letter(b"k" * 50_000, b"v", [("h", b"1")])
    meta = dict(letter.headers)
    assert _size(letter) <= ROOM
    assert letter.value is None
    assert letter.key == b"k" * 256
    assert not [k for k in meta if k.startswith("pyrula.original.")]
    assert meta["pyrula.dlq.reason"] == b"value does not decode"
    assert meta["pyrula.dlq.source"] == b"a.turns[0]@7"
    assert meta[TRIMMED_HEADER].decode() == (
        "reason-only: value and 1 original headers dropped; key: kept 256 of 50000 bytes"
    )


def test_the_room_leaves_space_for_the_batch_and_compression() -> None:
    assert record_room(1_048_576) < 1_048_576 - 61 - 1_048_576 // 255
