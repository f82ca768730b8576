"""The UI's turn model: events fold into a timeline; memory stays bounded."""

from __future__ import annotations

import json
from typing import Any

from pyrula_stream.kafka.io import TopicRecord
from pyrula_stream.ui.feed import EventFeed, FeedOptions
from pyrula_stream.ui.model import TurnView, UIState
from pyrula_stream.wire.events import Event


def ev(seq: int, type_: str, attempt: int = 1, turn: str = "t1", **data: Any) -> Event:
    return Event(type_, turn, "support", seq, 1_000 + 10 * seq, attempt, data)


def test_a_resumed_turn_marks_the_new_attempt_and_the_replayed_steps() -> None:
    turn = TurnView("t1", "support")
    events = [
        ev(0, "run:start", params={"q": "x"}, worker="w1"),
        ev(1, "llm:delta", call=0, text="Let me "),
        ev(2, "llm:delta", call=0, text="check."),
        ev(3, "llm:complete", call=0, text="Let me check.", tool_calls=[{"name": "t"}]),
        ev(4, "tool:start", call_key="0.0", tool="lookup", input={"id": 1}),
        # The worker died here; attempt 2 replays model call 0 and reruns the tool.
        ev(5, "tool:start", attempt=2, call_key="0.0", tool="lookup", input={"id": 1}),
        ev(6, "tool:result", attempt=2, call_key="0.0", tool="lookup", status="ok", output="{}"),
        ev(7, "llm:delta", attempt=2, call=1, text="Done"),
        ev(8, "run:error", attempt=2, code="budget_exceeded", message="max_llm_calls"),
    ]
    for event in events:
        assert turn.apply(event)
    assert not turn.apply(events[3])  # a repeated seq (at-least-once) is dropped
    kinds = [(s["kind"], s.get("state"), s.get("replayed", False)) for s in turn.steps]
    assert kinds == [
        ("model", "done", True),
        ("tool", "interrupted", False),
        ("attempt", None, False),
        ("tool", "done", False),
        ("model", "interrupted", False),
    ]
    assert turn.steps[0]["text"] == "Let me check."
    assert turn.steps[0]["started_ms"] == 1_000  # after run:start, before its first delta
    assert (turn.status, turn.attempt, turn.tool_calls) == ("failed", 2, 1)
    assert turn.summary()["error_code"] == "budget_exceeded"


def test_state_keeps_the_newest_finished_turns_and_every_running_one() -> None:
    state = UIState(max_turns=2)
    state.apply(ev(0, "run:start", turn="running"))
    for n in range(4):
        state.apply(ev(0, "run:start", turn=f"done{n}"))
        state.apply(ev(1, "run:complete", turn=f"done{n}", result="ok"))
    kept = [t.turn_id for t in state.all_turns()]
    assert kept == ["running", "done3"]
    later = ev(3, "run:complete", turn="old")
    assert state.apply(later) is not None
    assert state.find("support", "old") is not None
    assert state.find("support", "old").partial  # type: ignore[union-attr]


def test_dead_letter_keeps_reason_source_and_original_headers() -> None:
    state = UIState()
    letter = state.add_dead_letter(
        "support",
        0,
        5,
        1_000,
        b"k1",
        b"\x00\x01garbage",
        {
            "pyrula.dlq.reason": "value does not decode",
            "pyrula.dlq.code": "invalid_request",
            "pyrula.dlq.source": "pyrula.support.turns[0]@7",
            "pyrula.original.content-type": "application/json",
        },
    )
    assert (letter.reason, letter.code, letter.source) == (
        "value does not decode",
        "invalid_request",
        "pyrula.support.turns[0]@7",
    )
    assert letter.original_headers == {"content-type": "application/json"}
    assert letter.value_preview == "\\x00\\x01garbage"


def test_sub_agent_calls_link_the_child_and_a_parked_parent_resumes_without_a_crash() -> None:
    """A parent parks while each child runs; every reply resumes it as a new attempt (a
    third attempt used to raise on the previous attempt's marker)."""
    turn = TurnView("p1", "triage")
    events = [
        ev(0, "run:start", worker="w1"),
        ev(
            1,
            "subagent:start",
            call_key="0",
            agent="refunds",
            child_turn_id="c1",
            depth=1,
            input={"cents": 500},
        ),
        ev(
            2,
            "subagent:result",
            attempt=2,
            agent="refunds",
            child_turn_id="c1",
            status="completed",
            result={"refunded": 500},
            usage={},
        ),
        ev(
            3,
            "subagent:start",
            attempt=2,
            call_key="1",
            agent="refunds",
            child_turn_id="c2",
            depth=1,
            input={"cents": 20_000},
        ),
        ev(
            4,
            "subagent:result",
            attempt=3,
            agent="refunds",
            child_turn_id="c2",
            status="failed",
            result=None,
            error_code="agent_error",
            usage={},
        ),
        ev(5, "run:complete", attempt=3, result="escalated"),
    ]
    for event in events:
        assert turn.apply(event)
    steps = [
        (s["kind"], s.get("child_turn_id"), s.get("state"), s.get("replayed", False))
        for s in turn.steps
    ]
    assert steps == [
        ("subagent", "c1", "done", True),
        ("attempt", None, None, False),
        ("subagent", "c2", "done", True),
        ("attempt", None, None, False),
    ]
    assert [s.get("cause") for s in turn.steps if s["kind"] == "attempt"] == ["reply"] * 2
    first, second = turn.steps[0], turn.steps[2]
    assert (first["child_agent"], first["status"], first["result"]) == (
        "refunds",
        "completed",
        '{"refunded": 500}',
    )
    assert (second["status"], second["error_code"]) == ("failed", "agent_error")
    assert (turn.status, turn.attempt) == ("completed", 3)


