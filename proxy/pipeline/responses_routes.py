"""The Responses API's routes beside create, retrieve and delete (docs/architecture.md
§24): compaction, the input items of a stored response, and the WebSocket. Listed
ahead of ``GET``/``DELETE /v1/responses/{id}``, which would take ``compact`` for an id."""

from __future__ import annotations

from fastapi.routing import APIRoute
from starlette.routing import WebSocketRoute

from proxy import response_items, responses_socket
from proxy.pipeline import compaction
from proxy.pipeline.dialect import Dialect

RESPONSES_PATH = "/v1/responses"


def responses_routes(dialect: Dialect) -> list[APIRoute | WebSocketRoute]:
    return [
        WebSocketRoute(RESPONSES_PATH, responses_socket.responses_socket),
        APIRoute(
            RESPONSES_PATH + "/compact",
            compaction.compact_route(dialect),
            methods=["POST"],
            summary="Compact a conversation into a compaction item (no engine call)",
            tags=["openai"],
        ),
        APIRoute(
            RESPONSES_PATH + "/{response_id}/input_items",
            response_items.input_items,
            methods=["GET"],
            summary="The input items of a response this proxy stored",
            tags=["openai"],
        ),
    ]
