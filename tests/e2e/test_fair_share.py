"""Fair share and coalescing with the real Redis, a real worker and the embedded model: a key that floods the queue
cannot starve another key, and identical requests are generated once (coalescing)."""
import re

import pytest

from api import create_app
from common.api_keys import hash_key
from tests.support.settings import cleanup_namespace, make_settings
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

KEYS = {"flooder": "flooder-secret", "other": "other-secret"}
SLOTS = 2


def auth(name):
    return {"Authorization": f"Bearer {KEYS[name]}"}


@pytest.fixture(scope="module")
def stack(start_worker):
    settings = make_settings(max_batch_size=SLOTS, heartbeat_s=0.5,
                             api_keys=",".join(f"{k}:{hash_key(v)}" for k, v in KEYS.items()))
    start_worker(settings)
    app = create_app(settings)
    yield app.test_client(), app.extensions["llmq"]
    cleanup_namespace(settings)


def wait_for_record(client, job_id, key, holds, timeout=120) -> dict:
    """The job's record once `holds(record)`."""
    def record():
        found = client.get(f"/v1/jobs/{job_id}", headers=auth(key)).get_json()
        return found if holds(found) else None
    return wait_until(record, timeout, interval=0.1, message=f"job {job_id} never got there")


def wait_started(client, job_id, key, timeout=120):
    return wait_for_record(client, job_id, key, lambda job: job["started_at"], timeout)


def test_one_keys_hundred_jobs_do_not_starve_another_keys_single_job(stack):
    client, svc = stack
    body = {"prompt": "Count: one two three", "max_tokens": 12, "temperature": 0, "cache": False}
    flood = [client.post("/v1/jobs", json=body, headers=auth("flooder")).get_json()["id"] for _ in range(100)]
    wait_started(client, flood[SLOTS - 1], "flooder")  # the worker is busy with the flood

    single = client.post("/v1/jobs", json=body, headers=auth("other")).get_json()
    assert single["queue_position"] == 1  # next, though ~98 of the flooder's jobs wait before it
    started = wait_started(client, single["id"], "other", timeout=60)

    # bound: at most the slots busy when it arrived finish before it starts; nothing else overtakes
    records = [svc.jobs.get(job) for job in flood]
    overtook = [r for r in records if r.get("started_at") and single["created_at"] < r["started_at"] < started["started_at"]]
    assert len(overtook) <= SLOTS, len(overtook)
    still_queued = [r for r in records if r["status"] == "queued"]
    assert len(still_queued) > 50  # it really started ahead of the flood
    for record in still_queued:
        client.delete(f"/v1/jobs/{record['id']}", headers=auth("flooder"))


def test_identical_requests_are_generated_once_and_both_get_the_answer(stack):
    client, svc = stack
    body = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 24,
            "temperature": 0}
    first = client.post("/v1/jobs", json=body, headers=auth("flooder")).get_json()
    second = client.post("/v1/jobs", json=body, headers=auth("other")).get_json()
    assert second["coalesced"] and not first["coalesced"] and second["owner"] == "other"
    assert svc.jobs.get(second["id"])["coalesced_into"] == first["id"]
    sampled = client.post("/v1/jobs", json={**body, "temperature": 0.9}, headers=auth("other")).get_json()
    assert not sampled["coalesced"]  # not deterministic: never shared

    a, b = (wait_for_record(client, job["id"], key, lambda record: record["status"] == "succeeded")
            for job, key in ((first, "flooder"), (second, "other")))
    assert a["text"] and a["text"] == b["text"] and a["usage"] == b["usage"]
    assert b["attempts"] == 0  # the worker never ran it
    metrics = client.get("/metrics").get_data(as_text=True)
    assert re.search(r"^llmq_coalesced_total 1\.0$", metrics, re.M)
    events = client.get(f"/v1/jobs/{second['id']}/events", headers=auth("other")).get_data(as_text=True)
    assert "event: done" in events and '"succeeded"' in events
    # another identical request now is a result-cache hit, not a new generation
    third = client.post("/v1/jobs", json=body, headers=auth("other"))
    assert third.status_code == 200 and third.get_json()["cached"]
