"""The SSE relay sends the chunks it heard on the job's channel without reading them back from
Redis, and reads the log for whatever it did not hear: what came before it followed, a gap in
the chain of entry ids, an event announced without its content. Real Redis; the chunks are
written by the same Lua script a worker uses."""
import json
import threading
import time
import uuid

import pytest
import redis

from api.services import Services
from api.sse import is_later, job_event_stream, stream_id
from api.submit import Followed
from api.wakeups import JobWakeups
from common.schemas import JobStatus
from tests.support.scripted_jobs import queue_job
from tests.support.settings import settings_fixture
from tests.support.waiting import wait_until


# A fresh namespace per test: no listener of another test hears its channels.
settings = settings_fixture(scope="function")


@pytest.fixture
def svc(settings):
    return Services(settings)


def running_job(svc, job_id=None) -> str:
    job = queue_job(svc.jobs, job_id=job_id)
    assert svc.jobs.claim(job, "w1", max_attempts=2) == ("start", 1)
    return job


def count_log_reads(svc) -> list:
    reads, read_events = [], svc.token_log.read_events
    svc.token_log.read_events = lambda *args: reads.append(args) or read_events(*args)
    return reads


class Relay:
    """`job_event_stream` consumed on a thread; `paused` holds it between two events (`held`: the
    one taken from the stream and not yet let through)."""

    def __init__(self, svc, job, last_event_id=None):
        self.events, self.paused, self.held = [], threading.Event(), None
        self.paused.set()
        self._stream = job_event_stream(svc, job, last_event_id)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        for event in self._stream:
            self.held = event
            self.paused.wait()
            self.events.append(event)
            if event[1] == "done":
                return

    def wait_for(self, count, timeout=10):
        """The events sent but heartbeats, once there are `count`."""
        def sent():
            return [e for e in self.events if e[1] != "heartbeat"]
        wait_until(lambda: len(sent()) >= count, timeout, message=lambda: f"{len(sent())} events sent, not {count}")
        return sent()

    def join(self):
        self._thread.join(10)
        assert not self._thread.is_alive()


def wait_until_subscribed(svc):
    """The process's listener has subscribed to the namespace's job channels: from now on what is
    published on them is heard. (Its probe, on a channel no relay watches, wakes nobody.)"""
    wait_until(lambda: svc.redis.publish(svc.keys.channel("probe"), "probe") > 0, 5)


def wait_until_all_heard(svc):
    """The listener has handled everything published so far: messages reach it in order, so once
    a probe published now has woken its watcher, whatever came before it has been heard."""
    with svc.wakeups.watch("probe") as probe:
        probe.clear()
        assert svc.redis.publish(svc.keys.channel("probe"), "probe") > 0
        assert probe.wait(5)


def write_chunks(svc, job, texts, first_index=0):
    for i, text in enumerate(texts, first_index):
        assert svc.token_log.append_chunk(job, 1, {"index": i, "text": text}) == 1


def finish(svc, job):
    svc.jobs.finish(job, JobStatus.SUCCEEDED, attempt=1, finish_reason="stop")
    svc.token_log.publish_done(job)


def test_chunks_heard_on_the_channel_are_relayed_without_reading_the_log(svc):
    job = running_job(svc)
    reads = count_log_reads(svc)
    relay = Relay(svc, job)
    wait_until_subscribed(svc)
    texts = [f"word{i} " for i in range(20)]
    for i, text in enumerate(texts):
        write_chunks(svc, job, [text], i)
        time.sleep(0.01)  # a worker's pace: chunks one by one, not all at once
    assert len(relay.wait_for(20)) == 20
    finish(svc, job)
    relay.join()
    # the first pass (before anything was heard), the listener's wake-up once it has subscribed,
    # and `done` (announced without content); reading back each chunk would be 20 more
    assert len(reads) <= 3, reads
    logged = svc.token_log.read_events(job)
    assert relay.events == logged  # same ids, events and data as the log, in order, once each
    assert [data["text"] for _, event, data in relay.events if event == "chunk"] == texts


def test_a_relay_that_fell_behind_reads_the_gap_from_the_log_and_loses_nothing(svc):
    svc.wakeups = JobWakeups(svc.redis, svc.keys, max_heard=3)
    job = running_job(svc)
    reads = count_log_reads(svc)
    relay = Relay(svc, job)
    wait_until_subscribed(svc)
    write_chunks(svc, job, ["a "])
    relay.wait_for(1)
    relay.paused.clear()  # the client stops reading; the listener keeps only the last 3 heard
    write_chunks(svc, job, ["b "], 1)
    wait_until(lambda: relay.held and relay.held[2].get("text") == "b ")  # taken, not yet sent
    before = len(reads)
    write_chunks(svc, job, [f"{c} " for c in "cdefghij"], 2)
    wait_until_all_heard(svc)  # all 8 heard while the relay waits: it keeps only the last 3
    relay.paused.set()
    relay.wait_for(10)
    finish(svc, job)
    relay.join()
    assert relay.events == svc.token_log.read_events(job)
    assert "".join(data["text"] for _, event, data in relay.events if event == "chunk") == "a b c d e f g h i j "
    assert len(reads) > before  # the entries the listener dropped were read from the log


