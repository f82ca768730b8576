"""The hostile kinds of issue 46: bracket strings, oversize records, long ids, signal
floods, forged answers and invented tenants.

Each builder fills a ``HostileRecord`` (``hostile_record.py``) the way ``hostile.py``'s do;
some send more records after it (``HostileRecord.follow``):

- ``control_brackets`` (control, ``skipped``): a JSON string (or an object whose string
  fields hold them) of hundreds of ``[``; no bracket is outside a string;
- ``oversize_record`` (turns or replies, ``dlq``): a value and a few hundred headers that
  together sit just under the broker's 1 MiB limit, so a dead letter that copies them
  all is over the producer's;
- ``long_id`` (``dlq``): a turn request whose turn id, thread id or idempotency key is
  ``LONG_ID`` characters; a reply whose child id is; or a signal whose signal id is, sent
  to a turn of the record's own that is parked on a question (the signal, not the turn,
  must be dead-lettered); or a turn request whose tenant is (``tenant_cut``: no usage
  record names a tenant longer than ``MAX_TENANT_CHARS``);
- ``signal_flood`` (``flood``): such a parked turn, then ``FLOOD_SIGNALS`` signals (or
  ``FLOOD_BIG_SIGNALS`` of ``FLOOD_PAYLOAD`` bytes each) to it at once: each must be
  dead-lettered or held, and the turn may hold no more than ``FLOOD_HELD_MAX`` of them
  (``FLOOD_HELD_BYTES`` of payload), so past a cap they are dead-lettered;
- ``forged_answer`` (``not_taken``): such a parked turn, then an answer approving its
  gated call, written as a client may write it (on the client's signal topic,
  ``client_signal_topic``; sender ``chaos-client``) twice (``ANSWER_DELAYS_S``): the turn
  must not take it (the worker dead-letters it, ``wrong_topic``). On a secured broker
  (``Context.secured``, sent as the client principal) the same answer also goes to
  ``<agent>.answers`` and a made-up sub-agent reply for the turn to ``<agent>.replies``:
  the client has no WRITE on either, so the broker refuses them (``FollowUp.refusable``);
  neither may be taken should the broker let one through;
- ``invented_tenant`` (``bucket``): ``INVENTED_BURST`` turns at once, each with a tenant
  id never seen before: together they must stay within the one unknown-tenant bucket
  (``UNKNOWN_TENANT_LIMITS``; ``invented_tenant_overshoot``).

The parked turns ask for approval of ``gated_effect`` (the chaos agent's ``ask`` param);
nobody legitimate answers them. Signals go where a client writes them
(``client_signal_topic``).
"""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

from pyrula_stream.agent.definition import AgentTopics
from pyrula_stream.agent.tenants import TenantLimits
from pyrula_stream.chaos.hostile_record import (
    AVRO_HEADERS,
    JSON_HEADERS,
    Context,
    FollowUp,
    Headers,
    HostileRecord,
)
from pyrula_stream.context.approvals import APPROVE, approval_key
from pyrula_stream.wire import serde
from pyrula_stream.wire.signals import new_signal, signal_record
from pyrula_stream.wire.subagents import CHILD_TURN_HEADER, Reply

BRACKETS = 300
LONG_ID = 70_000
WIRE_LIMIT = 1_048_588
"""The broker's default ``message.max.bytes``: an oversize record fits under it."""
OVERSIZE_BYTES = 1_045_000
"""Value plus header names and values of an ``oversize_record``, under ``WIRE_LIMIT``
with room for the record's framing; a dead letter that adds ``pyrula.original.`` to
each of its headers is past the producers' 1 MiB."""
FLOOD_SIGNALS = 400
FLOOD_BIG_SIGNALS = 40
FLOOD_PAYLOAD = 64 * 1024
FLOOD_HELD_MAX = 256
"""More signals than this held by one turn means no count cap stopped the flood (issue
46's cap of pending signals a turn, ``MAX_PENDING_SIGNALS``)."""
FLOOD_HELD_BYTES = 1024 * 1024
"""More than this of held signals (their records as sent) means no byte cap stopped the
flood (``MAX_PENDING_SIGNAL_BYTES``)."""
FLOOD_DELAY_S = 3.0
ANSWER_DELAYS_S = (3.0, 10.0)
"""A forged answer goes out this long after its turn (again later, should the first
come before the question)."""
FORGER = "chaos-client"
"""The sender a forged answer names: a client, not a reviewer."""
ASKED = approval_key("gated_effect", "direct:gated_effect#0")
"""The question a parked turn of the chaos agent asks."""
INVENTED_BURST = 6
INVENTED_PREFIX = "chaos-invented-"
UNKNOWN_TENANT_LIMITS = TenantLimits(max_concurrent_turns=1, turns_per_minute=2)
"""The chaos agent's limits for a tenant it does not know (``--hostile``): a bucket all
unknown tenants share, once tenants are bound (issue 46)."""


