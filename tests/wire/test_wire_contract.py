"""The wire contract's prose follows the code: every event type is documented where a
consumer in another language looks for it.

``EventType`` is what the worker publishes. A reader without our code has two places to
learn the types: the ``type`` field's ``doc`` in ``schemas/event.avsc`` (the file it
decodes with) and the table of ``docs/pipelines.md`` that says what each type's ``data``
holds. Both drifted before (``run:interrupted`` and ``run:deferred`` were in neither), so
this test holds them to the enum, both ways.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pyrula_stream.wire.events import EventType

ROOT = Path(__file__).resolve().parent.parent.parent
SCHEMA = ROOT / "schemas" / "event.avsc"
PACKAGED_SCHEMA = ROOT / "pyrula_stream" / "schemas" / "event.avsc"
PIPELINES = ROOT / "docs" / "pipelines.md"

TYPES = {str(t) for t in EventType}
TABLE_HEADER = re.compile(r"\|\s*type\s*\|\s*data\s*\|")
TYPE_TOKEN = re.compile(r"(?<![\w:-])[a-z]+:[a-z]+(?![\w:-])")
"""A ``scope:name`` event type in prose (``status`` has no scope and is matched alone)."""


def _mentions(text: str, event_type: str) -> bool:
    return re.search(rf"(?<![\w:-]){re.escape(event_type)}(?![\w:-])", text) is not None


def _type_doc(schema_path: Path) -> str:
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    (field,) = [f for f in schema["fields"] if f["name"] == "type"]
    doc = field.get("doc", "")
    assert isinstance(doc, str)
    return doc


def _event_table(markdown: str) -> list[str]:
    """The first cell of each row of the table headed ``| type | data |``."""
    lines = markdown.splitlines()
    header = [i for i, line in enumerate(lines) if TABLE_HEADER.fullmatch(line)]
    assert len(header) == 1, f"{PIPELINES.name} has {len(header)} tables headed | type | data |"
    rows = []
    for line in lines[header[0] + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1].strip().strip("`"))
    return rows


def test_the_shipped_schema_is_the_repository_schema() -> None:
    """``schemas/`` is what readers are pointed at and the package's copy is what the
    codecs load and the wheel ships; it links to that copy, so they cannot differ."""
    assert SCHEMA.read_bytes() == PACKAGED_SCHEMA.read_bytes()


def test_the_schema_documents_every_event_type() -> None:
    doc = _type_doc(PACKAGED_SCHEMA)
    missing = sorted(t for t in TYPES if not _mentions(doc, t))
    unknown = sorted(set(TYPE_TOKEN.findall(doc)) - TYPES)
    assert not missing, f"schemas/event.avsc: the doc of `type` does not name {missing}"
    assert not unknown, f"schemas/event.avsc: the doc of `type` names {unknown}, not event types"


def test_the_pipelines_page_has_a_row_for_every_event_type() -> None:
    rows = _event_table(PIPELINES.read_text(encoding="utf-8"))
    missing = sorted(TYPES - set(rows))
    unknown = sorted(set(rows) - TYPES)
    assert not missing, f"docs/pipelines.md: the event table has no row for {missing}"
    assert not unknown, f"docs/pipelines.md: the event table has rows for {unknown}, not types"
    assert len(rows) == len(set(rows)), f"docs/pipelines.md: a type has two rows: {rows}"
