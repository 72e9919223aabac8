"""Reading a proxy's /metrics in tests: scrape over HTTP (a process) or through the
app's client (in-process, ``ascrape``), look up samples by labels."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Scrape:
    text: str
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    def value(self, name: str, **labels: str) -> float:
        """The sample's value; 0 when it is absent (a counter never incremented).

        Without an exact match, the sum over the samples whose labels include
        ``labels`` (a series asked for without its ``model`` label: all models)."""
        wanted = frozenset(labels.items())
        exact = self.samples.get((name, wanted))
        if exact is not None:
            return exact
        return sum(v for (n, got), v in self.samples.items() if n == name and wanted <= got)

    def has(self, name: str, **labels: str) -> bool:
        return (name, frozenset(labels.items())) in self.samples

    def by_engine(self, name: str) -> dict[str, float]:
        """``name``'s value for each ``engine`` label (the ``trimproxy_engine_*`` series)."""
        return {
            dict(labels)["engine"]: value
            for (n, labels), value in self.samples.items()
            if n == name and "engine" in dict(labels)
        }

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}


def parse(response: httpx.Response) -> Scrape:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    return Scrape(response.text, samples)


def scrape(base_url: str) -> Scrape:
    # A new connection per scrape: with several workers, any of them may answer.
    with httpx.Client(timeout=10.0) as client:
        return parse(client.get(f"{base_url}/metrics"))


async def ascrape(client: httpx.AsyncClient) -> Scrape:
    """``GET /metrics`` of an in-process proxy (its ``InProcessProxy.client``)."""
    return parse(await client.get("/metrics"))


def wait_for_scrape(
    base_url: str, predicate: Callable[[Scrape], bool], timeout: float = 10.0
) -> Scrape:
    """Scrape until ``predicate`` holds; fails after ``timeout`` seconds (a hang guard:
    what a test asserts is the scrape, never how long it took)."""
    deadline = time.monotonic() + timeout
    while True:
        result = scrape(base_url)
        if predicate(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"never matched within {timeout}s; last scrape:\n{result.text}")
        time.sleep(0.02)