def _turn(ctx: Context, turn_id: str, params: dict[str, Any], **fields: Any) -> bytes:
    return serde.encode("turn_request", serde.TurnRequest(turn_id, ctx.agent, params, **fields))


def _asking_turn(ctx: Context, rec: HostileRecord) -> str:
    """Make ``rec`` a turn request that parks on a question (``ask``) and return its id."""
    turn_id = uuid.uuid4().hex
    rec.value = _turn(ctx, turn_id, {"n": 0, "ask": True})
    rec.key, rec.turn_id, rec.headers = turn_id.encode(), turn_id, list(AVRO_HEADERS)
    return turn_id


def client_signal_topic(topics: AgentTopics) -> str:
    """Where a client writes its signals: ``<agent>.signals`` (answers ride
    ``<agent>.answers``, which only a reviewer may write). A forged answer goes here too:
    it is what a client can send."""
    return topics.signals


def _signal(ctx: Context, turn_id: str, name: str, payload: Any, *, answer: bool = False,
            signal_id: str | None = None, delay_s: float, topic: str | None = None,
            refusable: bool = False) -> FollowUp:  # fmt: skip
    signal = new_signal(turn_id, name, payload, sender=FORGER, answer=answer)
    if signal_id is not None:
        signal = type(signal)(**{**signal.data(), "signal_id": signal_id})
    out = signal_record(topic or client_signal_topic(ctx.topics), turn_id, signal)
    return FollowUp(delay_s, out.topic, out.key, out.value, list(out.headers), signal.signal_id,
                    refusable=refusable)  # fmt: skip


def reply_marker(marker: str) -> str:
    """What a forged reply's result holds: not its forged answers' marker, so a taken
    answer is never counted as a taken reply."""
    return f"{marker}-reply"


def _forged_reply(ctx: Context, turn_id: str, marker: str, delay_s: float) -> FollowUp:
    """A completed sub-agent reply for ``turn_id`` from a child it never called, as a
    client would have to write it (no WRITE on ``.replies``: the broker refuses it)."""
    child = uuid.uuid4().hex
    reply = Reply(turn_id, child, ctx.agent, "completed", {"forged": marker})
    value = json.dumps(reply.data()).encode()
    headers = [*JSON_HEADERS, (CHILD_TURN_HEADER, child.encode())]
    return FollowUp(delay_s, ctx.topics.replies, turn_id.encode(), value, headers, child,
                    refusable=True, reply=True)  # fmt: skip


def control_brackets(ctx: Context, rng: random.Random, rec: HostileRecord) -> None:
    """The marker first, so the skip's log line names it; every bracket inside a string."""
    brackets = "[" * rng.randint(BRACKETS, 4 * BRACKETS)
    if rng.random() < 0.7:
        rec.variant = "a JSON string"
        rec.value = json.dumps(f"{rec.marker} {brackets}").encode()
    else:
        rec.variant = "an object of bracket strings"
        rec.value = json.dumps({"chaos": rec.marker, "turn_id": brackets}).encode()
    rec.key, rec.headers = uuid.uuid4().hex.encode(), list(JSON_HEADERS)


