"""``pyrula-stream worker --log-format json``: one JSON object per line, with the turn's
fields where they apply, and no model or tool payload in the logs."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from pyrula_stream import KafkaAgentClient
from pyrula_stream.kafka.local.broker import free_port
from pyrula_stream.observability import logs
from pyrula_stream.testing import unique_name

ROOT = Path(__file__).parents[2]
SECRET = "sk-not-for-logs-1234"


async def test_json_logs_carry_turn_fields_and_no_payload(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    agent = unique_name("logs")
    port = free_port()
    worker = start_worker(agent, kafka_bootstrap_servers, port)
    try:
        async with httpx.AsyncClient() as http:
            for _ in range(600):
                try:
                    if (await http.get(f"http://127.0.0.1:{port}/readyz")).is_success:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        events = await client.run(agent, text=SECRET, timeout=120)
        assert events[-1].type == "run:complete"
    finally:
        worker.send_signal(signal.SIGTERM)
        output, _ = await asyncio.to_thread(worker.communicate, timeout=60)
    assert worker.returncode == 0, output

    lines = [json.loads(line) for line in output.splitlines()]  # each line is one object
    assert lines and all({"ts", "level", "logger", "message"} <= set(r) for r in lines)
    ended = [r for r in lines if r["message"] == "turn ended: completed"]
    assert len(ended) == 1
    assert ended[0]["agent"] == agent
    assert ended[0]["worker_id"] == "logs-1"
    assert ended[0]["turn_id"] == events[-1].turn_id
    assert ended[0]["attempt"] == 1
    assert ended[0]["partition"] in (0, 1)
    assert SECRET not in output and SECRET.upper() not in output  # params, tool result
    assert "said it" not in output  # the model's reply


def start_worker(agent: str, bootstrap: str, port: int) -> subprocess.Popen[str]:
    """``pyrula-stream -v worker ... --log-format json``, its output captured."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "pyrula_stream.cli", "-v", "worker", "tests.agents.echo:echo"),
            *("--bootstrap-servers", bootstrap, "--worker-id", "logs-1"),
            *("--health-port", str(port), "--log-format", "json"),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "ECHO_AGENT_NAME": agent},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_json_lines_carry_the_current_spans_trace_and_span_ids() -> None:
    """A log line written inside a span names it, so a log search finds the trace."""
    from opentelemetry.sdk.trace import TracerProvider

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(logs.ContextFilter())
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger(unique_name("traced"))
    logger.addHandler(handler)
    logger.propagate = False
    spans = TracerProvider().get_tracer("test")  # its own provider: the global one is set once
    with spans.start_as_current_span("turn") as span:
        logger.warning("inside")
    logger.warning("outside")
    inside, outside = (json.loads(line) for line in out.getvalue().splitlines())
    context = span.get_span_context()
    assert inside["trace_id"] == f"{context.trace_id:032x}"
    assert inside["span_id"] == f"{context.span_id:016x}"
    assert "trace_id" not in outside and "span_id" not in outside
