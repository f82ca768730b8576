"""``--hostile``: a seeded stream of hostile records, sent while the valid turns run.

Each record is generated from the run's seed (``generate``), tagged with the headers
``chaos-hostile: <kind>`` and ``chaos-hostile-id: <n>``, and sent by ``HostileSender``
spread over the submission window, so it lands between valid turns and kills. What each
kind must lead to (``expect``) is what the runtime documents (docs/hostile-input.md):

- ``dlq``: a dead letter whose ``pyrula.dlq.source`` is the record's own place, with a
  reason; turn requests (``deep_nesting``, ``huge_number``, ``invalid_utf8``,
  ``wrong_type``, ``forged_lineage``) at intake, replies (``forged_reply``,
  ``hostile_reply``) when the owner of the parent's partition refuses them
  (``unsolicited_reply``);
- ``reply_dlq`` (``forged_child``): a turn request with forged lineage headers placed
  exactly where ``call_agent`` would put it cannot be told from a real call, so it runs;
  its reply goes to the named parent, which made no such call and dead-letters it
  (``unsolicited_reply``, ``pyrula.original.pyrula-child-turn-id`` = the forged turn).
  On ``--secured`` (``undeliverable_dlq``) the broker refuses the reply itself: this
  agent's worker has no WRITE on the replies topic it names, so the turn ends with
  ``record_undeliverable`` and its own worker dead-letters the reply with that code;
- ``skipped`` (``control_unreadable``): a control record no worker can read is skipped,
  logged (``ignoring unreadable control record``, whose text holds the record's marker)
  and counted (``pyrula_skipped_records{source="control"}``), never dead-lettered;
- ``ignored`` (``control_unknown_turn``): a readable cancel or terminate for a turn that
  does not exist is remembered in case the turn arrives; nothing runs, nothing is written.

Cancel and terminate records on ``<agent>.control`` are the control signals sent here;
signals on ``<agent>.signals`` (long ids, floods, forged answers) are among issue 46's
kinds (``hostile_caps.py``), which ``generate`` builds too.
"""

from __future__ import annotations

import heapq
import io
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import fastavro
from confluent_kafka import KafkaException, Producer

from pyrula_stream.chaos import hostile_caps
from pyrula_stream.chaos.hostile_record import (
    AVRO_HEADERS,
    CAPS_KINDS,
    CONTROL_KINDS,
    DECODE_KINDS,
    EXPECT,
    ID_HEADER,
    JSON_HEADERS,
    KIND_HEADER,
    KINDS,
    MARK,
    PARAMS_HEADERS,
    REPLY_KINDS,
    TURN_KINDS,
    Context,
    FollowUp,
    Headers,
    HostileRecord,
)
from pyrula_stream.kafka.config import is_authorization_failure, new_producer, producer_config
from pyrula_stream.kafka.offsets import kafka_error
from pyrula_stream.kafka.partitioner import partition_for
from pyrula_stream.wire import serde
from pyrula_stream.wire.lineage import Lineage
from pyrula_stream.wire.serde import CONTENT_TYPE_HEADER
from pyrula_stream.wire.subagents import CHILD_TURN_HEADER, child_turn_id

