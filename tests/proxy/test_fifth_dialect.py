"""A fifth dialect from one row of the dialect table alone (docs/architecture.md §22):
a made-up wire format, ``POST /v2/notes``, added through ``create_app(dialects=...)``
and nothing else, is parsed, trimmed, guarded by ``TRIMPROXY_API_KEYS`` (its path is
outside ``/v1/``), labelled in ``/metrics`` and answers its errors in its own envelope.

Its engine route is chat's (``upstream``), so the sim answers it; the body is always
rendered (``forwards_raw=False``), the notes turned into chat messages.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
from asgi_lifespan import LifespanManager

from proxy.app import create_app
from proxy.body import common_fields, load_object, positive_int
from proxy.dialects.conversation import Conversation
from proxy.errors import InvalidRequest, ProxyError
from proxy.metrics import Metrics
from proxy.pipeline.dialect import Dialect, Envelope
from proxy.pipeline.table import builtin_dialects
from proxy.tokens.usage import prompt_tokens
from proxy.types import Message
from tests.support.inprocess import BASE_URL, make_settings
from tests.support.sim import SimUpstream

NOTES_PATH = "/v2/notes"
_ROLES = {"sys": "system", "me": "user", "bot": "assistant"}
KEY = "notes-key"


def _parse(raw: bytes) -> Conversation:
    body = load_object(raw, "'model' and 'notes'")
    notes = body.get("notes")
    if not isinstance(notes, list) or not notes or not all(_is_note(n) for n in notes):
        raise InvalidRequest("'notes' must be a non-empty list of {who, text}.", param="notes")
    model, stream = common_fields(body)
    return Conversation(
        endpoint="notes",
        body=body,
        items=notes,
        given_roles=[{"role": _ROLES[n["who"]]} for n in notes],
        head=0,
        model=model,
        stream=stream,
        max_tokens=positive_int(body, "max_tokens"),
        user=None,
        tools=None,
    )


def _is_note(note: object) -> bool:
    return (
        isinstance(note, dict) and note.get("who") in _ROLES and isinstance(note.get("text"), str)
    )


def _to_chat(conv: Conversation, kept: Sequence[int]) -> tuple[list[Message], list[int]]:
    messages = [{"role": conv.roles[i]["role"], "content": conv.items[i]["text"]} for i in kept]
    return messages, list(kept)


def _render(conv: Conversation, kept: Sequence[int], max_tokens: int | None) -> bytes:
    body: dict[str, Any] = {"model": conv.model, "messages": _to_chat(conv, kept)[0]}
    if max_tokens is not None or conv.max_tokens is not None:
        body["max_tokens"] = max_tokens or conv.max_tokens
    return orjson.dumps(body)


def _plain(status: int, message: str, code: str) -> bytes:
    return orjson.dumps({"notes_error": {"status": status, "why": message}})


def _body(exc: ProxyError) -> bytes:
    return _plain(exc.status, exc.message, exc.code)


NOTES = Dialect(
    endpoint="notes",
    path=NOTES_PATH,
    parse=_parse,
    to_chat=_to_chat,
    render=_render,
    usage=prompt_tokens,
    envelope=Envelope(
        body=_body, stream_event=lambda exc: b"event: oops\ndata: " + _body(exc), plain=_plain
    ),
    upstream="/v1/chat/completions",
    forwards_raw=False,
    summary="Notes, trimmed to the token budget",
)


@asynccontextmanager
async def notes_proxy(sim: SimUpstream) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(
        sim.url, tokenizer="approx", api_keys=KEY, max_prompt_tokens=200, context_window=4096
    )
    app = create_app(settings, Metrics(), dialects=(*builtin_dialects(), NOTES))
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
            yield client


def _notes(turns: int) -> list[dict[str, str]]:
    notes = [{"who": "sys", "text": "Be brief."}]
    for k in range(turns):
        notes.append({"who": "me", "text": f"question {k} " + "words " * 40})
        notes.append({"who": "bot", "text": f"answer {k} " + "words " * 40})
    notes.append({"who": "me", "text": "the last question"})
    return notes


async def test_a_fifth_dialect_is_served_from_its_row_alone(sim_upstream: SimUpstream) -> None:
    keyed = {"authorization": f"Bearer {KEY}"}
    async with notes_proxy(sim_upstream) as client:
        notes = _notes(turns=12)
        body = {"model": "sim-model", "notes": notes, "max_tokens": 4}
        # Guarded: its path is outside /v1/, and still needs a key, refused in its envelope.
        refused = await client.post(NOTES_PATH, json=body)
        assert refused.status_code == 401
        assert refused.json()["notes_error"]["status"] == 401
        assert not sim_upstream.chat_requests()
        # Parsed and trimmed: the engine gets chat messages, the oldest turns dropped.
        answered = await client.post(NOTES_PATH, json=body, headers=keyed)
        assert answered.status_code == 200, answered.text
        dropped = int(answered.headers["x-trimproxy-trimmed-messages"])
        assert dropped > 0
        sent = sim_upstream.chat_requests()[-1]["json"]["messages"]
        assert len(sent) == len(notes) - dropped
        assert sent[0] == {"role": "system", "content": "Be brief."}
        assert sent[-1] == {"role": "user", "content": "the last question"}
        # Its own envelope: a body it cannot parse, another method on its path.
        bad = await client.post(NOTES_PATH, json={"model": "m", "notes": []}, headers=keyed)
        assert bad.status_code == 400
        assert "'notes' must be" in bad.json()["notes_error"]["why"]
        wrong = await client.get(NOTES_PATH, headers=keyed)
        assert wrong.status_code == 405
        assert wrong.json()["notes_error"]["status"] == 405
        # Labelled: its route and its endpoint in /metrics.
        text = (await client.get("/metrics")).text
        assert f'trimproxy_requests_total{{code="200",route="{NOTES_PATH}"}} 1.0' in text
        assert 'endpoint="notes"' in text
        assert f'route="{NOTES_PATH}"' in text.split("trimproxy_upstream_ttfb_seconds", 1)[1]
