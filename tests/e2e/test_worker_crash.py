"""`kill -9` real worker processes mid-generation: redelivery to the next worker, one coherent
answer in the record and the SSE log, and the poison-job guard.

The stack uses a 4 s visibility timeout (redelivery delay) and 1 s heartbeats, so a lost job
comes back within seconds; a live worker renews what it holds, so long jobs are not redelivered.
"""
import json
import threading
import time
import uuid

import pytest
import requests

from api import create_app
from common.celery_app import TASK_TICKET, make_celery
from common.sseclient import iter_sse
from tests.support.servers import LiveServer
from tests.support.settings import cleanup_namespace, make_settings
from tests.support.waiting import wait_for_job

pytestmark = pytest.mark.slow
VISIBILITY_S = 4
# a raw prompt the model continues for as long as it is allowed to (greedy, no early EOS)
COUNTING = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 96, "temperature": 0, "cache": False}


class Stack:
    """The API on a socket plus the workers of this module, started one after another."""

    def __init__(self, start_worker, settings):
        self.start_worker = start_worker
        self.settings = settings
        app = create_app(settings)
        self.store = app.extensions["llmq"].store
        self.server = LiveServer(app)
        self.url = self.server.url
        self.worker = None

    def start(self, **overrides):
        self.worker = self.start_worker(self.settings.model_copy(update=overrides))
        return self.worker

    def submit(self, **body):
        resp = requests.post(f"{self.url}/v1/jobs", json=body, timeout=30)
        assert resp.status_code == 202, resp.text
        return resp.json()["id"]

    def job(self, job_id):
        return requests.get(f"{self.url}/v1/jobs/{job_id}", timeout=30).json()

    def wait_until_generating(self, job_id, chars=6, timeout=300):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["status"] == "running" and len(job["text"]) >= chars:
                return job
            assert job["status"] in ("queued", "running"), job
            time.sleep(0.1)
        raise TimeoutError(f"job {job_id} did not start generating")


@pytest.fixture(scope="module")
def stack(start_worker, model_ref):
    settings = make_settings(visibility_timeout_s=VISIBILITY_S, broker_restore_interval_s=1,
                             heartbeat_s=1, max_attempts=3)
    stack = Stack(start_worker, settings)
    yield stack
    stack.server.stop()
    cleanup_namespace(settings)


class Listener(threading.Thread):
    """An SSE client that stays connected to a job's stream across the crash."""

    def __init__(self, url, job_id):
        super().__init__(daemon=True)
        self.url, self.job_id, self.events = url, job_id, []
        self.start()

    def run(self):
        with requests.get(f"{self.url}/v1/jobs/{self.job_id}/events", stream=True, timeout=60) as resp:
            for event in iter_sse(resp.iter_lines()):
                self.events.append(event)
                if event.event == "done":
                    return


def unacked_message_age(stack, job_id):
    """Seconds since the broker last saw the job's message delivered or renewed; None if not held."""
    store = stack.store
    for tag, raw in store.r.hgetall(f"{store.keys.broker_prefix}unacked").items():
        if json.loads(raw)[0]["headers"]["id"] == job_id:
            score = store.r.zscore(store.keys.broker_unacked_index, tag)
            return None if score is None else time.time() - score
    return None


