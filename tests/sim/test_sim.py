"""The simulated upstream itself: wire shapes of both dialects, KV accounting,
disconnects, recording and knobs. Most tests run the sim in-process on a real
socket; the last ones go through the fixtures of ``tests/conftest.py``."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.sim import SimConfig, build_app
from proxy.sim import tokenizer as tok
from proxy.sim.state import STATE, SimState

CHAT = "/v1/chat/completions"


class Sim:
    """An in-process sim on 127.0.0.1 and a client session to it."""

    def __init__(self, runner: web.AppRunner, url: str, session: aiohttp.ClientSession) -> None:
        self.runner = runner
        self.url = url
        self.http = session

    @property
    def state(self) -> SimState:
        return self.runner.app[STATE]

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        async with self.http.post(self.url + path, json=body) as resp:
            raw = await resp.read()
            try:
                return resp.status, orjson.loads(raw)
            except orjson.JSONDecodeError:
                return resp.status, raw.decode()

    async def get(self, path: str) -> tuple[int, str]:
        async with self.http.get(self.url + path) as resp:
            return resp.status, await resp.text()

    async def stream(self, body: dict[str, Any]) -> list[str]:
        """The ``data:`` payloads of a streamed answer, in order."""
        async with self.http.post(self.url + CHAT, json={**body, "stream": True}) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            raw = (await resp.read()).decode()
        assert raw.endswith("\n\n")
        events = [e for e in raw.split("\n\n") if e]
        assert all(e.startswith("data: ") for e in events)
        return [e[len("data: ") :] for e in events]


SimFactory = Callable[..., Awaitable[Sim]]


@pytest.fixture
async def sim() -> AsyncIterator[SimFactory]:
    """``await sim(handler_cancellation=True, **SimConfig fields) -> Sim``."""
    started: list[Sim] = []

    async def start(*, handler_cancellation: bool = True, **config: Any) -> Sim:
        runner = web.AppRunner(
            build_app(SimConfig(**config)),
            access_log=None,
            handler_cancellation=handler_cancellation,
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        started.append(Sim(runner, f"http://127.0.0.1:{port}", aiohttp.ClientSession()))
        return started[-1]

    yield start
    for s in started:
        await s.http.close()
        await s.runner.cleanup()


def chat(n: int = 2, words: int = 20, **extra: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(n):
        messages.append({"role": "user", "content": " ".join(f"q{i}w{j}" for j in range(words))})
        messages.append({"role": "assistant", "content": f"answer {i}"})
    messages.append({"role": "user", "content": "last question"})
    return {"model": "sim-model", "messages": messages, **extra}


# -- the tokenizer ------------------------------------------------------------------


def test_tokenizer_counts_chatml_segments() -> None:
    msg = {"role": "user", "content": "abcdefgh"}  # "user\nabcdefgh" = 13 bytes -> 4
    assert tok.message_tokens(msg) == 3 + 4
    assert tok.prompt_tokens([msg], add_generation_prompt=True) == 7 + 4
    assert tok.prompt_tokens([msg], add_generation_prompt=False) == 7
    # Non-ASCII counts UTF-8 bytes: "é" is 2 bytes.
    assert tok.text_tokens("é" * 4) == 2
    # Parts: text joined, each non-text part a fixed cost.
    image = {"type": "image_url", "image_url": {"url": "x"}}
    parts = {"role": "user", "content": [{"type": "text", "text": "abcdefgh"}, image]}
    assert tok.message_tokens(parts) == 7 + tok.MEDIA_TOKENS


def test_token_ids_match_counts_and_are_prefix_stable() -> None:
    body = chat(3)
    msgs = body["messages"]
    ids = tok.prompt_ids(msgs, add_generation_prompt=True)
    assert len(ids) == tok.prompt_tokens(msgs, add_generation_prompt=True)
    shorter = tok.prompt_ids(msgs[:-2], add_generation_prompt=False)
    assert ids[: len(shorter)] == shorter
    # A rendered prompt counted as a raw string (FastChat's token_check) gives the
    # same number as the messages.
    rendered = tok.render(msgs, add_generation_prompt=True)
    assert tok.raw_prompt_tokens(rendered) == len(ids)
    assert tok.raw_prompt_ids(rendered) == ids


# -- vLLM dialect --------------------------------------------------------------------


async def test_vllm_models_and_health(sim: SimFactory) -> None:
    s = await sim(max_model_len=8192, model="m1")
    async with s.http.get(s.url + "/v1/models") as resp:
        models = await resp.json()
    card = models["data"][0]
    assert models["object"] == "list"
    assert card["id"] == "m1" and card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["max_model_len"] == 8192 and card["parent"] is None and card["root"] == "m1"
    assert card["permission"][0]["object"] == "model_permission"
    assert (await s.get("/health"))[0] == 200


async def test_vllm_chat_usage_matches_tokenize(sim: SimFactory) -> None:
    s = await sim()
    body = chat()
    status, answer = await s.post(CHAT, body)
    assert status == 200
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    choice = answer["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    usage = answer["usage"]
    expected = tok.prompt_tokens(body["messages"], add_generation_prompt=True)
    assert usage["prompt_tokens"] == expected
    assert usage["completion_tokens"] == 16
    assert usage["total_tokens"] == expected + 16
    status, counted = await s.post(
        "/tokenize", {"model": "sim-model", "messages": body["messages"]}
    )
    assert status == 200
    assert counted["count"] == expected == len(counted["tokens"])
    assert counted["max_model_len"] == 4096


async def test_vllm_max_tokens_limits_completion(sim: SimFactory) -> None:
    s = await sim()
    _, answer = await s.post(CHAT, chat(max_tokens=5))
    assert answer["usage"]["completion_tokens"] == 5
    assert answer["choices"][0]["finish_reason"] == "length"


async def test_vllm_stream_with_usage(sim: SimFactory) -> None:
    s = await sim()
    events = await s.stream(chat(stream_options={"include_usage": True}))
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    for c in chunks:
        assert c["object"] == "chat.completion.chunk" and isinstance(c["created"], int)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks if c["choices"] and "content" in c["choices"][0]["delta"]][1:]
    assert len(content) == 16
    assert all(c["usage"] is None for c in chunks[:-1])
    assert content[-1]["choices"][0]["finish_reason"] == "stop"
    usage = chunks[-1]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 16
    assert usage["usage"]["prompt_tokens"] == tok.prompt_tokens(
        chat()["messages"], add_generation_prompt=True
    )


async def test_vllm_stream_without_usage(sim: SimFactory) -> None:
    s = await sim()
    events = await s.stream(chat())
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert len(chunks) == 17  # role chunk + one per token
    assert all("usage" not in c for c in chunks)


async def test_vllm_context_errors_current(sim: SimFactory) -> None:
    s = await sim(max_model_len=100)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "x" * 1000}]
    long = {"model": "m", "messages": messages}
    prompt = tok.prompt_tokens(messages, add_generation_prompt=True)
    status, body = await s.post(CHAT, long)
    assert status == 400
    assert body == {
        "error": {
            "message": "This model's maximum context length is 100 tokens. However, your "
            f"request has {prompt} input tokens. Please reduce the length of the input "
            "messages.",
            "type": "BadRequestError",
            "param": "input_tokens",
            "code": 400,
        }
    }
    status, body = await s.post(CHAT, chat(n=0, max_tokens=99))
    assert status == 400
    assert body["error"]["param"] == "max_tokens"
    assert body["error"]["message"].startswith("'max_tokens' or 'max_completion_tokens' is too")


async def test_vllm_context_errors_legacy(sim: SimFactory) -> None:
    s = await sim(max_model_len=100, error_style="legacy")
    body = chat(n=0, max_tokens=95)
    prompt = tok.prompt_tokens(body["messages"], add_generation_prompt=True)
    status, answer = await s.post(CHAT, body)
    assert status == 400
    assert answer == {
        "object": "error",
        "message": "This model's maximum context length is 100 tokens. However, you requested "
        f"{prompt + 95} tokens ({prompt} in the messages, 95 in the completion). Please "
        "reduce the length of the messages or completion.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


async def test_vllm_strict_model_and_bad_json(sim: SimFactory) -> None:
    s = await sim(strict_model=True)
    status, body = await s.post(CHAT, {**chat(), "model": "other"})
    assert status == 404
    assert body["error"]["type"] == "NotFoundError" and body["error"]["param"] == "model"
    async with s.http.post(s.url + CHAT, data=b"{not json") as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == 400
    status, body = await s.post(CHAT, {"model": "sim-model", "messages": []})
    assert status == 400


async def test_vllm_metrics_names(sim: SimFactory) -> None:
    s = await sim(model="m")
    status, text = await s.get("/metrics")
    assert status == 200
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0' in text
    assert "vllm:num_requests_running{" in text and "vllm:num_requests_waiting{" in text
    assert "gpu_cache_usage_perc" not in text
    geometry = await sim(model="m", kv_blocks=192, block_size=32)
    _, text = await geometry.get("/metrics")
    assert 'vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="192"} 1.0' in text
    assert 'vllm:num_preemptions_total{engine="0",model_name="m"} 0.0' in text
    legacy = await sim(model="m", legacy_metrics=True)
    _, text = await legacy.get("/metrics")
    assert 'vllm:gpu_cache_usage_perc{model_name="m"} 0.0' in text
    assert "vllm:kv_cache_usage_perc" not in text
    assert "vllm:cache_config_info" not in text


async def test_completions_and_embeddings(sim: SimFactory) -> None:
    s = await sim()
    status, body = await s.post("/v1/completions", {"model": "m", "prompt": "abcd efgh"})
    assert status == 200 and body["object"] == "text_completion"
    assert body["usage"]["prompt_tokens"] == 3
    status, body = await s.post("/v1/embeddings", {"model": "m", "input": ["a", "bb"]})
    assert status == 200 and len(body["data"]) == 2
    assert body["usage"]["prompt_tokens"] == 2


# -- FastChat dialect ----------------------------------------------------------------


async def test_fastchat_models_and_missing_routes(sim: SimFactory) -> None:
    s = await sim(dialect="fastchat")
    _, text = await s.get("/v1/models")
    card = orjson.loads(text)["data"][0]
    assert card["owned_by"] == "fastchat" and "max_model_len" not in card
    assert (await s.get("/metrics"))[0] == 404
    assert (await s.get("/health"))[0] == 404
    assert (await s.post("/tokenize", {"prompt": "x"}))[0] == 404


async def test_fastchat_prompt_has_default_system(sim: SimFactory) -> None:
    s = await sim(dialect="fastchat")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    _, answer = await s.post(CHAT, {"model": "sim-model", "messages": messages})
    system = {"role": "system", "content": "You are a helpful assistant."}
    expected = tok.prompt_tokens([system, *messages], add_generation_prompt=True)
    assert answer["usage"]["prompt_tokens"] == expected
    assert set(answer) == {"id", "object", "created", "model", "choices", "usage"}


async def test_fastchat_stream_shape(sim: SimFactory) -> None:
    s = await sim(dialect="fastchat")
    events = await s.stream(chat(stream_options={"include_usage": True}))
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    for c in chunks[:-1]:
        assert "object" not in c and "created" not in c and "usage" not in c
    last = chunks[-1]
    assert last["object"] == "chat.completion.chunk" and "created" in last
    assert last["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    assert len(chunks) == 18  # role + 16 tokens + finish
    assert events[1].startswith('{"id": ')  # json.dumps separators, as FastChat writes


async def test_fastchat_errors(sim: SimFactory) -> None:
    s = await sim(dialect="fastchat", max_model_len=60, strict_model=True)
    long = {"model": "sim-model", "messages": [{"role": "user", "content": "x" * 400}]}
    status, body = await s.post(CHAT, long)
    assert status == 400
    assert body["object"] == "error" and body["code"] == 40303
    assert body["message"].startswith("This model's maximum context length is 60 tokens.")
    status, body = await s.post(CHAT, {**chat(n=0), "max_tokens": 0})
    assert (status, body["code"]) == (400, 40302)
    status, body = await s.post(CHAT, {**chat(n=0), "model": "nope"})
    assert (status, body["code"]) == (400, 40301)
    assert body["message"] == "Only sim-model allowed now, your model nope"
    tool = {"model": "sim-model", "messages": [{"role": "tool", "content": "x"}]}
    status, body = await s.post(CHAT, tool)
    assert status == 500 and body == "Internal Server Error"


async def test_fastchat_max_tokens_is_clamped_not_refused(sim: SimFactory) -> None:
    s = await sim(dialect="fastchat", max_model_len=60)
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1000}  # fmt: skip
    status, answer = await s.post(CHAT, body)
    assert status == 200
    assert answer["usage"]["completion_tokens"] == 16


async def test_fastchat_token_check(sim: SimFactory) -> None:
    s = await sim(dialect="fastchat", max_model_len=10)
    prompts = [{"model": "sim-model", "prompt": "abcdefgh", "max_tokens": 8},
               {"model": "sim-model", "prompt": "abcd", "max_tokens": 100}]  # fmt: skip
    status, body = await s.post("/api/v1/token_check", {"prompts": prompts})
    assert status == 200
    assert body == {"prompts": [
        {"fits": True, "tokenCount": 2, "contextLength": 10},
        {"fits": False, "tokenCount": 1, "contextLength": 10}]}  # fmt: skip


# -- KV accounting, pacing, disconnects ---------------------------------------------------


# How long a wait for the sim's state gives it before calling it a hang: a guard, not a
# measurement (the sim's CPU per request is measured by bench/overhead.py).
HANG_GUARD = 30.0


async def _until(predicate: Callable[[], bool], timeout: float = HANG_GUARD) -> float:
    """Seconds until ``predicate()`` held; fails after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def test_kv_blocks_grow_while_generating_and_free_at_end(sim: SimFactory) -> None:
    s = await sim(tokens_per_second=20, completion_tokens=40, block_size=4, kv_blocks=100)
    body = chat(n=0)
    prompt = tok.prompt_tokens(body["messages"], add_generation_prompt=True)
    task = asyncio.create_task(s.post(CHAT, body))
    await _until(lambda: s.state.kv.num_running == 1)
    first = s.state.kv.used_blocks
    assert first >= math.ceil(prompt / 4)
    await _until(lambda: s.state.kv.used_blocks > first)
    later = s.state.kv.used_blocks
    assert later > first
    assert later <= math.ceil((prompt + 40) / 4)
    status, answer = await task
    assert status == 200 and answer["usage"]["completion_tokens"] == 40
    assert s.state.kv.used_blocks == 0 and s.state.kv.num_running == 0


