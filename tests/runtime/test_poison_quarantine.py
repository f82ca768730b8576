"""A record that kills worker processes is quarantined after ``max_retries`` crashes.

A supervised worker whose tool calls ``os._exit`` on a marker: no decoder can guard
against that, so the next owners count the crashes from the partition's journal and the
record ends in the DLQ with ``poison_quarantine``, while later records complete. Only a
death while the record ran alone (careful mode) is counted: a death with many turns in
flight, or from outside, only makes the next owner careful.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from pathlib import Path

from pyrula_stream import KafkaAgentClient, PoisonOptions
from pyrula_stream.kafka.io import RecordProducer
from pyrula_stream.runtime.poison import PROCESS, CrashGuard, IntakeMark
from pyrula_stream.testing import agent_topics_ready, read_topic, unique_name, wait_for

ROOT = Path(__file__).parents[2]
STARTED = re.compile(r"worker (\S+) started \(pid (\d+)\)")


async def test_a_record_that_kills_workers_is_quarantined_and_the_partition_moves_on(
    kafka_bootstrap_servers: str, client: KafkaAgentClient
) -> None:
    agent = unique_name("crasher")
    supervisor = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pyrula_stream.cli",
        "worker",
        "tests.agents.crasher:crasher",
        "--bootstrap-servers",
        kafka_bootstrap_servers,
        "--processes",
        "1",
        "--worker-id",
        "poison",
        "--static-membership",
        "--shutdown-grace",
        "5",
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "CRASHER_AGENT_NAME": agent},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    lines: list[str] = []

    async def collect() -> None:
        assert supervisor.stdout is not None
        async for line in supervisor.stdout:
            lines.append(line.decode(errors="replace"))

    collector = asyncio.create_task(collect())
    dlq = f"pyrula.{agent}.dlq"
    try:
        await agent_topics_ready(kafka_bootstrap_servers, agent)
        before = await client.run(agent, text="fine before", timeout=120)
        assert before[-1].type == "run:complete"
        poison = await client.submit(agent, text="please CRASH now")
        # Read by each process that dies at the poison before its offset commits: one
        # dead letter for it all the same (the journal's marker commits with the letter).
        producer = RecordProducer(kafka_bootstrap_servers)
        await producer.send(f"pyrula.{agent}.turns", b"junk", b"\x00\x01garbage")
        producer.close()
        after = await client.submit(agent, text="fine after")

        async def events_of(turn_id: str) -> list[str]:
            seen = []
            async for event in client.stream(agent, turn_id):
                seen.append(event.type)
            return seen

        after_events = await asyncio.wait_for(events_of(after.turn_id), 240)
        assert after_events[-1] == "run:complete", "".join(lines)
        poison_events = await asyncio.wait_for(events_of(poison.turn_id), 60)
        assert poison_events[-1] == "run:error"

        def letters() -> list[dict[str, str]]:
            return [h for _, _, h in read_topic(kafka_bootstrap_servers, dlq)]

        await wait_for(lambda: len(letters()) == 2, 30, "the quarantined record in the DLQ")
        garbage, letter = sorted(letters(), key=lambda h: h["pyrula.dlq.code"])
        assert garbage["pyrula.dlq.code"] == "invalid_request"
        assert letter["pyrula.dlq.code"] == "poison_quarantine"
        assert "3 worker processes died" in letter["pyrula.dlq.reason"], letter
        # The first process (its death only makes the next one careful), one per counted
        # crash, and the fifth, which reads the record quarantined.
        assert len(STARTED.findall("".join(lines))) == 5, "".join(lines)
        again = await client.run(agent, text="fine again", timeout=120)
        assert again[-1].type == "run:complete"
    finally:
        supervisor.terminate()
        await asyncio.wait_for(supervisor.wait(), 90)
        await collector


def test_only_a_death_in_careful_mode_at_the_named_record_is_charged() -> None:
    options = PoisonOptions(max_retries=3, retry_ttl_s=60.0)
    now_ms = int(time.time() * 1000)

    def charged(mark: IntakeMark, committed: int = 7) -> int:
        return CrashGuard._charged(mark, committed, options)

    # Many turns ran (not careful): no record is to blame, however often it happens.
    assert charged(IntakeMark(7, crashes=2, ts_ms=now_ms)) == 0
    # The record ran alone under a careful mark: one more on the mark's count.
    assert charged(IntakeMark(7, crashes=0, ts_ms=now_ms, careful=True)) == 1
    assert charged(IntakeMark(7, crashes=2, ts_ms=now_ms, careful=True)) == 3
    # The careful mark names a record that has been committed since: nobody was running.
    assert charged(IntakeMark(6, crashes=2, ts_ms=now_ms, careful=True)) == 0
    # A count older than retry_ttl_s starts again.
    assert charged(IntakeMark(7, crashes=2, ts_ms=now_ms - 120_000, careful=True)) == 1


def test_an_intake_mark_keeps_its_careful_flag_and_an_old_mark_reads_as_not_careful() -> None:
    careful = IntakeMark(3, crashes=1, worker="w", ts_ms=5, careful=True)
    data = {"offset": 3, "crashes": 1, "open": True, "worker": "w", "careful": True}
    assert IntakeMark.from_entry(data, 5) == careful
    del data["careful"]  # written before marks said whether they were careful
    assert IntakeMark.from_entry(data, 5) == IntakeMark(3, 1, True, "w", 5, careful=False)


def test_a_mark_this_process_left_open_is_no_crash() -> None:
    """A session that failed leaves its mark open; the same process, assigned the
    partition again, knows nobody died: it keeps the mark's mode and count."""
    options = PoisonOptions(max_retries=3, retry_ttl_s=60.0)
    now_ms = int(time.time() * 1000)
    own = IntakeMark(7, crashes=2, ts_ms=now_ms, careful=True, process=PROCESS)
    assert CrashGuard.after(own, 7, options) == (True, 2)
    assert CrashGuard.after(IntakeMark(7, 0, ts_ms=now_ms, process=PROCESS), 7, options) == (
        False,
        0,
    )
    dead = IntakeMark(7, crashes=2, ts_ms=now_ms, careful=True, process="another process")
    assert CrashGuard.after(dead, 7, options) == (True, 3)
    assert CrashGuard.after(IntakeMark(7, 2, ts_ms=now_ms), 7, options) == (True, 0)
    assert CrashGuard.after(IntakeMark(7, 2, open=False), 7, options) == (False, 0)
    assert CrashGuard.after(None, 7, options) == (False, 0)
