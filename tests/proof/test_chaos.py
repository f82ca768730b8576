"""A small chaos run against the real broker: worker processes SIGKILLed mid-run.

The full experiment is ``make chaos`` (``python -m pyrula_stream.chaos``); this is the same
harness with 20 turns, 2 workers and 2 kills (one right after a tool's side effect).
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest

from pyrula_stream.chaos import approvals, hostile, hostile_check, verify
from pyrula_stream.chaos.harness import GATE_KEYS, ChaosConfig, run_chaos
from pyrula_stream.chaos.model_server import answer_for
from pyrula_stream.errors import MalformedRecordError
from pyrula_stream.kafka.partitioner import partition_for
from pyrula_stream.wire import serde
from pyrula_stream.wire.events import Event
from pyrula_stream.wire.journal_keys import SIGNAL
from pyrula_stream.wire.lineage import Lineage
from pyrula_stream.wire.records import ControlRequest
from pyrula_stream.wire.serde import JournalEntry
from pyrula_stream.wire.subagents import CHILD_TURN_HEADER, parse_reply


@pytest.mark.slow
@pytest.mark.timeout(290)
def test_chaos_small_run_loses_and_repeats_nothing(
    kafka_bootstrap_servers: str, tmp_path: Path
) -> None:
    pytest.importorskip("openai")  # the workers' model client
    result = run_chaos(
        ChaosConfig(
            turns=20,
            workers=2,
            kills=2,
            seed=20240601,
            bootstrap_servers=kafka_bootstrap_servers,
            rate=4.0,
            timeout_s=120.0,
            run_dir=str(tmp_path / "chaos"),
        )
    )
    c = result.counts
    detail = {k: result.examples.get(k) for k in result.examples}
    assert c["turns"] == 20
    assert c["kills"] == 2, result.kills
    for key in (
        *GATE_KEYS,
        "seq_gaps",
        "journal_gaps",
        "duplicate_journal_steps",
        "repeated_tool_after_journal",
        "unstable_idempotency_keys",
        "missing_effects",
        "failed_turns",
        "wrong_results",
        "dead_letters",
        "worker_crashes",
    ):
        assert c[key] == 0, (key, detail.get(key), c)
    # Every turn made its two model calls; repeats can only come from crashes before commit.
    assert c["model_calls"] == 40 + c["repeated_llm_before_commit"]
    assert c["effects"] == 20
    assert all(code == 0 for code in c["worker_exit_codes"].values()), c["worker_exit_codes"]


@pytest.mark.slow
@pytest.mark.timeout(290)
def test_chaos_small_run_with_subagents_takes_every_reply_once(
    kafka_bootstrap_servers: str, tmp_path: Path
) -> None:
    pytest.importorskip("openai")
    result = run_chaos(
        ChaosConfig(
            turns=12,
            workers=2,
            kills=3,  # after an effect, right after a reply (every worker), random
            seed=20241130,
            bootstrap_servers=kafka_bootstrap_servers,
            rate=4.0,
            timeout_s=120.0,
            run_dir=str(tmp_path / "chaos"),
            subagents=True,
        )
    )
    c = result.counts
    for key in (*GATE_KEYS, *verify.SUBAGENT_KEYS, "failed_turns", "wrong_results"):
        assert c[key] == 0, (key, result.examples.get(key), c)
    assert c["child_turns"] == 24 and c["replies"] == 24
    # Every worker died between a child's terminal commit and the parent's pickup.
    assert c["kills_after_reply"] == c["workers"], result.kills
    assert result.ok


def _request_record(parent: str, call_key: str, child: str) -> verify.Record:
    request = serde.TurnRequest(child, "chaos-child", {"parent": parent})
    return verify.Record(
        0,
        0,
        child,
        serde.encode("turn_request", request),
        {
            serde.CONTENT_TYPE_HEADER: serde.content_type("turn_request"),
            **Lineage(parent, parent, "chaos", "pyrula", 0, call_key, 1).as_dict(),
        },
        0,
    )


def test_subagent_checks_count_doubled_children_and_lost_and_doubled_replies() -> None:
    f = verify.Findings()
    parent_events = [
        _event_record("p", 0, "subagent:result", 0, child="c1"),
        _event_record("p", 1, "subagent:result", 1, child="c1"),
        _event_record("p", 2, "run:complete", 2),
    ]
    requests = [
        _request_record("p", "agent:x#0", "c1"),
        _request_record("p", "agent:x#1", "c2"),
        _request_record("p", "agent:x#1", "c3"),
    ]
    child_events = [_event_record(c, 0, "run:complete", i) for i, c in enumerate(["c1", "c2"])]
    verify.check_subagents(["p"], parent_events, requests, child_events, [], f)
    assert f.counts["child_turns_doubled"] == 1  # call agent:x#1 ran c2 and c3
    assert f.counts["replies_lost"] == 2  # c2 ended but was never taken; c3 never ended
    assert f.counts["replies_doubled"] == 1  # c1 taken twice


# -- the checks themselves catch what they claim to (no broker needed) ---------------------


def _event_record(
    turn: str, seq: int, type_: str, offset: int, *, child: str | None = None
) -> verify.Record:
    data: dict[str, Any] = {"result": {"answer": answer_for(turn)}}
    if child is not None:
        data["child_turn_id"] = child
    event = Event(type_, turn, "chaos", seq, 0, 1, data)
    return verify.Record(
        0,
        offset,
        turn,
        serde.encode("event", event),
        {serde.CONTENT_TYPE_HEADER: serde.content_type("event")},
        0,
    )


def _journal_record(
    turn: str, step: int, kind: str, data: dict[str, Any], ts_ms: int, offset: int, name: str = ""
) -> verify.Record:
    entry = JournalEntry(turn, step, kind, name or kind, "", data, 1, ts_ms)
    return verify.Record(
        0,
        offset,
        f"{turn}/{step}",
        serde.encode("journal_entry", entry),
        {serde.CONTENT_TYPE_HEADER: serde.content_type("journal_entry")},
        ts_ms,
    )


def test_event_checks_count_lost_doubled_and_repeated() -> None:
    ok, doubled, lost = "a" * 32, "b" * 32, "c" * 32
    records = [
        _event_record(ok, 0, "run:start", 0),
        _event_record(ok, 1, "run:complete", 1),
        _event_record(doubled, 0, "run:start", 2),
        _event_record(doubled, 0, "run:start", 3),
        _event_record(doubled, 1, "run:complete", 4),
        _event_record(doubled, 2, "run:error", 5),
        _event_record(lost, 0, "run:start", 6),
        _event_record(lost, 2, "llm:complete", 7),
    ]
    f = verify.Findings()
    verify.check_events([ok, doubled, lost], records, f)
    assert f.counts["lost"] == 1
    assert f.counts["duplicate_terminal"] == 1
    assert f.counts["duplicate_events"] == 1
    assert f.counts["seq_gaps"] == 1
    assert f.counts["events_after_terminal"] == 1


def test_model_call_and_effect_checks_split_repeats_at_the_journal_commit(
    tmp_path: Path,
) -> None:
    turn = "d" * 32
    key = f"{turn}:0.0:record_effect"
    journal = [
        _journal_record(turn, 1, "llm", {"call": 0}, 1_000_000, 0),
        _journal_record(turn, 2, "tool", {"call_key": "0.0"}, 1_000_100, 1, "record_effect"),
        _journal_record(turn, 4, "llm", {"call": 1}, 1_000_200, 2),
    ]
    calls = [
        {"turn": turn, "call": 0, "ts": 999.0},  # first try, crashed before the commit
        {"turn": turn, "call": 0, "ts": 999.9},  # the one journaled
        {"turn": turn, "call": 1, "ts": 1000.15},
        {"turn": turn, "call": 1, "ts": 1001.0},  # asked again after the journal: a bug
    ]
    effects = tmp_path / "effects.jsonl"
    effects.write_text(
        "".join(
            json.dumps({"key": key, "turn": turn, "applied": applied, "ts": ts}) + "\n"
            for applied, ts in ((True, 1000.05), (True, 1000.06), (False, 1000.5))
        )
    )
    f = verify.Findings()
    view = verify.check_journal([turn], journal, f)
    verify.check_model_calls([turn], calls, view, f)
    verify.check_effects([turn], str(effects), view, f)
    assert f.counts["journal_gaps"] == 1  # steps 1, 2, 4: no 0 and no 3
    assert f.counts["repeated_llm_before_commit"] == 1
    assert f.counts["repeated_llm_after_journal"] == 1
    assert f.counts["duplicate_effects"] == 1
    assert f.counts["repeated_tool_after_journal"] == 1
    assert f.counts["repeated_tool_before_commit"] == 1


def _thread_record(thread: str, n: int, turn: str, offset: int) -> verify.Record:
    turn_json = {"n": n, "turn_id": turn, "messages": [], "outcome": {}, "ts_ms": 0}
    return verify.Record(0, offset, f"{thread}/{n}", json.dumps(turn_json).encode(), {}, 0)


def test_thread_checks_count_missing_doubled_and_out_of_order() -> None:
    a, b, c, d = ("a" * 32, "b" * 32, "c" * 32, "d" * 32)
    events = [_event_record(t, 0, "run:complete", i) for i, t in enumerate((a, b, c, d))]
    threads = {"t1": [a, b], "t2": [c, d]}
    records = [
        _thread_record("t1", 1, a, 0),
        _thread_record("t1", 2, a, 1),  # a doubled, b missing
        _thread_record("t2", 1, d, 2),
        _thread_record("t2", 2, c, 3),  # out of submission order
    ]
    f = verify.Findings()
    verify.check_threads(threads, events, records, f)
    assert f.counts["thread_turns_doubled"] == 1
    assert f.counts["thread_turns_missing"] == 1
    assert f.counts["thread_turns_out_of_order"] == 1
    clean = verify.Findings()
    good = [_thread_record("t1", 1, a, 0), _thread_record("t1", 2, b, 1)]
    verify.check_threads({"t1": [a, b]}, events, good, clean)
    assert clean.counts["thread_turns_missing"] == clean.counts["thread_turns_doubled"] == 0


# -- --hostile ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_chaos_small_hostile_run_dead_letters_every_hostile_record(
    kafka_bootstrap_servers: str, tmp_path: Path
) -> None:
    """Issue 28's proof, small: every kind of hostile record among valid turns and a kill."""
    pytest.importorskip("openai")
    result = run_chaos(
        ChaosConfig(
            turns=10,
            workers=2,
            kills=1,
            seed=20261201,
            bootstrap_servers=kafka_bootstrap_servers,
            rate=8.0,
            timeout_s=90.0,
            run_dir=str(tmp_path / "chaos"),
            hostile=len(hostile.DECODE_KINDS) * 2,
            hostile_kinds=hostile.DECODE_KINDS,
        )
    )
    c = result.counts
    assert c["hostile_records"] == 20 and set(c["hostile_kinds"]) == set(hostile.DECODE_KINDS)
    extra = ("hostile_headers_lost", "control_skips_uncounted", "failed_turns")
    for key in (*GATE_KEYS, *hostile_check.HOSTILE_KEYS, *extra):
        assert c[key] == 0, (key, result.examples.get(key), c)
    assert c["hostile_dead_letters"] >= 16  # the 4 control records are not dead-lettered
    assert all(n >= 2 for n in c["control_skips_counted"].values()), c["control_skips_counted"]
    assert result.ok


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_chaos_secured_forged_answers_meet_the_acls_and_the_worker(tmp_path: Path) -> None:
    """Issue 46's forged answers from a client principal on a secured broker: each run's
    own SASL broker with the generated ACLs; the answers on ``.answers`` and the reply on
    ``.replies`` are refused by the broker, those on ``.signals`` by the worker."""
    pytest.importorskip("openai")
    result = run_chaos(
        ChaosConfig(
            turns=8,
            workers=1,
            kills=0,
            seed=4601,
            rate=8.0,
            timeout_s=60.0,
            run_dir=str(tmp_path / "chaos"),
            hostile=2,
            hostile_kinds=("forged_answer",),
            hostile_settle_s=40.0,
            secured=True,
        )
    )
    c = result.counts
    assert c["secured"] is True
    for key in (*GATE_KEYS, *hostile_check.HOSTILE_KEYS, "failed_turns"):
        assert c[key] == 0, (key, result.examples.get(key), c)
    assert (c["forged_answers_refused"], c["forged_replies_refused"]) == (4, 2), c
    assert c["forged_refusals"] == {"authorization": 6, "signal_refused/wrong_topic": 4}, c
    assert result.ok


