"""trimproxy in front of a real FastChat 0.2.36 stack (tiny model on CPU).

What only the real stack can show: FastChat's own prompt rendering and token count
(``usage.prompt_tokens``) agree with the proxy's header; a long conversation that
FastChat refuses (40303) passes through the proxy on every turn; session limits act on
real traffic; and a client that hangs up mid-stream stops FastChat's generation.

Counts here come from ``count_prompt``, the test's own reference (FastChat's prompt
string tokenized with plain ``tokenizers``), and every direct request to FastChat checks
that reference against FastChat's ``usage.prompt_tokens``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import CountPrompt, StartProxy
from tests.support.fastchat_stack import FastChatStack
from tests.support.tiny_model import MAX_POSITIONS

pytestmark = pytest.mark.fastchat

BUDGET = 600
MAX_TOKENS = 16
TURNS = 40
SYSTEM = {"role": "system", "content": "You are a terse assistant taking part in a test."}

# Prose reads better than a list literal here.
_WORDS = (  # noqa: SIM905
    "the river runs past the old mill and the mountain road where people walk in the "
    "morning light while a small train carries coffee bread and apples to the city team "
    "project plan needs a clear answer about the token budget the model server memory "
    "cache and each long story that a friend tells at the table near the warm window"
).split()


def user_text(turn: int, words: int = 45) -> str:
    """A deterministic user message of roughly ``words`` + a few tokens."""
    rng = random.Random(turn)
    return f"Turn {turn}: " + " ".join(rng.choice(_WORDS) for _ in range(words)) + "?"


def sdk_messages(messages: list[dict[str, str]]) -> Any:
    # The SDK types messages as TypedDicts; plain dicts are what clients really send.
    return messages


def client_for(base_url: str) -> openai.OpenAI:
    # No retries: a retried request would hide the very errors these tests look for.
    return openai.OpenAI(base_url=base_url, api_key="e2e-test", max_retries=0, timeout=120.0)


@dataclass
class Turn:
    content: str
    headers: Mapping[str, str]
    #: FastChat's usage.prompt_tokens; None for streamed answers (FastChat's stream
    #: carries no usage).
    prompt_tokens: int | None
    finish_reason: str | None


def chat(
    client: openai.OpenAI,
    model: str,
    messages: list[dict[str, str]],
    *,
    stream: bool,
    max_tokens: int = MAX_TOKENS,
    temperature: float = 0.0,
    headers: Mapping[str, str] | None = None,
) -> Turn:
    """One chat completion through the official SDK, keeping the response headers."""
    extra = dict(headers or {})
    if stream:
        with client.chat.completions.with_streaming_response.create(
            model=model,
            messages=sdk_messages(messages),
            max_tokens=max_tokens,
            temperature=temperature,
            stream=True,
            extra_headers=extra,
        ) as response:
            parts: list[str] = []
            finish: str | None = None
            for chunk in response.parse():
                for choice in chunk.choices:
                    parts.append(choice.delta.content or "")
                    finish = choice.finish_reason or finish
            return Turn("".join(parts), response.headers, None, finish)
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=sdk_messages(messages),
        max_tokens=max_tokens,
        temperature=temperature,
        extra_headers=extra,
    )
    completion = raw.parse()
    assert completion.usage is not None
    return Turn(
        completion.choices[0].message.content or "",
        raw.headers,
        completion.usage.prompt_tokens,
        completion.choices[0].finish_reason,
    )


def fastchat_usage(prompt: int, max_tokens: int) -> int:
    """The usage.prompt_tokens FastChat reports for a prompt of ``prompt`` tokens.

    FastChat shortens max_tokens to fit the context, and its worker keeps only the last
    ``context - max_new_tokens - 1`` prompt tokens, so a prompt that leaves no spare
    token loses its first token.
    """
    max_new = min(max_tokens, MAX_POSITIONS - prompt)
    return min(prompt, MAX_POSITIONS - max_new - 1)


def test_long_conversation_stays_in_budget_where_fastchat_alone_fails(
    fastchat_stack: FastChatStack, start_proxy: StartProxy, count_prompt: CountPrompt
) -> None:
    proxy = start_proxy(MAX_PROMPT_TOKENS=BUDGET)
    model = fastchat_stack.model
    history: list[dict[str, str]] = [SYSTEM]
    direct_refused: list[int] = []
    trimmed_turns: list[int] = []
    last_dropped = 0

    with client_for(proxy.api_base) as via_proxy, client_for(fastchat_stack.api_base) as direct:
        for turn in range(1, TURNS + 1):
            history.append({"role": "user", "content": user_text(turn)})
            full = count_prompt(history)

            # The same conversation straight to FastChat: it works until the history
            # outgrows the model's context, then FastChat refuses it (40303).
            try:
                answer = direct.chat.completions.create(
                    model=model, messages=sdk_messages(history), max_tokens=1, temperature=0
                )
            except openai.BadRequestError as error:
                assert error.response.json()["code"] == 40303, error.response.text
                assert full >= MAX_POSITIONS, (turn, full, error.response.text)
                direct_refused.append(turn)
            else:
                assert full < MAX_POSITIONS, (turn, full)
                assert answer.usage is not None
                assert answer.usage.prompt_tokens == fastchat_usage(full, 1), (turn, full)

            stream = turn % 2 == 1
            try:
                # Sampled answers (greedy decoding of the random model repeats one
                # token): arbitrary text, as real replies are, goes back into history.
                result = chat(via_proxy, model, history, stream=stream, temperature=1.0)
            except openai.APIStatusError as error:
                pytest.fail(f"turn {turn} failed through the proxy: {error.response.text}")

            forwarded = int(result.headers["x-trimproxy-prompt-tokens"])
            dropped = int(result.headers.get("x-trimproxy-trimmed-messages", "0"))
            assert forwarded <= BUDGET, (turn, forwarded)
            if result.prompt_tokens is not None:
                # The proxy's count is exactly what FastChat saw.
                assert result.prompt_tokens == forwarded, (turn, result.prompt_tokens)
            if full <= BUDGET:
                assert dropped == 0 and forwarded == full, (turn, full, forwarded, dropped)
            else:
                assert dropped > 0 and forwarded < full, (turn, full, forwarded, dropped)
                trimmed_turns.append(turn)
            # docs/architecture.md §6: the system message stays and whole turns go, oldest
            # first; here every turn is one user + one assistant message, so the forwarded prompt is
            # the system message plus the history after the dropped ones. Its count
            # checks the header on streamed turns too (FastChat streams no usage).
            assert dropped % 2 == 0, (turn, dropped)
            assert forwarded == count_prompt([SYSTEM, *history[1 + dropped :]]), (turn, dropped)
            # A message once dropped never comes back (the cut only moves forward).
            assert dropped >= last_dropped, (turn, dropped, last_dropped)
            last_dropped = dropped
            assert result.finish_reason in ("stop", "length"), (turn, result.finish_reason)
            history.append({"role": "assistant", "content": result.content})

    print(
        f"\ndirect refused from turn {direct_refused[:1]}, trimmed from turn "
        f"{trimmed_turns[:1]}, final history {count_prompt(history)} tokens"
    )
    # The conversation really outgrew FastChat's context, and from then on only the
    # proxy kept it going.
    assert direct_refused, "the conversation never outgrew the context: lengthen it"
    assert direct_refused == list(range(direct_refused[0], TURNS + 1))
    assert trimmed_turns and trimmed_turns[0] < direct_refused[0]


def test_session_turn_limit_resets_on_real_traffic(
    fastchat_stack: FastChatStack, start_proxy: StartProxy, count_prompt: CountPrompt
) -> None:
    proxy = start_proxy(MAX_PROMPT_TOKENS=BUDGET, SESSION_MAX_TURNS=3)
    model = fastchat_stack.model
    history: list[dict[str, str]] = [SYSTEM]
    reset_at = 1  # index in history where the session's kept part begins (after system)

    with client_for(proxy.api_base) as client:
        for turn in range(1, 8):
            history.append({"role": "user", "content": user_text(100 + turn, words=20)})
            result = chat(
                client,
                model,
                history,
                stream=turn in (2, 5),
                headers={"X-Session-ID": "e2e-session-a"},
            )
            # docs/architecture.md §10: with a limit of 3, turns 1-3 pass, turn 4 resets and
            # counts as turn 1 of the new session; turn 7 resets again.
            resets = turn in (4, 7)
            if resets:
                reset_at = len(history) - 1
            assert result.headers["x-trimproxy-session-id"] == "e2e-session-a"
            assert result.headers["x-trimproxy-session-turn"] == str((turn - 1) % 3 + 1), turn
            assert (result.headers.get("x-trimproxy-session-reset") == "1") == resets, turn
            # The client keeps sending its whole history; the proxy forwards only the
            # system message and what came after the last reset.
            expected = count_prompt([SYSTEM, *history[reset_at:]])
            assert int(result.headers["x-trimproxy-prompt-tokens"]) == expected, turn
            if result.prompt_tokens is not None:
                assert result.prompt_tokens == expected, turn
            history.append({"role": "assistant", "content": result.content})

        # Another session is counted on its own.
        other = chat(
            client,
            model,
            [SYSTEM, {"role": "user", "content": user_text(1)}],
            stream=False,
            headers={"X-Session-ID": "e2e-session-b"},
        )
        assert other.headers["x-trimproxy-session-turn"] == "1"
        assert other.headers.get("x-trimproxy-session-reset") is None


def test_session_turn_limit_rejects_on_real_traffic(
    fastchat_stack: FastChatStack, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(SESSION_MAX_TURNS=3, SESSION_LIMIT_ACTION="reject")
    history: list[dict[str, str]] = [SYSTEM]
    with client_for(proxy.api_base) as client:
        for turn in range(1, 5):
            history.append({"role": "user", "content": user_text(200 + turn, words=10)})
            if turn <= 3:
                result = chat(
                    client,
                    fastchat_stack.model,
                    history,
                    stream=False,
                    headers={"X-Session-ID": "e2e-session-reject"},
                )
                history.append({"role": "assistant", "content": result.content})
                continue
            with pytest.raises(openai.APIStatusError) as caught:
                chat(
                    client,
                    fastchat_stack.model,
                    history,
                    stream=False,
                    headers={"X-Session-ID": "e2e-session-reject"},
                )
            assert caught.value.status_code == 409
            error = caught.value.response.json()["error"]
            assert error["code"] == "session_turn_limit"
            assert error["type"] == "invalid_request_error"


def _wait_idle(stack: FastChatStack, timeout: float) -> float:
    """Seconds until the worker reports an empty queue; fails after ``timeout``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if stack.worker_status()["queue_length"] == 0:
            return time.monotonic() - began
        time.sleep(0.05)
    pytest.fail(f"worker still busy {timeout}s after the client left: {stack.worker_status()}")


