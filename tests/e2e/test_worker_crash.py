"""`kill -9` real worker processes mid-generation: redelivery to the next worker, which continues
the answer from the tokens in the job's log (nothing repeated, nothing lost, one seamless stream
for SSE and OpenAI clients), and the poison-job guard.

The stack runs the HF reference engine (the engine contract holds the others to the same
continuation, tests/engine/test_engine_contract.py), with a 4 s visibility timeout (redelivery
delay) and 1 s heartbeats, so a lost job comes back within seconds; a live worker renews what it
holds, so long jobs are not redelivered.
"""
import json
import threading
import time
import uuid

import openai
import pytest
import requests

from api import create_app
from common.celery_app import TASK_TICKET, make_celery
from common.sseclient import iter_sse
from tests.support.servers import LiveServer
from tests.support.settings import cleanup_namespace, make_settings
from tests.support.waiting import wait_for_job, wait_until

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
        self.store = app.extensions["llmq"].jobs
        self.server = LiveServer(app)
        self.url = self.server.url
        self.worker = None
        self.workers = []

    def start(self, **overrides):
        self.worker = self.start_worker(self.settings.model_copy(update=overrides))
        self.workers.append(self.worker)
        return self.worker

    def stop_all(self):
        """Stop every worker the module's tests started, so the next job goes where the test says."""
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.stop()

    def submit(self, **body):
        resp = requests.post(f"{self.url}/v1/jobs", json=body, timeout=30)
        assert resp.status_code == 202, resp.text
        return resp.json()["id"]

    def job(self, job_id):
        return requests.get(f"{self.url}/v1/jobs/{job_id}", timeout=30).json()

    def wait_until_generating(self, job_id, chars=6, timeout=300):
        def generating() -> dict | None:
            job = self.job(job_id)
            assert job["status"] in ("queued", "running"), job
            return job if job["status"] == "running" and len(job["text"]) >= chars else None
        return wait_until(generating, timeout, interval=0.1, message=f"job {job_id} did not start generating")


@pytest.fixture(scope="module")
def stack(start_worker, model_ref):
    settings = make_settings(visibility_timeout_s=VISIBILITY_S, broker_restore_interval_s=1,
                             heartbeat_s=1, max_attempts=3, engine="hf")
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


def assert_one_seamless_answer(events, final):
    """An SSE client's events of a job continued after a crash: numbered chunks from 0 with no
    gap, no `restart`, the record's text, and the usage of the whole answer."""
    names = [e.event for e in events]
    assert "restart" not in names and names[-1] == "done", names
    chunks = [e.json() for e in events if e.event == "chunk"]
    assert [c["index"] for c in chunks] == list(range(len(chunks)))
    assert "".join(c["text"] for c in chunks) == final["text"]
    done = events[-1].json()
    assert done["status"] == "succeeded" and done["usage"]["completion_tokens"] == final["usage"]["completion_tokens"]


class OpenAIStream(threading.Thread):
    """A streamed completion through the `openai` package, kept open across the crash."""

    def __init__(self, url, model, prompt=COUNTING["prompt"], max_tokens=COUNTING["max_tokens"], temperature=0,
                 **extra_body):
        super().__init__(daemon=True)
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        self.request = dict(model=model, prompt=prompt, max_tokens=max_tokens, temperature=temperature, stream=True,
                            extra_body={"cache": False, **extra_body})
        self.deltas, self.finish_reason, self.error, self.job_id = [], None, None, None
        self.start()

    def run(self):
        try:
            for chunk in self.client.completions.create(**self.request):
                self.job_id = chunk.id.removeprefix("cmpl-")
                self.deltas.append(chunk.choices[0].text)
                self.finish_reason = chunk.choices[0].finish_reason or self.finish_reason
        except openai.APIError as exc:
            self.error = exc


