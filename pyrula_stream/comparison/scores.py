"""Reading ``<agent>.scores``: every committed score once, however often it was written.

The topic is read with ``read_committed`` (a score in an aborted transaction is not a
score), every partition to the end it had when reading began. Evaluators write each
score exactly once, but a topic can still hold copies (an evaluator run twice by hand, a
redrive, an offline run written to the topic): copies share their ``score_id``, the
first is kept and the others counted. A record that is not a score is counted with its
reason, never dropped silently.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyrula_stream.errors import ConfigurationError, MalformedRecordError
from pyrula_stream.kafka.admin import missing_topics
from pyrula_stream.kafka.consumers import read_topic, reader_group_id
from pyrula_stream.wire.scores import SCORES_TOPIC_SUFFIX, Score, parse_score


def scores_topic(agent: str, prefix: str = "pyrula") -> str:
    return f"{prefix}.{agent}.{SCORES_TOPIC_SUFFIX}"


@dataclass
class ReadScores:
    """What a read found: the distinct scores, and what it left out and why."""

    scores: list[Score] = field(default_factory=list)
    duplicates: int = 0
    malformed: list[str] = field(default_factory=list)
    """``partition@offset: reason`` of each record that is not a score."""


def distinct(scores: Iterable[Score]) -> tuple[list[Score], int]:
    """The first copy of each ``score_id``, and how many copies were left out."""
    seen: set[str] = set()
    kept: list[Score] = []
    copies = 0
    for score in scores:
        if score.score_id in seen:
            copies += 1
            continue
        seen.add(score.score_id)
        kept.append(score)
    return kept, copies


def read_scores(
    bootstrap_servers: str,
    agent: str,
    *,
    prefix: str = "pyrula",
    since_ms: int | None = None,
    timeout_s: float = 30.0,
    kafka_config: Mapping[str, Any] | None = None,
) -> ReadScores:
    """Every committed score of ``agent`` written at or after ``since_ms`` (all: ``None``)."""
    topic = scores_topic(agent, prefix)
    if missing_topics(bootstrap_servers, [topic], kafka_config=kafka_config):
        raise ConfigurationError(
            f"no topic {topic}: agent {agent!r} has no scores yet (declare evaluators on it, "
            "or check --prefix and the agent's name)"
        )
    result = ReadScores()
    parsed: list[Score] = []
    for record in read_topic(
        bootstrap_servers,
        topic,
        timeout_s=timeout_s,
        client_id=f"pyrula-evals-{int(time.time() * 1000)}",
        kafka_config=kafka_config,
        group_id=reader_group_id(prefix, agent),
    ):
        if since_ms is not None and record.ts_ms < since_ms:
            continue
        try:
            parsed.append(parse_score(record.value))
        except MalformedRecordError as exc:
            result.malformed.append(f"{record.partition}@{record.offset}: {exc}")
    result.scores, result.duplicates = distinct(parsed)
    return result
