"""The per-token metrics (inter-token latency, generated tokens), kept by the event loop in plain Python numbers.

prometheus_client's Histogram.observe and Counter.inc take a lock and walk the buckets on every call; at a thousand
streams the dispatcher calls them for every token, and that cost sat in the one thread every stream shares. These
are written and read only on the event loop (the handlers observe, /metrics renders there too), so they need no lock:
an observation is one bisect and two additions, and the registry reads them when /metrics is scraped, under the same
names and in the same exposition format as the prometheus_client metrics they replace.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString


class LoopHistogram:
    """A histogram of `buckets` upper bounds (+Inf added), one label set."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name, self.documentation = name, documentation
        self._bounds = tuple(float(b) for b in buckets)
        self._counts = [0] * (len(self._bounds) + 1)  # the last: above every bound
        self._sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """`count` observations of `value`."""
        self._counts[bisect_left(self._bounds, value)] += count
        self._sum += value * count

    def family(self, label_names: list[str], label_values: list[str]) -> HistogramMetricFamily:
        cumulative, running = [], 0
        for bound, n in zip((*self._bounds, float("inf")), self._counts):
            running += n
            cumulative.append((floatToGoString(bound), running))
        h = HistogramMetricFamily(self.name, self.documentation, labels=label_names)
        h.add_metric(label_values, cumulative, self._sum)
        return h


class LoopCounter:
    """A counter, one label set (exposed as NAME_total)."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name, self.documentation = name, documentation
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount

    def family(self, label_names: list[str], label_values: list[str]) -> CounterMetricFamily:
        c = CounterMetricFamily(self.name, self.documentation, labels=label_names)
        c.add_metric(label_values, self.value)
        return c


class LoopMetricsCollector:
    """Hands the registry the loop's metrics at scrape time."""

    def __init__(self, metrics: Sequence[LoopHistogram | LoopCounter], model_name: str) -> None:
        self._metrics = metrics
        self._label_names, self._label_values = ["model_name"], [model_name]

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[HistogramMetricFamily | CounterMetricFamily]:
        for m in self._metrics:
            yield m.family(self._label_names, self._label_values)
