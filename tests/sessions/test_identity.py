"""Session identity and conversation hashes (proxy/sessions/identity.py)."""

from __future__ import annotations

from starlette.datastructures import Headers

from proxy.sessions.identity import HASH_HEX, Identity, hash_conversation, identify
from tests.sessions.helpers import conversation


def ident(headers: dict[str, str], user: str | None = None, users: int = 3) -> Identity:
    return identify(Headers(headers), "X-Session-ID", user, conversation(users))


def test_header_then_user_then_fingerprint() -> None:
    by_header = ident({"x-session-id": "chat-42"}, user="alice")
    assert (by_header.source, by_header.shown) == ("header", "chat-42")
    by_user = ident({}, user="alice")
    assert (by_user.source, by_user.shown) == ("user", "alice")
    by_print = ident({})
    assert by_print.source == "fingerprint" and by_print.shown.startswith("fp-")
    assert len({by_header.key, by_user.key, by_print.key}) == 3


def test_header_name_is_configurable_and_case_insensitive() -> None:
    found = identify(Headers({"x-conv": "c1"}), "X-Conv", None, conversation(1))
    assert (found.source, found.shown) == ("header", "c1")


def test_fingerprint_is_stable_while_the_conversation_grows() -> None:
    first = ident({}, users=1)
    assert ident({}, users=2).key == first.key
    forked = identify(Headers({}), "X-Session-ID", None, conversation(9, tag="b"))
    assert forked.key == first.key  # same system + first message
    other_system = identify(Headers({}), "X-Session-ID", None, conversation(2, system="Be loud."))
    assert other_system.key != first.key


def test_api_keys_namespace_every_id() -> None:
    for extra in ({"x-session-id": "shared"}, {}):
        a = ident({"authorization": "Bearer key-a", **extra}, user="same-user")
        b = ident({"authorization": "Bearer key-b", **extra}, user="same-user")
        anonymous = ident(extra, user="same-user")
        assert (a.shown, a.source) == (b.shown, b.source)
        assert len({a.key, b.key, anonymous.key}) == 3
    fp_a = ident({"authorization": "Bearer key-a"})
    fp_b = ident({"authorization": "Bearer key-b"})
    assert fp_a.key != fp_b.key and fp_a.shown != fp_b.shown


def test_an_x_api_key_namespaces_as_the_same_bearer_key_does() -> None:
    by_bearer = ident({"authorization": "Bearer key-a"}, user="u")
    by_header = ident({"x-api-key": "key-a"}, user="u")
    assert by_header.key == by_bearer.key != ident({}, user="u").key
    assert ident({"x-api-key": "key-b"}, user="u").key != by_bearer.key


def test_keys_are_bounded_and_unsafe_ids_are_not_echoed() -> None:
    long_id = ident({}, user="u" * 10_000)
    odd_id = ident({}, user="line\nbreak é")
    assert len(long_id.key) < 64 and len(odd_id.key) < 64
    for found in (long_id, odd_id):
        assert found.shown.startswith("id-") and found.shown.isascii()
    assert long_id.key != odd_id.key


def test_prefix_hashes_mark_every_user_message() -> None:
    messages = conversation(4)
    hashes = hash_conversation(messages)
    assert hashes.user_starts == (1, 3, 5, 7)
    assert len(hashes.prefix_hashes) == 4 * HASH_HEX
    # Growing the conversation keeps earlier prefix hashes; editing an old message
    # changes every hash after it.
    longer = hash_conversation(conversation(6))
    assert longer.prefix_hashes.startswith(hashes.prefix_hashes)
    edited = [dict(m) for m in messages]
    edited[4]["content"] = "a different answer"  # the answer before the 3rd user message
    changed = hash_conversation(edited)
    assert changed.prefix_hashes[: 2 * HASH_HEX] == hashes.prefix_hashes[: 2 * HASH_HEX]
    assert changed.prefix_hash(2) != hashes.prefix_hash(2)
    assert changed.prefix_hash(3) != hashes.prefix_hash(3)


def test_prefix_hashes_ignore_key_order_and_non_identity_fields() -> None:
    messages = conversation(3)
    reordered = [dict(reversed(list(m.items()))) for m in messages]
    decorated = [{**m, "x_ui_id": i} for i, m in enumerate(messages)]
    base = hash_conversation(messages).prefix_hashes
    assert hash_conversation(reordered).prefix_hashes == base
    assert hash_conversation(decorated).prefix_hashes == base
