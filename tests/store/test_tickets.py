"""A job's ticket is pushed by admission's own Lua call (common/tickets.py), not by Celery: it
must stay the very message `send_task` would publish, or workers and Flower would not read it."""
import json
import uuid

import redis

from common.celery_app import TASK_TICKET, make_celery, task_options
from common.keys import Keys
from common.tickets import Tickets
from tests.support.settings import cleanup_namespace, make_settings

VARIES = {"delivery_tag", "reply_to", "origin"}  # per message, or per process


def _sent_by_celery(settings, job_id, model, queue):
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    make_celery(settings).send_task(TASK_TICKET, args=[job_id, model], queue=queue,
                                    **task_options(settings, job_id, model))
    return json.loads(client.rpop(Keys(settings.namespace).broker_lists(queue)[0]))


def _without_varying(message):
    message = json.loads(json.dumps(message))
    for part in (message["headers"], message["properties"]):
        for name in VARIES & part.keys():
            part[name] = "*"
    return message


def test_a_ticket_is_the_message_celery_would_send():
    for private in (False, True):
        settings = make_settings(private_task_events=private)
        queue, job_id = f"{settings.namespace}.m", uuid.uuid4().hex
        try:
            ticket = Tickets(settings, Keys(settings.namespace), make_celery(settings)).for_job(job_id, "M", queue)
            ours = json.loads(ticket.message)
            theirs = _sent_by_celery(settings, job_id, "M", queue)
            assert ticket.list_key == Keys(settings.namespace).broker_lists(queue)[0]
            if private:  # each has a random task id of its own; the args hide the job either way
                assert ours["headers"]["argsrepr"] == theirs["headers"]["argsrepr"] == repr(["<hidden>", "M"])
                for message in (ours, theirs):
                    message["headers"].update(id="*", root_id="*")
                    message["properties"]["correlation_id"] = "*"
            assert _without_varying(ours) == _without_varying(theirs)
        finally:
            cleanup_namespace(settings)


def test_a_spare_ticket_has_a_task_id_of_its_own():
    settings = make_settings()
    tickets = Tickets(settings, Keys(settings.namespace), make_celery(settings))
    spare = json.loads(tickets.for_job("job-1", "M", "q", spare=True).message)
    assert spare["headers"]["id"] != "job-1" and json.loads(tickets.for_job("job-1", "M", "q").message)[
        "headers"]["id"] == "job-1"
