"""The wire contract for code in other languages: JSON Schemas of the records and an
AsyncAPI document of an agent's topics, generated from the code that writes them.

The Avro schemas (``schemas/*.avsc``) say what the bytes of a turn request, an event and a
result are. A producer or consumer without Avro uses their JSON form
(``content-type: application/json``), whose JSON-valued fields are nested objects, and
wants to know what each event type's ``data`` holds: that lives in the payload classes of
``wire.events``, not in the Avro schema. Both are turned into JSON Schema here (draft
2020-12), with the control, signal and reply bodies, so the files under ``schemas/json/`` and
``schemas/asyncapi.yaml`` are never typed by hand. ``python -m pyrula_stream.wire.contracts``
rewrites them; ``--check`` (run by the test suite) fails when they differ from the code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter

from pyrula_stream._version import __version__
from pyrula_stream.wire import events, payload_refs, serde
from pyrula_stream.wire.fitting import ORIGINAL_PREFIX, TRIMMED_HEADER
from pyrula_stream.wire.records import (
    CONTROL_ACTIONS,
    DLQ_CODE_HEADER,
    DLQ_REASON_HEADER,
    DLQ_SOURCE_HEADER,
    DLQ_WORKER_HEADER,
    ControlRequest,
)
from pyrula_stream.wire.scores import SCORE_RECORD_TYPE, Score
from pyrula_stream.wire.signals import RECORD_TYPE_HEADER, SIGNAL_ID_HEADER, Signal
from pyrula_stream.wire.subagents import CHILD_TURN_HEADER, Reply

DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMAS_DIR = Path(__file__).absolute().parent.parent / "schemas"
"""The package's ``schemas/`` (the repository's ``schemas/`` links to it)."""

AVRO_RECORDS = ("turn_request", "event", "turn_result")
"""The records with an Avro schema and a JSON form."""

_OPTIONAL_IN_JSON = {"turn_request": frozenset({"turn_id", "agent"})}
"""Fields the JSON form may leave out: the worker derives them from the record."""

_AVRO_PRIMITIVES = {
    "string": {"type": "string"},
    "long": {"type": "integer"},
    "int": {"type": "integer"},
    "double": {"type": "number"},
    "float": {"type": "number"},
    "boolean": {"type": "boolean"},
}

_SPREAD_FIELDS: Mapping[type, tuple[str, ...]] = {
    events.ToolStart: ("described",),
    events.ToolResult: ("approval",),
}
"""Payload fields whose keys ``data()`` merges into ``data`` instead of nesting them."""

_EXTRA_KEYS: Mapping[type, Mapping[str, dict[str, Any]]] = {
    events.ToolStart: {
        "mcp_server": {"type": "string", "description": "an MCP tool's server"},
        "mcp_tool": {"type": "string", "description": "the tool's name on that server"},
        "destructive": {"type": "boolean", "description": "the MCP server's destructiveHint"},
    },
    events.ToolResult: {
        "approval": {"enum": ["approved", "rejected", "expired"]},
        "approval_key": {"type": "string"},
        "answered_by": {"type": ["string", "null"]},
        "approval_reason": {"type": ["string", "null"]},
    },
}
"""The keys a spread field puts in ``data`` (all optional)."""


_BY_REFERENCE = (
    "; any value inside it (or the whole of it) may be a payload reference "
    "(payload_ref.schema.json) that stands for a value stored outside the record"
)


def _json_value(record: str, name: str) -> dict[str, Any] | None:
    """A JSON-valued field's schema in the JSON form (``None``: not one)."""
    if name in serde._JSON_FIELDS.get(record, ()):
        return {"type": "object"}
    if name in serde._JSON_VALUE_FIELDS.get(record, ()):
        return {"description": "any JSON value; null when there is none"}
    return None


