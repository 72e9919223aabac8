"""``truncation`` of the Responses API as OpenAI documents it (docs/architecture.md
§24): ``"disabled"``, sent explicitly, asks for an error rather than a cut, so a
request that trimming would cut is refused with the 400 an over-long prompt gets;
``"auto"`` or none is trimproxy's budget, as before."""

from __future__ import annotations

from proxy.dialects.conversation import Conversation
from proxy.errors import ContextLengthExceeded
from proxy.pipeline.prepare import Prepared


def check(conv: Conversation, prepared: Prepared) -> None:
    if conv.body.get("truncation") != "disabled" or prepared.trim_reason != "budget":
        return
    raise ContextLengthExceeded(
        f"The input is {prepared.received_tokens} tokens, over this proxy's budget of "
        f"{prepared.budget} tokens, and 'truncation' is 'disabled', so it is not trimmed. "
        "Send 'truncation': 'auto' (or leave it out) to have the oldest turns dropped, "
        "or shorten the input (compaction: POST /v1/responses/compact).",
        param="input",
        needed=prepared.received_tokens,
        maximum=prepared.budget,
    )
