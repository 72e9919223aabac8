"""A streamed answer outlives its engine: three simulated engines behind a real
``trimproxy serve``, an engine killed (or cut off on command) mid-answer, and the
answer continued on the next engine as the same answer (docs/architecture.md §23).

The sim's text is deterministic (``completion_text``) and a continuation goes on from
the words the final assistant message holds, so a whole answer is checkable to the
byte: the text relayed before the break followed by the continuation, nothing repeated.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from proxy.sim.dialect import completion_text
from tests.observability.promtext import scrape
from tests.support.processes import ProxyProcess
from tests.support.sim import SimUpstream, start_sim_process, start_sim_thread

CHAT = "/v1/chat/completions"
SETTINGS = {"upstream_metrics_interval": 0, "tokenizer": "approx", "health_interval": 0.5}
ANSWER = 200  # tokens per answer


def body(session: str, max_tokens: int = ANSWER) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": f"tell {session} a long story"}],
        "stream": True,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
    }


def continued_count(proxy: ProxyProcess) -> float:
    return scrape(proxy.url).value("trimproxy_answers_continued_total")


class Stream(threading.Thread):
    """One streamed session, read line by line; ``deltas`` counts content events."""

    def __init__(self, base: str, session: str) -> None:
        super().__init__(daemon=True)
        self.base, self.session = base, session
        self.lines: list[str] = []
        self.deltas = 0
        self.failed: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST",
                self.base + CHAT,
                json=body(self.session),
                headers={"x-session-id": self.session},
                timeout=60,
            ) as r:
                for line in r.iter_lines():
                    if line:
                        self.lines.append(line)
                        self.deltas += '"content"' in line
        except BaseException as exc:
            self.failed = exc


def chunks(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def assert_one_whole_answer(lines: list[str], tokens: int) -> None:
    """One answer to the byte: its deterministic text, one role delta, one id, one
    finish reason, usage over both parts, one [DONE] at the end, no error."""
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1, lines[-3:]
    assert not any('"error"' in line for line in lines)
    events = chunks(lines)
    assert len({(c["id"], c["created"], c["model"]) for c in events}) == 1
    choices = [choice for c in events for choice in c["choices"]]
    assert {choice["index"] for choice in choices} == {0}
    assert sum("role" in choice["delta"] for choice in choices) == 1
    assert [choice["finish_reason"] for choice in choices if choice["finish_reason"]] == ["length"]
    text = "".join(choice["delta"].get("content") or "" for choice in choices)
    assert text == "".join(completion_text(tokens))
    usage = [c["usage"] for c in events if c.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens"] == tokens


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[SimUpstream]]:
    started = [
        start_sim_process(tmp_path, "vllm", completion_tokens=ANSWER, tokens_per_second=40.0)
        for _ in range(3)
    ]
    try:
        yield started
    finally:
        for sim in started:
            sim.stop()


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.02)


def test_streams_survive_a_sigkilled_engine(engines: list[SimUpstream]) -> None:
    settings = {
        **SETTINGS,
        "upstream_url": ",".join(s.url for s in engines),
        "kv_admission": "100000",
    }
    with ProxyProcess(settings) as proxy:
        streams = [Stream(proxy.url, f"s{i}") for i in range(24)]
        for stream in streams:
            stream.start()
        wait_until(lambda: all(s.deltas >= 5 for s in streams), 60, "every stream's 5th token")
        running = [sim.state()["running"] for sim in engines]
        victim = engines[running.index(max(running))]
        victim.process.send_signal(signal.SIGKILL)
        for stream in streams:
            stream.join(90)
        reserved = scrape(proxy.url).by_engine("trimproxy_engine_kv_reserved_tokens")
        counted = continued_count(proxy)
        log = proxy.logs()
    assert all(s.failed is None for s in streams), [s.failed for s in streams]
    for stream in streams:
        assert_one_whole_answer(stream.lines, ANSWER)
    continued = [s for s in streams if any(x.startswith(": trimproxy continued") for x in s.lines)]
    assert len(continued) == max(running) > 0
    assert counted == len(continued)
    assert log.count('"continued":"reset@') == len(continued)
    assert len(reserved) == 3 and not any(reserved.values())  # every reservation given back
    # The continuations went to the live engines, as final assistant messages.
    resent = [
        r["json"]
        for sim in engines
        if sim is not victim
        for r in sim.chat_requests()
        if r["json"].get("continue_final_message")
    ]
    assert len(resent) == len(continued)
    for request in resent:
        assert request["add_generation_prompt"] is False
        partial = request["messages"][-1]
        assert partial["role"] == "assistant"
        assert "".join(completion_text(ANSWER)).startswith(partial["content"])
        assert request["max_tokens"] < ANSWER


def cut_stream(
    proxy: ProxyProcess, how: str, session: str = "one", lines: list[str] | None = None
) -> list[str]:
    """A stream the engine breaks off after its 10th token (``lines``: where to keep
    what came, when it ends in an exception)."""
    lines = [] if lines is None else lines
    headers = {"x-session-id": session, "x-sim-cut-after": "10", "x-sim-cut": how}
    with httpx.stream(
        "POST", proxy.url + CHAT, json=body(session, 30), headers=headers, timeout=30
    ) as r:
        assert r.status_code == 200
        lines.extend(line for line in r.iter_lines() if line)
    return lines


@pytest.mark.parametrize(("how", "reason"), [("close", "reset"), ("error", "error_event")])
def test_a_cut_stream_is_continued_on_the_next_engine(
    answering_sims: list[SimUpstream], how: str, reason: str
) -> None:
    with ProxyProcess(
        {**SETTINGS, "upstream_url": ",".join(s.url for s in answering_sims)}
    ) as proxy:
        lines = cut_stream(proxy, how)
        assert continued_count(proxy) == 1
    assert_one_whole_answer(lines, 30)
    comments = [line for line in lines if line.startswith(":")]
    assert len(comments) == 1 and f"after {reason} on 127.0.0.1:" in comments[0]
    assert "at 10 tokens" in comments[0]


def test_a_stalled_stream_is_continued_after_the_read_timeout(
    answering_sims: list[SimUpstream],
) -> None:
    """A hung engine (nothing sent, the connection open): the read timeout breaks its
    stream, the proxy closes it (the engine aborts the request and frees its blocks),
    and the answer goes on on the other engine."""
    settings = {
        **SETTINGS,
        "upstream_url": ",".join(s.url for s in answering_sims),
        "read_timeout": 1,
    }
    with ProxyProcess(settings) as proxy:
        lines = cut_stream(proxy, "stall")
        assert scrape(proxy.url).value("trimproxy_answers_continued_total", reason="timeout") == 1
    assert_one_whole_answer(lines, 30)
    stalled = next(s for s in answering_sims if not any(
        r["json"].get("continue_final_message") for r in s.chat_requests()))  # fmt: skip
    stalled.wait_for_state(lambda state: state["disconnects"] == 1, timeout=10)


@pytest.mark.parametrize("attempts", [1, 2])
def test_each_attempt_continues_once_and_then_the_error_event_is_relayed(attempts: int) -> None:
    """Broken at token 10 and again at 20 (each time with the engine's error event):
    two attempts make a whole answer; one relays the second engine's error event."""
    engines = [start_sim_thread("vllm", completion_tokens=40) for _ in range(3)]
    settings = {
        **SETTINGS,
        "upstream_url": ",".join(s.url for s in engines),
        "continue_attempts": attempts,
    }
    headers = {"x-sim-cut-after": "10,20", "x-sim-cut": "error"}
    try:
        with ProxyProcess(settings) as proxy:
            r = httpx.post(proxy.url + CHAT, json=body("one", 30), headers=headers, timeout=30)
            assert continued_count(proxy) == attempts
    finally:
        for sim in engines:
            sim.stop()
    lines = [line for line in r.text.split("\n") if line]
    if attempts == 2:
        assert_one_whole_answer(lines, 30)
        return
    assert lines[-2].startswith('data: {"error": {"message": "EngineCore')
    assert lines[-1] == "data: [DONE]"
    events = chunks(lines[:-2])
    text = "".join(ch["delta"].get("content") or "" for c in events for ch in c["choices"])
    assert text == "".join(completion_text(20))


def test_attempts_zero_keeps_the_honest_error_event(answering_sims: list[SimUpstream]) -> None:
    settings = {
        **SETTINGS,
        "upstream_url": ",".join(s.url for s in answering_sims),
        "continue_attempts": 0,
    }
    with ProxyProcess(settings) as proxy:
        cut: list[str] = []
        with pytest.raises(httpx.RemoteProtocolError):
            cut_stream(proxy, "close", lines=cut)
        # The engine's own error event is relayed as it came, then its [DONE].
        lines = cut_stream(proxy, "error")
        assert continued_count(proxy) == 0
    # A connection that broke: the proxy's own error event, and a broken transfer.
    assert sum('"content"' in line for line in cut) == 11  # the role delta and 10 tokens
    assert cut[-1].startswith('data: {"error"') and "data: [DONE]" not in cut
    assert lines[-2].startswith('data: {"error": {"message": "EngineCore')
    assert lines[-1] == "data: [DONE]"
    assert not any(line.startswith(":") for line in lines)
    assert all(
        not r["json"].get("continue_final_message")
        for s in answering_sims
        for r in s.chat_requests()
    )


def test_fastchat_engines_keep_the_honest_error_event() -> None:
    """FastChat has no continuation form (its /v1/models lists no max_model_len)."""
    engines = [start_sim_thread("fastchat", completion_tokens=40) for _ in range(2)]
    try:
        settings = {**SETTINGS, "upstream_url": ",".join(s.url for s in engines)}
        with ProxyProcess(settings) as proxy:
            with pytest.raises(httpx.RemoteProtocolError):
                cut_stream(proxy, "close")
            assert continued_count(proxy) == 0
            assert "not continued" in proxy.logs()
        assert all(len(s.chat_requests()) <= 1 for s in engines)
    finally:
        for sim in engines:
            sim.stop()


@pytest.mark.parametrize("extra", [{"n": 2}, {"logprobs": True}])
def test_answers_that_cannot_be_continued_keep_the_error_event(
    answering_sims: list[SimUpstream], extra: dict[str, Any]
) -> None:
    with ProxyProcess(
        {**SETTINGS, "upstream_url": ",".join(s.url for s in answering_sims)}
    ) as proxy:
        with (
            pytest.raises(httpx.RemoteProtocolError),
            httpx.stream(
                "POST",
                proxy.url + CHAT,
                json={**body("one", 30), **extra},
                headers={"x-sim-cut-after": "10"},
                timeout=30,
            ) as r,
        ):
            for _ in r.iter_lines():
                pass
        assert continued_count(proxy) == 0


def test_a_cut_messages_stream_ends_in_anthropics_error_event(
    answering_sims: list[SimUpstream],
) -> None:
    """vLLM's Messages route renders a trailing assistant message as a new turn (no
    continuation form): a broken Messages stream is not continued, and its last event
    is Anthropic's ``error`` event, which the anthropic SDK raises on."""
    request = {
        "model": "sim-model",
        "max_tokens": 30,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    lines: list[str] = []
    with ProxyProcess(
        {**SETTINGS, "upstream_url": ",".join(s.url for s in answering_sims)}
    ) as proxy:
        with (
            pytest.raises(httpx.RemoteProtocolError),
            httpx.stream(
                "POST",
                proxy.url + "/v1/messages",
                json=request,
                headers={"x-sim-cut-after": "5"},
                timeout=30,
            ) as r,
        ):
            lines.extend(line for line in r.iter_lines() if line)
        client = anthropic.Anthropic(
            base_url=proxy.url,
            api_key="x",
            max_retries=0,
            default_headers={"x-sim-cut-after": "5"},
        )
        with (
            client,
            pytest.raises(anthropic.APIError),
            client.messages.stream(
                model="sim-model", max_tokens=30, messages=[{"role": "user", "content": "hi"}]
            ) as stream,
        ):
            for _ in stream:
                pass
        assert continued_count(proxy) == 0
    assert lines[-2] == "event: error"
    error = json.loads(lines[-1][6:])
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