def test_client_disconnect_mid_stream_stops_fastchat_generation(
    fastchat_stack: FastChatStack, start_proxy: StartProxy
) -> None:
    proxy = start_proxy()
    model = fastchat_stack.model
    messages = [{"role": "user", "content": "Tell me a long story about the river and mountain."}]
    long_answer = 1800  # greedy decoding of this prompt runs to the length limit

    with client_for(proxy.api_base) as client:
        # Baseline: the whole answer, to know what a generation that is not stopped
        # costs the worker.
        _wait_idle(fastchat_stack, 10)
        cpu_before = fastchat_stack.worker_cpu_seconds()
        began = time.monotonic()
        full = chat(client, model, messages, stream=True, max_tokens=long_answer)
        full_seconds = time.monotonic() - began
        full_cpu = fastchat_stack.worker_cpu_seconds() - cpu_before
        assert full.finish_reason == "length"
        assert full_cpu > 1.0, f"baseline too cheap to tell ({full_cpu:.2f}s CPU)"

        # The same request, abandoned after a few chunks.
        cpu_before = fastchat_stack.worker_cpu_seconds()
        began = time.monotonic()
        with client.chat.completions.with_streaming_response.create(
            model=model,
            messages=sdk_messages(messages),
            max_tokens=long_answer,
            temperature=0,
            stream=True,
        ) as response:
            for index, _chunk in enumerate(response.parse()):
                if index == 3:
                    break
        # Leaving the block closed the connection mid-stream.
        assert fastchat_stack.worker_status()["queue_length"] <= 1
        idle_after = _wait_idle(fastchat_stack, timeout=full_seconds / 2)
        time.sleep(0.5)  # a generation still running would keep burning CPU here
        cpu_used = fastchat_stack.worker_cpu_seconds() - cpu_before

    print(
        f"\nfull answer {full_seconds:.2f}s, {full_cpu:.2f}s CPU; abandoned: "
        f"{cpu_used:.2f}s CPU, worker idle {idle_after:.2f}s after the client left"
    )
    assert cpu_used < full_cpu / 4, (
        f"worker used {cpu_used:.2f}s CPU after the client left "
        f"(full answer: {full_cpu:.2f}s, idle after {idle_after:.2f}s)"
    )
    # And the proxy still serves.
    assert httpx.get(f"{proxy.base_url}/healthz", timeout=5).status_code == 200


def test_prompt_at_the_budget_edge_reaches_fastchat_whole(
    fastchat_stack: FastChatStack, start_proxy: StartProxy, count_prompt: CountPrompt
) -> None:
    proxy = start_proxy()
    history: list[dict[str, str]] = [SYSTEM]
    for turn in range(1, 6):
        history.append({"role": "user", "content": user_text(300 + turn)})
        history.append({"role": "assistant", "content": user_text(400 + turn, words=10)})
    history.append({"role": "user", "content": user_text(306)})
    full = count_prompt(history)
    # max_tokens chosen so that the whole history is exactly context - max_tokens.
    # FastChat 0.2.36 keeps only context - max_new_tokens - 1 prompt tokens and would
    # silently drop the first one; the proxy's budget keeps one token of slack for it.
    max_tokens = MAX_POSITIONS - full
    with client_for(proxy.api_base) as client:
        result = chat(client, fastchat_stack.model, history, stream=False, max_tokens=max_tokens)
    forwarded = int(result.headers["x-trimproxy-prompt-tokens"])
    assert result.prompt_tokens == forwarded, (full, forwarded, result.prompt_tokens)
