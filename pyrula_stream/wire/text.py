"""Cutting text to a byte budget without breaking a UTF-8 character.

Tool results the model reads (``max_tool_result_bytes``) and event payloads
(``max_event_payload_bytes``) are cut the same way, with a marker that says how much was
shown; the journal always keeps the whole value.
"""

from __future__ import annotations


def truncate_utf8(text: str, max_bytes: int | None) -> str:
    """Cut ``text`` to ``max_bytes`` UTF-8 bytes at a character boundary, and say so."""
    if max_bytes is None:
        return text
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0 or None, got {max_bytes}")
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= max_bytes:
        return text
    cut = max_bytes
    while cut > 0 and encoded[cut] & 0xC0 == 0x80:  # step back off continuation bytes
        cut -= 1
    shown = encoded[:cut].decode("utf-8", "surrogatepass")
    return f"{shown}\n[truncated: showed {cut} of {len(encoded)} bytes]"
