"""Typed results: ``@kafka_agent(output_type=...)`` validates what a turn returns.

The output type's JSON Schema goes to the model natively when the provider takes one
(``OpenAILLM``: ``response_format``; ``AnthropicLLM``: ``output_config.format``) and the
schema is a closed object (fixed properties, as a pydantic model's is); otherwise it is
added to the system prompt. Either way, a model answer that does not validate is sent back with the
validation error (``output_retries`` times) before the turn fails with
``output_validation``. The validated value, dumped to JSON data, is the turn's result.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from pyrula_stream.errors import ErrorCode, TurnFailure
from pyrula_stream.llm.base import OutputFormat

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(.*?)\n?```\s*$", re.DOTALL)
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_VALUES = ("enum", "const", "default", "examples")
"""Keywords whose values are data, not schemas: never walked as schemas."""


class OutputValidationError(TurnFailure):
    """The turn's result does not validate against the agent's ``output_type``."""

    code = ErrorCode.OUTPUT_VALIDATION


@dataclass(frozen=True)
class OutputSpec:
    """Validation and the model-facing schema of one agent's ``output_type``."""

    output_type: Any
    adapter: TypeAdapter[Any] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "adapter", TypeAdapter(self.output_type))

    @property
    def is_text(self) -> bool:
        """A plain ``str`` output: the model's text is the result as it is."""
        return self.output_type is str

    def json_schema(self) -> dict[str, Any]:
        return self.adapter.json_schema()

    def native_format(self) -> OutputFormat | None:
        """The schema as providers' structured output takes it, or ``None`` when it cannot
        be said there without changing its meaning (a root that is not an object, or an
        object with free-form keys, such as a ``dict`` field): those stay in the prompt."""
        if self.is_text:
            return None
        schema = self.json_schema()
        if schema.get("type") != "object" or not _closed(schema):
            return None
        raw = getattr(self.output_type, "__name__", "") or "result"
        return OutputFormat(name=_NAME_CHARS.sub("_", raw)[:64], schema=_closing(schema))

    def instructions(self) -> str:
        """What the system prompt gains: answer with JSON matching the schema."""
        schema = json.dumps(self.json_schema(), separators=(",", ":"), sort_keys=True)
        return (
            "Your final answer must be only a JSON value (no prose, no code fence) that "
            f"matches this JSON Schema:\n{schema}"
        )

    def validate(self, value: Any) -> Any:
        """The value as JSON data; a string is parsed as JSON unless the type is ``str``.

        Raises ``pydantic.ValidationError``.
        """
        if isinstance(value, str) and not self.is_text:
            fenced = _FENCE.match(value)
            validated = self.adapter.validate_json(fenced.group(1) if fenced else value)
        else:
            validated = self.adapter.validate_python(value)
        return self.adapter.dump_python(validated, mode="json")

    @staticmethod
    def feedback(error: ValidationError) -> str:
        """What the model is told when its answer did not validate."""
        return (
            "Your answer does not match the required output schema:\n"
            f"{error}\nAnswer again with only the corrected JSON value."
        )

    @staticmethod
    def failure(error: ValidationError, attempts: int) -> OutputValidationError:
        return OutputValidationError(
            f"the result does not validate against output_type after {attempts} "
            f"attempt(s): {error}",
            detail=error.errors(include_url=False, include_input=False),
        )


def _closed(node: Any) -> bool:
    """Every object in the schema has fixed properties (no free-form or extra keys)."""
    if isinstance(node, list):
        return all(_closed(n) for n in node)
    if not isinstance(node, dict):
        return True
    if node.get("type") == "object":
        if "properties" not in node or "patternProperties" in node:
            return False
        if node.get("additionalProperties", False) is not False:
            return False
    return all(_closed(v) for k, v in node.items() if k not in _VALUES)


def _closing(node: Any) -> Any:
    """A copy that says ``additionalProperties: false`` on every object, as both providers'
    structured output requires (pydantic leaves it out, and ignores extra keys anyway)."""
    if isinstance(node, list):
        return [_closing(n) for n in node]
    if not isinstance(node, dict):
        return node
    copy = {k: v if k in _VALUES else _closing(v) for k, v in node.items()}
    if copy.get("type") == "object":
        copy["additionalProperties"] = False
    return copy
