"""@tool at decoration time: schema derivation, overrides, refusals, argument validation."""

from datetime import timedelta
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from pyrula_stream.errors import ErrorCode, ToolRegistrationError, TurnFailure
from pyrula_stream.llm.base import ToolDefinition
from pyrula_stream.tools.contract import (
    InvalidToolArguments,
    ToolCallable,
    ToolContext,
    check_bindable,
    tool,
)
from pyrula_stream.tools.retry import RetryPolicy


class Address(BaseModel):
    city: str
    zip_code: str | None = None


@tool
async def find_places(
    ctx: ToolContext,
    query: str,
    limit: int = 10,
    radius_km: float = 1.5,
    open_now: bool = False,
    tags: list[str] | None = None,
    kind: Literal["cafe", "bar"] = "cafe",
    near: Address | None = None,
    note: Annotated[str, Field(description="free text for the reviewer")] = "",
) -> list[str]:
    """Find places.

    Returns place names.
        An indented example stays indented relative to the text.
    """
    return [query]


def _properties(t: ToolCallable) -> dict[str, Any]:
    properties: dict[str, Any] = t.spec.input_schema["properties"]
    return properties


# --- schema derivation -------------------------------------------------------------------


def test_schema_types_come_from_type_hints() -> None:
    props = _properties(find_places)
    assert props["query"] == {"type": "string"}
    assert props["limit"] == {"type": "integer", "default": 10}
    assert props["radius_km"] == {"type": "number", "default": 1.5}
    assert props["open_now"] == {"type": "boolean", "default": False}
    assert props["tags"]["anyOf"] == [
        {"type": "array", "items": {"type": "string"}},
        {"type": "null"},
    ]
    assert props["kind"] == {"type": "string", "enum": ["cafe", "bar"], "default": "cafe"}
    assert props["near"]["anyOf"][0] == {"$ref": "#/$defs/Address"}
    assert "city" in find_places.spec.input_schema["$defs"]["Address"]["properties"]
    assert props["note"]["description"] == "free text for the reviewer"


def test_required_lists_only_parameters_without_default_and_never_the_context() -> None:
    schema = find_places.spec.input_schema
    assert schema["type"] == "object"
    assert schema["required"] == ["query"]
    assert "ctx" not in schema["properties"]
    assert schema["additionalProperties"] is False
    assert "title" not in schema and all(
        "title" not in p for p in _properties(find_places).values()
    )


def test_docstring_is_cleaned_into_the_description() -> None:
    assert find_places.spec.description == (
        "Find places.\n\nReturns place names.\n    An indented example stays indented relative"
        " to the text."
    )


def test_definition_is_a_tool_definition_and_a_defensive_copy() -> None:
    definition = find_places.definition()
    assert isinstance(definition, ToolDefinition)
    assert definition.name == "find_places"
    definition.input_schema["properties"].clear()
    assert "query" in _properties(find_places)


def test_no_argument_tool_has_an_empty_object_schema() -> None:
    @tool
    async def ping(ctx: ToolContext) -> str:
        return "pong"

    assert ping.spec.input_schema["properties"] == {}
    assert ping.spec.description == ""
    assert ping.validate_arguments({}) == {}


def test_parameter_names_that_shadow_basemodel_attributes_work() -> None:
    @tool
    async def export(ctx: ToolContext, json: bool, model_id: str, schema: str = "x") -> str:
        return model_id

    assert set(_properties(export)) == {"json", "model_id", "schema"}
    assert export.validate_arguments({"json": True, "model_id": "m"}) == {
        "json": True,
        "model_id": "m",
        "schema": "x",
    }


def test_bare_and_called_decorator_forms_and_wraps_metadata() -> None:
    async def lookup(ctx: ToolContext, order_id: str) -> str:
        """Look an order up."""
        return order_id

    bare = tool(lookup)
    called = tool()(lookup)
    for decorated in (bare, called):
        assert isinstance(decorated, ToolCallable)
        assert decorated.name == "lookup"
        assert decorated.__name__ == "lookup"
        assert decorated.__doc__ == "Look an order up."
        assert decorated.__wrapped__ is lookup
        assert decorated.spec.is_async