def test_a_restart_is_told_apart_from_a_reply_and_a_child_names_its_parent() -> None:
    turn = TurnView("c1", "refunds")
    turn.apply(ev(0, "run:start", parent={"agent": "triage", "turn_id": "p1"}))
    turn.apply(ev(1, "tool:start", call_key="0.0", tool="refund", input={}))
    turn.apply(ev(2, "tool:start", attempt=2, call_key="0.0", tool="refund", input={}))
    assert turn.detail()["parent"] == {"agent": "triage", "turn_id": "p1"}
    assert [s.get("cause") for s in turn.steps if s["kind"] == "attempt"] == ["restart"]
    assert turn.steps[0]["state"] == "interrupted"


def event_record(offset: int, turn: str, type_: str, data: Any) -> TopicRecord:
    """An events-topic record as another producer might write it (JSON framing)."""
    value = json.dumps(
        {"type": type_, "turn_id": turn, "agent": "support", "seq": 0, "ts_ms": 1_000,
         "attempt": 1, "data": data}
    )  # fmt: skip
    headers = {"content-type": "application/json"}
    return TopicRecord(
        "pyrula.support.events", 0, offset, turn.encode(), value.encode(), headers, 1
    )


def test_an_event_the_timeline_cannot_fold_is_counted_and_the_rest_still_shows() -> None:
    state = UIState()
    feed = EventFeed(FeedOptions("localhost:9", agents=("support",)), state)
    feed._topic_agent["pyrula.support.events"] = ("support", "events")
    records = [
        event_record(0, "odd", "llm:delta", {"call": "first", "text": "x"}),
        TopicRecord("pyrula.support.events", 0, 1, b"bad", b"\x00", {}, 1),
        event_record(2, "fine", "run:start", {"params": {"q": "hi"}}),
    ]
    assert feed._fold(records)
    assert (feed.unshowable, feed.undecodable) == (1, 1)
    assert state.find("support", "fine") is not None


def test_a_dead_letter_shows_no_credential_a_producer_put_in_its_headers() -> None:
    state = UIState()
    secrets = {
        "Authorization": "Bearer sk-live-1",
        "cookie": "sid=2",
        "X-Auth-Token": "3",
        "client_secret": "4",
        "db-password": "5",
        "x-api-key": "6",
        "Api_Key": "7",
    }
    letter = state.add_dead_letter(
        "support",
        0,
        5,
        1_000,
        b"k1",
        b"{}",
        {
            "pyrula.dlq.reason": "value does not decode",
            **{f"pyrula.original.{k}": v for k, v in secrets.items()},
            "pyrula.original.traceparent": "00-abc-def-01",
            "pyrula.original.pyrula-budget-tokens-left": "900",
        },
    )
    assert letter.original_headers == {
        **{k: "[redacted]" for k in secrets},
        "traceparent": "00-abc-def-01",
        "pyrula-budget-tokens-left": "900",
    }


def test_called_by_comes_from_lineage_never_from_submitter_metadata() -> None:
    forged = TurnView("t1", "support")
    forged.apply(
        ev(0, "run:start", worker="w1", metadata={"parent_turn_id": "p9", "parent_agent": "x"})
    )
    assert forged.parent is None
    child = TurnView("t1", "support")
    child.apply(ev(0, "run:start", worker="w1", parent={"agent": "triage", "turn_id": "p1"}))
    assert child.parent == {"agent": "triage", "turn_id": "p1"}


def test_a_turn_waiting_for_its_batch_says_so_and_its_call_shows_it_went_by_batch() -> None:
    turn = TurnView("t1", "support")
    waiting = {"waiting": "batch", "custom_id": "c0"}
    for event in [
        ev(0, "run:start", params={}, worker="w1"),
        ev(1, "status", text="waiting for batch", **waiting),
        ev(2, "llm:complete", attempt=2, call=0, text="ok", batch={"custom_id": "c0"}),
    ]:
        assert turn.apply(event)
    status, model = (s for s in turn.steps if s["kind"] in ("status", "model"))
    assert (status["text"], status["waiting"]) == ("waiting for batch", "batch")
    assert model["by_batch"] is True
