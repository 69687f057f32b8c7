"""Tickets stranded in a dead worker's own queue (worker/orphan_tickets.py): a spare ticket that
ran a job on a worker killed since is redelivered to that worker's own queue, which nobody reads;
the live workers' heartbeats move it to the model's queue, so the job runs again."""
import json

from tests.support.settings import settings_fixture
from worker.orphan_tickets import rescue

QUEUE = "m"


settings = settings_fixture(scope="function")


def ticket(name: str) -> str:
    return json.dumps({"headers": {"id": name}, "body": ""})


def test_a_dead_holders_stranded_tickets_move_to_the_models_queue_in_order(store):
    r, keys = store.r, store.keys
    r.hset(keys.held, mapping={"job1": "dead:1", "job2": "live:2"})
    r.set(keys.worker_alive("live:2"), "1")
    dead_lists, live_lists = keys.broker_lists(keys.worker_queue(QUEUE, "dead:1")), \
        keys.broker_lists(keys.worker_queue(QUEUE, "live:2"))
    r.lpush(dead_lists[0], ticket("first"), ticket("second"))  # kombu pushes left, pops right
    r.lpush(dead_lists[-1], ticket("urgent"))
    r.lpush(live_lists[0], ticket("spare"))

    assert rescue(r, keys, QUEUE) == 3
    model_lists = keys.broker_lists(QUEUE)
    assert [json.loads(m)["headers"]["id"] for m in r.lrange(model_lists[0], 0, -1)] == ["second", "first"]
    assert [json.loads(m)["headers"]["id"] for m in r.lrange(model_lists[-1], 0, -1)] == ["urgent"]
    assert not any(r.llen(key) for key in dead_lists)
    assert r.llen(live_lists[0]) == 1  # a live worker's own tickets stay for it
    assert rescue(r, keys, QUEUE) == 0


def test_nothing_moves_while_no_dead_worker_holds_a_job(store):
    r, keys = store.r, store.keys
    r.lpush(keys.broker_lists(keys.worker_queue(QUEUE, "gone:3"))[0], ticket("spare"))
    assert rescue(r, keys, QUEUE) == 0  # a spare ticket of a worker that held nothing costs nothing
    r.hset(keys.held, "job3", "gone:3")
    assert rescue(r, keys, QUEUE) == 1
