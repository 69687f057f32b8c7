"""Celery glue: the one task, `llmq.generate(job_id, model)`, handing the job to the runtime."""
from __future__ import annotations

from common.celery_app import TASK_GENERATE, make_celery
from common.logs import job_context
from common.settings import get_settings
from worker.job_runner import JobRunner
from worker.runtime import get_runtime

app = make_celery(get_settings())
# Workers use a Redis transport that survives a Redis outage under running jobs (see common/broker.py).
# Only they need it; the API and Flower keep kombu's plain `redis` transport (Flower reads queue
# lengths only from a broker URL it recognises).
app.conf.broker_transport = "common.broker:Transport"
_job_runner: JobRunner | None = None


def job_runner() -> JobRunner:
    global _job_runner
    if _job_runner is None:
        rt = get_runtime()
        _job_runner = JobRunner(rt.store, rt.loop, rt.name, rt.settings, rt.leases, metrics=rt.metrics,
                                meter=rt.meter)
    return _job_runner


@app.task(name=TASK_GENERATE, acks_late=True, reject_on_worker_lost=True, ignore_result=False)
def generate(job_id: str, model: str) -> dict:
    """Generate the job's completion. Arguments carry no prompt text: the job record holds it.
    The result (shown by Flower) carries no job id either: the task id and args already do,
    unless `private_task_events` hides them."""
    with job_context(job_id):
        result = job_runner().run(job_id)
    return {"status": result["status"], "finish_reason": result.get("finish_reason")}