def _decoded_outcome(ctx: hostile.Context, rec: hostile.HostileRecord) -> str:
    """What the worker's own decoders make of a generated record (no broker)."""
    headers = serde.headers_dict(rec.headers)
    if rec.topic == ctx.topics.control:
        return "ignored" if ControlRequest.parse(rec.value) is not None else "skipped"
    try:
        if rec.topic == ctx.topics.replies:
            parse_reply(rec.value)
            return "dlq"  # readable, but for no call the parent made: refused
        request = serde.decode_turn_request(
            rec.value, headers, default_turn_id="t", default_agent=ctx.agent
        )
    except MalformedRecordError:
        return "dlq"
    if request.agent != ctx.agent or request.lineage is None:
        return "dlq" if request.agent != ctx.agent else "runs"
    placed = rec.partition if rec.partition is not None else partition_for(rec.key, 6)
    misplaced = rec.key != request.turn_id.encode() or request.thread_id is not None
    return "dlq" if misplaced or placed != partition_for(rec.key, 6) else "reply_dlq"


def test_generated_hostile_records_meet_the_outcome_they_are_checked_for() -> None:
    """The generator's promises hold for the decoders a worker runs: a record meant for the
    DLQ is unreadable (or misplaced), a forged child is readable and well placed, an
    unreadable control record is unreadable and shows its marker where the log cuts."""
    ctx = hostile.Context("chaosx", 6, "tag", parents=lambda: ["a" * 32, "b" * 32])
    rng = random.Random(7)
    wrong: list[str] = []
    for i, kind in enumerate(hostile.kinds_for(300, rng, hostile.DECODE_KINDS)):
        rec = hostile.generate(ctx, rng, i, kind)
        if _decoded_outcome(ctx, rec) != rec.expect:
            wrong.append(rec.describe())
        if rec.expect == "skipped" and rec.marker not in repr(rec.value)[:200]:
            wrong.append(f"{rec.describe()}: marker past the log's 200 characters")
        assert (hostile.KIND_HEADER, kind.encode()) in rec.headers
    assert not wrong, wrong[:5]


