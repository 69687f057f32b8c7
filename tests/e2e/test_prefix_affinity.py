"""Prefix affinity with two real workers (common/scheduling/prefix_affinity.py): a tenant's jobs go to the
worker that served its prompt's start, whichever worker's ticket comes first (the other hands the
job over with a ticket on the holder's own queue); when the holder is full, the other worker takes
the next one at once and holds the prompt's start too."""
import time

import pytest

from api import create_app
from tests.support.settings import cleanup_namespace, make_settings
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
WAIT_S = 1.5
POLICY = ("Policy {n}: customers may return unused items within thirty days of delivery; refunds go to the "
          "original payment method within five business days. ")
TENANT = "".join(POLICY.format(n=n) for n in range(8))  # about 250 tokens: a few affinity blocks


@pytest.fixture(scope="module")
def stack(start_worker):
    settings = make_settings(max_batch_size=1, prefix_affinity_wait_s=WAIT_S)
    start_worker(settings, wait=False)
    start_worker(settings)
    app = create_app(settings)
    svc = app.extensions["llmq"]
    wait_until(lambda: len(svc.registry.live()) == 2, timeout=120, interval=0.2)
    yield app.test_client(), svc
    cleanup_namespace(settings)


def run(client, svc, prompt, max_tokens=4, wait=True):
    job = client.post("/v1/jobs", json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                        "cache": False}).get_json()
    if wait:
        wait_until(lambda: svc.jobs.get(job["id"])["status"] == "succeeded", timeout=60, interval=0.05)
    return svc.jobs.get(job["id"])


def test_a_tenants_jobs_stay_on_its_worker_and_a_full_one_hands_them_on_at_once(stack):
    client, svc = stack
    first = run(client, svc, TENANT + "Question 0: may I return a lamp?")
    assert first["prefix_affinity"] == "new"
    holder = first["worker"]
    for i in range(1, 6):  # either worker's ticket may come first: the job still goes to the holder
        job = run(client, svc, TENANT + f"Question {i}: may I return a lamp?")
        assert (job["worker"], job["prefix_affinity"]) == (holder, "hit")

    long = run(client, svc, TENANT + "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", max_tokens=400, wait=False)
    wait_until(lambda: svc.jobs.get(long["id"])["status"] == "running", timeout=30, interval=0.02)
    asked = time.time()
    job = run(client, svc, TENANT + "Question 6: may I return a lamp?")
    assert job["worker"] != holder and job["prefix_affinity"] == "miss"  # its holder's one slot is busy
    assert job["started_at"] - asked < 1.0  # no affinity wait for a full holder
    assert job["started_at"] < svc.jobs.get(long["id"]).get("finished_at", float("inf"))
    job = run(client, svc, TENANT + "Question 7: may I return a lamp?")
    assert job["prefix_affinity"] == "hit"  # both workers hold the tenant's start now
