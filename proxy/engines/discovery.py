"""Engines found in DNS: every A/AAAA record of a name is an engine.

``dns+http://vllm-headless.ns.svc:8000`` names a Kubernetes headless Service (or any name
with one record per engine); the engines are ``http://ADDRESS:8000``, re-resolved every
``TRIMPROXY_UPSTREAM_REFRESH`` seconds so that engines join and leave as pods come and go
(docs/architecture.md, several engines).

Resolution goes through dnspython's asyncio resolver: the system's ``/etc/resolv.conf``
(nameservers, search domains, ``ndots``) unless ``TRIMPROXY_DNS_NAMESERVER`` names one
server to ask instead. A name that answers with no records has no engines (a Deployment
scaled to zero); a lookup that fails (timeout, SERVFAIL, no nameserver) keeps the last
answer, so a blip of the cluster DNS never empties the rotation.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import dns.exception

from proxy.background import Background

log = logging.getLogger("trimproxy.engines")

DNS_SCHEMES = {"dns+http": "http", "dns+https": "https"}


class DiscoveryError(ValueError):
    """A ``dns+`` URL that cannot name engines; the message says what to write."""


@dataclass(frozen=True, slots=True)
class DnsName:
    """A ``dns+http://NAME:PORT[/PATH]`` upstream."""

    scheme: str  # the engines' scheme: http or https
    host: str
    port: int
    path: str = ""

    def engine_url(self, address: str) -> str:
        """The engine at ``address`` (IPv6 in brackets, as URLs write it)."""
        host = f"[{address}]" if ":" in address else address
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def parse_dns_url(url: str) -> DnsName | None:
    """``None`` for a URL that is not ``dns+http(s)://``; ``DiscoveryError`` for one that
    is and cannot be used (no host, no port, a literal address)."""
    parts = urlsplit(url.strip())
    scheme = DNS_SCHEMES.get(parts.scheme.lower())
    if scheme is None:
        return None
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or ""
    example = "dns+http://vllm-headless.default.svc.cluster.local:8000"
    if not host:
        raise DiscoveryError(f"{url!r} names no host to resolve; write it as {example}")
    if port is None:
        raise DiscoveryError(
            f"{url!r} names no port; DNS gives the engines' addresses, not their port: "
            f"write it as {example}"
        )
    if _is_address(host):
        raise DiscoveryError(
            f"{url!r} names an address, not a DNS name; write http://{host}:{port} for one "
            "engine, or a comma-separated list for several"
        )
    return DnsName(scheme, host, port, parts.path.rstrip("/"))


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Resolver(Protocol):
    """The addresses of a name; ``[]`` when it has none, an exception when the lookup
    itself failed (the caller keeps what it had)."""

    async def addresses(self, host: str) -> list[str]: ...


class DnsResolver:
    """A and AAAA records, asked of the system's nameservers or of ``nameserver``
    (``HOST`` or ``HOST:PORT``)."""

    def __init__(self, nameserver: str | None = None, timeout: float = 2.0) -> None:
        # Imported here, by the one proxy in many that names a dns+ upstream: the
        # resolver's modules would lengthen every other process's start, the CLIs'
        # too (docs/performance.md §6).
        import dns.asyncresolver

        self._resolver = dns.asyncresolver.Resolver(configure=nameserver is None)
        if nameserver is not None:
            host, port = split_nameserver(nameserver)
            self._resolver.nameservers = [host]
            self._resolver.port = port
        self._resolver.lifetime = timeout

    async def addresses(self, host: str) -> list[str]:
        import dns.resolver  # imported with dns.asyncresolver in __init__

        found: list[str] = []
        for kind in ("A", "AAAA"):
            try:
                answer = await self._resolver.resolve(host, kind, search=True)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                continue  # no records of this kind: no engines there (not a failure)
            found.extend(record.to_text() for record in answer)
        return sorted(set(found))


def split_nameserver(value: str) -> tuple[str, int]:
    """``HOST`` or ``HOST:PORT`` (``[V6]:PORT``) as (host, port); port 53 by default."""
    text = value.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not _is_address(host):
        raise DiscoveryError(
            f"TRIMPROXY_DNS_NAMESERVER={value!r}: write the server's address, e.g. 10.96.0.10 "
            "or 127.0.0.1:5353"
        )
    if not port_text:
        return host, 53
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise DiscoveryError(f"TRIMPROXY_DNS_NAMESERVER={value!r}: the port must be 1-65535")
    return host, int(port_text)


class Discovery:
    """Resolves ``name`` every ``refresh`` seconds and hands each changed set of engine
    URLs to ``on_change``. ``resolve_once`` is the first answer, awaited at start-up."""

    def __init__(
        self,
        name: DnsName,
        resolver: Resolver,
        refresh: float,
        on_change: Callable[[list[str]], Awaitable[None] | None],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.name = name
        self._resolver = resolver
        self._refresh = refresh
        self._on_change = on_change
        self._sleep = sleep
        self._background = Background(f"discovery {name.host}", self._loop, log)
        self.urls: list[str] | None = None  # None: never resolved yet
        self.failures = 0

    async def resolve_once(self) -> list[str] | None:
        """The engines now, or ``None`` when the lookup failed (nothing changes then)."""
        try:
            addresses = await self._resolver.addresses(self.name.host)
        except (dns.exception.DNSException, OSError) as exc:
            self.failures += 1
            log.warning(
                "DNS lookup of %s failed (%s); keeping the %s engines it had",
                self.name.host,
                exc.__class__.__name__,
                "no" if self.urls is None else len(self.urls),
            )
            return None
        urls = [self.name.engine_url(address) for address in addresses]
        if urls != self.urls:
            if not urls:
                log.warning("DNS name %s has no A/AAAA records: no engines", self.name.host)
            else:
                log.info("engines of %s: %s", self.name.host, ", ".join(urls))
            self.urls = urls
            outcome = self._on_change(list(urls))
            if outcome is not None:
                await outcome
        return urls

    def start(self) -> None:
        if self._refresh > 0:
            self._background.start()

    async def _loop(self) -> None:
        while True:
            await self._sleep(self._refresh)
            try:
                await self.resolve_once()
            except Exception:  # a failing consumer must not end discovery for good
                log.exception("applying the engines of %s failed", self.name.host)

    async def stop(self) -> None:
        await self._background.stop()
