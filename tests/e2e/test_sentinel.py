"""Every Redis client llmq makes follows a Sentinel-managed master: redis-py clients and the Celery
broker skip a first sentinel that is down and move to the new master after a switch, including
off a demoted master that still answers (READONLY), and so does a worker's Celery consumer; Flower
reads the queues through the sentinels.
(The failover under a running stack is `tests/e2e/test_failover.py`.)"""
import subprocess
import sys

import pytest
import redis
import requests

from api import create_app
from common.celery_app import make_celery
from common.keys import Keys
from common.redis_client import broker_url, redis_client, sentinel_addresses
from tests.support import ROOT
from tests.support.ports import free_port, redis_port
from tests.support.redis_group import MASTER_NAME, RedisGroup
from tests.support.settings import make_settings, settings_env
from tests.support.waiting import wait_until


def test_sentinel_setting_parses_to_addresses_and_broker_urls():
    settings = make_settings(redis_url="redis://:s3cret@ignored:1/4",
                             redis_sentinels="10.0.0.1:26379, sentinel-b ,10.0.0.3:26400")
    assert sentinel_addresses(settings) == [("10.0.0.1", 26379), ("sentinel-b", 26379), ("10.0.0.3", 26400)]
    assert broker_url(settings) == ("sentinel://:s3cret@10.0.0.1:26379/4;sentinel://:s3cret@sentinel-b:26379/4;"
                                    "sentinel://:s3cret@10.0.0.3:26400/4")
    assert broker_url(make_settings()) == make_settings().redis_url  # no sentinels: the plain URL


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    group = RedisGroup(tmp_path_factory.mktemp("ha"), redis_port)
    group.start()
    yield group
    group.stop()


@pytest.mark.slow
def test_clients_skip_a_dead_first_sentinel_and_leave_a_demoted_master(group):
    nobody = free_port()  # the first sentinel listed is down
    settings = make_settings(redis_url="redis://unused:0/0",
                             redis_sentinels=f"127.0.0.1:{nobody},{group.sentinels_setting}")
    client = redis_client(settings, decode_responses=True)
    celery = make_celery(settings)
    queue = f"{settings.namespace}.q"
    client.set(f"{settings.namespace}:k", "before")
    celery.send_task("llmq.noop", queue=queue)

    # replication is asynchronous, and a switch loses what the replica has not copied yet: this test
    # is about the clients, so the writes above are on the replica first (it acknowledges each second)
    wait_until(lambda: group.replication_lag_bytes() == 0, 10, interval=0.1)
    old = group.master_port()  # a switch that leaves the old master up, as a replica
    redis.Redis(port=group.live_sentinels()[0]).execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
    new = group.wait_failover(old)
    wait_until(lambda: redis.Redis(port=old).info("replication")["role"] == "slave", 20, interval=0.1)
    with pytest.raises(redis.ReadOnlyError):
        redis.Redis(port=old).set("x", "1")  # what a connection left on it gets for a write

    client.set(f"{settings.namespace}:k", "after")  # the pooled connection to the old master: READONLY, retried
    celery.send_task("llmq.noop", queue=queue)
    on_new = redis.Redis(port=new, decode_responses=True)
    assert on_new.get(f"{settings.namespace}:k") == "after"
    assert sum(on_new.llen(key) for key in Keys(settings.namespace).broker_lists(queue)) == 2


