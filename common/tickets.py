"""A job's ticket as the broker message itself, so admission can put it in the model's Celery queue
in the same Lua call that creates the job (common/lua/job_create.lua): one round trip for the
job, its ticket and its place in line, where `send_task` cost two broker publishes of its own
(the message and its task-sent event) and most of a millisecond of CPU.

The message is exactly what `celery.send_task(TASK_TICKET, ...)` puts on kombu's Redis transport:
Celery builds the task message (its protocol 2, `as_task_v2`), kombu's envelope wraps it (JSON
body, base64-encoded, and the delivery info a redelivery uses to find the queue again), and it is
pushed on the left of the queue's list for priority 0, where kombu pushes and workers pop.
Workers and Flower see an ordinary task: Flower learns of it from the worker's task-received
event, as it did before (the sent event only told it that a task was queued).
"""
from __future__ import annotations

import base64
import json
import uuid
from typing import NamedTuple

import redis
from celery import Celery

from common.celery_app import TASK_TICKET, task_options
from common.keys import Keys
from common.settings import Settings


class Ticket(NamedTuple):
    """Where a ticket goes (the broker's list key) and the message to push there."""
    list_key: str
    message: str


class Tickets:
    """Builds tickets for one process's settings; building one talks to nobody."""

    def __init__(self, settings: Settings, keys: Keys, celery: Celery):
        self.settings = settings
        self.keys = keys
        self.celery = celery

    def for_job(self, job_id: str, model: str, queue: str, spare: bool = False) -> Ticket:
        """The ticket of job `job_id`. Its task id is the job's (or hidden: see `task_options`);
        a spare ticket (one more for a job that may already have one) gets an id of its own,
        since a ticket's id maps to the job it took."""
        options = task_options(self.settings, job_id, model)
        task_id = uuid.uuid4().hex if spare else options["task_id"]
        args = [job_id, model]
        # the process's id, not `send_task`'s per-thread one: under gevent every request is a thread
        # of its own, and a ticket's result is never replied to
        headers, properties, body, _ = self.celery.amqp.as_task_v2(
            task_id, TASK_TICKET, args=args, kwargs={}, reply_to=self.celery.oid, ignore_result=None,
            argsrepr=options.get("argsrepr", repr(args)), kwargsrepr=options.get("kwargsrepr", "{}"))
        properties.update(delivery_mode=2, priority=0, body_encoding="base64", delivery_tag=str(uuid.uuid4()),
                          delivery_info={"exchange": "", "routing_key": queue})
        # send_task's options that kombu does not know become message properties: the hidden reprs
        properties.update((name, options[name]) for name in ("argsrepr", "kwargsrepr") if name in options)
        message = {"body": base64.b64encode(json.dumps(body).encode()).decode(), "content-encoding": "utf-8",
                   "content-type": "application/json", "headers": headers, "properties": properties}
        return Ticket(self.keys.broker_lists(queue)[0], json.dumps(message))

    def send_spare(self, client: redis.Redis, job_id: str, model: str, queue: str) -> None:
        """Push one more ticket on `queue` (see `for_job`): a ticket that finds nothing to run does
        nothing, so a spare one is always safe."""
        ticket = self.for_job(job_id, model, queue, spare=True)
        client.lpush(ticket.list_key, ticket.message)


def tickets_waiting(client: redis.Redis, keys: Keys, queue: str) -> int:
    """Messages waiting on a Celery queue, every priority step's list, in one round trip."""
    pipe = client.pipeline(transaction=False)
    for key in keys.broker_lists(queue):
        pipe.llen(key)
    return sum(pipe.execute())