def test_spec_defaults_and_options() -> None:
    @tool(retry=2, timeout=5, cache_ttl=60, read_only=True, approval_timeout=timedelta(minutes=5))
    def sync_lookup(ctx: ToolContext, key: str) -> str:
        return key

    spec = sync_lookup.spec
    assert spec.retry == RetryPolicy.from_retries(2) and spec.retry.max_attempts == 3
    assert spec.timeout == 5.0 and spec.cache_ttl == 60.0
    assert spec.read_only and not spec.writes
    assert spec.approval_timeout == 300.0 and spec.needs_approval_support
    assert not spec.is_async
    assert find_places.spec.timeout == 30.0 and find_places.spec.retry.max_attempts == 1
    assert not find_places.spec.needs_approval_support


# --- overrides ------------------------------------------------------------------------------

OVERRIDE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sku": {"type": "string", "description": "stock keeping unit"},
        "qty": {"type": "integer"},
        "mode": {"type": "string", "enum": ["fast", "slow"]},
    },
    "required": ["sku"],
    "additionalProperties": False,
}


@tool(name="reserve-stock", description="Reserve stock.", schema=OVERRIDE_SCHEMA)
async def reserve(ctx: ToolContext, sku: str, qty: int = 1, mode: str = "fast") -> str:
    """Ignored docstring."""
    return f"{sku}x{qty}"


def test_name_description_and_schema_override_what_the_model_sees() -> None:
    definition = reserve.definition()
    assert definition.name == "reserve-stock"
    assert definition.description == "Reserve stock."
    assert definition.input_schema == OVERRIDE_SCHEMA
    assert definition.input_schema is not OVERRIDE_SCHEMA


def test_override_schema_validation_is_minimal_and_passes_values_through() -> None:
    assert reserve.validate_arguments({"sku": "A1", "qty": 3}) == {"sku": "A1", "qty": 3}
    with pytest.raises(InvalidToolArguments) as info:
        reserve.validate_arguments({"qty": "3", "mode": "warp", "colour": "red"})
    message = str(info.value)
    assert "reserve-stock" in message
    assert "sku: required argument is missing" in message
    assert 'qty: should be of JSON type integer (got "3")' in message
    assert "mode: should be one of" in message
    assert "colour: unknown argument" in message
    assert {e["field"] for e in info.value.errors} == {"sku", "qty", "mode", "colour"}


def test_override_must_match_the_signature() -> None:
    async def f(ctx: ToolContext, a: str) -> str:
        return a

    with pytest.raises(ToolRegistrationError, match=r"\['b'\] are not parameters"):
        tool(schema={"type": "object", "properties": {"a": {}, "b": {}}})(f)
    with pytest.raises(ToolRegistrationError, match=r"\['a'\] have no default"):
        tool(schema={"type": "object", "properties": {}})(f)
    with pytest.raises(ToolRegistrationError, match="type 'object'"):
        tool(schema={"type": "array"})(f)

    async def g(ctx: ToolContext, **kwargs: Any) -> str:
        return str(kwargs)

    flexible = tool(schema={"type": "object", "properties": {"anything": {"type": "string"}}})(g)
    assert flexible.validate_arguments({"anything": "x"}) == {"anything": "x"}


# --- refusals at decoration time -----------------------------------------------------------------


@pytest.mark.parametrize("bad_name", ["has space", "", "a" * 65, "naïve", "dot.ted", "slash/x"])
def test_bad_names_are_refused_naming_the_name(bad_name: str) -> None:
    async def f(ctx: ToolContext) -> str:
        return ""

    with pytest.raises(ToolRegistrationError) as info:
        tool(name=bad_name)(f)
    assert repr(bad_name) in str(info.value)


def test_longest_allowed_name_is_64_characters() -> None:
    async def f(ctx: ToolContext) -> str:
        return ""

    assert tool(name="a-Z_0" + "x" * 59)(f).name == "a-Z_0" + "x" * 59


def test_context_must_come_first() -> None:
    async def no_params() -> str:
        return ""

    async def query_first(query: str) -> str:
        return query

    async def keyword_only_ctx(*, ctx: ToolContext) -> str:
        return ""

    with pytest.raises(ToolRegistrationError, match="first parameter must be the ToolContext"):
        tool(no_params)
    with pytest.raises(ToolRegistrationError, match="'query' is annotated"):
        tool(query_first)
    with pytest.raises(ToolRegistrationError, match="first parameter must be the ToolContext"):
        tool(keyword_only_ctx)

    async def unannotated(ctx, x: int) -> int:  # type: ignore[no-untyped-def]
        return x

    assert tool(unannotated).spec.input_schema["required"] == ["x"]