def _dlq_letter(source: str, kind: str, offset: int) -> verify.Record:
    headers = {
        "pyrula.dlq.source": source,
        "pyrula.dlq.reason": "unreadable",
        "pyrula.dlq.code": "invalid_request",
        f"pyrula.original.{hostile.KIND_HEADER}": kind,
    }
    return verify.Record(0, offset, "k", b"v", headers, 0)


def test_hostile_checks_count_missing_letters_and_taken_forged_replies(tmp_path: Path) -> None:
    ctx = hostile.Context("chaosx", 6, "tag", parents=lambda: ["p" * 32])
    rng = random.Random(3)
    deep, lost, reply, control = (
        hostile.generate(ctx, rng, i, kind)
        for i, kind in enumerate(
            ["deep_nesting", "huge_number", "forged_reply", "control_unreadable"]
        )
    )
    for n, rec in enumerate((deep, lost, reply, control)):
        rec.delivered = (0, n)
    child = dict(reply.headers)[CHILD_TURN_HEADER].decode()
    taken = _event_record("p" * 32, 0, "subagent:result", 0, child=child)
    log = tmp_path / "worker-1.log"
    log.write_text(f"W {hostile_check.SKIPPED_LINE}: {control.value!r}\n")
    f = verify.Findings()
    dlq = [_dlq_letter(deep.source, "deep_nesting", 0), _dlq_letter(deep.source, "x", 1)]
    hostile_check.check_hostile([deep, lost, reply, control], dlq, [taken], [], [log], f)
    assert f.counts["hostile_not_in_dlq"] == 2  # the huge number and the reply: no letter
    assert f.counts["forged_replies_taken"] == 1
    assert f.counts["hostile_dlq_doubled"] == 1
    assert f.counts["hostile_headers_lost"] == 0  # the first letter carries the tag


