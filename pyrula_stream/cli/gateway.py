"""``pyrula-stream gateway``: submit and stream turns over HTTP and Server-Sent Events."""

from __future__ import annotations

import argparse
import contextlib
import os

from pyrula_stream.cli.common import (
    Commands,
    access_from,
    add_access_arguments,
    add_object_store_argument,
    bootstrap_from,
    kafka_config_from,
    load_agent,
    positive_seconds,
    warn_if_open,
)
from pyrula_stream.errors import ConfigurationError
from pyrula_stream.gateway.options import MAX_UPLOAD_BYTES
from pyrula_stream.runtime.event_loop import EVENT_LOOPS

API_KEYS_ENV = "PYRULA_API_KEYS"
"""``name=key`` lines (or ``name=key,name=key``) when ``--api-keys`` is not given."""


def cmd_gateway(args: argparse.Namespace) -> int:
    try:
        from pyrula_stream.gateway.app import GATEWAY_EXPOSES, create_app
        from pyrula_stream.gateway.options import AppOptions
        from pyrula_stream.gateway.serve import run_gateway_server
    except ImportError as exc:
        raise ConfigurationError(
            f"the gateway needs the gateway extra: pip install 'pyrula-stream[gateway]' ({exc})"
        ) from None
    from pyrula_stream.access.api_keys import parse_api_keys
    from pyrula_stream.access.http_guard import check_bind
    from pyrula_stream.access.tenant_signature import load_tenant_key

    if args.static is not None and not os.path.isdir(args.static):
        raise ConfigurationError(f"--static {args.static}: no such directory")
    agents = [load_agent(spec) for spec in args.agents] + list(args.agent)
    if not agents:
        raise ConfigurationError("name the agents to serve: MODULE:AGENT or --agent NAME")
    access = access_from(args)
    if access.auth is None and os.environ.get(API_KEYS_ENV):
        text = os.environ[API_KEYS_ENV].replace(",", "\n")
        access = type(access)(
            auth=parse_api_keys(
                text, source=f"${API_KEYS_ENV}", allow_short_keys=args.allow_short_api_keys
            ),
            allowed_hosts=access.allowed_hosts,
            allow_unauthenticated=access.allow_unauthenticated,
        )
    check_bind(args.host, access, exposes=GATEWAY_EXPOSES)  # before saying it serves
    options = AppOptions(
        bootstrap_servers=bootstrap_from(args),
        prefix=args.prefix,
        topic_prefix=args.topic_prefix,
        kafka_config=kafka_config_from(args),
        auth=access.auth,
        host=args.host,
        allowed_hosts=access.allowed_hosts,
        allow_unauthenticated=access.allow_unauthenticated,
        kafka_timeout=args.timeout,
        static_dir=args.static,
        tenants=tenant_mapping(args.tenant),
        tenant_key=load_tenant_key(args.tenant_key_file) if args.tenant_key_file else None,
        object_store=args.object_store or None,
        max_upload_bytes=args.max_upload_bytes,
        upload_limits=upload_limits(args.upload_limit),
    )
    app = create_app(agents=agents, options=options)
    warn_if_open(args.host, access)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"pyrula-stream gateway on http://{shown}:{args.port}{args.prefix}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn stops gracefully, then re-raises
        run_gateway_server(app, args.host, args.port, args.event_loop)
    return 0


def tenant_mapping(pairs: list[str]) -> dict[str, str]:
    """``--tenant PRINCIPAL=TENANT`` pairs as a mapping (a principal named twice is refused)."""
    mapping: dict[str, str] = {}
    for pair in pairs:
        principal, sep, tenant = pair.partition("=")
        if not sep or not principal.strip() or not tenant.strip():
            raise ConfigurationError(f"--tenant {pair!r}: expected PRINCIPAL=TENANT")
        if principal.strip() in mapping:
            raise ConfigurationError(f"--tenant: principal {principal.strip()!r} named twice")
        mapping[principal.strip()] = tenant.strip()
    return mapping


def upload_limits(pairs: list[str]) -> dict[str, int]:
    """``--upload-limit NAME=BYTES`` pairs: one key's own upload limit."""
    limits: dict[str, int] = {}
    for pair in pairs:
        name, sep, size = pair.partition("=")
        if not sep or not name.strip() or not size.strip().isdigit() or int(size) < 1:
            raise ConfigurationError(f"--upload-limit {pair!r}: expected NAME=BYTES (BYTES >= 1)")
        if name.strip() in limits:
            raise ConfigurationError(f"--upload-limit: key {name.strip()!r} named twice")
        limits[name.strip()] = int(size)
    return limits


def register(sub: Commands[argparse.ArgumentParser]) -> None:
    """``gateway``."""
    g = sub.add_parser("gateway", help="serve agents over HTTP and Server-Sent Events")
    g.add_argument(
        "agents",
        nargs="*",
        metavar="MODULE:AGENT",
        help="agents whose parameters the gateway checks before producing (422 if bad)",
    )
    g.add_argument(
        "--agent",
        action="append",
        default=[],
        metavar="NAME",
        help="an agent served by name only: parameters are forwarded, the worker checks them",
    )
    g.add_argument("--host", default="127.0.0.1", help="bind address")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--prefix", default="/agents", help="the HTTP path of the routes")
    g.add_argument(
        "--bootstrap-servers",
        help="default: $KAFKA_BOOTSTRAP_SERVERS, "
        "else the broker `broker start` ran, else 127.0.0.1:9092",
    )
    g.add_argument(
        "--kafka-config",
        metavar="FILE",
        help="librdkafka client properties (key=value) for every client; "
        "default: $PYRULA_KAFKA_CONFIG",
    )
    g.add_argument(
        "--topic-prefix", default="pyrula", help="the Kafka topic prefix of --agent NAME agents"
    )
    g.add_argument(
        "--timeout",
        type=positive_seconds,
        default=10.0,
        help="seconds a request waits on Kafka before answering 503 store_unavailable",
    )
    g.add_argument(
        "--static",
        metavar="DIR",
        default=None,
        help="serve DIR at / (a web page, e.g. examples/web_chat); with keys the page signs "
        "in at /login",
    )
    g.add_argument(
        "--tenant",
        action="append",
        default=[],
        metavar="PRINCIPAL=TENANT",
        help="the tenant of a key's turns (default: the key's name); repeatable",
    )
    g.add_argument(
        "--tenant-key-file",
        metavar="FILE",
        default=None,
        help="sign each turn's tenant with the workers' tenant key in FILE",
    )
    add_object_store_argument(g)
    g.add_argument(
        "--max-upload-bytes",
        type=int,
        default=MAX_UPLOAD_BYTES,
        help="the most one upload (POST <prefix>/<agent>/uploads), or one turn's body with "
        f"--object-store, may hold (default {MAX_UPLOAD_BYTES}); past it, 413",
    )
    g.add_argument(
        "--upload-limit",
        action="append",
        default=[],
        metavar="NAME=BYTES",
        help="the API key NAME's own upload limit instead of --max-upload-bytes; repeatable",
    )
    g.add_argument(
        "--event-loop",
        default=None,
        choices=list(EVENT_LOOPS),
        help="the gateway's event loop (default: $PYRULA_EVENT_LOOP, else uvloop when "
        "installed, else asyncio)",
    )
    add_access_arguments(g)
    g.set_defaults(func=cmd_gateway)
