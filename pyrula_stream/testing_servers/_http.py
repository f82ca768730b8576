"""The HTTP part every local provider server shares: a loopback server in a daemon
thread, routes by method and path pattern, JSON and SSE replies, and the call log.

Every connection is closed after one reply, so no state leaks between requests through
keep-alive and a killed client leaves nothing half-read behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class Request:
    """One request as a route sees it; of the headers only the content type is kept (the
    client's API key stays out of everything the server holds)."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    raw: bytes
    match: re.Match[str]

    def json(self) -> Any:
        return json.loads(self.raw or b"null")


@dataclass(frozen=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    frames: tuple[bytes, ...] | None = None
    """Set for a stream: each frame is written and flushed on its own."""


def json_response(status: int, payload: Any) -> Response:
    return Response(status, json.dumps(payload, separators=(",", ":")).encode())


def sse_response(frames: list[bytes]) -> Response:
    return Response(200, content_type="text/event-stream", frames=tuple(frames))


Handler = Callable[[Request], Response]


class CallLog:
    """Append-only JSON lines (one ``os.write`` per line, O_APPEND), safe across
    threads and processes: the outside witness of every call a server was sent."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


class LoopbackServer(ABC):
    """A threaded HTTP/1.1 server on a loopback port, in a daemon thread; one reply per
    connection. Subclasses answer each request in ``answer``."""

    poll_interval_s = 0.05
    """How soon ``stop`` is noticed."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._httpd = ThreadingHTTPServer((host, port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._httpd.request_queue_size = 256
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        host = self._httpd.server_address[0]
        return f"http://{host!s}:{self.port}"

    def start(self) -> Self:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(self.poll_interval_s,), daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve on this thread until ``stop`` (the command-line entry point)."""
        self._httpd.serve_forever(poll_interval=0.2)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @abstractmethod
    def answer(self, request: BaseHTTPRequestHandler, raw: bytes) -> None:
        """Write the reply to ``request`` (its body read: ``raw``)."""


def _handler_for(server: LoopbackServer) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # small SSE writes must not wait for ACKs

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def do_DELETE(self) -> None:
            self._serve()

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            self.close_connection = True
            # The client may give up first (timeouts, aborted streams); nothing to report.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                server.answer(self, raw)

    return _Handler


class RoutedServer(LoopbackServer):
    """A loopback HTTP server answering from a route table; subclasses add routes."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []
        super().__init__(host, port)

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        """Answer ``method`` on paths matching ``pattern`` (anchored at both ends)."""
        self._routes.append((method, re.compile(pattern + r"/?"), handler))

    def not_found(self, method: str, path: str) -> Response:
        return json_response(404, {"error": {"message": f"no route {method} {path}"}})

    def dispatch(self, method: str, target: str, content_type: str, raw: bytes) -> Response:
        parts = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        for route_method, pattern, handler in self._routes:
            match = pattern.fullmatch(parts.path)
            if route_method == method and match:
                return handler(Request(method, parts.path, query, content_type, raw, match))
        return self.not_found(method, parts.path)

    def answer(self, request: BaseHTTPRequestHandler, raw: bytes) -> None:
        content_type = request.headers.get("content-type") or ""
        try:
            reply = self.dispatch(request.command, request.path, content_type, raw)
        except Exception as exc:  # a server bug must reach the test as a 500
            reply = json_response(500, {"error": {"message": repr(exc)}})
        headers = {"content-type": reply.content_type}
        if reply.frames is not None:
            headers["cache-control"] = "no-cache"
        write_reply(request, reply.status, headers, reply.body, reply.frames)


def write_reply(
    request: BaseHTTPRequestHandler,
    status: int,
    headers: dict[str, str],
    body: bytes,
    chunks: tuple[bytes, ...] | None,
    *,
    promised: int | None = None,
    delay_s: float = 0.0,
) -> None:
    """Write one reply and close: ``body`` with its length, or each of ``chunks`` flushed
    on its own (after ``delay_s``) until the connection closes. ``promised`` declares a
    longer body than the chunks hold (a transfer the client sees broken)."""
    request.send_response(status)
    for name, value in headers.items():
        request.send_header(name, value)
    request.send_header("connection", "close")
    if chunks is None:
        request.send_header("content-length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
        return
    if promised is not None:
        request.send_header("content-length", str(promised))
    request.end_headers()
    for chunk in chunks:
        if delay_s:
            time.sleep(delay_s)
        request.wfile.write(chunk)
        request.wfile.flush()
