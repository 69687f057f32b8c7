"""Batch lines preempted for interactive work, driven in-process (worker/job_runner.py,
common/lua/job_requeue.lua): while interactive jobs wait and batch lines hold more than their share
of a worker's slots, the lines beyond the share that started last stop and go back to the head of
the batch's queue, to start over; a preemption never counts as a lost worker."""
import threading
import uuid

from tests.support.scripted_jobs import RUNNER_SETTINGS, events_of, make_runner, queue_job
from tests.support.settings import settings_fixture
from tests.support.waiting import wait_until

QUEUE = "q"


settings = settings_fixture(scope="function", **RUNNER_SETTINGS, max_batch_size=2, batch_max_share=0.5)


def test_the_line_beyond_the_share_that_started_last_starts_over_after_the_interactive_job(store, settings):
    older, younger = (queue_job(store, queue=QUEUE, priority="batch") for _ in range(2))
    runner, _ = make_runner(store, settings, {older: "o" * 400, younger: "y" * 400}, delay=0.02)
    tickets = []
    runner.picker.send_ticket = tickets.append
    results = {}

    def run(name):
        results[name] = runner.run_ticket(uuid.uuid4().hex, QUEUE)
    threads = [threading.Thread(target=run, args=(name,)) for name in ("first", "second")]
    threads[0].start()
    wait_until(lambda: (store.get(older) or {}).get("status") == "running", timeout=10)
    threads[1].start()
    wait_until(lambda: (store.get(younger) or {}).get("text"), timeout=10)  # both lines run

    urgent = queue_job(store, queue=QUEUE, priority="normal")
    threads[1].join(timeout=10)
    assert results["second"] == {"job_id": younger, "status": "preempted"}
    record = store.get(younger)
    assert (record["status"], record["text"], record["preemptions"]) == ("queued", "", "1")
    assert tickets == [None]  # a spare ticket for the model's queue, for the line to start over
    assert store.r.hget(store.keys.held, younger) is None
    assert ("restart", {"attempt": 1, "reason": "preempted by interactive work"}) in events_of(store, younger)
    assert store.get(older)["status"] == "running"  # the line within the share runs on

    assert store.fair.pick(QUEUE, uuid.uuid4().hex).job_id == urgent  # interactive first
    assert store.fair.pick(QUEUE, uuid.uuid4().hex).job_id == younger  # then the line, at the head
    runner.stop_waiting()
    threads[0].join(timeout=30)


def test_a_preemption_is_not_an_attempt_and_only_the_holding_attempt_can_requeue(store):
    job = queue_job(store, queue=QUEUE, priority="batch")
    store.fair.pick(QUEUE, uuid.uuid4().hex, "w1")
    assert store.claim(job, "w1", max_attempts=1) == ("start", 1)
    assert not store.requeue(job, 2, "w1")  # another attempt's
    assert not store.requeue(job, 1, "w2")  # another worker's
    assert store.requeue(job, 1, "w1")
    assert not store.requeue(job, 1, "w1")  # queued now: nothing to requeue
    store.fair.pick(QUEUE, uuid.uuid4().hex, "w2")
    assert store.claim(job, "w2", max_attempts=1) == ("start", 2)  # not poisoned by the preemption


def test_interactive_waiting_counts_jobs_of_every_key_above_the_batch_level(store):
    for owner in ("a", "a", "a", "b"):
        queue_job(store, queue=QUEUE, priority="normal", owner=owner)
    queue_job(store, queue=QUEUE, priority="high")
    queue_job(store, queue=QUEUE, priority="batch")
    queue_job(store, queue="another-model", priority="normal")
    assert store.fair.interactive_waiting(QUEUE) == 5
