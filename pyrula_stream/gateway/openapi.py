"""The gateway's OpenAPI document: named request and response models, errors included.

The routes read their bodies by hand (a size limit first, then the agent's own parameter
check), so FastAPI alone would describe them as taking and returning anything. This
module builds the document from the same facts the routes use: each served agent's
parameter schema (``ServedAgent.parameters``) as a named request body, the models below
as named responses, and the one error shape (``errors.error_body``) for every refusal.
Code in other languages generates its client from ``GET <prefix>/openapi.json``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field, TypeAdapter

from pyrula_stream._version import __version__
from pyrula_stream.client.turn_status import TurnStatus

REF = "#/components/schemas/{model}"


class ServedAgent(Protocol):
    """What the document needs of a served agent (``app.ServedAgent``)."""

    @property
    def name(self) -> str: ...

    @property
    def parameters(self) -> dict[str, Any] | None: ...


class FieldError(BaseModel):
    field: str = Field(description="the parameter, or '' for the whole body")
    message: str


class ErrorBody(BaseModel):
    """Every refusal: the guard's 401, 403 and 421, a 413 or 422 on the body, a 404 for
    an unknown agent or turn, 429 over a limit, 503 while Kafka is unreachable."""

    error: str = Field(description="what went wrong, for people")
    code: str = Field(description="an ErrorCode: invalid_request, store_unavailable, ...")
    errors: list[FieldError] | None = Field(None, description="per field, on a 422")


class TurnAccepted(BaseModel):
    """A submitted turn: read its events from ``events_url`` (Server-Sent Events)."""

    turn_id: str
    events_url: str
    status_url: str


class AgentInfo(BaseModel):
    name: str
    validates: bool = Field(description="the gateway checks parameters before producing")
    parameters: dict[str, Any] | None = Field(description="the JSON Schema of its parameters")


class AgentList(BaseModel):
    agents: list[AgentInfo]


class ControlAccepted(BaseModel):
    turn_id: str
    action: str
    reason: str | None


class ControlBody(BaseModel):
    reason: str | None = Field(None, description="said in the turn's run:error")


class ThreadTurns(BaseModel):
    thread_id: str
    turns: list[dict[str, Any]]


class ThreadDeleted(BaseModel):
    thread_id: str
    deleted_turns: int


class StoredObject(BaseModel):
    store: str = Field(description="the object store that holds it: s3, local")
    key: str = Field(description="its key: <prefix><sha256[:2]>/<sha256>")
    size: int = Field(description="its length in bytes")
    sha256: str = Field(description="the hex sha256 of its bytes")
    content_type: str = Field(description="application/json: its bytes are JSON")


class PayloadReference(BaseModel):
    """A value held in the object store: pass this object as a parameter's value, and
    the worker reads the value in its place (schemas/json: the $pyrula_ref shape)."""

    pyrula_ref: StoredObject = Field(alias="$pyrula_ref")


MODELS: tuple[Any, ...] = (
    ErrorBody,
    TurnAccepted,
    AgentList,
    ControlAccepted,
    ControlBody,
    ThreadTurns,
    ThreadDeleted,
    PayloadReference,
    TurnStatus,
)

_ERRORS = {
    "400": "the body is not JSON",
    "401": "no or a wrong API key",
    "403": "the key may not do this, or the turn is another caller's",
    "404": "no such agent, turn or thread",
    "413": "the body or upload is over the size limit (the key's, for an upload)",
    "422": "invalid parameters (each field named in errors)",
    "429": "over a rate or stream limit (Retry-After says when to try again)",
    "503": "Kafka is not reachable (Retry-After says when to try again)",
}

_ANSWERS: dict[tuple[str, str], tuple[str, str | None]] = {
    ("get", "/"): ("200", "AgentList"),
    ("post", "/{agent}/turns"): ("202", "TurnAccepted"),
    ("post", "/{agent}/uploads"): ("201", "PayloadReference"),
    ("get", "/{agent}/turns/{turn_id}/events"): ("200", None),
    ("get", "/{agent}/turns/{turn_id}"): ("200", "TurnStatus"),
    ("post", "/{agent}/turns/{turn_id}/cancel"): ("202", "ControlAccepted"),
    ("post", "/{agent}/turns/{turn_id}/terminate"): ("200", "TurnStatus"),
    ("get", "/{agent}/threads/{thread_id}"): ("200", "ThreadTurns"),
    ("delete", "/{agent}/threads/{thread_id}"): ("200", "ThreadDeleted"),
}
"""Each route's success status and model (``None``: the event stream)."""