def relay_until_done(stream, first=(), timeout=10):
    """The relay's events until `done`, or as far as they got in `timeout` seconds (it sends a
    heartbeat at least every second here, so the time is checked)."""
    events, deadline = list(first), time.monotonic() + timeout
    for event in stream:
        events.append(event)
        if event[1] == "done" or time.monotonic() > deadline:
            return events


def test_a_relay_that_watched_before_its_job_existed_does_not_read_its_empty_log(svc):
    """As a request that queues a job and follows it does (api/submit.py, `submit_followed`)."""
    svc.settings.sse_heartbeat_s = 0.1  # the relay's first pass ends at once, in a heartbeat
    job = uuid.uuid4().hex
    with svc.wakeups.watch("another job"):  # the listener is up and subscribed before the job exists
        wait_until_subscribed(svc)
        wait_until_all_heard(svc)  # including its own subscribing, which wakes every relay to read
        reads = count_log_reads(svc)
        with svc.wakeups.watch(job, before_created=True) as woken:
            running_job(svc, job)
            stream = job_event_stream(svc, job, None, places=False, followed=Followed(svc.jobs.get(job), woken))
            first = next(stream)  # its first pass, on the empty log
            write_chunks(svc, job, ["a ", "b "])
            finish(svc, job)
            wait_until_all_heard(svc)  # else a slow listener leaves the relay to find the end itself
            events = relay_until_done(stream, [first])
    assert len(reads) == 1, reads  # for `done`, announced without its content
    assert [e for e in events if e[1] != "heartbeat"] == svc.token_log.read_events(job)


def test_a_relay_that_watched_before_its_job_existed_loses_nothing_logged_before_the_listener_subscribed(
        svc, monkeypatch):
    """The listener starts with the first watch; what is logged before it has subscribed is not
    heard, and its subscribing makes every relay read the log."""
    subscribe, pubsub = threading.Event(), svc.redis.pubsub

    def late_pubsub():
        listener = pubsub()
        psubscribe = listener.psubscribe
        listener.psubscribe = lambda *args: subscribe.wait(10) and psubscribe(*args)
        return listener
    monkeypatch.setattr(svc.redis, "pubsub", late_pubsub)
    job = uuid.uuid4().hex
    with svc.wakeups.watch(job, before_created=True) as woken:
        running_job(svc, job)
        write_chunks(svc, job, ["a ", "b ", "c "])
        finish(svc, job)
        stream = job_event_stream(svc, job, None, places=False, followed=Followed(svc.jobs.get(job), woken))
        first = next(stream)  # nothing heard yet, so nothing read: a heartbeat
        subscribe.set()
        events = relay_until_done(stream, [first])
    assert [e for e in events if e[1] != "heartbeat"] == svc.token_log.read_events(job)


def test_chunks_before_the_relay_followed_and_after_last_event_id_come_from_the_log(svc):
    job = running_job(svc)
    write_chunks(svc, job, ["one ", "two ", "three "])
    first_id = svc.token_log.read_events(job)[0][0]
    relay = Relay(svc, job, last_event_id=first_id)
    assert [data["text"] for _, _, data in relay.wait_for(2)] == ["two ", "three "]
    write_chunks(svc, job, ["four "], 3)
    relay.wait_for(3)
    finish(svc, job)
    relay.join()
    assert relay.events == svc.token_log.read_events(job, first_id)


def test_a_logged_chunk_is_announced_with_its_content_and_the_id_before_it(svc):
    job = running_job(svc)
    pubsub = redis.Redis.from_url(svc.settings.redis_url, decode_responses=True).pubsub()
    pubsub.subscribe(svc.keys.channel(job))
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    write_chunks(svc, job, ["x y", "z"])
    messages = [pubsub.get_message(timeout=5)["data"] for _ in range(2)]
    pubsub.close()
    (id0, _, data0), (id1, _, data1) = svc.token_log.read_events(job)
    assert messages == [f"0 {id0} chunk {json.dumps(data0)}", f"{id0} {id1} chunk {json.dumps(data1)}"]


def test_stream_ids_compare_as_numbers_and_anything_else_is_refused():
    assert is_later("1700000000000-10", "1700000000000-9") and is_later("10-0", "9")
    assert not is_later("5-0", "5") and stream_id("0") == (0, 0)
    for bad in ("", "abc", "-1", "1-", "1-2-3", "1 2"):
        with pytest.raises(ValueError):
            stream_id(bad)
