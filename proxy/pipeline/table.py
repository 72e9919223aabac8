"""The dialect table (docs/architecture.md §22): one ``Dialect`` row per prompt route,
and everything that lists routes derived from it, so a new dialect is one row and a
new prompt route can never be left unguarded, unlabelled or in the wrong envelope.

``Table`` gives the path table (the prompt paths that are never relayed blind), the
API keys' and the in-flight limit's prefixes, the metrics' ``route`` labels and the
error envelope of any path; the handler (``proxy.pipeline.handler``) builds each row's
routes; each row carries its own continuation form, usage reader and answer shape,
which the forward step, the relay and KV admission read from the prepared request.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.routing import BaseRoute, Route

from proxy.admission.overrun import MESSAGES_ANSWER, RESPONSES_ANSWER
from proxy.dialects import (
    anthropic_errors,
    chat,
    completions,
    messages,
    messages_chat,
    responses,
    tool_outputs,
)
from proxy.dialects.conversation import Conversation
from proxy.errors import InvalidRequest, ProxyError
from proxy.metrics import OWN_ROUTES
from proxy.openapi import CHAT_BODY, CHAT_RESPONSES
from proxy.paths import FORWARDED_EXACT, FORWARDED_PREFIX
from proxy.pipeline import chain as response_chain
from proxy.pipeline import context_management
from proxy.pipeline.continuation import CHAT
from proxy.pipeline.continuation_responses import RESPONSES_FORM
from proxy.pipeline.dialect import OPENAI, Dialect, Envelope
from proxy.pipeline.handler import count_tokens_route, prompt_routes
from proxy.pipeline.raw_prompt import count_prompts
from proxy.pipeline.responses_routes import responses_routes
from proxy.tokens.usage import anthropic_input_tokens, input_tokens, prompt_tokens

CHAT_PATH = "/v1/chat/completions"
#: The headers coding agents name their conversation by, read on the Responses and
#: Messages routes when ``TRIMPROXY_SESSION_HEADER`` is absent: the Codex CLI sends
#: ``session_id`` (docs/sessions.md).
AGENT_SESSION_HEADERS = ("session_id", "session-id")

#: The paths every request to which needs a key (``TRIMPROXY_API_KEYS``) and counts
#: against the in-flight limit: everything the proxy forwards (``proxy.paths``).
FORWARDED = (FORWARDED_PREFIX, *sorted(FORWARDED_EXACT))


def _anthropic_body(exc: ProxyError) -> bytes:
    return anthropic_errors.error_body(exc)


def _anthropic_event(exc: ProxyError) -> bytes:
    return anthropic_errors.stream_error_event(exc.status, exc.message)


def _anthropic_plain(status: int, message: str, code: str) -> bytes:
    return anthropic_errors.envelope(status, message)


#: Anthropic's error envelope and stream error event (the Messages API).
ANTHROPIC = Envelope(body=_anthropic_body, stream_event=_anthropic_event, plain=_anthropic_plain)


def _parse_responses(raw: bytes) -> Conversation:
    conv = responses.parse(raw)
    if conv.body.get("background") is True:
        raise InvalidRequest(
            "'background': true is not served through this proxy: a background response "
            "runs unbounded by the prompt budget and session limits. Send it without "
            "'background' (stream it instead).",
            param="background",
        )
    return conv


def _stored_responses(dialect: Dialect) -> list[BaseRoute]:
    # Compaction, input_items and the WebSocket ahead of GET/DELETE /v1/responses/{id}.
    return [*responses_routes(dialect), *response_chain.stored_routes(dialect.path, dialect.tag)]


def builtin_dialects() -> tuple[Dialect, ...]:
    """The four wire formats the proxy serves: chat, Responses, Messages, completions."""
    return (
        Dialect(
            endpoint="chat",
            tool_outputs=tool_outputs.CHAT,
            path=CHAT_PATH,
            parse=chat.parse_chat,
            to_chat=chat.to_chat,
            render=chat.render,
            usage=prompt_tokens,
            form=CHAT,
            items_are_messages=True,
            summary="Chat completion, trimmed to the token budget",
            openapi_body=CHAT_BODY,
            openapi_responses=CHAT_RESPONSES,
        ),
        Dialect(
            endpoint="responses",
            tool_outputs=tool_outputs.RESPONSES,
            path="/v1/responses",
            parse=_parse_responses,
            to_chat=responses.to_chat,
            render=responses.render,
            usage=input_tokens,
            answer=RESPONSES_ANSWER,
            form=RESPONSES_FORM,
            agent_headers=AGENT_SESSION_HEADERS,
            session_roles=responses.session_roles,
            stored=True,
            more_routes=_stored_responses,
            summary="Responses API, trimmed to the token budget",
        ),
        Dialect(
            endpoint="messages",
            tool_outputs=tool_outputs.MESSAGES,
            path=anthropic_errors.MESSAGES_PATH,
            parse=messages.parse_create,
            to_chat=messages.to_chat,
            render=messages.render,
            tools=messages_chat.chat_tools,
            usage=anthropic_input_tokens,
            answer=MESSAGES_ANSWER,
            envelope=ANTHROPIC,
            agent_headers=AGENT_SESSION_HEADERS,
            edit=context_management.edit_message,
            more_routes=count_tokens_route(
                anthropic_errors.MESSAGES_PATH + "/count_tokens",
                messages.parse,
                context_management.count_message,
            ),
            summary="Anthropic Messages API, trimmed to the token budget",
            tag="anthropic",
        ),
        Dialect(
            endpoint="completions",
            path="/v1/completions",
            parse=completions.parse,
            to_chat=completions.to_chat,
            render=completions.render,
            usage=prompt_tokens,
            count_prompts=count_prompts,
            summary="Completion of a raw prompt, refused over the token budget",
        ),
    )


class Table:
    """The dialects a proxy serves, and what is derived from them."""

    def __init__(self, dialects: Iterable[Dialect]) -> None:
        self.dialects = tuple(dialects)
        paths = [d.path for d in self.dialects]
        names = [d.endpoint for d in self.dialects]
        if len(set(paths)) != len(paths) or len(set(names)) != len(names):
            raise ValueError(f"two dialects share a path or a name: {paths}, {names}")
        #: Every dialect's routes, ahead of the relayed rest of ``/v1/``.
        self.routes = prompt_routes(self.dialects)
        prompt_paths = {
            r.path for r in self.routes if isinstance(r, Route) and "POST" in (r.methods or ())
        }
        #: The routes that carry a prompt, each bounded by its handler: never relayed
        #: blind, whatever the method or the case it is spelled in.
        self.prompt_paths = frozenset(prompt_paths)
        #: What needs a key and counts as in flight: what the proxy forwards, and every
        #: prompt route, wherever it is.
        self.guarded = FORWARDED + tuple(
            p for p in paths if not p.startswith(FORWARDED_PREFIX) and p not in FORWARDED_EXACT
        )
        #: The metrics' ``route`` labels: the proxy's own routes and every dialect's.
        self.route_labels = OWN_ROUTES | frozenset(paths)
        self._envelopes = tuple(
            (d.path, d.envelope) for d in self.dialects if d.envelope is not OPENAI
        )

    def envelope_for(self, path: str) -> Envelope:
        """The error envelope of ``path`` (in normal form): its dialect's on the
        dialect's path and everything under it, else OpenAI's."""
        for prefix, envelope in self._envelopes:
            if path == prefix or path.startswith(prefix + "/"):
                return envelope
        return OPENAI