def parameters_model_name(agent: str) -> str:
    """``support-bot`` -> ``SupportBotParameters``: a schema name any generator takes."""
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[^0-9A-Za-z]+", agent) if p) + (
        "Parameters"
    )


def _request_body(agent: ServedAgent) -> dict[str, Any]:
    """What ``POST /{agent}/turns`` takes for one agent: its parameters, plus the keys
    the gateway reads itself."""
    params = dict(agent.parameters or {"type": "object", "additionalProperties": True})
    properties = dict(params.get("properties", {}))
    properties["metadata"] = {"type": "object", "description": "passed to ctx.metadata"}
    properties["thread_id"] = {"type": "string", "description": "the conversation"}
    properties["deferrable"] = {
        "type": "boolean",
        "description": "its model calls may wait in the agent's batch lane (default false)",
    }
    properties["deadline"] = {
        "type": ["string", "number"],
        "description": "until when its calls may wait in a batch (ISO 8601 or epoch seconds)",
    }
    return {**params, "properties": properties, "title": parameters_model_name(agent.name)}


def document(
    api: FastAPI, agents: Callable[[], Sequence[ServedAgent]], prefix: str
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``api`` (built once, then cached on it)."""
    if api.openapi_schema:
        return api.openapi_schema
    schema = get_openapi(
        title="pyrula-stream gateway",
        version=__version__,
        description="Submit turns to Kafka agents and stream their events (Server-Sent "
        "Events). Every error has the ErrorBody shape.",
        routes=api.routes,
    )
    schema["servers"] = [{"url": prefix}]
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in MODELS:
        found = TypeAdapter(model).json_schema(ref_template=REF, mode="serialization")
        components.update(found.pop("$defs", {}))
        components[model.__name__] = found
    served = agents()
    bodies = []
    for agent in served:
        name = parameters_model_name(agent.name)
        components[name] = _request_body(agent)
        bodies.append({"$ref": REF.format(model=name)})
    schema.setdefault("components", {})["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer", "description": "an API key"}
    }
    schema["security"] = [{"bearer": []}]
    for path, methods in schema.get("paths", {}).items():
        for method, operation in methods.items():
            _describe(operation, _ANSWERS.get((method, path)), served, bodies, path, method)
    api.openapi_schema = schema
    return schema


def _describe(
    operation: dict[str, Any],
    answer: tuple[str, str | None] | None,
    served: Sequence[ServedAgent],
    bodies: list[dict[str, Any]],
    path: str,
    method: str,
) -> None:
    error = {"content": {"application/json": {"schema": {"$ref": REF.format(model="ErrorBody")}}}}
    responses: dict[str, Any] = {}
    if answer is not None:
        status, model = answer
        if model is None:
            content = {"text/event-stream": {"schema": {"type": "string"}}}
            responses[status] = {
                "description": "the turn's committed events: id (seq), event (type), data "
                "(the event as JSON, schemas/json/event.schema.json); Last-Event-ID resumes",
                "content": content,
            }
        else:
            schema = {"$ref": REF.format(model=model)}
            responses[status] = {
                "description": model,
                "content": {"application/json": {"schema": schema}},
            }
    for status, why in _ERRORS.items():
        responses[status] = {"description": why, **error}
    operation["responses"] = responses
    for parameter in operation.get("parameters", []):
        if parameter.get("name") == "agent" and served:
            parameter["schema"] = {"type": "string", "enum": [a.name for a in served]}
    if (method, path) == ("post", "/{agent}/turns"):
        body = bodies[0] if len(bodies) == 1 else {"oneOf": bodies}
        operation["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": body}},
        }
        operation["parameters"] = [
            *operation.get("parameters", []),
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
                "description": "the same key submits the turn once",
            },
        ]
    elif (method, path) == ("post", "/{agent}/uploads"):
        operation["requestBody"] = {
            "required": True,
            "description": "the document's bytes, streamed; Content-Type is kept with it "
            "(application/json: read back as JSON, text/*: as text, else as bytes)",
            "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
        }
    elif method == "post" and path.endswith(("/cancel", "/terminate")):
        schema = {"$ref": REF.format(model="ControlBody")}
        operation["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": schema}},
        }
