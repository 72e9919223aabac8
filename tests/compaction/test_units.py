"""The pure parts of compaction: what an item holds (``fold``), how it is put back
(``unfold``), and the seal (``Sealer``)."""

from __future__ import annotations

import base64
import os
import zlib
from typing import Any

import orjson
import pytest

from proxy.compaction.fold import fold, unfold
from proxy.compaction.items import carries, expand, make
from proxy.compaction.seal import PREFIX, CompactionRefused, Sealer, key_from_text
from proxy.dialects import responses
from proxy.ladder import placeholder
from proxy.metrics import Metrics
from proxy.tokens.approx import estimate_text
from tests.compaction.helpers import agent_input, types_of

KEY = os.urandom(32)


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def test_fold_clears_every_tool_output_but_the_latest_three_and_keeps_the_calls() -> None:
    items = [*agent_input(6), {"type": "compaction_trigger"}]
    folded = fold(items)
    assert types_of(folded) == types_of(items[:-1])  # the trigger left out, nothing else
    outputs = [i for i in folded if i["type"] == "function_call_output"]
    cleared = [o for o in outputs if o["output"].startswith("[tool output cleared")]
    assert len(cleared) == 3 and outputs[-3:] == [i for i in items if i in outputs[-3:]]
    # The ladder's own placeholder: what the output held, in (approximate) tokens.
    assert cleared[0]["output"] == placeholder(estimate_text(items[3]["output"]))
    calls = [i for i in folded if i["type"] == "function_call"]
    assert calls == [i for i in items if i.get("type") == "function_call"]


def test_unfold_takes_the_clients_user_messages_and_puts_back_the_rest() -> None:
    sealed = [user("a"), {"type": "function_call", "call_id": "1"}, user("b"), user("c")]
    # All sent back (shortened): each in its place.
    assert unfold([user("A"), user("B"), user("C")], sealed) == [
        user("A"), sealed[1], user("B"), user("C"),
    ]  # fmt: skip
    # Only the latest sent: the older put back from the seal.
    assert unfold([user("C")], sealed) == [user("a"), sealed[1], user("b"), user("C")]
    # The item alone (as context_management's clients send it): the seal whole.
    assert unfold([], sealed) == sealed
    # The client's other items before the item are what it stands for: left out.
    assert unfold([{"type": "reasoning"}, user("C")], sealed)[-1] == user("C")


def test_an_item_sent_back_expands_to_the_folded_conversation() -> None:
    sealer, metrics = Sealer(KEY, 1_000_000), Metrics()
    history = agent_input(5)
    kept, item = make(sealer, metrics, history, "key-a", "endpoint")
    assert [k["role"] for k in kept] == ["user"]
    new = user("Go on.")
    # The user's message as the client sent it back (content parts), in its place.
    whole = [*fold(history), new]
    whole[1] = kept[0]
    expanded = expand(sealer, metrics, [*kept, item, new], "key-a")
    assert expanded == whole
    # Compacted again: the newest item stands for everything before it.
    again, item2 = make(sealer, metrics, expanded, "key-a", "endpoint")
    assert expand(sealer, metrics, [*again, item2], "key-a") == [*whole[:-1], again[-1]]


def test_the_seal_refuses_a_changed_token_another_identity_and_another_key() -> None:
    sealer = Sealer(KEY, 1_000_000)
    token = sealer.seal(b'{"v": 1}', "key-a")
    assert token is not None and token.startswith(PREFIX)
    assert sealer.open(token, "key-a") == b'{"v": 1}'
    raw = bytearray(base64.urlsafe_b64decode(token[len(PREFIX) :]))
    raw[-1] ^= 1
    changed = PREFIX + base64.urlsafe_b64encode(bytes(raw)).decode()
    for bad, why in (
        (changed, "was changed"),
        (token, "another API key"),
        ("tpc1.!!", "not this proxy's"),
        ("opaque-from-openai", "made by this proxy"),
        (None, "made by this proxy"),
    ):
        with pytest.raises(CompactionRefused) as refused:
            sealer.open(bad, "key-b" if bad == token else "key-a")
        assert why in refused.value.message
    with pytest.raises(CompactionRefused) as other:
        Sealer(os.urandom(32), 1_000_000).open(token, "key-a")
    assert "another deployment" in other.value.message


def test_the_seal_is_bounded_both_ways() -> None:
    sealer = Sealer(KEY, 2048)
    assert sealer.seal(os.urandom(4096), "k") is None  # over the bound: not made
    with pytest.raises(CompactionRefused):
        sealer.open(PREFIX + "A" * 4096, "k")
    # What a token unpacks to is bounded too (a small token of many zeros).
    bomb = Sealer(KEY, 2048)
    token = bomb.seal(b"\0" * (64 * 2048 + 10), "k")
    assert token is not None
    with pytest.raises(CompactionRefused):
        bomb.open(token, "k")
    assert len(zlib.compress(b"\0" * 200_000)) < 2048


def test_an_item_over_the_bound_leaves_out_its_oldest_folded_pairs() -> None:
    sealer, metrics = Sealer(KEY, 8000), Metrics()
    history = agent_input(40, size=2000)
    _, item = make(sealer, metrics, [*history[:2], *history[2:]], "k", "endpoint")
    assert len(item["encrypted_content"]) <= 8000
    sealed = orjson.loads(sealer.open(item["encrypted_content"], "k"))["items"]
    ids = [i.get("call_id") for i in sealed if "call_id" in i]
    assert ids and all(ids.count(c) == 2 for c in set(ids))  # pairs whole
    assert sealed[-1] == fold(history)[-1]  # the newest kept


def test_key_from_text() -> None:
    assert key_from_text("ab" * 32) == bytes.fromhex("ab" * 32)
    assert len(key_from_text("any passphrase")) == 32
    assert key_from_text("any passphrase") == key_from_text("any passphrase")


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ([user("a"), {"type": "compaction", "encrypted_content": "x"}], True),
        ([user("a"), {"type": "compaction_trigger"}], True),
        ([user("a"), {"role": "assistant", "content": "b"}, {"type": "function_call"}], False),
        # What a hostile client may put there is read, never an error.
        ([{"type": ["compaction"]}, {"type": None}, "compaction", 3], False),
        ("compaction", False),
        (None, False),
        ([], False),
    ],
)
def test_carries_finds_an_item_or_a_trigger_anywhere(value: Any, found: bool) -> None:
    assert carries(value) is found


@pytest.mark.parametrize(
    "value",
    [
        [user("a"), {"type": "compaction", "encrypted_content": "x"}],
        [{"type": "compaction_trigger"}, user("a")],
        [user("a"), {"role": "assistant", "content": "b"}, {"type": "function_call"}],
        [user("a"), {"type": ["compaction"]}, {"type": {"a": 1}}, {"type": 3}],
        [user("a"), {"role": "assistant", "content": "b"}],
        "compaction",
        [],
    ],
)
def test_the_responses_parse_tells_what_carries_tells(value: Any) -> None:
    """The parse notes a compaction item on its way (the step asks it, not ``carries``),
    and an odd ``type`` is read, never an error."""
    conv = responses.parse(orjson.dumps({"model": "m", "input": value}))
    assert conv.holds_compaction is carries(value)
