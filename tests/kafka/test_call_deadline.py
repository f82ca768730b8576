"""A transactional call that an outage stalled is given up once Kafka answers again,
not after its whole timeout; a call that returns or raises is passed through."""

from __future__ import annotations

import threading

import pytest

from pyrula_stream.kafka.deadline import CallAbandoned, call_with_deadline


def _scripted(*answers: bool) -> list[bool]:
    return list(answers)


def test_a_call_stalled_by_an_outage_is_given_up_once_kafka_answers_again() -> None:
    never = threading.Event()
    script = _scripted(False, False, True)
    asked: list[bool] = []

    def answers() -> bool:
        asked.append(script.pop(0) if script else True)
        return asked[-1]

    with pytest.raises(CallAbandoned) as abandoned:
        call_with_deadline(
            never.wait,
            "commit_transaction",
            timeout_s=120,
            answers=answers,
            watch_after_s=0.1,
            heal_grace_s=0.1,
        )
    assert "commit_transaction still pending" in str(abandoned.value)
    assert "after Kafka answered again" in str(abandoned.value)
    assert asked == [False, False, True]


def test_a_slow_call_while_kafka_answers_is_left_to_finish() -> None:
    release = threading.Timer(1.5, lambda: None)

    def slow() -> str:
        release.start()
        release.join()
        return "committed"

    assert (
        call_with_deadline(slow, "commit", timeout_s=60, answers=lambda: True, watch_after_s=0.1)
        == "committed"
    )


def test_a_call_that_raises_raises_its_own_error() -> None:
    def fails() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        call_with_deadline(fails, "abort", timeout_s=5, answers=lambda: True)


def test_a_call_that_never_returns_is_given_up_at_its_timeout() -> None:
    never = threading.Event()
    with pytest.raises(CallAbandoned, match=r"did not return within 0\.5s"):
        call_with_deadline(never.wait, "send_offsets", timeout_s=0.5, answers=lambda: False)


def test_calls_reuse_a_thread_but_never_one_left_blocked_by_a_call_given_up() -> None:
    first, second = (
        call_with_deadline(threading.get_ident, "commit", timeout_s=5, answers=lambda: True)
        for _ in range(2)
    )
    assert first == second  # no new thread per call
    never = threading.Event()
    with pytest.raises(CallAbandoned):
        call_with_deadline(
            lambda: (threading.get_ident(), never.wait()),
            "send_offsets",
            timeout_s=0.3,
            answers=lambda: False,
        )
    after = call_with_deadline(threading.get_ident, "commit", timeout_s=5, answers=lambda: True)
    assert after != first  # the blocked thread is not handed the next call
    never.set()