def test_on_a_secured_run_a_forged_child_is_dead_lettered_by_its_own_worker() -> None:
    """With ``--secured`` the broker refuses a forged child's reply (the chaos worker may
    not write the replies topic it names): its own worker's ``record_undeliverable``
    letter is its outcome, and a parent's ``unsolicited_reply`` letter is not."""
    rng = random.Random(5)
    plain = hostile.generate(hostile.Context("chaosx", 6, "tag"), rng, 0, "forged_child")
    secured = hostile.Context("chaosx", 6, "tag", secured=True)
    rec = hostile.generate(secured, rng, 1, "forged_child")
    assert (plain.expect, rec.expect) == ("reply_dlq", "undeliverable_dlq")
    rec.delivered = (0, 0)

    def letter(code: str) -> verify.Record:
        headers = {
            "pyrula.dlq.source": f"{secured.topics.replies}/0",
            "pyrula.dlq.reason": "TOPIC_AUTHORIZATION_FAILED",
            "pyrula.dlq.code": code,
            f"pyrula.original.{CHILD_TURN_HEADER}": str(rec.turn_id),
        }
        return verify.Record(0, 0, "k", None, headers, 0)

    for code, missing in (("unsolicited_reply", 1), ("record_undeliverable", 0)):
        f = verify.Findings()
        hostile_check.check_hostile([rec], [letter(code)], [], [], [], f)
        assert f.counts["hostile_not_in_dlq"] == missing, code
        assert f.counts["hostile_dead_letters"] == 1 - missing, code


