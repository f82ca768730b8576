"""Client configuration shared by every producer, consumer and admin client we create."""

from __future__ import annotations

import logging
from typing import Any

librdkafka_logger = logging.getLogger("pyrula_stream.librdkafka")


def base_config(bootstrap_servers: str, **overrides: Any) -> dict[str, Any]:
    """Bootstrap plus routing librdkafka's log lines into Python logging (not stderr)."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "logger": librdkafka_logger,
        "log_level": 3,
    }
    conf.update({k.replace("_", "."): v for k, v in overrides.items()})
    return conf
