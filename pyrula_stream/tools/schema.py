"""A tool's argument schema: derived from its signature, and checked on every call.

``derive_arguments`` turns a tool function into the JSON Schema the model fills in (via a
pydantic model built from the signature and type hints) or checks a ``schema=`` override
against the function. ``validate_arguments`` checks what the model sent and names every
bad field, so the model can correct its call instead of the turn failing. Every mistake in
the declaration raises ``ToolRegistrationError`` at decoration (import) time.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from pyrula_stream.errors import ErrorCode, ToolRegistrationError, TurnFailure

__all__ = [
    "InvalidToolArguments",
    "derive_arguments",
    "refusal",
    "validate_arguments",
]


class InvalidToolArguments(TurnFailure):
    """The model (or a direct call) passed arguments the tool's schema refuses.

    ``errors`` lists ``{"field": ..., "message": ...}``; the message names every bad field
    and why, so the model can correct the call.
    """

    code = ErrorCode.TOOL_ERROR

    def __init__(self, tool_name: str, problems: list[tuple[str, str]]) -> None:
        listed = "; ".join(f"{where}: {why}" if where else why for where, why in problems)
        errors = [{"field": where, "message": why} for where, why in problems]
        super().__init__(f"invalid arguments for tool '{tool_name}': {listed}", detail=errors)
        self.tool_name = tool_name
        self.errors = errors


def refusal(tool_name: str, problem: str) -> ToolRegistrationError:
    """The error for a bad declaration, worded the same for every ``@tool`` check."""
    return ToolRegistrationError(f"tool '{tool_name}': {problem}")


# --- deriving the schema at decoration time -------------------------------------------------


def derive_arguments(
    fn: Callable[..., Any],
    tool_name: str,
    *,
    schema: Mapping[str, Any] | None,
    context_type: type,
) -> tuple[type[BaseModel] | None, dict[str, Any]]:
    """The arguments model (``None`` with a ``schema=`` override) and the JSON Schema.

    ``context_type`` is the class the first parameter may be annotated with (``ToolContext``),
    passed in so this module does not import ``tools``.
    """
    params, takes_extra, hints = _model_parameters(fn, tool_name, context_type)
    if schema is not None:
        return None, _checked_override(tool_name, schema, params, takes_extra)
    if takes_extra:
        raise refusal(
            tool_name, "**kwargs cannot become a JSON Schema; name the parameters or pass schema="
        )
    return _derived_model(tool_name, params, hints)


def _type_hints(fn: Callable[..., Any], tool_name: str) -> dict[str, Any]:
    try:
        return get_type_hints(fn, include_extras=True)
    except NameError as exc:
        raise refusal(tool_name, f"cannot resolve a type hint ({exc})") from exc
    except TypeError:  # not a plain function (a partial, a callable object)
        return {
            name: param.annotation
            for name, param in inspect.signature(fn).parameters.items()
            if param.annotation is not inspect.Parameter.empty
        }


def _model_parameters(
    fn: Callable[..., Any], tool_name: str, context_type: type
) -> tuple[list[inspect.Parameter], bool, dict[str, Any]]:
    """The parameters the model fills in, whether ``**kwargs`` is taken, and the type hints."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise refusal(tool_name, f"cannot read its signature ({exc})") from exc
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if not params or params[0].kind not in positional:
        raise refusal(
            tool_name,
            "the first parameter must be the ToolContext, "
            "as in `async def my_tool(ctx: ToolContext, ...)`",
        )
    hints = _type_hints(fn, tool_name)
    ctx_hint = hints.get(params[0].name, Any)
    if not (ctx_hint is Any or (isinstance(ctx_hint, type) and issubclass(ctx_hint, context_type))):
        raise refusal(
            tool_name,
            f"the first parameter '{params[0].name}' is annotated "
            f"{ctx_hint!r}; it receives the ToolContext, so annotate it ToolContext",
        )
    takes_extra = False
    named: list[inspect.Parameter] = []
    for param in params[1:]:
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            takes_extra = True
        elif param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            raise refusal(
                tool_name,
                f"parameter '{param.name}' cannot be passed by name; the "
                "model passes arguments by name, so use named parameters",
            )
        else:
            named.append(param)
    return named, takes_extra, hints


def _derived_model(
    tool_name: str, params: list[inspect.Parameter], hints: dict[str, Any]
) -> tuple[type[BaseModel], dict[str, Any]]:
    """A pydantic model for the arguments and its JSON Schema (titles dropped: noise to a model).

    Fields get neutral names with the parameter name as alias, so a parameter called
    ``json`` or ``model_id`` cannot clash with ``BaseModel`` attributes.
    """
    fields: dict[str, Any] = {}
    for index, param in enumerate(params):
        if param.default is inspect.Parameter.empty:
            info = Field(alias=param.name)
        else:
            info = Field(default=param.default, alias=param.name)
        fields[f"arg_{index}"] = (hints.get(param.name, Any), info)
    try:
        model: type[BaseModel] = create_model(
            "Arguments", __config__=ConfigDict(extra="forbid"), **fields
        )
        schema = model.model_json_schema()
    except Exception as exc:  # pydantic's schema errors have no single base class
        raise refusal(tool_name, f"cannot derive a JSON Schema from its signature ({exc})") from exc
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    return model, schema


