"""The path rule (proxy/paths.py), by example and by property."""

from __future__ import annotations

from urllib.parse import unquote, urljoin, urlsplit

import pytest
import yarl
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from proxy.paths import BadPath, is_forwarded, normalise, route
from tests.support.properties import examples

CHAT = "/v1/chat/completions"

# The bypasses and escapes the path rule refuses (docs/architecture.md §3).
BYPASSES = [
    "/v1/./chat/completions",
    "/v1/chat/./completions",
    "/v1/x/../chat/completions",
    "/v1/%2e/chat/completions",
    "/v1/%2E/chat/completions",
    "/v1//chat/completions",
    "//v1/chat/completions",
    "/v1/chat/completions/",
    "/v1/chat/complet%69ons",
    "/x/../v1/chat/completions",
]
ESCAPES = [
    "/v1/../metrics",
    "/v1/%2e%2e/health",
    "/v1/%2E%2E/health",
    "/v1/.%2e/health",
    "/v1/models/../../health",
    "/v1/../tokenize",
    "/v1/..",
    "/v1/",
    "/./metrics",
    "/heal%74h",
]
REFUSED = [
    "/v1/..%2fmetrics",
    "/v1/..%2Fmetrics",
    "/v1/..%5cmetrics",
    "/v1/..\\metrics",
    "/v1/chat%2fcompletions",
    "/v1/a%00b",
    "/v1/a%zz",
    "/v1/a%2",
    "/v1/a b",
    "/v1/caf\u00e9",
    "v1/models",
    "",
]


@pytest.mark.parametrize("raw", BYPASSES)
def test_every_spelling_of_the_chat_path_routes_to_chat(raw: str) -> None:
    assert route(raw).path == CHAT


@pytest.mark.parametrize("raw", ESCAPES)
def test_a_path_that_walks_out_of_v1_is_refused(raw: str) -> None:
    with pytest.raises(BadPath, match="leaves /v1/"):
        route(raw)


@pytest.mark.parametrize("raw", REFUSED)
def test_encoded_slashes_and_odd_characters_are_refused(raw: str) -> None:
    with pytest.raises(BadPath):
        route(raw)


@pytest.mark.parametrize(
    "raw", [CHAT, "/v1/models", "/v1/embeddings", "/tokenize", "/detokenize", "/metrics"]
)
def test_paths_in_normal_form_are_routed_unchanged(raw: str) -> None:
    routed = route(raw)
    assert routed.path == raw and not routed.changed


def test_unknown_paths_in_normal_form_are_left_to_the_router() -> None:
    # Not forwarded (is_forwarded is False); the app's router answers 404.
    assert route("/admin").path == "/admin"
    assert not is_forwarded("/admin")


def test_other_escapes_are_kept_with_upper_case_hex() -> None:
    assert normalise("/v1/models/a%3ab%20c") == "/v1/models/a%3Ab%20c"


# --- properties -----------------------------------------------------------------

_SEGMENT_CHARS = st.sampled_from(list("abcAZ09-_~.!$&'()*+,;=:@"))
_segment = st.one_of(
    st.text(_SEGMENT_CHARS, min_size=0, max_size=6),
    st.sampled_from([".", "..", "%2e", "%2E", "%2e%2e", ".%2E", "%41", "%3a", "%7E", "%25"]),
)
raw_paths = st.lists(_segment, min_size=0, max_size=8).map(lambda s: "/" + "/".join(s))
any_text = st.text(max_size=40)


def _normalised_or_none(raw: str) -> str | None:
    try:
        return normalise(raw)
    except BadPath:
        return None


@settings(max_examples=examples(400))
@given(raw_paths)
@example("/v1/%2e%2e/%2e%2e/x")
def test_normal_form_has_no_dot_or_empty_segments(raw: str) -> None:
    path = normalise(raw)
    assert path.startswith("/")
    segments = path.split("/")[1:]
    assert path == "/" or all(s not in ("", ".", "..") for s in segments)
    assert "%2e" not in path.lower()


@settings(max_examples=examples(400))
@given(st.one_of(raw_paths, any_text))
def test_normalising_is_idempotent(raw: str) -> None:
    once = _normalised_or_none(raw)
    if once is not None:
        assert normalise(once) == once
        assert not route(once).changed or not is_forwarded(once)


@settings(max_examples=examples(400))
@given(st.one_of(raw_paths, any_text))
def test_nothing_routed_leaves_the_forwarded_space_unless_sent_plainly(raw: str) -> None:
    try:
        routed = route(raw)
    except BadPath:
        return
    if routed.changed:
        assert is_forwarded(routed.path)
    if raw.startswith("/v1/"):
        assert routed.path.startswith("/v1/")


@settings(max_examples=examples(400))
@given(raw_paths)
def test_the_http_client_sends_the_routed_path_byte_for_byte(raw: str) -> None:
    """What the upstream receives is exactly what was routed: yarl (aiohttp's URL
    type) leaves a normal-form path alone when told it is encoded already (without
    ``encoded=True`` it would re-quote: ``%3A`` becomes ``:``)."""
    path = normalise(raw)
    assert yarl.URL("http://upstream" + path, encoded=True).raw_path == path


@settings(max_examples=examples(400))
@given(raw_paths)
def test_agrees_with_rfc3986_resolution(raw: str) -> None:
    """Python's urljoin implements RFC 3986 5.2.4; after decoding the unreserved
    escapes and merging empty segments (first, as nginx's merge_slashes does), both
    agree. (urljoin splits off ``;params``, which RFC 3986 no longer has.)"""
    assume(";" not in raw)
    decoded = "/" + "/".join(
        unquote(s) if s.lower() in ("%2e", "%2e%2e", ".%2e", "%41", "%7e") else s
        for s in raw.split("/")[1:]
        if s
    )
    reference = urlsplit(urljoin("http://h/", decoded)).path
    merged = "/" + "/".join(s for s in reference.split("/") if s)
    assert normalise(raw) == merged.replace("%3a", "%3A")


@settings(max_examples=examples(300))
@given(st.lists(st.sampled_from(["./", "x/../", "%2e/", "/", "%2E/", "a/b/../../"]), max_size=5))
def test_chat_spelled_any_way_is_chat(noise: list[str]) -> None:
    raw = "/v1/" + "".join(noise) + "chat/" + "".join(reversed(noise)) + "completions"
    assert route(raw).path == CHAT
