"""The HTTP gateway (floor 9): submit and stream Kafka turns over HTTP and Server-Sent
Events.

``create_app`` (needs the ``gateway`` extra: FastAPI) builds the app; ``AgentClient``
(httpx only) talks to it. Both are imported on first use, so the client does not pull
in FastAPI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyrula_stream.gateway.options import AppOptions

if TYPE_CHECKING:
    from pyrula_stream.gateway.app import create_app
    from pyrula_stream.gateway.client import AgentClient

__all__ = ["AgentClient", "AppOptions", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from pyrula_stream.gateway.app import create_app

        return create_app
    if name == "AgentClient":
        from pyrula_stream.gateway.client import AgentClient

        return AgentClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
