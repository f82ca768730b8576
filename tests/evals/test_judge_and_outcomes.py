"""A judge agent (on FakeLLM) and a deferred outcome on a real broker: the judge's turn
is asked once per sampled turn under its derived id and its verdict becomes the score;
a business event joins the turn that named its key, also when it arrives before the
turn's result; a window that closes without one scores ``timed_out``; so does one whose
event came after the window. The timeouts fire in a second member of the evaluators'
group, which took the waits over from the first."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

from pyrula_stream import AgentContext, KafkaAgentClient, kafka_agent
from pyrula_stream.evals import ScoredTurn, judge, outcome
from pyrula_stream.evals.judges import judge_turn_id
from pyrula_stream.kafka.admin import TopicSpec, apply_topics
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.kafka.once import read_raw
from pyrula_stream.llm import FakeLLM, reply_text
from pyrula_stream.testing import running_worker, wait_for
from pyrula_stream.wire.scores import parse_score
from tests.evals.streaming import streaming

WINDOW = timedelta(seconds=3)


def _grade(messages: list[dict[str, Any]], tools: Any) -> Any:
    """The judge's model: an even order number is a good answer."""
    n = int(str(messages[-1]["content"]).rsplit("o", 1)[1])
    return reply_text(json.dumps({"passed": n % 2 == 0, "reason": f"order {n}"}))


def _params(turn: ScoredTurn) -> dict[str, Any]:
    return {"answer": turn.result["order_id"]}


async def test_a_judge_and_deferred_outcomes_score_each_turn_once(
    kafka_bootstrap_servers: str,
) -> None:
    bootstrap = kafka_bootstrap_servers
    tag = uuid.uuid4().hex[:8]
    orders = f"orders-{tag}"
    apply_topics(bootstrap, [TopicSpec(orders, 2)])

    @kafka_agent(name=f"judge-{tag}", llm=FakeLLM(_grade), partitions=1)
    async def grader(ctx: AgentContext, answer: str) -> Any:
        return json.loads(await ctx.llm.run([{"role": "user", "content": answer}]))

    quality = judge("quality", grader, params=_params)
    delivered = outcome(
        "delivered",
        topic=orders,
        key="order_id",
        window=WINDOW,
        grace=timedelta(seconds=3),
        score=lambda turn, event: event.value["status"] == "delivered",
    )

    @kafka_agent(name=f"shop-{tag}", llm=FakeLLM(), partitions=2, evaluators=[quality, delivered])
    async def shop(ctx: AgentContext, n: int) -> dict[str, Any]:
        return {"order_id": f"o{n}"}

    producer = RecordProducer(bootstrap)

    def event(n: int, status: str) -> None:
        body = json.dumps({"status": status}).encode()
        producer.send_sync(orders, f"o{n}".encode(), body)

    async with (
        running_worker(grader, bootstrap),
        running_worker(shop, bootstrap),
        KafkaAgentClient(bootstrap) as client,
    ):
        try:
            with streaming(shop, bootstrap, "t1") as first:
                event(0, "delivered")  # before the turn that names o0 has even run
                await wait_for(lambda: first.stats["events"] >= 1, 60, "o0's event kept")
                turns = []
                for n in range(4):
                    turns.append((await client.run(shop.name, n=n))[-1].turn_id)
                    if n == 1:
                        event(1, "lost")  # within the window
                await wait_for(
                    lambda: first.stats["scores"] >= 6 and first.stats["waits"] >= 4,
                    60,
                    "4 judged, o0 and o1 joined, o2 and o3 waiting",
                )
            with streaming(shop, bootstrap, "t2") as second:
                await asyncio.sleep(WINDOW.total_seconds())
                event(3, "delivered")  # after the window: o3 times out all the same
                # o2 never gets an event
                await wait_for(lambda: second.stats["scores"] >= 2, 60, "2 timeouts")
                await asyncio.sleep(0.5)
        finally:
            producer.close()
    assert second.stats["restored_partitions"] >= 1
    assert (first.stats["timed_out"], second.stats["timed_out"]) == (0, 2)
    scores = [parse_score(r.value) for r in read_raw(bootstrap, shop.topics.scores)]
    assert Counter((s.turn_id, s.evaluator) for s in scores) == {
        (t, ev): 1 for t in turns for ev in ("quality", "delivered")
    }
    by = {(s.turn_id, s.evaluator): s for s in scores}
    for n, t in enumerate(turns):
        q = by[(t, "quality")]
        assert (q.kind, q.passed, q.reason) == ("judge", n % 2 == 0, f"order {n}")
        assert q.inputs["judge_turn_id"] == judge_turn_id(t, "quality", "1")
    judged = [r for r in read_raw(bootstrap, grader.topics.results)]
    assert sorted((r.key or b"").decode() for r in judged) == sorted(
        judge_turn_id(t, "quality", "1") for t in turns
    )
    outcomes = [by[(t, "delivered")] for t in turns]
    assert [(o.kind, o.passed, o.timed_out) for o in outcomes] == [
        ("outcome", True, False),
        ("outcome", False, False),
        ("outcome", False, True),
        ("outcome", False, True),
    ]
    assert outcomes[0].inputs["key"] == "o0"