_PARAMS = PARAMS_HEADERS
_JSON = JSON_HEADERS
_AVRO = AVRO_HEADERS
_BAD_UTF8 = (b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80")
_LEGACY_CHILD_NS = uuid.UUID("6f1d3c2e-6b0f-4f7e-9a53-2b8f0c6f7a11")


def _nest(depth: int, rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


def _depth(rng: random.Random) -> int:
    return 100_000 if rng.random() < 0.1 else rng.randint(129, 20_000)


def _digits(rng: random.Random) -> bytes:
    return b"9" * rng.randint(4_301, 60_000)


def _avro(body: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, serde.parsed_schema("turn_request"), body)
    return buf.getvalue()


def _avro_body(ctx: Context, **fields: Any) -> dict[str, Any]:
    request = serde.TurnRequest(uuid.uuid4().hex, ctx.agent, {"n": 0})
    return {**serde.avro_body("turn_request", request), **fields}


def _envelope(ctx: Context, **fields: Any) -> dict[str, Any]:
    return {"agent": ctx.agent, "params": {"n": 0}, **fields}


def _turn_bytes(ctx: Context, raw_field: str, raw: bytes) -> bytes:
    """A JSON turn request whose ``raw_field`` is the bytes ``raw`` as they are."""
    head = json.dumps(_envelope(ctx))[:-1].encode()
    return head + b', "' + raw_field.encode() + b'": ' + raw + b"}"


def _deep_nesting(ctx: Context, rng: random.Random) -> tuple[str, bytes, Headers]:
    deep = _nest(_depth(rng), rng)
    choice = rng.randrange(5)
    if choice == 0:
        return "bare params", deep, _PARAMS
    if choice == 1:
        return "bare params field", b'{"n": ' + deep + b"}", _PARAMS
    if choice == 2:
        return "json metadata", _turn_bytes(ctx, "metadata", deep), _JSON
    if choice == 3:
        text = json.dumps(deep.decode()).encode()
        return "json params as text", _turn_bytes(ctx, "params", text), _JSON
    return "avro params text", _avro(_avro_body(ctx, params=deep.decode())), _AVRO


def _huge_number(ctx: Context, rng: random.Random) -> tuple[str, bytes, Headers]:
    digits = _digits(rng)
    choice = rng.randrange(5)
    if choice == 0:
        return "bare params", b'{"n": ' + digits + b"}", _PARAMS
    if choice == 1:
        return "json submitted_ms", _turn_bytes(ctx, "submitted_ms", digits), _JSON
    if choice == 2:
        text = b'"' + digits + b'"'
        return "json submitted_ms as text", _turn_bytes(ctx, "submitted_ms", text), _JSON
    if choice == 3:
        inf = rng.choice([b"1e400", b"-1e999", b"1" + digits + b".5"])
        return "json submitted_ms past float", _turn_bytes(ctx, "submitted_ms", inf), _JSON
    params = '{"n": ' + digits.decode() + "}"
    return "avro params text", _avro(_avro_body(ctx, params=params)), _AVRO


def _invalid_utf8(ctx: Context, rng: random.Random) -> tuple[str, bytes, Headers]:
    bad = rng.choice(_BAD_UTF8) * rng.randint(1, 4)
    choice = rng.randrange(5)
    if choice == 4:  # valid JSON, but a surrogate with no pair is no text either
        escape = rng.choice([b"\\ud800", b"\\uDFFF", b"\\udc00x"])
        name = rng.choice(["thread_id", "idempotency_key", "turn_id"])
        value = _turn_bytes(ctx, name, b'"' + escape + b'"')
        return f"json {name} with a lone surrogate", value, _JSON
    if choice == 0:
        return "bare params", b'{"n": 0, "s": "a' + bad + b'"}', _PARAMS
    if choice == 1:
        return "json turn_id", _turn_bytes(ctx, "turn_id", b'"t' + bad + b'"'), _JSON
    if choice == 2:
        return (
            "json field name",
            b'{"' + bad + b'": 1, ' + json.dumps(_envelope(ctx))[1:].encode(),
            _JSON,
        )
    placeholder = "X" * 32
    body = _avro_body(ctx, turn_id=placeholder)
    value = _avro(body).replace(placeholder.encode(), (bad * 32)[:32], 1)
    return "avro turn_id", value, _AVRO


_WRONG: dict[str, list[Any]] = {
    "turn_id": [[1], {"a": 1}, True, 1.5, [], {}, False],
    "agent": [["x"], {"name": "x"}, True, 2.5, 7, [], {}, False],
    "params": ["n=1", "[1]", 7, [1], True, 1.5],
    "metadata": [[1], "x", 5, True, 1.5, False],
    "thread_id": [[1], {"a": 1}, 5, True, 1.5],
    "idempotency_key": [[1], {"a": 1}, 5, True, 1.5],
    "submitted_ms": [[1], {"a": 1}, True, "soon", 1.5, [], {}, False],
}


def _wrong_type(ctx: Context, rng: random.Random) -> tuple[str, bytes | None, Headers]:
    choice = rng.randrange(10)
    if choice < 6:
        name = rng.choice(sorted(_WRONG))
        wrong = rng.choice(_WRONG[name])
        body = _envelope(ctx, **{name: wrong})
        return f"json {name}={json.dumps(wrong)}", json.dumps(body).encode(), _JSON
    if choice == 6:
        top = rng.choice([b"[1, 2]", b'"turn"', b"7", b"null", b"true"])
        return "json not an object", top, rng.choice([_JSON, _PARAMS])
    if choice == 7:
        other = json.dumps(_envelope(ctx, agent=f"{ctx.agent}-other")).encode()
        return "another agent's turn", other, _JSON
    if choice == 8:
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        return "corrupt avro", junk, _AVRO
    ctype = rng.choice([b"text/plain", b"application/x-protobuf", b"\xff\xfe"])
    headers = [(CONTENT_TYPE_HEADER, ctype)]
    return "unsupported content-type", json.dumps(_envelope(ctx)).encode(), headers


def _lineage(ctx: Context, rng: random.Random) -> Lineage:
    parent = ctx.parent(rng)
    return Lineage(
        parent,
        parent,
        ctx.agent,
        "pyrula",
        partition_for(parent.encode(), ctx.partitions),
        f"agent:{ctx.agent}#0",
        1,
    )


def _forged_request(ctx: Context, rng: random.Random, **fields: Any) -> tuple[str, bytes]:
    turn_id = uuid.uuid4().hex
    request = serde.TurnRequest(turn_id, ctx.agent, {"n": rng.randrange(1000)}, **fields)
    return turn_id, serde.encode("turn_request", request)


def _forged_lineage(ctx: Context, rng: random.Random, rec: HostileRecord) -> None:
    """Lineage headers a worker can tell are forged: partial, unreadable or misplaced."""
    lineage = _lineage(ctx, rng)
    turn_id, value = _forged_request(ctx, rng)
    rec.value, rec.key = value, turn_id.encode()
    headers = lineage.headers()
    choice = rng.randrange(5)
    if choice == 0:
        parent = ("pyrula-parent-turn-id", lineage.parent_turn_id.encode())
        others = [h for h in headers if h != parent]
        keep = [parent, *rng.sample(others, rng.randrange(len(others)))]
        rec.variant, headers = "partial", keep
    elif choice == 1:
        name = rng.choice(["pyrula-depth", "pyrula-parent-partition", "pyrula-max-depth"])
        bad = rng.choice([b"deep", b"1.5", _digits(rng), rng.choice(_BAD_UTF8)])
        headers = [(k, bad if k == name else v) for k, v in headers]
        if name == "pyrula-max-depth":
            headers.append((name, bad))
        rec.variant = f"unreadable {name}"
    elif choice == 2:
        rec.variant, rec.key = "keyed by another id", uuid.uuid4().hex.encode()
    elif choice == 3:
        turn_id, rec.value = _forged_request(ctx, rng, thread_id=f"thread-{uuid.uuid4().hex}")
        rec.variant, rec.key = "in a thread", turn_id.encode()
    else:
        own = partition_for(rec.key, ctx.partitions)
        rec.partition = (own + rng.randrange(1, max(2, ctx.partitions))) % ctx.partitions
        rec.variant = "on another partition" if rec.partition != own else "misplaced key"
        if rec.partition == own:  # one partition: a misplaced key instead
            rec.key = uuid.uuid4().hex.encode()
    rec.headers = headers + _AVRO


def _forged_child(ctx: Context, rng: random.Random, rec: HostileRecord) -> None:
    """Lineage headers exactly as ``call_agent`` writes them, for a parent that never
    called: the turn runs, and its parent must refuse its reply."""
    lineage = _lineage(ctx, rng)
    turn_id, rec.value = _forged_request(ctx, rng)
    rec.key, rec.turn_id = turn_id.encode(), turn_id
    rec.headers = lineage.headers() + _AVRO
    rec.variant = "well placed"
    if ctx.secured:  # the broker refuses the reply: the callee dead-letters it
        rec.outcome = "undeliverable_dlq"


def _reply_value(parent: str, child: str, agent: str, marker: str, status: str) -> bytes:
    body: dict[str, Any] = {
        "parent_turn_id": parent,
        "child_turn_id": child,
        "agent": agent,
        "status": status,
        "result": {"forged": marker, "refunded": 99_999},
        "usage": {},
    }
    if status == "failed":
        body.update(result=None, code="agent_error", message=marker)
    return json.dumps(body).encode()


def _forged_reply(ctx: Context, rng: random.Random, rec: HostileRecord) -> None:
    """A well-formed reply for a turn that did not make that call, with a child id a
    reader of the source would predict."""
    parent = ctx.parent(rng)
    agent = rng.choice([f"{ctx.agent}-child", ctx.agent])
    call_key = f"agent:{agent}#0"
    guess = rng.randrange(3)
    if guess == 0:
        child, rec.variant = str(uuid.uuid5(_LEGACY_CHILD_NS, f"{parent}|{call_key}")), "legacy id"
    elif guess == 1:
        child, rec.variant = child_turn_id(parent, call_key, ""), "id with a guessed hash"
    else:
        child, rec.variant = str(uuid.uuid4()), "random id"
    status = rng.choice(["completed", "completed", "failed"])
    rec.value = _reply_value(parent, child, agent, rec.marker, status)
    rec.key = parent.encode()
    rec.headers = [*_JSON, (CHILD_TURN_HEADER, child.encode())]


def _hostile_reply(ctx: Context, rng: random.Random, rec: HostileRecord) -> None:
    parent = ctx.parent(rng)
    good = json.loads(_reply_value(parent, str(uuid.uuid4()), ctx.agent, rec.marker, "completed"))
    choice = rng.randrange(6)
    if choice == 0:
        rec.variant, rec.value = "deep nesting", b'{"result": ' + _nest(_depth(rng), rng) + b"}"
    elif choice == 1:
        rec.variant = "huge number"
        rec.value = json.dumps(good)[:-1].encode() + b', "n": ' + _digits(rng) + b"}"
    elif choice == 2:
        bad = rng.choice(_BAD_UTF8)
        rec.variant = "invalid utf-8"
        if rng.random() < 0.3:
            bad, rec.variant = b"\\ud800", "lone surrogate"
        rec.value = json.dumps(good).encode().replace(b'"completed"', b'"c' + bad + b'"')
    elif choice == 3:
        name = rng.choice(["parent_turn_id", "child_turn_id", "agent", "status"])
        wrong: Any = rng.choice([1, [parent], {"id": parent}, None, True])
        rec.variant = f"{name}={json.dumps(wrong)}"
        rec.value = json.dumps({**good, name: wrong}).encode()
    elif choice == 4:
        name = rng.choice(["code", "message", "usage"])
        wrong = rng.choice([[1], 5, True] if name != "usage" else [[1], "x", 5])
        rec.variant = f"{name}={json.dumps(wrong)}"
        rec.value = json.dumps({**good, name: wrong}).encode()
    else:
        rec.variant, rec.value = "not an object", rng.choice([b"", b"[1]", b'"ok"', b"7"])
    rec.key = parent.encode()
    rec.headers = list(_JSON)


def _control_unreadable(ctx: Context, rng: random.Random, rec: HostileRecord) -> None:
    """Unreadable whatever its fault; the marker comes first, so the log line shows it."""
    head = b'{"chaos": "' + rec.marker.encode() + b'", '
    turn = uuid.uuid4().hex
    choice = rng.randrange(5)
    if choice == 0:
        rec.variant, tail = "deep nesting", b'"turn_id": ' + _nest(_depth(rng), rng) + b"}"
    elif choice == 1:
        rec.variant = "huge number"
        tail = b'"turn_id": "' + turn.encode() + b'", "action": "cancel", "ts_ms": '
        tail += _digits(rng) + b"}"
    elif choice == 2:
        rec.variant = "invalid utf-8"
        tail = b'"turn_id": "' + rng.choice(_BAD_UTF8) + b'", "action": "cancel"}'
    elif choice == 3:
        name = rng.choice(["turn_id", "action", "ts_ms"])
        wrong: Any = {"turn_id": [turn], "action": "explode", "ts_ms": "soon"}[name]
        if name != "ts_ms":
            wrong = rng.choice([wrong, 7, True, {"x": 1}, 1.5])
        body = {"turn_id": turn, "action": "cancel", name: wrong}
        rec.variant = f"{name}={json.dumps(wrong)}"
        tail = json.dumps(body)[1:].encode()
    else:
        rec.variant, tail = "not JSON", b"cancel " + turn.encode() + b"}"
    rec.value, rec.key = head + tail, turn.encode()
    rec.headers = list(_JSON)


def _control_unknown_turn(ctx: Context, rng: random.Random, rec: HostileRecord) -> None:
    turn = uuid.uuid4().hex
    action = rng.choice(["cancel", "terminate"])
    body = {"turn_id": turn, "action": action, "reason": rec.marker, "ts_ms": int(time.time())}
    rec.variant, rec.turn_id = action, turn
    rec.value, rec.key, rec.headers = json.dumps(body).encode(), turn.encode(), list(_JSON)


_SIMPLE = {
    "deep_nesting": _deep_nesting,
    "huge_number": _huge_number,
    "invalid_utf8": _invalid_utf8,
    "wrong_type": _wrong_type,
}
_BUILDERS: dict[str, Callable[[Context, random.Random, HostileRecord], None]] = {
    "forged_lineage": _forged_lineage,
    "forged_child": _forged_child,
    "forged_reply": _forged_reply,
    "hostile_reply": _hostile_reply,
    "control_unreadable": _control_unreadable,
    "control_unknown_turn": _control_unknown_turn,
}


def _topic(ctx: Context, kind: str) -> str:
    if kind in REPLY_KINDS:
        return ctx.topics.replies
    if kind in CONTROL_KINDS or kind == "control_brackets":
        return ctx.topics.control
    return ctx.topics.turns


def generate(ctx: Context, rng: random.Random, index: int, kind: str) -> HostileRecord:
    """The ``index``-th hostile record, of ``kind``, drawn from ``rng``."""
    rec = HostileRecord(index, kind, "", _topic(ctx, kind), None, None, [])
    rec.marker = f"{MARK}{ctx.run_tag}-{index:06d}"
    if kind in _SIMPLE:
        rec.variant, rec.value, rec.headers = _SIMPLE[kind](ctx, rng)
        rec.key = rng.choice([None, b"", f"h{index}".encode(), uuid.uuid4().hex.encode()])
    elif kind in hostile_caps.BUILDERS:
        hostile_caps.BUILDERS[kind](ctx, rng, rec)
    else:
        _BUILDERS[kind](ctx, rng, rec)
    tags = [(KIND_HEADER, kind.encode()), (ID_HEADER, str(index).encode())]
    rec.headers = [*rec.headers, *tags]
    for follow in rec.follow:
        follow.headers = [*follow.headers, *tags]
    return rec


def kinds_for(count: int, rng: random.Random, kinds: Sequence[str] = KINDS) -> list[str]:
    """``count`` of ``kinds``, each at least once when ``count`` allows, in random order."""
    chosen = [kinds[i % len(kinds)] for i in range(count)]
    rng.shuffle(chosen)
    return chosen


def client_topics(ctx: Context) -> frozenset[str]:
    """What a record is sent as the client principal to on a secured run
    (``client_config``): the topics a client may write (turns, control, signals), and
    the records the broker must refuse it (``FollowUp.refusable``). A reply is sent with
    ``kafka_config`` (a super user there), standing in for a called agent's worker."""
    t = ctx.topics
    return frozenset((t.turns, t.control, t.signals))


class HostileSender(threading.Thread):
    """Sends ``count`` generated hostile records, evenly over ``window_s`` seconds, and
    each record's follow-ups (``HostileRecord.follow``) when they are due."""

    def __init__(
        self,
        bootstrap: str,
        ctx: Context,
        count: int,
        window_s: float,
        rng: random.Random,
        kinds: Sequence[str] = KINDS,
        *,
        kafka_config: Mapping[str, Any] | None = None,
        client_config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(name="chaos-hostile", daemon=True)
        self.ctx = ctx
        self.count = count
        self.window_s = window_s
        self.rng = rng
        self.kinds = kinds_for(count, rng, kinds)
        self.sent: list[HostileRecord] = []
        self.errors: list[str] = []
        # An oversize record is up to the broker's limit, past the client's default.
        limit = {"message.max.bytes": hostile_caps.WIRE_LIMIT}
        self._producer = new_producer(producer_config(bootstrap, kafka_config, extra=limit))
        self._client = self._refusable = self._producer
        self._client_topics = client_topics(ctx)
        if client_config is not None:
            self._client = new_producer(producer_config(bootstrap, client_config, extra=limit))
            # Records the broker must refuse get a producer of their own, so their
            # authorization errors touch no other record's sequence.
            self._refusable = new_producer(producer_config(bootstrap, client_config))
        self._halt = threading.Event()
        self._due: list[tuple[float, int, HostileRecord, FollowUp]] = []

    def run(self) -> None:
        start = time.monotonic()
        try:
            for i, kind in enumerate(self.kinds):
                at = start + self.window_s * (i + self.rng.uniform(0.1, 0.9)) / self.count
                if self._wait_until(at):
                    break
                rec = generate(self.ctx, self.rng, i, kind)
                self._send(rec)
                now = time.monotonic()
                for n, follow in enumerate(rec.follow):
                    heapq.heappush(self._due, (now + follow.delay_s, n, rec, follow))
            while self._due and not self._wait_until(self._due[0][0]):
                pass
        finally:
            for producer in {
                id(p): p for p in (self._producer, self._client, self._refusable)
            }.values():
                left = producer.flush(30)
                if left:
                    self.errors.append(f"{left} hostile records not acknowledged")

    def _wait_until(self, at: float) -> bool:
        """Send the follow-ups due before ``at``, then wait for it; True when halted."""
        while True:
            while self._due and self._due[0][0] <= time.monotonic():
                _, _, rec, follow = heapq.heappop(self._due)
                self._send_follow(rec, follow)
            due = min(at, self._due[0][0]) if self._due else at
            if self._halt.wait(max(0.0, due - time.monotonic())):
                return True
            if time.monotonic() >= at:
                return False

    def _produce(self, producer: Producer, what: str, topic: str, key: bytes | None,
                 value: bytes | None, headers: Headers, on_delivery: Callable[[Any, Any], None],
                 partition: int | None = None) -> None:  # fmt: skip
        kwargs: dict[str, Any] = {"partition": partition} if partition is not None else {}
        out: list[tuple[str, str | bytes | None]] = [*headers]
        try:
            producer.produce(
                topic, key=key, value=value, headers=out, on_delivery=on_delivery, **kwargs
            )
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None:  # refused at once (a topic known to be denied): report it so
                on_delivery(err, None)
            else:
                self.errors.append(f"{what}: {exc}")
        except BufferError as exc:
            self.errors.append(f"{what}: {exc}")
        producer.poll(0)

    def _send(self, rec: HostileRecord) -> None:
        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                self.errors.append(f"{rec.describe()}: {err}")
            else:
                rec.delivered = (msg.partition(), msg.offset())

        self.sent.append(rec)  # an unsent record counts as one without its outcome
        producer = self._client if rec.topic in self._client_topics else self._producer
        self._produce(
            producer, rec.describe(), rec.topic, rec.key, rec.value, rec.headers, delivered,
            rec.partition,
        )  # fmt: skip

    def _send_follow(self, rec: HostileRecord, follow: FollowUp) -> None:
        def delivered(err: Any, msg: Any) -> None:
            if err is not None and follow.refusable and is_authorization_failure(err):
                follow.refused = str(err)  # what the broker must do with it
            elif err is not None:
                self.errors.append(f"{rec.describe()} follow-up {follow.note[:40]}: {err}")
            else:
                follow.delivered = (msg.partition(), msg.offset())

        what = f"{rec.describe()} follow-up"
        producer = self._client if follow.topic in self._client_topics else self._producer
        if follow.refusable:
            producer = self._refusable
        self._produce(
            producer, what, follow.topic, follow.key, follow.value, follow.headers, delivered
        )

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(60)


__all__ = [
    "CAPS_KINDS",
    "CONTROL_KINDS",
    "DECODE_KINDS",
    "EXPECT",
    "ID_HEADER",
    "KINDS",
    "KIND_HEADER",
    "MARK",
    "REPLY_KINDS",
    "TURN_KINDS",
    "Context",
    "FollowUp",
    "HostileRecord",
    "HostileSender",
    "client_topics",
    "generate",
    "kinds_for",
]
