"""`python -m worker.control`: the model-less Celery worker for control queues.

It loads no model and imports no torch: it sends webhook deliveries and runs the steps of batches
(validating input files, following their lines' jobs, writing output files; worker/batch_tasks.py),
so that this work never waits behind generation and generation never waits on it. It also runs the
batches' watchdog. Threads pool: the work is network I/O. Run one or more anywhere that reaches
Redis; without one, webhooks are not sent and batches stay `validating`.
"""
from __future__ import annotations

import argparse
import os

import redis

from common.celery_app import TASK_DELIVER_WEBHOOK
from common.keys import Keys
from common.logs import setup_logging
from common.settings import Settings, get_settings
from common.webhooks import WEBHOOK_QUEUE
from worker.batch_tasks import start_watchdog  # also registers the batch task
from worker.control_app import app, stores

_sender = None


def control_queues(settings: Settings) -> list[str]:
    """Every queue this worker consumes."""
    keys = Keys(settings.namespace)
    return [keys.control_queue(WEBHOOK_QUEUE), keys.batch_queue]


def sender():
    global _sender
    if _sender is None:
        from worker.webhook_sender import WebhookSender

        _sender = WebhookSender(get_settings(), stores().webhooks)
    return _sender


@app.task(name=TASK_DELIVER_WEBHOOK, bind=True, max_retries=None,
          autoretry_for=(redis.RedisError,), retry_backoff=1, retry_backoff_max=60)
def deliver_webhook(self, delivery_id: str, attempt: int) -> None:
    """Attempt `attempt` of a webhook delivery; a retry (or a hop of a long wait) is this task
    again with a countdown: Celery holds it, no thread sleeps. Redis being away retries the same
    attempt later (an attempt whose outcome could not be written may reach the receiver twice,
    under the same webhook-id)."""
    following = sender().run(delivery_id, attempt)
    if following is not None:
        raise self.retry(args=[delivery_id, following.attempt], countdown=following.countdown)


def main(argv: list[str] | None = None) -> None:
    settings = get_settings()
    parser = argparse.ArgumentParser(prog="python -m worker.control", description=__doc__)
    parser.add_argument("--concurrency", type=int, default=settings.control_concurrency,
                        help="tasks run at once (threads)")
    parser.add_argument("--name", default=None, help="Celery node name")
    parser.add_argument("--loglevel", default=settings.log_level)
    args = parser.parse_args(argv)
    setup_logging(settings, "control")
    start_watchdog()
    name = args.name or f"llmq-control-{os.getpid()}@%h"
    app.worker_main(["worker", "--pool", "threads", "--concurrency", str(args.concurrency),
                     "--queues", ",".join(control_queues(settings)), "--hostname", name,
                     "--loglevel", args.loglevel, "--task-events", "--without-gossip",
                     "--without-mingle"])


if __name__ == "__main__":
    main()
