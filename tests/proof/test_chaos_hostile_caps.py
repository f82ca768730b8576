"""Issue 46's hostile kinds for ``make chaos ARGS=--hostile``: the generated records are
what they claim, and the checks count what they claim (no broker needed).

The run itself is ``python -m pyrula_stream.chaos --hostile`` (docs/hostile-input.md); its
small test in ``test_chaos.py`` keeps to issue 28's kinds.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from pyrula_stream.chaos import hostile, hostile_caps, hostile_caps_check, verify
from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.wire import guard, serde
from pyrula_stream.wire.events import Event
from pyrula_stream.wire.journal_keys import REPLY, signal_key
from pyrula_stream.wire.records import ControlRequest
from pyrula_stream.wire.signals import parse_signal

CTX = hostile.Context("chaosx", 6, "tag", parents=lambda: ["p" * 32])


def _records(kind: str, count: int = 40, seed: int = 46) -> list[hostile.HostileRecord]:
    rng = random.Random(seed)
    return [hostile.generate(CTX, rng, i, kind) for i in range(count)]


def _request(value: bytes | None, headers: hostile.Headers) -> serde.TurnRequest:
    return serde.decode_turn_request(
        value, serde.headers_dict(headers), default_turn_id="t", default_agent=CTX.agent
    )


def _wire_bytes(rec: hostile.HostileRecord, prefix: str = "") -> int:
    """Value and headers as a record batch carries them (4 bytes of framing a header)."""
    headers = sum(len(prefix) + len(k) + len(v) + 4 for k, v in rec.headers)
    return len(rec.value or b"") + headers + 100


def test_generated_caps_records_are_what_they_claim() -> None:
    for kind in hostile.CAPS_KINDS:
        for rec in _records(kind):
            tag = (hostile.KIND_HEADER, kind.encode())
            assert tag in rec.headers and all(tag in f.headers for f in rec.follow)
            if rec.follow and rec.kind != "invented_tenant":  # a turn that parks on a question
                assert _request(rec.value, rec.headers).params == {"n": 0, "ask": True}
    for rec in _records("oversize_record"):
        # Under the broker's limit as sent; its dead letter, every header copied, is over
        # the producers' 1 MiB.
        assert _wire_bytes(rec) < hostile_caps.WIRE_LIMIT, rec.describe()
        assert _wire_bytes(rec, "pyrula.original.") > 1_048_576, rec.describe()
        assert len(rec.headers) >= 250
    long = b"L" * hostile_caps.LONG_ID
    for rec in _records("long_id"):
        # In the value as one field (a decoder with caps refuses it: not decoded here).
        ids = [len(f.note) for f in rec.follow] + [len(v) for _, v in rec.headers]
        assert max(ids) >= hostile_caps.LONG_ID or long in (rec.value or b""), rec.describe()
    for rec in _records("signal_flood"):
        signals = [parse_signal(f.value, 0) for f in rec.follow]
        assert {s.turn_id for s in signals} == {rec.turn_id}
        assert len({s.signal_id for s in signals}) == len(signals)
        payload = sum(len(f.value or b"") for f in rec.follow)
        too_many = len(signals) > hostile_caps.FLOOD_HELD_MAX
        assert too_many or payload > hostile_caps.FLOOD_HELD_BYTES, rec.describe()
    for rec in _records("forged_answer"):
        answers = [parse_signal(f.value, 0) for f in rec.follow]
        assert all(a.answer and a.name == hostile_caps.ASKED for a in answers)
        assert all(a.payload["answer"] == "approve" for a in answers)
        assert {a.sender for a in answers} == {hostile_caps.FORGER}
    for rec in _records("invented_tenant"):
        values = [(rec.value, rec.headers)] + [(f.value, f.headers) for f in rec.follow]
        tenants = [_request(v, h).metadata["tenant"] for v, h in values]
        assert tenants == rec.tenants and len(set(tenants)) == hostile_caps.INVENTED_BURST


def _control_outcome(value: bytes | None) -> str:
    try:
        return "ignored" if ControlRequest.parse(value) is not None else "skipped"
    except MalformedRecordError:
        return "skipped"


def test_bracket_control_records_hold_every_bracket_in_a_string() -> None:
    for rec in _records("control_brackets"):
        assert rec.value is not None and rec.marker in repr(rec.value)[:200]
        assert guard.loads(rec.value.replace(b"[", b"x"), "control") is not None
        assert rec.value.count(b"[") >= hostile_caps.BRACKETS


def test_bracket_control_records_are_skipped_not_a_crash() -> None:
    outcomes = {_control_outcome(rec.value) for rec in _records("control_brackets")}
    assert outcomes == {"skipped"}


def _rec(key: str, value: bytes | None, headers: dict[str, str] | None = None) -> verify.Record:
    return verify.Record(0, 0, key, value, headers or {}, 0)


def _usage(tenant: str, minute: int, turns: int, turn: str) -> verify.Record:
    body: dict[str, Any] = {"tenant": tenant, "ts_ms": minute * 60_000 + 5, "turns": turns}
    return _rec(f"{tenant}/{minute}/{turn}/turn", json.dumps(body).encode())


def _terminal(turn: str) -> verify.Record:
    event = Event("run:complete", turn, "chaosx", 0, 0, 1, {"result": {}})
    value = serde.encode("event", event)
    return _rec(turn, value, {serde.CONTENT_TYPE_HEADER: serde.content_type("event")})


def test_caps_checks_count_held_floods_taken_answers_overshoot_and_stuck_turns(
    tmp_path: Path,
) -> None:
    (flood,) = _records("signal_flood", 1, seed=1)
    (answer,) = _records("forged_answer", 1)
    (burst,) = _records("invented_tenant", 1)
    long_tenant = next(r for r in _records("long_id") if r.expect == "tenant_cut")
    for n, follow in enumerate(flood.follow + answer.follow):
        follow.delivered = (0, n)
    # The flood: every signal held but the first, which no one dead-lettered either.
    journal = [_rec(signal_key(flood.turn_id or "", f.note), b"{}") for f in flood.follow[1:]]
    # The forged answer: its first copy journaled under its turn (taken).
    journal.append(_rec(signal_key(answer.turn_id or "", answer.follow[0].note), b"{}"))
    dlq = [_rec("k", b"", {"pyrula.dlq.source": answer.follow[1].source()})]
    turns = [burst.turn_id or "", *(f.note for f in burst.follow)]
    usage = [_usage(t, 7, 1, turn) for t, turn in zip(burst.tenants, turns, strict=True)]
    usage.append(usage[0])  # read twice: counts once
    usage += [_usage(t, 8, 1, turn) for t, turn in zip(burst.tenants[:2], turns[:2], strict=True)]
    usage += [_usage("default", 7, 1, "v"), _usage("t0", 7, 9, "w")]  # known tenants' turns
    # An invented tenant's turn put in the default tenant's bucket still counts.
    usage += [_usage("default", 9, 1, turn) for turn in turns]
    # A long tenant id used whole in a usage record (not cut): one more without outcome.
    usage.append(_usage("L" * 70_000, 9, 0, long_tenant.turn_id or ""))
    usage.append(_usage("L" * 200, 9, 0, long_tenant.turn_id or ""))  # cut: its outcome
    f = verify.Findings()
    hostile_caps_check.check_caps(
        [flood, answer, burst, long_tenant],
        ["done", "stuck"],
        dlq,
        [_terminal("done")],
        journal,
        usage,
        str(tmp_path / "gated.jsonl"),
        2,
        f,
    )
    held = len(flood.follow) - 1
    over = held - hostile_caps.FLOOD_HELD_MAX if held > hostile_caps.FLOOD_HELD_MAX else 1
    # The lost signal, those past the cap, the usage record of the tenant not cut.
    assert f.counts["hostile_not_in_dlq"] == 1 + over + 1
    assert f.counts["forged_answers_taken"] == 1
    assert f.counts["forged_answers_sent"] == 2
    # Six unknown tenants' turns in minute 7 > 2 + bound 2, and six of their turns in
    # the default bucket in minute 9; two in minute 8 are within.
    assert f.counts["invented_tenant_overshoot"] == 2
    assert f.counts["unknown_tenant_turns_per_minute"] == {7: 6, 8: 2, 9: 6}
    assert f.counts["valid_turns_stuck"] == 1


SECURED = hostile.Context("chaosx", 6, "tag", parents=lambda: ["p" * 32], secured=True)


def test_secured_forged_answers_also_try_what_a_client_may_not_write() -> None:
    """On ``--secured`` a forged answer also goes to ``.answers`` and comes with a made-up
    sub-agent reply on ``.replies``: both for the broker to refuse; on a plaintext run
    they are not sent (nothing would refuse them)."""
    (plain,) = _records("forged_answer", 1)
    assert {f.topic for f in plain.follow} == {CTX.topics.signals}
    assert not any(f.refusable or f.reply for f in plain.follow)
    (rec,) = [hostile.generate(SECURED, random.Random(46), 0, "forged_answer")]
    topics = [f.topic for f in rec.follow]
    t = SECURED.topics
    assert sorted(topics) == sorted([t.signals, t.signals, t.answers, t.answers, t.replies])
    assert all(f.refusable == (f.topic != t.signals) for f in rec.follow)
    (reply,) = [f for f in rec.follow if f.reply]
    body = json.loads(reply.value or b"")
    assert body["parent_turn_id"] == rec.turn_id and body["child_turn_id"] == reply.note
    assert body["result"] == {"forged": hostile_caps.reply_marker(rec.marker)}


def _secured_answer() -> hostile.HostileRecord:
    rec = hostile.generate(SECURED, random.Random(46), 0, "forged_answer")
    rec.delivered = (0, 99)
    return rec


def _check(rec: hostile.HostileRecord, journal: list[verify.Record], dlq: list[verify.Record],
           tmp_path: Path) -> verify.Findings:  # fmt: skip
    f = verify.Findings()
    hostile_caps_check.check_caps(
        [rec], [], dlq, [], journal, [], str(tmp_path / "gated.jsonl"), 1, f
    )
    return f


def test_secured_checks_count_refusals_and_what_got_through(tmp_path: Path) -> None:
    # Refused everywhere: the broker refused what went to .answers and .replies, the
    # worker dead-lettered the answers on .signals (wrong_topic). Nothing taken.
    rec = _secured_answer()
    dlq = []
    for n, follow in enumerate(rec.follow):
        if follow.refusable:
            follow.refused = "TOPIC_AUTHORIZATION_FAILED"
        else:
            follow.delivered = (0, n)
            reason = "signal refused: wrong_topic: an answer is taken only from answers"
            dlq.append(_rec("k", b"", {"pyrula.dlq.source": follow.source(),
                                        "pyrula.dlq.code": "signal_refused",
                                        "pyrula.dlq.reason": reason}))  # fmt: skip
    f = _check(rec, [], dlq, tmp_path)
    assert f.counts["forged_answers_taken"] == f.counts["forged_replies_taken"] == 0
    assert (f.counts["forged_answers_refused"], f.counts["forged_replies_refused"]) == (2, 1)
    assert f.counts["forged_refusals"] == {"authorization": 3, "signal_refused/wrong_topic": 2}
    # Let through by the broker: the answer on .answers journaled under its turn and the
    # forged reply journaled as the turn's child's: each is counted as taken.
    rec = _secured_answer()
    for n, follow in enumerate(rec.follow):
        follow.delivered = (0, n)
    on_answers = next(f for f in rec.follow if f.topic == SECURED.topics.answers)
    reply = next(f for f in rec.follow if f.reply)
    turn = rec.turn_id or ""
    journal = [
        _rec(signal_key(turn, on_answers.note), b"{}"),
        _rec(f"{turn}/{REPLY}{reply.note}", b"{}"),
    ]
    f = _check(rec, journal, [], tmp_path)
    assert f.counts["forged_answers_taken"] == 1
    assert f.counts["forged_replies_taken"] == 1
    assert (f.counts["forged_answers_sent"], f.counts["forged_replies_sent"]) == (4, 1)
