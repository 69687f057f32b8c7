"""Batch lines yield slots to interactive jobs (common/scheduling/batch_share.py): the room a worker leaves
them, and tickets that wait for room with their slot free, so an interactive job starts at once."""
import collections
import threading
import time

import pytest

from tests.support.scripted_jobs import RUNNER_SETTINGS, make_runner, queue_job
from tests.support.settings import fresh_namespace
from tests.support.waiting import wait_until
from common.scheduling.batch_share import BatchLineShare


class Clock:
    now = 100.0

    def __call__(self):
        return self.now


def test_batch_room_is_capped_only_while_interactive_work_is_about():
    clock = Clock()
    gate = BatchLineShare(slots=8, max_share=0.5, window_s=10, clock=clock)
    assert gate.batch_room() is None  # no interactive job yet: the batch may take every slot
    gate.after_pick(None, "batch")
    gate.after_pick(gate.before_pick(), "batch")
    gate.after_pick(gate.before_pick(), "normal")
    assert gate.batch_room() == 2  # 4 of 8 slots, 2 held
    room = gate.before_pick()
    assert room == 2 and gate.batch_room() == 1  # kept for that pick...
    gate.after_pick(room, None)
    assert gate.batch_room() == 2  # ...and given back: it found nothing
    for priority in ("batch", "batch", "normal"):
        gate.done(priority)
    assert gate.batch_room() == 4  # the interactive job ended just now
    clock.now += 10.5
    assert gate.batch_room() is None  # none for the window: every slot again


def test_the_batch_always_keeps_a_slot_and_a_share_of_one_is_no_cap():
    gate = BatchLineShare(slots=1, max_share=0.5, window_s=10)
    gate.after_pick(None, "high")
    assert gate.batch_room() == 1
    assert BatchLineShare(slots=4, max_share=1, window_s=10).batch_room() is None


@pytest.fixture
def settings():
    with fresh_namespace(**RUNNER_SETTINGS, max_batch_size=4, batch_max_share=0.5,
                         batch_yield_window_s=2) as settings:
        yield settings


def test_while_interactive_jobs_run_batch_lines_hold_half_the_slots_and_a_new_one_starts_at_once(store, settings):
    warm_up = queue_job(store, max_tokens=2)  # an interactive job: the worker has seen one
    lines = [queue_job(store, max_tokens=40, priority="batch") for _ in range(6)]
    scripts = {job: "x" * 40 for job in lines} | {warm_up: "ok"}
    job_runner, runner = make_runner(store, settings, scripts, delay=0.05)
    assert job_runner.run_ticket("t-warm", "default")["status"] == "succeeded"
    runner.scripts = collections.defaultdict(lambda: [ord(c) for c in "hello"], runner.scripts)

    slots = [threading.Thread(target=job_runner.run_ticket, args=(f"t{i}", "default"), daemon=True)
             for i in range(4)]
    for slot in slots:
        slot.start()
    wait_until(lambda: sum(store.get(j)["status"] == "running" for j in lines) == 2, 10)
    time.sleep(0.5)
    running = [j for j in lines if store.get(j)["status"] == "running"]
    assert len(running) == 2  # two tickets wait, slots free

    interactive = queue_job(store, max_tokens=5)  # its script: the runner's default
    wait_until(lambda: store.get(interactive)["status"] == "succeeded", 5)
    record = store.get(interactive)
    # a waiting ticket took it at once: it started while both running lines still ran (each takes
    # 2 s), not in a slot one of them freed by ending
    assert all(record["started_at"] < (store.get(j).get("finished_at") or float("inf")) for j in running)
    assert sum(store.get(j)["status"] == "running" for j in lines) <= 2


def test_with_no_interactive_job_the_batch_takes_every_slot(store, settings):
    lines = [queue_job(store, max_tokens=40, priority="batch") for _ in range(4)]
    job_runner, _ = make_runner(store, settings, {job: "x" * 40 for job in lines}, delay=0.05)
    for i in range(4):
        threading.Thread(target=job_runner.run_ticket, args=(f"t{i}", "default"), daemon=True).start()
    wait_until(lambda: sum(store.get(j)["status"] == "running" for j in lines) == 4, 10)


def test_a_waiting_ticket_goes_back_when_the_worker_stops(store, settings):
    warm_up = queue_job(store, max_tokens=2)
    line = queue_job(store, max_tokens=40, priority="batch")
    job_runner, _ = make_runner(store, settings, {warm_up: "ok", line: "x" * 40}, delay=0.05)
    job_runner.picker.batch_share.batch_slots = 0  # no room at all for the batch while interactive work is about
    job_runner.run_ticket("t-warm", "default")
    result = {}
    waiting = threading.Thread(target=lambda: result.update(job_runner.run_ticket("t1", "default")), daemon=True)
    waiting.start()
    time.sleep(0.3)
    assert waiting.is_alive()  # waiting for room, the line still queued
    job_runner.stop_waiting()
    waiting.join(2)
    assert result["status"] == "requeue" and store.get(line)["status"] == "queued"
