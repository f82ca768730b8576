"""The one guarded path for decoding bytes that came from outside.

Records, headers, model output and MCP results are written by someone else. Whatever they
hold, decoding them must raise nothing but ``MalformedRecordError``: a ``RecursionError``
from JSON nested past the parser's stack, a ``MemoryError`` from a length prefix, an
over-long number (Python refuses to convert more than ``sys.get_int_max_str_digits()``
digits) or invalid UTF-8 would otherwise pass every ``except ValueError`` and kill the
worker, and every worker that takes the partition next. Size and nesting depth are
checked before the parser runs, with a byte scan that costs nothing for shallow values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, TypeVar

from pyrula_stream.errors import MalformedRecordError

T = TypeVar("T")

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_DEPTH = 128


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Caps checked before a value from outside is parsed.

    ``max_bytes`` (16 MiB) bounds one record's value or one JSON text; ``max_depth`` (128)
    bounds how deeply arrays and objects nest, far below the parser's recursion limit and
    far above what tool arguments or agent params need.
    """

    max_bytes: int = DEFAULT_MAX_BYTES
    max_depth: int = DEFAULT_MAX_DEPTH


DEFAULT_LIMITS = DecodeLimits()

_STRING_B = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS_B = re.compile(rb"[^\[\]{}]+")
_OPEN = frozenset(b"[{")


def _text_bytes(data: bytes | bytearray | str) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8", "surrogatepass")
    return bytes(data)


def json_depth(data: bytes | bytearray | str) -> int:
    """How deeply arrays and objects nest in ``data`` (brackets inside strings ignored).

    An unterminated string counts its brackets: such text fails to parse anyway.
    """
    raw = _text_bytes(data)
    if raw.count(b"[") + raw.count(b"{") == 0:
        return 0
    brackets = _BRACKETS_B.sub(b"", _STRING_B.sub(b"", raw))
    # Every bracket may sit inside a string (a JSON string of 300 "["): nothing to count.
    return max(accumulate((1 if b in _OPEN else -1 for b in brackets), initial=0))


def check_size(data: bytes | bytearray | str | None, what: str, limits: DecodeLimits) -> None:
    """Refuse a value over ``limits.max_bytes`` before anything reads it."""
    if data is not None and len(data) > limits.max_bytes:
        raise MalformedRecordError(
            f"{what} is {len(data)} bytes, over the decode limit of {limits.max_bytes} "
            "(DecodeLimits.max_bytes)"
        )


def check_depth(data: bytes | bytearray | str, what: str, limits: DecodeLimits) -> None:
    """Refuse JSON nested deeper than ``limits.max_depth`` before the parser recurses."""
    raw = _text_bytes(data)
    # Fewer opening brackets than the cap cannot nest past it: no scan needed.
    if raw.count(b"[") + raw.count(b"{") <= limits.max_depth:
        return
    depth = json_depth(raw)
    if depth > limits.max_depth:
        raise MalformedRecordError(
            f"{what} is JSON nested deeper than {limits.max_depth} levels ({depth}; "
            "DecodeLimits.max_depth)"
        )


def loads(
    data: bytes | bytearray | str | None, what: str, limits: DecodeLimits = DEFAULT_LIMITS
) -> Any:
    """``json.loads`` of outside text: any failure is ``MalformedRecordError`` naming
    ``what`` and why."""
    if data is None:
        raise MalformedRecordError(f"{what} is missing (null)")
    if not isinstance(data, bytes | bytearray | str):
        raise MalformedRecordError(f"{what} is {type(data).__name__}, not JSON text")
    try:  # ``guarded(what)`` inline: a generator context costs more than a small parse
        check_size(data, what, limits)
        check_depth(data, what, limits)
        # Strict UTF-8 first (a BOM allowed, as before): ``json.loads`` of bytes decodes
        # with "surrogatepass", so an encoded surrogate (ED A0 80) would become a string
        # that no encoder writes back.
        text = data if isinstance(data, str) else bytes(data).decode("utf-8-sig")
        value = json.loads(text)
    except MalformedRecordError:
        raise
    except Exception as exc:
        raise MalformedRecordError(f"{what} cannot be read: {_reason(exc)}") from None
    if _SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogates(value, what)
    return value


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a surrogate (D800 to DFFF): only these leave one in parsed JSON."""


def _refuse_lone_surrogates(value: Any, what: str) -> None:
    """A lone surrogate (the escape of D800 without its pair) is valid JSON but no text:
    encoding it back, in an event or the journal, raises ``UnicodeEncodeError`` long
    after the decode."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise MalformedRecordError(
                    f"{what} holds a lone surrogate (\\u{ord(item[exc.start]):04x}), "
                    "which is not text"
                ) from None


def loads_object(
    data: bytes | bytearray | str | None, what: str, limits: DecodeLimits = DEFAULT_LIMITS
) -> dict[str, Any]:
    """``loads`` that must give a JSON object."""
    value = loads(data, what, limits)
    if not isinstance(value, dict):
        raise MalformedRecordError(f"{what} must be a JSON object, not {_kind(value)}")
    return value


def utf8(data: bytes | bytearray | None, what: str) -> str:
    """Strict UTF-8 text of outside bytes (``None`` is refused)."""
    if data is None:
        raise MalformedRecordError(f"{what} is missing (null)")
    with guarded(what):
        return bytes(data).decode("utf-8")


@contextmanager
def guarded(what: str) -> Iterator[None]:
    """Turn any exception raised while reading ``what`` into ``MalformedRecordError``.

    ``Exception`` covers ``RecursionError`` and ``MemoryError`` too; only
    ``BaseException`` (cancellation, ``KeyboardInterrupt``, ``SystemExit``) goes through.
    """
    try:
        yield
    except MalformedRecordError:
        raise
    except Exception as exc:
        raise MalformedRecordError(f"{what} cannot be read: {_reason(exc)}") from None


def decode(what: str, fn: Callable[[], T]) -> T:
    """``fn()`` under ``guarded(what)``: the decoder's own checks, any slip caught."""
    with guarded(what):
        return fn()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "RecursionError: nested too deeply to parse"
    if isinstance(exc, MemoryError):
        return "MemoryError: the value claims more memory than is available"
    if isinstance(exc, UnicodeDecodeError):
        return f"not valid UTF-8 ({exc.reason} at byte {exc.start})"
    text = str(exc)
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{type(exc).__name__}: {text}"


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def text_field(body: dict[str, Any], name: str, what: str) -> str | None:
    """An optional text field (``None`` when absent or null)."""
    value = body.get(name)
    if value is None or isinstance(value, str):
        return value
    raise MalformedRecordError(f"{what}: field {name!r} must be text, not {_kind(value)}")


def int_field(body: dict[str, Any], name: str, what: str, default: int = 0) -> int:
    """An optional integer field (``default`` when absent or null); text is not a number."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedRecordError(f"{what}: field {name!r} must be an integer, not {_kind(value)}")
    return value


def dict_field(body: dict[str, Any], name: str, what: str) -> dict[str, Any]:
    """An optional object field (``{}`` when absent or null)."""
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedRecordError(f"{what}: field {name!r} must be an object, not {_kind(value)}")
    return value


def bad_record_reason(exc: BaseException) -> str:
    """The dead-letter reason of a record whose reading raised ``exc``: our own message for
    ``MalformedRecordError``, else the exception's type and text (a decoder slipped)."""
    if isinstance(exc, MalformedRecordError):
        return str(exc)
    return f"unreadable record: {_reason(exc)}"
