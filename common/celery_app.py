"""Celery configuration shared by the API (which sends tasks by name) and the workers."""
from __future__ import annotations

import uuid

from celery import Celery

from common.broker import transport_for
from common.keys import Keys
from common.redis_client import broker_url, sentinel_transport_options
from common.schemas import PRIORITY_LEVELS
from common.settings import Settings, get_settings

TASK_TICKET = "llmq.ticket"  # a ticket for a model's fair queue (worker/tasks.py)
TASK_TICKET_BEFORE_RENAME = "llmq.generate"  # the ticket's name before it was renamed; still consumed
TASK_DELIVER_WEBHOOK = "llmq.webhook.deliver"  # consumed by `python -m worker.control`


def make_celery(settings: Settings, consumer: bool = False) -> Celery:
    """A Celery app bound to llmq's Redis and namespace; the one place an app is built.

    A consumer's app (a model worker's, the control worker's) uses a Redis transport that survives
    a Redis outage under running jobs and follows a Sentinel failover (common/broker.py). Senders
    (the API) and Flower keep kombu's plain `redis` transport: Flower reads queue lengths only from
    a broker URL it recognises.

    Late acks + reject-on-worker-lost: a job whose worker dies is redelivered, not lost; Redis
    redelivers it once it has been unacked for `visibility_timeout_s`. Live workers renew the
    messages they hold every heartbeat (`worker.lease`), so the timeout is the crash-detection
    delay, not a bound on job length; each worker sweeps for lost messages every
    `broker_restore_interval_s`. A sweep holds kombu's restore lock (`unacked_mutex`) while it
    runs; a worker killed mid-sweep leaves the lock held until it expires, and kombu's default
    expiry (five minutes) would hold back every lost job that long. It expires after one
    visibility timeout instead: a crash costs at most one more timeout, and two sweeps that
    overlap are harmless (each message is restored in a transaction, once). Prefetch 1 per
    thread: a worker reserves only as many jobs as its engine can batch, leaving the rest on the
    queue for other workers. A message is a ticket
    for the model's fair queue (`common/scheduling/fair_queue.py`), which decides which job runs, priorities
    included; the priority lists stay configured so older clients' messages are still read.

    No result backend: a job's state and answer live in llmq's own job record, and Flower reads a
    task's outcome from its `task-succeeded` event. A Redis result backend would only copy them,
    and it costs the sender: every `send_task` subscribes the sending process (the API) to the
    task's result channel, and unsubscribes when the returned `AsyncResult` is garbage-collected.
    That unsubscribe retries its reconnect for minutes while Redis is unreachable, in whichever
    thread the collector happens to run, a request thread included.
    """
    keys = Keys(settings.namespace)
    transport = {
        "visibility_timeout": settings.visibility_timeout_s,
        "unacked_restore_interval": settings.broker_restore_interval_s,
        "unacked_restore_throttle": 1,
        "unacked_mutex_expire": settings.visibility_timeout_s,
        "global_keyprefix": keys.broker_prefix,
        "queue_order_strategy": "priority",
        "priority_steps": sorted(set(PRIORITY_LEVELS.values())),
        **sentinel_transport_options(settings),
    }
    url = broker_url(settings)  # `sentinel://` URLs when Sentinel is configured
    app = Celery("llmq", broker=url)
    app.conf.update(
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # a worker outlives any Redis outage
        worker_cancel_long_running_tasks_on_connection_loss=False,  # jobs ride outages out
        task_default_priority=PRIORITY_LEVELS["normal"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        worker_send_task_events=True,  # Flower learns of a task from its worker's task-received event
        task_send_sent_event=False,  # so a sent event is a second publish per task that tells nobody anything
        control_exchange=keys.control_exchange,
        event_exchange=keys.event_exchange,
        worker_hijack_root_logger=False,
    )
    if consumer:
        app.conf.broker_transport = transport_for(settings)
    return app


app = make_celery(get_settings())  # for the `celery -A common.celery_app ...` CLI (Flower)


def task_options(settings: Settings, job_id: str, model: str) -> dict:
    """How a job's task shows up in Celery events and Flower.

    By default the task id is the job id and Flower shows `[job_id, model]`. With
    `private_task_events` the task gets a random id and its args read `["<hidden>", model]`: when
    API auth is off a job id is enough to read the job's prompt and answer, so people who can see
    Flower should not see job ids. The real args still carry the job id to the worker.
    """
    if not settings.private_task_events:
        return {"task_id": job_id}
    return {"task_id": uuid.uuid4().hex, "argsrepr": repr(["<hidden>", model]), "kwargsrepr": "{}"}
