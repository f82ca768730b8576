"""Agents (floor 4): what ``@kafka_agent`` declares, checked when it binds.

- ``definition``: ``KafkaAgent``, ``@kafka_agent``, ``AgentTopics``, the registry.
- ``limits``: ``AgentLimits``, a turn's budgets.
- ``tenants``: ``TenantLimits`` and the tenant a turn belongs to.
- ``output``: structured output types.
- ``as_tool``: an agent offered to another agent as a tool.

This module is the public face: ``from pyrula_stream.agent import kafka_agent`` keeps
working.
"""

from pyrula_stream.agent.definition import (
    AgentTopics,
    KafkaAgent,
    kafka_agent,
    registered_agents,
)

__all__ = ["AgentTopics", "KafkaAgent", "kafka_agent", "registered_agents"]
