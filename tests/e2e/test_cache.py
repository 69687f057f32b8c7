"""Result cache: an identical deterministic request is answered by the API alone."""
import pytest
import requests

from api import create_app
from tests.support.servers import LiveServer
from tests.support.settings import cleanup_namespace, make_settings
from tests.support.waiting import wait_for_job

pytestmark = pytest.mark.slow
BODY = {"messages": [{"role": "user", "content": "What colour is the sky on a clear day?"}],
        "max_tokens": 24, "temperature": 0}


@pytest.fixture(scope="module")
def own_stack(start_worker, model_ref):
    """A worker of our own, so the test can stop it."""
    settings = make_settings()
    worker = start_worker(settings)
    server = LiveServer(create_app(settings))
    yield server.url, worker
    server.stop()
    cleanup_namespace(settings)


def test_cached_answer_is_served_with_the_worker_stopped(own_stack):
    base, worker = own_stack
    first = requests.post(f"{base}/v1/jobs", json=BODY, timeout=10)
    assert first.status_code == 202
    original = wait_for_job(base, first.json()["id"])
    assert original["status"] == "succeeded" and not original["cached"]

    worker.stop()
    assert requests.get(f"{base}/health", timeout=10).json()["workers"] == []

    hit = requests.post(f"{base}/v1/jobs", json=BODY, timeout=10)
    assert hit.status_code == 200
    job = hit.json()
    assert job["cached"] and job["status"] == "succeeded" and job["id"] != original["id"]
    assert job["text"] == original["text"] and job["usage"] == original["usage"]
    assert job["attempts"] == 0  # never delivered to a worker
    events = requests.get(f"{base}{job['links']['events']}", timeout=10).text
    assert "event: done" in events and '"cached": true' in events

    # `cache: false`, a different parameter, or a non-deterministic request all go to the queue
    for body in ({**BODY, "cache": False}, {**BODY, "max_tokens": 25}, {**BODY, "temperature": 0.7}):
        resp = requests.post(f"{base}/v1/jobs", json=body, timeout=10)
        assert resp.status_code == 202 and resp.json()["status"] == "queued"