@pytest.mark.slow
@pytest.mark.timeout(290)
def test_chaos_small_run_with_approvals_runs_only_what_was_approved(
    kafka_bootstrap_servers: str, tmp_path: Path
) -> None:
    pytest.importorskip("openai")
    result = run_chaos(
        ChaosConfig(
            turns=12,
            workers=2,
            kills=2,
            seed=20261202,
            bootstrap_servers=kafka_bootstrap_servers,
            rate=4.0,
            timeout_s=120.0,
            run_dir=str(tmp_path / "chaos"),
            approvals=True,
        )
    )
    c = result.counts
    for key in (*GATE_KEYS, *approvals.APPROVAL_KEYS, "failed_turns", "wrong_results"):
        assert c[key] == 0, (key, result.examples.get(key), c)
    assert c["approvals_answered"] == 12 and c["questions_unanswered"] == 0
    assert result.ok


def _gated_result(turn: str, seq: int, verdict: str, offset: int) -> verify.Record:
    data = {"tool": "gated_effect", "status": "ok", "approval": verdict, "approval_key": "k"}
    event = Event("tool:result", turn, "chaos", seq, 0, 1, data)
    return verify.Record(
        0,
        offset,
        turn,
        serde.encode("event", event),
        {serde.CONTENT_TYPE_HEADER: serde.content_type("event")},
        0,
    )


