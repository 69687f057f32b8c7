"""Fair share between API keys in the real Redis: the pick order of common/scheduling/fair_queue.py, and the
queue positions the API reports from it (no worker: picks are what a worker's ticket does)."""
import random
import time
import uuid

from common.new_jobs import NewJob
from tests.support.settings import settings_fixture

QUEUE = "q"


# A fresh namespace per test: each starts with an empty queue (the `store` fixture's).
settings = settings_fixture(scope="function")


def queue_job(store, owner, priority="normal", weight=1.0):
    job_id = uuid.uuid4().hex
    store.create(job_id, {"id": job_id, "status": "queued", "model": "m", "queue": QUEUE,
                          "created_at": time.time(), "owner": owner, "priority": priority,
                          "request": {"prompt_token_ids": [1], "sampling": {}}}, queue_limit=0,
                 weight=weight)
    return job_id


def pick(store):
    picked = store.fair.pick(QUEUE, uuid.uuid4().hex)
    return picked[0] if picked else None


def position(store, job_id):
    return store.queue_position(store.get(job_id))


def test_a_key_that_floods_the_queue_does_not_starve_another(store):
    flood = [queue_job(store, "flooder") for _ in range(100)]
    assert [pick(store) for _ in range(10)] == flood[:10]
    single = queue_job(store, "zed")  # sorts after "flooder", so it wins no tie by name
    assert position(store, single) == 0  # nothing is ahead of it: it is next
    assert pick(store) == single
    assert [pick(store) for _ in range(90)] == flood[10:]
    assert pick(store) is None


def test_keys_share_the_queue_by_weight(store):
    heavy = {queue_job(store, "heavy", weight=2) for _ in range(30)}
    light = {queue_job(store, "light") for _ in range(30)}
    first = [pick(store) for _ in range(30)]
    assert 19 <= len(heavy.intersection(first)) <= 21
    assert 9 <= len(light.intersection(first)) <= 11


def test_a_key_cannot_bank_credit_while_idle(store):
    """A key that was away joins at the current virtual time, not at its old low tag."""
    busy = [queue_job(store, "busy") for _ in range(20)]
    away = queue_job(store, "away")
    assert {pick(store), pick(store)} == {busy[0], away}
    for _ in range(10):
        pick(store)
    returning = [queue_job(store, "away") for _ in range(5)]
    order = [pick(store) for _ in range(5)]
    assert sum(job in returning for job in order) == 3  # alternates with busy, no burst of 5


def test_higher_priority_levels_go_first_then_fair_within_a_level(store):
    low = [queue_job(store, "a", "low") for _ in range(3)]
    normal = [queue_job(store, "a") for _ in range(3)] + [queue_job(store, "b")]
    high = queue_job(store, "b", "high")
    order = [pick(store) for _ in range(8)]
    assert order[0] == high
    assert set(order[1:5]) == set(normal) and order[1:5].index(normal[-1]) <= 1
    assert order[5:] == low


def test_reported_positions_are_the_pick_order(store):
    rng = random.Random(7)
    for _ in range(60):
        queue_job(store, rng.choice(["a", "b", "c", "d"]), rng.choice(["high", "normal", "normal", "low"]),
                  weight=rng.choice([1, 1, 2, 3]))
    for _ in range(7):
        pick(store)
    queued = store.r.zrange(store.keys.queued, 0, -1)
    predicted = sorted(queued, key=lambda job: position(store, job))
    assert sorted(position(store, job) for job in queued) == list(range(len(queued)))
    assert [pick(store) for _ in queued] == predicted


def test_positions_of_a_whole_queue_at_once_are_the_pick_order(store):
    """What each waiting stream is told (one read per list for many jobs) is what each job's own
    position says, and the order the jobs are picked in; jobs not queued are left out."""
    rng = random.Random(11)
    for _ in range(80):  # lists of 20 and more: read whole, not job by job
        queue_job(store, rng.choice(["a", "b", "c"]), rng.choice(["high", "normal", "low"]),
                  weight=rng.choice([1, 2]))
    taken = [pick(store) for _ in range(9)]
    queued = store.r.zrange(store.keys.queued, 0, -1)
    lonely = queue_job(store, "d")  # alone in its list: looked up, not read whole
    records = store.get_many([*queued, lonely, *taken])
    positions = store.fair.positions(records)
    assert set(positions) == {*queued, lonely}
    assert positions == {job: position(store, job) for job in [*queued, lonely]}
    predicted = sorted(positions, key=positions.get)
    assert [pick(store) for _ in predicted] == predicted


def test_cancelled_jobs_leave_and_tickets_resume_what_they_took(store):
    first, second, third = (queue_job(store, "a") for _ in range(3))
    assert store.request_cancel(second) == "cancelled"
    assert position(store, third) == 1
    ticket = uuid.uuid4().hex
    assert store.fair.pick(QUEUE, ticket)[:2] == (first, "picked")
    assert store.fair.pick(QUEUE, ticket)[:2] == (first, "resumed")  # a redelivered message: same job
    assert pick(store) == third
    assert pick(store) is None  # the cancelled job's ticket finds nothing to do


def test_a_worker_without_batch_room_leaves_batch_lines_queued_but_takes_interactive_jobs(store):
    from common.scheduling.fair_queue import CAPPED

    line = queue_job(store, "batcher", priority="batch")
    assert store.fair.pick(QUEUE, uuid.uuid4().hex, "w", batch_room=0) == CAPPED
    assert position(store, line) == 0  # still queued, first in line
    urgent = queue_job(store, "someone", priority="low")
    assert store.fair.pick(QUEUE, uuid.uuid4().hex, "w", batch_room=0)[:3] == (urgent, "picked", "low")
    assert store.fair.pick(QUEUE, uuid.uuid4().hex, "w", batch_room=1)[:3] == (line, "picked", "batch")
    assert store.fair.pick(QUEUE, uuid.uuid4().hex, "w", batch_room=0) is None  # nothing waits


def test_the_place_read_when_a_job_is_created_is_its_queue_position(store):
    """Admission reads a new job's place in the same Lua call that creates it: the same number
    `queue_position` computes later, across priorities, keys, weights and picks."""
    rng = random.Random(7)
    for n in range(120):
        job_id = uuid.uuid4().hex
        created = store.create(job_id, {"id": job_id, "status": "queued", "model": "m", "queue": QUEUE,
                                        "created_at": time.time(), "owner": rng.choice([None, "a", "b", "c"]),
                                        "priority": rng.choice(["high", "normal", "low", "batch"])},
                               queue_limit=0, weight=rng.choice([1.0, 2.0]), place=True)
        assert created.ahead == position(store, job_id)
        if n % 5 == 0:
            pick(store)


def test_a_burst_of_jobs_is_created_in_order(store):
    ids = [uuid.uuid4().hex for _ in range(5)]
    created = store.create_many([NewJob(job_id, {"id": job_id, "status": "queued", "model": "m", "queue": QUEUE,
                                                 "created_at": time.time()}) for job_id in ids], queue_limit=0)
    assert [c.record["id"] for c in created] == ids
    assert [pick(store) for _ in ids] == ids
