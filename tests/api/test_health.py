"""`/health` answers from the workers' heartbeats in Redis, fast enough for a probe that polls it;
`/health?deep=1` also pings the workers through the broker."""
import statistics
import time

import pytest
import requests

from api import create_app
from tests.support.servers import LiveServer
from tests.support.settings import cleanup_namespace, fresh_namespace, make_settings


@pytest.fixture
def settings():
    """A fresh namespace per test: no heartbeats left by another test."""
    with fresh_namespace() as settings:
        yield settings


def beat(registry, name, ttl_s):
    registry.heartbeat({"name": name, "model": "SmolLM2-135M-Instruct", "running": 0,
                     "updated_at": time.time()}, ttl_s=ttl_s)


def test_health_is_fast_and_lists_workers_by_heartbeat(api):
    base, registry = api.serve(), api.services.registry
    assert requests.get(f"{base}/health", timeout=10).json()["status"] == "degraded"  # no worker yet
    beat(registry, "steady:1", ttl_s=60)
    beat(registry, "dying:2", ttl_s=1)
    body = requests.get(f"{base}/health", timeout=10).json()
    assert body["status"] == "ok" and body["workers"] == ["dying:2", "steady:1"]

    timings = []
    for _ in range(20):
        started = time.perf_counter()
        assert requests.get(f"{base}/health", timeout=10).status_code == 200
        timings.append(time.perf_counter() - started)
    assert statistics.median(timings) < 0.05, timings

    time.sleep(1.5)  # the dying worker's heartbeat is stale: it drops out, and out of the hash
    assert requests.get(f"{base}/health", timeout=10).json()["workers"] == ["steady:1"]
    assert registry.r.hkeys(registry.keys.workers) == ["steady:1"]


def test_deep_health_pings_the_workers_through_the_broker(api):
    base, registry = api.serve(), api.services.registry
    beat(registry, "ghost:3", ttl_s=60)  # a heartbeat without a consumer behind it
    assert requests.get(f"{base}/health", timeout=10).json()["workers"] == ["ghost:3"]
    deep = requests.get(f"{base}/health", params={"deep": "1"}, timeout=10).json()
    assert deep["celery_workers"] == [] and deep["workers"] == [] and deep["status"] == "degraded"


@pytest.mark.slow
def test_a_killed_worker_drops_out_once_its_heartbeat_is_stale(start_worker, model_ref):
    settings = make_settings(heartbeat_s=1)
    worker = start_worker(settings)
    server = LiveServer(create_app(settings))
    try:
        body = requests.get(f"{server.url}/health", params={"deep": "1"}, timeout=10).json()
        assert body["status"] == "ok" and len(body["workers"]) == 1
        assert any(worker.name in name for name in body["celery_workers"])
        worker.kill()
        killed = time.monotonic()
        while requests.get(f"{server.url}/health", timeout=10).json()["workers"]:
            assert time.monotonic() - killed < 10  # heartbeat TTL: 3 beats
            time.sleep(0.2)
        assert requests.get(f"{server.url}/health", timeout=10).json()["status"] == "degraded"
    finally:
        server.stop()
        cleanup_namespace(settings)
