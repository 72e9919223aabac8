"""DNS discovery against a real DNS server (dnsmasq on a loopback port)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.engines.discovery import (
    Discovery,
    DiscoveryError,
    DnsName,
    DnsResolver,
    parse_dns_url,
    split_nameserver,
)
from tests.support.dnsmasq import Dnsmasq, dnsmasq_binary

NAME = "vllm-headless.test"

needs_dnsmasq = pytest.mark.skipif(
    dnsmasq_binary() is None, reason="dnsmasq is not installed (apt-get install -y dnsmasq-base)"
)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("dns+http://vllm.ns.svc:8000", DnsName("http", "vllm.ns.svc", 8000)),
        ("dns+https://vllm.ns.svc:8443/", DnsName("https", "vllm.ns.svc", 8443)),
        ("DNS+HTTP://Engines:9000/v1", DnsName("http", "engines", 9000, "/v1")),
        ("http://vllm.ns.svc:8000", None),
    ],
)
def test_parse(url: str, expected: DnsName | None) -> None:
    assert parse_dns_url(url) == expected


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("dns+http://vllm.ns.svc", "names no port"),
        ("dns+http://:8000", "names no host"),
        ("dns+http://10.0.0.5:8000", "names an address"),
        ("dns+http://vllm.ns.svc:99999", "names no port"),
    ],
)
def test_parse_refuses(url: str, says: str) -> None:
    with pytest.raises(DiscoveryError, match=says):
        parse_dns_url(url)


def test_engine_url_brackets_ipv6() -> None:
    name = DnsName("http", "vllm", 8000)
    assert name.engine_url("127.0.0.2") == "http://127.0.0.2:8000"
    assert name.engine_url("::1") == "http://[::1]:8000"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1", ("127.0.0.1", 53)),
        ("127.0.0.1:5353", ("127.0.0.1", 5353)),
        ("[::1]:53", ("::1", 53)),
    ],
)
def test_nameserver(value: str, expected: tuple[str, int]) -> None:
    assert split_nameserver(value) == expected


@pytest.mark.parametrize("value", ["dns.local", "127.0.0.1:0", "127.0.0.1:x"])
def test_nameserver_refused(value: str) -> None:
    with pytest.raises(DiscoveryError, match="TRIMPROXY_DNS_NAMESERVER"):
        split_nameserver(value)


@needs_dnsmasq
async def test_engines_join_and_leave(tmp_path: Path) -> None:
    seen: list[list[str]] = []
    with Dnsmasq(tmp_path, {NAME: ["127.0.0.2", "127.0.0.3"]}) as server:
        discovery = Discovery(
            DnsName("http", NAME, 8000), DnsResolver(server.nameserver), 0, seen.append
        )
        assert await discovery.resolve_once() == ["http://127.0.0.2:8000", "http://127.0.0.3:8000"]
        server.set_records(NAME, ["127.0.0.2", "127.0.0.3", "127.0.0.4"])
        assert await discovery.resolve_once() == [
            "http://127.0.0.2:8000",
            "http://127.0.0.3:8000",
            "http://127.0.0.4:8000",
        ]
        await discovery.resolve_once()  # unchanged: on_change is not called again
        server.set_records(NAME, ["127.0.0.4"])
        assert await discovery.resolve_once() == ["http://127.0.0.4:8000"]
        server.set_records(NAME, [])
        assert await discovery.resolve_once() == []
    assert seen == [
        ["http://127.0.0.2:8000", "http://127.0.0.3:8000"],
        ["http://127.0.0.2:8000", "http://127.0.0.3:8000", "http://127.0.0.4:8000"],
        ["http://127.0.0.4:8000"],
        [],
    ]


@needs_dnsmasq
async def test_failed_lookup_keeps_the_engines(tmp_path: Path) -> None:
    seen: list[list[str]] = []
    server = Dnsmasq(tmp_path, {NAME: ["127.0.0.2"]}).start()
    resolver = DnsResolver(server.nameserver, timeout=0.5)
    discovery = Discovery(DnsName("http", NAME, 8000), resolver, 0, seen.append)
    try:
        assert await discovery.resolve_once() == ["http://127.0.0.2:8000"]
    finally:
        server.stop()
    assert await discovery.resolve_once() is None  # the DNS server is gone
    assert discovery.failures == 1
    assert discovery.urls == ["http://127.0.0.2:8000"]
    assert seen == [["http://127.0.0.2:8000"]]


@needs_dnsmasq
async def test_refresh_loop_follows_the_name(tmp_path: Path) -> None:
    """The loop's sleep is injected: each tick is one refresh, no wall-clock wait."""
    import asyncio

    ticks: asyncio.Queue[None] = asyncio.Queue()
    changes: asyncio.Queue[list[str]] = asyncio.Queue()

    async def tick(_: float) -> None:
        await ticks.get()

    with Dnsmasq(tmp_path, {NAME: ["127.0.0.2"]}) as server:
        discovery = Discovery(
            DnsName("http", NAME, 8000),
            DnsResolver(server.nameserver),
            5.0,
            changes.put_nowait,
            tick,
        )
        await discovery.resolve_once()
        assert await changes.get() == ["http://127.0.0.2:8000"]
        discovery.start()
        server.set_records(NAME, ["127.0.0.2", "127.0.0.5"])
        ticks.put_nowait(None)
        assert await asyncio.wait_for(changes.get(), 10) == [
            "http://127.0.0.2:8000",
            "http://127.0.0.5:8000",
        ]
        await discovery.stop()
