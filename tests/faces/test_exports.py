"""Every import path a user was shown keeps working: the package's ``__all__``, the faces
(``tools``, ``agent``, ``client``, ``context``, ``llm``, ``testing``) and every module path
that the docs, the README, the examples and the Makefile import.

``PUBLIC_PATHS`` was generated from main at ``58f1648``, before the package root's
modules moved into packages, by importing each path the docs and examples name and
listing each face's public classes and functions (``pyrula_stream.run_worker``, which
``docs/outages.md`` named but nothing exported, was left out). A path that moved still
imports, with a ``DeprecationWarning`` that names its new home; a removed name fails here.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import warnings
from types import ModuleType

import pytest

PUBLIC_PATHS: dict[str, tuple[str, ...]] = {
    "pyrula_stream": (
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
        "Fatal",
        "KafkaAgent",
        "KafkaAgentClient",
        "KafkaLimitError",
        "KafkaWorker",
        "LLMProviderUnavailable",
        "LLMRateLimited",
        "MCPServer",
        "MalformedRecordError",
        "MemoryBackend",
        "MemoryItem",
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
        "ThreadHandle",
        "ToolCallFailed",
        "ToolCallRejected",
        "ToolContext",
        "ToolRegistrationError",
        "TopicDriftError",
        "TurnFailure",
        "TurnHandle",
        "TurnNotRecorded",
        "TurnRequest",
        "UserError",
        "VersionBehavior",
        "VersionUnavailable",
        "WaitTimeout",
        "WorkerOptions",
        "WriteToolBlocked",
        "__version__",
        "as_tool",
        "build_mcp_server",
        "kafka_agent",
        "registered_agents",
        "tool",
    ),
    "pyrula_stream.agent": (
        "AgentTopics",
        "KafkaAgent",
        "kafka_agent",
        "registered_agents",
    ),
    "pyrula_stream.api_keys": (
        "APIKeyAuth",
        "load_api_keys",
    ),
    "pyrula_stream.bench": (),
    "pyrula_stream.bench.gateway": (),
    "pyrula_stream.chaos": (),
    "pyrula_stream.cli": ("format_event",),
    "pyrula_stream.client": (
        "KafkaAgentClient",
        "TurnHandle",
        "missing_agent_topic",
        "new_request",
        "turn_id_for",
    ),
    "pyrula_stream.context": (
        "AgentContext",
        "LLMHandle",
    ),
    "pyrula_stream.gateway": (
        "AgentClient",
        "AppOptions",
        "create_app",
    ),
    "pyrula_stream.history": ("export_turn",),
    "pyrula_stream.http_guard": (
        "HTTPAccess",
        "HTTPGuard",
        "principal_of",
    ),
    "pyrula_stream.integrations.faust": (
        "results_topic",
        "submit_turn",
        "turns_topic",
    ),
    "pyrula_stream.integrations.mcp_server": (
        "mcp_http_app",
        "serve_http",
    ),
    "pyrula_stream.integrations.quix": (
        "TurnRequestSerializer",
        "TurnResultDeserializer",
    ),
    "pyrula_stream.kafka.admin": ("apply_topics",),
    "pyrula_stream.llm": (
        "AnthropicLLM",
        "FakeLLM",
        "FallbackLLM",
        "LLMClient",
        "LLMRate",
        "LiteLLM",
        "ModelResponse",
        "OpenAILLM",
        "StreamingMode",
        "TextBlock",
        "TextDelta",
        "ToolDefinition",
        "ToolUseBlock",
        "Usage",
        "reply_text",
        "reply_tool_call",
        "reply_tool_calls",
    ),
    "pyrula_stream.llm.fake": (
        "count_model_calls",
        "last_tool_results",
        "reply_text",
        "reply_tool_call",
    ),
    "pyrula_stream.serde": (
        "TurnResult",
        "decode_turn_result",
    ),
    "pyrula_stream.testing": (
        "agent_topics_ready",
        "assert_replays",
        "local_kafka",
        "local_schema_registry",
        "read_topic",
        "running_worker",
        "unique_name",
        "wait_for",
    ),
    "pyrula_stream.tools": (
        "DurableToolCaller",
        "InvalidToolArguments",
        "ToolCallable",
        "ToolContext",
        "ToolOutcome",
        "ToolRuntime",
        "ToolSpec",
        "UnserializableToolResult",
        "canonical_json",
        "check_bindable",
        "current_boundary",
        "durable_boundary",
        "encode_result",
        "tool",
    ),
    "pyrula_stream.ui.feed": ("FeedOptions",),
    "pyrula_stream.ui.server": (
        "UIOptions",
        "serve_ui",
    ),
    "pyrula_stream.wire_guard": ("DecodeLimits",),
    "pyrula_stream.kafka.local_broker": (
        "check_java",
        "fetch_jars",
    ),
    "pyrula_stream.mcp.serve": (
        "build_mcp_server",
        "serve_http",
        "serve_stdio",
    ),
}


def _bound_names(module: str) -> set[str]:
    """The names a module's source binds at its top level (for a module whose optional
    extra is not installed in this venv, so it cannot be imported here)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, f"{module} is gone"
    with open(spec.origin, encoding="utf-8") as source:
        tree = ast.parse(source.read())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _import(module: str) -> ModuleType | None:
    """The module, or None when only a third-party extra it needs is missing here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as missing:
            if (missing.name or "").split(".")[0] == "pyrula_stream":
                raise
            return None


@pytest.mark.parametrize("module", sorted(PUBLIC_PATHS))
def test_every_public_path_still_imports(module: str) -> None:
    imported = _import(module)
    names = PUBLIC_PATHS[module]
    if imported is None:
        missing = sorted(set(names) - _bound_names(module))
    else:
        missing = [name for name in names if not hasattr(imported, name)]
    assert not missing, f"{module} no longer offers {missing}"


def test_the_package_exports_what_it_exported() -> None:
    import pyrula_stream

    assert set(PUBLIC_PATHS["pyrula_stream"]) - {"__version__"} <= set(pyrula_stream.__all__)
