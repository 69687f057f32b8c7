"""Celery glue: the one task, `llmq.ticket(job_id, model)`, a ticket for the model's fair queue
that the worker's job runner turns into a job run."""
from __future__ import annotations

import uuid

from celery.exceptions import Reject
from celery.signals import worker_shutting_down

from common.celery_app import TASK_TICKET, TASK_TICKET_BEFORE_RENAME, make_celery
from common.settings import get_settings
from worker.job_runner import JobRunner
from worker.runtime import get_runtime

app = make_celery(get_settings(), consumer=True)
_job_runner: JobRunner | None = None


def job_runner() -> JobRunner:
    global _job_runner
    if _job_runner is None:
        rt = get_runtime()
        _job_runner = JobRunner(rt.store, rt.loop, rt.name, rt.settings, rt.leases, metrics=rt.metrics,
                                meter=rt.meter, cache=rt.stores.cache, send_ticket=_send_spare_ticket,
                                free_slots=rt.free_slots)
    return _job_runner


def _send_spare_ticket(worker: str | None) -> None:
    """A spare ticket on another worker's own queue (for the job prefix affinity leaves it), or on
    the model's queue (for a preempted batch line). A ticket that finds nothing does nothing."""
    rt = get_runtime()
    queue = rt.queue if worker is None else rt.keys.worker_queue(rt.queue, worker)
    app.send_task(TASK_TICKET, args=["", rt.model.name], queue=queue, task_id=uuid.uuid4().hex)


def run_ticket(self, job_id: str, model: str) -> dict:
    """A ticket for the model's fair queue: run the fairest queued job now that a slot is free
    (`job_id` is the job admitted with this message; another key's job may be fairer, and the
    worker's log names the one that ran). The arguments carry no prompt text: the job record holds
    it. The return value (Flower shows it, from the `task-succeeded` event) carries no job id, so
    `private_task_events` stays private."""
    result = job_runner().run_ticket(self.request.id, get_runtime().queue)
    if result["status"] == "requeue":  # it waited for batch room as the worker stopped: not used
        raise Reject("the worker stops; the ticket goes back to the queue", requeue=True)
    return {"status": result["status"], "finish_reason": result.get("finish_reason")}


@worker_shutting_down.connect
def _stop_waiting_tickets(**_) -> None:
    if _job_runner is not None:
        _job_runner.stop_waiting()


_OPTIONS = {"bind": True, "acks_late": True, "reject_on_worker_lost": True}
ticket = app.task(name=TASK_TICKET, **_OPTIONS)(run_ticket)
# Tickets an API sent before the rename may still wait on the queue (or come back unacked after an
# upgrade restarts the workers): they run the same way, so none of their jobs is left waiting.
ticket_before_rename = app.task(name=TASK_TICKET_BEFORE_RENAME, **_OPTIONS)(run_ticket)
