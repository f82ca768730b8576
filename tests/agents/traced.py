"""A worker process that exports its spans to a JSONL file, for the cross-process trace
test. Run as ``python -m tests.agents.traced SPANS_FILE -- <pyrula-stream args>``.

The agent's name comes from ``TRACED_AGENT``; its tool writes ``TRACED_MARKER`` when it
starts and, while ``TRACED_BLOCK=1``, never returns (the test SIGKILLs the worker then).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from pyrula_stream import AgentContext, ToolContext, kafka_agent, tool
from pyrula_stream.llm import FakeLLM, reply_tool_call


@tool(writes=True)
async def effect(ctx: ToolContext, item: str) -> str:
    """A side effect the test can hold forever (so it can kill the worker inside it)."""
    marker = Path(os.environ["TRACED_MARKER"])
    await asyncio.to_thread(marker.write_text, ctx.idempotency_key or "")
    if os.environ.get("TRACED_BLOCK") == "1":
        await asyncio.Event().wait()
    return f"did {item}"


@kafka_agent(
    name=os.environ.get("TRACED_AGENT", "traced"),
    llm=FakeLLM([reply_tool_call("effect", item="x"), "done"]),
    tools=[effect],
    partitions=1,
)
async def traced(ctx: AgentContext, q: str) -> str:
    return await ctx.llm.run([{"role": "user", "content": q}])


class JsonlSpanExporter(SpanExporter):
    """One JSON object per ended span, flushed at once (a SIGKILL loses nothing ended)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            ctx = span.get_span_context()
            assert ctx is not None
            self.out.write(
                json.dumps(
                    {
                        "name": span.name,
                        "kind": span.kind.name,
                        "trace_id": format(ctx.trace_id, "032x"),
                        "span_id": format(ctx.span_id, "016x"),
                        "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
                        "attributes": dict(span.attributes or {}),
                        "links": [
                            format(link.context.span_id, "016x") for link in span.links or ()
                        ],
                        "events": [
                            {"name": e.name, "attributes": dict(e.attributes or {})}
                            for e in span.events
                        ],
                        "status": span.status.status_code.name,
                    },
                    default=list,
                )
                + "\n"
            )
        self.out.flush()
        return SpanExportResult.SUCCESS


def main(argv: list[str]) -> int:
    spans_file, args = argv[0], argv[argv.index("--") + 1 :]
    provider = TracerProvider()
    with open(spans_file, "a") as out:
        provider.add_span_processor(SimpleSpanProcessor(JsonlSpanExporter(out)))
        trace.set_tracer_provider(provider)
        from pyrula_stream.cli import main as cli_main

        return cli_main(args)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
