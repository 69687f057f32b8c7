"""Cancels of running jobs, learnt by the worker's one watcher: one read for every job it holds,
and a job that writes nothing meanwhile (a long prefill, a slow step) still stops at once."""
import threading
import time

from tests.support.scripted_jobs import RUNNER_SETTINGS, make_runner, queue_job
from tests.support.settings import settings_fixture
from tests.support.waiting import wait_until
from worker.cancel_watch import CancelWatch


settings = settings_fixture(scope="function", **RUNNER_SETTINGS)


def test_one_read_looks_at_every_watched_job_and_each_cancel_is_reported_once(store):
    jobs = [queue_job(store) for _ in range(50)]
    watch, fired, reads = CancelWatch(store, interval_s=3600), [], []
    real = store.cancels_requested
    store.cancels_requested = lambda job_ids: reads.append(len(job_ids)) or real(job_ids)
    for job_id in jobs:
        watch.watch(job_id, lambda job_id=job_id: fired.append(job_id))
    watch.forget(jobs[-1])
    store.request_cancel(jobs[3])
    store.request_cancel(jobs[-1])  # no longer watched: its job ended

    watch.look()
    watch.look()
    assert reads == [49, 48] and fired == [jobs[3]]


def test_a_job_that_writes_nothing_meanwhile_stops_after_the_step_under_way(store, settings):
    job = queue_job(store, max_tokens=50)
    job_runner, _ = make_runner(store, settings, {job: "x" * 50}, delay=2)  # each step takes 2 s
    ran = threading.Thread(target=job_runner.run, args=(job,), daemon=True)
    ran.start()
    wait_until(lambda: store.get(job)["status"] == "running", 10)
    asked = time.monotonic()
    store.request_cancel(job)  # during the first step: no write yet to report it
    wait_until(lambda: store.get(job)["status"] == "cancelled", 10)
    assert time.monotonic() - asked < 3.0  # the step under way, not the 50 steps of the job
    assert store.get(job)["completion_tokens"] <= 1
