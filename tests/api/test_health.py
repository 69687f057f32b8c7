"""`/health` answers from the workers' heartbeats in Redis alone, cheap enough for a probe that polls
it; `/health?deep=1` also pings the workers through the broker."""
import time

import pytest
import requests

from api import create_app
from tests.support.servers import LiveServer
from tests.support.settings import cleanup_namespace, make_settings, settings_fixture
from tests.support.waiting import wait_until


# A fresh namespace per test: no heartbeats left by another test.
settings = settings_fixture(scope="function")


def beat(registry, name, ttl_s):
    registry.heartbeat({"name": name, "model": "SmolLM2-135M-Instruct", "running": 0,
                     "updated_at": time.time()}, ttl_s=ttl_s)


def broker_pings(api, monkeypatch) -> list:
    """The pings the app sends its workers through the broker (Celery's remote control), recorded
    as they go out: what makes a health check wait for replies."""
    control, pings = api.services.celery.control, []
    ping = control.ping
    monkeypatch.setattr(control, "ping", lambda *args, **kwargs: pings.append(kwargs) or ping(*args, **kwargs))
    return pings


def test_health_lists_workers_by_heartbeat_without_asking_the_broker(api, monkeypatch):
    base, registry = api.serve(), api.services.registry
    pings = broker_pings(api, monkeypatch)
    assert requests.get(f"{base}/health", timeout=10).json()["status"] == "degraded"  # no worker yet
    beat(registry, "steady:1", ttl_s=60)
    beat(registry, "dying:2", ttl_s=1)
    body = requests.get(f"{base}/health", timeout=10).json()
    assert body["status"] == "ok" and body["workers"] == ["dying:2", "steady:1"]
    assert "celery_workers" not in body and pings == []  # heartbeats read from Redis, nobody pinged

    time.sleep(1.5)  # the 1 s heartbeat of the dying worker lapses: it drops out, and out of the hash
    assert requests.get(f"{base}/health", timeout=10).json()["workers"] == ["steady:1"]
    assert registry.r.hkeys(registry.keys.workers) == ["steady:1"]
    assert pings == []


def test_deep_health_pings_the_workers_through_the_broker(api, monkeypatch):
    base, registry = api.serve(), api.services.registry
    pings = broker_pings(api, monkeypatch)
    beat(registry, "ghost:3", ttl_s=60)  # a heartbeat without a consumer behind it
    assert requests.get(f"{base}/health", timeout=10).json()["workers"] == ["ghost:3"]
    assert pings == []
    deep = requests.get(f"{base}/health", params={"deep": "1"}, timeout=10).json()
    assert deep["celery_workers"] == [] and deep["workers"] == [] and deep["status"] == "degraded"
    assert len(pings) == 1  # one round of pings, answered by nobody


@pytest.mark.slow
def test_a_killed_worker_drops_out_once_its_heartbeat_is_stale(start_worker, model_ref):
    settings = make_settings(heartbeat_s=1)
    worker = start_worker(settings)
    server = LiveServer(create_app(settings))
    try:
        seen = {}

        def deep_ok():  # a ping can miss its 1 s timeout on a loaded machine, which says degraded
            seen.update(requests.get(f"{server.url}/health", params={"deep": "1"}, timeout=10).json())
            return seen["status"] == "ok"
        wait_until(deep_ok, 10, interval=0.2)
        body = seen
        assert len(body["workers"]) == 1
        assert any(worker.name in name for name in body["celery_workers"])
        worker.kill()
        wait_until(lambda: not requests.get(f"{server.url}/health", timeout=10).json()["workers"], 10,
                   interval=0.2)  # heartbeat TTL: 3 beats
        assert requests.get(f"{server.url}/health", timeout=10).json()["status"] == "degraded"
    finally:
        server.stop()
        cleanup_namespace(settings)
