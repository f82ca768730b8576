"""Agent versions: which body runs a turn, so a deploy never breaks an in-flight turn.

A turn's start step journals the version it started on. ``pinned`` (the default when an
agent names a ``version``): the turn runs to its end on that version's body, the current
one or an older one kept in ``versions={"1": old_body}``. A worker without that body does
not start the turn; it leaves it to a worker that has it (see ``KafkaWorker``).
``auto_upgrade``: the current body continues every turn, and a step whose input changed
fails the turn with ``replay_input_changed``. A turn journaled before the agent had a
version runs on the current body.

A new turn of an agent with an ``experiment`` starts on the variant its key hashes to
(``agent/experiments.py``), so the assignment is made where the turn starts, from the
request alone, the same on every worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.durable.journal import TurnJournal
from pyrula_stream.wire.serde import TurnRequest


def started_version(journal: TurnJournal) -> tuple[bool, str | None]:
    """``(started, version)``: whether the journal holds the turn's start, and its version."""
    start = journal.steps.get(0)
    if start is None or start.kind != "start":
        return False, None
    version = start.data.get("version")
    return True, str(version) if version is not None else None


def turn_version(
    agent: KafkaAgent, journal: TurnJournal, request: TurnRequest | None = None
) -> str | None:
    """The version a turn runs on: the one it started on; for a new turn, its experiment
    variant, else the agent's current version."""
    started, version = started_version(journal)
    if started:
        return version
    return new_turn_version(agent, request)


def new_turn_version(agent: KafkaAgent, request: TurnRequest | None) -> str | None:
    """The version a turn not started yet starts on."""
    if agent.experiment is None or request is None:
        return agent.version
    return agent.experiment.variant_for(request.thread_id or request.turn_id)


def body_for(agent: KafkaAgent, version: str | None) -> Callable[..., Any] | None:
    """The body that runs a turn of ``version``, or ``None`` when this worker lacks it."""
    if agent.version_behavior == "auto_upgrade" or version is None or version == agent.version:
        return agent.fn
    return agent.versions.get(version)


def known_versions(agent: KafkaAgent) -> list[str]:
    return sorted({*agent.versions, *([agent.version] if agent.version else [])})


def missing_version(
    agent: KafkaAgent, journal: TurnJournal, request: TurnRequest | None = None
) -> str | None:
    """The version a pinned turn needs when this worker lacks its body, else ``None``.

    The worker then leaves the turn unstarted and its input offset uncommitted (the
    partition's watermark stops there), so the partition's next owner reads it again; a
    worker that keeps that version in ``versions=`` runs it.
    """
    version = turn_version(agent, journal, request)
    return version if body_for(agent, version) is None else None
