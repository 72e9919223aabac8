"""The plain per-request series (``proxy.series``) expose what prometheus-client would.

Each case records the same values into a plain family and into prometheus-client's own
``Counter`` / ``Histogram`` / ``Gauge`` of the same name, each on a registry of its own,
and the two expositions must be byte for byte the same (the ``_created`` timestamps,
taken a few microseconds apart, are masked). The values sit on and around the bucket
bounds, above the last one, below zero, NaN: where a hand-written bucket rule would go
wrong first.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from proxy.metrics import ERROR_BUCKETS, SECONDS_BUCKETS, TOKEN_BUCKETS
from proxy.series import PlainGauge, counter_family, histogram_family

_CREATED = re.compile(rb"(_created(?:\{[^}]*\})?) \S+")

SECONDS = [0.0, 0.005, 0.0050001, 0.01, 0.1 + 0.2, 1, 2.5, 599.9, 600, 1200, 1200.0001, 1e9]
TOKENS = [0, 1, 63, 64, 65, 1000, 4096, 262144, 262145, 10**7]
ERRORS = [-(10**6), -4097, -4096, -3, -1, -0.5, -0.4, 0, 0.5, 0.6, 1, 4096, 4097, 10**6]


def _exposition(registry: CollectorRegistry) -> bytes:
    return _CREATED.sub(rb"\1 T", generate_latest(registry))


def _histograms(
    bounds: tuple[float, ...], values: list[float]
) -> tuple[CollectorRegistry, CollectorRegistry]:
    plain, reference = CollectorRegistry(), CollectorRegistry()
    ours = histogram_family(True, "t_seconds", "Help.", ("route", "model"), bounds, plain)
    theirs = Histogram("t_seconds", "Help.", ("route", "model"), buckets=bounds, registry=reference)
    for i, value in enumerate(values):
        labels = ("/a", "m") if i % 3 else ("/b", "n")
        ours.labels(*labels).observe(value)
        theirs.labels(*labels).observe(value)
    return plain, reference


@pytest.mark.parametrize(
    ("bounds", "values"),
    [
        (SECONDS_BUCKETS, SECONDS),
        (TOKEN_BUCKETS, [float(t) for t in TOKENS]),
        # A first bound below zero: prometheus-client then leaves _sum out.
        (ERROR_BUCKETS, [float(e) for e in ERRORS]),
        (SECONDS_BUCKETS, [math.nan, 0.1]),
    ],
    ids=["seconds", "tokens", "errors", "nan"],
)
def test_a_plain_histogram_exposes_what_prometheus_client_does(
    bounds: tuple[float, ...], values: list[float]
) -> None:
    plain, reference = _histograms(bounds, values)
    assert _exposition(plain) == _exposition(reference)


def test_a_plain_counter_exposes_what_prometheus_client_does() -> None:
    plain, reference = CollectorRegistry(), CollectorRegistry()
    ours = counter_family(True, "t_requests", "Help.", ("route", "code"), plain)
    theirs = Counter("t_requests", "Help.", ("route", "code"), registry=reference)
    for labels, amount in [(("/a", "200"), 1.0), (("/a", "200"), 2.5), (("/b", "502"), 1.0)]:
        ours.labels(*labels).inc(amount)
        theirs.labels(*labels).inc(amount)
    ours.labels("/never", "200")  # a child with no increments is exposed at 0
    theirs.labels("/never", "200")
    assert _exposition(plain) == _exposition(reference)


def test_a_plain_gauge_exposes_what_prometheus_client_does() -> None:
    plain, reference = CollectorRegistry(), CollectorRegistry()
    ours = PlainGauge("t_in_flight", "Help.", plain)
    theirs = Gauge("t_in_flight", "Help.", registry=reference)
    for step in (ours, theirs):
        step.inc()
        step.inc(3)
        step.dec(2)
    assert _exposition(plain) == _exposition(reference)


@pytest.mark.parametrize(
    "misuse",
    [
        lambda family: family.labels("/a", "200").inc(-1),  # counters only go up
        lambda family: family.labels("/a"),  # too few label values
    ],
    ids=["negative", "labels"],
)
def test_a_plain_counter_refuses_what_prometheus_client_refuses(
    misuse: Callable[[object], object],
) -> None:
    ours = counter_family(True, "t_a", "Help.", ("route", "code"), CollectorRegistry())
    theirs = Counter("t_a", "Help.", ("route", "code"), registry=CollectorRegistry())
    with pytest.raises(ValueError):
        misuse(theirs)
    with pytest.raises(ValueError):
        misuse(ours)


def test_a_name_taken_twice_on_one_registry_is_refused_as_before() -> None:
    registry = CollectorRegistry()
    counter_family(True, "t_dup", "Help.", ("route",), registry)
    with pytest.raises(ValueError):
        Counter("t_dup", "Help.", ("route",), registry=registry)
