"""Shared fixtures: the simulated upstream, and the proxy in-process or as a process.

* ``sim_upstream``: the session's vLLM-dialect sim (``proxy.sim``, served by a thread
  of the test process), reset before each test (start config, nothing recorded,
  counters zero). A ``SimUpstream`` (``tests.support.sim``): ``url``,
  ``requests(path=None)``, ``chat_requests()``, ``clear()``, ``configure(**knobs)``,
  ``reset()``, ``state()``, ``wait_for_state(pred)``, ``metrics()``.
* ``sim_upstream_factory(dialect="vllm", **config)``: fresh in-process sims with any
  ``SimConfig`` fields; all stopped after the test.
* ``sim_process``: the sim as a child process, for tests that measure it as one.
* ``app_proxy(*, upstream=None, **settings)`` (async): ``create_app(settings,
  Metrics())`` in this process, driven through ``httpx.ASGITransport`` with its
  lifespan run; against ``upstream`` (a ``SimUpstream`` or a URL; the session sim
  when omitted). An ``InProcessProxy`` (``tests.support.inprocess``): ``client``
  (relative URLs), ``app``, ``settings``, ``metrics``, ``metrics_text()``. Shut down
  after the test. The default for behaviour tests.
* ``proxy_server(env=None, *, upstream=None, workers=None, **settings)``: starts
  ``python -m proxy.cli serve`` on a free port and waits for ``/healthz``; for the
  tests where the process is the point (disconnects, workers, signals, the CLI, logs
  as written). ``settings`` become ``TRIMPROXY_<NAME>``, ``env`` is added as is. A
  ``ProxyProcess`` (``tests.support.processes``): ``url``, ``port``, ``process``,
  ``logs()``, ``stop()``. All stopped after the test.
* ``closing(client)``: enters ``client`` (an SDK or httpx client, a socket) and
  returns it; closed when the test ends (``tests.support.closing``). ``aclosing``
  (awaited) for async clients.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.support.closing import AsyncClosing, Closing
from tests.support.inprocess import InProcessProxy, running_proxy
from tests.support.processes import PROXY_START_TIMEOUT, ProxyProcess, StackError
from tests.support.properties import DEFAULT_EXAMPLES, FAST_EXAMPLES
from tests.support.redis_server import REDIS_BIN, RedisServer
from tests.support.sim import SimUpstream, start_sim_process, start_sim_thread

StartProxy = Callable[..., ProxyProcess]
StartSim = Callable[..., SimUpstream]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # No property test fails for being slow: hypothesis's per-example deadline (200 ms)
    # is a wall-clock assert, and on a loaded machine it fails examples that are right.
    # First of the configure hooks, so that hypothesis's own then loads the profile
    # --hypothesis-profile names: "fast" for the fast loop (tests.support.properties).
    settings.register_profile("trimproxy", deadline=None, max_examples=DEFAULT_EXAMPLES)
    settings.register_profile("fast", deadline=None, max_examples=FAST_EXAMPLES)
    settings.load_profile("trimproxy")


@pytest.fixture
def closing() -> Iterator[Closing]:
    """``client = closing(openai.OpenAI(...))``: the client, closed when the test ends."""
    with ExitStack() as stack:
        yield stack.enter_context


@pytest.fixture
async def aclosing() -> AsyncIterator[AsyncClosing]:
    """``client = await aclosing(openai.AsyncOpenAI(...))``: ``closing`` for async clients."""
    async with AsyncExitStack() as stack:
        yield stack.enter_async_context


@pytest.fixture(scope="session")
def _sim_session() -> Iterator[SimUpstream]:
    sim = start_sim_thread()
    yield sim
    sim.stop()


@pytest.fixture
def sim_upstream(_sim_session: SimUpstream) -> SimUpstream:
    """The shared vLLM-dialect sim, as it started, with nothing recorded."""
    sim = _sim_session
    if not sim.alive():
        pytest.fail("the session sim died")
    # A previous test's slow request may still be running; let it end first so its
    # disconnect or tokens do not land in this test's counters.
    try:
        sim.wait_for_state(lambda s: s["running"] == 0 and s["waiting"] == 0, timeout=5.0)
    finally:
        sim.reset()
    return sim


@pytest.fixture
def sim_upstream_factory() -> Iterator[StartSim]:
    """``factory(dialect="vllm", **SimConfig fields) -> SimUpstream``, stopped at the end."""
    started: list[SimUpstream] = []

    def factory(dialect: str = "vllm", **config: Any) -> SimUpstream:
        sim = start_sim_thread(dialect, **config)
        started.append(sim)
        return sim

    yield factory
    for sim in started:
        sim.stop()


@pytest.fixture
def sim_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimUpstream]:
    """A vLLM-dialect sim in its own process (``.process`` is the child)."""
    try:
        sim = start_sim_process(tmp_path_factory.mktemp("sim"))
    except StackError as exc:
        pytest.fail(str(exc))
    yield sim
    sim.stop()


def _upstream_url(request: pytest.FixtureRequest, upstream: SimUpstream | str | None) -> str:
    if upstream is None:
        upstream = request.getfixturevalue("sim_upstream")
    return upstream if isinstance(upstream, str) else upstream.url


@pytest.fixture
async def app_proxy(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Callable[..., Any]]:
    """``await app_proxy(*, upstream=None, headers=None, **settings) -> InProcessProxy``."""
    for name in [k for k in os.environ if k.startswith("TRIMPROXY_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    async with AsyncExitStack() as stack:

        async def start(
            *,
            upstream: SimUpstream | str | None = None,
            headers: Mapping[str, str] | None = None,
            **settings: Any,
        ) -> InProcessProxy:
            url = _upstream_url(request, upstream)
            return await stack.enter_async_context(running_proxy(url, headers=headers, **settings))

        yield start


@pytest.fixture
def proxy_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartProxy]:
    started: list[ProxyProcess] = []

    def start(
        env: Mapping[str, str] | None = None,
        *,
        upstream: SimUpstream | str | None = None,
        workers: int | None = None,
        timeout: float = PROXY_START_TIMEOUT,
        **settings: Any,
    ) -> ProxyProcess:
        child = {"TRIMPROXY_UPSTREAM_URL": _upstream_url(request, upstream)}
        server = ProxyProcess(
            settings=settings,
            env={**child, **(env or {})},
            workers=workers,
            startup_timeout=timeout,
            workdir=tmp_path_factory.mktemp("proxy"),
        )
        try:
            server.start()
        except StackError as exc:
            pytest.fail(str(exc))
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A real ``redis-server`` on a free loopback port, per test (a start is ~20 ms), so
    no state leaks between tests and a test may stop and restart it on the same port
    to simulate an outage."""
    if REDIS_BIN is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server)")
    with tempfile.TemporaryDirectory(prefix="trimproxy-redis-") as tmp:
        server = RedisServer(REDIS_BIN, Path(tmp))
        server.start()
        try:
            yield server
        finally:
            server.stop()
