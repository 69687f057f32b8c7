"""Batch lines yield slots to interactive jobs on a real worker: while interactive jobs are about,
a batch holds at most its share of the worker's slots, an interactive job starts at once in a slot
left free, and a worker stopped while tickets wait for batch room hands them back, so the batch
still completes on the next worker."""
import signal
import time

import pytest

from api import create_app
from common.batches import line_job_id
from tests.support.batches import chat_line, create_batch, upload, wait_batch
from tests.support.jobs import submit
from tests.support.servers import LiveServer
from tests.support.settings import fresh_namespace
from tests.support.waiting import wait_for_job

pytestmark = pytest.mark.slow
SLOTS = 2


@pytest.fixture(scope="module")
def stack(start_worker, start_control_worker):
    with fresh_namespace(max_batch_size=SLOTS, batch_max_share=0.5, batch_yield_window_s=120,
                         batch_poll_s=0.2) as settings:
        app = create_app(settings)
        server = LiveServer(app)
        start_control_worker(settings)
        yield settings, app.extensions["llmq"], server.url
        server.stop()


def batch_lines_held(svc) -> int:
    held = svc.redis.hkeys(svc.keys.held)  # job id -> the worker that holds it
    return sum((svc.jobs.get(job_id) or {}).get("priority") == "batch" for job_id in held)


def test_batch_holds_its_share_while_interactive_jobs_run_and_a_stop_hands_waiting_tickets_back(stack, start_worker):
    settings, svc, url = stack
    worker = start_worker(settings)
    first = submit(url, prompt="Say hi.", max_tokens=4, cache=False)
    wait_for_job(url, first["id"], timeout=60)  # the worker has seen interactive work

    lines = [chat_line(f"line-{i}", f"Write a long story about the number {i}.", max_tokens=64)
             for i in range(6)]
    batch = create_batch(url, upload(url, lines))
    deadline = time.monotonic() + 60
    while batch_lines_held(svc) == 0:
        assert time.monotonic() < deadline, "the batch did not start"
        time.sleep(0.1)
    samples = []
    for _ in range(20):
        samples.append(batch_lines_held(svc))
        time.sleep(0.1)
    assert max(samples) == SLOTS // 2, samples  # the other slot waits free

    urgent = submit(url, prompt="Quick: name a colour.", max_tokens=8, cache=False)
    done = wait_for_job(url, urgent["id"], timeout=60)
    assert done["started_at"] - done["created_at"] < 1.0, done  # no wait for a batch line to end

    worker.stop(signal.SIGTERM, timeout=60)
    assert worker.proc.returncode == 0  # it did not hang on the ticket waiting for batch room
    start_worker(settings.model_copy(update={"batch_max_share": 1.0}))
    state = wait_batch(url, batch["id"], timeout=300)
    assert state["status"] == "completed" and state["request_counts"]["completed"] == len(lines), state


def test_interactive_work_after_a_quiet_spell_preempts_a_batch_line_which_starts_over(start_worker,
                                                                                        start_control_worker):
    """No interactive job for the window: the batch holds every slot. The first interactive job
    then takes a preempted line's slot at once; the line starts over and the batch completes."""
    with fresh_namespace(max_batch_size=SLOTS, batch_max_share=0.5, batch_yield_window_s=0.5,
                         batch_poll_s=0.2) as settings:
        app = create_app(settings)
        svc, server = app.extensions["llmq"], LiveServer(app)
        try:
            start_control_worker(settings)
            start_worker(settings)
            lines = [chat_line(f"line-{i}", f"Write a long story about the number {i}.", max_tokens=200)
                     for i in range(4)]
            batch = create_batch(server.url, upload(server.url, lines))
            deadline = time.monotonic() + 60
            while batch_lines_held(svc) < SLOTS:
                assert time.monotonic() < deadline, "the batch did not take every slot"
                time.sleep(0.05)

            urgent = submit(server.url, prompt="Quick: name a colour.", max_tokens=8, cache=False)
            done = wait_for_job(server.url, urgent["id"], timeout=60)
            assert done["status"] == "succeeded"
            assert done["started_at"] - done["created_at"] < 1.5, done  # not after a 200-token line

            state = wait_batch(server.url, batch["id"], timeout=300)
            assert state["status"] == "completed" and state["request_counts"]["completed"] == len(lines), state
            records = [svc.jobs.get(line_job_id(batch["id"], n)) for n in range(1, len(lines) + 1)]
            assert sum(int(r.get("preemptions") or 0) for r in records) >= 1
            assert all(r["status"] == "succeeded" for r in records)
        finally:
            server.stop()
