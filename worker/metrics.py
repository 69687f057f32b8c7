"""A worker's Prometheus metrics, served on its own HTTP port (`LLMQ_METRICS_PORT`).

Per-job figures (time in queue, time to first token, decode tokens/s, jobs finished by status) are
observed by the job runner; engine figures (batch size per step, steps, tokens) are read from the
engine's plain `EngineStats` at scrape time, so the engine itself knows nothing of Prometheus.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from worker.engine.protocol import EngineStats

log = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)
RATE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


class EngineCollector:
    """Exports `EngineStats` (owned and updated by the engine thread) when scraped."""

    def __init__(self, stats: Callable[[], EngineStats], running: Callable[[], int]):
        self.stats = stats
        self.running = running

    def collect(self):
        stats = self.stats()
        histogram = dict(stats.batch_size_histogram)  # one C-level copy: safe against the engine thread
        buckets, cumulative = [], 0
        for bound in BATCH_BUCKETS:
            cumulative += sum(n for size, n in histogram.items() if bound // 2 < size <= bound)
            buckets.append((floatToGoString(bound), cumulative))
        buckets.append(("+Inf", sum(histogram.values())))
        total = sum(size * n for size, n in histogram.items())
        batch = HistogramMetricFamily("llmq_worker_batch_size", "sequences in each engine step's forward")
        batch.add_metric([], buckets, sum_value=total)
        yield batch
        steps = CounterMetricFamily("llmq_worker_engine_steps", "engine steps", labels=["kind"])
        steps.add_metric(["prefill"], stats.prefill_steps)
        steps.add_metric(["decode"], stats.decode_steps)
        yield steps
        tokens = CounterMetricFamily("llmq_worker_tokens_generated", "tokens sampled by the engine")
        tokens.add_metric([], stats.tokens_generated)
        yield tokens
        running = GaugeMetricFamily("llmq_worker_running_jobs", "jobs in the engine now")
        running.add_metric([], self.running())
        yield running


class WorkerMetrics:
    def __init__(self, stats: Callable[[], EngineStats], running: Callable[[], int],
                 info: dict[str, str]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.time_in_queue = Histogram("llmq_worker_time_in_queue_seconds",
                                       "from submission to a worker starting the job",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("llmq_worker_time_to_first_token_seconds",
                              "from submission to the job's first generated token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tokens_per_s = Histogram("llmq_worker_job_tokens_per_second",
                                      "decode speed of each job after its first token",
                                      buckets=RATE_BUCKETS, registry=r)
        self.finished = Counter("llmq_worker_jobs_finished", "jobs this worker ended, by status",
                                ["status"], registry=r)
        self.affinity = Counter("llmq_worker_prefix_affinity_picks", "jobs this worker picked, by how prefix "
                                "affinity placed them: hit (it had served the prompt's start last), miss "
                                "(another worker had, but was busy, gone or slow to take it), new", ["outcome"],
                                registry=r)
        Info("llmq_worker", "what this worker serves", registry=r).info(info)
        r.register(EngineCollector(stats, running))

    def job_started(self, created_at: float, started_at: float) -> None:
        self.time_in_queue.observe(max(0.0, started_at - created_at))

    def job_generated(self, created_at: float, first_token_at: float | None, finished_at: float,
                      completion_tokens: int) -> None:
        if first_token_at is None:
            return
        self.ttft.observe(max(0.0, first_token_at - created_at))
        decode_s = finished_at - first_token_at
        if completion_tokens > 1 and decode_s > 0:
            self.tokens_per_s.observe((completion_tokens - 1) / decode_s)

    def affinity_picked(self, outcome: str) -> None:
        self.affinity.labels(outcome).inc()

    def job_finished(self, status: str) -> None:
        self.finished.labels(status).inc()


class HeldModelsCollector:
    """Every held model's metrics in one exposition. A worker that may hold several models labels
    each sample with its model, since each model has its own engine, batch and jobs; a worker of
    one model keeps today's series as they are."""

    def __init__(self, held):
        self.held = held

    def collect(self):
        label = self.held.catalog.named
        families: dict[str, Metric] = {}
        for runtime in self.held.runtimes():
            for family in runtime.metrics.registry.collect():
                merged = families.setdefault(family.name, Metric(family.name, family.documentation,
                                                                 family.type, family.unit))
                for sample in family.samples:
                    labels = {**sample.labels, "model": runtime.model.name} if label else sample.labels
                    merged.add_sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
        yield from families.values()
        loads = CounterMetricFamily("llmq_worker_model_loads", "catalog models this worker loaded", labels=["model"])
        unloads = CounterMetricFamily("llmq_worker_model_unloads", "catalog models this worker unloaded "
                                      "(idle, for another model)", labels=["model"])
        for model, n in self.held.loads.items():
            loads.add_metric([model], n)
        for model, n in self.held.unloads.items():
            unloads.add_metric([model], n)
        yield from (loads, unloads)


def serve_held_metrics(held, port: int, host: str) -> None:
    registry = CollectorRegistry()
    registry.register(HeldModelsCollector(held))
    start_http_server(port, addr=host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", host, port)

