"""``as_tool(agent)``: offer a sub-agent to the model as a tool.

The model sees the agent's parameters (from its signature) as the tool's input schema.
When the model calls it, the tool loop makes a ``call_agent`` (the same call and reply
steps, the same parking and limits) instead of running a function, so it is never
approval-gated and never runs inside a tool's boundary.
"""

from __future__ import annotations

import inspect
from typing import Any, get_type_hints

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.errors import KafkaLimitError, UserError
from pyrula_stream.tools.contract import ToolCallable, ToolContext, tool


class AgentTool(ToolCallable):
    """A sub-agent offered as a tool; ``agent`` is the child the loop calls."""

    def __init__(
        self, agent: KafkaAgent, *, name: str | None = None, description: str | None = None
    ) -> None:
        if not isinstance(agent, KafkaAgent):
            raise UserError(f"as_tool takes a @kafka_agent, not {type(agent).__name__}")
        built = tool(
            _stand_in(agent),
            name=name or agent.name,
            description=description or inspect.getdoc(agent.fn) or f"Ask the {agent.name} agent.",
        )
        assert isinstance(built, ToolCallable)
        super().__init__(built.__wrapped__, built.spec, built._arguments_model)
        self.agent = agent


def as_tool(
    agent: KafkaAgent, *, name: str | None = None, description: str | None = None
) -> AgentTool:
    """The agent as a tool for ``@kafka_agent(tools=[...])`` or ``ctx.llm.run(tools=[...])``."""
    return AgentTool(agent, name=name, description=description)


def _stand_in(agent: KafkaAgent) -> Any:
    """A function with the agent's parameters and a ToolContext first, for the schema; the
    loop never calls it (a direct call from agent code is refused: use call_agent)."""

    async def call(ctx: ToolContext, **params: Any) -> Any:
        raise KafkaLimitError(
            f"'{agent.name}' is a sub-agent offered as a tool; from agent code call "
            f"ctx.call_agent({agent.name}, ...) instead"
        )

    sig = inspect.signature(agent.fn)
    hints = get_type_hints(agent.fn)
    params = list(sig.parameters.values())
    if not params:
        raise UserError(f"agent '{agent.name}' takes no context parameter")
    params = [params[0].replace(annotation=ToolContext)] + [
        p.replace(annotation=hints.get(p.name, p.annotation)) for p in params[1:]
    ]
    call.__signature__ = sig.replace(parameters=params, return_annotation=Any)  # type: ignore[attr-defined]
    call.__annotations__ = {p.name: p.annotation for p in params} | {"return": Any}
    call.__name__ = call.__qualname__ = agent.name
    return call
