"""`GET /metrics` in Prometheus format, and a structured access log line per request.

Two kinds of figures: this process's HTTP request counts and latencies (prometheus-client
counters), and cluster-wide ones read from Redis when scraped (queue depth per Celery queue, jobs
queued/running, jobs finished by status, result-cache hits and misses, live workers), so any API
process answers them the same.
"""
from __future__ import annotations

import logging
import time

import redis
from flask import Flask, Response, g, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from api.services import Services
from common.tickets import tickets_waiting

log = logging.getLogger("api.access")


class ClusterCollector:
    """Reads llmq's state from Redis at scrape time; a Redis outage shows as `llmq_redis_up 0`."""

    def __init__(self, svc: Services):
        self.svc = svc

    def collect(self):
        up = GaugeMetricFamily("llmq_redis_up", "1 when the API reaches Redis")
        try:
            families = list(self._from_redis())
        except redis.RedisError as exc:
            log.warning("metrics: Redis unreachable: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _from_redis(self):
        svc = self.svc
        workers = svc.registry.live()
        queued = GaugeMetricFamily("llmq_jobs", "jobs now queued or running", labels=["status"])
        queued.add_metric(["queued"], svc.jobs.queue_depth())
        queued.add_metric(["running"], sum(w.get("running", 0) for w in workers))
        yield queued
        depth = GaugeMetricFamily("llmq_queue_depth", "messages waiting in each Celery queue",
                                  labels=["queue"])
        for queue in sorted(self._queues(workers)):
            depth.add_metric([queue], tickets_waiting(svc.redis, svc.keys, queue))
        yield depth
        counters = svc.counters.read()
        finished = CounterMetricFamily("llmq_jobs_finished", "jobs that reached a terminal status "
                                       "(cluster-wide, cache hits excluded)", labels=["status"])
        for name, value in sorted(counters.items()):
            if name.startswith("finished:"):
                finished.add_metric([name.removeprefix("finished:")], value)
        yield finished
        cache = CounterMetricFamily("llmq_cache_lookups", "result-cache lookups by outcome",
                                    labels=["result"])
        cache.add_metric(["hit"], counters.get("cache_hits", 0))
        cache.add_metric(["miss"], counters.get("cache_misses", 0))
        yield cache
        yield CounterMetricFamily("llmq_coalesced", "requests attached to an identical queued or "
                                  "running job instead of generating again", counters.get("coalesced", 0))
        live = GaugeMetricFamily("llmq_workers_live", "workers whose heartbeat is fresh")
        live.add_metric([], len(workers))
        yield live
        yield from self._demand(workers)

    def _demand(self, workers: list[dict]):
        """Per model, what an autoscaler needs (common/demand.py)."""
        jobs = GaugeMetricFamily("llmq_model_jobs", "jobs of a model: queued (not picked by any "
                                 "worker yet) or held (picked by a live worker)", labels=["model", "state"])
        slots = GaugeMetricFamily("llmq_model_slots", "batch slots of the live workers serving a model",
                                  labels=["model"])
        live = GaugeMetricFamily("llmq_model_workers", "live workers serving a model", labels=["model"])
        desired = GaugeMetricFamily("llmq_model_desired_workers", "workers that would hold every queued "
                                    "and held job of a model at once (0: no work)", labels=["model"])
        loading = GaugeMetricFamily("llmq_model_loading", "1 while a worker loads the model (it had queued "
                                    "jobs and no live worker)", labels=["model"])
        load_s = GaugeMetricFamily("llmq_model_load_seconds", "how long the model's last load took",
                                   labels=["model"])
        for demand in self.svc.model_demands(workers):
            loading.add_metric([demand.model], 1 if demand.loading_by else 0)
            if demand.last_load:
                load_s.add_metric([demand.model], demand.last_load["load_s"])
            jobs.add_metric([demand.model, "queued"], demand.queued)
            jobs.add_metric([demand.model, "held"], demand.held)
            slots.add_metric([demand.model], demand.slots)
            live.add_metric([demand.model], demand.workers)
            desired.add_metric([demand.model], demand.desired_workers)
        yield from (jobs, slots, live, desired, loading, load_s)

    def _queues(self, workers: list[dict]) -> set[str]:
        """The catalog's models' queues (even while no worker is live: scale from zero) and every
        queue a live worker consumes."""
        queues = {w["queue"] for w in workers if w.get("queue")}
        queues.update(q for w in workers for q in w.get("queues", []))
        queues.update(self.svc.keys.queue(name) for name in self.svc.admission.served_models())
        return queues


class ApiMetrics:
    def __init__(self, svc: Services):
        self.registry = CollectorRegistry()
        self.requests = Counter("llmq_http_requests", "HTTP requests answered by this API process",
                                ["method", "endpoint", "status"], registry=self.registry)
        self.latency = Histogram("llmq_http_request_duration_seconds",
                                 "time to the response headers (a stream's life is not included)",
                                 ["endpoint"], registry=self.registry)
        Gauge("llmq_api_open_streams", "streams this API process holds open (SSE, OpenAI streams, "
              "OpenAI requests waiting for their answer)", registry=self.registry
              ).set_function(lambda: svc.streams.open)
        Gauge("llmq_api_waiting_streams", "open streams of this API process whose job may still be "
              "queued (they are told their place in line)", registry=self.registry
              ).set_function(lambda: svc.places.watched)
        self.registry.register(ClusterCollector(svc))

    def observe(self, response: Response) -> None:
        endpoint = request.endpoint or "unknown"
        elapsed = time.perf_counter() - g.get("llmq_t0", time.perf_counter())
        self.requests.labels(request.method, endpoint, str(response.status_code)).inc()
        self.latency.labels(endpoint).observe(elapsed)
        # the job the request names, or the one it created (api/submit.py)
        job_id = (request.view_args or {}).get("job_id") or g.get("llmq_job_id")
        log.info("%s %s %d %.1fms", request.method, request.path, response.status_code, elapsed * 1000,
                 extra={"method": request.method, "path": request.path, "status": response.status_code,
                        "duration_ms": round(elapsed * 1000, 1), "job_id": job_id})


def init_app(app: Flask, svc: Services) -> None:
    metrics = ApiMetrics(svc)
    app.extensions["llmq_metrics"] = metrics

    @app.before_request
    def _start_timer():
        g.llmq_t0 = time.perf_counter()

    @app.after_request
    def _observe(response: Response) -> Response:
        metrics.observe(response)
        return response

    @app.get("/metrics")
    def prometheus_metrics():
        return Response(generate_latest(metrics.registry), mimetype=CONTENT_TYPE_LATEST)