def test_a_killed_workers_streamed_job_continues_where_it_stopped(stack, model_ref):
    """The job's worker is killed mid-answer while an OpenAI streaming client and an SSE client
    follow it; the next worker continues from the tokens logged, and both clients see one answer
    with nothing repeated or lost, equal to the same greedy request run without a crash."""
    first = stack.start()
    stream = OpenAIStream(stack.url, model_ref.name)
    wait_until(lambda: stream.job_id is not None, timeout=300)
    job_id = stream.job_id
    listener = Listener(stack.url, job_id)
    partial = stack.wait_until_generating(job_id)
    wait_until(lambda: any(e.event == "chunk" for e in listener.events), timeout=60)
    first.kill()  # SIGKILL, mid-generation
    assert stack.job(job_id)["status"] == "running" and partial["attempts"] == 1

    stack.start()
    final = wait_for_job(stack.url, job_id, timeout=600)
    assert final["status"] == "succeeded" and final["finish_reason"] == "length", final
    assert final["attempts"] == 2 and final["usage"]["completion_tokens"] == COUNTING["max_tokens"]
    assert final["text"].startswith(partial["text"])  # what was sent before the crash stands

    listener.join(60)
    stream.join(60)
    assert_one_seamless_answer(listener.events, final)
    assert stream.error is None and stream.finish_reason == "length"
    assert "".join(stream.deltas) == final["text"]
    # a clean run says exactly the same: the continuation is exact on the reference engine
    reference = wait_for_job(stack.url, stack.submit(**COUNTING), timeout=600)
    assert reference["text"] == final["text"] and reference["attempts"] == 1


def json_numbers(count):
    """A response_format asking for exactly `count` numbers: a long answer, to kill mid-way."""
    schema = {"type": "object", "additionalProperties": False, "required": ["numbers"],
              "properties": {"numbers": {"type": "array", "minItems": count, "maxItems": count,
                                         "items": {"type": "integer", "minimum": 0, "maximum": 999}}}}
    return {"type": "json_schema", "json_schema": {"name": "numbers", "schema": schema}}


def test_a_killed_workers_json_answer_continues_as_valid_json(stack):
    """Structured output: the new attempt's grammar is advanced over the tokens generated before
    (HF engine), so the answer continued after the crash still parses and follows the schema."""
    if stack.worker is None or stack.worker.proc.poll() is not None:
        stack.start()
    body = {"prompt": "Thirty numbers as JSON:", "max_tokens": 200, "temperature": 0, "cache": False,
            "response_format": json_numbers(30)}
    job_id = stack.submit(**body)
    listener = Listener(stack.url, job_id)
    partial = stack.wait_until_generating(job_id)
    stack.worker.kill()
    stack.start()
    final = wait_for_job(stack.url, job_id, timeout=600)
    assert final["status"] == "succeeded" and final["finish_reason"] == "stop", final
    assert final["attempts"] == 2 and final["text"].startswith(partial["text"])
    assert len(json.loads(final["text"])["numbers"]) == 30
    listener.join(60)
    assert_one_seamless_answer(listener.events, final)
    reference = wait_for_job(stack.url, stack.submit(**body), timeout=600)
    assert reference["text"] == final["text"]


def test_a_job_that_cannot_be_continued_starts_over_and_its_openai_stream_goes_on_unseen(stack, model_ref):
    """OpenVINO's structured output cannot be given the tokens generated before: the job starts
    over and SSE clients get a `restart` saying why. A sampled job without a seed of its own is
    seeded from its id, so the new attempt says again what the OpenAI stream was sent, and that
    stream, which cannot take back what it sent, goes on with only what the new attempt adds."""
    if stack.worker is not None:
        stack.worker.kill()
    first = stack.start(engine="openvino")
    stream = OpenAIStream(stack.url, model_ref.name, prompt="Eighty numbers as JSON:", max_tokens=500,
                          temperature=0.8, response_format=json_numbers(80))  # OpenVINO is quick: a long answer
    wait_until(lambda: stream.job_id is not None, timeout=300)
    job_id = stream.job_id
    listener = Listener(stack.url, job_id)
    partial = stack.wait_until_generating(job_id)
    first.kill()
    stack.start(engine="openvino")
    final = wait_for_job(stack.url, job_id, timeout=600)
    assert final["status"] == "succeeded" and final["attempts"] == 2, final
    assert final["text"].startswith(partial["text"]) and len(json.loads(final["text"])["numbers"]) == 80
    stream.join(60)
    assert stream.error is None and "".join(stream.deltas) == final["text"]
    listener.join(60)
    names = [e.event for e in listener.events]
    assert names.count("restart") == 1 and names[-1] == "done"
    restart = listener.events[names.index("restart")].json()
    assert restart["attempt"] == 2 and "cannot continue structured output" in restart["reason"]
    after = [e.json() for e in listener.events[names.index("restart") + 1:-1]]
    assert [c["index"] for c in after] == list(range(len(after)))
    assert "".join(c["text"] for c in after) == final["text"]
    stack.worker.kill()  # the next tests start the module's own (HF) worker
    stack.worker = None


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
    assert store.claim(job_id, "elsewhere", max_attempts=3, lease_ttl_s=2) == ("start", 1)
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