def _avro_field(avro_type: Any) -> dict[str, Any]:
    """The JSON Schema of one Avro field type (primitives and nullable unions)."""
    if isinstance(avro_type, list):
        kinds = [t for t in avro_type if t != "null"]
        if len(kinds) != 1 or not isinstance(kinds[0], str):
            raise ValueError(f"no JSON form for the Avro union {avro_type}")
        return {"type": [_AVRO_PRIMITIVES[kinds[0]]["type"], "null"]}
    if not isinstance(avro_type, str) or avro_type not in _AVRO_PRIMITIVES:
        raise ValueError(f"no JSON form for the Avro type {avro_type!r}")
    return dict(_AVRO_PRIMITIVES[avro_type])


def record_schema(record: str) -> dict[str, Any]:
    """The JSON form of an Avro record (``schemas/<record>.avsc``)."""
    avsc = json.loads((SCHEMAS_DIR / f"{record}.avsc").read_text(encoding="utf-8"))
    properties: dict[str, Any] = {}
    required = []
    optional = _OPTIONAL_IN_JSON.get(record, frozenset())
    for f in avsc["fields"]:
        schema = _json_value(record, f["name"]) or _avro_field(f["type"])
        if "doc" in f:
            schema["description"] = f["doc"]
        if record == "turn_request" and f["name"] == "params":
            schema["description"] = "The agent function's keyword arguments."
        if f["name"] in ("params", "data", "result"):
            schema["description"] = schema.get("description", "").rstrip(".") + _BY_REFERENCE
        properties[f["name"]] = schema
        if "default" not in f and f["name"] not in optional:
            required.append(f["name"])
    return {
        "$schema": DIALECT,
        "$id": f"{record}.schema.json",
        "title": avsc["name"],
        "description": avsc.get("doc", "")
        + f" JSON form (content-type: {serde.JSON_CONTENT_TYPE}); the Avro form is "
        f"schemas/{record}.avsc ({serde.content_type(record)}).",
        "type": "object",
        "properties": properties,
        "required": required,
    }


