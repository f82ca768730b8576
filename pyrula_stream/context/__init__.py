"""The operations an agent body calls (floor 6), each a step maker on the step kernel.

- ``agent_context``: ``AgentContext``, what a body receives, and ``LLMHandle``.
- ``tool_loop``: the model's tool loop (model call, tool calls, model call, ...).
- ``tool_calls``: one tool call, durable.
- ``agent_calls``: calling another agent (a sub-agent turn, parked for its reply).
- ``memory_calls``: reading and writing shared memory as steps.
- ``waits``: ``ctx.wait_for_signal`` and durable timers.
- ``approvals``: a person's approval of a tool call.
- ``compaction``: keeping a long turn's history inside its context window.

This module is the public face: ``from pyrula_stream.context import AgentContext`` keeps
working.
"""

from pyrula_stream.context.agent_context import AgentContext, LLMHandle

__all__ = ["AgentContext", "LLMHandle"]
