"""Per-key rate limits on the gateway and the UI (issue 46): one caller past its rate gets
``429`` with ``Retry-After``, and another caller is not held back by it. Real HTTP."""

from __future__ import annotations

import httpx

from pyrula_stream.access.api_keys import APIKeyAuth
from pyrula_stream.access.http_guard import HTTPAccess
from pyrula_stream.access.rate_limit import RatePolicy
from pyrula_stream.gateway import AppOptions, create_app
from pyrula_stream.gateway.serve import running_gateway
from pyrula_stream.ui.feed import FeedOptions
from pyrula_stream.ui.server import UIOptions, running_ui

WEB, OPS = "k-web-0123456789abcdef0123456789abcdef", "k-ops-fedcba9876543210fedcba9876543210"
KEYS = APIKeyAuth({"web": WEB, "ops": OPS})
SLOW = RatePolicy(per_second=0.05, burst=3)
"""Three at once, then one per 20 s: a test's few requests never earn a fresh token."""


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_the_gateway_holds_each_key_to_its_rate(kafka_bootstrap_servers: str) -> None:
    options = AppOptions(bootstrap_servers=kafka_bootstrap_servers, auth=KEYS, rate_limit=SLOW)
    app = create_app(agents=["anyagent"], options=options)
    async with (
        running_gateway(app) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        web = [(await http.get("/agents/", headers=bearer(WEB))) for _ in range(5)]
        ops = await http.get("/agents/", headers=bearer(OPS))
        probe = await http.get("/healthz")
    assert [r.status_code for r in web] == [200, 200, 200, 429, 429]
    assert web[3].json()["code"] == "backpressure_rejected"
    assert int(web[3].headers["retry-after"]) >= 1
    assert ops.status_code == 200, "another key has its own bucket"
    assert probe.status_code == 200, "the probes are not limited"


async def test_the_ui_holds_each_key_to_its_rate() -> None:
    feed = FeedOptions("127.0.0.1:9")  # never contacted by the routes asked here
    access = HTTPAccess(auth=KEYS)
    options = UIOptions(port=0, access=access, rate_limit=SLOW)
    async with (
        running_ui(feed, options) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        web = [(await http.get("/", headers=bearer(WEB))) for _ in range(4)]
        ops = await http.get("/", headers=bearer(OPS))
    assert [r.status_code for r in web] == [200, 200, 200, 429]
    assert ops.status_code == 200
