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
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.mcp_servers.order_server", "--http", str(self.port)],
            env=child_env({"ORDER_SERVER_TOOLSET": self.toolset}),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:  # ready when the port accepts connections
            if self.proc.poll() is not None:
                raise RuntimeError(f"the MCP test server exited with {self.proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return self
            if time.monotonic() > deadline:
                raise TimeoutError("the MCP test server did not open its port")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def declaration(self, name: str = "orders", **options: object) -> MCPServer:
        return MCPServer(name, url=self.url, **options)  # type: ignore[arg-type]


def stdio_declaration(
    name: str = "orders", *, toolset: str = "v1", down_flag: Path | None = None, **options: object
) -> MCPServer:
    env = {"PYTHONPATH": ROOT, "ORDER_SERVER_TOOLSET": toolset}
    if down_flag is not None:
        env["ORDER_SERVER_DOWN_FLAG"] = str(down_flag)
    return MCPServer(name, command=STDIO_COMMAND, env=env, **options)  # type: ignore[arg-type]
