"""Internal (Anthropic-shaped) messages, tools and tool choice in Chat Completions terms.

Kept apart from the adapter so the mapping can be read (and tested) on its own.
"""

from __future__ import annotations

import json
from typing import Any

from pyrula_stream.llm.base import OutputFormat, ToolDefinition

# What strict structured output accepts in a schema (OpenAI's "supported schemas"); a
# schema using anything else is sent with strict off, as guidance the result is validated
# against afterwards, rather than refused by the API.
_STRICT_KEYWORDS = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "anyOf", "enum",
        "const", "$ref", "$defs", "description", "title", "pattern", "format", "minimum",
        "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minItems", "maxItems",
    }
)  # fmt: skip
_STRICT_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)

STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content", "")
    if isinstance(content, list):
        content = "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    text = str(content)
    # Chat Completions has no error flag on tool messages; say it in the text.
    return f"Error: {text}" if block.get("is_error") else text


def to_openai_messages(
    messages: list[dict[str, Any]], system: str | None = None
) -> list[dict[str, Any]]:
    """Internal (Anthropic-shaped) messages as Chat Completions messages."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        role, content = message["role"], message.get("content")
        if not isinstance(content, list):
            out.append({"role": role, "content": content if content is not None else ""})
            continue
        blocks = [b for b in content if isinstance(b, dict)]
        texts = [
            str(b.get("text", "")) for b in blocks if b.get("type") == "text" and b.get("text")
        ]
        if role == "assistant":
            calls = [
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})},
                }
                for b in blocks
                if b.get("type") == "tool_use"
            ]
            wire: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                wire["tool_calls"] = calls
            elif wire["content"] is None:
                wire["content"] = ""
            out.append(wire)
            continue
        # Tool results must directly follow the assistant message that asked for them.
        for b in blocks:
            if b.get("type") == "tool_result":
                out.append(
                    {"role": "tool", "tool_call_id": b["tool_use_id"], "content": _result_text(b)}
                )
        if len(texts) == 1:
            out.append({"role": role, "content": texts[0]})
        elif texts:
            out.append({"role": role, "content": [{"type": "text", "text": t} for t in texts]})
    return out


def to_openai_tools(tools: list[ToolDefinition]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.input_schema,
            },
        }
        for t in tools
    ]


def to_openai_tool_choice(choice: dict[str, Any]) -> str | dict[str, Any]:
    """An internal (Anthropic-shaped) ``tool_choice`` in Chat Completions terms."""
    kind = choice.get("type")
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def to_openai_response_format(output: OutputFormat) -> dict[str, Any]:
    """``response_format`` for Chat Completions: the schema, strict when it can be."""
    return {
        "type": "json_schema",
        "json_schema": {
            "name": output.name,
            "schema": output.schema,
            "strict": _strict_compatible(output.schema),
        },
    }


def _strict_compatible(node: Any) -> bool:
    """Whether strict mode takes the schema as it is: every property required (strict
    has no optional fields) and only the keywords and formats strict supports."""
    if isinstance(node, list):
        return all(_strict_compatible(n) for n in node)
    if not isinstance(node, dict):
        return True
    if not _STRICT_KEYWORDS.issuperset(node):
        return False
    if "format" in node and node["format"] not in _STRICT_FORMATS:
        return False
    properties = node.get("properties")
    if isinstance(properties, dict):
        if set(node.get("required", ())) != set(properties):
            return False
        if not all(_strict_compatible(p) for p in properties.values()):
            return False
    return all(
        _strict_compatible(v)
        for k, v in node.items()
        if k in ("items", "anyOf", "additionalProperties")
    ) and all(_strict_compatible(d) for d in dict(node.get("$defs") or {}).values())
