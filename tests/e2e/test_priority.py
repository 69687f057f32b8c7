"""High-priority jobs overtake a backlog of low-priority ones on a real worker.

The worker holds one job at a time (concurrency 1, prefetch 1), so the rest wait in the fair queue,
where a free slot always takes a job of the highest level waiting (common/scheduling/fair_queue.py).
"""
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from api import create_app
from tests.support.servers import LiveServer
from tests.support.settings import cleanup_namespace, make_settings
from tests.support.waiting import wait_for_job

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(start_worker, model_ref):
    settings = make_settings()
    start_worker(settings, concurrency=1)
    server = LiveServer(create_app(settings))
    yield server.url
    server.stop()
    cleanup_namespace(settings)


def submit(base, i, priority):
    body = {"prompt": f"Fact number {i} about the sea:", "max_tokens": 12, "temperature": 0,
            "cache": False, "priority": priority}
    resp = requests.post(f"{base}/v1/jobs", json=body, timeout=30)
    assert resp.status_code == 202, resp.text
    assert resp.json()["priority"] == priority
    return resp.json()["id"]


def test_high_priority_jobs_overtake_a_low_priority_backlog(base):
    low = [submit(base, i, "low") for i in range(12)]
    high = [submit(base, 100 + i, "high") for i in range(3)]
    with ThreadPoolExecutor(8) as pool:
        jobs = {j["id"]: j for j in pool.map(lambda j: wait_for_job(base, j, timeout=600), low + high)}
    assert all(j["status"] == "succeeded" for j in jobs.values())
    last_high_start = max(jobs[j]["started_at"] for j in high)
    low_after = sum(jobs[j]["started_at"] > last_high_start for j in low)
    # submitted last, the high ones still start before most of the backlog: only the job(s) the
    # worker had already taken when they arrived go first
    assert low_after >= len(low) - 3, sorted((jobs[j]["started_at"], j in high) for j in jobs)
    assert sum(jobs[j]["started_at"] > jobs[high[0]]["started_at"] for j in low) >= len(low) - 3
