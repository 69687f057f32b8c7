"""Celery glue: the one task, `llmq.ticket(sent_for_job, model)`, a ticket for the model's fair queue
that the job runner of that model (one per model the worker holds) turns into a job run."""
from __future__ import annotations

import threading

from celery.exceptions import Reject
from celery.signals import worker_shutting_down

from common.celery_app import TASK_TICKET, TASK_TICKET_BEFORE_RENAME, make_celery
from common.settings import get_settings
from worker.held_models import HeldModels
from worker.job_runner import JobRunner
from worker.runtime import WorkerRuntime

app = make_celery(get_settings(), consumer=True)
_held: HeldModels | None = None
_runner_lock = threading.Lock()


def serve(held: HeldModels) -> None:
    """The models this process serves; set once, before the consumer starts."""
    global _held
    _held = held


def job_runner(rt: WorkerRuntime) -> JobRunner:
    """The model's job runner, built with its first ticket (the runtime closes it on unload)."""
    with _runner_lock:
        if rt.runner is None:
            rt.runner = JobRunner(
                rt.jobs, rt.loop, rt.name, rt.settings, rt.leases, metrics=rt.metrics, meter=rt.meter,
                cache=rt.stores.cache, send_ticket=rt.send_spare_ticket,
                free_slots=rt.free_slots)
        return rt.runner


def run_ticket(self, sent_for_job: str, model: str) -> dict:
    """A ticket for the model's fair queue: run the fairest queued job now that a slot is free
    (`sent_for_job` is the job whose admission sent this message, "" for a spare ticket, and is
    not read: another key's job may be fairer, and the worker's log names the one that ran). The
    arguments (positional on the wire) carry no prompt text: the job record holds it. The return
    value (Flower shows it, from the `task-succeeded` event) carries no job id, so
    `private_task_events` stays private."""
    if _held is None:
        raise RuntimeError("worker runtime not built; start workers with `python -m worker`")
    rt = _held.ticket(model)
    if rt is None:  # unloaded here since the ticket was taken: whoever holds the model next runs it
        raise Reject(f"model {model} is not held here now; the ticket goes back to its queue", requeue=True)
    try:
        result = job_runner(rt).run_ticket(self.request.id, rt.queue)
    finally:
        _held.ticket_done(rt)
    if result["status"] == "requeue":  # it waited for batch room as the worker stopped: not used
        raise Reject("the worker stops; the ticket goes back to the queue", requeue=True)
    return {"status": result["status"], "finish_reason": result.get("finish_reason")}


@worker_shutting_down.connect
def _stop_waiting_tickets(**_) -> None:
    for rt in _held.runtimes() if _held is not None else []:
        if rt.runner is not None:
            rt.runner.stop_waiting()


_OPTIONS = {"bind": True, "acks_late": True, "reject_on_worker_lost": True}
ticket = app.task(name=TASK_TICKET, **_OPTIONS)(run_ticket)
# Tickets an API sent before the rename may still wait on the queue (or come back unacked after an
# upgrade restarts the workers): they run the same way, so none of their jobs is left waiting.
ticket_before_rename = app.task(name=TASK_TICKET_BEFORE_RENAME, **_OPTIONS)(run_ticket)
