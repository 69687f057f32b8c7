"""The autoscaling signal counts the jobs workers hold. With every job held by a busy worker the
broker's queue list is empty, which is all a queue-length scaler sees, yet the desired-workers
figure says the model needs its worker, rises as jobs wait, and falls to zero with no work."""
from __future__ import annotations

import pytest
import requests

from api import create_app
from common.keys import Keys
from tests.support.jobs import submit
from tests.support.metrics import parse_metrics, value
from tests.support.servers import LiveServer
from tests.support.settings import fresh_namespace
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

LONG = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 400, "temperature": 0, "cache": False}


@pytest.fixture
def stack(start_worker):
    with fresh_namespace(max_batch_size=2) as settings:
        start_worker(settings, concurrency=2)
        server = LiveServer(create_app(settings))
        yield settings, server.url
        server.stop()


def figures(url: str, settings, model: str) -> dict[str, float]:
    samples = parse_metrics(requests.get(f"{url}/metrics", timeout=10).text)
    return {"queued": value(samples, "llmq_model_jobs", model=model, state="queued"),
            "held": value(samples, "llmq_model_jobs", model=model, state="held"),
            "slots": value(samples, "llmq_model_slots", model=model),
            "desired": value(samples, "llmq_model_desired_workers", model=model),
            "broker_list": value(samples, "llmq_queue_depth", queue=Keys(settings.namespace).queue(model))}


def test_desired_workers_counts_held_jobs_while_the_broker_list_is_empty(stack, model_ref):
    settings, url = stack
    model = model_ref.name
    assert figures(url, settings, model)["desired"] == 0  # no work: a model can scale to zero

    jobs = [submit(url, **LONG)["id"] for _ in range(2)]
    wait_until(lambda: figures(url, settings, model)["held"] == 2, timeout=120)
    now = figures(url, settings, model)
    assert now["broker_list"] == 0 and now["queued"] == 0  # what LLEN-based scaling would read: idle
    assert now["slots"] == 2 and now["desired"] == 1

    jobs += [submit(url, **LONG)["id"] for _ in range(2)]
    wait_until(lambda: figures(url, settings, model)["queued"] == 2, timeout=30)
    assert figures(url, settings, model)["desired"] == 2

    for job_id in jobs:
        requests.delete(f"{url}/v1/jobs/{job_id}", timeout=10)
    wait_until(lambda: figures(url, settings, model)["desired"] == 0, timeout=60)
