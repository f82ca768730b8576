"""Record the support agent's golden turns: run every sample question on a real broker
and export each finished turn to ``golden/<customer>.json``.

    python -m examples.support_triage.record_golden

Run it again (and review the diff) after a change that is meant to alter the turns;
``tests/durable/test_golden_turns.py`` replays these files against the current code.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from examples.support_triage.agent import DATA, support
from pyrula_stream import KafkaAgentClient
from pyrula_stream.kafka.admin import apply_topics
from pyrula_stream.state.history import export_turn
from pyrula_stream.testing import local_kafka, running_worker

GOLDEN = Path(__file__).parent / "golden"


async def record(bootstrap: str) -> None:
    apply_topics(bootstrap, support.topic_specs())
    GOLDEN.mkdir(exist_ok=True)
    async with (
        KafkaAgentClient(bootstrap, prefix=support.prefix) as client,
        running_worker(support, bootstrap, all_partitions=True),
    ):
        for q in DATA["questions"]:
            events = await client.run(support.name, thread_id=q["customer"], **q)
            if events[-1].type != "run:complete":
                raise SystemExit(f"{q['customer']}: the turn failed: {events[-1].data}")
            recording = await asyncio.to_thread(
                export_turn,
                bootstrap,
                history_topic=support.topics.history,
                events_topic=support.topics.events,
                turn_id=events[-1].turn_id,
            )
            recording.dump(GOLDEN / f"{q['customer']}.json")
            print(f"{q['customer']}: {len(recording.steps)} steps -> golden/{q['customer']}.json")


def main() -> None:
    with local_kafka() as bootstrap:
        asyncio.run(record(bootstrap))


if __name__ == "__main__":
    main()
