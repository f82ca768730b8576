"""Schema Registry framing against a real registry (Apicurio, started once for these tests):
registration at ``topics apply``, the Confluent wire format end to end, both framings read
side by side, a clear error for an unregistered subject, and BACKWARD evolution."""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from pyrula_stream import AgentContext, KafkaAgentClient, WorkerOptions, kafka_agent
from pyrula_stream.cli import main as cli_main
from pyrula_stream.errors import (
    ConfigurationError,
    MalformedRecordError,
    SchemaRegistryUnavailableError,
)
from pyrula_stream.kafka.local.broker import free_port
from pyrula_stream.kafka.schema_registry import RegistryCodec, schema_text, subject_for
from pyrula_stream.llm import FakeLLM, reply_text
from pyrula_stream.testing import read_topic, running_worker, unique_name
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import Event, decode_event

FRAMED = serde.registry_content_type("event")


def _agent(name: str) -> Any:
    @kafka_agent(name=name, llm=FakeLLM(lambda messages, tools: reply_text("pong")), partitions=1)
    async def agent(ctx: AgentContext, q: str) -> str:
        return await ctx.llm.run([{"role": "user", "content": q}])

    return agent


def _apply(bootstrap: str, agent: str, settings: dict[str, Any], tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    args = ["topics", "apply", agent, "--partitions", "1", "--bootstrap-servers", bootstrap]
    assert cli_main([*args, "--kafka-config", str(config)]) == 0


async def test_framed_turns_run_end_to_end_after_topics_apply_registers_schemas(
    kafka_bootstrap_servers: str,
    schema_registry_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = unique_name("sr")
    settings = {"schema.registry.url": schema_registry_url}
    await asyncio.to_thread(_apply, kafka_bootstrap_servers, name, settings, tmp_path)
    printed = capsys.readouterr().out
    assert f"schema  pyrula.{name}.turns-value id" in printed
    assert f"schema  pyrula.{name}.events-value id" in printed
    with SchemaRegistryClient({"url": schema_registry_url}) as registry:
        events_id = registry.get_latest_version(f"pyrula.{name}.events-value").schema_id

    options = WorkerOptions(kafka_config=settings, serialization="schema_registry")
    async with (
        running_worker(_agent(name), kafka_bootstrap_servers, options),
        KafkaAgentClient(
            kafka_bootstrap_servers, kafka_config=settings, serialization="schema_registry"
        ) as client,
    ):
        events = await asyncio.wait_for(client.run(name, q="ping"), 60)
    assert events[-1].type == "run:complete" and events[-1].data["result"] == "pong"

    for topic, schema_id in ((f"pyrula.{name}.events", events_id), (f"pyrula.{name}.turns", None)):
        records = await asyncio.to_thread(read_topic, kafka_bootstrap_servers, topic)
        assert records
        for _, value, headers in records:
            assert value is not None and value[0] == 0, "Confluent magic byte"
            assert headers["content-type"].endswith(";framing=confluent")
            if schema_id is not None:
                assert struct.unpack(">I", value[1:5])[0] == schema_id


async def test_readers_accept_both_framings_so_a_topic_can_migrate(
    kafka_bootstrap_servers: str,
    schema_registry_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = unique_name("mixed")
    settings = {"schema.registry.url": schema_registry_url}
    await asyncio.to_thread(_apply, kafka_bootstrap_servers, name, settings, tmp_path)
    capsys.readouterr()
    plain_worker = WorkerOptions(kafka_config=settings)  # reads both, writes schemaless
    async with running_worker(_agent(name), kafka_bootstrap_servers, plain_worker):
        for serialization in ("avro", "schema_registry"):
            async with KafkaAgentClient(
                kafka_bootstrap_servers, kafka_config=settings, serialization=serialization
            ) as client:
                events = await asyncio.wait_for(client.run(name, q="ping"), 60)
                assert events[-1].type == "run:complete", serialization
        submit = ["submit", name, "q=ping", "--wait", "--serialization", "schema_registry"]
        submit += ["--kafka-config", str(tmp_path / "client.properties")]
        submit += ["--bootstrap-servers", kafka_bootstrap_servers]
        assert await asyncio.to_thread(cli_main, submit) == 0
        assert "run:complete" in capsys.readouterr().out
    framed = WorkerOptions(kafka_config=settings, serialization="schema_registry")
    async with (
        running_worker(_agent(name), kafka_bootstrap_servers, framed),
        KafkaAgentClient(kafka_bootstrap_servers, kafka_config=settings) as client,
    ):
        events = await asyncio.wait_for(client.run(name, q="ping"), 60)
        assert events[-1].type == "run:complete"

    events_topic = f"pyrula.{name}.events"
    records = await asyncio.to_thread(read_topic, kafka_bootstrap_servers, events_topic)
    types = {headers["content-type"] for _, _, headers in records}
    assert types == {serde.content_type("event"), FRAMED}, "both framings on one topic"
    turns = await asyncio.to_thread(read_topic, kafka_bootstrap_servers, f"pyrula.{name}.turns")
    framings = [h["content-type"] for _, _, h in turns]
    assert framings.count(serde.registry_content_type("turn_request")) == 2  # client and CLI
    # The CLI's tail reads the mixed topic too.
    config = tmp_path / "client.properties"
    tail = ["tail", name, "--from-beginning", "--timeout", "3", "--kafka-config", str(config)]
    tail += ["--bootstrap-servers", kafka_bootstrap_servers]
    assert await asyncio.to_thread(cli_main, tail) == 0
    assert capsys.readouterr().out.count("run:complete") == 4
    # Without a registry, a framed record is refused with what to configure.
    framed_value, framed_headers = next(
        (v, h) for _, v, h in records if h["content-type"] == FRAMED
    )
    assert framed_value is not None
    with pytest.raises(MalformedRecordError, match=r"set schema\.registry\.url"):
        decode_event(framed_value, framed_headers)


async def test_an_unregistered_subject_fails_at_start_naming_it(
    kafka_bootstrap_servers: str, schema_registry_url: str
) -> None:
    name = unique_name("unreg")
    settings = {"schema.registry.url": schema_registry_url}
    options = WorkerOptions(kafka_config=settings, serialization="schema_registry")
    with pytest.raises(ConfigurationError, match=rf"subject 'pyrula\.{name}\.events-value'"):
        async with running_worker(_agent(name), kafka_bootstrap_servers, options):
            pass
    async with KafkaAgentClient(
        kafka_bootstrap_servers, kafka_config=settings, serialization="schema_registry"
    ) as client:
        with pytest.raises(ConfigurationError, match=rf"pyrula\.{name}\.turns-value"):
            await client.submit(name, q="x")
    with pytest.raises(ConfigurationError, match=r"needs schema\.registry\.url"):
        WorkerOptions(serialization="schema_registry", kafka_config={})


def test_event_schema_evolves_backward_compatibly(schema_registry_url: str) -> None:
    topic = f"pyrula.{unique_name('evolve')}.events"
    subject = subject_for(topic)
    codec = RegistryCodec({"url": schema_registry_url})
    try:
        _evolve(codec, topic, subject)
    finally:
        codec.close()


def _evolve(codec: RegistryCodec, topic: str, subject: str) -> None:
    first_id = codec.register("event", topic)
    codec.client.set_compatibility(subject, "BACKWARD")

    v2 = json.loads(schema_text("event"))
    v2["fields"].append({"name": "trace_id", "type": ["null", "string"], "default": None})
    v2_text = json.dumps(v2).replace('"{}"', '"\\u007b\\u007d"')
    assert codec.client.test_compatibility(subject, Schema(v2_text, "AVRO"))
    second_id = codec.client.register_schema(subject, Schema(v2_text, "AVRO"))
    assert second_id != first_id

    breaking = json.loads(schema_text("event"))
    breaking["fields"].append({"name": "tenant", "type": "string"})  # no default
    breaking_text = json.dumps(breaking).replace('"{}"', '"\\u007b\\u007d"')
    assert not codec.client.test_compatibility(subject, Schema(breaking_text, "AVRO"))
    with pytest.raises(SchemaRegistryError):
        codec.client.register_schema(subject, Schema(breaking_text, "AVRO"))

    # A v2 writer's record is read with our v1 schema: the new field is skipped.
    writer = AvroSerializer(
        codec.client, v2_text, conf={"auto.register.schemas": False, "use.latest.version": False}
    )
    body = {**serde.avro_body("event", Event("status", "t", "a", 3, 4)), "trace_id": "x"}
    value = writer(body, SerializationContext(topic, MessageField.VALUE))
    assert value is not None and struct.unpack(">I", value[1:5])[0] == second_id
    event = decode_event(value, {"content-type": FRAMED}, codec)
    assert (event.type, event.turn_id, event.seq) == ("status", "t", 3)


async def test_the_web_ui_feed_reads_registry_framed_events(schema_registry_url: str) -> None:
    from pyrula_stream.kafka.io import TopicRecord
    from pyrula_stream.ui.feed import EventFeed, FeedOptions
    from pyrula_stream.ui.model import UIState

    agent = unique_name("ui")
    topic = f"pyrula.{agent}.events"
    codec = RegistryCodec({"url": schema_registry_url})
    try:
        codec.register("event", topic)
        value, ctype = codec.encode("event", Event("run:start", "t1", agent, 0, 1), topic)
    finally:
        codec.close()
    assert ctype == FRAMED
    options = FeedOptions("127.0.0.1:1", kafka_config={"schema.registry.url": schema_registry_url})
    feed = EventFeed(options, UIState())
    try:
        feed._topic_agent[topic] = (agent, "events")  # what discovery records for a topic
        feed._fold([TopicRecord(topic, 0, 0, b"t1", value, {"content-type": ctype}, 1)])
    finally:
        await feed.stop()
    assert feed.undecodable == 0
    assert feed.state.find(agent, "t1") is not None


SECRET = "registry-pw-7d41e0"


def _with_password(url: str) -> str:
    """``url`` with basic-auth userinfo, which the registry client sends as credentials."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://svc:{SECRET}@{rest}"


async def test_credentials_in_the_registry_url_never_show(
    kafka_bootstrap_servers: str,
    schema_registry_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    name = unique_name("urlpw")
    settings = {"schema.registry.url": _with_password(schema_registry_url)}
    options = WorkerOptions(kafka_config=settings, serialization="schema_registry")
    assert SECRET not in repr(options)
    assert "svc:[redacted]@" in repr(options)
    with pytest.raises(ConfigurationError, match=r"events-value") as started:
        async with running_worker(_agent(name), kafka_bootstrap_servers, options):
            pass
    async with KafkaAgentClient(
        kafka_bootstrap_servers, kafka_config=settings, serialization="schema_registry"
    ) as client:
        assert SECRET not in repr(client.kafka_config)
        with pytest.raises(ConfigurationError, match=r"turns-value") as submitted:
            await client.submit(name, q="x")
    for error in (started.value, submitted.value):
        assert "svc:[redacted]@" in str(error)
        assert SECRET not in str(error)
    assert SECRET not in caplog.text


def test_an_unreachable_registry_is_named_and_its_password_is_not(
    kafka_bootstrap_servers: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    config = tmp_path / "client.properties"
    config.write_text(f"schema.registry.url={_with_password(closed)}\n")
    args = ["topics", "apply", unique_name("noreg"), "--partitions", "1"]
    args += ["--bootstrap-servers", kafka_bootstrap_servers, "--kafka-config", str(config)]
    assert cli_main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: cannot reach the Schema Registry at http://svc:[redacted]@{closed[7:]} "
        "to register subject"
    ), err
    assert SECRET not in err
    with pytest.raises(SchemaRegistryUnavailableError, match="cannot reach the Schema Registry"):
        RegistryCodec({"url": closed}).encode("event", Event("status", "t", "a", 0, 1), "p.a.x")
