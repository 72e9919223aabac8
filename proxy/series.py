"""The series every request records, as plain numbers, in a process of its own.

prometheus-client keeps each value behind its own mutex, and a histogram's
``observe`` is several Python calls, two locks and a loop over the bounds; a chat
request records seven values, and that cost more than counting its prompt
(docs/performance.md §6). Without multiprocess mode,
``Metrics`` keeps those seven series here instead: the same counters, histograms and
gauge, collected by prometheus-client's own registry into the same samples (names,
labels, order, float values, ``_created``), so the exposition is byte for byte the
same (``tests/observability/test_series.py``). With ``PROMETHEUS_MULTIPROC_DIR`` set
they are prometheus-client's objects, whose values live in its mmap'd files.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString


class CounterChild(Protocol):
    """One counter series: prometheus-client's child or a ``_PlainCounterChild``."""

    def inc(self, amount: float = 1) -> None: ...


class HistogramChild(Protocol):
    def observe(self, amount: float) -> None: ...


class CounterFamily(Protocol):
    def labels(self, *labelvalues: str) -> CounterChild: ...


class HistogramFamily(Protocol):
    def labels(self, *labelvalues: str) -> HistogramChild: ...


class UpDownGauge(Protocol):
    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


def counter_family(
    plain: bool,
    name: str,
    documentation: str,
    labelnames: Sequence[str],
    registry: CollectorRegistry,
) -> CounterFamily:
    if plain:
        return _PlainCounter(name, documentation, labelnames, registry)
    return Counter(name, documentation, labelnames, registry=registry)


def histogram_family(
    plain: bool,
    name: str,
    documentation: str,
    labelnames: Sequence[str],
    buckets: Sequence[float],
    registry: CollectorRegistry,
) -> HistogramFamily:
    if plain:
        return _PlainHistogram(name, documentation, labelnames, buckets, registry)
    return Histogram(name, documentation, labelnames, buckets=buckets, registry=registry)


# The _Plain* families below record what prometheus-client's Counter, Histogram and
# Gauge record, as plain Python numbers, and collect into the same samples (names,
# labels, order, float values, _created), so the exposition is byte for byte the
# same. Without multiprocess mode prometheus-client keeps each value behind its own
# mutex, and an observe is several Python calls, two locks and a loop over the
# bounds; here it is one call. No locks: every recording happens on the event
# loop's thread (the tokenizers' worker threads only count tokens), so there is
# only ever one writer, and a scrape from elsewhere reads whole numbers, no less
# consistent than prometheus-client's one-lock-per-value reads.


class _PlainCounterChild:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class _PlainHistogramChild:
    __slots__ = ("_bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # bisect_left finds the first bound >= amount: prometheus-client's bucket
        # (``amount <= bound``). A NaN is in no bucket there, and only in the sum.
        if amount == amount:
            self.counts[bisect_left(self._bounds, amount)] += 1
        self.sum += amount


class _PlainFamily:
    """What the plain families share: labels, the registry, describe."""

    _type = ""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        registry.register(self)

    def _family(self) -> Metric:
        return Metric(self._name, self._documentation, self._type)

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> list[Metric]:
        raise NotImplementedError

    def _key(self, labelvalues: tuple[str, ...]) -> tuple[str, ...]:
        key = tuple(str(value) for value in labelvalues)
        if len(key) != len(self._labelnames):
            raise ValueError("Incorrect label count")
        return key

    def _labels(self, key: tuple[str, ...]) -> dict[str, str]:
        return dict(zip(self._labelnames, key, strict=True))


_Child = TypeVar("_Child", _PlainCounterChild, _PlainHistogramChild)


class _LabelledFamily(_PlainFamily, Generic[_Child]):
    """A family of labelled children, each made on its first ``labels()``."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self._children: dict[tuple[str, ...], _Child] = {}
        super().__init__(name, documentation, labelnames, registry)

    def labels(self, *labelvalues: str) -> _Child:
        # The values as given are the key of the hot path; str() and the count check
        # run only for a child not seen under them yet.
        child = self._children.get(labelvalues)
        if child is None:
            key = self._key(labelvalues)
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._new_child()
        return child

    def _new_child(self) -> _Child:
        raise NotImplementedError


class _PlainCounter(_LabelledFamily[_PlainCounterChild]):
    _type = "counter"

    def _new_child(self) -> _PlainCounterChild:
        return _PlainCounterChild()

    def collect(self) -> list[Metric]:
        metric = self._family()
        total, created = self._name + "_total", self._name + "_created"
        for key, child in list(self._children.items()):
            metric.add_sample(total, self._labels(key), child.value)
            metric.add_sample(created, self._labels(key), child.created)
        return [metric]


class _PlainHistogram(_LabelledFamily[_PlainHistogramChild]):
    _type = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = [float(b) for b in buckets]  # as prometheus-client prepares them
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if bounds and bounds[-1] != float("inf"):
            bounds.append(float("inf"))
        if len(bounds) < 2:
            raise ValueError("Must have at least two buckets")
        self._bounds = tuple(bounds)
        self._les = tuple(floatToGoString(b) for b in bounds)  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> _PlainHistogramChild:
        return _PlainHistogramChild(self._bounds)

    def collect(self) -> list[Metric]:
        metric = self._family()
        name = self._name
        bucket, count, total, created = (
            name + s for s in ("_bucket", "_count", "_sum", "_created")
        )
        # As prometheus-client does: no _sum when a bound is negative (ERROR_BUCKETS),
        # since a sum that can fall is no counter, and OpenMetrics then forbids it.
        with_sum = self._bounds[0] >= 0
        for key, child in list(self._children.items()):
            acc = 0.0
            for le, n in zip(self._les, list(child.counts), strict=True):
                acc += n
                metric.add_sample(bucket, {**self._labels(key), "le": le}, acc)
            metric.add_sample(count, self._labels(key), acc)
            if with_sum:
                metric.add_sample(total, self._labels(key), child.sum)
            metric.add_sample(created, self._labels(key), child.created)
        return [metric]


class PlainGauge(_PlainFamily):
    """A gauge without labels that goes up and down."""

    _type = "gauge"

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.value = 0.0
        super().__init__(name, documentation, (), registry)

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        self.value -= amount

    def collect(self) -> list[Metric]:
        metric = self._family()
        metric.add_sample(self._name, {}, self.value)
        return [metric]
