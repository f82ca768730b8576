"""The worker's event loop: asyncio's by default, uvloop on request (flag or environment).

``test_cli`` runs a real worker process on each (``--event-loop``).
"""

from __future__ import annotations

import pytest

from pyrula_stream.cli import build_parser
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.runtime import event_loop


async def running_loop() -> str:
    return event_loop.loop_in_use()


def test_a_worker_runs_on_asyncio_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loop.ENV, raising=False)
    assert event_loop.run(running_loop()) == "asyncio"
    assert event_loop.run(running_loop(), "uvloop") == "uvloop"


def test_the_environment_chooses_the_loop_of_spawned_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(event_loop.ENV, "uvloop")
    assert event_loop.run(running_loop()) == "uvloop"
    assert event_loop.run(running_loop(), "asyncio") == "asyncio"  # the flag wins


def test_an_unknown_loop_is_refused_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.ENV, "tokio")
    with pytest.raises(ConfigurationError, match="'tokio': choose one of asyncio, uvloop"):
        event_loop.run(running_loop())


def test_the_worker_command_takes_the_loop_as_a_flag() -> None:
    args = build_parser().parse_args(["worker", "m:a", "--event-loop", "uvloop"])
    assert args.event_loop == "uvloop"
    assert build_parser().parse_args(["worker", "m:a"]).event_loop is None
