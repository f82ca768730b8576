"""Where the cluster is when nobody says: one answer for the CLI, the client and the worker.

A newcomer starts a broker with ``pyrula-stream broker start`` (which picks a free port)
and then runs Python; the client must find that broker as the CLI does, not a hard-coded
``localhost:9092``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyrula_stream.kafka.config import resolve
from pyrula_stream.kafka.local.broker import cache_root

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"


def state_file() -> Path:
    """The file ``pyrula-stream broker start`` writes: the running broker's address."""
    return cache_root() / "broker.json"


def find_bootstrap(kafka_config: Mapping[str, Any] | None = None) -> str:
    """``$KAFKA_BOOTSTRAP_SERVERS``, else ``bootstrap.servers`` of the settings (default:
    the file in ``PYRULA_KAFKA_CONFIG`` and the ``PYRULA_KAFKA_*`` variables), else the
    broker ``pyrula-stream broker start`` ran, else ``127.0.0.1:9092``."""
    env = os.environ.get(BOOTSTRAP_ENV)
    if env:
        return env
    from_settings = resolve(kafka_config).get("bootstrap.servers")
    if from_settings:
        return str(from_settings)
    path = state_file()
    if path.exists():
        return str(json.loads(path.read_text())["bootstrap_servers"])
    return DEFAULT_BOOTSTRAP