@pytest.mark.parametrize("cancellation", [True, False])
@pytest.mark.parametrize("stream", [True, False])
async def test_disconnect_frees_blocks_within_a_second(
    sim: SimFactory, cancellation: bool, stream: bool
) -> None:
    s = await sim(tokens_per_second=5, completion_tokens=100, handler_cancellation=cancellation)
    body = {**chat(), "stream": stream}
    async with aiohttp.ClientSession() as client:
        if stream:
            resp = await client.post(s.url + CHAT, json=body)
            await resp.content.readline()  # the role chunk is there
            assert s.state.kv.used_blocks > 0
            resp.close()  # drop the connection mid-answer
        else:
            pending = asyncio.create_task(client.post(s.url + CHAT, json=body))
            await _until(lambda: s.state.kv.num_running == 1)
            assert s.state.kv.used_blocks > 0
            pending.cancel()  # gives up waiting: aiohttp closes the connection
            with pytest.raises(asyncio.CancelledError):
                await pending
    # Freed by the disconnect, not by the end of the answer (100 tokens at 5 a second).
    await _until(lambda: s.state.kv.num_running == 0)
    assert s.state.kv.used_blocks == 0
    assert s.state.disconnects == 1
    record = s.state.recorder.snapshot()[-1]
    assert record["disconnected"] is True and record["path"] == CHAT
    assert record["completion_tokens"] < 100


