"""The `pyrula-stream` commands, run as a user would run them."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pyrula_stream.cli import build_parser
from pyrula_stream.kafka.local.broker import free_port
from pyrula_stream.testing import unique_name

ROOT = Path(__file__).parents[2]


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pyrula_stream.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_topics_apply_reports_drift_with_a_nonzero_exit(kafka_bootstrap_servers: str) -> None:
    agent = unique_name("cli")
    created = cli(
        "topics",
        "apply",
        agent,
        "--partitions",
        "2",
        "--bootstrap-servers",
        kafka_bootstrap_servers,
    )
    assert created.returncode == 0, created.stderr
    assert f"created pyrula.{agent}.journal" in created.stdout
    same = cli(
        "topics",
        "apply",
        agent,
        "--partitions",
        "2",
        "--bootstrap-servers",
        kafka_bootstrap_servers,
    )
    assert same.returncode == 0
    assert f"ok      pyrula.{agent}.turns" in same.stdout
    drift = cli(
        "topics",
        "apply",
        agent,
        "--partitions",
        "3",
        "--bootstrap-servers",
        kafka_bootstrap_servers,
    )
    assert drift.returncode == 2
    assert f"DRIFT   pyrula.{agent}.turns: partitions is 2, spec says 3" in drift.stdout


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_worker_submit_tail_and_graceful_sigterm(kafka_bootstrap_servers: str, loop: str) -> None:
    agent = unique_name("echo")
    env = {"ECHO_AGENT_NAME": agent}
    port = free_port()
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pyrula_stream.cli",
            "--verbose",
            "worker",
            "tests.agents.echo:echo",
            "--bootstrap-servers",
            kafka_bootstrap_servers,
            "--worker-id",
            "cli-1",
            "--event-loop",
            loop,
            "--health-port",
            str(port),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if http_status(f"http://127.0.0.1:{port}/readyz") == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert http_status(f"http://127.0.0.1:{port}/livez") == 200

        submitted = cli(
            "submit",
            agent,
            "text=hello",
            "--wait",
            "--bootstrap-servers",
            kafka_bootstrap_servers,
            env=env,
        )
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        turn_id = submitted.stdout.splitlines()[0]
        assert "run:complete" in submitted.stdout
        assert "shout ok: HELLO" in submitted.stdout

        tailed = cli(
            "tail",
            agent,
            "--turn",
            turn_id,
            "--from-beginning",
            "--timeout",
            "30",
            "--bootstrap-servers",
            kafka_bootstrap_servers,
        )
        assert tailed.returncode == 0
        lines = tailed.stdout.splitlines()
        assert "run:start" in lines[0] and "run:complete" in lines[-1]
    finally:
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, output
    assert f"event loop: {loop}" in output


def test_submit_rejects_malformed_params() -> None:
    result = cli("submit", "x", "novalue", "--bootstrap-servers", "127.0.0.1:1")
    assert result.returncode == 2
    assert "expected key=value" in result.stderr


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_broker_start_brings_back_the_same_port_and_topics_unless_fresh(tmp_path: Path) -> None:
    from pyrula_stream.kafka.local.broker import cache_root, fetch_jars

    jars = fetch_jars()  # shared jar cache; only the state file goes to tmp_path
    env = {"PYRULA_STREAM_CACHE": str(tmp_path)}
    (tmp_path / jars.parent.name).symlink_to(jars.parent)
    assert cache_root() != tmp_path

    def start(*flags: str) -> str:
        started = cli("broker", "start", *flags, env=env)
        assert started.returncode == 0, started.stderr
        return started.stdout.strip().splitlines()[-1]

    def apply_topics(bootstrap: str) -> str:
        applied = cli("topics", "apply", "kept", "--bootstrap-servers", bootstrap)
        assert applied.returncode == 0, applied.stderr
        return applied.stdout

    try:
        bootstrap = start()
        assert bootstrap.startswith("127.0.0.1:")
        status = cli("broker", "status", env=env)
        assert status.returncode == 0 and "running pid" in status.stdout
        assert "created pyrula.kept.turns" in apply_topics(bootstrap)
        assert cli("broker", "stop", env=env).returncode == 0
        stopped = cli("broker", "status", env=env)
        assert stopped.returncode == 1
        assert f"not running (last at {bootstrap})" in stopped.stdout

        assert start() == bootstrap  # a restart: same port, same topics
        assert "ok      pyrula.kept.turns" in apply_topics(bootstrap)
        refused = cli("broker", "start", "--fresh", env=env)
        assert refused.returncode == 2
        assert "run `pyrula-stream broker stop` before `broker start --fresh`" in refused.stderr

        assert cli("broker", "stop", env=env).returncode == 0
        fresh = start("--fresh")
        assert "created pyrula.kept.turns" in apply_topics(fresh)
    finally:
        stopped = cli("broker", "stop", env=env)
    assert stopped.returncode == 0
    assert cli("broker", "status", env=env).returncode == 1


# -- what a new user meets: one clear line, a non-zero exit, a bounded wait ----------------


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def test_worker_of_an_unknown_module_says_what_to_do_without_a_traceback() -> None:
    result = cli("worker", "nosuch:agent", "--bootstrap-servers", "127.0.0.1:1")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert last_line(result.stderr) == (
        "error: no module named 'nosuch' (from nosuch:agent): run from the directory "
        "that holds it, or add that directory to PYTHONPATH"
    )


def test_submit_to_an_agent_without_topics_says_how_to_create_them(
    kafka_bootstrap_servers: str,
) -> None:
    agent = unique_name("ghost")
    result = cli("submit", agent, "x=1", "--bootstrap-servers", kafka_bootstrap_servers)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert last_line(result.stderr) == (
        f"error: no topic pyrula.{agent}.turns: start a worker for '{agent}' or run "
        f"`pyrula-stream topics apply {agent}`"
    )


def test_submit_wait_without_a_worker_says_so_and_gives_up_at_its_timeout(
    kafka_bootstrap_servers: str,
) -> None:
    agent = unique_name("idle")
    applied = cli("topics", "apply", agent, "--bootstrap-servers", kafka_bootstrap_servers)
    assert applied.returncode == 0, applied.stderr
    result = cli(
        "submit",
        agent,
        "x=1",
        "--wait",
        "--timeout",
        "6",
        "--bootstrap-servers",
        kafka_bootstrap_servers,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    turn_id = result.stdout.splitlines()[0]
    hint = (
        f"no worker is running for '{agent}' (consumer group pyrula.{agent}.workers has no "
        f"members): start one with `pyrula-stream worker MODULE:{agent}`"
    )
    assert f"waiting for turn {turn_id}: {hint}" in result.stderr
    assert last_line(result.stderr) == f"error: no event of turn {turn_id} within 6s; {hint}"


def test_status_of_a_queued_turn_and_of_an_agent_without_topics(
    kafka_bootstrap_servers: str,
) -> None:
    agent = unique_name("queue")
    applied = cli("topics", "apply", agent, "--bootstrap-servers", kafka_bootstrap_servers)
    assert applied.returncode == 0, applied.stderr
    broker = ("--bootstrap-servers", kafka_bootstrap_servers)
    submitted = cli("submit", agent, "x=1", "--thread", "order-3", *broker)
    assert submitted.returncode == 0, submitted.stderr
    turn_id = submitted.stdout.strip()
    queued = cli("status", agent, turn_id, "--key", "order-3", *broker)
    assert queued.returncode == 0, queued.stderr
    assert json.loads(queued.stdout) == {
        "turn_id": turn_id,
        "state": "queued",
        "attempt": 0,
        "last_step": None,
        "code": None,
        "events": 0,
    }
    unknown = cli("status", agent, "no-such-turn", *broker)
    assert json.loads(unknown.stdout)["state"] == "unknown"
    ghost = cli("status", unique_name("ghost"), turn_id, *broker)
    assert ghost.returncode == 2
    assert "Traceback" not in ghost.stderr
    assert "start a worker for" in last_line(ghost.stderr)


def test_submit_to_a_wrong_address_fails_at_its_timeout_with_one_clear_line() -> None:
    port = free_port()  # nothing listens there
    result = cli(
        "submit", "support", "x=1", "--timeout", "1", "--bootstrap-servers", f"127.0.0.1:{port}"
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert last_line(result.stderr).startswith(
        f"error: cannot reach Kafka at 127.0.0.1:{port} within 1s"
    )
    assert "Connection refused" in last_line(result.stderr)
    # librdkafka retries every few tens of milliseconds; the user reads one line about it.
    assert len(result.stderr.splitlines()) <= 2, result.stderr


def test_each_cli_module_registers_its_commands() -> None:
    """The command list is the union of what cluster, running, turns, answers, tenants, dlq,
    evals, gateway and objects register."""
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(commands.choices) == [
        *["broker", "topics", "schema", "acls"],
        *["worker", "mcp", "ui"],
        *["submit", "status", "tail", "turn", "thread", "replay"],
        *["signal", "approve", "reject", "pending"],
        "tenants",
        "dlq",
        "evals",
        "gateway",
        "objects",
    ]
    args = parser.parse_args(["thread", "delete", "triage", "t-1", "--timeout", "5"])
    assert (args.agent, args.thread_id, args.timeout, args.prefix) == (
        "triage",
        "t-1",
        5.0,
        "pyrula",
    )
