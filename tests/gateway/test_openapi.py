"""``GET /openapi.json``: the gateway's routes with named request and response models, and
the answers a real gateway gives validate against them (so the document cannot drift
from the code)."""

from __future__ import annotations

from typing import Any

import httpx
from jsonschema import Draft202012Validator

from pyrula_stream import AgentContext, kafka_agent
from pyrula_stream.gateway import AgentClient, create_app
from pyrula_stream.gateway.openapi import parameters_model_name
from pyrula_stream.gateway.serve import running_gateway
from pyrula_stream.llm import FakeLLM
from pyrula_stream.testing import running_worker, unique_name
from tests.gateway.test_gateway import AS_WEB, options


def _check(document: dict[str, Any], model: str, value: Any) -> list[str]:
    """Errors of ``value`` against ``#/components/schemas/<model>``."""
    schema = {"$ref": f"#/components/schemas/{model}", "components": document["components"]}
    return [e.message for e in Draft202012Validator(schema).iter_errors(value)]


async def test_the_document_names_its_models_and_the_gateway_answers_by_them(
    kafka_bootstrap_servers: str,
) -> None:
    @kafka_agent(name=unique_name("openapi-bot"), llm=FakeLLM(["fine"]))
    async def agent(ctx: AgentContext, question: str, urgent: bool = False) -> str:
        return await ctx.llm.run([{"role": "user", "content": question}])

    app = create_app(agents=[agent], options=options(kafka_bootstrap_servers))
    async with (
        running_worker(agent, kafka_bootstrap_servers),
        running_gateway(app) as url,
        AgentClient(url, headers=AS_WEB) as web,
        httpx.AsyncClient(base_url=url, timeout=30, follow_redirects=True) as http,
    ):
        assert (await http.get("/openapi.json")).status_code == 401  # behind the guard
        found = await http.get("/openapi.json", headers=AS_WEB)
        document = found.json()
        accepted = await http.post(
            f"/agents/{agent.name}/turns", json={"question": "hi"}, headers=AS_WEB
        )
        refused = await http.post(
            f"/agents/{agent.name}/turns", json={"urgent": "x"}, headers=AS_WEB
        )
        await web.run(agent.name, question="hello")
        status = await http.get(accepted.json()["status_url"], headers=AS_WEB)

    assert found.status_code == 200 and found.url.path == "/agents/openapi.json"
    assert document["openapi"].startswith("3.") and document["servers"] == [{"url": "/agents"}]
    submit = document["paths"]["/{agent}/turns"]["post"]
    params = parameters_model_name(agent.name)
    assert submit["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": f"#/components/schemas/{params}"
    }
    assert submit["responses"]["202"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/TurnAccepted"
    )
    assert {"401", "404", "422", "429", "503"} <= set(submit["responses"])
    agent_param = next(p for p in submit["parameters"] if p["name"] == "agent")
    assert agent_param["schema"]["enum"] == [agent.name]
    assert set(document["components"]["schemas"][params]["required"]) == {"question"}

    assert accepted.status_code == 202
    assert _check(document, "TurnAccepted", accepted.json()) == []
    assert refused.status_code == 422
    assert _check(document, "ErrorBody", refused.json()) == []
    assert _check(document, params, {"urgent": True}) != []  # question is required
    assert _check(document, "TurnStatus", status.json()) == []
    assert _check(document, "TurnStatus", {"turn_id": "t", "state": "lost"}) != []
