"""The app is a FastAPI app: an operator's routes, dependencies and middleware work on
it the FastAPI way, over real HTTP (uvicorn on 127.0.0.1, the sim as upstream), and
``/docs`` and ``/openapi.json`` describe the proxy's own routes."""

from __future__ import annotations

from typing import Annotated, Any

import httpx
from fastapi import Depends, FastAPI, Header, HTTPException
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.app import create_app
from proxy.metrics import Metrics
from tests.support.inprocess import StartApp, make_settings
from tests.support.served import served
from tests.support.sim import SimUpstream

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class Tagging:
    """A pure-ASGI middleware the way an operator writes one: tags every answer."""

    def __init__(self, app: ASGIApp, seen: list[str]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.seen.append(scope["path"])

        async def tagged(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (b"x-operator", b"1")]}
            await send(message)

        await self.app(scope, receive, tagged)


# At module level: FastAPI resolves the (string) annotations in the module's namespace.
def tenant(x_tenant: Annotated[str | None, Header()] = None) -> str:
    if x_tenant is None:
        raise HTTPException(status_code=400, detail="X-Tenant is required")
    return x_tenant


def operator_app(sim: SimUpstream, seen: list[str]) -> FastAPI:
    """``create_app(...)``'s app with an operator's route (with a dependency) and two
    middleware: a pure-ASGI one and FastAPI's ``@app.middleware("http")``."""
    app = create_app(make_settings(sim.url, tokenizer="approx"), Metrics())

    @app.get("/operator/whoami")
    async def whoami(name: Annotated[str, Depends(tenant)]) -> dict[str, str]:
        return {"tenant": name}

    @app.middleware("http")
    async def timing(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        response.headers["x-operator-http"] = "1"
        return response

    app.add_middleware(Tagging, seen=seen)
    return app


async def test_an_operators_route_dependency_and_middleware_work(sim_upstream: SimUpstream) -> None:
    seen: list[str] = []
    async with served(operator_app(sim_upstream, seen)) as url, httpx.AsyncClient() as client:
        ok = await client.get(f"{url}/operator/whoami", headers={"x-tenant": "blue"})
        refused = await client.get(f"{url}/operator/whoami")
        chat = await client.post(f"{url}/v1/chat/completions", json=CHAT)
        health = await client.get(f"{url}/healthz")
    assert ok.status_code == 200 and ok.json() == {"tenant": "blue"}
    assert ok.headers["x-operator"] == "1" and ok.headers["x-operator-http"] == "1"
    # The dependency's HTTPException answers through the proxy's error envelope.
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "X-Tenant is required"
    # The chat route, served ahead of FastAPI's router, still passes both middleware.
    assert chat.status_code == 200 and chat.json()["choices"]
    assert chat.headers["x-operator"] == "1" and chat.headers["x-operator-http"] == "1"
    assert chat.headers["x-request-id"]  # and the proxy's own (Accounting)
    assert len(sim_upstream.chat_requests()) == 1
    assert health.json() == {"status": "ok"}
    assert seen == ["/operator/whoami", "/operator/whoami", "/v1/chat/completions", "/healthz"]


#: A small request on every prompt route of the dialect table.
PROMPTS = {
    "/v1/chat/completions": CHAT,
    "/v1/responses": {"model": "sim-model", "input": "hi", "max_output_tokens": 4},
    "/v1/messages": {"model": "sim-model", "messages": CHAT["messages"], "max_tokens": 4},
    "/v1/completions": {"model": "sim-model", "prompt": "hi", "max_tokens": 4},
}


async def test_every_prompt_route_passes_an_operators_middleware(sim_upstream: SimUpstream) -> None:
    """Each prompt route is served ahead of FastAPI's router, below every middleware."""
    seen: list[str] = []
    async with served(operator_app(sim_upstream, seen)) as url, httpx.AsyncClient() as client:
        answers = {path: await client.post(url + path, json=body) for path, body in PROMPTS.items()}
        other = await client.get(f"{url}/v1/responses")
    for path, answer in answers.items():
        assert answer.status_code == 200, (path, answer.text)
        assert answer.headers["x-operator"] == "1" and answer.headers["x-operator-http"] == "1"
        assert int(answer.headers["x-trimproxy-prompt-tokens"]) > 0
    assert seen == [*PROMPTS, "/v1/responses"]
    # Another method on a prompt path still goes to the router.
    assert other.status_code == 405 and "POST" in other.headers["allow"]


async def test_docs_and_openapi_list_the_proxys_routes(sim_upstream: SimUpstream) -> None:
    app = create_app(make_settings(sim_upstream.url, tokenizer="approx"), Metrics())
    async with served(app) as url, httpx.AsyncClient() as client:
        schema_answer = await client.get(f"{url}/openapi.json")
        docs = await client.get(f"{url}/docs")
        chat = await client.post(f"{url}/v1/chat/completions", json=CHAT)
    assert schema_answer.status_code == 200
    schema = schema_answer.json()
    assert schema["info"]["title"] == "trimproxy"
    paths = schema["paths"]
    assert set(paths) == {
        "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
        "/v1/completions", "/v1/models", "/healthz",
        "/readyz", "/metrics", "/v1/responses/{response_id}", "/v1/responses/compact",
        "/v1/responses/{response_id}/input_items",
    }  # fmt: skip
    assert set(paths["/v1/responses/{response_id}"]) == {"get", "delete"}
    assert set(paths["/v1/chat/completions"]) == {"post"}
    for path in ("/v1/models", "/healthz", "/readyz", "/metrics"):
        assert set(paths[path]) == {"get"}, path
    post = paths["/v1/chat/completions"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["model", "messages"]
    assert "text/event-stream" in post["responses"]["200"]["content"]
    assert {"400", "413", "502", "504"} <= set(post["responses"])
    assert "ErrorEnvelope" in schema["components"]["schemas"]
    assert docs.status_code == 200
    assert "swagger" in docs.text.lower() and "/openapi.json" in docs.text
    # Serving the schema changes nothing on the hot path.
    assert chat.status_code == 200


async def test_the_catch_all_does_not_swallow_fastapis_own_routes(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx")
    redoc = await proxy.client.get("/redoc")
    relayed = await proxy.client.get("/v1/models")
    head = await proxy.client.head("/healthz")
    assert redoc.status_code == 200
    assert relayed.status_code == 200 and relayed.json()["data"]
    assert head.status_code == 200  # HEAD on the probes as before
    assert [m["id"] for m in relayed.json()["data"]] == ["sim-model"]
    assert "/redoc" not in {r["path"] for r in sim_upstream.requests()}


PROMPT_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": CHAT,
    "/v1/responses": {"model": "sim-model", "input": "hi", "max_output_tokens": 4, "store": False},
    "/v1/messages": {**CHAT, "max_tokens": 4},
    "/v1/completions": {"model": "sim-model", "prompt": "hi", "max_tokens": 4},
}


async def test_every_prompt_route_is_served_ahead_of_the_router(
    app_proxy: StartApp, sim_upstream: SimUpstream
) -> None:
    proxy = await app_proxy(tokenizer="approx")
    dialects = proxy.app.state.dialects.dialects
    assert set(PROMPT_BODIES) == {d.path for d in dialects}
    # The router's own prompt routes taken out: what still serves them (counted, the
    # proxy's headers on the answer, nothing relayed blind) is DirectRoute.
    proxy.app.router.routes[:] = [
        r
        for r in proxy.app.router.routes
        if not (isinstance(r, APIRoute) and r.path in PROMPT_BODIES and "POST" in (r.methods or ()))
    ]
    for path, body in PROMPT_BODIES.items():
        answer = await proxy.client.post(path, json=body)
        assert answer.status_code == 200, (path, answer.text)
        assert answer.headers["x-trimproxy-prompt-tokens"], path
        # A refusal in the dialect's envelope, as its route's handler answers it.
        refused = await proxy.client.post(path, content=b"{")
        assert refused.status_code == 400, path
        envelope = refused.json()
        assert envelope["error"]["type"] == "invalid_request_error", path
        assert ("type" in envelope) is (path == "/v1/messages"), path  # Anthropic's
