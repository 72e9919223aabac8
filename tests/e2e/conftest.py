"""Fixtures for the end-to-end tests against a real FastChat stack and a real vLLM engine.

``fastchat_stack`` (session scope) builds the FastChat venv and the tiny model when
needed and runs controller + worker + OpenAI API server on loopback. It skips only when
``TRIMPROXY_SKIP_FASTCHAT=1``; anywhere else (CI included) a stack that cannot start is
an error, not a skip.

``start_proxy(**settings)`` starts trimproxy as a real process
(``python -m proxy.cli serve``, through the shared ``proxy_server`` fixture) in front
of that stack; it is stopped after the test.

``vllm_stack`` (session scope) builds the vLLM venv and the tiny model when needed and
runs ONE vLLM engine (``--api-key VLLM_API_KEY``, ``--max-model-len VLLM_MAX_MODEL_LEN``,
6,144 KV tokens) for every vLLM test: each start costs about a minute. It skips only
when ``TRIMPROXY_SKIP_VLLM=1``; anywhere else a venv that cannot be built or an engine
that does not start is an error. ``vllm_idle`` waits until the engine runs and queues
nothing, so one test's leftovers never land in the next one's counters.
``start_vllm_proxy(**settings)`` starts trimproxy (a real process) in front of it, with
the upstream key and the hf counter by default; stopped after the test.

``agent_engine`` (session scope) is the tool-rendering engine of
``tests.support.agent_engine`` at a window of ``AGENT_WINDOW``, started once for every
module that serves a coding agent on that window (each start is a minute or more).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.agent_engine import agent_stack
from tests.support.fastchat_stack import FastChatStack
from tests.support.processes import ProxyProcess
from tests.support.tiny_model import MAX_POSITIONS, render_fastchat_prompt
from tests.support.vllm_stack import VllmStack, build_vllm_model

#: The key the session's vLLM engine is started with (``--api-key``).
VLLM_API_KEY = "vllm-e2e-key"
#: The engine's ``--max-model-len``: below the model's 4,096 positions, so that a
#: conversation outgrows it in a few turns.
VLLM_MAX_MODEL_LEN = 2048
#: The tests' engines run at this nice value (their session's too): on two shared
#: cores a busy engine otherwise left the proxy under test unscheduled for seconds,
#: and a disconnect reached the engine late (``processes.yield_cpu``).
ENGINE_NICE = 10
#: Seconds an engine may take to answer /health: 45 s on a quiet machine, past 600 s
#: at a load average of 14 on two cores (benchmarks beside the tests).
ENGINE_START_TIMEOUT = 1500.0
#: The window of the shared agent engine: a small one, which an agent's task outgrows.
AGENT_WINDOW = 8192


@dataclass(frozen=True)
class FastChatProxy:
    """A trimproxy process in front of the FastChat stack."""

    base_url: str
    logs: Callable[[], str]

    @property
    def api_base(self) -> str:
        return f"{self.base_url}/v1"


StartProxy = Callable[..., FastChatProxy]
CountPrompt = Callable[[list[dict[str, str]]], int]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    # Remember each phase's outcome on the item, so fixtures can attach logs on failure.
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "rep_call", None)
    return report is None or report.failed


@pytest.fixture(scope="session")
def fastchat_stack() -> Iterator[FastChatStack]:
    if os.environ.get("TRIMPROXY_SKIP_FASTCHAT") == "1":
        pytest.skip("TRIMPROXY_SKIP_FASTCHAT=1: the real FastChat stack is switched off")
    with FastChatStack(nice=ENGINE_NICE) as stack:
        timings = stack.timings
        print(
            f"\nFastChat stack up: venv {timings.venv:.1f}s, model {timings.model:.1f}s, "
            f"ready {timings.ready:.1f}s, first completion {timings.first_completion:.2f}s"
        )
        yield stack


@pytest.fixture(scope="session")
def count_prompt(fastchat_stack: FastChatStack) -> CountPrompt:
    """The test's own reference count: FastChat's prompt string, tokenized.

    Independent of the proxy's counters (plain ``tokenizers`` on the rendered string
    FastChat builds); the tests check it against FastChat's ``usage.prompt_tokens``.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(fastchat_stack.model_dir / "tokenizer.json"))

    def count(messages: list[dict[str, str]]) -> int:
        return len(tokenizer.encode(render_fastchat_prompt(messages)).ids)

    return count


