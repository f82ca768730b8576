"""Error codes and the exception tree.

Every error a user can see derives from ``PyrulaError`` and carries an ``ErrorCode``.
``retriable`` says whether trying the same thing again can help; the worker uses it to
choose between a retry and the dead-letter topic.

    PyrulaError
    ├── UserError                      usage mistakes, raised where the mistake is made
    │   ├── ConfigurationError
    │   ├── ToolRegistrationError      bind-time refusals (approval, bad tool name)
    │   ├── AgentRegistrationError
    │   ├── ConcurrentCallIdError
    │   ├── NestedDurableOperationError
    │   ├── SignalRefused              a signal or answer the turn's worker refused
    │   └── KafkaLimitError            an API that needs a person or a timer loop
    ├── TurnNotRecorded                no history record of the turn (keep_history off, or expired)
    ├── TopicDriftError                existing topics differ from their spec
    ├── BrokerUnavailableError         no local broker could be started or reached
    ├── SchemaRegistryUnavailableError the Schema Registry did not answer
    ├── ObjectStoreUnavailable         an object store (S3, a folder) failed or did not answer
    ├── ThreadDeleteFailed             client.delete_thread: the delete failed or timed out
    ├── MalformedRecordError           a record that cannot be decoded (goes to the DLQ)
    ├── WaitTimeout                    a wait for a signal or an answer reached its deadline
    └── TurnFailure                    a turn ended with an error code
        ├── ToolCallRejected
        ├── ToolCallFailed             a tool called from agent code failed (its own code)
        ├── ReplayInputChanged
        ├── VersionUnavailable         a pinned turn's version is not on this worker
        ├── WriteToolBlocked           a branch asked for an effect it may not repeat
        ├── BranchUnresumable          a branch's original turn is gone
        ├── BudgetExceeded
        ├── ContextWindowExceeded
        ├── LLMRateLimited
        ├── LLMProviderUnavailable
        │   └── ProviderStreamTruncated
        ├── ToolTimeout
        ├── Fatal                      a tool error that must not be retried
        ├── Poison                     a tool error that quarantines the turn
        ├── TurnCancelled
        ├── PayloadTooLarge
        └── PayloadUnresolved          a payload reference whose object is missing or altered
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Codes a turn reports. The set is open: compare by value and keep a fallback."""

    STORE_UNAVAILABLE = "store_unavailable"
    STREAM_TOO_LARGE = "stream_too_large"
    TURN_TIMEOUT = "turn_timeout"
    VERSION_SKEW = "version_skew"
    CANCELLED = "cancelled"
    PAUSED = "paused"
    TOOL_ERROR = "tool_error"
    BUDGET_EXCEEDED = "budget_exceeded"
    AGENT_ERROR = "agent_error"
    BUFFER_OVERFLOW = "buffer_overflow"
    LLM_ERROR = "llm_error"
    LLM_RATE_LIMITED = "llm_rate_limited"
    LLM_PROVIDER_UNAVAILABLE = "llm_provider_unavailable"
    POISON_QUARANTINE = "poison_quarantine"
    MAX_RETRIES = "max_retries"
    OUTPUT_VALIDATION = "output_validation"
    AUTH_MISSING = "auth_missing"
    AUTH_INVALID = "auth_invalid"
    AUTH_FORBIDDEN = "auth_forbidden"
    NOT_FOUND = "not_found"
    INVALID_REQUEST = "invalid_request"
    BACKPRESSURE_REJECTED = "backpressure_rejected"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    INTERNAL = "internal"
    WAIT_TIMEOUT = "wait_timeout"
    CONTEXT_WINDOW_EXCEEDED = "context_window_exceeded"
    AUTH_UNAVAILABLE = "auth_unavailable"
    WRITE_TOOL_BLOCKED = "write_tool_blocked"
    CONTINUE_AS_NEW_NOT_SUPPORTED = "continue_as_new_not_supported"
    DUPLICATE_RUN = "duplicate_run"
    FATAL = "fatal"
    POISON = "poison"
    REPLAY_INPUT_CHANGED = "replay_input_changed"
    BRANCH_UNRESUMABLE = "branch_unresumable"
    STREAM_CARRY_MISSING = "stream_carry_missing"
    INTERRUPT_HANDLER_FAILED = "interrupt_handler_failed"
    AGENT_DEPTH_EXCEEDED = "agent_depth_exceeded"
    UNSOLICITED_REPLY = "unsolicited_reply"
    """A DLQ code: a reply that answers no call its parent's journal holds."""
    SIGNAL_REFUSED = "signal_refused"
    """A DLQ code: a signal or answer for a turn that is unknown, ended, or already
    answered that question (its sender is told why)."""
    RECORD_UNDELIVERABLE = "record_undeliverable"
    PAYLOAD_UNRESOLVED = "payload_unresolved"
    """A payload reference whose object is not in its store, or whose bytes differ."""


