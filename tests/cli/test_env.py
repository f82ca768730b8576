"""Every option of ``worker``, ``gateway`` and ``ui`` from a ``PYRULA_*`` variable, as a
pod's ConfigMap or Secret sets them: flags win over the environment, the environment
over defaults, and a bad value is refused naming its variable."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyrula_stream import WorkerOptions
from pyrula_stream._version import __version__
from pyrula_stream.cli import FROM_ENVIRONMENT, build_parser
from pyrula_stream.cli.env import env_name, env_options

ROOT = Path(__file__).parents[2]
WORKER = ["worker", "tests.agents.echo:echo"]


def parse(argv: list[str], **environ: str) -> argparse.Namespace:
    return build_parser(environ).parse_args(argv)


def run_cli(*args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    """The real command, in a process of its own, with ``environ`` added."""
    return subprocess.run(
        [sys.executable, "-m", "pyrula_stream.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **environ},
    )


def test_a_variable_sets_what_the_command_line_does_not() -> None:
    args = parse(
        WORKER,
        PYRULA_MAX_CONCURRENT_TURNS="7",
        PYRULA_HEALTH_PORT="9464",
        PYRULA_HEALTH_HOST="0.0.0.0",
        PYRULA_LOG_FORMAT="json",
        PYRULA_SHUTDOWN_GRACE="12.5",
        PYRULA_STATIC_MEMBERSHIP="true",
        PYRULA_WORKER_ID="pod-3",
    )
    assert args.max_concurrent_turns == 7
    assert args.health_port == 9464
    assert args.health_host == "0.0.0.0"
    assert args.log_format == "json"
    assert args.shutdown_grace == 12.5
    assert args.static_membership is True
    assert args.worker_id == "pod-3"
    assert not args.env_errors


def test_a_flag_wins_over_its_variable_and_defaults_stay_without_one() -> None:
    args = parse([*WORKER, "--max-concurrent-turns", "3"], PYRULA_MAX_CONCURRENT_TURNS="7")
    assert args.max_concurrent_turns == 3
    plain = parse(WORKER)
    assert plain.max_concurrent_turns == 50
    assert plain.health_host == "127.0.0.1"
    assert plain.static_membership is False


def test_switches_take_true_and_false_words() -> None:
    assert parse(WORKER, PYRULA_STATIC_MEMBERSHIP="0").static_membership is False
    assert parse(WORKER, PYRULA_STATIC_MEMBERSHIP="YES").static_membership is True
    assert parse(["ui"], PYRULA_ALLOW_ACTIONS="on").allow_actions is True


def test_a_repeatable_option_takes_a_list_that_a_flag_replaces() -> None:
    hosts = "api.example.com, agents.example.com"
    args = parse(["gateway", "--agent", "a"], PYRULA_ALLOWED_HOSTS=hosts)
    assert args.allowed_hosts == ["api.example.com", "agents.example.com"]
    flagged = parse(
        ["gateway", "--agent", "a", "--allowed-hosts", "x.example"], PYRULA_ALLOWED_HOSTS=hosts
    )
    assert flagged.allowed_hosts == ["x.example"]
    twice = parse(["ui", "--reviewer", "ann", "--reviewer", "bob"], PYRULA_REVIEWER="zed")
    assert twice.reviewer == ["ann", "bob"]


def test_gateway_and_ui_options_come_from_the_environment() -> None:
    gw = parse(
        ["gateway", "--agent", "a"],
        PYRULA_HOST="0.0.0.0",
        PYRULA_PORT="8080",
        PYRULA_TIMEOUT="2.5",
        PYRULA_API_KEYS_FILE="/etc/pyrula/keys",
    )
    assert (gw.host, gw.port, gw.timeout, gw.api_keys) == ("0.0.0.0", 8080, 2.5, "/etc/pyrula/keys")
    ui = parse(["ui"], PYRULA_PORT="9000", PYRULA_MAX_TURNS="20", PYRULA_HOST="0.0.0.0")
    assert (ui.port, ui.max_turns, ui.host) == (9000, 20, "0.0.0.0")


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("PYRULA_MAX_CONCURRENT_TURNS", "lots", "invalid int value: 'lots'"),
        ("PYRULA_LOG_FORMAT", "yaml", "expected one of text, json"),
        ("PYRULA_STATIC_MEMBERSHIP", "maybe", "expected 1/true/yes/on"),
        ("PYRULA_HEALTH_PORT", "http", "invalid int value"),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(variable: str, value: str, says: str) -> None:
    done = run_cli(*WORKER, **{variable: value})
    assert done.returncode == 2
    assert f"${variable}" in done.stderr and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_gateway_value_does_not_stop_another_command() -> None:
    args = parse(["submit", "agent", "text=hi"], PYRULA_PORT="eighty")
    assert not getattr(args, "env_errors", None)
    assert parse(["gateway", "--agent", "a"], PYRULA_PORT="eighty").env_errors == [
        "$PYRULA_PORT: invalid int value: 'eighty'"
    ]


def test_the_help_names_the_variable_of_every_option() -> None:
    sub = next(a for a in build_parser({})._actions if isinstance(a, argparse._SubParsersAction))
    for command in FROM_ENVIRONMENT:
        text = sub.choices[command].format_help()
        for action in env_options(sub.choices[command]):
            assert env_name(action) in text, (command, action.dest)
    assert env_name(next(a for a in env_options(sub.choices["ui"]) if a.dest == "api_keys")) == (
        "PYRULA_API_KEYS_FILE"
    )


def test_version() -> None:
    done = run_cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"pyrula-stream {__version__}"


def test_the_default_drain_ends_within_kubernetes_default_grace_period() -> None:
    """Kubernetes kills a pod 30 s after SIGTERM unless told otherwise: a default drain
    that takes its full time must leave room to commit and leave the group."""
    kubernetes_default_grace_s = 30.0
    handover_s = 5.0
    assert WorkerOptions().shutdown_grace + handover_s <= kubernetes_default_grace_s
    assert parse(WORKER).shutdown_grace == WorkerOptions().shutdown_grace


def test_the_container_docs_list_every_variable() -> None:
    """docs/containers.md is where a pod's author looks them up: none may be missing."""
    text = (ROOT / "docs" / "containers.md").read_text()
    sub = next(a for a in build_parser({})._actions if isinstance(a, argparse._SubParsersAction))
    missing = {
        env_name(action)
        for command in FROM_ENVIRONMENT
        for action in env_options(sub.choices[command])
        if f"`{env_name(action)}`" not in text
    }
    assert not missing, f"add to docs/containers.md: {sorted(missing)}"
