"""Which event loop a worker process runs on: asyncio's, or uvloop when asked for.

A worker's loop thread wakes for every commit, model call, poll and timer of every turn
in flight: in the bench's profile asyncio's own selector loop was the largest single item
of the loop thread's time. uvloop (libuv, compiled) runs the same programs with cheaper
callbacks. Measured (bench ``cpu`` phase, three interleaved rounds, 2-core EPYC, issue
27's note): 7% less worker CPU per one-step turn (0.766 against 0.828 ms, medians) and 6%
more turns/s, but 17% more CPU per step of 200-step turns (0.353 against 0.301 ms), so a
turn's cost grows faster with its length. That is a trade, not a free win: the default
stays asyncio's loop, and ``--event-loop uvloop`` (``pip install 'pyrula-stream[uvloop]'``)
or ``PYRULA_EVENT_LOOP=uvloop`` (inherited by the processes a supervisor or the bench
spawns) chooses uvloop for short turns at high rates.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar, get_args

from pyrula_stream.errors import ConfigurationError

EventLoopName = Literal["asyncio", "uvloop"]
EVENT_LOOPS: tuple[str, ...] = get_args(EventLoopName)
DEFAULT_EVENT_LOOP = "asyncio"
ENV = "PYRULA_EVENT_LOOP"
"""The environment variable naming the loop when no ``event_loop`` is given."""

T = TypeVar("T")


def chosen(name: str | None = None, default: str = DEFAULT_EVENT_LOOP) -> str:
    """``name``, else ``PYRULA_EVENT_LOOP``, else ``default``; refuses a name it does not
    know."""
    name = name or os.environ.get(ENV) or default
    if name not in EVENT_LOOPS:
        raise ConfigurationError(f"event loop {name!r}: choose one of {', '.join(EVENT_LOOPS)}")
    return name


def fastest_installed() -> str:
    """uvloop when it is installed, else asyncio: the default of a process whose loop only
    moves bytes between sockets (the gateway), where uvloop's trade does not apply."""
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def loop_factory(name: str | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop named (``chosen``); ``None``: asyncio's default loop."""
    if chosen(name) == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        raise ConfigurationError(
            "event loop 'uvloop' is not installed: pip install 'pyrula-stream[uvloop]' "
            "(no Windows build), or run on asyncio's loop"
        ) from None
    return uvloop.new_event_loop


def loop_in_use() -> str:
    """``"uvloop"`` or ``"asyncio"``: what the running loop is."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T], event_loop: str | None = None) -> T:
    """``asyncio.run(main)`` on the chosen loop (a refused choice closes ``main`` unrun)."""
    try:
        factory = loop_factory(event_loop)
    except ConfigurationError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
