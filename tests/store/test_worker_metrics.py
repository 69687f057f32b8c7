"""A worker's metrics registry, fed as the job runner and the engine feed it, served over HTTP."""
from types import SimpleNamespace

import requests

from tests.support.metrics import parse_metrics, value
from tests.support.ports import free_port
from worker.engine.protocol import EngineStats
from worker.metrics import WorkerMetrics, serve_held_metrics


def test_engine_stats_and_job_timings_are_served():
    stats = EngineStats(steps=7, prefill_steps=2, decode_steps=5, tokens_generated=30,
                        batch_size_histogram={1: 2, 3: 4, 16: 1})
    metrics = WorkerMetrics(lambda: stats, lambda: 2, {"model": "m", "engine": "hf", "queue": "q", "worker": "w"})
    metrics.job_started(created_at=100.0, started_at=100.4)
    metrics.job_generated(created_at=100.0, first_token_at=101.0, finished_at=103.0, completion_tokens=21)
    metrics.job_generated(created_at=100.0, first_token_at=None, finished_at=101.0, completion_tokens=0)
    metrics.job_finished("succeeded")
    metrics.job_finished("cancelled")
    s = _scrape(_held(named=False, m=metrics))
    assert value(s, "llmq_worker_batch_size_bucket", le="1.0") == 2
    assert value(s, "llmq_worker_batch_size_bucket", le="4.0") == 6
    assert value(s, "llmq_worker_batch_size_bucket", le="8.0") == 6
    assert value(s, "llmq_worker_batch_size_bucket", le="16.0") == 7
    assert value(s, "llmq_worker_batch_size_count") == 7 and value(s, "llmq_worker_batch_size_sum") == 30
    assert value(s, "llmq_worker_engine_steps_total", kind="decode") == 5
    assert value(s, "llmq_worker_tokens_generated_total") == 30
    assert value(s, "llmq_worker_running_jobs") == 2
    assert value(s, "llmq_worker_time_in_queue_seconds_count") == 1
    assert abs(value(s, "llmq_worker_time_in_queue_seconds_sum") - 0.4) < 1e-9
    assert value(s, "llmq_worker_time_to_first_token_seconds_sum") == 1.0  # a job with no token is skipped
    assert value(s, "llmq_worker_job_tokens_per_second_sum") == 10.0  # 20 tokens after the first, in 2 s
    assert value(s, "llmq_worker_jobs_finished_total", status="cancelled") == 1
    assert value(s, "llmq_worker_info", model="m", engine="hf", queue="q", worker="w") == 1


def test_a_worker_of_several_models_labels_each_models_series():
    stats = {"a": EngineStats(tokens_generated=5), "b": EngineStats(tokens_generated=9)}
    metrics = {name: WorkerMetrics(lambda name=name: stats[name], lambda: 1,
                                   {"model": name, "engine": "hf", "queue": f"q.{name}", "worker": f"w/{name}"})
               for name in stats}
    metrics["b"].job_finished("succeeded")
    s = _scrape(_held(named=True, **metrics))
    assert value(s, "llmq_worker_tokens_generated_total", model="a") == 5
    assert value(s, "llmq_worker_tokens_generated_total", model="b") == 9
    assert value(s, "llmq_worker_jobs_finished_total", status="succeeded", model="b") == 1
    assert value(s, "llmq_worker_model_loads_total", model="b") == 1


def _held(named: bool, **metrics):
    """What `serve_held_metrics` reads of a worker's held models."""
    runtimes = [SimpleNamespace(metrics=m, model=SimpleNamespace(name=name)) for name, m in metrics.items()]
    return SimpleNamespace(catalog=SimpleNamespace(named=named), runtimes=lambda: runtimes,
                           loads={name: 1 for name in metrics}, unloads={})


def _scrape(held) -> list:
    port = free_port()
    serve_held_metrics(held, port, "127.0.0.1")
    return parse_metrics(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
