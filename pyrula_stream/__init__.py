"""pyrula-stream: run LLM agents as Apache Kafka stream processors (floor 9, the face).

Turn requests arrive on ``<prefix>.<agent>.turns``; ``@kafka_agent`` workers (one consumer
group) run the model's tool loop, journal every step to a compacted changelog, and publish
the turn's events exactly once to ``<prefix>.<agent>.events``.
"""

from pyrula_stream import _moved
from pyrula_stream._version import __version__ as __version__
from pyrula_stream.agent.as_tool import as_tool
from pyrula_stream.agent.definition import (
    AgentTopics,
    KafkaAgent,
    VersionBehavior,
    kafka_agent,
    registered_agents,
)
from pyrula_stream.agent.experiments import Experiment
from pyrula_stream.agent.limits import AgentLimits
from pyrula_stream.agent.tenants import TenantLimits
from pyrula_stream.client.kafka_client import KafkaAgentClient, TurnHandle
from pyrula_stream.context.agent_context import AgentContext
from pyrula_stream.errors import (
    AgentDepthExceeded,
    AgentRegistrationError,
    BranchUnresumable,
    BudgetExceeded,
    ConcurrentCallIdError,
    ConfigurationError,
    ContextWindowExceeded,
    ErrorCode,
    Fatal,
    KafkaLimitError,
    LLMProviderUnavailable,
    LLMRateLimited,
    MalformedRecordError,
    NestedDurableOperationError,
    Poison,
    ProviderStreamTruncated,
    PyrulaError,
    ReplayInputChanged,
    SignalRefused,
    SubAgentError,
    ToolCallFailed,
    ToolCallRejected,
    ToolRegistrationError,
    TopicDriftError,
    TurnFailed,
    TurnFailure,
    TurnNotRecorded,
    UserError,
    VersionUnavailable,
    WaitTimeout,
    WriteToolBlocked,
)
from pyrula_stream.integrations.mcp_server import build_mcp_server
from pyrula_stream.runtime.mesh import MeshWorker
from pyrula_stream.runtime.options import PoisonOptions, WorkerOptions
from pyrula_stream.runtime.worker import KafkaWorker
from pyrula_stream.state.memory import MemoryBackend, MemoryItem
from pyrula_stream.state.threads import ThreadHandle
from pyrula_stream.tools.contract import ToolContext, tool
from pyrula_stream.tools.mcp_servers import MCPServer
from pyrula_stream.tools.retry import RetryPolicy
from pyrula_stream.wire.events import Event, EventType
from pyrula_stream.wire.serde import TurnRequest
from pyrula_stream.wire.signals import Signal

__all__ = [
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
    "TurnFailed",
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
    "as_tool",
    "build_mcp_server",
    "kafka_agent",
    "registered_agents",
    "tool",
]

_moved.install()
