"""The Prometheus metrics of `vsr-run serve` (prometheus-client), one registry per service.

With PROMETHEUS_MULTIPROC_DIR set (the replicas of `--replicas N`, one process each), the values
are kept in that folder's files and /metrics reads every replica's through MultiProcessCollector,
prometheus-client's own multiprocess mode; the queue-depth gauge then sums over the replicas.
"""
from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServiceMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("vsr_requests", "HTTP requests answered, by endpoint and status code",
                                ["endpoint", "code"], registry=r)
        self.errors = Counter("vsr_errors", "Requests refused or failed, by kind", ["kind"], registry=r)
        self.inputs = Counter("vsr_inputs", "Texts answered (one call may carry several)", registry=r)
        self.latency = Histogram("vsr_request_latency_seconds", "Time from a request's arrival to its answer",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("vsr_queue_wait_seconds", "Time a call waits before the engine takes it",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.engine_seconds = Histogram("vsr_engine_seconds", "Time of one engine call",
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.batch_rows = Histogram("vsr_batch_rows", "Rows (texts) per batch taken by the engine worker",
                                    buckets=ROW_BUCKETS, registry=r)
        self.batch_calls = Histogram("vsr_batch_calls", "Calls merged into one batch",
                                     buckets=ROW_BUCKETS, registry=r)
        self.engine_rows = Histogram("vsr_engine_call_rows", "Rows per engine call", buckets=ROW_BUCKETS, registry=r)
        self.engine_failures = Counter("vsr_engine_failures", "Engine calls that raised (their callers got 500)",
                                       registry=r)
        self.depth = Gauge("vsr_queue_depth", "Calls waiting for the engine", registry=r,
                           multiprocess_mode="livesum")

    # The batcher's hooks (called from its worker thread or the event loop; prometheus-client
    # metrics are thread-safe).
    def batch(self, calls: int, rows: int, waits: list[float]) -> None:
        self.batch_calls.observe(calls)
        self.batch_rows.observe(rows)
        for w in waits:
            self.queue_wait.observe(w)

    def engine_call(self, rows: int, seconds: float) -> None:
        self.engine_rows.observe(rows)
        self.engine_seconds.observe(seconds)

    def engine_failed(self) -> None:
        self.engine_failures.inc()

    def queue_depth(self, depth: int) -> None:
        self.depth.set(depth)

    def exposition(self) -> tuple[bytes, str]:
        """The text /metrics returns and its content type."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