def _dataclass_schema(cls: type, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """What ``cls(...)`` holds as JSON: its fields (less ``drop``) by their type hints."""
    schema = TypeAdapter(cls).json_schema(mode="serialization")
    schema.pop("title", None)
    props = schema.get("properties", {})
    for name in drop:
        props.pop(name, None)
    for prop in props.values():
        prop.pop("title", None)
    schema["required"] = [r for r in schema.get("required", []) if r not in drop]
    return schema


def event_data_schema(payload: type) -> dict[str, Any]:
    """What an event's ``data`` holds, from the event type's payload class."""
    schema = _dataclass_schema(payload, _SPREAD_FIELDS.get(payload, ()))
    schema["properties"].update(_EXTRA_KEYS.get(payload, {}))
    doc = payload.__doc__ or ""
    if doc and not doc.startswith(payload.__name__ + "("):  # not the dataclass default
        schema["description"] = " ".join(doc.split())
    return schema


def payload_classes() -> dict[str, type]:
    """Each event type's payload class (every class of ``wire.events`` with a ``type``)."""
    found = {
        str(getattr(cls, "type")): cls  # noqa: B009 (a ClassVar mypy does not see)
        for cls in vars(events).values()
        if isinstance(cls, type)
        and dataclasses.is_dataclass(cls)
        and isinstance(getattr(cls, "type", None), events.EventType)
    }
    missing = sorted(str(t) for t in events.EventType if str(t) not in found)
    if missing:
        raise ValueError(f"no payload class for the event types {missing}")
    return {str(t): found[str(t)] for t in events.EventType}


def event_schema() -> dict[str, Any]:
    """An event record (JSON form), its ``data`` checked against its type's payload."""
    schema = record_schema("event")
    classes = payload_classes()
    schema["properties"]["type"]["enum"] = list(classes)
    schema["$defs"] = {cls.__name__: event_data_schema(cls) for cls in classes.values()}
    schema["allOf"] = [
        {
            "if": {"properties": {"type": {"const": name}}, "required": ["type"]},
            "then": {"properties": {"data": {"$ref": f"#/$defs/{cls.__name__}"}}},
        }
        for name, cls in classes.items()
    ]
    return schema


def control_schema() -> dict[str, Any]:
    """A cancel or terminate request on ``<agent>.control``."""
    schema = _dataclass_schema(ControlRequest)
    schema["properties"]["action"] = {"enum": list(CONTROL_ACTIONS)}
    return {"$schema": DIALECT, "$id": "control.schema.json", "title": "ControlRequest", **schema}


def signal_schema() -> dict[str, Any]:
    """A signal (or a reviewer's answer) on ``<agent>.signals`` / ``<agent>.answers``."""
    schema = _dataclass_schema(Signal, ("position",))
    return {
        "$schema": DIALECT,
        "$id": "signal.schema.json",
        "title": "Signal",
        "description": " ".join((Signal.__doc__ or "").split()),
        **schema,
    }


def reply_schema() -> dict[str, Any]:
    """A called agent's outcome on its caller's ``<agent>.replies`` (workers write it)."""
    schema = _dataclass_schema(Reply)
    schema["properties"]["status"] = {"enum": ["completed", "failed"]}
    return {
        "$schema": DIALECT,
        "$id": "reply.schema.json",
        "title": "Reply",
        "description": " ".join((Reply.__doc__ or "").split()),
        **schema,
    }


def payload_ref_schema() -> dict[str, Any]:
    """A value stored outside its record (``wire.payload_refs``): where it is and how to
    check it. A reader fetches ``key`` from the object store named ``store``, checks its
    size and SHA-256, and reads it as ``content_type`` (JSON: the value itself)."""
    body = {
        "type": "object",
        "properties": {
            "store": {"type": "string", "description": "the object store's name (local, s3)"},
            "key": {"type": "string", "description": "the object's key in that store"},
            "size": {"type": "integer", "minimum": 0, "description": "the object's bytes"},
            "sha256": {
                "type": "string",
                "pattern": "^[0-9a-f]{64}$",
                "description": "the hex SHA-256 of the object's bytes",
            },
            "content_type": {
                "type": "string",
                "default": "application/json",
                "description": "application/json: the bytes are the value's JSON",
            },
        },
        "required": ["store", "key", "size", "sha256"],
    }
    return {
        "$schema": DIALECT,
        "$id": "payload_ref.schema.json",
        "title": "PayloadRef",
        "description": " ".join((payload_ref_schema.__doc__ or "").split()),
        "type": "object",
        "properties": {payload_refs.REF_FIELD: body},
        "required": [payload_refs.REF_FIELD],
        "additionalProperties": False,
    }


def score_schema() -> dict[str, Any]:
    """An evaluator's score of one turn on ``<agent>.scores`` (the evaluators write it)."""
    schema = _dataclass_schema(Score)
    schema.pop("description", None)
    schema["properties"] = {
        "score_id": {
            "type": "string",
            "description": "the same for every copy of one evaluator version's score of "
            "one turn: (turn_id, evaluator, evaluator_version) hashed",
        },
        **schema["properties"],
    }
    schema["properties"]["kind"] = {"enum": ["function", "judge", "outcome"]}
    schema["required"] = sorted({"score_id", *schema["required"]})
    return {
        "$schema": DIALECT,
        "$id": "score.schema.json",
        "title": "Score",
        "description": " ".join((Score.__doc__ or "").split())
        + " Keyed by the scored turn's id; an error score has label 'error' and the "
        "reason; a deferred outcome whose window closed has timed_out true.",
        **schema,
    }


def json_schemas() -> dict[str, dict[str, Any]]:
    """Every JSON Schema, by file name."""
    return {
        "payload_ref.schema.json": payload_ref_schema(),
        "turn_request.schema.json": record_schema("turn_request"),
        "event.schema.json": event_schema(),
        "turn_result.schema.json": record_schema("turn_result"),
        "control.schema.json": control_schema(),
        "signal.schema.json": signal_schema(),
        "reply.schema.json": reply_schema(),
        "score.schema.json": score_schema(),
    }


def _headers(**headers: Any) -> dict[str, Any]:
    return {"type": "object", "properties": headers}


def _message(name: str, summary: str, content_type: str, payload: Any, **extra: Any) -> Any:
    message = {"name": name, "summary": summary, "contentType": content_type, "payload": payload}
    return message | extra


def _avro(record: str) -> dict[str, Any]:
    return {
        "schemaFormat": "application/vnd.apache.avro;version=1.9.0",
        "schema": {"$ref": f"./{record}.avsc"},
    }


def _json(record: str) -> dict[str, Any]:
    return {"$ref": f"./json/{record}.schema.json"}


def asyncapi() -> dict[str, Any]:
    """An AsyncAPI 3.0 document of one agent's topics: keys, headers and payloads."""
    correlation = {"type": "string", "description": "echoed on the turn's result"}
    ctype = {"type": "string", "description": "how the value is framed"}
    turn_headers = _headers(
        **{
            serde.CONTENT_TYPE_HEADER: {
                "enum": [
                    serde.content_type("turn_request"),
                    serde.registry_content_type("turn_request"),
                    serde.JSON_CONTENT_TYPE,
                    serde.PARAMS_CONTENT_TYPE,
                ]
            },
            serde.CORRELATION_HEADER: correlation,
            f"{serde.REPLY_HEADER_PREFIX}<name>": {
                "type": "string",
                "description": "each comes back on the result as <name>",
            },
        }
    )
    signal_headers = _headers(
        **{
            serde.CONTENT_TYPE_HEADER: {"const": serde.JSON_CONTENT_TYPE},
            RECORD_TYPE_HEADER: {"const": "signal"},
            SIGNAL_ID_HEADER: {"type": "string"},
        }
    )
    messages = {
        "turnRequest": _message(
            "TurnRequest",
            "A request to run one turn; key: thread id, else turn id (or any key)",
            serde.content_type("turn_request"),
            _avro("turn_request"),
            headers=turn_headers,
        ),
        "turnRequestJson": _message(
            "TurnRequestJson",
            "The same request as JSON (or the params object alone, with "
            f"content-type {serde.PARAMS_CONTENT_TYPE})",
            serde.JSON_CONTENT_TYPE,
            _json("turn_request"),
            headers=turn_headers,
        ),
        "event": _message(
            "Event",
            'One event of a turn; key: turn id. JSON form when the agent has event_format="json"',
            serde.content_type("event"),
            _avro("event"),
            headers=_headers(**{serde.CONTENT_TYPE_HEADER: ctype}),
        ),
        "eventJson": _message(
            "EventJson", "An event, JSON form", "application/json", _json("event")
        ),
        "turnResult": _message(
            "TurnResult",
            "A turn's outcome; keyed as its request was",
            serde.content_type("turn_result"),
            _avro("turn_result"),
            headers=_headers(
                **{
                    serde.CONTENT_TYPE_HEADER: ctype,
                    serde.CORRELATION_HEADER: correlation,
                    serde.AGENT_VERSION_HEADER: {
                        "type": "string",
                        "description": "the agent's version that ran the turn (if it has one)",
                    },
                }
            ),
        ),
        "turnResultJson": _message(
            "TurnResultJson", "A result, JSON form", serde.JSON_CONTENT_TYPE, _json("turn_result")
        ),
        "control": _message(
            "ControlRequest",
            "Cancel or terminate a turn; key: turn id",
            serde.JSON_CONTENT_TYPE,
            _json("control"),
        ),
        "signal": _message(
            "Signal",
            "A signal to a waiting turn, keyed as the turn's request",
            serde.JSON_CONTENT_TYPE,
            _json("signal"),
            headers=signal_headers,
        ),
        "reply": _message(
            "Reply",
            "A called agent's outcome, keyed by the caller's turn id, at its partition "
            "(written by the called agent's workers; signals share this topic)",
            serde.JSON_CONTENT_TYPE,
            _json("reply"),
            headers=_headers(
                **{
                    serde.CONTENT_TYPE_HEADER: {"const": serde.JSON_CONTENT_TYPE},
                    CHILD_TURN_HEADER: {"type": "string", "description": "the called turn"},
                }
            ),
        ),
        "score": _message(
            "Score",
            "An evaluator's score of one turn; key: the scored turn's id (evaluators write it)",
            serde.JSON_CONTENT_TYPE,
            _json("score"),
            headers=_headers(
                **{
                    serde.CONTENT_TYPE_HEADER: {"const": serde.JSON_CONTENT_TYPE},
                    RECORD_TYPE_HEADER: {"const": SCORE_RECORD_TYPE},
                }
            ),
        ),
        "deadLetter": _message(
            "DeadLetter",
            "A record the worker could not take: its value as it came, and why",
            "application/octet-stream",
            {"description": "the refused record's value, unchanged (or cut: see headers)"},
            headers=_headers(
                **{
                    DLQ_REASON_HEADER: {"type": "string"},
                    DLQ_CODE_HEADER: {"type": "string", "description": "an ErrorCode"},
                    DLQ_WORKER_HEADER: {"type": "string", "description": "the worker's id"},
                    DLQ_SOURCE_HEADER: {
                        "type": "string",
                        "description": "topic[partition]@offset",
                    },
                    TRIMMED_HEADER: {"type": "string", "description": "what was cut to fit"},
                    f"{ORIGINAL_PREFIX}<name>": {"description": "the record's own headers"},
                }
            ),
        ),
    }
    channels: dict[str, Any] = {}
    topics = {
        "turns": (["turnRequest", "turnRequestJson"], "turn requests: produce here"),
        "events": (["event", "eventJson"], "every event of every turn, in seq order per turn"),
        "results": (["turnResult", "turnResultJson"], "one result per turn"),
        "control": (["control"], "cancel and terminate requests"),
        "replies": (["reply", "signal"], "called agents' outcomes for this agent's turns"),
        "signals": (["signal"], "clients' signals to waiting turns"),
        "answers": (["signal"], "reviewers' answers to questions (approvals, interrupts)"),
        "dlq": (["deadLetter"], "dead letters, with the reason"),
        "scores": (["score"], "evaluators' scores: one per sampled turn and evaluator version"),
    }
    for topic, (names, description) in topics.items():
        channels[topic] = {
            "address": "{prefix}.{agent}." + topic,
            "description": description,
            "parameters": {
                "prefix": {"default": "pyrula", "description": "the deployment's topic prefix"},
                "agent": {"description": "the agent's name"},
            },
            "messages": {n: {"$ref": f"#/components/messages/{n}"} for n in names},
        }
    sends = {"turns", "control", "signals", "answers"}
    operations = {
        f"{'send' if topic in sends else 'receive'}_{topic}": {
            "action": "send" if topic in sends else "receive",
            "channel": {"$ref": f"#/channels/{topic}"},
        }
        for topic in topics
    }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "pyrula-stream agent topics",
            "version": __version__,
            "description": "The topics of one agent, as a client in any language uses them. "
            "Keys are UTF-8 text; events are partitioned by turn id with Kafka's default "
            "(murmur2) partitioner.",
        },
        "defaultContentType": serde.JSON_CONTENT_TYPE,
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


