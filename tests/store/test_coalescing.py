"""Coalescing (common/coalescing.py) in the real Redis, driven in-process: the job runner runs a
scripted engine, so attach, cancel and promotion can be staged at exact moments."""
import threading
import time
import uuid

from common.schemas import JobStatus
from tests.support.scripted_jobs import RUNNER_SETTINGS, events_of, make_runner
from tests.support.settings import settings_fixture
from tests.support.waiting import wait_until

QUEUE = "q"
DIGEST = "d" * 64
ANSWER = "the same answer for everyone"


# A fresh namespace per test (the `store` fixture's), with quick heartbeats and cancel polls.
settings = settings_fixture(scope="function", **RUNNER_SETTINGS)


def new_fields(owner=None):
    job_id = uuid.uuid4().hex
    sampling = {"max_tokens": 64, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None, "stop": []}
    return job_id, {"id": job_id, "status": "queued", "model": "m", "queue": QUEUE, "owner": owner,
                    "created_at": time.time(), "prompt_tokens": 1, "cache_key": DIGEST,
                    "request": {"prompt_token_ids": [1], "sampling": sampling}}


def primary(store):
    job_id, fields = new_fields()
    assert store.create(job_id, fields, queue_limit=0, digest=DIGEST)
    return job_id


def follower(store, expect_primary):
    job_id, fields = new_fields()
    assert store.attach(job_id, fields, DIGEST) == expect_primary
    return job_id


def text_of(store, job_id):
    return "".join(d["text"] for e, d in events_of(store, job_id) if e == "chunk")


def done_of(store, job_id):
    events = events_of(store, job_id)
    assert [e for e, _ in events].count("done") == 1
    return events[-1][1] if events[-1][0] == "done" else None


def run_in_thread(job_runner):
    result = {}

    def work():
        result.update(job_runner.run_ticket(uuid.uuid4().hex, QUEUE))
    thread = threading.Thread(target=work)
    thread.start()
    return thread, result


def test_identical_requests_share_one_generation(store, settings):
    first = primary(store)
    second = follower(store, first)
    assert store.queue_position(store.get(second)) == 0  # it waits where its primary waits
    job_runner, engine = make_runner(store, settings, {first: ANSWER})
    assert job_runner.run_ticket(uuid.uuid4().hex, QUEUE)["status"] == "succeeded"
    assert [rid for _, ids in engine.calls for rid in ids if rid != first] == []  # generated once
    for job in (first, second):
        record = store.get(job)
        assert record["status"] == "succeeded" and record["text"] == ANSWER
        assert text_of(store, job) == ANSWER and done_of(store, job)["status"] == "succeeded"
    assert store.get(second)["coalesced_into"] == first
    assert store.counters.read()["coalesced"] == 1
    assert store.attach(uuid.uuid4().hex, new_fields()[1], DIGEST) is None  # it ended: nothing to join


def test_a_follower_that_joins_mid_generation_gets_the_tokens_so_far(store, settings):
    first = primary(store)
    job_runner, _ = make_runner(store, settings, {first: ANSWER}, delay=0.05)
    thread, _ = run_in_thread(job_runner)
    wait_until(lambda: len(store.get(first).get("text", "")) >= 5)
    late = follower(store, first)
    assert store.get(late)["status"] == "running"
    thread.join(30)
    assert text_of(store, late) == ANSWER == store.get(late)["text"]
    chunks = [d["index"] for e, d in events_of(store, late) if e == "chunk"]
    assert chunks == list(range(len(chunks)))


def test_cancelling_a_follower_detaches_it_and_the_generation_goes_on(store, settings):
    first = primary(store)
    second = follower(store, first)
    assert store.request_cancel(second) == "cancelled"
    store.token_log.publish_done(second)
    job_runner, _ = make_runner(store, settings, {first: ANSWER})
    job_runner.run_ticket(uuid.uuid4().hex, QUEUE)
    assert store.get(first)["status"] == "succeeded" and store.get(second)["status"] == "cancelled"
    assert done_of(store, second)["status"] == "cancelled" and text_of(store, second) == ""


def test_a_running_primary_cancelled_by_its_client_keeps_generating_for_its_followers(store, settings):
    first = primary(store)
    second = follower(store, first)
    job_runner, _ = make_runner(store, settings, {first: ANSWER}, delay=0.05)
    thread, _ = run_in_thread(job_runner)
    wait_until(lambda: len(store.get(first).get("text", "")) >= 3)
    assert store.request_cancel(first) == "cancelled"  # its own client is done with it at once
    store.token_log.publish_done(first)
    thread.join(30)
    assert store.get(first)["status"] == "cancelled" and done_of(store, first)["status"] == "cancelled"
    assert store.get(second)["status"] == "succeeded" and text_of(store, second) == ANSWER
    assert done_of(store, second)["status"] == "succeeded"


