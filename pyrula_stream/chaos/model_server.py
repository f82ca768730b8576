"""A deterministic OpenAI-compatible model server for the chaos harness (its own process).

It speaks streamed Chat Completions (``stream=True``: SSE ``chat.completion.chunk``
events, ``tool_calls`` deltas, ``finish_reason``, a final usage chunk, ``[DONE]``) on a
loopback port. The reply depends only on the conversation:

- no assistant message yet: ask for the side-effect tool ``record_effect(turn=<turn id>)``;
- otherwise: answer with text.

Every request appends one JSON line to the call log *before* the reply is sent: the turn
id (parsed from the conversation), the call index (the number of assistant messages) and
the time it arrived. That log is the outside witness of how often each model call was
really made. A small random latency (spread over the chunks) opens kill windows.

Run: ``python -m pyrula_stream.chaos.model_server --log calls.jsonl [--port 0]``; the
first line on stdout is ``PORT <n>``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "chaos-model"
TOOL_NAME = "record_effect"
TURN_PATTERN = re.compile(r"chaos turn ([0-9a-f]{8,64})")


def prompt_for(turn_id: str, n: int) -> str:
    """The user message the chaos agent sends; the server reads the turn id back from it."""
    return f"chaos turn {turn_id} (#{n}): record this turn's effect, then answer."


def answer_for(turn_id: str) -> str:
    """The final text the server answers with (the harness checks results against it)."""
    return f"effect recorded for turn {turn_id}"


def parse_conversation(body: dict[str, Any]) -> tuple[str | None, int]:
    """``(turn_id, call_index)`` of a Chat Completions request body."""
    messages = body.get("messages") or []
    turn_id = None
    for message in messages:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        match = TURN_PATTERN.search(str(content or ""))
        if match:
            turn_id = match.group(1)
            break
    calls = sum(1 for m in messages if m.get("role") == "assistant")
    return turn_id, calls


def reply_chunks(turn_id: str, call: int) -> tuple[list[dict[str, Any]], str]:
    """The deltas of the reply (before the finish chunk) and its finish_reason."""
    if call == 0:
        args = json.dumps({"turn": turn_id})
        cut = len(args) // 2
        head = {
            "index": 0,
            "id": f"call_{turn_id[:12]}_{call}",
            "type": "function",
            "function": {"name": TOOL_NAME, "arguments": ""},
        }
        return [
            {"role": "assistant", "content": None},
            {"tool_calls": [head]},
            {"tool_calls": [{"index": 0, "function": {"arguments": args[:cut]}}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": args[cut:]}}]},
        ], "tool_calls"
    words = answer_for(turn_id).split(" ")
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"content": w if i == 0 else " " + w} for i, w in enumerate(words)]
    return deltas, "stop"


class CallLog:
    """Append-only JSON lines, one write per line (O_APPEND), safe across threads."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        os.close(self._fd)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ChaosModelServer

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._send_json(200, {"status": "ok", "model": MODEL})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send_error(404, f"no route {self.path}")
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send_error(400, "body is not JSON")
            return
        turn_id, call = parse_conversation(body)
        self.server.log.append(
            {
                "turn": turn_id,
                "call": call,
                "ts": time.time(),
                "pid": os.getpid(),
                "messages": len(body.get("messages") or []),
            }
        )
        if turn_id is None:
            self._send_error(400, "no 'chaos turn <id>' in the user message")
            return
        if not body.get("stream"):
            self._send_error(400, "this server only streams (stream=true)")
            return
        self._stream(body, turn_id, call)

    # -- replies -----------------------------------------------------------------------

    def _stream(self, body: dict[str, Any], turn_id: str, call: int) -> None:
        deltas, finish = reply_chunks(turn_id, call)
        latency = self.server.rng_latency()
        pause = latency / (len(deltas) + 1)
        created = int(time.time())
        cid = f"chatcmpl-{turn_id[:12]}-{call}"

        def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
            payload: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": MODEL,
                "choices": choices,
            }
            if usage is not None:
                payload["usage"] = usage
            return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            time.sleep(pause)
            for delta in deltas:
                self._write_chunk(chunk([{"index": 0, "delta": delta, "finish_reason": None}]))
                time.sleep(pause / 2)
            self._write_chunk(chunk([{"index": 0, "delta": {}, "finish_reason": finish}]))
            if (body.get("stream_options") or {}).get("include_usage"):
                prompt = sum(len(json.dumps(m)) for m in body.get("messages") or []) // 4
                self._write_chunk(
                    chunk(
                        [],
                        {
                            "prompt_tokens": prompt,
                            "completion_tokens": 12,
                            "total_tokens": prompt + 12,
                        },
                    )
                )
            self._write_chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the worker died mid-stream: expected under chaos

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: int, message: str) -> None:
        self._send_json(
            status,
            {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "code": None,
                    "param": None,
                }
            },
        )


class ChaosModelServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(
        self,
        address: tuple[str, int],
        log: CallLog,
        *,
        min_latency_ms: float,
        max_latency_ms: float,
        seed: int | None = None,
    ) -> None:
        super().__init__(address, _Handler)
        self.log = log
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._latency = (min_latency_ms / 1000, max_latency_ms / 1000)

    def rng_latency(self) -> float:
        with self._rng_lock:
            return self._rng.uniform(*self._latency)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--log", required=True, help="call log (JSON lines, appended)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--min-latency-ms", type=float, default=20.0)
    parser.add_argument("--max-latency-ms", type=float, default=50.0)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    log = CallLog(args.log)
    server = ChaosModelServer(
        (args.host, args.port),
        log,
        min_latency_ms=args.min_latency_ms,
        max_latency_ms=args.max_latency_ms,
        seed=args.seed,
    )
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"PORT {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
