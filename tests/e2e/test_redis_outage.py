"""A Redis restart under a live stack: the API answers 503 while it is down and recovers by itself,
the worker rides it out and reconnects, and no job record is left half-written.

Uses a private `redis-server` on a free port, configured as llmq's scripts start Redis (append-only
file fsynced every second, noeviction), so a restart keeps the data; the shared Redis is never
touched. One test kills that Redis with SIGKILL, so what survives is what the append-only file holds.
"""
import time

import pytest
import redis
import requests

from api import create_app
from common.schemas import JobStatus
from common.sseclient import iter_sse
from tests.support.processes import PrivateRedis
from tests.support.servers import LiveServer
from tests.support.settings import make_settings
from tests.support.waiting import wait_for_job, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def outage_stack(start_worker, model_ref, tmp_path_factory):
    private = PrivateRedis(tmp_path_factory.mktemp("redis"))
    private.start()
    settings = make_settings(redis_url=f"{private.url}/0", heartbeat_s=1, max_tokens_cap=512)
    worker = start_worker(settings)
    server = LiveServer(create_app(settings))
    yield private, server.url, settings, worker
    server.stop()
    worker.stop()
    private.stop()


def post(base, **body):
    return requests.post(f"{base}/v1/jobs", json={"cache": False, **body}, timeout=30)


def test_redis_restart_is_503_then_recovery_without_losing_or_tearing_a_job(outage_stack):
    private, base, settings, worker = outage_stack
    warm = post(base, prompt="Hello", max_tokens=4)
    assert wait_for_job(base, warm.json()["id"])["status"] == "succeeded"

    long_job = post(base, prompt="1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", max_tokens=64, temperature=0).json()
    wait_until(lambda: len(requests.get(f"{base}/v1/jobs/{long_job['id']}", timeout=30).json()["text"]) >= 3,
               120, interval=0.1)

    private.stop()
    for call in (lambda: post(base, prompt="Hi"),
                 lambda: requests.get(f"{base}/v1/jobs/{long_job['id']}", timeout=30),
                 lambda: requests.get(f"{base}/v1/jobs/{long_job['id']}/events", timeout=30),
                 lambda: requests.delete(f"{base}/v1/jobs/{long_job['id']}", timeout=30)):
        started = time.monotonic()
        resp = call()
        assert time.monotonic() - started < 15  # answers, does not hang
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["type"] == "service_unavailable"
        assert "Redis" in resp.json()["error"]["message"] and int(resp.headers["Retry-After"]) > 0
    assert requests.get(f"{base}/health", timeout=30).status_code == 503
    time.sleep(3)  # the outage lasts: the worker keeps generating meanwhile
    assert worker.proc.poll() is None

    private.start()
    def accepted():
        resp = post(base, prompt="Name a colour.", max_tokens=8)
        assert resp.status_code in (202, 503), resp.text
        return resp.status_code == 202 and resp
    resp = wait_until(accepted, 60, interval=0.5, message="the API kept answering 503")
    after = wait_for_job(base, resp.json()["id"], timeout=180)  # the worker reconnected
    assert after["status"] == "succeeded"

    final = wait_for_job(base, long_job["id"], timeout=180)
    assert final["status"] == "succeeded" and final["attempts"] == 1
    assert final["usage"]["completion_tokens"] == 64
    with requests.get(f"{base}/v1/jobs/{long_job['id']}/events", stream=True, timeout=30) as stream:
        events = list(iter_sse(stream.iter_lines()))
    chunks = [e.json() for e in events if e.event == "chunk"]
    assert [c["index"] for c in chunks] == list(range(len(chunks)))
    assert "".join(c["text"] for c in chunks) == final["text"]
    assert events[-1].event == "done" and "restart" not in [e.event for e in events]

    # the worker is still up, and every job's message was acked, even the one acked on the
    # connection that died (nothing left for Redis to redeliver)
    last = wait_for_job(base, post(base, prompt="Bye", max_tokens=4).json()["id"], timeout=180)
    assert last["status"] == "succeeded" and worker.proc.poll() is None
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    unacked = f"{settings.namespace}:broker:unacked_index"
    wait_until(lambda: client.zcard(unacked) == 0, 5, interval=0.1)

    # every job record in the namespace is whole: the fields of its state are all there
    store = create_app(settings).extensions["llmq"].jobs
    job_keys = [k for k in client.scan_iter(f"{settings.namespace}:job:*") if k.count(":") == 2]
    assert len(job_keys) >= 4
    for key in job_keys:
        record = store.get(key.rsplit(":", 1)[1])
        assert {"id", "status", "model", "created_at", "request", "prompt_tokens"} <= set(record)
        assert JobStatus(record["status"]).terminal
        assert record["finish_reason"] and record["finished_at"] >= record["created_at"]


def test_queued_and_running_jobs_survive_a_redis_crash_from_its_append_only_file(outage_stack, start_worker):
    """A one-slot worker runs one job while three wait; Redis is SIGKILLed (not shut down) over a
    second after the last write and restarted on its files: every job is still there and ends."""
    private, _, _, _ = outage_stack
    settings = make_settings(redis_url=f"{private.url}/0", heartbeat_s=1, max_tokens_cap=512)
    worker = start_worker(settings, concurrency=1)
    server = LiveServer(create_app(settings))
    base = server.url
    try:
        running = post(base, prompt="1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", max_tokens=256, temperature=0).json()
        job_url = f"{base}/v1/jobs/{running['id']}"
        wait_until(lambda: requests.get(job_url, timeout=30).json()["status"] == "running", 120, interval=0.1)
        queued = [post(base, prompt=f"Say the word {w}.", max_tokens=8).json() for w in ("red", "blue", "green")]
        assert all(job["status"] == "queued" for job in queued)
        time.sleep(2)  # lets appendfsync everysec put every write (older than a second) on disk
        private.crash()
        time.sleep(1)  # Redis stays away for a second
        private.start()

        for job in queued:  # still there after the crash (the slot may just have freed for one)
            assert requests.get(f"{base}/v1/jobs/{job['id']}", timeout=30).json()["status"] in ("queued", "running")
        for job in [running, *queued]:
            final = wait_for_job(base, job["id"], timeout=240)
            assert final["status"] == "succeeded", final
        final = wait_for_job(base, running["id"])
        assert final["attempts"] == 1  # the worker rode the crash out: no redelivery, no restart
        with requests.get(f"{base}/v1/jobs/{running['id']}/events", stream=True, timeout=30) as stream:
            chunks = [e.json() for e in iter_sse(stream.iter_lines()) if e.event == "chunk"]
        assert "".join(c["text"] for c in chunks) == final["text"]
    finally:
        server.stop()
        worker.stop()
