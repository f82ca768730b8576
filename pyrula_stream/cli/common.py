"""What every command shares: finding the agent, the cluster and its settings; event lines."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyrula_stream.errors import (
    ConfigurationError,
)

if TYPE_CHECKING:
    from pyrula_stream.access.http_guard import HTTPAccess
    from pyrula_stream.kafka.config import KafkaSettings


KAFKA_TIMEOUT_S = 30.0
"""Default for ``--timeout``: how long a command waits on Kafka (and on a turn's next event)."""


def load_agent(spec: str) -> Any:
    """``MODULE:AGENT`` → the ``KafkaAgent`` object (the module is imported)."""
    from pyrula_stream.agent.definition import KafkaAgent

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"expected MODULE:AGENT, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise ConfigurationError(
                f"no module named '{module_name}' (from {spec}): run from the directory "
                "that holds it, or add that directory to PYTHONPATH"
            ) from None
        raise ConfigurationError(f"importing '{module_name}' failed: {exc}") from None
    agent = getattr(module, attr, None)
    if agent is None:
        raise ConfigurationError(f"module '{module_name}' has no '{attr}' (from {spec})")
    if not isinstance(agent, KafkaAgent):
        raise ConfigurationError(f"{spec} is not a @kafka_agent (got {type(agent).__name__})")
    return agent


def state_file() -> Path:
    from pyrula_stream.kafka.local.bootstrap import state_file as broker_state_file

    return broker_state_file()


def kafka_config_from(args: argparse.Namespace) -> KafkaSettings:
    """--kafka-config FILE, else the file in PYRULA_KAFKA_CONFIG, then the
    PYRULA_KAFKA_* variables over it (``kafka.config.settings_from_env``)."""
    from pyrula_stream.kafka.config import settings_from_env

    return settings_from_env(getattr(args, "kafka_config", None))


def bootstrap_from(args: argparse.Namespace) -> str:
    """--bootstrap-servers, else KAFKA_BOOTSTRAP_SERVERS, else the config file's
    ``bootstrap.servers``, else the broker `broker start` ran."""
    if getattr(args, "bootstrap_servers", None):
        return str(args.bootstrap_servers)
    from pyrula_stream.kafka.local.bootstrap import find_bootstrap

    return find_bootstrap(kafka_config_from(args))


def parse_params(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; a value that parses as JSON is used as JSON, else as text."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigurationError(f"expected key=value, got {pair!r}")
        try:
            params[key] = json.loads(raw)
        except ValueError:
            params[key] = raw
    return params


def format_event(event: Any) -> str:
    """One line per event, for people."""
    data = event.data
    detail = {
        "run:start": lambda: json.dumps(data.get("params", {}), ensure_ascii=False),
        "llm:delta": lambda: repr(data.get("text", "")),
        "llm:complete": lambda: (
            f"{len(data.get('tool_calls', []))} tool call(s)"
            if data.get("tool_calls")
            else repr(data.get("text", ""))[:120]
        ),
        "tool:start": lambda: f"{data.get('tool')}({json.dumps(data.get('input', {}))})",
        "tool:result": lambda: (
            f"{data.get('tool')} {data.get('status')}: {str(data.get('output', ''))[:100]}"
        ),
        "status": lambda: str(data.get("text", "")),
        "run:interrupted": lambda: (
            f"{data.get('reason')} {data.get('key')}"
            + (
                f" {data.get('tool_name')}({json.dumps(data.get('tool_input', {}))})"
                if data.get("tool_name")
                else f" {json.dumps(data.get('question'), ensure_ascii=False)[:100]}"
            )
        ),
        "run:complete": lambda: json.dumps(data.get("result"), ensure_ascii=False)[:200],
        "run:error": lambda: f"{data.get('code')}: {data.get('message')}",
    }.get(event.type, lambda: json.dumps(data)[:200])()
    return f"{event.turn_id[:8]} #{event.seq:<3} {event.type:<13} {detail}"


def positive_seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text}")
    return value


Commands = argparse._SubParsersAction
"""What a ``cli`` module adds its subcommands to, in its ``register(sub)``."""


def with_bootstrap(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of every command that talks to a cluster."""
    p.add_argument(
        "--bootstrap-servers",
        help="default: $KAFKA_BOOTSTRAP_SERVERS, "
        "else the broker `broker start` ran, else 127.0.0.1:9092",
    )
    p.add_argument(
        "--kafka-config",
        metavar="FILE",
        help="librdkafka client properties (key=value, # comments) for every client: "
        "security.protocol, sasl.*, ssl.*, client.id; default: $PYRULA_KAFKA_CONFIG",
    )
    p.add_argument("--prefix", default="pyrula")
    return p


def add_access_arguments(p: argparse.ArgumentParser) -> None:
    """``--api-keys``, ``--allowed-hosts``, ``--allow-unauthenticated`` and
    ``--allow-short-api-keys``: the same options on every command that serves HTTP."""
    p.add_argument(
        "--api-keys",
        metavar="FILE",
        default=None,
        help="name=key lines; every request then needs Authorization: Bearer <key> "
        "(the principal is the key's name)",
    )
    p.add_argument(
        "--allowed-hosts",
        metavar="HOST[,HOST]",
        action="append",
        default=[],
        help="Host header names served besides localhost, 127.0.0.1, [::1] and --host; "
        "repeatable; * for any",
    )
    p.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve beyond loopback without --api-keys (something in front checks callers)",
    )
    p.add_argument(
        "--allow-short-api-keys",
        action="store_true",
        help="take keys under 32 characters from --api-keys (refused otherwise)",
    )


def access_from(args: argparse.Namespace) -> HTTPAccess:
    """The ``HTTPAccess`` the options of ``add_access_arguments`` describe."""
    from pyrula_stream.access.api_keys import load_api_keys
    from pyrula_stream.access.http_guard import HTTPAccess

    hosts = tuple(h.strip() for item in args.allowed_hosts for h in item.split(",") if h.strip())
    return HTTPAccess(
        auth=(
            load_api_keys(args.api_keys, allow_short_keys=args.allow_short_api_keys)
            if args.api_keys
            else None
        ),
        allowed_hosts=hosts,
        allow_unauthenticated=args.allow_unauthenticated,
    )


def warn_if_open(host: str, access: HTTPAccess) -> None:
    """Say so on stderr when a face serves beyond loopback without keys."""
    from pyrula_stream.access.http_guard import is_loopback

    if access.auth is None and not is_loopback(host):
        print(
            f"warning: serving on {host} without API keys (--allow-unauthenticated): "
            "anyone who reaches the port may use it",
            file=sys.stderr,
            flush=True,
        )


def add_object_store_argument(parser: argparse.ArgumentParser) -> None:
    """``--object-store URL``: where values too big for a record are (docs/large-payloads.md)."""
    parser.add_argument(
        "--object-store",
        default=None,
        metavar="URL",
        help="file:///DIR (or a directory) or s3://BUCKET/PREFIX: large values go there by "
        "reference, and references are read back from it (docs/large-payloads.md)",
    )
