"""Reading a request's body once: the size limit (413) and the body timeout (408)
(docs/architecture.md §4)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request

from proxy.errors import ClientClosedRequest, RequestTimeout, RequestTooLarge


async def read_body(request: Request, limit: int, timeout: float | None = None) -> bytes:
    """The whole body, at most ``limit`` bytes (413), within ``timeout`` seconds (408).

    A client that leaves half-way is a 499 (``ClientClosedRequest``), logged and
    counted as such, not a server error.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    # The timer cancels this task; a flag tells its cancellation from anyone else's.
    # (asyncio.timeout does the same with several times the work: docs/performance.md §6.)
    task = asyncio.current_task()
    fired = False

    def expire() -> None:
        nonlocal fired
        fired = True
        if task is not None:
            task.cancel()

    timer = None if timeout is None else asyncio.get_running_loop().call_later(timeout, expire)
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise ClientClosedRequest("The client left while sending the request body.")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
    except asyncio.CancelledError:
        if not fired or task is None or task.uncancel() > 0:
            raise  # cancelled by someone else (a shutdown): not ours to answer
        raise RequestTimeout(
            f"The request body did not arrive within {timeout:g} s "
            "(TRIMPROXY_BODY_TIMEOUT). Send the body at once, or raise the limit.",
            headers={"connection": "close"},
        ) from None
    finally:
        if timer is not None:
            timer.cancel()
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"The request body is {size} bytes or more; this proxy accepts at most {limit} "
        "bytes (TRIMPROXY_MAX_BODY_BYTES). Send less history or raise the limit.",
        param="messages",
    )
