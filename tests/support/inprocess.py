"""The proxy app in the test process: ``create_app(settings, Metrics())`` driven through
``httpx.ASGITransport``, its lifespan run by ``asgi_lifespan.LifespanManager``.

For the tests that check behaviour (what is forwarded, trimmed, counted, answered):
no interpreter start, no port, no polling for ``/healthz``. The upstream is still a
real HTTP server (the sim, ``tests.support.sim``), reached by the proxy's own aiohttp
client, so forwarding, the upstream's errors and the scrape run as in production.
What it cannot show — a client that goes away mid-stream (the ASGI transport reads
the whole answer), several workers, signals, the CLI — stays with ``ProxyProcess``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2
import openai
from asgi_lifespan import LifespanManager
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource
from starlette.applications import Starlette

from proxy.app import create_app
from proxy.metrics import Metrics
from proxy.settings import Settings

#: The host the in-process proxy answers as; nothing listens there.
BASE_URL = "http://trimproxy.test"


@dataclass
class InProcessProxy:
    app: Starlette
    settings: Settings
    metrics: Metrics
    client: httpx.AsyncClient
    """Requests go straight to the app; relative URLs (``/v1/chat/completions``)."""

    url: str = BASE_URL

    async def metrics_text(self) -> str:
        response = await self.client.get("/metrics")
        response.raise_for_status()
        return response.text


class _ArgumentsOnly(Settings):
    """``Settings`` read from the constructor's arguments alone."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def make_settings(upstream_url: str, **settings: Any) -> Settings:
    """Settings from keyword arguments only: no ``.env`` file and no ``TRIMPROXY_*`` of
    the environment (a developer's exported settings, or the suite's own switches such
    as ``TRIMPROXY_SKIP_VLLM``, must not change what a test runs)."""
    return _ArgumentsOnly(upstream_url=upstream_url, **settings)


@asynccontextmanager
async def running_proxy(
    upstream_url: str,
    *,
    headers: Mapping[str, str] | None = None,
    startup_timeout: float = 60.0,
    **settings: Any,
) -> AsyncIterator[InProcessProxy]:
    """The app with its lifespan run (start-up and shut-down as under uvicorn)."""
    built = make_settings(upstream_url, **settings)
    metrics = Metrics()
    app = create_app(built, metrics)
    async with LifespanManager(app, startup_timeout=startup_timeout) as manager:
        # Like a server: an unexpected error is the 500 envelope, not an exception here.
        transport = httpx.ASGITransport(app=manager.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url=BASE_URL, headers=headers, timeout=30.0
        ) as client:
            yield InProcessProxy(app, built, metrics, client)


@asynccontextmanager
async def openai_client(proxy: InProcessProxy) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official SDK straight into the in-process app. The SDK brings its own HTTP
    library (``httpx2``, a fork of httpx), so it gets that library's ASGI transport."""
    http_client = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=proxy.app))
    async with openai.AsyncOpenAI(
        base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0, http_client=http_client
    ) as client:
        yield client


#: The ``app_proxy`` fixture: ``await app_proxy(upstream=..., **settings)``.
StartApp = Callable[..., Awaitable[InProcessProxy]]
