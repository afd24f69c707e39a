"""Prometheus metrics, exported by an observer plugin built on the lifecycle hooks.

Enable it with ``FanOut(plugins=[MetricsObserver.serve("orders", port=9108)])`` or a
``[metrics]`` section in a pipeline file. Every metric carries the ``pipeline`` label;
per-sink metrics also ``sink``:

- ``fanout_batches_total{outcome}``: micro-batches committed (``committed``) or failed;
- ``fanout_batch_duration_seconds``: wall time of each batch's fan-out;
- ``fanout_rows_written_total{sink}`` and ``fanout_dead_lettered_rows_total{sink}``;
  ``fanout_rows_already_written_total{sink}``: rows of batches a sink found written
  already by its own records (a replay, a retry after a commit), not written again;
- ``fanout_sink_duration_seconds{sink}``: time of each successful write;
- ``fanout_sink_retries_total{sink}`` and ``fanout_sink_failures_total{sink}`` (attempts
  that failed for good);
- ``fanout_last_committed_batch{sink}``: the last batch each sink committed;
- for sinks that may lag (``on_failure="lag"``, ``backfill_from``):
  ``fanout_sink_lag_batches{sink}`` and ``fanout_sink_lag_rows{sink}`` (how far behind),
  ``fanout_sink_state{sink,state}`` (1 for its state: live, lagging, catching_up), and
  ``fanout_spool_batches``, ``fanout_spool_rows``, ``fanout_spool_bytes``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fanout.contract.batch import BatchInfo
from fanout.contract.lag import SinkLag, SpoolSize
from fanout.contract.sink import SinkResult
from fanout.hooks.specs import hookimpl


class MetricsObserver:
    """Counts what the lifecycle hooks report into its own Prometheus registry.

    :param pipeline: the value of the ``pipeline`` label.
    """

    def __init__(self, pipeline: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.pipeline = pipeline
        self.registry = CollectorRegistry()
        self.server: Any = None
        self._serving: tuple[int, str] | None = None  # (port asked for, host) when serving
        self._started: dict[int, float] = {}
        self._lock = threading.Lock()
        sink = ["pipeline", "sink"]
        kw: dict[str, Any] = {"registry": self.registry}
        self.batches = Counter(
            "fanout_batches", "Micro-batches fanned out", ["pipeline", "outcome"], **kw
        )
        self.batch_duration = Histogram(
            "fanout_batch_duration_seconds", "Fan-out time per micro-batch", ["pipeline"], **kw
        )
        self.rows = Counter("fanout_rows_written", "Rows written per sink", sink, **kw)
        self.held = Counter(
            "fanout_rows_already_written",
            "Rows a sink found already written (a replay, a retry), not written again",
            sink,
            **kw,
        )
        self.dead = Counter(
            "fanout_dead_lettered_rows", "Rows sent to a sink's dead-letter target", sink, **kw
        )
        self.sink_duration = Histogram(
            "fanout_sink_duration_seconds", "Time of each successful sink write", sink, **kw
        )
        self.retries = Counter("fanout_sink_retries", "Sink attempts retried", sink, **kw)
        self.failures = Counter(
            "fanout_sink_failures", "Sink attempts that failed for good", sink, **kw
        )
        self.last_batch = Gauge(
            "fanout_last_committed_batch", "Last batch each sink committed", sink, **kw
        )
        self.lag_batches = Gauge(
            "fanout_sink_lag_batches", "Batches a lagging sink still needs", sink, **kw
        )
        self.lag_rows = Gauge(
            "fanout_sink_lag_rows", "Spooled rows a lagging sink still needs", sink, **kw
        )
        self.sink_state = Gauge(
            "fanout_sink_state", "1 for the sink's state", ["pipeline", "sink", "state"], **kw
        )
        self.spool_batches = Gauge("fanout_spool_batches", "Batches spooled", ["pipeline"], **kw)
        self.spool_rows = Gauge("fanout_spool_rows", "Rows spooled", ["pipeline"], **kw)
        self.spool_bytes = Gauge("fanout_spool_bytes", "Bytes of spool files", ["pipeline"], **kw)

    @classmethod
    def serve(cls, pipeline: str, *, port: int = 9108, host: str = "0.0.0.0") -> MetricsObserver:
        """An observer whose metrics are served over HTTP at ``http://host:port/metrics``
        (``port=0`` picks a free port; see :attr:`port`)."""
        from prometheus_client import start_http_server

        observer = cls(pipeline)
        observer.server, _thread = start_http_server(port, addr=host, registry=observer.registry)
        observer._serving = (port, host)
        return observer

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as configuration (with a ``FanOut`` under Spark Connect): a fresh
        observer where it lands, serving there if this one serves (docs/architecture.md
        §15: the metrics of a Connect pipeline are those of the process beside the
        server)."""
        return (_rebuilt, (self.pipeline, self._serving))

    @property
    def port(self) -> int | None:
        """The port the metrics are served on, when serving."""
        return None if self.server is None else int(self.server.server_port)

    def stop(self) -> None:
        """Stop serving."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def value(self, name: str, **labels: str) -> float | None:
        """The current value of a sample (for tests and status pages)."""
        return self.registry.get_sample_value(name, {"pipeline": self.pipeline, **labels})

    # -- hooks --------------------------------------------------------------------------

    @hookimpl
    def fanout_batch_start(
        self, info: BatchInfo, pending: Sequence[str], skipped: Sequence[str]
    ) -> None:
        """Start the batch clock."""
        with self._lock:
            self._started[info.batch_id] = time.perf_counter()

    @hookimpl
    def fanout_sink_error(
        self, info: BatchInfo, sink: str, error: BaseException, attempt: int, will_retry: bool
    ) -> None:
        """Count a retry or a final failure."""
        (self.retries if will_retry else self.failures).labels(self.pipeline, sink).inc()

    @hookimpl
    def fanout_sink_done(
        self, info: BatchInfo, sink: str, result: SinkResult, duration_s: float
    ) -> None:
        """Time the successful write (rows are counted once the mark is written)."""
        self.sink_duration.labels(self.pipeline, sink).observe(duration_s)

    @hookimpl
    def fanout_batch_end(self, info: BatchInfo, results: Mapping[str, SinkResult]) -> None:
        """Count rows of every sink that committed, and the batch."""
        self._count_committed(info, results)
        self._finish(info, "committed")

    @hookimpl
    def fanout_batch_failed(
        self,
        info: BatchInfo,
        failures: Mapping[str, BaseException],
        results: Mapping[str, SinkResult],
    ) -> None:
        """Count the sinks that committed anyway, and the failed batch."""
        self._count_committed(info, results)
        self._finish(info, "failed")

    @hookimpl
    def fanout_sink_lag(
        self, info: BatchInfo, lags: Mapping[str, SinkLag], spool: SpoolSize | None
    ) -> None:
        """How far behind each lag-capable sink is, and the spool's size."""
        for sink, lag in lags.items():
            self.lag_batches.labels(self.pipeline, sink).set(lag.batches)
            self.lag_rows.labels(self.pipeline, sink).set(lag.rows)
            for state in ("live", "lagging", "catching_up"):
                self.sink_state.labels(self.pipeline, sink, state).set(int(lag.state == state))
        if spool is not None:
            self.spool_batches.labels(self.pipeline).set(spool.batches)
            self.spool_rows.labels(self.pipeline).set(spool.rows)
            self.spool_bytes.labels(self.pipeline).set(spool.bytes)

    def _count_committed(self, info: BatchInfo, results: Mapping[str, SinkResult]) -> None:
        for sink, result in results.items():
            written = self.rows.labels(self.pipeline, sink)
            held = self.held.labels(self.pipeline, sink)  # both shown, 0 until counted
            (held if result.already_written else written).inc(result.rows)
            self.dead.labels(self.pipeline, sink).inc(result.dead_lettered)
            self.last_batch.labels(self.pipeline, sink).set(info.batch_id)

    def _finish(self, info: BatchInfo, outcome: str) -> None:
        with self._lock:
            started = self._started.pop(info.batch_id, None)
        if started is not None:
            self.batch_duration.labels(self.pipeline).observe(time.perf_counter() - started)
        self.batches.labels(self.pipeline, outcome).inc()


def _rebuilt(pipeline: str, serving: tuple[int, str] | None) -> MetricsObserver:
    """A :class:`MetricsObserver` unpickled: serving at the same port when it is free,
    else at a free one (said in the log), so two processes on one host both serve."""
    if serving is None:
        return MetricsObserver(pipeline)
    port, host = serving
    try:
        return MetricsObserver.serve(pipeline, port=port, host=host)
    except OSError as exc:
        observer = MetricsObserver.serve(pipeline, port=0, host=host)
        logging.getLogger("fanout").warning(
            "pipeline %s: metrics port %d is taken here (%s); serving at %d instead",
            pipeline, port, exc, observer.port,
        )  # fmt: skip
        return observer
