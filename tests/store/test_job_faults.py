"""Redelivery (continuing from the log, or starting over), fencing, poison jobs, deadlines and
Redis hiccups, driven in-process.

The job runner runs against the real Redis with a scripted engine (no model), so each fault can
be staged exactly: a second delivery, a lapsed lease, a stale attempt writing late, a deadline.
"""
import threading
import time

import pytest
import redis

from api import create_app
from common.schemas import JobStatus
from common.sseclient import iter_sse
from tests.support.scripted_jobs import RUNNER_SETTINGS, events_of, make_runner, queue_job
from tests.support.settings import settings_fixture
from tests.support.waiting import wait_until
from worker.relay_loop import RelayPace


# A fresh namespace per test (the `store` fixture's), with quick heartbeats and cancel polls.
settings = settings_fixture(scope="function", **RUNNER_SETTINGS)


def ids_of(text):
    """The scripted engine's token ids of `text` (one per character: tests.support.fakes)."""
    return [ord(c) for c in text]


def lose_first_attempt(store, job, chunks):
    """Attempt 1 of `job` on w1 logs `chunks` (texts, with their token ids), then w1 dies."""
    assert store.claim(job, "w1", max_attempts=2) == ("start", 1)
    text = ""
    for index, chunk in enumerate(chunks):
        text += chunk
        assert store.token_log.append_chunk(job, 1, {"index": index, "text": chunk}, token_ids=ids_of(chunk),
                                      text=text, completion_tokens=len(text))
    # a second delivery while w1's lease lives is a duplicate and changes nothing
    assert store.claim(job, "w2", max_attempts=2) == ("duplicate", 1)
    store.r.delete(store.keys.lease(job))  # w1 died: its lease lapses


def test_a_redelivered_job_continues_from_its_log_and_the_stale_attempt_is_fenced_off(store, settings):
    job = queue_job(store, max_tokens=10)
    lose_first_attempt(store, job, ["Hel", "lo "])

    job_runner, runner = make_runner(store, settings, {job: "world and more"})  # the rest, as the model says it
    result = job_runner.run(job)

    # the engine got the prompt followed by the tokens generated before, and 10 - 6 tokens to go
    assert runner.prompts[job] == [1, *ids_of("Hello ")]
    record = store.get(job)
    assert result["status"] == "succeeded" and record["status"] == "succeeded"
    assert record["attempts"] == 2 and record["text"] == "Hello worl" and record["finish_reason"] == "length"
    assert record["completion_tokens"] == 10  # usage counts both attempts' tokens
    events = events_of(store, job)
    assert "restart" not in [e for e, _ in events]
    chunks = [d for e, d in events if e == "chunk"]
    assert [c["index"] for c in chunks] == list(range(len(chunks)))  # the numbering carries on
    assert "".join(c["text"] for c in chunks) == record["text"]
    assert events[-1][0] == "done" and events[-1][1]["usage"]["completion_tokens"] == 10
    # the stale attempt wakes up: nothing it writes lands
    assert not store.token_log.append_chunk(job, 1, {"index": 2, "text": "zombie"}, text="Hello zombie")
    assert not store.finish(job, JobStatus.FAILED, attempt=1, finish_reason="error")
    assert store.get(job)["text"] == "Hello worl" and len(events_of(store, job)) == len(events)

    # a fresh SSE replay is one seamless answer
    client = create_app(settings).test_client()
    replay = list(iter_sse(client.get(f"/v1/jobs/{job}/events").get_data(as_text=True).splitlines()))
    assert [e.event for e in replay if e.event != "chunk"] == ["done"]
    assert "".join(e.json()["text"] for e in replay if e.event == "chunk") == "Hello worl"


def test_a_continued_job_keeps_the_logprobs_its_lost_attempt_logged(store, settings):
    job = queue_job(store, max_tokens=8, top_logprobs=0)
    assert store.claim(job, "w1", max_attempts=2) == ("start", 1)
    earlier = [{"token": c, "logprob": -0.25, "bytes": [ord(c)], "top_logprobs": []} for c in "Hi "]
    store.token_log.append_chunk(job, 1, {"index": 0, "text": "Hi ", "logprobs": earlier}, token_ids=ids_of("Hi "),
                           text="Hi ", completion_tokens=3)
    store.r.delete(store.keys.lease(job))  # w1 died

    job_runner, _ = make_runner(store, settings, {job: "there"})
    assert job_runner.run(job)["status"] == "succeeded"
    record = store.get(job)
    assert record["text"] == "Hi there" and record["logprobs"][:3] == earlier
    assert "".join(e["token"] for e in record["logprobs"]) == "Hi there"


