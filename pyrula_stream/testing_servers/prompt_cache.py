"""Prompt caches kept by the local provider servers, by each provider's published rules.

A server built with ``prompt_cache=True`` reports the usage a real bill would show for
the request it received, instead of fixed numbers, so tests and the bench measure what
caching saves:

- Anthropic (``AnthropicPromptCache``): only a prefix ending at a ``cache_control``
  breakpoint is written (tools, then system, then messages, in that order); a later
  request reads the longest written prefix found at a breakpoint or at one of the 20
  block boundaries before it, while its TTL ("5m" or "1h", refreshed on each read) runs.
  A prefix shorter than the model's minimum (``min_cacheable_tokens``, the adapter's
  table of the published minimums) is not cached; more than four breakpoints is
  a 400, as on the API.
- OpenAI (``OpenAIPromptCache``): automatic; a prompt of 1,024 tokens or more reads the
  longest prefix it shares with a prompt seen before under the same model and
  ``prompt_cache_key``, in 1,024 + 128k token steps, for five minutes (24 hours with
  ``prompt_cache_retention="24h"``).

Tokens are counted as ``llm.tokens.text_tokens`` of each piece's compact JSON (about four
characters a token), the way the adapters estimate them.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream.llm.anthropic import min_cacheable_tokens
from pyrula_stream.llm.tokens import text_tokens

MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}

OPENAI_MINIMUM = 1024
OPENAI_INCREMENT = 128
OPENAI_RETENTION_SECONDS = {"in_memory": 300.0, "24h": 86400.0}


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


@dataclass
class _Entry:
    expires: float
    ttl: float


@dataclass(frozen=True)
class CacheUsage:
    """What one request is billed for its prompt, split as the provider reports it."""

    input_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_creation_1h_input_tokens: int = 0


class CacheRefused(ValueError):
    """A request the provider refuses for its cache markers (a 400)."""


@dataclass
class _Clocked:
    clock: Callable[[], float] = time.monotonic
    offset: float = 0.0

    def now(self) -> float:
        return self.clock() + self.offset

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass for the cache's TTLs (tests of expiry wait for nothing)."""
        self.offset += seconds


@dataclass
class AnthropicPromptCache(_Clocked):
    """Anthropic's explicit prompt cache: written at breakpoints, read at prefixes."""

    entries: dict[str, _Entry] = field(default_factory=dict)

    def usage(self, body: dict[str, Any]) -> CacheUsage:
        """Bill one Messages request and update the cache; ``CacheRefused`` if invalid."""
        blocks = _anthropic_blocks(body)
        marks = [i for i, b in enumerate(blocks) if b.ttl is not None]
        if len(marks) > MAX_BREAKPOINTS:
            raise CacheRefused(
                f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                f"Found {len(marks)}."
            )
        total = blocks[-1].cumulative if blocks else 0
        now = self.now()
        read_at = -1
        for mark in marks:  # the longest live prefix at or up to 20 blocks before a mark
            for i in range(mark, max(-1, mark - LOOKBACK_BLOCKS - 1), -1):
                entry = self.entries.get(blocks[i].digest)
                if entry is not None and entry.expires > now and i > read_at:
                    read_at = i
                    break
        read = blocks[read_at].cumulative if read_at >= 0 else 0
        if read_at >= 0:
            entry = self.entries[blocks[read_at].digest]
            entry.expires = now + entry.ttl
        minimum = min_cacheable_tokens(str(body.get("model", "")))
        written = written_1h = 0
        start = read
        for mark in marks:
            block = blocks[mark]
            if mark <= read_at or block.cumulative < minimum or block.ttl is None:
                continue
            ttl = TTL_SECONDS[block.ttl]
            self.entries[block.digest] = _Entry(now + ttl, ttl)
            written += block.cumulative - start
            if block.ttl == "1h":
                written_1h += block.cumulative - start
            start = block.cumulative
        return CacheUsage(total - read - written, read, written, written_1h)


@dataclass(frozen=True)
class _Block:
    cumulative: int
    digest: str
    ttl: str | None


def _anthropic_blocks(body: dict[str, Any]) -> list[_Block]:
    """The request's cacheable pieces in prefix order (tools, system, message blocks), each
    with the tokens up to and including it, the digest of that prefix and its mark."""
    pieces: list[tuple[str, Any]] = []
    pieces += [("tool", t) for t in body.get("tools") or []]
    system = body.get("system")
    if isinstance(system, str) and system:
        pieces.append(("system", {"type": "text", "text": system}))
    elif isinstance(system, list):
        pieces += [("system", b) for b in system]
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for index, block in enumerate(content or []):
            role = message.get("role", "") if index == 0 else ""
            pieces.append((f"message:{role}", block))
    digest = hashlib.sha256(str(body.get("model", "")).encode())
    blocks: list[_Block] = []
    tokens = 0
    for kind, piece in pieces:
        control = piece.get("cache_control") if isinstance(piece, dict) else None
        bare = {k: v for k, v in piece.items() if k != "cache_control"}
        text = _compact(bare)
        tokens += text_tokens(text)
        digest.update(kind.encode() + b"\0" + text.encode() + b"\0")
        ttl = None
        if isinstance(control, dict):
            ttl = str(control.get("ttl") or "5m")
            if ttl not in TTL_SECONDS:
                raise CacheRefused(f"cache_control.ttl must be '5m' or '1h', got {ttl!r}")
        blocks.append(_Block(tokens, digest.copy().hexdigest(), ttl))
    return blocks


@dataclass
class OpenAIPromptCache(_Clocked):
    """OpenAI's automatic prompt cache: the longest prefix seen before, in 128-token steps."""

    prompts: dict[tuple[str, str], list[tuple[str, float]]] = field(default_factory=dict)

    def usage(self, body: dict[str, Any]) -> tuple[int, int]:
        """``(prompt_tokens, cached_tokens)`` of one Chat Completions request."""
        # Tools first: OpenAI renders them ahead of the messages, so they are in the prefix.
        text = _compact(body.get("tools") or []) + _compact(body.get("messages") or [])
        prompt_tokens = text_tokens(text)
        key = (str(body.get("model", "")), str(body.get("prompt_cache_key") or ""))
        now = self.now()
        live = [(p, e) for p, e in self.prompts.get(key, []) if e > now]
        shared = max((_common_prefix(text, p) for p, _ in live), default=0)
        shared_tokens = min(shared // 4, prompt_tokens)
        cached = 0
        if prompt_tokens >= OPENAI_MINIMUM and shared_tokens >= OPENAI_MINIMUM:
            steps = (shared_tokens - OPENAI_MINIMUM) // OPENAI_INCREMENT
            cached = OPENAI_MINIMUM + OPENAI_INCREMENT * steps
        retention = OPENAI_RETENTION_SECONDS.get(
            str(body.get("prompt_cache_retention") or "in_memory"), 300.0
        )
        if prompt_tokens >= OPENAI_MINIMUM:
            live.append((text, now + retention))
        self.prompts[key] = live[-64:]
        return prompt_tokens, cached


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low
