"""A catalog of two models behind one endpoint, with real workers that load what is asked
(worker/held_models.py): a request for a model no worker holds is queued, not refused; one worker
loads it (unloading its idle model when it has room for one only); every job is answered by the
model it named; with two workers that have room, exactly one of them loads a cold model."""
import json
import time

import pytest

from api import create_app
from common.celery_app import make_celery
from tests.support.random_models import TINY, build
from tests.support.settings import cleanup_namespace, make_settings
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    """The embedded model, and a tiny random-weight model (its own answers) on the HF engine."""
    folder = tmp_path_factory.mktemp("models")
    tiny = build(folder / "tiny", TINY)
    path = folder / "catalog.json"
    path.write_text(json.dumps({"default": "smol", "models": {
        "smol": {"source": "embedded"},
        "tiny": {"source": str(tiny), "engine": "hf", "max_batch_size": 4}}}))
    return path


def stack_of(catalog, start_worker, workers: int, args=(), **overrides):
    settings = make_settings(catalog=catalog, model_idle_s=1.0, **overrides)
    for i in range(workers):
        start_worker(settings, wait=i == workers - 1, args=args)
    app = create_app(settings)
    svc = app.extensions["llmq"]
    wait_until(lambda: len(svc.registry.live()) == workers, timeout=120, interval=0.2)
    return settings, app.test_client(), svc


@pytest.fixture(scope="module")
def one_slot(catalog, start_worker):
    """One worker with room for one model, holding the default (smol) at start."""
    settings, client, svc = stack_of(catalog, start_worker, 1, worker_max_models=1)
    yield client, svc
    cleanup_namespace(settings)


def submit(client, model, prompt="Name a colour.", max_tokens=6):
    resp = client.post("/v1/jobs", json={"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                         "temperature": 0, "cache": False})
    assert resp.status_code == 202, resp.get_data(as_text=True)
    return resp.get_json()


def finished(svc, job_id, timeout=180):
    wait_until(lambda: svc.jobs.get(job_id)["status"] in ("succeeded", "failed", "expired"),
               timeout=timeout, interval=0.1)
    return svc.jobs.get(job_id)


def states(client) -> dict:
    return {m["id"]: m["llmq"] for m in client.get("/v1/models").get_json()["data"]}


def test_a_cold_model_is_queued_loaded_and_answers_under_its_own_name(one_slot):
    client, svc = one_slot
    listed = states(client)
    assert listed["smol"]["state"] == "loaded" and listed["tiny"]["state"] == "cold"
    assert client.post("/v1/jobs", json={"model": "nope", "prompt": "hi"}).status_code == 404

    job = submit(client, "tiny")
    assert job["status"] == "queued"  # accepted although no worker holds it
    record = finished(svc, job["id"])
    assert record["status"] == "succeeded" and record["model"] == "tiny"
    assert record["worker"].endswith("/tiny")  # run by the worker's tiny runtime, not smol's
    listed = states(client)
    assert listed["tiny"]["state"] == "loaded" and listed["tiny"]["load_s"] > 0
    assert listed["smol"]["state"] == "cold"  # unloaded to make room: the worker holds one model

    # the next cold model's ETA counts its last measured load
    svc.model_loads.record("smol", "earlier", 30.0, 500.0, 16)
    job = submit(client, "smol")
    assert job["estimated_start"] >= time.time() + 20
    record = finished(svc, job["id"])
    assert record["status"] == "succeeded" and record["worker"].endswith("/smol")
    health = client.get("/health").get_json()
    assert health["models"]["smol"]["state"] == "loaded" and health["models"]["tiny"]["state"] == "cold"
    # Flower (Celery's inspect) sees the worker consume the loaded model's queues only
    replies = make_celery(svc.settings).control.inspect(timeout=2).active_queues() or {}
    queues = {q["name"] for consumed in replies.values() for q in consumed}
    assert svc.keys.queue("smol") in queues and svc.keys.queue("tiny") not in queues


def test_a_running_job_is_never_dropped_to_load_another_model(one_slot):
    client, svc = one_slot
    finished(svc, submit(client, "smol")["id"])  # loaded, whatever the test before left
    long = submit(client, "smol", prompt="Count from 1 to 200, separated by commas.", max_tokens=160)
    wait_until(lambda: svc.jobs.get(long["id"])["status"] == "running", timeout=60, interval=0.05)
    other = submit(client, "tiny")
    record = finished(svc, long["id"])
    assert (record["status"], record["finish_reason"]) == ("succeeded", "length")  # ran to its end
    assert record["completion_tokens"] == 160
    assert finished(svc, other["id"])["started_at"] > record["finished_at"]  # tiny waited for it


def test_alternating_bursts_lose_no_job_and_each_is_answered_by_its_model(one_slot):
    client, svc = one_slot
    answers = {}
    for model in ("smol", "tiny"):  # each model's own greedy answer, for the burst to match
        answers[model] = finished(svc, submit(client, model)["id"])["text"]
    assert answers["smol"] != answers["tiny"]
    jobs = [(model, submit(client, model)["id"]) for _ in range(3) for model in ("tiny", "smol")]
    for model, job_id in jobs:
        record = finished(svc, job_id)
        assert record["status"] == "succeeded", record
        assert (record["model"], record["text"]) == (model, answers[model])
        assert record["worker"].endswith(f"/{model}")


def test_with_room_on_two_workers_exactly_one_loads_a_cold_model(catalog, start_worker):
    """Both workers start with tiny only and see smol's queue; smol takes seconds to load (its
    OpenVINO pipeline), so both look at it while it loads: the lock lets one of them load it."""
    settings, client, svc = stack_of(catalog, start_worker, 2, args=("--models", "tiny"), worker_max_models=2)
    try:
        jobs = [submit(client, "smol")["id"] for _ in range(4)]
        for job_id in jobs:
            assert finished(svc, job_id)["status"] == "succeeded"
        time.sleep(3 * settings.heartbeat_s)  # a second load would show by now
        holders = [w["name"] for w in svc.registry.live() if w["model"] == "smol"]
        assert len(holders) == 1, holders
        assert len([w for w in svc.registry.live() if w["model"] == "tiny"]) == 2  # kept: there was room
    finally:
        cleanup_namespace(settings)