def test_a_job_whose_log_was_trimmed_starts_over_with_a_restart_event(store, settings):
    job = queue_job(store)
    lose_first_attempt(store, job, ["lost ", "text "])
    store.r.xtrim(store.keys.events(job), maxlen=1, approximate=False)  # the log's cap dropped the first chunk

    job_runner, runner = make_runner(store, settings, {job: "fresh answer"})
    assert job_runner.run(job)["status"] == "succeeded"

    record = store.get(job)
    assert record["attempts"] == 2 and record["text"] == "fresh answer"
    assert runner.prompts[job] == [1]  # from the start
    events = events_of(store, job)
    cut = [e for e, _ in events].index("restart")
    assert events[cut][1]["attempt"] == 2
    assert events[cut][1]["reason"].startswith("the previous attempt lost its worker, and its answer cannot")
    after = events[cut + 1:]
    assert [d["index"] for e, d in after if e == "chunk"] == list(range(len(after) - 1))
    assert "".join(d["text"] for e, d in after if e == "chunk") == "fresh answer"
    # a fresh SSE replay shows only the new run, announced by its `restart`
    client = create_app(settings).test_client()
    replay = list(iter_sse(client.get(f"/v1/jobs/{job}/events").get_data(as_text=True).splitlines()))
    assert [e.event for e in replay][0] == "restart"
    assert "".join(e.json()["text"] for e in replay if e.event == "chunk") == "fresh answer"


def test_chunks_logged_without_their_token_ids_are_not_continued(store, settings):
    """A log written before chunks kept their token ids (an older worker) cannot say where the
    answer stands in tokens: the job starts over."""
    job = queue_job(store)
    assert store.claim(job, "w1", max_attempts=2) == ("start", 1)
    assert store.token_log.append_chunk(job, 1, {"index": 0, "text": "old "}, text="old ")
    store.r.delete(store.keys.lease(job))
    job_runner, _ = make_runner(store, settings, {job: "new"})
    job_runner.run(job)
    assert store.get(job)["text"] == "new"
    events = [e for e, _ in events_of(store, job)]
    assert events[:2] == ["chunk", "restart"] and events[-1] == "done" and "restart" not in events[2:]


def test_an_answer_generated_whole_before_the_worker_died_only_gets_its_end(store, settings):
    """The lost attempt logged its last chunk (which says the generation ended) but not the end:
    the next attempt ends the job with that text and runs nothing."""
    job = queue_job(store)
    assert store.claim(job, "w1", max_attempts=2) == ("start", 1)
    assert store.token_log.append_chunk(job, 1, {"index": 0, "text": "all of it"}, token_ids=ids_of("all of it") + [0],
                                  ended="stop", text="all of it")
    store.r.delete(store.keys.lease(job))
    job_runner, runner = make_runner(store, settings, {job: "never"})
    assert job_runner.run(job)["status"] == "succeeded"
    record = store.get(job)
    assert (record["text"], record["finish_reason"], record["completion_tokens"]) == ("all of it", "stop", 10)
    assert runner.calls == [] and [e for e, _ in events_of(store, job)] == ["chunk", "done"]


def test_a_duplicate_delivery_waits_for_the_live_owner_and_does_not_run_twice(store, settings):
    job = queue_job(store)
    assert store.claim(job, "w1", max_attempts=2, lease_ttl_s=1) == ("start", 1)
    job_runner, runner = make_runner(store, settings, {job: "never"})
    result = {}
    thread = threading.Thread(target=lambda: result.update(job_runner.run(job)))
    thread.start()
    for _ in range(10):  # w1 stays alive for a second, renewing its lease, then finishes the job
        time.sleep(0.1)  # the behaviour: a second of a live owner holding the job
        assert store.renew_lease(job, 1, "w1", 1)
    assert thread.is_alive()  # still waiting behind the live owner
    assert store.finish(job, JobStatus.SUCCEEDED, attempt=1, finish_reason="stop", text="done by w1")
    thread.join(10)
    assert result == {"job_id": job, "status": "succeeded"}
    assert runner.calls == [] and store.get(job)["attempts"] == 1
    assert not store.renew_lease(job, 1, "w1", 1)  # an ended job's lease is not renewed


def test_a_job_that_keeps_losing_its_worker_is_failed_as_poison(store, settings):
    job = queue_job(store)
    for attempt in (1, 2):  # two deliveries, each worker dies mid-job
        assert store.claim(job, f"w{attempt}", max_attempts=2)[1] == attempt
        store.r.delete(store.keys.lease(job))
    job_runner, runner = make_runner(store, settings, {job: "never"}, name="w3")
    assert job_runner.run(job)["status"] == "failed"
    record = store.get(job)
    assert record["status"] == "failed" and record["error"]["type"] == "poison_job"
    assert "max_attempts=2" in record["error"]["message"] and runner.calls == []
    assert events_of(store, job)[-1][1]["error"]["type"] == "poison_job"


