"""Prefix affinity in the real Redis (common/scheduling/prefix_affinity.py, common/lua/fair_pick.lua): a job
is left for a worker that served its prompt's start while that worker has a free slot, for at most
the affinity wait; a worker with room takes it when every holder is full, and becomes a holder too;
job order (priorities, fair shares) never changes."""
import time
import uuid

import pytest

from common.scheduling.fair_queue import CAPPED
from common.scheduling.free_slots import FreeSlots
from common.scheduling.prefix_affinity import BLOCK_TOKENS, MAX_BLOCKS, MAX_HOLDERS, Deferred, prefix_blocks
from tests.support.settings import fresh_namespace
from tests.support.waiting import wait_until

QUEUE = "q"
WAIT_S = 0.3
SYSTEM = list(range(1000, 1000 + 4 * BLOCK_TOKENS))  # a shared system prompt of four blocks


@pytest.fixture
def settings():
    with fresh_namespace() as settings:
        yield settings


def queue_job(store, prompt, owner="k", priority="normal"):
    job_id = uuid.uuid4().hex
    store.create(job_id, {"id": job_id, "status": "queued", "model": "m", "queue": QUEUE,
                          "created_at": time.time(), "owner": owner, "priority": priority,
                          "prefix_blocks": prefix_blocks(prompt),
                          "request": {"prompt_token_ids": prompt, "sampling": {}}}, queue_limit=0)
    return job_id


def pick(store, worker, wait_s=WAIT_S):
    return store.fair.pick(QUEUE, uuid.uuid4().hex, worker, affinity_wait_s=wait_s)


def free(store, worker, slots=2):
    """What a worker with `slots` free slots has written (common/scheduling/free_slots.py)."""
    FreeSlots(store.r, store.keys.free_slots(worker), slots, ttl_s=60).publish()


def test_prompts_sharing_a_start_share_its_block_chains_and_only_whole_blocks_count():
    a = prefix_blocks(SYSTEM + [1, 2, 3])
    b = prefix_blocks(SYSTEM + list(range(5, 5 + BLOCK_TOKENS)))
    assert a.split() == b.split()[:4] and len(b.split()) == 5
    other = prefix_blocks([7] + SYSTEM[1:])
    assert not set(other.split()) & set(a.split())  # a chain: one early token changes every hash
    assert prefix_blocks(list(range(BLOCK_TOKENS - 1))) == ""
    assert len(prefix_blocks(list(range(BLOCK_TOKENS * (MAX_BLOCKS + 3)))).split()) == MAX_BLOCKS


def test_the_next_job_waits_for_the_worker_that_served_its_start(store):
    free(store, "a")
    first = queue_job(store, SYSTEM + [1])
    assert pick(store, "a")[:4] == (first, "picked", "normal", "new")
    second = queue_job(store, SYSTEM + [2])
    assert pick(store, "b") == Deferred("a", first=True)  # b leaves it, and nudges a once
    assert pick(store, "b") == Deferred("a", first=False)
    assert pick(store, "a")[:4] == (second, "picked", "normal", "hit")


def test_when_every_holder_is_full_a_worker_with_room_takes_the_job_and_holds_it_too(store):
    free(store, "a", 0)
    free(store, "b", 1)
    queue_job(store, SYSTEM + [1])
    pick(store, "a")
    second = queue_job(store, SYSTEM + [2])
    assert pick(store, "b")[:4] == (second, "picked", "normal", "miss")  # no wait for a full holder
    third, fourth = queue_job(store, SYSTEM + [3]), queue_job(store, SYSTEM + [4])
    assert pick(store, "a").affinity == "hit" and pick(store, "b").affinity == "hit"  # both hold it now
    assert {store.get(third)["prefix_affinity"], store.get(fourth)["prefix_affinity"]} == {"hit"}


def test_a_chain_keeps_its_most_recent_holders(store):
    for n in range(MAX_HOLDERS + 3):
        queue_job(store, SYSTEM + [n])
        pick(store, f"w{n}")  # no holder has room: each worker takes one and holds the chain too
        time.sleep(0.002)
    key = store.keys.affinity(QUEUE, prefix_blocks(SYSTEM).split()[-1])
    assert sorted(store.r.hkeys(key)) == sorted(f"w{n}" for n in range(3, MAX_HOLDERS + 3))


def test_a_holder_that_does_not_pick_loses_the_job_after_the_wait(store):
    free(store, "a")  # says it has room, but takes nothing (stuck, or its ticket was lost)
    queue_job(store, SYSTEM + [1])
    pick(store, "a")
    second = queue_job(store, SYSTEM + [2])
    started = time.monotonic()
    picked = wait_until(lambda: None if isinstance(p := pick(store, "b"), Deferred) else p, WAIT_S + 10,
                        interval=0.02, message="the job stayed with a holder that does not pick")
    assert picked[:4] == (second, "picked", "normal", "miss")
    assert time.monotonic() - started >= WAIT_S - 0.05  # not before the holder's wait was over


def test_a_gone_holder_does_not_keep_the_job(store):
    queue_job(store, SYSTEM + [1])
    pick(store, "a")  # "a" never said it has room (or its count lapsed): gone
    second = queue_job(store, SYSTEM + [2])
    assert pick(store, "b").job_id == second


def test_affinity_never_reorders_jobs(store):
    """The head job waits for its holder; no other worker takes a later job meanwhile, even one
    whose start it holds. A higher priority still goes first."""
    free(store, "a")
    free(store, "b")
    queue_job(store, SYSTEM + [1], owner="k1")
    pick(store, "a")
    theirs = [7] * (2 * BLOCK_TOKENS)
    queue_job(store, theirs + [1], owner="k2")
    pick(store, "b")  # b holds the second start
    head = queue_job(store, SYSTEM + [2], owner="k1")
    later = queue_job(store, theirs + [2], owner="k2")
    assert isinstance(pick(store, "b"), Deferred)  # b does not take `later` past `head`
    urgent = queue_job(store, [5] * BLOCK_TOKENS, owner="k3", priority="high")
    assert pick(store, "b").job_id == urgent
    assert pick(store, "a").job_id == head
    assert pick(store, "b").job_id == later


def test_with_affinity_off_picks_are_as_before_and_nothing_is_remembered(store):
    free(store, "a")
    first = queue_job(store, SYSTEM + [1])
    assert pick(store, "a", wait_s=0)[:4] == (first, "picked", "normal", "")
    second = queue_job(store, SYSTEM + [2])
    assert pick(store, "b", wait_s=0).job_id == second
    assert not list(store.r.scan_iter(store.keys.affinity(QUEUE, "") + "*"))


def test_a_short_prompt_is_not_routed_on(store):
    free(store, "a")
    queue_job(store, [1, 2, 3])
    assert pick(store, "a").affinity == ""
    second = queue_job(store, [1, 2, 3])
    assert pick(store, "b").job_id == second


def test_batch_room_still_applies(store):
    free(store, "a")
    queue_job(store, SYSTEM + [1], priority="batch")
    assert store.fair.pick(QUEUE, uuid.uuid4().hex, "b", batch_room=0, affinity_wait_s=WAIT_S) == CAPPED