def test_a_killed_workers_job_is_redelivered_and_streams_one_coherent_answer(stack):
    first = stack.start()
    job_id = stack.submit(**COUNTING)
    listener = Listener(stack.url, job_id)
    partial = stack.wait_until_generating(job_id)
    first.kill()  # SIGKILL, mid-generation
    assert stack.job(job_id)["status"] == "running" and partial["attempts"] == 1

    stack.start()
    reference_id = stack.submit(**COUNTING)  # the same greedy request, run cleanly
    final = wait_for_job(stack.url, job_id, timeout=600)
    assert final["status"] == "succeeded" and final["finish_reason"] == "length", final
    assert final["attempts"] == 2

    listener.join(60)
    names = [e.event for e in listener.events]
    assert names.count("restart") == 1 and names[-1] == "done"
    cut = names.index("restart")
    before, restart, after = listener.events[:cut], listener.events[cut], listener.events[cut + 1:-1]
    assert before and all(e.event == "chunk" for e in before)  # what the lost attempt had said
    assert restart.json()["attempt"] == 2
    assert [e.json()["index"] for e in after] == list(range(len(after)))
    assert "".join(e.json()["text"] for e in after) == final["text"]
    assert listener.events[-1].json()["status"] == "succeeded"
    # a clean run says exactly the same: nothing of the lost attempt leaked into the answer
    reference = wait_for_job(stack.url, reference_id, timeout=600)
    assert reference["text"] == final["text"] and reference["attempts"] == 1


def test_a_live_workers_job_is_not_redelivered_however_long_it_holds_it(stack, model_ref):
    """A copy delivered while another worker holds the job waits behind it; meanwhile the worker
    renews the broker message, so Redis does not hand it out again after the visibility timeout.
    The holder is staged (a lease the test renews), so how long it holds the job does not depend
    on how fast the model runs."""
    if stack.worker is None or stack.worker.proc.poll() is not None:
        stack.start()
    store, job_id = stack.store, uuid.uuid4().hex
    sampling = {"max_tokens": 8, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None, "stop": []}
    queue = store.keys.queue(model_ref.name)
    store.create(job_id, {"id": job_id, "status": "queued", "model": model_ref.name, "queue": queue,
                          "created_at": time.time(), "prompt_tokens": 3,
                          "request": {"prompt_token_ids": [1, 2, 3], "sampling": sampling}}, 0)
    # "elsewhere" took the job with this message (ticket) and holds it; the message comes back
    assert store.fair.pick(queue, job_id)[:2] == (job_id, "picked")
    assert store.start(job_id, "elsewhere", max_attempts=3, lease_ttl_s=2) == ("start", 1)
    make_celery(stack.settings).send_task(TASK_TICKET, args=[job_id, model_ref.name], task_id=job_id,
                                          queue=queue)
    ages, watch_until = [], time.monotonic() + 3 * VISIBILITY_S
    while time.monotonic() < watch_until:
        assert store.renew_lease(job_id, 1, "elsewhere", 2)
        ages.append(unacked_message_age(stack, job_id))
        time.sleep(0.5)
    ages = ages[4:]  # from 2 s on: the worker has received the message by then
    assert ages and all(a is not None and a < VISIBILITY_S for a in ages), ages
    assert stack.job(job_id)["attempts"] == 1
    # the holder vanishes: its lease lapses and the waiting copy takes the job over
    final = wait_for_job(stack.url, job_id, timeout=300)
    assert final["status"] == "succeeded" and final["attempts"] == 2
    assert stack.worker.log_path.read_text().count(f"llmq.ticket[{job_id}] received") == 1


def test_a_job_that_keeps_killing_workers_is_failed_not_retried_forever(stack):
    # the job below is the worker's first and only delivery allowed: the next one is poison
    if stack.worker is None or stack.worker.proc.poll() is not None:
        stack.start()
    job_id = stack.submit(**COUNTING)
    stack.wait_until_generating(job_id)
    stack.worker.kill()
    stack.start(max_attempts=1)
    final = wait_for_job(stack.url, job_id, timeout=300)
    assert final["status"] == "failed" and final["finish_reason"] == "error"
    assert final["error"]["type"] == "poison_job" and final["attempts"] == 2
    events = requests.get(f"{stack.url}/v1/jobs/{job_id}/events", timeout=30).text
    assert "event: done" in events and "poison_job" in events and "event: restart" not in events
    # the worker that refused it is fine and serves the next job
    ok = wait_for_job(stack.url, stack.submit(prompt="Hello", max_tokens=4, cache=False), timeout=300)
    assert ok["status"] == "succeeded"
