"""Talking to the upstream model server: forwarding, relaying, context windows.

One shared aiohttp session (keep-alive pool, explicit timeouts) serves every
request. aiohttp rather than httpx: on this 2-core machine httpx's default
transport costs about 3x the CPU of an aiohttp client per proxied request
(``bench/overhead.py``), and the client is most of what a proxy spends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

import aiohttp
import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy.errors import (
    ClientClosedRequest,
    UpstreamUnavailable,
    upstream_error_kind,
    upstream_failure,
)
from proxy.settings import Settings

log = logging.getLogger("trimproxy.upstream")

# RFC 9110 section 7.6.1 hop-by-hop headers, plus the ones the proxy sets itself.
_HOP_BY_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    )
)
_REQUEST_DROP = _HOP_BY_HOP | {"host", "content-length", "authorization", "expect"}
_RESPONSE_DROP = _HOP_BY_HOP | {"content-length", "date", "server"}

ErrorHook = Callable[[str], None]
#: Called once the relay ends: whether the body went out whole, and the captured body.
EndHook = Callable[[bool, bytes | None], None]


def request_headers(
    raw: Iterable[tuple[bytes, bytes]], settings: Settings, *, keep_client_auth: bool
) -> dict[str, str]:
    """Headers to send upstream: hop-by-hop dropped, the key replaced.

    The client's ``Authorization`` reaches the upstream only when the proxy is open
    (no ``TRIMPROXY_API_KEYS``) and no upstream key is configured: then the proxy is
    transparent to an upstream that checks keys itself. A key the proxy checked is
    the proxy's own and never leaves it.
    """
    out: dict[str, str] = {}
    for name_b, value_b in raw:
        name = name_b.decode("latin-1").lower()
        if name in _REQUEST_DROP:
            if name == "authorization" and keep_client_auth:
                out["authorization"] = value_b.decode("latin-1")
            continue
        out[name] = value_b.decode("latin-1")
    if settings.upstream_api_key:
        out["authorization"] = f"Bearer {settings.upstream_api_key}"
    return out


def response_headers(
    headers: Mapping[str, str], extra: Mapping[str, str]
) -> list[tuple[bytes, bytes]]:
    out = [
        (k.lower().encode("latin-1"), v.encode("latin-1"))
        for k, v in headers.items()
        if k.lower() not in _RESPONSE_DROP
    ]
    out.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items())
    return out


class Upstream:
    """The shared client; built once in the lifespan, closed with it."""

    def __init__(self, settings: Settings) -> None:
        self.base_url = settings.upstream_url
        self.read_timeout = settings.read_timeout
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=75, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(
                total=None, connect=settings.connect_timeout, sock_read=settings.read_timeout
            ),
            # Bodies pass through as the upstream encoded them.
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )

    async def open(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        client_gone: asyncio.Future[None] | None = None,
    ) -> aiohttp.ClientResponse:
        """Send a request and return once the response head has arrived.

        A non-streaming answer's head comes only when generation is done, so the
        client's disconnect (``client_gone``) is raced against the wait: when the
        client leaves first, the request is cancelled, which closes the upstream
        connection and lets the server abort the generation.
        """
        with CancelOnDisconnect(client_gone) as watch:
            try:
                return await self.session.request(
                    method, self.base_url + path, headers=headers, data=body, allow_redirects=False
                )
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise upstream_failure(exc, self.base_url, self.read_timeout) from exc
        assert watch.fired  # only a disconnect ends the block without a return
        raise ClientClosedRequest("The client closed the connection before the answer.")

    async def get_json(self, path: str, timeout: float = 5.0) -> Any:
        """A small GET for the proxy's own use (models, readiness); None on failure."""
        try:
            async with self.session.get(
                self.base_url + path, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                if resp.status != 200:
                    return None
                return orjson.loads(await resp.read())
        except (TimeoutError, aiohttp.ClientError, OSError, orjson.JSONDecodeError):
            return None

    async def post_json(self, path: str, payload: Any, timeout: float = 5.0) -> Any:
        try:
            async with self.session.post(
                self.base_url + path,
                data=orjson.dumps(payload),
                headers={"content-type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                if resp.status != 200:
                    return None
                return orjson.loads(await resp.read())
        except (TimeoutError, aiohttp.ClientError, OSError, orjson.JSONDecodeError):
            return None

    async def ready(self) -> bool:
        try:
            async with self.session.get(
                self.base_url + "/v1/models", timeout=aiohttp.ClientTimeout(total=3)
            ) as resp:
                return resp.status < 500
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def aclose(self) -> None:
        await self.session.close()


class ContextWindows:
    """The served models' context lengths, discovered once and cached.

    vLLM reports ``max_model_len`` on each entry of ``/v1/models``; FastChat does not,
    but its ``/api/v1/token_check`` answers ``contextLength``. A failed discovery is
    retried after ``retry_after`` seconds, so a restarting upstream is not hammered.
    """

    def __init__(self, upstream: Upstream, retry_after: float = 10.0, ttl: float = 300.0) -> None:
        self._upstream = upstream
        self._known: dict[str, tuple[int | None, float]] = {}
        self._pending: dict[str, asyncio.Future[int | None]] = {}
        self._retry_after = retry_after
        self._ttl = ttl

    async def get(self, model: str) -> int | None:
        entry = self._known.get(model)
        now = time.monotonic()
        if entry is not None and entry[1] > now:
            return entry[0]
        pending = self._pending.get(model)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._pending[model] = future
        try:
            value = await self._discover(model)
            self._known[model] = (value, now + (self._ttl if value else self._retry_after))
            future.set_result(value)
            return value
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters get it through shield
            raise
        finally:
            del self._pending[model]

    async def _discover(self, model: str) -> int | None:
        listing = await self._upstream.get_json("/v1/models")
        if isinstance(listing, dict) and isinstance(listing.get("data"), list):
            entries = [e for e in listing["data"] if isinstance(e, dict)]
            for entry in entries:
                if entry.get("id") == model and isinstance(entry.get("max_model_len"), int):
                    return int(entry["max_model_len"])
            if len(entries) == 1 and isinstance(entries[0].get("max_model_len"), int):
                return int(entries[0]["max_model_len"])
        checked = await self._upstream.post_json(
            "/api/v1/token_check",
            {"prompts": [{"model": model, "prompt": "", "max_tokens": 0}]},
        )
        if isinstance(checked, dict):
            prompts = checked.get("prompts")
            if isinstance(prompts, list) and prompts and isinstance(prompts[0], dict):
                length = prompts[0].get("contextLength")
                if isinstance(length, int) and length > 0:
                    return length
        log.warning(
            "could not learn the context window of model %r from the upstream; "
            "set TRIMPROXY_CONTEXT_WINDOW (or TRIMPROXY_MAX_PROMPT_TOKENS) to bound prompts",
            model,
        )
        return None


class Relay(Response):
    """Relay an upstream response to the client, chunk by chunk, as it arrives.

    Nothing is buffered, so SSE tokens reach the client as the upstream sends them.
    The client's ``http.disconnect`` is watched all along; when it comes, the
    upstream connection is closed at once (not returned to the pool), which is what
    makes vLLM abort the request and free its KV blocks.
    """

    def __init__(
        self,
        upstream: aiohttp.ClientResponse,
        extra_headers: Mapping[str, str],
        client_gone: asyncio.Future[None],
        *,
        on_error: ErrorHook | None = None,
        on_end: EndHook | None = None,
        on_first_byte: Callable[[], None] | None = None,
        capture_limit: int = 0,
    ) -> None:
        self._upstream = upstream
        self._client_gone = client_gone
        self._on_error = on_error
        self._on_end = on_end
        self._on_first_byte = on_first_byte
        # Up to this many bytes of the body are kept for on_end (usage comparison);
        # a longer body is relayed all the same, just not kept.
        self._capture_limit = capture_limit
        self._captured: list[bytes] | None = [] if capture_limit > 0 else None
        self.status_code = upstream.status
        self.raw_headers = response_headers(upstream.headers, extra_headers)
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        completed = False
        try:
            with CancelOnDisconnect(self._client_gone):
                await self._pump(send)
                completed = True
        finally:
            self._client_gone.cancel()
            if completed:
                self._upstream.release()
            else:
                self._upstream.close()
            if self._on_end is not None:
                captured = b"".join(self._captured) if completed and self._captured else None
                self._on_end(completed, captured)

    async def _pump(self, send: Send) -> None:
        length = self._upstream.content_length
        if self._captured is not None and length is not None and length <= self._capture_limit:
            await self._send_whole(send)
            return
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        first = True
        kept = 0
        try:
            async for chunk in self._upstream.content.iter_any():
                if first and self._on_first_byte is not None:
                    self._on_first_byte()
                first = False
                if self._captured is not None:
                    kept += len(chunk)
                    if kept <= self._capture_limit:
                        self._captured.append(chunk)
                    else:
                        self._captured = None
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            # Headers are out already: the client sees a cut stream, the logs say why.
            if self._on_error is not None:
                self._on_error(upstream_error_kind(exc))
            log.warning("upstream stream broke off: %s", type(exc).__name__)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send_whole(self, send: Send) -> None:
        """A small answer of known length (a non-streaming completion): one read, one
        send, and the body kept for the usage comparison. Should the upstream break
        off mid-body, nothing has gone out yet and the client gets a clean 502."""
        if self._on_first_byte is not None:
            self._on_first_byte()
        try:
            body = await self._upstream.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            if self._on_error is not None:
                self._on_error(upstream_error_kind(exc))
            error = UpstreamUnavailable(
                "The upstream broke off while sending its answer. Retry; if it keeps "
                "happening, check the model server's logs.",
                kind=upstream_error_kind(exc),
            )
            body = error.body()
            self.status_code = error.status
            self.raw_headers = [(b"content-type", b"application/json")]
            self._captured = None
        else:
            self._captured = [body]
        self.raw_headers.append((b"content-length", str(len(body)).encode()))
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        await send({"type": "http.response.body", "body": body})


class CancelOnDisconnect:
    """Cancels the running task when the client disconnects, and swallows that
    cancellation at the end of the block (``fired`` then says it happened).

    A done-callback on the watcher does it, so waiting for the upstream needs no
    second task and no ``asyncio.wait`` per request. The callback is disarmed on
    exit, so a disconnect noticed later never cancels code outside the block.
    """

    def __init__(self, client_gone: asyncio.Future[None] | None) -> None:
        self._client_gone = client_gone
        self._task: asyncio.Task[Any] | None = None
        self._armed = False
        self.fired = False

    def __enter__(self) -> CancelOnDisconnect:
        if self._client_gone is not None:
            self._task = asyncio.current_task()
            self._armed = True
            self._client_gone.add_done_callback(self._fire)
        return self

    def _fire(self, gone: asyncio.Future[None]) -> None:
        if self._armed and not gone.cancelled() and self._task is not None:
            self.fired = True
            self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._armed = False
        if self._client_gone is not None:
            self._client_gone.remove_done_callback(self._fire)
        if self.fired and exc_type is asyncio.CancelledError and self._task is not None:
            self._task.uncancel()
            return True
        return False


def watch_disconnect(receive: Receive) -> asyncio.Future[None]:
    """A task that completes when the client disconnects; call once the body is read.

    The caller owns it: it is handed to ``Upstream.open`` and then to ``Relay``,
    which cancels it at the end; on an error in between the caller cancels it.
    """
    return asyncio.ensure_future(_wait_disconnect(receive))


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
