"""Flower against the test broker: it sees the live worker, the completed `llmq.ticket` tasks
with meaningful arguments (job id, model) and no prompt text, the queue's depth, and with
`private_task_events` no job id at all."""
import json
import socket
import subprocess
import sys
import uuid

import pytest
import requests

from api import create_app
from common.celery_app import make_celery
from tests.support import ROOT
from tests.support.ports import free_port
from tests.support.servers import LiveServer
from tests.support.settings import settings_env
from tests.support.waiting import wait_for_job, wait_until

pytestmark = pytest.mark.slow
AUTH = ("llmq", "test-secret")


@pytest.fixture(scope="module")
def flower(stack_settings, worker, tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("flower") / "flower.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "common.celery_app", "flower", f"--port={port}",
         "--address=127.0.0.1", f"--basic-auth={AUTH[0]}:{AUTH[1]}"],
        cwd=ROOT, env=settings_env(stack_settings), stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: requests.get(f"{url}/healthcheck", timeout=2).text == "OK", 60, interval=0.5,
                   ignoring=(requests.RequestException,),
                   message=lambda: f"Flower did not start: {log_path.read_text()[-3000:]}")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def get(url, path, **params):
    resp = requests.get(f"{url}{path}", params=params, auth=AUTH, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()


def submit(base, content):
    resp = requests.post(f"{base}/v1/jobs", json={"messages": [{"role": "user", "content": content}],
                                                  "max_tokens": 8, "temperature": 0, "cache": False}, timeout=30)
    assert resp.status_code == 202, resp.text
    return resp.json()


def test_flower_api_needs_auth(flower):
    assert requests.get(f"{flower}/api/workers", timeout=10).status_code == 401


def test_flower_sees_worker_tasks_and_no_prompt_text(flower, live_api, worker, stack_settings):
    workers = get(flower, "/api/workers", refresh="1")
    name = next(n for n in workers if n.startswith(worker.name))
    queue = f"{stack_settings.namespace}.smollm2-135m-instruct"
    # the model's queue, and the worker's own (spare tickets other workers send it: prefix affinity)
    own = f"{queue}.worker.{socket.gethostname()}:{worker.proc.pid}"
    assert sorted(q["name"] for q in workers[name]["active_queues"]) == sorted([queue, own])

    private = LiveServer(create_app(stack_settings.model_copy(update={"private_task_events": True})))
    try:
        secret_a, secret_b = (f"Repeat the code word {uuid.uuid4().hex[:10]}" for _ in range(2))
        plain = submit(live_api, secret_a)
        hidden = submit(private.url, secret_b)
        for job in (plain, hidden):
            assert wait_for_job(live_api, job["id"])["status"] == "succeeded"
    finally:
        private.stop()

    def both_seen():
        tasks = get(flower, "/api/tasks")
        return sum(t["state"] == "SUCCESS" for t in tasks.values()) >= 2 and tasks
    wait_until(both_seen, 30, interval=0.5, ignoring=(requests.RequestException,),
               message=lambda: f"Flower saw: {get(flower, '/api/tasks')}")
    tasks = get(flower, "/api/tasks")
    dump = json.dumps(tasks)
    assert secret_a not in dump and secret_b not in dump  # prompts never travel in the broker

    task = tasks[plain["id"]]  # default: the task id is the job id
    assert task["name"] == "llmq.ticket" and task["state"] == "SUCCESS"
    assert task["args"] == repr([plain["id"], "SmolLM2-135M-Instruct"])
    assert "succeeded" in task["result"] and task["worker"] == name

    assert hidden["id"] not in dump  # private: neither task id, args nor result name the job
    private_tasks = [t for t in tasks.values() if t["args"] == repr(["<hidden>", "SmolLM2-135M-Instruct"])]
    assert len(private_tasks) == 1 and private_tasks[0]["state"] == "SUCCESS"


def test_flower_reports_queue_depth(flower, live_api, worker, stack_settings):
    """Stop the worker consuming, queue a job, read the depth in Flower, then let it run."""
    get(flower, "/api/workers", refresh="1")  # Flower learns the worker's queues
    app = make_celery(stack_settings)
    queue = f"{stack_settings.namespace}.smollm2-135m-instruct"
    node = next(n for reply in app.control.ping(timeout=1) for n in reply if n.startswith(worker.name))
    app.control.cancel_consumer(queue, destination=[node], reply=True)
    try:
        job = submit(live_api, "Say hello.")
        lengths = {q["name"]: q["messages"] for q in get(flower, "/api/queues/length")["active_queues"]}
        assert lengths.get(queue) == 1
    finally:
        app.control.add_consumer(queue, destination=[node], reply=True)
    assert wait_for_job(live_api, job["id"])["status"] == "succeeded"
    lengths = {q["name"]: q["messages"] for q in get(flower, "/api/queues/length")["active_queues"]}
    assert lengths.get(queue) == 0
