"""One hostile record of a ``--hostile`` run: what it is, where it went, what it must lead to.

The kinds and their documented outcomes (``EXPECT``) live here so that the generators
(``hostile.py`` for the decoding kinds, ``hostile_caps.py`` for the caps and roles
kinds of issue 46) and the checks (``hostile_check.py``, ``hostile_caps_check.py``) agree.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.wire import serde
from pyrula_stream.wire.serde import CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE, PARAMS_CONTENT_TYPE

KIND_HEADER = "chaos-hostile"
ID_HEADER = "chaos-hostile-id"
MARK = "chaos-hostile-"
"""``chaos-hostile-<run tag>-<index>``: in every forged reply's result (a parent that took
one shows it in its events) and first in every unreadable control record (so the
worker's log line names it)."""

TURN_KINDS = (
    "deep_nesting",
    "huge_number",
    "invalid_utf8",
    "wrong_type",
    "forged_lineage",
    "forged_child",
)
REPLY_KINDS = ("forged_reply", "hostile_reply")
CONTROL_KINDS = ("control_unreadable", "control_unknown_turn")
CAPS_KINDS = (
    "control_brackets",
    "oversize_record",
    "long_id",
    "signal_flood",
    "forged_answer",
    "invented_tenant",
)
"""Issue 46's kinds (``hostile_caps.py``)."""
DECODE_KINDS = TURN_KINDS + REPLY_KINDS + CONTROL_KINDS
"""Issue 28's kinds (``hostile.py``)."""
KINDS = DECODE_KINDS + CAPS_KINDS
EXPECT = {
    **{k: "dlq" for k in TURN_KINDS + REPLY_KINDS},
    "forged_child": "reply_dlq",
    "control_unreadable": "skipped",
    "control_unknown_turn": "ignored",
    "control_brackets": "skipped",
    "oversize_record": "dlq",
    "long_id": "dlq",
    "signal_flood": "flood",
    "forged_answer": "not_taken",
    "invented_tenant": "bucket",
}
"""``flood``: each signal dead-lettered or held, and no more held than ``FLOOD_HELD_MAX``;
``not_taken``: the forged answer is not taken (``forged_answers_taken``); ``bucket``: the
invented tenants' turns stay within one unknown-tenant bucket
(``invented_tenant_overshoot``)."""

Headers = list[tuple[str, bytes]]
PARAMS_HEADERS: Headers = [(CONTENT_TYPE_HEADER, PARAMS_CONTENT_TYPE.encode())]
JSON_HEADERS: Headers = [(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE.encode())]
AVRO_HEADERS: Headers = [(CONTENT_TYPE_HEADER, serde.content_type("turn_request").encode())]


@dataclass
class FollowUp:
    """A record sent ``delay_s`` after its hostile record (a flood's signals, an answer
    to the question the record's turn asks), checked with it."""

    delay_s: float
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers
    note: str = ""
    """What it names (a signal id, or a forged reply's child id), for the check."""
    delivered: tuple[int, int] | None = None
    refusable: bool = False
    """Sent where its principal has no WRITE (``--secured``): the broker's authorization
    error is its expected outcome, not a failure to send."""
    refused: str | None = None
    """The broker's authorization error, when it refused the record."""
    reply: bool = False
    """A forged sub-agent reply (``note`` is its child id), not a signal."""

    def source(self) -> str:
        if self.delivered is None:
            return f"{self.topic}[?]@?"
        return f"{self.topic}[{self.delivered[0]}]@{self.delivered[1]}"


@dataclass
class HostileRecord:
    """One hostile record and what it must lead to."""

    index: int
    kind: str
    variant: str
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers
    partition: int | None = None
    marker: str = ""
    turn_id: str | None = None
    """The turn a ``forged_child`` runs as, or the unknown turn a control record names."""
    delivered: tuple[int, int] | None = None
    """(partition, offset) the broker acknowledged."""
    follow: list[FollowUp] = field(default_factory=list)
    """Records sent after this one (``signal_flood``, ``forged_answer``)."""
    tenants: list[str] = field(default_factory=list)
    """The invented tenant ids of an ``invented_tenant`` record's turns."""
    outcome: str = ""
    """What this record must lead to when its variant differs from its kind's ``EXPECT``
    (``tenant_cut``: a long tenant id is cut to ``MAX_TENANT_CHARS``, as documented)."""

    @property
    def expect(self) -> str:
        return self.outcome or EXPECT[self.kind]

    @property
    def source(self) -> str:
        """Where it sits, as a dead letter's ``pyrula.dlq.source`` names it."""
        if self.delivered is None:
            return f"{self.topic}[?]@?"
        return f"{self.topic}[{self.delivered[0]}]@{self.delivered[1]}"

    def describe(self) -> str:
        return f"#{self.index} {self.kind}/{self.variant} at {self.source}"


@dataclass
class Context:
    """What a generator needs: the agent, its topics and the valid turns sent so far."""

    agent: str
    partitions: int
    run_tag: str
    parents: Callable[[], Sequence[str]] = list
    secured: bool = False
    """``--secured``: forged answers also try the topics a client may not write."""
    topics: AgentTopics = field(init=False)

    def __post_init__(self) -> None:
        self.topics = AgentTopics.for_agent(self.agent)

    def parent(self, rng: random.Random) -> str:
        """A valid turn already submitted (it never called), else a made-up one."""
        known = self.parents()
        return rng.choice(known) if known and rng.random() < 0.85 else uuid.uuid4().hex