def test_when_the_last_rider_leaves_a_detached_generation_stops(store, settings):
    first = primary(store)
    second = follower(store, first)
    job_runner, _ = make_runner(store, settings, {first: ANSWER * 20}, delay=0.05)
    thread, _ = run_in_thread(job_runner)
    wait_until(lambda: len(store.get(first).get("text", "")) >= 3)
    assert store.request_cancel(first) == "cancelled"
    assert store.request_cancel(second) == "cancelled"
    started = time.monotonic()
    thread.join(30)
    assert time.monotonic() - started < 5  # stopped, not run to the end (~28 s of steps)
    assert store.get(second)["status"] == "cancelled" and store.get(first)["cancel_requested"]


def test_a_queued_primary_cancelled_hands_its_place_to_a_follower(store, settings):
    ahead = primary(store)  # another job, first in the queue (it stops being the one to join)
    store.r.delete(store.keys.inflight(DIGEST))
    first = primary(store)
    second = follower(store, first)
    third = follower(store, first)
    assert store.queue_position(store.get(second)) == 1
    assert store.request_cancel(first) == "cancelled"
    assert store.get(second).get("coalesced_into") is None  # promoted: now the primary
    assert store.get(third)["coalesced_into"] == second
    assert store.queue_position(store.get(second)) == 1  # same place in the queue
    job_runner, _ = make_runner(store, settings, {ahead: "x", second: ANSWER})
    assert job_runner.run_ticket(uuid.uuid4().hex, QUEUE)["job_id"] == ahead
    assert job_runner.run_ticket(uuid.uuid4().hex, QUEUE)["job_id"] == second
    assert job_runner.run_ticket(uuid.uuid4().hex, QUEUE)["status"] == "idle"  # first's ticket
    for job in (second, third):
        assert store.get(job)["status"] == "succeeded" and text_of(store, job) == ANSWER
    assert store.get(first)["status"] == "cancelled"


def test_followers_share_the_primarys_end_whatever_it_is(store, settings):
    first = primary(store)
    second = follower(store, first)
    assert store.finish(first, JobStatus.FAILED, finish_reason="error", error={"type": "x", "message": "y"}) \
        == [first, second]
    assert store.get(second)["status"] == "failed" and store.get(second)["error"]["type"] == "x"


def lose_first_attempt(store, job_id, text):
    """Attempt 1 of `job_id` on w1 logs `text` (with its token ids) to it and its followers; w1 dies."""
    assert store.claim(job_id, "w1", max_attempts=2) == ("start", 1)
    assert store.token_log.append_chunk(job_id, 1, {"index": 0, "text": text}, token_ids=[ord(c) for c in text],
                                  text=text)
    store.r.delete(store.keys.lease(job_id))  # w1 died: its lease lapses


def test_followers_ride_on_into_the_continuation_of_a_lost_workers_job(store, settings):
    first = primary(store)
    second = follower(store, first)
    lose_first_attempt(store, first, ANSWER[:8])
    job_runner, _ = make_runner(store, settings, {first: ANSWER[8:]})
    assert job_runner.run(first)["status"] == "succeeded"
    for job in (first, second):
        assert store.get(job)["text"] == ANSWER == text_of(store, job)
        events = events_of(store, job)
        assert "restart" not in [e for e, _ in events]
        chunks = [d["index"] for e, d in events if e == "chunk"]
        assert chunks == list(range(len(chunks)))


def test_a_carriers_lost_generation_starts_over_for_its_followers(store, settings):
    """A primary whose own client left carries on for its followers, but its own log stopped
    then: the next attempt cannot read the answer from it, so the followers get a `restart`."""
    first = primary(store)
    second = follower(store, first)
    lose_first_attempt(store, first, "lost ")
    assert store.request_cancel(first) == "cancelled"  # a carrier now
    job_runner, _ = make_runner(store, settings, {first: ANSWER})
    job_runner.run(first)
    assert store.get(second)["status"] == "succeeded" and store.get(second)["text"] == ANSWER
    events = events_of(store, second)
    cut = [e for e, _ in events].index("restart")
    assert "its own client left" in events[cut][1]["reason"]
    assert "".join(d["text"] for e, d in events[cut:] if e == "chunk") == ANSWER
    assert store.get(first)["status"] == "cancelled"
