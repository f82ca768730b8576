"""AnthropicBatchClient through the real ``anthropic`` SDK (``messages.batches``) against
a local server speaking Message Batches: submit, find after a crash (and "not yet" while
a candidate runs), poll, results as ``ModelResponse``, a failed call, expiry, cancel."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from pyrula_stream.errors import LLMError
from pyrula_stream.llm import AnthropicLLM, ModelRequest, ToolDefinition, ToolUseBlock
from pyrula_stream.llm.anthropic_batch import AnthropicBatchClient
from pyrula_stream.llm.batch import (
    BatchCall,
    BatchClient,
    BatchLookupPending,
    BatchState,
    OutcomeKind,
    custom_id_for,
)
from pyrula_stream.testing_servers import (
    Answer,
    AnthropicBatchServer,
    CallError,
    ScriptedResponder,
    ToolCall,
)
from tests.llm.servers import batch
from tests.llm.servers.fixtures import SECRET_KEY as SECRET
from tests.llm.servers.fixtures import collect

anthropic_batch_server = batch.anthropic_batch_server

MODEL = "claude-sonnet-4-6"
LOOKUP = ToolDefinition(
    name="lookup",
    description="Find an order by id.",
    input_schema={"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
)


def _llm(server: AnthropicBatchServer) -> AnthropicLLM:
    return AnthropicLLM(MODEL, api_key=SECRET, base_url=server.base_url, max_tokens=256)


@pytest.fixture
async def client(
    anthropic_batch_server: AnthropicBatchServer,
) -> AsyncIterator[AnthropicBatchClient]:
    llm = _llm(anthropic_batch_server)
    yield AnthropicBatchClient(llm)
    await llm.aclose()


def _script(server: AnthropicBatchServer) -> ScriptedResponder:
    assert isinstance(server.responder, ScriptedResponder)
    return server.responder


def _calls(tag: str, n: int) -> list[BatchCall]:
    return [
        BatchCall(
            custom_id_for(tag, i),
            ModelRequest([{"role": "user", "content": f"order {i}?"}], [LOOKUP], "Be brief."),
        )
        for i in range(n)
    ]


async def test_submit_find_after_a_crash_poll_and_parse(
    client: AnthropicBatchClient, anthropic_batch_server: AnthropicBatchServer
) -> None:
    server = anthropic_batch_server
    server.book.delay_s = 60.0  # ends when the test says so
    _script(server).enqueue(
        Answer(text="Order 0 shipped.", input_tokens=120, output_tokens=9, cached_tokens=100),
        Answer(tool_calls=(ToolCall("toolu_7", "lookup", {"id": "7"}),), input_tokens=80),
    )
    assert isinstance(client, BatchClient)
    calls = _calls("t1", 2)
    submitted_at = time.time()
    batch_id = await client.submit(calls, tag="t1")
    assert server.book.submitted == [(batch_id, "t1-0"), (batch_id, "t1-1")]
    record = server.book.get(batch_id)
    assert record is not None
    params = record.calls[0].body
    assert params == client.llm.batch_params(calls[0].request)
    # The live adapter's prompt-cache breakpoints ride along in the batch.
    assert params["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert params["tools"][-1]["cache_control"] == {"type": "ephemeral"}

    # A new worker cannot tell yet: the batch that may hold the tag is still running.
    llm = _llm(server)
    fresh = AnthropicBatchClient(llm)
    with pytest.raises(BatchLookupPending, match="1 running batch"):
        await fresh.find("t1", submitted_at=submitted_at)
    # A batch created long after the submit time cannot be the one.
    assert await fresh.find("t1", submitted_at=submitted_at - 3600) is None
    server.book.complete_now(batch_id)
    assert await fresh.find("t1", submitted_at=submitted_at) == batch_id
    assert await fresh.find("t1") == batch_id
    assert await fresh.find("t2", submitted_at=submitted_at) is None

    status = await batch.poll_until_done(fresh, batch_id)
    assert (status.state, status.total, status.succeeded, status.failed) == (
        BatchState.ENDED,
        2,
        2,
        0,
    )
    outcomes = {o.custom_id: o for o in await fresh.results(batch_id)}
    await llm.aclose()
    text, tool = outcomes["t1-0"].response, outcomes["t1-1"].response
    assert text is not None and tool is not None
    assert text.text == "Order 0 shipped." and text.stop_reason == "end_turn"
    assert text.model == MODEL
    usage = text.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (20, 100, 9)
    assert tool.stop_reason == "tool_use"
    assert tool.content == [ToolUseBlock(id="toolu_7", name="lookup", input={"id": "7"})]
    assert all(o.kind is OutcomeKind.SUCCEEDED for o in outcomes.values())


async def test_the_same_answer_goes_live_or_batched(
    client: AnthropicBatchClient, anthropic_batch_server: AnthropicBatchServer
) -> None:
    answer = Answer(
        text="Looking.", tool_calls=(ToolCall("toolu_1", "lookup", {"id": "1"}),), input_tokens=30
    )
    _script(anthropic_batch_server).enqueue(answer, answer)
    request = _calls("t1", 1)[0]
    _, live = await collect(
        client.llm, request.request.messages, tools=[LOOKUP], system="Be brief."
    )
    batch_id = await client.submit([request], tag="t1")
    await batch.poll_until_done(client, batch_id)
    [outcome] = await client.results(batch_id)
    assert outcome.response == live
    assert anthropic_batch_server.live_calls == 1


async def test_a_failed_call_and_its_neighbour(
    client: AnthropicBatchClient, anthropic_batch_server: AnthropicBatchServer
) -> None:
    _script(anthropic_batch_server).enqueue(
        Answer(text="fine"), CallError(400, "invalid_request_error", "bad tool schema")
    )
    batch_id = await client.submit(_calls("t1", 2), tag="t1")
    status = await batch.poll_until_done(client, batch_id)
    assert (status.state, status.succeeded, status.failed) == (BatchState.ENDED, 1, 1)
    outcomes = {o.custom_id: o for o in await client.results(batch_id)}
    assert outcomes["t1-0"].response is not None and outcomes["t1-0"].response.text == "fine"
    failed = outcomes["t1-1"]
    assert failed.kind is OutcomeKind.ERRORED and failed.response is None
    assert failed.error == "invalid_request_error: bad tool schema"
    assert failed.extra["request_id"].startswith("req_")


async def test_expiry_keeps_the_answered_calls(
    client: AnthropicBatchClient, anthropic_batch_server: AnthropicBatchServer
) -> None:
    server = anthropic_batch_server
    _script(server).enqueue(Answer(text="first"))
    batch_id = await client.submit(_calls("t1", 3), tag="t1")
    server.book.expire(batch_id, answered=1)
    status = await client.status(batch_id)
    assert (status.state, status.total, status.succeeded, status.failed) == (
        BatchState.EXPIRED,
        3,
        1,
        2,
    )
    outcomes = {o.custom_id: o for o in await client.results(batch_id)}
    assert outcomes["t1-0"].response is not None and outcomes["t1-0"].response.text == "first"
    assert {outcomes[c].kind for c in ("t1-1", "t1-2")} == {OutcomeKind.EXPIRED}


async def test_cancel_a_running_batch_then_again(
    client: AnthropicBatchClient, anthropic_batch_server: AnthropicBatchServer
) -> None:
    server = anthropic_batch_server
    server.book.delay_s = 60.0
    batch_id = await client.submit(_calls("t1", 2), tag="t1")
    await client.cancel(batch_id)
    await client.cancel(batch_id)
    status = await client.status(batch_id)
    assert (status.state, status.succeeded, status.failed) == (BatchState.CANCELLED, 0, 2)
    outcomes = await client.results(batch_id)
    assert sorted(o.custom_id for o in outcomes) == ["t1-0", "t1-1"]
    assert {o.kind for o in outcomes} == {OutcomeKind.CANCELLED}
    assert _script(server).prompts == []


async def test_a_refused_batch_raises_and_holds_nothing(
    client: AnthropicBatchClient, anthropic_batch_server: AnthropicBatchServer
) -> None:
    anthropic_batch_server.book.refuse_next = 1
    with pytest.raises(LLMError, match="refuse this batch") as caught:
        await client.submit(_calls("t1", 1), tag="t1")
    assert SECRET not in repr(caught.value) and caught.value.__cause__ is None
    assert anthropic_batch_server.book.submitted == []
    with pytest.raises(LLMError, match="no results yet"):
        batch_id = await client.submit(_calls("t2", 1), tag="t2")
        await client.results(batch_id)