class PyrulaError(Exception):
    """Root of every pyrula-stream error."""

    code: ErrorCode | None = ErrorCode.INTERNAL
    retriable: bool = False

    def __init__(self, message: str = "", *, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class UserError(PyrulaError):
    """A usage mistake: fix the code or the configuration, a retry cannot help."""

    code = ErrorCode.INVALID_REQUEST


class ConfigurationError(UserError):
    pass


class ToolRegistrationError(UserError):
    """A tool cannot be offered to this agent (bad name, or needs a person's approval)."""


class AgentRegistrationError(UserError):
    pass


class KafkaLimitError(UserError):
    """An API that needs a person or a timer loop, which a Kafka consumer cannot host."""


class ConcurrentCallIdError(UserError):
    """Two direct calls of one tool name are running together under one ``id=``."""

    def __init__(self, tool_name: str, call_id: str) -> None:
        super().__init__(
            f"two calls of tool '{tool_name}' are running together under id={call_id!r}; "
            "pass a distinct id= to each concurrent call"
        )
        self.tool_name = tool_name
        self.call_id = call_id


class NestedDurableOperationError(UserError):
    """Durable orchestration attempted inside an atomic step or tool."""

    def __init__(
        self, operation: str, operation_name: str, boundary_kind: str, boundary_name: str
    ) -> None:
        super().__init__(
            f"{operation} '{operation_name}' cannot run inside {boundary_kind} "
            f"'{boundary_name}': durable operations are only allowed in the agent body"
        )
        self.operation = operation
        self.operation_name = operation_name
        self.boundary_kind = boundary_kind
        self.boundary_name = boundary_name


class TopicDriftError(PyrulaError):
    """Existing topics differ from their spec; the message lists every difference."""

    code = ErrorCode.INVALID_REQUEST


class BrokerUnavailableError(PyrulaError):
    """No broker could be started or reached."""

    code = ErrorCode.STORE_UNAVAILABLE
    retriable = True


class SchemaRegistryUnavailableError(PyrulaError):
    """The Schema Registry at ``schema.registry.url`` could not be reached (names it)."""

    code = ErrorCode.STORE_UNAVAILABLE
    retriable = True


class ObjectStoreUnavailable(PyrulaError):
    """The object store that holds values by reference failed or did not answer (the
    message names the store and bucket, never a credential)."""

    code = ErrorCode.STORE_UNAVAILABLE
    retriable = True


class ThreadDeleteFailed(PyrulaError):
    """``client.delete_thread`` could not confirm the delete. Either its delete turn ended
    with ``run:error`` (``code`` is that turn's; the thread is unchanged), or no worker
    finished it in time (``wait_timeout``, retriable: the delete stays queued and runs when
    a worker takes it). A delete is safe to repeat."""

    def __init__(self, message: str, *, code: ErrorCode, agent: str, thread_id: str) -> None:
        super().__init__(message, code=code)
        self.retriable = code == ErrorCode.WAIT_TIMEOUT
        self.agent = agent
        self.thread_id = thread_id


class TurnFailed(PyrulaError):
    """A turn the client waited on ended with ``run:error``: raised by ``client.ask``, so
    a failed turn reads as its code and message, not as a missing ``result``. ``code`` is
    the turn's (``internal`` when it is not one of ours); ``data`` is the event's."""

    def __init__(self, *, agent: str, turn_id: str, data: dict[str, Any]) -> None:
        raw = str(data.get("code", ErrorCode.INTERNAL))
        known = raw in ErrorCode.__members__.values()
        super().__init__(
            f"turn {turn_id} of agent '{agent}' failed with {raw}: "
            f"{data.get('message') or '(no message)'}",
            code=ErrorCode(raw) if known else ErrorCode.INTERNAL,
        )
        self.agent = agent
        self.turn_id = turn_id
        self.data = data


class TurnNotRecorded(UserError):
    """A turn asked for by id has no record in ``<agent>.history``."""

    code = ErrorCode.NOT_FOUND


class UnknownTopicError(UserError):
    """A topic the call needs does not exist (the message says how to create it)."""

    def __init__(self, message: str, *, topic: str) -> None:
        super().__init__(message)
        self.topic = topic


class OverCapError(UserError):
    """An id or a count past its cap (``wire/caps.py``), refused by the client before it
    produced anything: a worker would have dead-lettered the record."""


class KafkaAuthenticationError(ConfigurationError):
    """The cluster refused the client's credentials (a wrong password, an unknown user)."""


class KafkaAuthorizationError(ConfigurationError):
    """The cluster's ACLs deny an operation on a topic or group (names both)."""


class MalformedRecordError(PyrulaError):
    """A record that cannot be decoded or validated; it goes to the dead-letter topic."""

    code = ErrorCode.INVALID_REQUEST


class TurnFailure(PyrulaError):
    """A turn ended with an error code; published as ``run:error``."""

    code = ErrorCode.AGENT_ERROR

    def __init__(
        self, message: str = "", *, code: ErrorCode | None = None, detail: Any = None
    ) -> None:
        super().__init__(message, code=code)
        self.detail = detail


class WaitTimeout(PyrulaError):
    """A ``wait_for_signal`` or ``interrupt`` reached its deadline with no answer.

    An ordinary exception, unlike the suspension of a parked turn: the body is running
    again when it is raised and may catch it and carry on. Uncaught, the turn ends with
    ``wait_timeout``."""

    code = ErrorCode.WAIT_TIMEOUT

    def __init__(
        self,
        wait_kind: str,
        name: str,
        call_index: int | None = None,
        deadline: datetime | None = None,
        message: str | None = None,
    ) -> None:
        when = f" at {deadline.isoformat()}" if deadline is not None else ""
        super().__init__(message or f"{wait_kind} wait for {name!r} timed out{when}")
        self.wait_kind = wait_kind
        self.name = name
        self.call_index = call_index
        self.deadline = deadline


class SignalRefused(UserError):
    """A signal or answer the turn's worker refused: the turn is ``unknown`` on its
    partition, has ``ended``, the question was ``already_answered``, has ``expired`` or
    is ``not_asked`` (an answer names the question the turn parked on), the signal is
    ``too_large`` to journal, or the turn holds ``too_many`` signals no wait took
    (``MAX_PENDING_SIGNALS``). ``reason`` is one of those; ``message`` is the worker's own
    words."""

    code = ErrorCode.SIGNAL_REFUSED

    def __init__(self, message: str, *, reason: str, turn_id: str, name: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.turn_id = turn_id
        self.name = name


class ToolCallRejected(TurnFailure):
    """A reviewer, or the approval deadline, kept a direct call to a gated tool from
    running. ``reason`` is the reviewer's text, ``expired`` true when nobody answered."""

    code = ErrorCode.TOOL_ERROR

    def __init__(self, tool_name: str, *, reason: str | None = None, expired: bool = False) -> None:
        super().__init__(f"call to tool '{tool_name}' was not approved")
        self.tool_name = tool_name
        self.reason = reason
        self.expired = expired


class ToolCallFailed(TurnFailure):
    """A tool called from agent code failed; carries the tool's own error code and type.

    ``Fatal`` keeps ``fatal``, a timeout ``tool_error``, and so on, so a turn that lets it
    propagate reports what the tool raised, not a generic agent error.
    """

    def __init__(self, tool_name: str, message: str, *, code: str, error_type: str) -> None:
        try:
            error_code = ErrorCode(code)
        except ValueError:
            error_code = ErrorCode.TOOL_ERROR
        super().__init__(message, code=error_code, detail={"tool": tool_name})
        self.tool_name = tool_name
        self.error_type = error_type


class ReplayInputChanged(TurnFailure):
    code = ErrorCode.REPLAY_INPUT_CHANGED


class WriteToolBlocked(TurnFailure):
    """A branch needed an effect the original never had; ``detail["reason"]`` says which
    kind (``write``, ``unmarked``, ``step``, ``effect``)."""

    code = ErrorCode.WRITE_TOOL_BLOCKED


class BranchUnresumable(TurnFailure):
    """A branch's original turn is gone (``detail["reason"]``: ``parent_missing``)."""

    code = ErrorCode.BRANCH_UNRESUMABLE


class VersionUnavailable(TurnFailure):
    """A pinned turn started on a version whose body this worker does not have."""

    code = ErrorCode.VERSION_SKEW


class BudgetExceeded(TurnFailure):
    code = ErrorCode.BUDGET_EXCEEDED


class ContextWindowExceeded(TurnFailure):
    code = ErrorCode.CONTEXT_WINDOW_EXCEEDED


class LLMError(TurnFailure):
    code = ErrorCode.LLM_ERROR


class LLMRateLimited(TurnFailure):
    code = ErrorCode.LLM_RATE_LIMITED
    retriable = True


class LLMProviderUnavailable(TurnFailure):
    code = ErrorCode.LLM_PROVIDER_UNAVAILABLE
    retriable = True


class ProviderStreamTruncated(LLMProviderUnavailable):
    """A provider stream ended without its terminal event after it was read to the end."""


class ToolTimeout(TurnFailure):
    code = ErrorCode.TOOL_ERROR
    retriable = True


class MCPServerUnavailable(TurnFailure):
    """An MCP server could not be reached (or dropped the connection); retried per the
    server's ``retry``. In a tool call the model reads it; in discovery it fails the turn."""

    code = ErrorCode.TOOL_ERROR
    retriable = True


class Fatal(TurnFailure):
    """Raise from a tool to fail the call without any retry."""

    code = ErrorCode.FATAL


class Poison(TurnFailure):
    """Raise from a tool to quarantine the turn: no retry, the turn goes to the DLQ."""

    code = ErrorCode.POISON


class AgentDepthExceeded(TurnFailure):
    """A ``call_agent`` past ``max_agent_depth``: refused before any child is produced."""

    code = ErrorCode.AGENT_DEPTH_EXCEEDED


class SubAgentError(TurnFailure):
    """A sub-agent's turn ended with ``run:error``; ``code`` is the child's code."""

    def __init__(self, agent: str, child_turn_id: str, code: str, message: str) -> None:
        super().__init__(
            f"sub-agent '{agent}' (turn {child_turn_id}) failed with {code}: {message}"
        )
        try:
            self.code = ErrorCode(code)
        except ValueError:
            self.code = ErrorCode.AGENT_ERROR
        self.agent = agent
        self.child_turn_id = child_turn_id
        self.child_code = code
        self.child_message = message


class TurnCancelled(TurnFailure):
    code = ErrorCode.CANCELLED


class PayloadTooLarge(TurnFailure):
    """A record would exceed the broker's size limit; fails fast, never retried."""

    code = ErrorCode.STREAM_TOO_LARGE


class PayloadUnresolved(TurnFailure):
    """A payload reference (``$pyrula_ref``) that cannot be read back: its store is not
    configured here, its object is gone, or its bytes differ from its size and hash. The
    message names the store and the key."""

    code = ErrorCode.PAYLOAD_UNRESOLVED
