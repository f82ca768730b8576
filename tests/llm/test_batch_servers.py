"""The local batch servers themselves, through the official SDKs: paging, a refused input
file, the knobs a chaos run turns, the call log, and the server as its own process."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import anthropic
import openai

from pyrula_stream.llm import ModelRequest, OpenAILLM
from pyrula_stream.llm.batch import BatchCall, BatchState, OutcomeKind, custom_id_for
from pyrula_stream.llm.openai_batch import OpenAIBatchClient
from pyrula_stream.testing_servers import AnthropicBatchServer, OpenAIBatchServer, echo
from tests.llm.servers import batch

KEY = "sk-test-batch-servers"


def _line(cid: str, **body: object) -> str:
    request = {"model": "gpt-5.4-mini", "messages": [{"role": "user", "content": cid}], **body}
    return json.dumps(
        {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": request}
    )


async def test_openai_lists_pages_newest_first_and_refuses_a_bad_file() -> None:
    with OpenAIBatchServer(echo) as server:
        sdk = openai.AsyncOpenAI(api_key=KEY, base_url=server.base_url + "/v1", max_retries=0)
        ids = []
        for n in range(3):
            file = await sdk.files.create(file=(f"{n}.jsonl", _line(f"c-{n}")), purpose="batch")
            created = await sdk.batches.create(
                input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            ids.append(created.id)
        assert [b.id async for b in sdk.batches.list(limit=2)] == ids[::-1]

        bad = "\n".join([_line("c-0"), _line("c-1", stream=True)])
        file = await sdk.files.create(file=("bad.jsonl", bad), purpose="batch")
        refused = await sdk.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert refused.status == "failed"
        assert refused.errors is not None and refused.errors.data
        error = refused.errors.data[0]
        assert (error.line, error.message) == (2, "a batched request cannot stream")
        await sdk.close()


async def test_anthropic_lists_pages_newest_first() -> None:
    with AnthropicBatchServer(echo) as server:
        sdk = anthropic.AsyncAnthropic(api_key=KEY, base_url=server.base_url, max_retries=0)
        params = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        ids = [
            (
                await sdk.messages.batches.create(
                    requests=[{"custom_id": f"c-{n}", "params": params}]
                )
            ).id  # type: ignore[typeddict-item]
            for n in range(3)
        ]
        assert [b.id async for b in sdk.messages.batches.list(limit=2)] == ids[::-1]
        await sdk.close()


async def test_knobs_expire_every_and_fail_every_and_the_call_log(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    with OpenAIBatchServer(echo, delay_s=0.0, log=log) as server:
        server.book.expire_every = 2
        server.book.fail_every = 3
        llm = OpenAILLM("gpt-5.4-mini", api_key=KEY, base_url=server.base_url)
        client = OpenAIBatchClient(llm)
        request = ModelRequest([{"role": "user", "content": "same call"}])
        first = await client.submit([BatchCall(custom_id_for("a", 0), request)], tag="a")
        calls = [BatchCall(custom_id_for("b", n), request) for n in range(4)]
        second = await client.submit(calls, tag="b")
        assert (await client.status(first)).state is BatchState.ENDED
        assert (await client.status(second)).state is BatchState.EXPIRED
        kinds = {o.custom_id: o.kind for o in await client.results(second)}
        # Half the expiring batch is answered; the 3rd call answered overall errors.
        assert kinds == {
            "b-0": OutcomeKind.SUCCEEDED,
            "b-1": OutcomeKind.ERRORED,
            "b-2": OutcomeKind.EXPIRED,
            "b-3": OutcomeKind.EXPIRED,
        }
        await llm.complete_request(request)  # the same call, live
        await llm.aclose()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(x["via"], x.get("custom_id")) for x in lines] == [
        ("batch", "a-0"),
        ("batch", "b-0"),
        ("batch", "b-1"),
        ("batch", "b-2"),
        ("batch", "b-3"),
        ("live", None),
    ]
    # One call, one digest: whether batched under any custom id, or sent live.
    assert len({x["digest"] for x in lines}) == 1


async def test_the_server_as_its_own_process(tmp_path: Path) -> None:
    """How the chaos harness runs it: the provider outlives the clients that use it."""
    log = tmp_path / "calls.jsonl"
    argv = [sys.executable, "-m", "pyrula_stream.testing_servers", "openai"]
    argv += ["--delay", "0.1", "--log", str(log)]
    process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    try:
        assert process.stdout is not None
        first = (await process.stdout.readline()).decode().split()
        assert first[0] == "PORT"
        url = f"http://127.0.0.1:{first[1]}/v1"
        llm = OpenAILLM("gpt-5.4-mini", api_key=KEY, base_url=url)
        request = ModelRequest([{"role": "user", "content": "hello"}])
        batch_id = await OpenAIBatchClient(llm).submit([BatchCall("p-0", request)], tag="p")
        await llm.aclose()
        llm = OpenAILLM("gpt-5.4-mini", api_key=KEY, base_url=url)  # a new worker
        client = OpenAIBatchClient(llm)
        assert await client.find("p") == batch_id
        await batch.poll_until_done(client, batch_id)
        [outcome] = await client.results(batch_id)
        assert outcome.response is not None and outcome.response.text == "step 0: hello"
        await llm.aclose()
    finally:
        process.terminate()
        await process.wait()
    assert [json.loads(x)["custom_id"] for x in log.read_text().splitlines()] == ["p-0"]