@pytest.fixture
def start_proxy(
    fastchat_stack: FastChatStack,
    proxy_server: Callable[..., Any],
    request: pytest.FixtureRequest,
) -> Iterator[StartProxy]:
    """``start_proxy(**settings)``: trimproxy in front of the FastChat stack.

    Built on the shared ``proxy_server`` fixture (tests/conftest.py); ``settings``
    become ``TRIMPROXY_<NAME>`` and override the defaults below.
    """
    started: list[Any] = []

    def start(**settings: str | int | float) -> FastChatProxy:
        merged: dict[str, str | int | float] = {
            "tokenizer": f"hf:{fastchat_stack.model_dir}",
            # FastChat's /v1/models reports no max_model_len, so the window is given.
            "context_window": MAX_POSITIONS,
        }
        merged.update({key.lower(): value for key, value in settings.items()})
        # Importing transformers for the hf counter takes a few seconds on 2 busy cores.
        server = proxy_server(upstream=fastchat_stack.base_url, timeout=60.0, **merged)
        started.append(server)
        return FastChatProxy(server.url, server.logs)

    yield start
    if _failed(request):
        # Shown under "Captured stdout teardown" of the failing test.
        for server in started:
            print(f"\n--- trimproxy log ({server.env}) ---\n{server.logs()[-6000:]}")
        print(fastchat_stack.log_tails())


# --------------------------------------------------------------------------- vLLM

StartVllmProxy = Callable[..., ProxyProcess]


@pytest.fixture(scope="session")
def vllm_stack() -> Iterator[VllmStack]:
    if os.environ.get("TRIMPROXY_SKIP_VLLM") == "1":
        pytest.skip("TRIMPROXY_SKIP_VLLM=1: the real vLLM engine is switched off")
    with VllmStack(
        build_vllm_model(),
        api_key=VLLM_API_KEY,
        max_model_len=VLLM_MAX_MODEL_LEN,
        nice=ENGINE_NICE,
        startup_timeout=ENGINE_START_TIMEOUT,
    ) as stack:
        print(f"\nvLLM engine up: ready {stack.timings.ready:.1f}s")
        yield stack


@pytest.fixture(scope="session")
def agent_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmStack]:
    if os.environ.get("TRIMPROXY_SKIP_VLLM") == "1":
        pytest.skip("TRIMPROXY_SKIP_VLLM=1: the real vLLM engine is switched off")
    folder = tmp_path_factory.mktemp("agent-model")
    with agent_stack(
        folder,
        AGENT_WINDOW,
        api_key=VLLM_API_KEY,
        nice=ENGINE_NICE,
        startup_timeout=ENGINE_START_TIMEOUT,
    ) as engine:
        print(f"\nagent engine up: ready {engine.timings.ready:.1f}s")
        yield engine


@pytest.fixture
def vllm_idle(vllm_stack: VllmStack, request: pytest.FixtureRequest) -> Iterator[VllmStack]:
    """The session's engine, once nothing runs or waits on it; its log on failure."""
    vllm_stack.wait_for_metrics(lambda m: m.running == 0 and m.waiting == 0, timeout=60.0)
    yield vllm_stack
    if vllm_stack.proc is None or vllm_stack.proc.poll() is not None:
        pytest.fail(f"the vLLM engine died:\n{vllm_stack.log_text()[-6000:]}")
    if _failed(request):
        print(f"\n--- vLLM log ---\n{vllm_stack.log_text()[-6000:]}")


@pytest.fixture
def start_vllm_proxy(
    vllm_idle: VllmStack, request: pytest.FixtureRequest
) -> Iterator[StartVllmProxy]:
    """``start_vllm_proxy(**settings)``: trimproxy in front of the session's engine.

    Defaults: the upstream key, the hf counter on the model folder, a scrape of the
    engine every 0.25 s; ``settings`` become ``TRIMPROXY_<NAME>`` and override them.
    """
    started: list[ProxyProcess] = []

    def start(**settings: str | int | float) -> ProxyProcess:
        merged: dict[str, str | int | float] = {
            "upstream_url": vllm_idle.base_url,
            "upstream_api_key": VLLM_API_KEY,
            "tokenizer": f"hf:{vllm_idle.model_dir}",
            "upstream_metrics_interval": 0.25,
        }
        merged.update({key.lower(): value for key, value in settings.items()})
        # Importing transformers for the hf counter takes a few seconds on busy cores.
        proxy = ProxyProcess(settings=merged, startup_timeout=120.0)
        started.append(proxy)
        return proxy.start()

    yield start
    failed = _failed(request)
    for proxy in started:
        proxy.stop()
        if failed:
            print(f"\n--- trimproxy log ({proxy.settings}) ---\n{proxy.final_log[-6000:]}")