def _checked_override(
    tool_name: str, schema: Any, params: list[inspect.Parameter], takes_extra: bool
) -> dict[str, Any]:
    """A ``schema=`` must describe an object whose properties the function can receive."""
    if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
        raise refusal(tool_name, "schema must be a JSON Schema of type 'object'")
    properties = schema.get("properties") or {}
    required = schema.get("required") or []
    if not isinstance(properties, Mapping) or not isinstance(required, list):
        raise refusal(tool_name, "schema 'properties' must be an object and 'required' a list")
    names = {param.name for param in params}
    unknown = [name for name in properties if name not in names]
    if unknown and not takes_extra:
        raise refusal(tool_name, f"schema properties {unknown} are not parameters of the function")
    uncovered = [
        p.name for p in params if p.default is inspect.Parameter.empty and p.name not in properties
    ]
    if uncovered:
        raise refusal(tool_name, f"parameters {uncovered} have no default and are not in schema")
    return copy.deepcopy(dict(schema))


# --- checking arguments at call time ----------------------------------------------------------


def validate_arguments(
    tool_name: str,
    input_schema: Mapping[str, Any],
    arguments_model: type[BaseModel] | None,
    arguments: Mapping[str, Any],
) -> dict[str, Any]:
    """Keyword arguments for the function, or ``InvalidToolArguments`` naming each bad field.

    With a derived model, pydantic validates (and coerces); with a ``schema=`` override
    (``arguments_model`` is ``None``), a minimal JSON Schema check runs and the values pass
    through unchanged.
    """
    if not isinstance(arguments, Mapping):
        kind = type(arguments).__name__
        raise InvalidToolArguments(tool_name, [("", f"arguments must be an object, got {kind}")])
    if arguments_model is None:
        problems = _schema_problems(input_schema, arguments)
        if problems:
            raise InvalidToolArguments(tool_name, problems)
        return dict(arguments)
    try:
        parsed = arguments_model.model_validate(dict(arguments))
    except ValidationError as exc:
        accepted = list(input_schema.get("properties") or {})
        raise InvalidToolArguments(tool_name, _pydantic_problems(exc, accepted)) from None
    return {alias: getattr(parsed, name) for name, alias in _aliases(arguments_model)}


@functools.cache
def _aliases(model: type[BaseModel]) -> tuple[tuple[str, str], ...]:
    """``(field name, argument name)`` of an arguments model (read once per tool)."""
    return tuple((name, str(info.alias)) for name, info in model.model_fields.items())


def _short_repr(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _pydantic_problems(exc: ValidationError, accepted: list[str]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            why = f"unknown argument; this tool takes: {', '.join(accepted) or 'no arguments'}"
        elif error["type"] == "missing":
            why = "required argument is missing"
        else:
            why = f"{error['msg']} (got {_short_repr(error.get('input'))})"
        problems.append((where, why))
    return problems


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list | tuple),
    "object": lambda v: isinstance(v, Mapping),
    "null": lambda v: v is None,
}


def _schema_problems(
    schema: Mapping[str, Any], arguments: Mapping[str, Any]
) -> list[tuple[str, str]]:
    """A deliberately small check of a ``schema=`` override: required, types, enum, extras."""
    properties: Mapping[str, Any] = schema.get("properties") or {}
    problems = [
        (name, "required argument is missing")
        for name in schema.get("required") or ()
        if name not in arguments
    ]
    for name, value in arguments.items():
        prop = properties.get(name)
        if not isinstance(prop, Mapping):
            if prop is None and schema.get("additionalProperties") is False:
                problems.append(
                    (
                        str(name),
                        f"unknown argument; this tool takes: "
                        f"{', '.join(properties) or 'no arguments'}",
                    )
                )
            continue
        declared = prop.get("type")
        types = [declared] if isinstance(declared, str) else list(declared or ())
        known = [t for t in types if t in _JSON_TYPES]
        if known and not any(_JSON_TYPES[t](value) for t in known):
            problems.append(
                (name, f"should be of JSON type {' or '.join(known)} (got {_short_repr(value)})")
            )
        elif "enum" in prop and value not in prop["enum"]:
            problems.append(
                (name, f"should be one of {_short_repr(prop['enum'])} (got {_short_repr(value)})")
            )
    return problems
