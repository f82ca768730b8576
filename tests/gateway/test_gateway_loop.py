"""The gateway's event loop: uvloop when installed (it only moves bytes between sockets),
unless the flag or ``PYRULA_EVENT_LOOP`` names another. The worker's default stays
asyncio's (``tests/runtime/test_event_loop.py``)."""

from __future__ import annotations

import pytest

from pyrula_stream.cli import build_parser
from pyrula_stream.gateway.serve import gateway_event_loop
from pyrula_stream.runtime import event_loop


def test_the_gateway_runs_on_uvloop_when_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop")  # the dev and gateway extras install it (not on Windows)
    monkeypatch.delenv(event_loop.ENV, raising=False)
    assert gateway_event_loop() == "uvloop"
    assert event_loop.chosen() == "asyncio"  # a worker's default is not the gateway's
    monkeypatch.setenv(event_loop.ENV, "asyncio")
    assert gateway_event_loop() == "asyncio"
    assert gateway_event_loop("uvloop") == "uvloop"  # the flag wins


def test_the_gateway_command_takes_the_loop_as_a_flag() -> None:
    args = build_parser({}).parse_args(["gateway", "--agent", "a", "--event-loop", "asyncio"])
    assert args.event_loop == "asyncio"
    assert build_parser({}).parse_args(["gateway", "--agent", "a"]).event_loop is None
    from_env = build_parser({event_loop.ENV: "asyncio"}).parse_args(["gateway", "--agent", "a"])
    assert from_env.event_loop == "asyncio"