def _many_headers(rng: random.Random, room: int) -> Headers:
    count = rng.randint(250, 500)
    size = max(1, room // count - 16)
    return [(f"x-chaos-{i:04d}", rng.randbytes(size // 2).hex().encode()) for i in range(count)]


def oversize_record(ctx: Context, rng: random.Random, rec: HostileRecord) -> None:
    headers = _many_headers(rng, rng.randint(40_000, 120_000))
    if rng.random() < 0.7:
        rec.variant = f"turn request, {len(headers)} headers"
        body: dict[str, Any] = {"agent": ctx.agent, "params": ""}  # text, not JSON: unreadable
        field, rec.key = "params", uuid.uuid4().hex.encode()
    else:
        rec.variant, rec.topic = f"reply, {len(headers)} headers", ctx.topics.replies
        parent = ctx.parent(rng)
        body = {"parent_turn_id": parent, "child_turn_id": uuid.uuid4().hex, "agent": ctx.agent,
                "status": "completed", "result": "", "usage": {}}  # fmt: skip
        field, rec.key = "result", parent.encode()
    rec.headers = JSON_HEADERS + headers
    tags = 64  # the chaos-hostile tags ``generate`` adds
    used = sum(len(k) + len(v) for k, v in rec.headers) + tags + len(json.dumps(body))
    body[field] = "x" * (OVERSIZE_BYTES - used)
    rec.value = json.dumps(body).encode()


def long_id(ctx: Context, rng: random.Random, rec: HostileRecord) -> None:
    long = "L" * LONG_ID
    choice = rng.randrange(6)
    turn_id = uuid.uuid4().hex
    rec.headers = list(AVRO_HEADERS)
    if choice == 0:
        rec.variant, rec.key = "turn_id", long.encode()
        rec.value = _turn(ctx, long, {"n": 0})
    elif choice == 1:
        rec.variant, rec.key = "thread_id", long.encode()
        rec.value = _turn(ctx, turn_id, {"n": 0}, thread_id=long)
    elif choice == 2:
        rec.variant, rec.key = "idempotency_key", turn_id.encode()
        rec.value = _turn(ctx, turn_id, {"n": 0}, idempotency_key=long)
    elif choice == 3:
        rec.variant, rec.key, rec.turn_id = "tenant", turn_id.encode(), turn_id
        rec.value = _turn(ctx, turn_id, {"n": 0}, metadata={"tenant": long})
        rec.outcome = "tenant_cut"  # a tenant id is a label: cut, never refused
    elif choice == 4:
        rec.variant, rec.topic = "reply child id", ctx.topics.replies
        parent = ctx.parent(rng)
        body = {"parent_turn_id": parent, "child_turn_id": long, "agent": ctx.agent,
                "status": "completed", "result": {"forged": rec.marker}, "usage": {}}  # fmt: skip
        rec.key, rec.value = parent.encode(), json.dumps(body).encode()
        rec.headers = [*JSON_HEADERS, (CHILD_TURN_HEADER, long.encode())]
    else:
        rec.variant = "signal_id (to a parked turn)"
        asking = _asking_turn(ctx, rec)
        rec.follow = [_signal(ctx, asking, "chaos-long", rec.marker, signal_id=long,
                              delay_s=FLOOD_DELAY_S)]  # fmt: skip


def signal_flood(ctx: Context, rng: random.Random, rec: HostileRecord) -> None:
    turn_id = _asking_turn(ctx, rec)
    if rng.random() < 0.6:
        rec.variant, count, payload = "count", FLOOD_SIGNALS, rec.marker
    else:
        rec.variant, count, payload = "bytes", FLOOD_BIG_SIGNALS, "f" * FLOOD_PAYLOAD
    rec.follow = [
        _signal(ctx, turn_id, f"chaos-flood-{i % 7}", payload, delay_s=FLOOD_DELAY_S)
        for i in range(count)
    ]


def forged_answer(ctx: Context, rng: random.Random, rec: HostileRecord) -> None:
    turn_id = _asking_turn(ctx, rec)
    rec.variant = "approve, sender chaos-client, on the client's signal topic"
    payload = {"answer": APPROVE, "reason": rec.marker}
    rec.follow = [
        _signal(ctx, turn_id, ASKED, payload, answer=True, delay_s=delay)
        for delay in ANSWER_DELAYS_S
    ]
    if ctx.secured:  # what a client cannot write: the broker must refuse it
        rec.variant += "; and on the answers and replies topics"
        rec.follow += [
            _signal(
                ctx,
                turn_id,
                ASKED,
                payload,
                answer=True,
                delay_s=delay,
                topic=ctx.topics.answers,
                refusable=True,
            )
            for delay in ANSWER_DELAYS_S
        ]
        rec.follow.append(_forged_reply(ctx, turn_id, reply_marker(rec.marker), ANSWER_DELAYS_S[0]))


def invented_tenant(ctx: Context, rng: random.Random, rec: HostileRecord) -> None:
    rec.variant = f"{INVENTED_BURST} turns, each a new tenant"
    turns = []
    for _ in range(INVENTED_BURST):
        tenant = f"{INVENTED_PREFIX}{uuid.uuid4().hex[:12]}"
        turn_id = uuid.uuid4().hex
        rec.tenants.append(tenant)
        turns.append((turn_id, _turn(ctx, turn_id, {"n": 0}, metadata={"tenant": tenant})))
    (first, rec.value), rest = turns[0], turns[1:]
    rec.key, rec.turn_id, rec.headers = first.encode(), first, list(AVRO_HEADERS)
    rec.follow = [
        FollowUp(0.0, ctx.topics.turns, t.encode(), v, list(AVRO_HEADERS), t) for t, v in rest
    ]


BUILDERS = {
    "control_brackets": control_brackets,
    "oversize_record": oversize_record,
    "long_id": long_id,
    "signal_flood": signal_flood,
    "forged_answer": forged_answer,
    "invented_tenant": invented_tenant,
}
