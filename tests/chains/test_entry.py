"""A stored entry on the wire: read back whole as it was kept, its turn read alone
for a chain's walk, the earlier layout still read, anything else refused."""

from __future__ import annotations

import orjson

from proxy.chains.entry import Stored, Turn, parent_of, turn_of
from tests.chains.test_store import entry


def _vllm_like(n: int, parent: str | None = None) -> Stored:
    """An entry whose response object has vLLM's many fields around its output."""
    kept = entry(n, session="ns:h:abc", parent=parent)
    response = {"id": kept.response["id"], "created_at": 1, "instructions": None}
    response |= {"output": kept.response["output"], "usage": {"input_tokens": 9}, "user": None}
    return Stored(response, kept.input, kept.session_key, kept.session_shown, parent)


def test_an_entry_reads_back_whole_its_response_in_its_own_order() -> None:
    for kept in (_vllm_like(1), _vllm_like(2, parent="k1"), entry(3)):
        raw = kept.encode()
        back = Stored.decode(raw)
        assert back == kept
        assert back is not None
        assert orjson.dumps(back.response) == orjson.dumps(kept.response)
        assert parent_of(raw) == kept.parent


def test_a_chains_walk_reads_the_turn_alone() -> None:
    kept = _vllm_like(1, parent="k0")
    raw = kept.encode()
    assert turn_of(raw) == Turn(kept.items(), "ns:h:abc", "ns:h:abc")
    # The response's other fields are not the turn's: changed, the turn reads the same.
    parent, turn, rest = raw.split(b"\n")
    assert b"created_at" in rest and b"created_at" not in turn
    assert turn_of(b"\n".join((parent, turn, b"not json"))) == turn_of(raw)


def test_the_earlier_layout_is_still_read() -> None:
    kept = _vllm_like(1, parent="k0")
    fields: dict[str, object] = {"response": kept.response, "input": kept.input}
    fields |= {"session_key": kept.session_key, "session_shown": kept.session_shown}
    earlier = b"k0\n" + orjson.dumps(fields)
    assert Stored.decode(earlier) == kept
    assert turn_of(earlier) == Turn(kept.items(), kept.session_key, kept.session_shown)


def test_anything_else_is_no_entry() -> None:
    turn = orjson.dumps({"input": [], "output": [], "session_key": None})
    for raw in (b"no newline", b"p\nnot json", b"p\n[]", b"p\n" + turn + b"\n[]"):
        assert Stored.decode(raw) is None
    assert Stored.decode(b"p\n" + turn + b"\n" + orjson.dumps({"id": "r"})) is None
    for raw in (b"no newline", b"p\nnot json", b"p\n[]\n{}", b'p\n{"input": 1}\n{}'):
        assert turn_of(raw) is None
