"""Fixtures for the end-to-end tests against a real FastChat stack.

``fastchat_stack`` (session scope) builds the FastChat venv and the tiny model when
needed and runs controller + worker + OpenAI API server on loopback. It skips only when
``TRIMPROXY_SKIP_FASTCHAT=1``; anywhere else (CI included) a stack that cannot start is
an error, not a skip.

``start_proxy(**settings)`` starts trimproxy as a real process
(``python -m proxy.cli serve``, through the shared ``proxy_server`` fixture) in front
of that stack; it is stopped after the test.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    # `tests.support` must import whether pytest was started as `pytest` or as
    # `python -m pytest`, and whatever pyproject's pythonpath says.
    sys.path.insert(0, str(_ROOT))

from tests.support.fastchat_stack import FastChatStack  # noqa: E402
from tests.support.tiny_model import MAX_POSITIONS, render_fastchat_prompt  # noqa: E402


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
    with FastChatStack() as stack:
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
