"""Queue position, ETAs and Retry-After come from what workers measure (real Redis, heartbeats
written as a worker writes them; no worker consumes, so jobs stay queued)."""
import json
import time

from tests.support.settings import settings_fixture

CHAT = [{"role": "user", "content": "Hello"}]


# A fresh namespace per test (an empty queue, no heartbeat), with room for four jobs.
settings = settings_fixture(scope="function", max_queue=4)


def fake_heartbeat(svc, model, tokens_per_s, mean_job_tokens, capacity=2, running=2):
    info = {"name": "w-test", "model": model, "max_batch_size": capacity, "running": running,
            "tokens_per_s": tokens_per_s, "mean_job_tokens": mean_job_tokens}
    svc.redis.hset(svc.keys.workers, "w-test", json.dumps(info))
    svc.redis.set(svc.keys.worker_alive("w-test"), "1", ex=30)


def submit(client):
    resp = client.post("/v1/jobs", json={"messages": CHAT, "max_tokens": 20, "cache": False})
    return resp


def test_queued_jobs_carry_position_and_eta_that_grow_along_the_queue(api):
    client, svc = api, api.services
    model, _ = svc.admission.model()
    fake_heartbeat(svc, model.name, tokens_per_s=40.0, mean_job_tokens=20.0)  # drains 2 jobs/s
    before = time.time()
    jobs = [submit(client).get_json() for _ in range(3)]
    assert [j["queue_position"] for j in jobs] == [1, 2, 3]
    starts = [j["estimated_start"] - before for j in jobs]
    assert starts == sorted(starts) and 0.4 < starts[0] < 1.0 and 1.4 < starts[2] < 2.0
    assert all(j["estimated_finish"] > j["estimated_start"] for j in jobs)
    # GET while queued says the same; position moves up when the head leaves
    client.delete(f"/v1/jobs/{jobs[0]['id']}")
    again = client.get(f"/v1/jobs/{jobs[2]['id']}").get_json()
    assert again["queue_position"] == 2


def test_retry_after_is_computed_from_the_measured_rate(api):
    client, svc = api, api.services
    model, _ = svc.admission.model()
    for _ in range(4):
        assert submit(client).status_code == 202
    fake_heartbeat(svc, model.name, tokens_per_s=4.0, mean_job_tokens=20.0)  # 0.2 jobs/s
    slow = submit(client)
    fake_heartbeat(svc, model.name, tokens_per_s=400.0, mean_job_tokens=20.0)  # 20 jobs/s
    fast = submit(client)
    assert slow.status_code == fast.status_code == 429
    assert int(slow.headers["Retry-After"]) == 5 and int(fast.headers["Retry-After"]) == 1


def test_no_live_worker_means_position_without_eta(api):
    client = api
    job = submit(client).get_json()
    assert job["queue_position"] == 1 and "estimated_start" not in job
