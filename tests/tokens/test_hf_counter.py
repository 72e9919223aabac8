"""The hf backend counts exactly what apply_chat_template counts, faster."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from proxy.tokens.hf import HFCounter
from proxy.tokens.hf.normalize import merged_systems, supports_developer, to_conversation
from tests.support.properties import examples
from tests.tokens.conversations import TOOLS, conversations, growing_chat

TINY_TEMPLATES = ["tools_default_system", "think_strip", "sliced_system", "content_parts"]
FAST = settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def reference(counter: HFCounter, messages: list[Any], tools: Any = None) -> int:
    """What vLLM counts: its normalised messages through apply_chat_template.

    Trap: transformers 5 returns a BatchEncoding (len 2, its keys) from
    apply_chat_template(tokenize=True) unless return_dict=False.
    """
    template = counter._template(tools)
    conversation, _ = to_conversation(messages, template.format)
    ids = counter._tok.apply_chat_template(
        conversation, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    return len(ids)


def count(counter: HFCounter, messages: list[Any], tools: Any = None) -> Any:
    return asyncio.run(counter.count(messages, tools=tools))


def check(counter: HFCounter, messages: list[Any], tools: Any = None) -> Any:
    got = count(counter, messages, tools)
    assert len(got.per_message) == len(messages)
    assert min(got.per_message, default=0) >= 0 and got.overhead >= 0
    assert got.total == sum(got.per_message) + got.overhead == reference(counter, messages, tools)
    return got


def test_batch_encoding_trap(tiny_dir: Path, hf_counter: Callable[[Path], HFCounter]) -> None:
    tok = hf_counter(tiny_dir)._tok
    messages = [{"role": "user", "content": "a fairly long question about tokens"}]
    as_dict = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert len(as_dict) == 2  # input_ids, attention_mask: not a token count
    assert len(as_dict["input_ids"]) > 2
    assert check(hf_counter(tiny_dir), messages).total == len(as_dict["input_ids"])


@pytest.mark.parametrize("name", TINY_TEMPLATES)
def test_fast_path_passes_its_start_up_check(
    name: str, template_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(template_dir(name))
    assert counter.failures == ()


@pytest.mark.parametrize("name", TINY_TEMPLATES)
def test_exact_on_generated_conversations(
    name: str, template_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(template_dir(name))
    with_tools = name == "tools_default_system"

    @FAST
    @given(conversations(tools=with_tools, parts=True))
    def run(messages: list[Any]) -> None:
        check(counter, messages, TOOLS if with_tools else None)
        check(counter, messages)

    run()


def test_exact_with_the_tiny_models_own_template(
    tiny_dir: Path, hf_counter: Callable[[Path], HFCounter]
) -> None:
    # FastChat's qwen-7b-chat: the last system message wins and is rendered first.
    counter = hf_counter(tiny_dir)

    @FAST
    @given(conversations(tools=False, parts=False))
    def run(messages: list[Any]) -> None:
        check(counter, messages)
        late = [*messages[:-1], {"role": "system", "content": "late rule"}, messages[-1]]
        check(counter, late)

    run()


def test_default_system_prompt_and_tools_are_overhead(
    template_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(template_dir("tools_default_system"))
    enc = counter._tok.backend_tokenizer
    user = [{"role": "user", "content": "hi there"}]
    plain = check(counter, user)
    # The message's own segment, exactly; the default system prompt + generation
    # prompt are overhead.
    segment = len(enc.encode("<|im_start|>user\nhi there<|im_end|>\n").ids)
    assert plain.per_message == (segment,)
    default = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>assistant\n"
    assert plain.overhead == len(enc.encode(default).ids)
    with_tools = check(counter, user, TOOLS)
    assert with_tools.per_message == plain.per_message
    assert with_tools.overhead > plain.overhead


def test_template_that_ignores_tools(
    template_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(template_dir("sliced_system"))
    messages = [{"role": "system", "content": " be brief "}, {"role": "user", "content": "yo"}]
    assert check(counter, messages, TOOLS) == check(counter, messages)


def test_reasoning_is_counted_only_where_the_template_keeps_it(
    template_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(template_dir("think_strip"))
    thought = "<think>\n" + "long private reasoning " * 30 + "\n</think>\n\nShort answer."
    last = [{"role": "user", "content": "q"}, {"role": "assistant", "content": thought}]
    history = [*last, {"role": "user", "content": "next"}]
    kept = check(counter, last).per_message[1]
    stripped = check(counter, history).per_message[1]
    assert kept > stripped + 100  # the same message costs far less once it is history


def test_vllm_normalisation_is_what_gets_counted(
    template_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(template_dir("tools_default_system"))
    sent: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"word": "pear"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "a fruit"},
        {"role": "user", "content": "ok"},
    ]
    # What vLLM renders: parts joined by "\n", None content as "", arguments a dict.
    as_vllm = [
        {"role": "user", "content": "one\ntwo"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": {"word": "pear"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "a fruit"},
        {"role": "user", "content": "ok"},
    ]
    ids = counter._tok.apply_chat_template(
        as_vllm, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert count(counter, sent, TOOLS).total == len(ids)
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == '{"word": "pear"}'  # untouched


def test_request_messages_are_not_modified(
    template_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(template_dir("content_parts"))
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": "x"}},
            ],
        }
    ]
    snapshot = repr(messages)
    got = count(counter, messages)
    assert repr(messages) == snapshot
    assert got.per_message[0] > 1000  # the image is estimated, not ignored


def test_attribution_follows_messages_in_a_growing_chat(
    template_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(template_dir("tools_default_system"))
    chat = growing_chat(12)
    previous = None
    for end in range(2, len(chat) + 1, 2):
        got = check(counter, chat[:end])
        if previous is not None:  # old messages keep their counts as the chat grows
            assert got.per_message[: len(previous.per_message)] == previous.per_message
        previous = got


def test_warm_requests_encode_only_new_text(
    template_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(template_dir("tools_default_system"))
    encoded: list[str] = []
    real = counter.runs._encode

    def spy(texts: list[str]) -> list[int]:
        encoded.extend(texts)
        return real(texts)

    counter.runs._encode = spy
    try:
        chat = [*growing_chat(10), {"role": "user", "content": "brand new question 12345"}]
        count(counter, chat[:-2])
        encoded.clear()
        count(counter, chat[:-2])
        assert encoded == []  # repeat: nothing to encode
        count(counter, chat)
        new_chars = len(chat[-1]["content"]) + len(chat[-2]["content"])
        assert 0 < sum(map(len, encoded)) <= new_chars + 64
    finally:
        counter.runs._encode = real


async def test_real_published_tokenizer_is_exact(
    deepseek_dir: Path, hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(deepseek_dir)
    assert counter.failures == ()

    @FAST
    @given(conversations(tools=False, parts=True))
    def run(messages: list[Any]) -> None:
        check(counter, messages)

    await asyncio.to_thread(run)


def test_real_tokenizer_strips_history_reasoning_and_hoists_system(
    deepseek_dir: Path, hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(deepseek_dir)
    chat = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>" + "hidden " * 50 + "</think>shown"},
        {"role": "system", "content": "A system prompt that the template moves to the front."},
        {"role": "user", "content": "again"},
    ]
    got = check(counter, chat)
    assert got.per_message[1] < 10  # the reasoning is not rendered at all
    assert got.per_message[2] == 0  # rendered at the front: counted there, never twice


def test_template_errors_fall_back_to_an_estimate(
    deepseek_dir: Path, hf_counter: Callable[[Path], HFCounter]
) -> None:
    # DeepSeek-R1's template concatenates the arguments as a string; vLLM parses them to
    # a dict first, so the template fails (and vLLM refuses the request). No crash here.
    counter = hf_counter(deepseek_dir)
    chat = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "r"},
    ]
    with pytest.raises(TypeError):
        reference(counter, chat)
    got = count(counter, chat)
    assert got.total > 0 and len(got.per_message) == 3


async def test_a_big_new_message_leaves_the_event_loop_free(
    deepseek_dir: Path, hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(deepseek_dir)
    text = " ".join(f"word{i} 数据{i % 97}" for i in range(30_000))  # far from any cache
    messages = [{"role": "user", "content": text}]
    # The real encode, made to wait for the event loop: it ends only when the loop,
    # running meanwhile, says so (an encode on the loop's thread fails at once; no
    # stopwatch on the loop's gaps).
    loop_thread = threading.current_thread()
    calls: list[tuple[int, bool]] = []  # (characters, on the loop's thread)
    loop_ran = threading.Event()
    encode_runs = counter.runs._encode_runs

    def watched(runs: list[tuple[str, bool]]) -> list[int]:
        on_loop = threading.current_thread() is loop_thread
        calls.append((sum(len(chunk) for chunk, _ in runs), on_loop))
        if not on_loop:
            assert loop_ran.wait(10.0), "the event loop was blocked while encoding"
        return encode_runs(runs)

    async def release_from_the_loop() -> None:
        while not any(not on_loop for _, on_loop in calls):
            await asyncio.sleep(0.001)
        loop_ran.set()

    counter.runs._encode_runs = watched  # type: ignore[method-assign]
    releaser = asyncio.create_task(release_from_the_loop())
    try:
        got = await counter.count(messages)
    finally:
        releaser.cancel()
        counter.runs._encode_runs = encode_runs  # type: ignore[method-assign]
    assert got.total == await asyncio.to_thread(reference, counter, messages)
    big = [on_loop for chars, on_loop in calls if chars >= len(text)]
    assert big == [False], calls  # the big message was encoded off the loop, once


@pytest.fixture
def named_dir(
    template_dir: Callable[[str], Path], tiny_dir: Path, deepseek_dir: Path
) -> Callable[[str], Path]:
    """The tokenizer directory for one of ``TINY_TEMPLATES``, "tiny" or "deepseek"."""
    return lambda name: {"tiny": tiny_dir, "deepseek": deepseek_dir}.get(name) or template_dir(name)


@pytest.mark.parametrize("name", [*TINY_TEMPLATES, "tiny", "deepseek"])
def test_each_message_is_found_inside_its_own_stretch(
    name: str, named_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    counter = hf_counter(named_dir(name))
    tools = TOOLS if name == "tools_default_system" else None

    @FAST
    @given(conversations(tools=tools is not None, parts=False))
    def run(messages: list[Any]) -> None:
        template = counter._template(tools)
        conversation, _ = to_conversation(messages, template.format)
        rendered = template.tracked.render(counter._prepare(conversation), tools)
        text, bounds = rendered.text, rendered.bounds
        assert list(bounds) == sorted(bounds)
        for i, message in enumerate(conversation):
            content = message["content"]
            if message["role"] == "system" or not isinstance(content, str):
                continue  # templates move system prompts; parts are not one string
            content = content.strip()
            if len(content) < 8 or text.count(content) != 1:
                continue  # transformed by the template, or ambiguous
            at = text.index(content)
            assert bounds[i] <= at < bounds[i + 1], (i, message["role"])

    run()


def test_the_plain_paths_stay_exact(
    template_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    # What a tokenizer or template that fails the start-up check gets: the text from
    # transformers, the total from encoding it whole, the split by estimate.
    path = template_dir("think_strip")
    counter = HFCounter(hf_counter(path)._tok, str(path))
    counter.self_check()
    counter._tally = counter._by_whole_encode
    for template in counter._templates.values():
        template.choose(False, counter._estimated)
    chat = growing_chat(3)
    got = check(counter, chat)
    assert min(got.per_message) > 0
    asyncio.run(counter.aclose())


@pytest.mark.parametrize("name", [*TINY_TEMPLATES, "tiny", "deepseek"])
def test_placing_messages_in_a_plain_render_splits_as_tracking_does(
    name: str, named_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    # The located split must be the tracked one, message for message: a counter that
    # places messages and one that never does (every locator refuted) count alike.
    path = named_dir(name)
    tok = hf_counter(path)._tok
    located, tracked_only = HFCounter(tok, str(path)), HFCounter(tok, str(path))
    tools = TOOLS if name == "tools_default_system" else None
    variants = [None] if tools is None else [None, tools]
    for counter in (located, tracked_only):
        counter.self_check()
        for variant in variants:
            counter._template(variant)
    locators = [t.locators[i] for t in located._templates.values() for i in (0, 1)]
    for template in tracked_only._templates.values():
        for locator in template.locators:
            locator.refuted = True

    @FAST
    @given(conversations(tools=tools is not None, parts=False))
    def run(messages: list[Any]) -> None:
        for locator in locators:
            # Reasoning-heavy examples would trip the valve (``Locator.note``); kept
            # on, every example a locator can place is compared.
            locator.missed = 0
        for variant in variants:
            assert count(located, messages, variant) == count(tracked_only, messages, variant)

    run()
    if name != "content_parts":  # loops over content parts: nothing to search for
        assert sum(locator.placed for locator in locators) > 0
    for counter in (located, tracked_only):
        asyncio.run(counter.aclose())


def _ids(counter: HFCounter, conversation: list[Any]) -> int:
    ids = counter._tok.apply_chat_template(
        conversation, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return len(ids)


def test_developer_messages_are_counted_as_the_system_messages_vllm_makes_them(
    template_dir: Callable[[str], Path], hf_counter: Callable[[Path], HFCounter]
) -> None:
    """A template that never names the developer role (vLLM's test: the quoted name in
    its source) gets developer messages as system ones, every system message merged
    into one at the start; the default system prompt is then not added."""
    counter = hf_counter(template_dir("tools_default_system"))
    assert not counter._template(None).developer
    sent: list[dict[str, Any]] = [
        {"role": "developer", "content": "Work in /repo."},
        {"role": "user", "content": "hi"},
    ]
    first = count(counter, sent)
    assert first.total == _ids(counter, [{**sent[0], "role": "system"}, sent[1]])
    # This template renders no developer role at all: as one, the message would be lost.
    assert first.per_message[0] > 0
    assert len(first.per_message) == 2 and sent[0]["role"] == "developer"  # untouched
    later: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "developer", "content": [{"type": "text", "text": "Now in /tmp."}]},
        {"role": "user", "content": "go on"},
    ]
    merged = [
        {"role": "system", "content": "Be brief.\n\nNow in /tmp."},
        later[1],
        later[2],
        later[4],
    ]
    got = count(counter, later)
    assert got.total == sum(got.per_message) + got.overhead == _ids(counter, merged)
    assert len(got.per_message) == len(later) and min(got.per_message) >= 0


def test_which_templates_take_the_developer_role() -> None:
    assert supports_developer("{% if m['role'] == 'developer' %}")
    assert supports_developer('{% if m.role == "developer" %}')
    assert not supports_developer("{{ m.role }}: {{ m.content }}")
    conversation: list[dict[str, Any]] = [
        {"role": "system", "content": "a"},
        {"role": "user", "content": "b"},
    ]
    assert merged_systems(conversation) is None
    twice = [*conversation, {"role": "system", "content": ""}, {"role": "system", "content": "c"}]
    assert merged_systems(twice) == [
        {"role": "system", "content": "a\n\nc"},
        {"role": "user", "content": "b"},
    ]