def test_a_worker_killed_holding_the_restore_lock_delays_redelivery_by_seconds(stack):
    """Workers sweep for lost jobs under kombu's restore lock, and a worker killed mid-sweep leaves
    it held. Here the lock is taken as kombu takes it, by a sweeper that never comes back, and the
    job's worker is killed: the job is back within seconds (the lock lapses after one visibility
    timeout), not after the five minutes kombu holds it by default."""
    if stack.worker is None or stack.worker.proc.poll() is not None:
        stack.start()
    job_id = stack.submit(**COUNTING)
    stack.wait_until_generating(job_id)
    with make_celery(stack.settings).connection_for_write() as conn:
        channel = conn.default_channel
        lock = channel.client.lock(channel.unacked_mutex_key, timeout=channel.unacked_mutex_expire)
        wait_until(lambda: lock.acquire(blocking=False), timeout=10, interval=0.05)  # a live sweep may hold it
        stack.worker.kill()
    stack.start()
    # redelivered after the visibility timeout, once the lock has lapsed and a sweep has run
    wait_until(lambda: stack.job(job_id)["attempts"] == 2, timeout=2 * VISIBILITY_S + 30, interval=0.5,
               message="the job was not redelivered while a dead sweeper's lock was held")
    final = wait_for_job(stack.url, job_id, timeout=300)
    assert final["status"] == "succeeded" and final["attempts"] == 2, final


class ResponsesStream(threading.Thread):
    """A streamed background response through the `openai` package, kept open across the crash."""

    def __init__(self, url, model):
        super().__init__(daemon=True)
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        self.request = dict(model=model, input="Count from 1 to 100, separated by commas.", background=True,
                            stream=True, max_output_tokens=COUNTING["max_tokens"], temperature=0,
                            extra_body={"cache": False})
        self.events, self.error, self.job_id = [], None, None
        self.start()

    def run(self):
        try:
            for event in self.client.responses.create(**self.request):
                self.job_id = self.job_id or event.response.id.removeprefix("resp_")
                self.events.append(event)
        except openai.APIError as exc:
            self.error = exc


def test_a_killed_workers_background_response_streams_on_to_completion(stack, model_ref):
    """A Responses stream in background mode follows its job across a kill -9 of its worker: its
    events stay numbered without a gap, none is an error, and its deltas are the stored answer."""
    stack.stop_all()  # (the poison test leaves a worker that allows one delivery only)
    first = stack.start()
    stream = ResponsesStream(stack.url, model_ref.name)
    wait_until(lambda: stream.job_id is not None, timeout=300)
    partial = stack.wait_until_generating(stream.job_id)
    first.kill()
    stack.start()
    final = wait_for_job(stack.url, stream.job_id, timeout=600)
    stream.join(60)
    assert stream.error is None and final["status"] == "succeeded" and final["attempts"] == 2
    assert final["text"].startswith(partial["text"])
    events = stream.events
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    stored = stream.client.responses.retrieve(events[-1].response.id)
    assert deltas == events[-1].response.output_text == stored.output_text == final["text"]
