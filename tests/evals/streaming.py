"""An evaluators' member run in a thread for a test (stopped and joined on exit)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyrula_stream.evals.stream.runner import EvalStream


@contextmanager
def streaming(agent: Any, bootstrap: str, instance: str) -> Iterator[EvalStream]:
    stream = EvalStream(agent, bootstrap, instance=instance)
    stop = threading.Event()
    thread = threading.Thread(target=stream.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield stream
    finally:
        stop.set()
        thread.join(30)
