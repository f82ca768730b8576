"""Typed results: ``@kafka_agent(output_type=...)`` validates what a turn returns.

The output type's JSON Schema is added to the model's system prompt, so the model knows
the shape to answer in; a model answer that does not validate is sent back with the
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

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(.*?)\n?```\s*$", re.DOTALL)


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
