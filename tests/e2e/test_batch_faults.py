"""Nothing is lost: a batch survives a worker killed with SIGKILL, its control worker killed, the
API restarted and Redis restarted (append-only file on, as production should run it), and ends
with every line accounted for exactly once. Uses a private redis-server; the shared one is never
touched."""
import time

import pytest
import redis
import requests

from api import create_app
from common.batches import line_job_id
from common.keys import Keys
from tests.support.batches import chat_line, create_batch, results, upload, wait_batch
from tests.support.processes import WorkerProcess
from tests.support.processes import PrivateRedis
from tests.support.servers import LiveServer
from tests.support.settings import make_settings
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
LINES = 40


def progress(base, batch_id):
    try:
        counts = requests.get(f"{base}/v1/batches/{batch_id}", timeout=10).json()["request_counts"]
        return counts["completed"] + counts["failed"]
    except (requests.RequestException, ValueError, KeyError):
        return 0


def wait_progress(base, batch_id, at_least, timeout=120):
    wait_until(lambda: progress(base, batch_id) >= at_least, timeout, interval=0.2,
               message=f"batch stuck below {at_least} lines")


def stuck_lines(settings, batch_id):
    """The batch record and the state of the jobs of its pending lines, to say where it stuck."""
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys = Keys(settings.namespace)
    pending = sorted(int(n) for n in client.smembers(keys.batch_part(batch_id, "pending")))
    jobs = {n: client.hmget(keys.job(line_job_id(batch_id, n)), "status", "attempts", "worker")
            for n in pending[:10]}
    return {"batch": client.hgetall(keys.batch(batch_id)), "pending": len(pending), "jobs": jobs,
            "tick": client.get(keys.batch_part(batch_id, "tick"))}


def test_batch_survives_worker_kill_api_restart_and_redis_restart(start_worker, model_ref, tmp_path_factory):
    private = PrivateRedis(tmp_path_factory.mktemp("redis"))
    private.start()
    logs = tmp_path_factory.mktemp("logs")
    settings = make_settings(redis_url=f"{private.url}/0", visibility_timeout_s=4, broker_restore_interval_s=1,
                             heartbeat_s=1, batch_poll_s=0.5)
    worker = start_worker(settings)
    batch_worker = WorkerProcess(settings, "control-1", logs / "control-1.log", module="worker.control")
    server = LiveServer(create_app(settings))
    try:
        lines = [chat_line(f"f{i}", f"Tell me fact number {i} about the sea.", max_tokens=24, cache=False)
                 for i in range(LINES)]
        batch_id = create_batch(server.url, upload(server.url, lines))["id"]
        wait_progress(server.url, batch_id, 3)

        worker.kill()  # SIGKILL with jobs in its batch: they come back after the visibility timeout
        worker = start_worker(settings)
        batch_worker.kill()  # and the batch's own worker, mid-step or between steps
        batch_worker = WorkerProcess(settings, "control-2", logs / "control-2.log", module="worker.control")
        server.stop()  # the API holds no state: a new process carries on
        server = LiveServer(create_app(settings))
        done = progress(server.url, batch_id)
        wait_progress(server.url, batch_id, done + 3)

        private.stop()  # Redis restart: the append-only file keeps jobs, batch and broker messages
        time.sleep(1)  # Redis stays away for a second
        private.start()

        try:
            state = wait_batch(server.url, batch_id, timeout=300)
        except AssertionError as timed_out:
            raise AssertionError(f"batch stuck: {stuck_lines(settings, batch_id)}") from timed_out
        assert state["status"] == "completed", state
        output, errors = results(server.url, state)
        assert sorted(line["custom_id"] for line in output + errors) == sorted(f"f{i}" for i in range(LINES))
        assert state["request_counts"] == {"total": LINES, "completed": len(output), "failed": len(errors)}
        # A lost worker's jobs are redone. A job can still fail on its own (e.g. redelivered too
        # often across the Redis restart: poison_job); then it is an error line, never a lost one.
        assert len(output) >= LINES // 2
        assert all(line["response"]["status_code"] >= 500 for line in errors), errors[:3]
    finally:
        server.stop()
        batch_worker.stop()
        worker.stop()
        private.stop()
