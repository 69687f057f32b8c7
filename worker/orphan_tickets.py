"""Tickets stranded in the own queue of a worker that is gone go back to the model's queue.

Prefix affinity sends spare tickets to a worker's own queue (`<model queue>.worker.<name>`,
common/scheduling/prefix_affinity.py). A worker that runs a job with such a ticket and is then killed leaves
the ticket unacked; Celery redelivers it to the queue it came from, the dead worker's own queue,
which nobody reads any more. That ticket was the job's only one (the job's first ticket found it
left for this worker and ended idle), so the job would stay `running` for ever. Every heartbeat,
each worker moves the messages of the own queues of dead workers that still hold a job to its
model's queue, where the next free worker takes the ticket and continues the job from its log.
"""
from __future__ import annotations

import redis

from common.keys import Keys


def rescue(client: redis.Redis, keys: Keys, queue: str) -> int:
    """Move every message in the own queues (of `queue`) of the workers that hold a job in the
    fair queue's `held` hash but have no live heartbeat; the number moved. Each move is one
    atomic LMOVE, so workers sweeping at once never copy a ticket twice."""
    holders = {_text(name) for name in client.hvals(keys.held)}
    if not holders:
        return 0
    pipe = client.pipeline(transaction=False)
    for name in sorted(holders):
        pipe.exists(keys.worker_alive(name))
    dead = [name for name, alive in zip(sorted(holders), pipe.execute()) if not alive]
    moved = 0
    for name in dead:
        # kombu pushes on the left and pops on the right: take the oldest first, put it last
        for source, target in zip(keys.broker_lists(keys.worker_queue(queue, name)), keys.broker_lists(queue)):
            while client.lmove(source, target, "RIGHT", "LEFT") is not None:
                moved += 1
    return moved


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