def test_a_job_past_its_run_deadline_stops_with_finish_reason_timeout(store, settings):
    job = queue_job(store, max_tokens=500, run_timeout_s=0.4)
    job_runner, _ = make_runner(store, settings, {job: "x" * 400 + "y"}, delay=0.01)
    started = time.monotonic()
    job_runner.run(job)
    record = store.get(job)
    assert record["status"] == "expired" and record["finish_reason"] == "timeout"
    assert record["error"]["type"] == "run_timeout"
    assert 0 < len(record["text"]) < 400 and set(record["text"]) == {"x"}  # partial text kept
    assert time.monotonic() - started < 10
    assert events_of(store, job)[-1][1]["finish_reason"] == "timeout"


def test_a_cancel_is_learnt_from_the_chunk_writes_themselves(store, settings):
    """While tokens flow, each chunk write reports a pending cancel: the job stops within a few
    steps although the runner's own cancel poll (`cancel_poll_s`) is set far beyond the test."""
    settings = settings.model_copy(update={"cancel_poll_s": 60})
    job = queue_job(store, max_tokens=400)
    job_runner, _ = make_runner(store, settings, {job: "x" * 400}, delay=0.01)
    polls = []
    job_runner.store.cancels_requested = lambda job_ids: polls.append(job_ids) or []
    ran = threading.Thread(target=job_runner.run, args=(job,))
    ran.start()
    wait_until(lambda: store.token_log.chunks_written(job) >= 5, 10)
    assert store.request_cancel(job) == "cancelling"
    ran.join(timeout=10)
    record = store.get(job)
    assert not ran.is_alive() and record["status"] == "cancelled" and not polls
    assert 5 <= record["completion_tokens"] < 400 and record["text"] == "x" * len(record["text"])


def test_the_worker_refuses_a_job_that_waited_past_its_queue_deadline(store, settings):
    job = queue_job(store, queue_deadline=time.time() - 1)
    job_runner, runner = make_runner(store, settings, {job: "never"})
    assert job_runner.run(job)["status"] == "expired"
    record = store.get(job)
    assert record["status"] == "expired" and record["finish_reason"] == "timeout"
    assert record["error"]["type"] == "queue_timeout" and record.get("attempts", 0) == 0
    assert runner.calls == [] and store.queue_depth() == 0
    assert events_of(store, job)[-1][0] == "done"


def test_redis_write_failures_are_buffered_and_nothing_is_lost(store, settings, monkeypatch):
    job = queue_job(store)
    real_append, failures = store.token_log.append_chunks, {"left": 5}

    def flaky_append(chunks):
        if failures["left"] > 0:
            failures["left"] -= 1
            raise redis.ConnectionError("Redis is restarting")
        return real_append(chunks)

    monkeypatch.setattr(store.token_log, "append_chunks", flaky_append)
    job_runner, _ = make_runner(store, settings, {job: "all of this text arrives"}, delay=0.01)
    job_runner.run(job)
    assert_whole_answer(store, job, "all of this text arrives")


def assert_whole_answer(store, job, text):
    """The job succeeded with `text`, and its log holds that text once, in numbered chunks."""
    record = store.get(job)
    assert record["status"] == "succeeded" and record["text"] == text
    chunks = [d for e, d in events_of(store, job) if e == "chunk"]
    assert "".join(c["text"] for c in chunks) == text
    assert [c["index"] for c in chunks] == list(range(len(chunks)))


def test_a_chunk_whose_reply_was_lost_is_neither_doubled_nor_dropped(store, settings, monkeypatch):
    """Redis ran the append and went down before replying: the runner sees an error, but the
    chunk is in the log. The next write must continue after it, not repeat it."""
    job = queue_job(store)
    real_append, lost = store.token_log.append_chunks, {"left": 3}

    def append_then_lose_reply(chunks):
        result = real_append(chunks)
        if lost["left"] > 0:
            lost["left"] -= 1
            raise redis.ConnectionError("Connection closed by server")
        return result

    monkeypatch.setattr(store.token_log, "append_chunks", append_then_lose_reply)
    job_runner, _ = make_runner(store, settings, {job: "every word exactly once"}, delay=0.01)
    job_runner.run(job)
    assert_whole_answer(store, job, "every word exactly once")


