"""Reading a JSON request body: the checks every route that parses one shares (chat,
``proxy.dialects``), each with the 400 that says what to send instead.

Only what the proxy needs is checked; every other field passes through untouched.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.errors import InvalidRequest
from proxy.types import JSONObject

#: Deeper than orjson writes (it reads 1024 levels, writes fewer than 255): a body
#: that could not be re-serialised after trimming, or hashed for a session, is
#: refused up front, so no later step can fail on it with a 500.
MAX_NESTING = 250


def load_object(raw: bytes, needs: str) -> JSONObject:
    """The body as a JSON object, or the 400 that says what to send (``needs``: the
    fields the route requires, for the message)."""
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # orjson reads 1024 levels and stops there with a decode error: deeper JSON is
        # valid, and answered as too deep, like any body past MAX_NESTING.
        if exc.msg.startswith("depth limit exceeded"):
            raise _too_deep() from None
        raise InvalidRequest(
            f"The request body is not valid JSON (error at byte {exc.pos}). "
            f"Send a JSON object with {needs}.",
            param=None,
        ) from exc
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object with {needs}.", param=None)
    check_nesting(body)
    return body


def check_nesting(body: JSONObject) -> None:
    # Serialising is the check itself, and cheaper than any pre-filter: orjson writes
    # a body in less time than counting its brackets (two C scans of the raw bytes)
    # takes (docs/performance.md §6).
    try:
        orjson.dumps(body)
    except orjson.JSONEncodeError:
        raise _too_deep() from None


def _too_deep() -> InvalidRequest:
    return InvalidRequest(
        f"The request body is nested more than {MAX_NESTING} levels deep; this proxy "
        "does not accept JSON that deep. Flatten the structure.",
        param=None,
    )


def positive_int(body: JSONObject, name: str, *, zero: bool = False) -> int | None:
    """``body[name]`` as a positive integer (or zero when ``zero``), None when absent."""
    value = body.get(name)
    if value is None:
        return None
    least = 0 if zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        kind = "a non-negative" if zero else "a positive"
        raise InvalidRequest(f"'{name}' must be {kind} integer or null.", param=name)
    return value


def common_fields(body: JSONObject) -> tuple[str | None, bool]:
    """``model`` and ``stream``, checked the same way on every route."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("'model' must be a string.", param="model")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be true or false.", param="stream")
    return model, bool(stream)


def answers(body: JSONObject, name: str = "n") -> int:
    """How many answers ``n`` asks for, for the KV reservation, read as vLLM's pydantic
    reads it (lax mode: ``"3"``, ``3.0`` and ``true`` are 3, 3 and 1), so a client
    cannot be reserved one answer and run three; a value the engine would refuse
    (not an integer, below one) is the proxy's 400. ``best_of`` is checked the same
    way (vLLM 0.32 ignores it: it holds nothing)."""
    if name == "n" and body.get("best_of") is not None:  # absent: 1, nothing to check
        answers(body, "best_of")
    value = body.get(name)
    if value is None:
        return 1
    count = _lax_int(value)
    if count is None or count < 1:
        raise InvalidRequest(f"'{name}' must be a positive integer or null.", param=name)
    return count


def _lax_int(value: object) -> int | None:
    """pydantic's lax integer: an int or bool, a float with no fraction, a string of
    digits (blanks around); None for anything else."""
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        text = value.strip()
        digits = text.removeprefix("-").removeprefix("+")
        if 0 < len(digits) <= 18 and digits.isascii() and digits.isdigit():
            return int(text)
    return None
