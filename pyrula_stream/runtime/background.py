"""``async with worker:``: ``run()`` in a background task, entered once the worker joined.

``KafkaWorker`` and ``MeshWorker`` share this shape: the block's body runs while the
worker serves, a failure before joining is raised at the ``async with`` line, and leaving
the block stops the worker and waits for it to drain.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class RunsInBackground(ABC):
    """The async context manager of something that ``run()``s until ``stop()``."""

    _task: asyncio.Task[None] | None = None

    @abstractmethod
    async def run(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    async def wait_joined(self) -> None: ...

    def _task_name(self) -> str:
        return type(self).__name__

    async def __aenter__(self) -> Self:
        """Start ``run()`` in the background; return once it joined, or raise why it ended."""
        self._task = asyncio.create_task(self.run(), name=self._task_name())
        joined = asyncio.ensure_future(self.wait_joined())
        await asyncio.wait({self._task, joined}, return_when=asyncio.FIRST_COMPLETED)
        joined.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await joined
        if self._task.done():
            self._task.result()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._task is not None:
            await self._task
