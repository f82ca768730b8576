"""``pyrula-stream tenants``: operators' per-tenant limits, changed without a deploy.

``tenants set AGENT TENANT key=value ...`` writes the tenant's override to the compacted
``<prefix>.<agent>.tenants`` topic (merged over its earlier override; ``key=none``
uncaps that limit, ``--clear`` drops the override); every worker of the agent follows
the topic and applies it to the next admission and model call, without a restart.
``tenants show AGENT`` prints each override and the tenant's usage now, one JSON line
per tenant.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from pyrula_stream.cli.common import (
    KAFKA_TIMEOUT_S,
    Commands,
    bootstrap_from,
    kafka_config_from,
    positive_seconds,
    with_bootstrap,
)
from pyrula_stream.errors import UserError


def _topics(args: argparse.Namespace) -> tuple[str, str]:
    base = f"{args.prefix}.{args.agent}"
    return f"{base}.tenants", f"{base}.tenant-usage"


def _overrides(args: argparse.Namespace, topic: str) -> dict[str, dict[str, Any]]:
    """Each tenant's override as the topic holds it now (latest record per key)."""
    from pyrula_stream.kafka.consumers import read_topic

    found: dict[str, dict[str, Any]] = {}
    for record in read_topic(
        bootstrap_from(args),
        topic,
        timeout_s=args.timeout,
        kafka_config=kafka_config_from(args),
        group_id=f"{topic}.readers",  # the group the operator's ACLs grant (acls.py)
    ):
        if record.value is None:
            found.pop(record.key, None)
        else:
            found[record.key] = json.loads(record.value)
    return found


def cmd_set(args: argparse.Namespace) -> int:
    from pyrula_stream.agent.tenants import TenantLimits, parse_limit
    from pyrula_stream.kafka.io import RecordProducer
    from pyrula_stream.runtime.quotas import override_value
    from pyrula_stream.wire.records import JSON_CONTENT_TYPE

    if not args.values and not args.clear:
        raise UserError("give limits as key=value (e.g. tokens_per_minute=20000) or --clear")
    topic, _ = _topics(args)
    value: bytes | None = None
    if not args.clear:
        limits = dict(_overrides(args, topic).get(args.tenant, {}))
        for pair in args.values:
            name, sep, text = pair.partition("=")
            if not sep:
                raise UserError(f"expected key=value, got {pair!r}")
            limits[name] = parse_limit(name, text)
        TenantLimits(**limits)  # refuses a value the workers would refuse
        value = override_value(limits)
    producer = RecordProducer(
        bootstrap_from(args), timeout_s=args.timeout, kafka_config=kafka_config_from(args)
    )
    try:
        producer.send_sync(topic, args.tenant.encode(), value, [JSON_CONTENT_TYPE])
    finally:
        producer.close()
    print(json.dumps({"tenant": args.tenant, "override": None if value is None else limits}))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from pyrula_stream.kafka.consumers import read_topic
    from pyrula_stream.runtime.quotas import fold_usage

    topic, usage_topic = _topics(args)
    overrides = _overrides(args, topic)
    records = read_topic(
        bootstrap_from(args),
        usage_topic,
        timeout_s=args.timeout,
        kafka_config=kafka_config_from(args),
        group_id=f"{usage_topic}.readers",
    )
    usage = fold_usage(records, int(time.time() * 1000))
    for tenant in sorted(set(overrides) | set(usage)):
        minute, day = usage.get(tenant, (None, None))
        print(
            json.dumps(
                {
                    "tenant": tenant,
                    "override": overrides.get(tenant),
                    "minute": vars(minute) if minute is not None else None,
                    "day": vars(day) if day is not None else None,
                }
            )
        )
    return 0


def register(sub: Commands[argparse.ArgumentParser]) -> None:
    """``tenants set`` and ``tenants show``."""
    t = sub.add_parser("tenants", help="per-tenant limits of an agent with tenant=")
    t_sub = t.add_subparsers(dest="tenants_command", required=True)
    s = with_bootstrap(t_sub.add_parser("set", help="AGENT TENANT key=value ... (or --clear)"))
    s.add_argument("agent")
    s.add_argument("tenant")
    s.add_argument("values", nargs="*")
    s.add_argument("--clear", action="store_true", help="drop the override: code's limits hold")
    s.add_argument("--timeout", type=positive_seconds, default=KAFKA_TIMEOUT_S)
    s.set_defaults(func=cmd_set)
    sh = with_bootstrap(t_sub.add_parser("show", help="each tenant's override and usage now"))
    sh.add_argument("agent")
    sh.add_argument("--timeout", type=positive_seconds, default=KAFKA_TIMEOUT_S)
    sh.set_defaults(func=cmd_show)
