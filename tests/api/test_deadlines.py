"""Queue deadlines and retention TTLs, seen through the API with no worker running."""
import time

import pytest

from api import create_app
from common.schemas import JobStatus
from tests.support.settings import cleanup_namespace, make_settings

CHAT = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def make_api(model_ref):
    made = []

    def make(**overrides):
        settings = make_settings(**overrides)
        made.append(settings)
        return create_app(settings).test_client()

    yield make
    for settings in made:
        cleanup_namespace(settings)


def post(api, **body):
    return api.post("/v1/jobs", json={"messages": CHAT, "cache": False, **body})


def test_a_job_queued_past_its_deadline_reads_as_expired_with_no_worker(make_api):
    api = make_api(queue_timeout_s=30)
    job = post(api, queue_timeout=0.3).get_json()  # the request may shorten the server's limit
    assert job["status"] == "queued" and job["queue_deadline"] == pytest.approx(job["created_at"] + 0.3)
    assert job["run_timeout_s"] == 600  # the server default
    time.sleep(0.5)  # the behaviour: its 0.3 s in the queue run out, no worker having come
    expired = api.get(f"/v1/jobs/{job['id']}").get_json()
    assert expired["status"] == "expired" and expired["finish_reason"] == "timeout"
    assert expired["error"]["type"] == "queue_timeout" and expired["finished_at"]
    events = api.get(f"/v1/jobs/{job['id']}/events").get_data(as_text=True)
    assert "event: done" in events and '"status": "expired"' in events
    assert api.delete(f"/v1/jobs/{job['id']}").status_code == 409  # ended: nothing to cancel
    # a request cannot lengthen the server's limit
    assert post(api, queue_timeout=999).get_json()["queue_deadline"] < time.time() + 31


def test_a_listener_on_a_queued_job_is_told_when_it_expires(make_api):
    api = make_api(queue_timeout_s=1, sse_heartbeat_s=0.3)
    job = post(api).get_json()
    started = time.monotonic()
    events = api.get(f"/v1/jobs/{job['id']}/events").get_data(as_text=True)  # blocks until done
    assert '"status": "expired"' in events and time.monotonic() - started < 15


def test_expired_jobs_leave_the_queue_bound_even_if_nobody_reads_them(make_api):
    api = make_api(queue_timeout_s=0.5, max_queue=2)
    stale = [post(api).get_json()["id"] for _ in range(2)]
    assert post(api).status_code == 429
    time.sleep(0.7)  # the behaviour: both run past their 0.5 s deadline, unread
    fresh = post(api)  # admission sweeps the overdue jobs first
    assert fresh.status_code == 202
    store = api.application.extensions["llmq"].jobs
    assert [store.status(j) for j in stale] == [JobStatus.EXPIRED, JobStatus.EXPIRED]
    assert store.queue_depth() == 1


def test_records_and_token_logs_expire_after_the_ttl(make_api):
    api = make_api(job_ttl_s=1)
    store = api.application.extensions["llmq"].jobs
    cancelled = post(api).get_json()["id"]
    assert api.delete(f"/v1/jobs/{cancelled}").status_code == 200
    finished = post(api).get_json()["id"]  # ended by a (simulated) worker, with a token log
    assert store.claim(finished, "w", max_attempts=3)[0] == "start"
    assert store.token_log.append_chunk(finished, 1, {"index": 0, "text": "hi"}, text="hi")
    assert store.finish(finished, JobStatus.SUCCEEDED, attempt=1, finish_reason="stop", text="hi")
    store.token_log.publish_done(finished)
    for job_id in (cancelled, finished):
        assert api.get(f"/v1/jobs/{job_id}").status_code == 200
        assert 0 < store.r.ttl(store.keys.job(job_id)) <= 1
        assert 0 < store.r.ttl(store.keys.events(job_id)) <= 1
    time.sleep(1.5)  # the behaviour: the 1 s retention runs out
    for job_id in (cancelled, finished):
        assert api.get(f"/v1/jobs/{job_id}").status_code == 404
        assert api.get(f"/v1/jobs/{job_id}/events").status_code == 404
        assert not store.r.exists(store.keys.job(job_id), store.keys.events(job_id),
                                  store.keys.lease(job_id))


def test_an_openai_request_whose_job_expires_in_the_queue_is_a_503_to_retry(make_api):
    """Its deadline passed before any worker had room: the service is busy, not broken."""
    api = make_api(queue_timeout_s=1, sse_heartbeat_s=0.3)
    started = time.monotonic()
    resp = api.post("/v1/chat/completions", json={"model": "SmolLM2-135M-Instruct", "messages": CHAT})
    assert resp.status_code == 503 and resp.headers["Retry-After"], resp.get_data(as_text=True)
    assert resp.get_json()["error"]["code"] == "queue_timeout"
    assert time.monotonic() - started < 30  # answered once it expired, not left hanging