@pytest.mark.slow
def test_flower_reads_queues_through_the_sentinels(group, tmp_path):
    settings = make_settings(redis_url="redis://unused:0/0", redis_sentinels=group.sentinels_setting)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "common.celery_app", "flower",
                             f"--port={port}", "--address=127.0.0.1"], cwd=ROOT,
                            env=settings_env(settings) | {"FLOWER_UNAUTHENTICATED_API": "true"},
                            stdout=open(tmp_path / "flower.log", "w"), stderr=subprocess.STDOUT)
    try:
        def answered():
            resp = requests.get(f"http://127.0.0.1:{port}/api/queues/length", timeout=5)
            return resp.status_code == 200 and resp
        resp = wait_until(answered, 60, interval=0.5, ignoring=(requests.RequestException,),
                          message=lambda: (tmp_path / "flower.log").read_text()[-3000:])
        assert "active_queues" in resp.json()
    finally:  # as `docker stop` does: a grace period, then a kill (Flower's shutdown may wait on a
        proc.terminate()  # broker reconnect of its own, which is not what this test is about)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _consumer_met_readonly(log_path) -> bool:
    """Whether the worker's Celery consumer was refused by a demoted master: redis-py's Sentinel
    connection turns READONLY into this connection error, which the consumer logs."""
    return any("consumer" in line and "The previous master is now a slave" in line
               for line in log_path.read_text().splitlines())


def _submit(client, body: dict, timeout: float = 60) -> str:
    """The id of a job accepted by the API, submitting through 503s (no master known yet)."""
    def accepted() -> str | None:
        resp = client.post("/v1/jobs", json={"cache": False, "max_tokens": 4, **body})
        assert resp.status_code in (202, 503), resp.get_data(as_text=True)
        return resp.get_json()["id"] if resp.status_code == 202 else None
    return wait_until(accepted, timeout, interval=0.2, message="the API kept answering 503")


def _ended(client, job_id: str, timeout: float = 120) -> dict:
    def ended() -> dict | None:
        resp = client.get(f"/v1/jobs/{job_id}")
        assert resp.status_code in (200, 503), resp.get_data(as_text=True)
        return resp.get_json() if resp.status_code == 200 and resp.get_json()["status"] not in ("queued", "running") \
            else None
    return wait_until(ended, timeout, interval=0.2, message=f"job {job_id} did not end")


@pytest.mark.slow
def test_worker_consumer_leaves_a_demoted_master_that_answers_readonly(tmp_path, start_worker):
    """The master is demoted by hand (`REPLICAOF`, as an operator or a healed partition does): it
    stays up, and no sentinel kills the worker's connections to it, so the consumer's next
    command there is refused with READONLY. It keeps reconnecting, without the worker exiting,
    until the sentinels name the new master; the same worker process then consumes from the new
    master and runs the next job."""
    group = RedisGroup(tmp_path / "ha", redis_port)
    group.start()
    settings = make_settings(redis_url="redis://unused:0/0", redis_sentinels=group.sentinels_setting,
                             heartbeat_s=1, visibility_timeout_s=10, broker_restore_interval_s=1)
    worker = start_worker(settings)
    client = create_app(settings).test_client()
    try:
        assert _ended(client, _submit(client, {"prompt": "Say yes."}))["status"] == "succeeded"

        old = group.master_port()
        (new,) = [port for port in group.servers if port != old]
        assert not _consumer_met_readonly(worker.log_path)
        redis.Redis(port=new).execute_command("REPLICAOF", "NO", "ONE")
        redis.Redis(port=old).execute_command("REPLICAOF", "127.0.0.1", str(new))
        with pytest.raises(redis.ReadOnlyError):
            redis.Redis(port=old).set("x", "1")
        def met_readonly() -> bool:
            assert worker.proc.poll() is None, worker.log_path.read_text()[-3000:]
            return _consumer_met_readonly(worker.log_path)
        # the sentinels still name the old master (for ~25 s)
        wait_until(met_readonly, 20, interval=0.1, message="the worker's consumer never met READONLY")

        try:  # the sentinels would find the master demoted on their own, ~25 s later
            redis.Redis(port=group.live_sentinels()[0]).execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
        except redis.ResponseError as exc:
            assert "INPROG" in str(exc)  # they already are at it
        assert group.wait_failover(old) == new
        job = _ended(client, _submit(client, {"prompt": "Say no."}))
        assert job["status"] == "succeeded", job
        assert worker.proc.poll() is None, worker.log_path.read_text()[-3000:]  # the same process
    finally:
        worker.stop()
        group.stop()
