"""``EvalStream``: an agent's evaluators as a consumer group of their own.

It reads ``<agent>.results`` (committed: a turn's result is written in its terminal
transaction), so an evaluator runs after the turn, never on its path, and can neither
slow nor fail it. For each batch it reads, it writes, in ONE transaction with the
batch's offsets (EOS v2, as a worker commits): the function evaluators' scores, the
judges' turn requests, the deferred outcomes' waits and early events, and the scores of
judges' results and of joined or timed-out outcomes. A member killed mid-batch leaves
nothing visible, and the next member reads the batch again: each sampled turn gets
exactly one score per evaluator version.

Judges are agents: their requests go to ``<judge>.turns`` under a deterministic turn id
(``judge.judge_turn_id``) and their results come back on ``<judge>.results``, which this
group also reads. Deferred outcomes keep their state in ``<agent>.outcomes`` (``joins``),
restored when a member takes a partition over; timeouts fire once a second (a member that
lags behind by less than an outcome's grace still joins the events written in time).
A record that cannot be read goes to ``<agent>.dlq`` with the reason.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from confluent_kafka import KafkaException

from pyrula_stream.agent.definition import KafkaAgent
from pyrula_stream.errors import (
    ConfigurationError,
    ErrorCode,
    KafkaAuthorizationError,
    MalformedRecordError,
    PyrulaError,
)
from pyrula_stream.evals.evaluators import (
    Evaluator,
    FunctionEvaluator,
    Verdict,
    error_score,
    run_function,
)
from pyrula_stream.evals.judges import EVAL_REPLY_HEADER, JudgeEvaluator
from pyrula_stream.evals.outcomes import BusinessEvent, OutcomeEvaluator
from pyrula_stream.evals.stream import state
from pyrula_stream.evals.stream.joins import Joined, Joins
from pyrula_stream.evals.stream.tools_called import ToolsCalled
from pyrula_stream.evals.turns import ScoredTurn
from pyrula_stream.kafka.admin import missing_topics
from pyrula_stream.kafka.group import ConsumerFenced
from pyrula_stream.kafka.offsets import ConsumedRecord
from pyrula_stream.kafka.processor import GroupReader, TopicPartitions, read_partition
from pyrula_stream.kafka.transactions import (
    BatchWriter,
    ProducerFenced,
    TransactionAborted,
    writer_record_room,
)
from pyrula_stream.wire import serde
from pyrula_stream.wire.records import OutRecord, SourceRecord, dead_letter_source, request_headers
from pyrula_stream.wire.scores import Score, score_record

log = logging.getLogger(__name__)

TIMER_EVERY_S = 1.0
"""How often a member looks for timeouts while records keep coming (and whenever idle)."""
SESSION_ERRORS = (TransactionAborted, ProducerFenced, ConsumerFenced)
"""What ends a session: its uncommitted work is dropped and a new one reads it again."""


def evals_group_id(prefix: str, agent: str) -> str:
    """The evaluators' consumer group of ``agent`` (apart from its workers')."""
    return f"{prefix}.{agent}.evals"


def evals_transactional_id(prefix: str, agent: str, instance: str) -> str:
    """One member's transactional id: a restarted member with the same ``instance``
    fences its dead self and aborts what it left open at once."""
    return f"{prefix}.{agent}.evals-{instance}"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _named(tps: TopicPartitions) -> str:
    return ", ".join(f"{t}[{p}]" for t, p in sorted(tps)) or "nothing"


def _close_quietly(client: Any) -> None:
    """End a session's client; a failure to close is logged, never raised over the
    error that ended the session (the client is dropped either way)."""
    if client is None:
        return
    try:
        client.close()
    except (KafkaException, RuntimeError) as exc:
        log.warning("closing %s: %s", type(client).__name__, exc)


def _event_value(value: bytes | None) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return value.decode("utf-8", "replace")


class EvalStream:
    """Runs ``agent``'s evaluators (or ``evaluators``) until ``stop`` is set.

    ``instance`` names this member (its transactional id); give a restarted member the
    same one (with ``static=True`` it also keeps its partitions across the restart).
    ``on_batch`` sees each committed batch's scores (tests, metrics).
    """

    def __init__(
        self,
        agent: KafkaAgent,
        bootstrap_servers: str,
        *,
        evaluators: Sequence[Evaluator] | None = None,
        instance: str | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        on_batch: Callable[[list[Score]], None] | None = None,
        static: bool = False,
    ) -> None:
        if static and instance is None:
            raise ConfigurationError("a static evaluators' member needs its instance name")
        self.static = static
        """Static membership (KIP-345, ``group.instance.id`` = ``instance``): restarted
        under its name, the member resumes at once, without a rebalance; one that stops
        for good holds its partitions until the session times out (10 s)."""
        self.agent = agent
        self.bootstrap_servers = bootstrap_servers
        self.kafka_config = kafka_config
        self.evaluators = tuple(agent.evaluators if evaluators is None else evaluators)
        if not self.evaluators:
            raise ValueError(f"agent '{agent.name}' has no evaluators to run")
        self.instance = instance or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.on_batch = on_batch
        self.topics = agent.topics
        self.functions = [e for e in self.evaluators if isinstance(e, FunctionEvaluator)]
        self.judges = {
            (e.name, e.version): e for e in self.evaluators if isinstance(e, JudgeEvaluator)
        }
        self.outcomes = [e for e in self.evaluators if isinstance(e, OutcomeEvaluator)]
        self._outcome_by = {(e.name, e.version): e for e in self.outcomes}
        self._judge_results = {self._judge_topic(j, "results") for j in self.judges.values()}
        self._business = {e.topic for e in self.outcomes}
        self._joins: dict[int, Joins] = {}
        self._tools: ToolsCalled | None = None
        self._room = writer_record_room(kafka_config, None)
        self.stats: Counter[str] = Counter()
        """``scores`` (by kind: ``scores.judge``...) and ``timed_out`` count committed
        scores; ``judge_requests``, ``waits``, ``events`` and ``dead_letters`` count what
        was written (a batch aborted is written again); ``restored_partitions``,
        ``sessions_restarted``."""

    # -- topics --------------------------------------------------------------------

    def _judge_topic(self, ev: JudgeEvaluator, kind: str) -> str:
        return f"{ev.judge_prefix or self.agent.prefix}.{ev.judge}.{kind}"

    def input_topics(self) -> list[str]:
        topics = [self.topics.results, *sorted(self._judge_results), *sorted(self._business)]
        if self.outcomes:
            topics.append(self.topics.outcomes)
        return topics

    # -- the loop ------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Sessions until ``stop``: an aborted or fenced batch starts a new session,
        which reads the batch again from the committed offsets."""
        missing = missing_topics(
            self.bootstrap_servers, self.input_topics(), kafka_config=self.kafka_config
        )
        if missing:
            raise ConfigurationError(
                f"evaluators of '{self.agent.name}' read topics that do not exist: "
                f"{', '.join(missing)}; start them once the agent's (and its judges') "
                "workers have created their topics, and create the business topics"
            )
        while not stop.is_set():
            try:
                self._session(stop)
            except SESSION_ERRORS as exc:
                denied = [f for f in getattr(exc, "failed", ()) if f.denied]
                if denied:  # every later try fails the same: say so and stop
                    raise KafkaAuthorizationError(
                        f"the evaluators of '{self.agent.name}' may not write {denied[0].topic}"
                        f" ({denied[0].reason}); grant them with `pyrula-stream acls "
                        "MODULE:AGENT --evaluator-principal User:<name> --apply`"
                    ) from None
                self.stats["sessions_restarted"] += 1
                log.warning(
                    "evaluators of %s: batch not committed (%s); rejoining", self.agent.name, exc
                )

    def _session(self, stop: threading.Event) -> None:
        writer = BatchWriter(
            self.bootstrap_servers,
            transactional_id=evals_transactional_id(
                self.agent.prefix, self.agent.name, self.instance
            ),
            kafka_config=self.kafka_config,
        )
        reader = GroupReader(
            self.bootstrap_servers,
            topics=self.input_topics(),
            group_id=evals_group_id(self.agent.prefix, self.agent.name),
            client_id=f"pyrula-evals-{self.instance}",
            kafka_config=self.kafka_config,
            group_instance_id=self.instance if self.static else None,
        )
        self._joins.clear()
        timers_at = 0.0
        try:
            writer.start()
            reader.subscribe(lambda tps: self._assigned(reader, tps), self._revoked)
            while not stop.is_set():
                records = reader.poll()
                out: list[OutRecord] = []
                scores: list[Score] = []
                offsets: dict[tuple[str, int], int] = {}
                for rec in records:
                    out += self._handle(rec, scores)
                    offsets[(rec.topic, rec.partition)] = rec.offset + 1
                if not records or time.monotonic() >= timers_at:
                    timers_at = time.monotonic() + TIMER_EVERY_S
                    out += self._due(_now_ms(), scores)
                if out or offsets:
                    writer.write(out, offsets, reader.client, reader.group_metadata)
                    self._committed(scores)
        finally:
            self._joins.clear()
            self._tools, tools = None, self._tools
            for client in (reader, writer, tools):
                _close_quietly(client)

    def _committed(self, scores: list[Score]) -> None:
        for s in scores:
            self.stats["scores"] += 1
            self.stats[f"scores.{s.kind}"] += 1
            if s.timed_out:
                self.stats["timed_out"] += 1
        if scores and self.on_batch is not None:
            self.on_batch(scores)

    def _assigned(self, reader: GroupReader, tps: TopicPartitions) -> None:
        """Rebuild the joins of each outcomes partition taken (before reading it)."""
        log.info("evaluators of %s: took %s", self.agent.name, _named(tps))
        for topic, partition in tps:
            if topic != self.topics.outcomes:
                continue
            committed = reader.committed(topic, partition)
            records = read_partition(
                self.bootstrap_servers,
                topic,
                partition,
                client_id=f"pyrula-evals-restore-{self.instance}",
                kafka_config=self.kafka_config,
            )
            self._joins[partition] = Joins.restore(records, committed)
            self.stats["restored_partitions"] += 1

    def _revoked(self, tps: TopicPartitions) -> None:
        log.info("evaluators of %s: released %s", self.agent.name, _named(tps))
        for topic, partition in tps:
            if topic == self.topics.outcomes:
                self._joins.pop(partition, None)

    # -- one record ----------------------------------------------------------------

    def _handle(self, rec: ConsumedRecord, scores: list[Score]) -> list[OutRecord]:
        try:
            if rec.topic == self.topics.results:
                return self._turn(ScoredTurn.from_record(rec.value, rec.headers), scores)
            out: list[OutRecord] = []
            if rec.topic in self._judge_results:
                out += self._judged(rec, scores)
            if rec.topic in self._business:
                out += self._business_event(rec)
            if rec.topic == self.topics.outcomes:
                out += self._join_record(rec, scores)
            return out
        except MalformedRecordError as exc:
            self.stats["dead_letters"] += 1
            return [self._dead_letter(rec, str(exc))]

    def _dead_letter(self, rec: ConsumedRecord, reason: str) -> OutRecord:
        source = SourceRecord(
            rec.topic,
            rec.partition,
            rec.offset,
            rec.key.encode(),
            rec.value,
            [(k, v.encode()) for k, v in rec.headers.items()],
        )
        return dead_letter_source(
            self.topics.dlq,
            source,
            f"evaluators could not read the record: {reason}",
            ErrorCode.POISON,
            worker=self.instance,
            max_bytes=self._room,
        )

    def _score(self, score: Score, scores: list[Score]) -> OutRecord:
        scores.append(score)
        return score_record(self.topics.scores, score)

    def _turn(self, turn: ScoredTurn, scores: list[Score]) -> list[OutRecord]:
        """A finished turn: every evaluator that samples it starts its scoring."""
        out: list[OutRecord] = []
        sampled = [e for e in (*self.functions, *self.judges.values()) if e.samples(turn)]
        unread: str | None = None
        if any(e.reads_tools for e in sampled):
            try:
                turn = replace(turn, tools=self._tools_called().of(turn.turn_id, turn.started_ms))
            except (TimeoutError, PyrulaError) as exc:
                unread = f"could not read the tools the turn called: {exc}"
        for ev in sampled:
            if unread is not None and ev.reads_tools:
                out.append(self._score(error_score(ev, turn, unread, turn.read()), scores))
            elif isinstance(ev, FunctionEvaluator):
                score = run_function(ev, turn)
                if score is not None:
                    out.append(self._score(score, scores))
            elif isinstance(ev, JudgeEvaluator):
                out.append(self._judge_request(ev, turn, scores))
        for ev in self.outcomes:
            if ev.samples(turn):
                out.append(self._wait(ev, turn, scores))
        return out

    def _tools_called(self) -> ToolsCalled:
        if self._tools is None:
            self._tools = ToolsCalled(
                self.bootstrap_servers,
                self.topics.events,
                client_id=f"pyrula-evals-tools-{self.instance}",
                kafka_config=self.kafka_config,
            )
        return self._tools

    # -- judges --------------------------------------------------------------------

    def _judge_request(
        self, ev: JudgeEvaluator, turn: ScoredTurn, scores: list[Score]
    ) -> OutRecord:
        """The judge's turn request (or an error score when its params cannot be built)."""
        try:
            params = ev.params(turn)
            if not isinstance(params, dict):
                raise TypeError(f"params() returned {type(params).__name__}, not a dict")
        except Exception as exc:  # an evaluator's bug is a score
            return self._score(
                error_score(ev, turn, f"{type(exc).__name__}: {exc}", turn.read()), scores
            )
        judge_turn = ev.turn_id_for(turn.turn_id)
        context = {
            "agent": turn.agent,
            "turn_id": turn.turn_id,
            "agent_version": turn.agent_version,
            "evaluator": ev.name,
            "version": ev.version,
        }
        request = serde.TurnRequest(
            turn_id=judge_turn,
            agent=ev.judge,
            params=params,
            metadata={"evaluates": turn.turn_id, "evaluator": ev.name},
            idempotency_key=judge_turn,
            submitted_ms=_now_ms(),
            reply_headers=((EVAL_REPLY_HEADER, json.dumps(context, separators=(",", ":"))),),
        )
        self.stats["judge_requests"] += 1
        return OutRecord(
            self._judge_topic(ev, "turns"),
            request.key.encode(),
            serde.encode("turn_request", request),
            request_headers(request),
        )

    def _judged(self, rec: ConsumedRecord, scores: list[Score]) -> list[OutRecord]:
        """A judge's result: the score of the turn it judged (others' results pass by)."""
        raw = rec.headers.get(EVAL_REPLY_HEADER)
        if raw is None:
            return []
        try:
            context = json.loads(raw)
            agent, version = context["agent"], str(context["version"])
            ev = self.judges.get((str(context["evaluator"]), version))
            turn = ScoredTurn(
                turn_id=str(context["turn_id"]),
                agent=str(agent),
                status="",
                agent_version=str(context.get("agent_version") or ""),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise MalformedRecordError(
                f"judge result: bad {EVAL_REPLY_HEADER} header: {exc!r}"
            ) from None
        if agent != self.agent.name or ev is None:
            return []  # another agent's judging, or an evaluator no longer run
        if rec.value is None:
            raise MalformedRecordError("judge result: empty value")
        result = serde.decode_turn_result(rec.value, rec.headers)
        inputs = {"judge_turn_id": result.turn_id, "judge_result": result.result}
        if result.status != "completed":
            why = f"judge turn {result.status}: {result.error_code}: {result.error_message}"
            return [self._score(error_score(ev, turn, why, inputs), scores)]
        try:
            verdict = Verdict.of(ev.read(result.result))
        except Exception as exc:
            return [
                self._score(error_score(ev, turn, f"{type(exc).__name__}: {exc}", inputs), scores)
            ]
        return [self._score(ev.score(turn, verdict, inputs), scores)]

    # -- deferred outcomes ---------------------------------------------------------

    def _wait(self, ev: OutcomeEvaluator, turn: ScoredTurn, scores: list[Score]) -> OutRecord:
        try:
            join_key = ev.key(turn)
        except Exception as exc:
            return self._score(
                error_score(ev, turn, f"key: {type(exc).__name__}: {exc}", turn.read()), scores
            )
        if join_key is None:
            return self._score(
                error_score(ev, turn, "the turn names no key to join its outcome by", turn.read()),
                scores,
            )
        finished = turn.finished_ms or _now_ms()
        deadline = finished + ev.window_ms
        wait = state.Wait(
            ev.name,
            ev.version,
            str(join_key),
            turn.data(),
            deadline,
            deadline + ev.grace_ms,
            finished - ev.window_ms,
        )
        self.stats["waits"] += 1
        return state.record(self.topics.outcomes, wait, self.agent.partitions)

    def _business_event(self, rec: ConsumedRecord) -> list[OutRecord]:
        event = BusinessEvent(
            rec.key, _event_value(rec.value), rec.ts_ms, rec.topic, rec.partition, rec.offset
        )
        out = []
        for ev in self.outcomes:
            if ev.topic != rec.topic:
                continue
            try:
                join_key = ev.event_key(event)
            except Exception as exc:  # the event is dead-lettered
                raise MalformedRecordError(f"{ev.name}: event_key raised {exc!r}") from None
            if join_key is None:
                continue
            expire = event.ts_ms + ev.window_ms + ev.grace_ms
            early = state.Early(ev.name, str(join_key), event.data(), expire)
            out.append(state.record(self.topics.outcomes, early, self.agent.partitions))
            self.stats["events"] += 1
        return out

    def _join_record(self, rec: ConsumedRecord, scores: list[Score]) -> list[OutRecord]:
        joins = self._joins.get(rec.partition)
        if joins is None or rec.value is None:
            if joins is not None:
                joins.forget(rec.key)
            return []
        return self._joined(joins.arrive(state.parse(rec.value)), rec.partition, scores)

    def _joined(
        self, joined: Iterable[Joined], partition: int, scores: list[Score]
    ) -> list[OutRecord]:
        out = []
        for j in joined:
            ev = self._outcome_by.get((j.wait.evaluator, j.wait.version))
            out.append(state.deleted(self.topics.outcomes, j.wait.key, partition))
            if ev is None:
                continue
            turn = ScoredTurn.from_data(j.wait.turn)
            event = BusinessEvent(**j.event.event)
            inputs = {"key": j.wait.join_key, "event": j.event.event}
            try:
                verdict = Verdict.of(ev.score_event(turn, event))
                score = ev.score(turn, verdict, inputs)
            except Exception as exc:
                score = error_score(ev, turn, f"{type(exc).__name__}: {exc}", inputs)
            out.append(self._score(score, scores))
        return out

    def _due(self, now_ms: int, scores: list[Score]) -> list[OutRecord]:
        """Timeouts and expired early events of every outcomes partition held."""
        out: list[OutRecord] = []
        for partition, joins in self._joins.items():
            waits, events = joins.due(now_ms)
            for e in events:
                out.append(state.deleted(self.topics.outcomes, e.key, partition))
            for w in waits:
                out.append(state.deleted(self.topics.outcomes, w.key, partition))
                ev = self._outcome_by.get((w.evaluator, w.version))
                if ev is None:
                    continue
                turn = ScoredTurn.from_data(w.turn)
                inputs = {"key": w.join_key, "deadline_ms": w.deadline_ms}
                try:
                    verdict = Verdict.of(ev.on_timeout(turn))
                    score = ev.score(turn, verdict, inputs, timed_out=True)
                except Exception as exc:
                    score = error_score(ev, turn, f"{type(exc).__name__}: {exc}", inputs)
                out.append(self._score(score, scores))
        return out
