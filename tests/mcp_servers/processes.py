"""Start and stop the test MCP server (``tests.mcp_servers.order_server``) as a real subprocess."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pyrula_stream.chaos.processes import child_env, free_port
from pyrula_stream.mcp import MCPServer

ROOT = str(Path(__file__).resolve().parent.parent.parent)
STDIO_COMMAND = [sys.executable, "-m", "tests.mcp_servers.order_server", "--stdio"]
# Starting the server (a Python process importing the SDK) takes seconds on a busy
# machine; the tests are about behaviour, not start-up speed.
CONNECT_TIMEOUT_S = 120.0


def start_listening(argv: list[str], port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own process group; return once ``port`` accepts connections."""
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=child_env(env), stdin=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{argv} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
            return proc
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"{argv} did not open port {port}")
        time.sleep(0.05)


def sigkill(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL the process group and reap it."""
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    if proc is not None:
        proc.wait(10)


class OrderServer:
    """``order_server --http PORT`` in its own process group; ``kill()`` is a SIGKILL."""

    def __init__(self, *, toolset: str = "v1", port: int | None = None) -> None:
        self.port = port or free_port()
        self.toolset = toolset
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> OrderServer:
        self.proc = start_listening(
            [sys.executable, "-m", "tests.mcp_servers.order_server", "--http", str(self.port)],
            self.port,
            {"ORDER_SERVER_TOOLSET": self.toolset},
        )
        return self

    def kill(self) -> None:
        sigkill(self.proc)

    def declaration(self, name: str = "orders", **options: object) -> MCPServer:
        options.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
        return MCPServer(name, url=self.url, **options)  # type: ignore[arg-type]


def stdio_declaration(
    name: str = "orders",
    *,
    toolset: str = "v1",
    down_flag: Path | None = None,
    start_delay: float = 0,
    **options: object,
) -> MCPServer:
    env = {"PYTHONPATH": ROOT, "ORDER_SERVER_TOOLSET": toolset}
    if down_flag is not None:
        env["ORDER_SERVER_DOWN_FLAG"] = str(down_flag)
    if start_delay:
        env["ORDER_SERVER_START_DELAY"] = str(start_delay)
    options.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    return MCPServer(name, command=STDIO_COMMAND, env=env, **options)  # type: ignore[arg-type]