def test_logprobs_go_with_their_text_through_lost_replies_and_failed_writes(store, settings, monkeypatch):
    """Each token's logprobs entry is logged once, in the chunk that carries its text, however
    the writes fail; the record keeps them all."""
    job = queue_job(store, top_logprobs=2)
    real_append, faults = store.token_log.append_chunks, ["lose", "fail", "lose", "fail"]

    def faulty_append(chunks):
        fault = faults.pop(0) if faults else None
        if fault == "fail":
            raise redis.ConnectionError("Redis is restarting")
        result = real_append(chunks)
        if fault == "lose":
            raise redis.ConnectionError("Connection closed by server")
        return result

    monkeypatch.setattr(store.token_log, "append_chunks", faulty_append)
    job_runner, _ = make_runner(store, settings, {job: "each token once"}, delay=0.01)
    job_runner.run(job)
    assert_whole_answer(store, job, "each token once")
    entries = store.get(job)["logprobs"]
    assert "".join(e["token"] for e in entries) == "each token once"
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in entries)
    chunks = [d for e, d in events_of(store, job) if e == "chunk"]
    assert all("".join(e["token"] for e in c["logprobs"]) == c["text"] for c in chunks)


def test_text_is_relayed_once_per_stream_interval_and_the_first_token_at_once(store, settings):
    """60 decode steps of 10 ms: with a 200 ms interval their text reaches the log in a handful of
    chunks, the first token alone; with no interval every step is a chunk of its own."""
    text = "abcdefghij" * 6
    chunk_counts = {}
    for interval_ms in (200, 0):
        job = queue_job(store, max_tokens=100)
        job_runner, _ = make_runner(store, settings.model_copy(update={"stream_interval_ms": interval_ms}),
                                    {job: text}, delay=0.01)
        job_runner.run(job)
        assert_whole_answer(store, job, text)
        chunks = [d["text"] for e, d in events_of(store, job) if e == "chunk"]
        assert chunks[0] in ("a", "ab")  # not held back for the interval
        chunk_counts[interval_ms] = len(chunks)
    assert 3 <= chunk_counts[200] <= 7
    assert chunk_counts[0] >= 30


def test_a_worker_holding_many_jobs_relays_each_less_often():
    """Each job writes every `stream_interval_ms` until the worker's jobs together would write more
    than `stream_writes_per_s` times a second; then each waits longer, up to 1 s."""
    running = [1]
    pace = RelayPace(0.1, 100, lambda: running[0])
    assert pace.interval_s() == 0.1
    running[0] = 32
    assert pace.interval_s() == pytest.approx(0.32)
    running[0] = 256
    assert pace.interval_s() == 1.0
    assert RelayPace(0.1, 0, lambda: 256).interval_s() == 0.1  # 0: no limit


def test_the_writes_limit_slows_each_jobs_relay(store, settings):
    """The runner paces its relays by how many jobs its engine holds: one job, allowed 2.5 writes a
    second, writes every 0.4 s instead of every 50 ms."""
    text = "abcdefghij" * 6
    chunk_counts = {}
    for writes_per_s in (2.5, 0):
        job = queue_job(store, max_tokens=100)
        paced = settings.model_copy(update={"stream_interval_ms": 50, "stream_writes_per_s": writes_per_s})
        job_runner, _ = make_runner(store, paced, {job: text}, delay=0.01)
        job_runner.run(job)
        assert_whole_answer(store, job, text)
        chunk_counts[writes_per_s] = len([d for e, d in events_of(store, job) if e == "chunk"])
    assert chunk_counts[2.5] * 2 < chunk_counts[0], chunk_counts


def test_a_worker_writes_all_its_jobs_text_together_once_a_tick(store, settings, monkeypatch):
    """Eight jobs decoding side by side: one thread writes their text, in one round trip a tick
    carrying a chunk of each, instead of a write per job; each answer still arrives whole."""
    jobs = [queue_job(store, max_tokens=100) for _ in range(8)]
    text = "abcdefghij" * 5
    real_append, batches, writers = store.token_log.append_chunks, [], set()

    def counted_append(chunks):
        batches.append(len(chunks))
        writers.add(threading.get_ident())
        return real_append(chunks)

    monkeypatch.setattr(store.token_log, "append_chunks", counted_append)
    paced = settings.model_copy(update={"stream_interval_ms": 100, "stream_writes_per_s": 0})
    job_runner, _ = make_runner(store, paced, {job: text for job in jobs}, delay=0.01)
    threads = [threading.Thread(target=job_runner.run, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    for job in jobs:
        assert_whole_answer(store, job, text)
    assert max(batches) >= 6, batches  # the ticks carry (nearly) every job's chunk
    assert len(batches) * 2 < sum(batches), batches
    assert len(writers) == 1  # one thread wrote them all
