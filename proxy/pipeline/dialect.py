"""One wire format's row of the dialect table (docs/architecture.md §22): everything the
request path asks of a prompt route, built by keyword, so a new dialect is one row
(``proxy.pipeline.table``) and nothing else.

The request path reads a dialect through this record only: the handler its path, parse
and error envelope; the prepare step its chat view (what the chat template renders),
its count, its render of the kept items and its tools; the forward step its
continuation form and its answer's shape (the overrun watch); the relay its usage
reader and its stream error event.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response
from starlette.routing import BaseRoute

from proxy.admission.overrun import CHAT_ANSWER, AnswerShape
from proxy.choices import Endpoint
from proxy.dependencies import Services
from proxy.dialects.conversation import Conversation
from proxy.dialects.tool_outputs import ToolOutputs
from proxy.errors import ProxyError, envelope
from proxy.logs import RequestFacts
from proxy.pipeline.breakoff import sse_error_event
from proxy.pipeline.continuation import Form
from proxy.tokens.usage import UsageReader
from proxy.types import JSONObject, Message, PromptCount, PromptLimit


@dataclass(frozen=True, slots=True)
class ChatView:
    """A request's items as the chat template renders them: the chat messages, and for
    each the index of the item it came from (None: each message is its own item)."""

    messages: list[Message]
    owner: list[int] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Edit:
    """A request a dialect changed before the shared prepare step (Messages' context
    editing): the conversation and body to prepare, and the wrap of its answer."""

    conv: Conversation
    raw: bytes
    wrap: Callable[[Response], Response]
    """The relayed answer with what the change adds to it (``context_management``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """How a dialect's clients read an error: the body of an error answer, and the
    last event of a stream that broke off after its head went out."""

    body: Callable[[ProxyError], bytes]
    stream_event: Callable[[ProxyError], bytes]
    #: The body of an error the router answers (404, 405): status and message.
    plain: Callable[[int, str, str], bytes]


def _openai_plain(status: int, message: str, code: str) -> bytes:
    return envelope(message, "invalid_request_error", code)


def _openai_body(exc: ProxyError) -> bytes:
    return exc.body()


#: OpenAI's error envelope, and the error event vLLM streams (chat, Responses,
#: completions).
OPENAI = Envelope(body=_openai_body, stream_event=sse_error_event, plain=_openai_plain)


#: The kept items (``kept``: their indices) as the chat template renders them: the chat
#: messages and, for each, the index of the item it came from.
ToChat = Callable[[Conversation, Sequence[int]], tuple[list[Message], list[int]]]
#: The body to forward: the kept items, the completion tokens written when given.
Render = Callable[[Conversation, Sequence[int], int | None], bytes]
#: The tools as the chat template renders them, for the kept items.
Tools = Callable[[Conversation, Sequence[int]], list[JSONObject] | None]
#: A dialect's change to a request before the shared prepare step, or None for none.
EditStep = Callable[[Services, "Dialect", Conversation, RequestFacts], Awaitable[Edit | None]]
#: Each prompt's tokens of a request that is not trimmed but refused over the budget
#: (a raw prompt): the count as the engine encodes it.
CountPrompts = Callable[[Services, Conversation, PromptLimit | None], Awaitable[PromptCount]]


def own_tools(conv: Conversation, kept: Sequence[int]) -> list[JSONObject] | None:
    """The request's tools, whatever was kept."""
    return conv.tools


@dataclass(frozen=True, slots=True, kw_only=True)
class Dialect:
    """One prompt route's wire format (docs/architecture.md §22)."""

    endpoint: Endpoint
    """Its name: the ``endpoint`` label in the metrics and the access line."""
    path: str
    """The route it is served on (``POST``), and forwarded to."""
    parse: Callable[[bytes], Conversation]
    to_chat: ToChat
    """The chat view of the kept items: what the count is of."""
    render: Render
    usage: UsageReader
    """The prompt tokens of an answer's usage (the estimate error)."""
    envelope: Envelope = OPENAI
    """How its clients read an error: every answer the proxy gives on its path and
    below it, the middleware's too."""
    answer: AnswerShape = CHAT_ANSWER
    """How its answers show their completion tokens (the overrun watch)."""
    tools: Tools = own_tools
    tool_outputs: ToolOutputs | None = None
    """Where its tool outputs are and one cleared (the trim ladder's first rung,
    docs/architecture.md §6); None: the dialect has none."""
    form: Form | None = None
    """How a stream that breaks off goes on on another engine (None: it ends in an error)."""
    count_prompts: CountPrompts | None = None
    """A raw prompt's count: set, the request is refused over the budget, never trimmed."""
    edit: EditStep | None = None
    """A change the dialect makes to a request before the shared prepare step (Messages'
    context editing); the session still sees the client's own conversation."""
    session_roles: Callable[[Conversation], list[str]] | None = None
    """The role each item counts as for the session limits, where the dialect counts
    turns otherwise than trimming does (docs/sessions.md); None: the turn roles."""
    agent_headers: tuple[str, ...] = ()
    """Session headers read after ``TRIMPROXY_SESSION_HEADER`` (``identify``)."""
    stored: bool = False
    """``previous_response_id`` from trimproxy's store (``proxy.pipeline.chain``)."""
    more_routes: Callable[[Dialect], Sequence[BaseRoute]] | None = None
    """Its routes beside the prompt route (a token count, stored responses); a ``POST``
    among them carries a prompt too, so it is never relayed blind."""
    upstream: str | None = None
    """The engine's route it is forwarded to; None: its own path."""
    forwards_raw: bool = True
    """The client's bytes go upstream as they came when nothing was dropped and no cap
    written; False: the body is always rendered (a dialect whose engine route reads
    another format)."""
    summary: str = ""
    """What ``/docs`` says of the route."""
    tag: str = "openai"
    """The ``/docs`` group of the route."""
    openapi_body: dict[str, Any] | None = None
    openapi_responses: dict[int | str, dict[str, Any]] | None = None
    items_are_messages: bool = False
    """The items are the chat messages themselves (chat): counted as they are, and the
    client's bytes forwarded whole when they fit (docs/performance.md §6)."""

    def chat_view(self, conv: Conversation) -> ChatView:
        """Every item, as the chat template renders them."""
        if self.items_are_messages:
            return ChatView(conv.items)
        if conv.plain_for is conv.items and conv.plain_view is not None:
            return ChatView(conv.plain_view)
        return ChatView(*self.to_chat(conv, range(len(conv.items))))

    def stream_error(self, exc: ProxyError) -> bytes:
        return self.envelope.stream_event(exc)