@cache
def _rendered() -> dict[str, str]:
    files = {
        f"json/{name}": json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
        for name, schema in json_schemas().items()
    }
    files["asyncapi.yaml"] = (
        "# Generated by python -m pyrula_stream.wire.contracts: do not edit.\n"
        + yaml.safe_dump(asyncapi(), sort_keys=False, allow_unicode=True, width=100)
    )
    return files


def rendered() -> dict[str, str]:
    """Every generated file's text, by its path under ``schemas/``."""
    return dict(_rendered())


def stale(root: Path = SCHEMAS_DIR) -> list[str]:
    """The generated files under ``root`` that differ from the code (or are missing)."""
    out = []
    for path, text in rendered().items():
        file = root / path
        if not file.exists() or file.read_text(encoding="utf-8") != text:
            out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyrula_stream.wire.contracts")
    parser.add_argument("--check", action="store_true", help="fail when a file is stale")
    parser.add_argument("--out", type=Path, default=SCHEMAS_DIR)
    args = parser.parse_args(argv)
    if args.check:
        old = stale(args.out)
        for path in old:
            print(f"stale: schemas/{path} (run: python -m pyrula_stream.wire.contracts)")
        return 1 if old else 0
    for path, text in rendered().items():
        file = args.out / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text, encoding="utf-8")
        print(f"wrote {file}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
