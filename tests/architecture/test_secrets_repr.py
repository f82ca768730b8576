"""No secret in a repr: every public configuration object, built with marked credentials,
keeps them out of ``repr``, ``str`` and a log line.

The objects are found, not listed: the classes of the public packages' ``__all__`` and
every public dataclass of every submodule. One whose fields or parameters can hold a
credential (by name: ``kafka_config``, ``headers``, ``api_key``, ``url``, ...) needs a
builder below, so a new configuration object cannot slip past this test.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import pkgutil
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import pyrula_stream
import pyrula_stream.llm
import pyrula_stream.mcp
from pyrula_stream import (
    AgentLimits,
    KafkaAgent,
    KafkaAgentClient,
    KafkaWorker,
    MCPServer,
    MeshWorker,
    ToolContext,
    WorkerOptions,
    kafka_agent,
    tool,
)
from pyrula_stream.kafka.group import TurnRecord
from pyrula_stream.llm import FakeLLM, reply_text, reply_tool_call
from pyrula_stream.testing import running_worker, unique_name
from pyrula_stream.wire.serde import TurnRequest

MARK = "Zq7mArKed9secret"
"""In every credential below; shaped like no provider key, so only real redaction hides it."""

URL = f"https://svc-user:{MARK}@svc.example:8443/v1?api_key={MARK}"
KAFKA = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "worker",
    "sasl.password": MARK,
    "ssl.key.password": MARK,
    "sasl.oauthbearer.client.secret": MARK,
    "schema.registry.url": URL,
    "schema.registry.basic.auth.user.info": f"reg:{MARK}",
}
PUBLIC_PACKAGES = (pyrula_stream, pyrula_stream.llm, pyrula_stream.mcp)
CREDENTIAL = re.compile(
    r"^(kafka_config|consumer_config|producer_config|headers|env|command|url|base_url|conf|"
    r"settings|deps|memory_backend|mcp_servers|llm|options)$"
    r"|(^|_)(password|passwords|secret|secrets|token|api_key|api_keys|credentials?|auth)($|_)"
)
NOT_CONFIG = {
    # Records read from or written to topics: their headers are the wire's (lineage,
    # content type, DLQ reasons), never a credential of ours.
    "pyrula_stream.kafka.io.TopicRecord",
    "pyrula_stream.kafka.offsets.ConsumedRecord",
    "pyrula_stream.wire.records.OutRecord",
    "pyrula_stream.wire.records.SourceRecord",
    "pyrula_stream.ui.model.DeadLetter",
    "pyrula_stream.chaos.hostile_record.HostileRecord",  # a generated record chaos sends
    "pyrula_stream.chaos.hostile_record.FollowUp",  # one sent after it
    # The chaos verifier's tally of what the journal holds (``llm``: model-call times).
    "pyrula_stream.chaos.verify.JournalView",
    # A partition's crash count; its ``options`` are the poison retry policy (two numbers).
    "pyrula_stream.runtime.poison.CrashGuard",
    # A local model server's scripted response: its headers are the reply's content type.
    "pyrula_stream.testing_servers.scripted_http.Reply",
}
BUILT_IN_A_TURN = {
    # Only the worker builds it: checked from inside a real turn, below.
    "pyrula_stream.context.agent_context.AgentContext",
}
OPTIONAL = ("pyrula_stream.integrations.quix",)  # needs the quixstreams extra


DEPRECATED = {"pyrula_stream.mcp.serve"}
"""Old paths that only re-export (and warn): their classes are found where they live."""


def _modules() -> Iterator[Any]:
    with warnings.catch_warnings():  # walk_packages imports the shim package to look inside
        warnings.filterwarnings("ignore", "pyrula_stream.mcp.serve moved", DeprecationWarning)
        infos = list(pkgutil.walk_packages(pyrula_stream.__path__, "pyrula_stream."))
    for info in infos:
        if info.name.endswith("__main__") or info.name in OPTIONAL or info.name in DEPRECATED:
            continue
        yield importlib.import_module(info.name)


def _parameters(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    try:
        return list(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return []


def _config_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for package in PUBLIC_PACKAGES:
        for name in package.__all__:
            obj = getattr(package, name)
            if inspect.isclass(obj):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    for module in _modules():
        for name, obj in vars(module).items():
            defined_here = inspect.isclass(obj) and obj.__module__ == module.__name__
            # An abstract base (``SDKAdapter``) has no instances: its subclasses are built.
            buildable = defined_here and not inspect.isabstract(obj)
            if buildable and not name.startswith("_") and dataclasses.is_dataclass(obj):
                found[f"{module.__name__}.{name}"] = obj
    return {
        path: cls
        for path, cls in found.items()
        if path not in NOT_CONFIG and any(CREDENTIAL.search(p) for p in _parameters(cls))
    }


@dataclasses.dataclass
class _Deps:
    """What users hand to ``deps=``: their own clients, with their own keys."""

    db_password: str = MARK


def _servers() -> tuple[MCPServer, MCPServer]:
    return (
        MCPServer("github", url=URL, headers={"Authorization": f"Bearer {MARK}"}),
        MCPServer("files", command=["files-server", f"--token={MARK}"], env={"FILES_TOKEN": MARK}),
    )


def _agent() -> KafkaAgent:
    @kafka_agent(
        name="secrets-repr",
        llm=FakeLLM([reply_text("hi")]),
        mcp_servers=_servers(),
        deps=_Deps(),
        limits=AgentLimits(),
    )
    async def body(ctx: Any) -> Any:
        return await ctx.llm.run([{"role": "user", "content": "hi"}])

    return body


def _options() -> WorkerOptions:
    return WorkerOptions(
        kafka_config=KAFKA,
        consumer_config={"sasl.password": MARK},
        producer_config={"ssl.key.password": MARK},
        memory_backend=_Deps(),
    )


def _openai() -> Any:
    from pyrula_stream.llm import OpenAILLM

    return OpenAILLM("gpt-4o-mini", api_key=MARK, base_url=URL)


def _anthropic() -> Any:
    from pyrula_stream.llm import AnthropicLLM

    return AnthropicLLM("claude-sonnet-4-5", api_key=MARK, base_url=URL)


def _litellm() -> Any:
    from pyrula_stream.llm import LiteLLM

    return LiteLLM(
        "bedrock/anthropic.claude-sonnet-4-5",
        api_key=MARK,
        api_base=URL,
        extra={"aws_secret_access_key": MARK, "aws_region_name": "eu-west-1"},
    )


def _http_access() -> Any:
    from pyrula_stream.access.api_keys import APIKeyAuth
    from pyrula_stream.access.http_guard import HTTPAccess

    return HTTPAccess(auth=APIKeyAuth({"ops": MARK}, allow_short_keys=True))


def _app_options() -> object:
    from pyrula_stream.access.api_keys import APIKeyAuth
    from pyrula_stream.gateway.options import AppOptions

    return AppOptions(auth=APIKeyAuth({"web": MARK}, allow_short_keys=True))


def _feed() -> Any:
    from pyrula_stream.ui.feed import FeedOptions

    return FeedOptions("localhost:9092", kafka_config=KAFKA)


def _broker_security() -> Any:
    from pyrula_stream.kafka.local.broker import BrokerSecurity

    return BrokerSecurity("/tmp/ca.pem", "/tmp/keystore.p12", {"client": MARK}, MARK)


def _raw_record() -> Any:
    from pyrula_stream.kafka.once import RawRecord

    return RawRecord(0, 7, b"k", b"v", (("authorization", f"Bearer {MARK}".encode()),), 1)


def _local_registry() -> Any:
    import subprocess
    import sys

    from pyrula_stream.kafka.local.registry import LocalRegistry

    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return LocalRegistry(URL, process, "/tmp/registry.log")


def _recorded_request() -> Any:
    from pyrula_stream.testing_servers.scripted_http import RecordedRequest

    return RecordedRequest("POST", "/v1/messages", {"x-api-key": MARK}, b"{}")


def _local_s3() -> Any:
    from pyrula_stream.objects.s3_server import LocalS3

    return LocalS3("http://127.0.0.1:9", "/tmp/pyrula-s3-none", f"key{MARK}", MARK, False)


BUILDERS: dict[str, Callable[[], Any]] = {
    "pyrula_stream.tools.mcp_servers.MCPServer": lambda: _servers(),
    "pyrula_stream.agent.definition.KafkaAgent": _agent,
    "pyrula_stream.runtime.options.WorkerOptions": _options,
    "pyrula_stream.client.kafka_client.KafkaAgentClient": lambda: KafkaAgentClient(
        "localhost:9092", kafka_config=KAFKA
    ),
    "pyrula_stream.runtime.worker.KafkaWorker": lambda: KafkaWorker(
        _agent(), bootstrap_servers="localhost:9092", options=_options()
    ),
    "pyrula_stream.runtime.mesh.MeshWorker": lambda: MeshWorker(
        [_agent()], bootstrap_servers="localhost:9092", options=_options()
    ),
    "pyrula_stream.llm.openai.OpenAILLM": _openai,
    "pyrula_stream.llm.anthropic.AnthropicLLM": _anthropic,
    "pyrula_stream.llm.litellm.LiteLLM": _litellm,
    "pyrula_stream.ui.feed.FeedOptions": _feed,
    "pyrula_stream.kafka.local.broker.BrokerSecurity": _broker_security,
    "pyrula_stream.kafka.local.registry.LocalRegistry": _local_registry,
    "pyrula_stream.tools.contract.ToolContext": lambda: ToolContext(
        httpx.AsyncClient(), deps=_Deps()
    ),
    "pyrula_stream.access.http_guard.HTTPAccess": lambda: _http_access(),
    "pyrula_stream.gateway.options.AppOptions": lambda: _app_options(),
    "pyrula_stream.kafka.group.TurnRecord": lambda: TurnRecord(
        0, 0, TurnRequest("t-1", "triage", {}), headers={"authorization": f"Bearer {MARK}"}
    ),
    "pyrula_stream.kafka.once.RawRecord": lambda: _raw_record(),
    "pyrula_stream.objects.s3_server.LocalS3": _local_s3,
    "pyrula_stream.testing_servers.scripted_http.RecordedRequest": _recorded_request,
}


def test_every_configuration_object_with_a_credential_has_a_builder() -> None:
    found = _config_classes()
    assert "pyrula_stream.tools.mcp_servers.MCPServer" in found, "the discovery found nothing"
    covered = set(BUILDERS) | BUILT_IN_A_TURN
    assert sorted(set(found) - covered) == []
    assert sorted(covered - set(found)) == [], "a builder for a class no longer found"


@pytest.mark.parametrize("path", sorted(BUILDERS))
def test_no_marked_secret_in_repr_str_or_a_log_line(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    built = BUILDERS[path]()
    objects = built if isinstance(built, tuple) else (built,)
    logger = logging.getLogger("pyrula_stream.test_secrets")
    with caplog.at_level(logging.INFO, logger=logger.name):
        for obj in objects:
            logger.info("built %s, as repr %r", obj, obj)
    for obj in objects:
        assert MARK not in repr(obj), repr(obj)
        assert MARK not in str(obj), str(obj)
    assert caplog.records, "nothing was logged"
    assert MARK not in caplog.text, caplog.text


def test_redacted_reprs_still_say_what_is_configured() -> None:
    """Redaction keeps the names (which header, which variable, which host): a repr stays
    useful for debugging."""
    http, stdio = _servers()
    assert "Authorization" in repr(http) and "svc.example" in repr(http)
    assert "FILES_TOKEN" in repr(stdio) and "files-server" in repr(stdio)
    assert "sasl.username" in repr(_options())


async def test_the_contexts_of_a_real_turn_keep_deps_out(
    kafka_bootstrap_servers: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``AgentContext`` and the bound ``ToolContext`` carry the agent's ``deps`` (users'
    clients, with their keys): a body or tool that logs its context must not print them."""
    logger = logging.getLogger("pyrula_stream.test_secrets")

    @tool
    async def peek(ctx: ToolContext) -> str:
        logger.info("tool context %s", ctx)
        return repr(ctx)

    @kafka_agent(
        name=unique_name("secrets-ctx"),
        llm=FakeLLM([reply_tool_call("peek"), reply_text("done")]),
        tools=[peek],
        deps=_Deps(),
        partitions=1,
    )
    async def agent(ctx: Any) -> Any:
        logger.info("agent context %s %r", ctx, ctx)
        await ctx.llm.run([{"role": "user", "content": "peek"}])
        return {"agent": repr(ctx), "str": str(ctx)}

    with caplog.at_level(logging.INFO, logger=logger.name):
        async with (
            running_worker(agent, kafka_bootstrap_servers, WorkerOptions(shutdown_grace=0.2)),
            KafkaAgentClient(kafka_bootstrap_servers) as client,
        ):
            events = await client.run(agent.name, timeout=60)
    assert events[-1].type == "run:complete", events[-1]
    assert "tool context" in caplog.text and "agent context" in caplog.text
    seen = [repr(e.data) for e in events] + [caplog.text]
    assert [text for text in seen if MARK in text] == []
