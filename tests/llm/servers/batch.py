"""The batch servers (``pyrula_stream.testing_servers``) as fixtures, and helpers for
tests of the batch clients. A test module brings a fixture in by assignment::

    from tests.llm.servers import batch

    openai_batch_server = batch.openai_batch_server
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from pyrula_stream.llm.batch import BatchClient, BatchState, BatchStatus
from pyrula_stream.testing_servers import AnthropicBatchServer, OpenAIBatchServer

DELAY_S = 0.2
"""How long a batch runs at the test servers."""


@pytest.fixture
def openai_batch_server() -> Iterator[OpenAIBatchServer]:
    with OpenAIBatchServer(delay_s=DELAY_S) as server:
        yield server


@pytest.fixture
def anthropic_batch_server() -> Iterator[AnthropicBatchServer]:
    with AnthropicBatchServer(delay_s=DELAY_S) as server:
        yield server


async def poll_until_done(client: BatchClient, batch_id: str, polls: int = 200) -> BatchStatus:
    """Poll every 50 ms until the batch is no longer in progress (at most ``polls`` times)."""
    for _ in range(polls):
        status = await client.status(batch_id)
        if status.state is not BatchState.IN_PROGRESS:
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"batch {batch_id} still in progress after {polls} polls")
