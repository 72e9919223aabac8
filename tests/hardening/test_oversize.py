"""The floor (docs/architecture.md §7): a message that cannot fit is refused before it is tokenized.

The bound: a token covers at most as many characters as the vocabulary's longest
token, so ``characters / longest`` tokens is a floor on any message's count. When
the floor of what must be kept (the head system messages and the last user turn)
is already over the budget, the answer is 400 ``context_length_exceeded`` with no
tokenizer call: the ``received`` prompt histogram (observed after counting) stays
empty, which is how the test knows counting never ran.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.observability.promtext import scrape
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream
from tests.support.tiny_model import build_tokenizer

StartProxy = Callable[..., ProxyProcess]
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("tokenizer", ["hf", "approx"])
def test_huge_message_is_refused_before_counting(
    proxy_server: StartProxy, sim_upstream: SimUpstream, tiny_dir: Path, tokenizer: str
) -> None:
    spec = f"hf:{tiny_dir}" if tokenizer == "hf" else tokenizer
    proxy = proxy_server(tokenizer=spec, context_window=4096, upstream_metrics_interval=0)
    huge = "lorem ipsum dolor " * (6 << 16)  # ~7 MiB, under the 8 MiB body limit
    body = {"model": "sim-model", "messages": [{"role": "user", "content": huge}]}
    answer = httpx.post(proxy.url + CHAT, json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "at least" in error["message"] and "4096" in error["message"]
    metrics = scrape(proxy.url)
    assert metrics.value("trimproxy_prompt_tokens_count", stage="received") == 0
    assert sim_upstream.chat_requests() == []


def test_a_long_history_that_trimming_can_drop_is_still_trimmed(
    proxy_server: StartProxy, sim_upstream: SimUpstream, tiny_dir: Path
) -> None:
    """The floor counts only what must be kept: old turns of any size may be dropped."""
    proxy = proxy_server(
        tokenizer=f"hf:{tiny_dir}", context_window=4096, upstream_metrics_interval=0
    )
    messages = [
        {"role": "user", "content": "old " * 200_000},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "now a short question"},
    ]
    answer = httpx.post(
        proxy.url + CHAT, json={"model": "sim-model", "messages": messages}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-trimproxy-trimmed-messages"] == "2"
