"""Fixtures for the end-to-end tests against a real FastChat stack.

``fastchat_stack`` (session scope) builds the FastChat venv and the tiny model when
needed and runs controller + worker + OpenAI API server on loopback. It skips only when
``TRIMPROXY_SKIP_FASTCHAT=1``; anywhere else (CI included) a stack that cannot start is
an error, not a skip.

``start_proxy(**settings)`` starts trimproxy as a real process
(``python -m proxy.cli serve``) in front of that stack and stops it after the test.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    # `tests.support` must import whether pytest was started as `pytest` or as
    # `python -m pytest`, and whatever pyproject's pythonpath says.
    sys.path.insert(0, str(_ROOT))

from tests.support.fastchat_stack import FastChatStack  # noqa: E402
from tests.support.proxy_process import ProxyProcess  # noqa: E402
from tests.support.tiny_model import MAX_POSITIONS, render_fastchat_prompt  # noqa: E402

StartProxy = Callable[..., ProxyProcess]
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
    fastchat_stack: FastChatStack, request: pytest.FixtureRequest
) -> Iterator[StartProxy]:
    started: list[ProxyProcess] = []

    def start(**settings: str | int | float) -> ProxyProcess:
        merged: dict[str, str | int | float] = {
            "UPSTREAM_URL": fastchat_stack.base_url,
            "TOKENIZER": f"hf:{fastchat_stack.model_dir}",
            # FastChat's /v1/models reports no max_model_len, so the window is given.
            "CONTEXT_WINDOW": MAX_POSITIONS,
        }
        merged.update(settings)
        proxy = ProxyProcess(merged)
        started.append(proxy)
        return proxy.start()

    yield start
    for proxy in started:
        proxy.stop()
    if _failed(request):
        # Shown under "Captured stdout teardown" of the failing test.
        for proxy in started:
            print(f"\n--- trimproxy log ({proxy.settings}) ---\n{proxy.final_log[-6000:]}")
        print(fastchat_stack.log_tails())