async def test_full_cache_queues_requests(sim: SimFactory) -> None:
    # Room for one request at a time: prompt + 16 tokens needs more than half the cache.
    body = chat(n=0)
    prompt = tok.prompt_tokens(body["messages"], add_generation_prompt=True)
    blocks = math.ceil((prompt + 16) / 4)
    s = await sim(tokens_per_second=40, completion_tokens=16, block_size=4, kv_blocks=blocks + 1)
    first = asyncio.create_task(s.post(CHAT, body))
    await _until(lambda: s.state.kv.num_running == 1)
    second = asyncio.create_task(s.post(CHAT, body))
    await _until(lambda: s.state.kv.num_waiting == 1)
    _, text = await s.get("/metrics")
    assert 'vllm:num_requests_waiting{engine="0",model_name="sim-model"} 1.0' in text
    assert 'vllm:num_requests_running{engine="0",model_name="sim-model"} 1.0' in text
    results = await asyncio.gather(first, second)
    assert [r[0] for r in results] == [200, 200]
    assert s.state.kv.num_waiting == 0 and s.state.kv.used_blocks == 0


async def test_queued_client_that_leaves_is_dropped(sim: SimFactory) -> None:
    body = chat(n=0)
    prompt = tok.prompt_tokens(body["messages"], add_generation_prompt=True)
    s = await sim(tokens_per_second=10, completion_tokens=30, block_size=4,
                  kv_blocks=math.ceil((prompt + 30) / 4))  # fmt: skip
    first = asyncio.create_task(s.post(CHAT, body))
    await _until(lambda: s.state.kv.num_running == 1)
    async with aiohttp.ClientSession() as client:
        waiting = asyncio.create_task(client.post(s.url + CHAT, json=body))
        await _until(lambda: s.state.kv.num_waiting == 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    await _until(lambda: s.state.kv.num_waiting == 0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await _until(lambda: s.state.kv.num_running == 0)
    assert s.state.kv.used_blocks == 0


async def test_delay_before_first_byte(sim: SimFactory) -> None:
    s = await sim(delay_seconds=0.3)
    start = time.monotonic()
    status, _ = await s.post(CHAT, chat())
    assert status == 200 and time.monotonic() - start >= 0.3


# -- recording and knobs -------------------------------------------------------------


async def test_records_raw_bytes_and_headers(sim: SimFactory) -> None:
    s = await sim(record_limit=3)
    raw = b'{"model": "m",   "messages": [{"role": "user", "content": "h\\u00e9"}], "x": 1}'
    headers = {"Content-Type": "application/json", "X-Request-ID": "abc"}
    async with s.http.post(s.url + CHAT, data=raw, headers=headers) as resp:
        assert resp.status == 200
    record = s.state.recorder.snapshot()[-1]
    assert record["body"] == raw.decode()
    assert record["json"]["x"] == 1
    assert ["X-Request-ID", "abc"] in record["headers"]
    assert record["status"] == 200 and record["disconnected"] is False
    assert record["prompt_tokens"] == tok.prompt_tokens(
        orjson.loads(raw)["messages"], add_generation_prompt=True
    )
    for _ in range(4):
        await s.get("/v1/models")
    assert len(s.state.recorder.snapshot()) == 3  # bounded ring


async def test_sim_routes_are_not_recorded_and_clear(sim: SimFactory) -> None:
    s = await sim()
    await s.post(CHAT, chat())
    status, text = await s.get("/_sim/requests")
    assert status == 200 and len(orjson.loads(text)) == 1
    _, text = await s.get(f"/_sim/requests?path={CHAT}")
    assert orjson.loads(text)[0]["path"] == CHAT
    async with s.http.delete(s.url + "/_sim/requests") as resp:
        assert resp.status == 200
    _, text = await s.get("/_sim/requests")
    assert orjson.loads(text) == []


async def test_fail_next(sim: SimFactory) -> None:
    s = await sim()
    rule = {"status": 503, "body": {"error": "busy"}, "times": 2, "headers": {"Retry-After": "1"}}
    status, _ = await s.post("/_sim/config", {"fail_next": rule})
    assert status == 200
    assert (await s.get("/v1/models"))[0] == 200  # other paths unaffected
    for _ in range(2):
        async with s.http.post(s.url + CHAT, json=chat()) as resp:
            assert resp.status == 503 and resp.headers["Retry-After"] == "1"
            assert await resp.json() == {"error": "busy"}
    assert (await s.post(CHAT, chat()))[0] == 200
    await s.post("/_sim/config", {"fail_next": {"close": True}})
    with pytest.raises(aiohttp.ClientError):
        await s.post(CHAT, chat())
    assert (await s.post(CHAT, chat()))[0] == 200


async def test_runtime_knobs_and_reset(sim: SimFactory) -> None:
    s = await sim()
    status, state = await s.post(
        "/_sim/config", {"completion_tokens": 3, "kv_usage_override": 0.42, "max_model_len": 50}
    )
    assert status == 200 and state["kv_usage_override"] == 0.42
    _, answer = await s.post(CHAT, chat(n=0))
    assert answer["usage"]["completion_tokens"] == 3
    _, text = await s.get("/metrics")
    assert "vllm:kv_cache_usage_perc" in text and "} 0.42" in text
    async with s.http.get(s.url + "/v1/models") as resp:
        assert (await resp.json())["data"][0]["max_model_len"] == 50
    status, body = await s.post("/_sim/config", {"kv_blocks": 5})
    assert status == 400 and "kv_blocks" in body["error"]
    status, body = await s.post("/_sim/config", {"tokens_per_second": -1})
    assert status == 400
    status, body = await s.post("/_sim/config", {"max_model_len": "big"})
    assert status == 400 and "max_model_len" in body["error"]
    status, body = await s.post("/_sim/config", {"fail_next": {"status": 99}})
    assert status == 400
    assert (await s.get("/_sim/state"))[0] == 200
    _, state_text = await s.get("/_sim/state")
    assert orjson.loads(state_text)["fail_next"] == []  # all or nothing
    status, state = await s.post("/_sim/reset", {})
    assert status == 200
    assert state["config"]["completion_tokens"] == 16 and state["kv_usage_override"] is None
    assert state["requests_total"] == 0
    _, text = await s.get("/_sim/requests")
    assert orjson.loads(text) == []


# -- the subprocess fixtures ---------------------------------------------------------


def test_sim_upstream_fixture(sim_upstream: Any) -> None:
    import httpx

    assert sim_upstream.state()["requests_total"] == 0
    body = chat()
    with httpx.Client() as client:
        answer = client.post(sim_upstream.url + CHAT, json=body, headers={"X-Request-ID": "r1"})
    assert answer.status_code == 200
    (record,) = sim_upstream.chat_requests()
    assert record["json"] == body
    assert ["x-request-id", "r1"] in [[k.lower(), v] for k, v in record["headers"]]
    state = sim_upstream.configure(fail_next={"status": 500, "body": "boom"})
    assert state["fail_next"][0]["status"] == 500
    with httpx.Client() as client:
        failed = client.post(sim_upstream.url + CHAT, json=body)
    assert (failed.status_code, failed.text) == (500, "boom")
    sim_upstream.clear()
    assert sim_upstream.requests() == []
    assert "vllm:kv_cache_usage_perc" in sim_upstream.metrics()


def test_sim_upstream_is_reset_between_tests(sim_upstream: Any) -> None:
    state = sim_upstream.state()
    assert state["requests_total"] == 0 and state["fail_next"] == []


def test_sim_upstream_factory_fastchat(sim_upstream_factory: Any) -> None:
    import httpx

    fc = sim_upstream_factory("fastchat", max_model_len=64, completion_tokens=4)
    with httpx.Client() as client:
        models = client.get(fc.url + "/v1/models").json()
        answer = client.post(fc.url + CHAT, json=chat(n=0)).json()
        long = client.post(fc.url + CHAT, json=chat(n=3))
    assert "max_model_len" not in models["data"][0]
    assert answer["usage"]["completion_tokens"] == 4
    assert long.status_code == 400 and long.json()["code"] == 40303
