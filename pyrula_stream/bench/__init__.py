"""The benchmark (floor 9): what pyrula-stream costs on top of Kafka, measured against
the floor.

``python -m pyrula_stream.bench`` (``make bench``) runs five phases against a local broker
(or ``--bootstrap-servers`` / ``KAFKA_BOOTSTRAP_SERVERS``) on ``FakeLLM``: throughput
against a raw confluent-kafka loop, per-turn overhead, turns in flight and memory, journal
bytes per step, and restore speed. See ``docs/BENCHMARKS.md`` for what each figure means.
A benchmark is not a test: the suite only runs it at ``--quick`` size to prove it works.
"""

from __future__ import annotations

from pyrula_stream.bench.runner import PHASES, BenchConfig, run_all

__all__ = ["PHASES", "BenchConfig", "run_all"]
