"""How llmq's Celery app talks to Redis, against a real Redis."""
import redis

from common.celery_app import TASK_TICKET, TASK_TICKET_BEFORE_RENAME, make_celery
from common.keys import Keys
from tests.support.settings import cleanup_namespace, make_settings


def test_sending_a_task_subscribes_the_sender_to_nothing():
    """No result backend: a Redis one would subscribe the API to every job's result channel and
    unsubscribe when the `AsyncResult` is collected, retrying for minutes if Redis is gone by
    then. The job's answer lives in llmq's own record; Flower reads task outcomes from events."""
    settings = make_settings()
    celery = make_celery(settings)
    queue = f"{settings.namespace}.q"
    client = redis.Redis.from_url(settings.redis_url)
    try:
        result = celery.send_task("llmq.noop", queue=queue)
        assert sum(client.llen(key) for key in Keys(settings.namespace).broker_lists(queue)) == 1
        assert client.pubsub_channels(f"*{result.id}*") == []
    finally:
        cleanup_namespace(settings)


def test_a_ticket_sent_under_the_task_name_before_the_rename_still_runs():
    """Messages an older API queued as `llmq.generate` may wait through an upgrade: the worker
    consumes them as tickets too."""
    from worker.tasks import app, run_ticket

    for name in (TASK_TICKET, TASK_TICKET_BEFORE_RENAME):
        assert app.tasks[name].run.__func__ is run_ticket
