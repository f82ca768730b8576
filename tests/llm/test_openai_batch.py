"""OpenAIBatchClient through the real ``openai`` SDK (``files`` + ``batches``) against a
local server speaking the Batch API: submit, find after a crash, poll, results as
``ModelResponse``, a failed call, expiry, cancel, a refused batch."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from pyrula_stream.errors import ConfigurationError, LLMError
from pyrula_stream.llm import ModelRequest, OpenAILLM, ToolDefinition, ToolUseBlock
from pyrula_stream.llm.batch import (
    BatchCall,
    BatchClient,
    BatchState,
    OutcomeKind,
    custom_id_for,
)
from pyrula_stream.llm.openai_batch import TAG_KEY, OpenAIBatchClient
from pyrula_stream.testing_servers import Answer, OpenAIBatchServer, ScriptedResponder, ToolCall
from tests.llm.servers import batch
from tests.llm.servers.fixtures import OPENAI_SECRET_KEY as SECRET
from tests.llm.servers.fixtures import collect

openai_batch_server = batch.openai_batch_server

MODEL = "gpt-5.4-mini"
LOOKUP = ToolDefinition(
    name="lookup",
    description="Find an order by id.",
    input_schema={"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
)


def _llm(server: OpenAIBatchServer) -> OpenAILLM:
    return OpenAILLM(MODEL, api_key=SECRET, base_url=server.base_url + "/v1", max_tokens=256)


@pytest.fixture
async def client(openai_batch_server: OpenAIBatchServer) -> AsyncIterator[OpenAIBatchClient]:
    llm = _llm(openai_batch_server)
    yield OpenAIBatchClient(llm)
    await llm.aclose()


def _script(server: OpenAIBatchServer) -> ScriptedResponder:
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
    client: OpenAIBatchClient, openai_batch_server: OpenAIBatchServer
) -> None:
    server = openai_batch_server
    _script(server).enqueue(
        Answer(text="Order 0 shipped.", input_tokens=120, output_tokens=9, cached_tokens=100),
        Answer(tool_calls=(ToolCall("call_7", "lookup", {"id": "7"}),), input_tokens=80),
    )
    assert isinstance(client, BatchClient)
    calls = _calls("t1", 2)
    submitted_at = time.time()
    batch_id = await client.submit(calls, tag="t1")
    # The provider saw each call once, with the body the live adapter builds, unstreamed.
    assert server.book.submitted == [(batch_id, "t1-0"), (batch_id, "t1-1")]
    record = server.book.get(batch_id)
    assert record is not None
    body = record.calls[0].body
    assert body == client.llm.batch_body(calls[0].request)
    assert "stream" not in body
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["tools"][0]["function"]["name"] == "lookup"
    assert (await client.status(batch_id)).state is BatchState.IN_PROGRESS

    # A new worker (new adapter, new SDK client) finds the batch by its tag alone.
    llm = _llm(server)
    fresh = OpenAIBatchClient(llm)
    assert await fresh.find("t1", submitted_at=submitted_at) == batch_id
    assert await fresh.find("t1") == batch_id
    assert await fresh.find("t2", submitted_at=submitted_at) is None
    assert await fresh.find("t1", submitted_at=submitted_at - 3600) is None  # outside window
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
    # prompt_tokens counts the cached ones; ours apart, as the live adapter reports them.
    usage = text.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (20, 100, 9)
    assert tool.stop_reason == "tool_use"
    assert tool.content == [ToolUseBlock(id="call_7", name="lookup", input={"id": "7"})]
    assert tool.usage.input_tokens == 80
    assert all(o.kind is OutcomeKind.SUCCEEDED and o.error is None for o in outcomes.values())
    assert all(o.extra["request_id"].startswith("req_") for o in outcomes.values())


async def test_the_same_answer_goes_live_or_batched(
    client: OpenAIBatchClient, openai_batch_server: OpenAIBatchServer
) -> None:
    """One responder behind both endpoints: a live call and a batched call of the same
    request get the same ModelResponse (but for the ids the provider makes up)."""
    answer = Answer(tool_calls=(ToolCall("call_1", "lookup", {"id": "1"}),), input_tokens=30)
    _script(openai_batch_server).enqueue(answer, answer)
    request = _calls("t1", 1)[0]
    _, live = await collect(
        client.llm, request.request.messages, tools=[LOOKUP], system="Be brief."
    )
    batch_id = await client.submit([request], tag="t1")
    await batch.poll_until_done(client, batch_id)
    [outcome] = await client.results(batch_id)
    assert outcome.response == live
    assert openai_batch_server.live_calls == 1


async def test_a_failed_call_and_its_neighbour(
    client: OpenAIBatchClient, openai_batch_server: OpenAIBatchServer
) -> None:
    server = openai_batch_server
    _script(server).enqueue(Answer(text="fine"))
    server.book.fail_ids = {"t1-1"}
    batch_id = await client.submit(_calls("t1", 2), tag="t1")
    status = await batch.poll_until_done(client, batch_id)
    assert (status.state, status.succeeded, status.failed) == (BatchState.ENDED, 1, 1)
    outcomes = {o.custom_id: o for o in await client.results(batch_id)}
    assert outcomes["t1-0"].response is not None and outcomes["t1-0"].response.text == "fine"
    failed = outcomes["t1-1"]
    assert failed.kind is OutcomeKind.ERRORED and failed.response is None
    assert failed.error == "HTTP 500: local server failed call t1-1"


async def test_expiry_keeps_the_answered_calls(
    client: OpenAIBatchClient, openai_batch_server: OpenAIBatchServer
) -> None:
    server = openai_batch_server
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
    for cid in ("t1-1", "t1-2"):
        assert outcomes[cid].kind is OutcomeKind.EXPIRED and outcomes[cid].response is None
        assert outcomes[cid].error is not None and "batch_expired" in outcomes[cid].error


async def test_cancel_a_running_batch_then_again(
    client: OpenAIBatchClient, openai_batch_server: OpenAIBatchServer
) -> None:
    server = openai_batch_server
    server.book.delay_s = 60.0
    batch_id = await client.submit(_calls("t1", 2), tag="t1")
    await client.cancel(batch_id)
    await client.cancel(batch_id)  # cancelling a cancelled batch is no error
    status = await client.status(batch_id)
    assert (status.state, status.succeeded, status.failed) == (BatchState.CANCELLED, 0, 2)
    # The provider lists no line for calls that never ran: the input file names them.
    outcomes = await client.results(batch_id)
    assert sorted(o.custom_id for o in outcomes) == ["t1-0", "t1-1"]
    assert {o.kind for o in outcomes} == {OutcomeKind.CANCELLED}
    assert _script(server).prompts == []  # nothing was answered


async def test_cancel_an_ended_batch_is_no_error(
    client: OpenAIBatchClient, openai_batch_server: OpenAIBatchServer
) -> None:
    _script(openai_batch_server).enqueue(Answer(text="done"))
    batch_id = await client.submit(_calls("t1", 1), tag="t1")
    await batch.poll_until_done(client, batch_id)
    await client.cancel(batch_id)
    assert (await client.status(batch_id)).state is BatchState.ENDED


async def test_a_refused_batch_fails_every_call(
    client: OpenAIBatchClient, openai_batch_server: OpenAIBatchServer
) -> None:
    openai_batch_server.book.refuse_next = 1
    batch_id = await client.submit(_calls("t1", 2), tag="t1")
    status = await client.status(batch_id)
    assert status.state is BatchState.FAILED
    assert status.error is not None and "refuse this batch" in status.error
    outcomes = await client.results(batch_id)
    assert sorted(o.custom_id for o in outcomes) == ["t1-0", "t1-1"]
    assert all(o.kind is OutcomeKind.ERRORED and "refuse" in (o.error or "") for o in outcomes)


async def test_bad_batches_are_refused_before_anything_is_sent(
    client: OpenAIBatchClient, openai_batch_server: OpenAIBatchServer
) -> None:
    request = ModelRequest([{"role": "user", "content": "x"}])
    with pytest.raises(ConfigurationError, match="not 't1-<suffix>'"):
        await client.submit([BatchCall("other-0", request)], tag="t1")
    with pytest.raises(ConfigurationError, match="appears twice"):
        await client.submit([BatchCall("t1-0", request), BatchCall("t1-0", request)], tag="t1")
    with pytest.raises(ConfigurationError, match="tag"):
        await client.submit([BatchCall("t-1-0", request)], tag="t-1")
    small = OpenAIBatchClient(client.llm, max_calls=1)
    with pytest.raises(ConfigurationError, match="at most 1"):
        await small.submit(_calls("t1", 2), tag="t1")
    assert openai_batch_server.book.submitted == []


async def test_provider_errors_are_ours_and_secret_free(
    client: OpenAIBatchClient, openai_batch_server: OpenAIBatchServer
) -> None:
    with pytest.raises(LLMError, match="No batch found") as caught:
        await client.status("batch_nope")
    assert SECRET not in repr(caught.value) and caught.value.__cause__ is None
    with pytest.raises(LLMError, match="has not ended"):
        batch_id = await client.submit(_calls("t1", 1), tag="t1")
        await client.results(batch_id)


async def test_metadata_carries_the_tag(
    client: OpenAIBatchClient, openai_batch_server: OpenAIBatchServer
) -> None:
    batch_id = await client.submit(_calls("t9", 1), tag="t9")
    record = openai_batch_server.book.get(batch_id)
    assert record is not None and record.meta["metadata"] == {TAG_KEY: "t9"}