def test_parameters_the_model_cannot_fill_are_refused() -> None:
    async def star_args(ctx: ToolContext, *items: str) -> str:
        return ""

    async def positional_only(ctx: ToolContext, a: str, /) -> str:
        return a

    async def star_kwargs(ctx: ToolContext, **kw: str) -> str:
        return ""

    async def unknown_hint(ctx: ToolContext, x: "NoSuchType") -> str:  # type: ignore[name-defined]  # noqa: F821
        return ""

    with pytest.raises(ToolRegistrationError, match="'items' cannot be passed by name"):
        tool(star_args)
    with pytest.raises(ToolRegistrationError, match="'a' cannot be passed by name"):
        tool(positional_only)
    with pytest.raises(ToolRegistrationError, match=r"\*\*kwargs"):
        tool(star_kwargs)
    with pytest.raises(ToolRegistrationError, match="NoSuchType"):
        tool(unknown_hint)


def test_contradictory_or_invalid_options_are_refused() -> None:
    async def f(ctx: ToolContext) -> str:
        return ""

    with pytest.raises(ToolRegistrationError, match="read_only=True and writes=True"):
        tool(read_only=True, writes=True)(f)
    for bad in (
        {"timeout": 0},
        {"timeout": float("inf")},
        {"cache_ttl": 0},
        {"retry": -1},
        {"retry": True},
        {"approval_timeout": -5},
    ):
        with pytest.raises(ToolRegistrationError, match="tool 'f'"):
            tool(**bad)(f)
    with pytest.raises(ToolRegistrationError, match="decorates a function"):
        tool(Address)


# --- argument validation messages ----------------------------------------------------------------


def test_invalid_arguments_name_each_field_and_why() -> None:
    with pytest.raises(InvalidToolArguments) as info:
        find_places.validate_arguments({"limit": "many", "kind": "club", "surprise": 1})
    error = info.value
    assert isinstance(error, TurnFailure) and error.code == ErrorCode.TOOL_ERROR
    message = str(error)
    assert message.startswith("invalid arguments for tool 'find_places': ")
    assert "query: required argument is missing" in message
    assert "limit: Input should be a valid integer" in message and '(got "many")' in message
    assert "kind: Input should be 'cafe' or 'bar'" in message
    assert "surprise: unknown argument; this tool takes: query, limit," in message
    assert [e["field"] for e in error.errors] == ["query", "limit", "kind", "surprise"]


def test_nested_field_errors_carry_their_path() -> None:
    with pytest.raises(InvalidToolArguments, match=r"near\.city: required argument is missing"):
        find_places.validate_arguments({"query": "q", "near": {"zip_code": "1000"}})


def test_validation_coerces_like_pydantic_and_fills_defaults() -> None:
    kwargs = find_places.validate_arguments(
        {"query": "tea", "limit": "5", "near": {"city": "Oslo"}}
    )
    assert kwargs["limit"] == 5 and kwargs["radius_km"] == 1.5 and kwargs["kind"] == "cafe"
    assert kwargs["near"] == Address(city="Oslo")


def test_validated_arguments_validate_again_unchanged() -> None:
    # The tool loop validates before journaling tool:start, then invoke validates again.
    once = find_places.validate_arguments({"query": "tea", "near": {"city": "Oslo"}})
    assert find_places.validate_arguments(once) == once


def test_arguments_must_be_an_object() -> None:
    with pytest.raises(InvalidToolArguments, match="arguments must be an object, got list"):
        find_places.validate_arguments(["tea"])  # type: ignore[arg-type]


# --- Kafka binding -------------------------------------------------------------------------------


def test_check_bindable_accepts_ordinary_tools() -> None:
    check_bindable(find_places, agent_name="concierge")


@pytest.mark.parametrize(
    ("options", "declared"),
    [
        ({"requires_approval": True}, "requires_approval=True"),
        ({"requires_approval": lambda args: args["cents"] > 100}, "a requires_approval predicate"),
        ({"approval_timeout": 3600}, "approval_timeout=3600s"),
        ({"approval_timeout": timedelta(hours=1)}, "approval_timeout=3600s"),
    ],
)
def test_check_bindable_refuses_approval(options: dict[str, Any], declared: str) -> None:
    async def refund(ctx: ToolContext, cents: int) -> str:
        return "ok"

    gated = tool(**options)(refund)
    assert gated.spec.needs_approval_support
    with pytest.raises(ToolRegistrationError) as info:
        check_bindable(gated, agent_name="billing")
    message = str(info.value)
    assert "tool 'refund'" in message and "agent 'billing'" in message and declared in message
    assert "a Kafka consumer cannot wait for a person's approval" in message