def _answer_record(turn: str, signal_id: str, offset: int) -> verify.Record:
    entry = JournalEntry(turn, -1, "signal", "k", data={"name": "k", "answer": True})
    return verify.Record(
        0,
        offset,
        f"{turn}/{SIGNAL}{signal_id}",
        serde.encode("journal_entry", entry),
        {serde.CONTENT_TYPE_HEADER: serde.content_type("journal_entry")},
        0,
    )


def test_approval_checks_count_unrun_approvals_run_rejections_and_lost_or_doubled_answers(
    tmp_path: Path,
) -> None:
    from pyrula_stream.chaos.effects import apply_effect_once

    effects = str(tmp_path / "gated.jsonl")
    ok, not_run, ran, lost, doubled = "ok", "not-run", "ran", "lost", "doubled"
    for turn in (ok, ran, doubled):
        apply_effect_once(effects, f"{turn}:key", turn)
    events = [
        _gated_result(ok, 3, "approved", 0),
        _gated_result(not_run, 3, "approved", 1),
        _gated_result(ran, 3, "rejected", 2),
        _gated_result(doubled, 3, "approved", 3),
        _gated_result(doubled, 4, "approved", 4),  # published twice
    ]
    journal = [_answer_record(doubled, "s1", 0), _answer_record(doubled, "s2", 1)]
    answers = [
        {"turn": ok, "answer": "approve", "accepted": True},
        {"turn": not_run, "answer": "approve", "accepted": True},
        {"turn": ran, "answer": "reject", "accepted": True},
        {"turn": lost, "answer": "reject", "accepted": True},  # no result reflects it
        {"turn": doubled, "answer": "approve", "accepted": True},
    ]
    f = verify.Findings()
    ids = [ok, not_run, ran, lost, doubled]
    approvals.check_approvals(ids, events, journal, answers, effects, [], f)
    assert f.counts["approved_not_run"] == 1, f.examples
    assert f.counts["rejected_ran"] == 1, f.examples
    assert f.counts["answers_lost"] == 1, f.examples
    assert f.counts["answers_doubled"] == 2, f.examples  # two answers journaled, two results
    assert f.counts["questions_unanswered"] == 0


def _tool_start(turn: str, seq: int, ts_ms: int, offset: int) -> verify.Record:
    data = {"call_key": "c", "tool": "gated_effect", "tool_use_id": None, "input": {}}
    event = Event("tool:start", turn, "chaos", seq, 0, 1, data)
    return verify.Record(
        0,
        offset,
        turn,
        serde.encode("event", event),
        {serde.CONTENT_TYPE_HEADER: serde.content_type("event")},
        ts_ms,
    )


def test_answer_kills_count_only_the_kills_before_the_gated_call_went_on(
    tmp_path: Path,
) -> None:
    from pyrula_stream.chaos.answer_kills import AnswerKill, check_answer_kills

    effects = str(tmp_path / "gated.jsonl")
    (tmp_path / "gated.jsonl").write_text(
        json.dumps({"key": "k", "turn": "ran-first", "applied": True, "ts": 1.0}) + "\n"
    )
    rejected = _gated_result("denied", 4, "rejected", 3)
    events = [
        _tool_start("early", 3, 5_000, 0),  # started after the kill at 4 s
        _tool_start("late", 3, 3_000, 1),  # started before the kill
        _tool_start("ran-first", 3, 9_000, 2),  # its effect (1 s) came before the kill
        dataclasses.replace(rejected, ts_ms=8_000),  # denied after the kill
    ]
    kills = [
        AnswerKill(turn, "chaos-1", owner=turn != "denied", wall_ts=4.0)
        for turn in ("early", "late", "ran-first", "denied", "never-went-on")
    ]
    f = verify.Findings()
    check_answer_kills(kills, events, effects, f)
    assert f.counts["answer_kills"] == 5
    assert f.counts["answer_kills_owner"] == 4
    assert f.counts["kills_after_answer"] == 2  # early and denied
