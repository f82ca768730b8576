"""The public surface is chosen: this list changes only on purpose."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import pyrula_stream
from pyrula_stream.errors import BrokerUnavailableError, ErrorCode, PyrulaError
from pyrula_stream.kafka.local import broker as local_broker


def test_exported_names_are_pinned() -> None:
    assert sorted(pyrula_stream.__all__) == sorted(
        [
            "AgentContext",
            "AgentDepthExceeded",
            "AgentLimits",
            "AgentRegistrationError",
            "AgentTopics",
            "BranchUnresumable",
            "BudgetExceeded",
            "ConcurrentCallIdError",
            "ConfigurationError",
            "ContextWindowExceeded",
            "ErrorCode",
            "Event",
            "EventType",
            "Experiment",
            "Fatal",
            "KafkaAgent",
            "KafkaAgentClient",
            "KafkaLimitError",
            "KafkaWorker",
            "LLMProviderUnavailable",
            "LLMRateLimited",
            "MCPServer",
            "MemoryBackend",
            "MemoryItem",
            "MalformedRecordError",
            "MeshWorker",
            "NestedDurableOperationError",
            "Poison",
            "PoisonOptions",
            "ProviderStreamTruncated",
            "PyrulaError",
            "ReplayInputChanged",
            "RetryPolicy",
            "Signal",
            "SignalRefused",
            "SubAgentError",
            "TenantLimits",
            "ToolCallFailed",
            "ToolCallRejected",
            "ToolContext",
            "ToolRegistrationError",
            "TopicDriftError",
            "TurnFailed",
            "TurnFailure",
            "TurnHandle",
            "TurnNotRecorded",
            "ThreadHandle",
            "TurnRequest",
            "UserError",
            "VersionBehavior",
            "VersionUnavailable",
            "WaitTimeout",
            "WorkerOptions",
            "WriteToolBlocked",
            "as_tool",
            "build_mcp_server",
            "kafka_agent",
            "registered_agents",
            "tool",
        ]
    )
    for name in pyrula_stream.__all__:
        assert getattr(pyrula_stream, name) is not None


def test_every_error_is_under_the_root_and_has_a_code() -> None:
    for name in pyrula_stream.__all__:
        obj = getattr(pyrula_stream, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, PyrulaError), name
            assert obj.code is None or isinstance(obj.code, ErrorCode), name
    assert ErrorCode("replay_input_changed") is ErrorCode.REPLAY_INPUT_CHANGED


def test_missing_java_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(BrokerUnavailableError) as err:
        local_broker.check_java()
    message = str(err.value)
    assert "Java was not found" in message
    assert "KAFKA_BOOTSTRAP_SERVERS" in message and "docker compose" in message


def test_old_java_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_home = tmp_path / "jdk11"
    (fake_home / "bin").mkdir(parents=True)
    java = fake_home / "bin" / "java"
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(fake_home))
    with pytest.raises(BrokerUnavailableError, match=r"Java 17\+ is needed .* found 11"):
        local_broker.check_java()


def test_moved_module_keeps_its_documented_path_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``pyrula_stream.mcp.serve`` (the README names it) re-exports the moved server side."""
    from pyrula_stream.integrations import mcp_server

    monkeypatch.delitem(sys.modules, "pyrula_stream.mcp.serve", raising=False)
    with pytest.warns(DeprecationWarning, match="integrations.mcp_server"):
        old = importlib.import_module("pyrula_stream.mcp.serve")
    assert old.serve_stdio is mcp_server.serve_stdio
    assert old.serve_http is mcp_server.serve_http
    assert old.build_mcp_server is pyrula_stream.build_mcp_server
