"""Scale-out on one machine: `ops/workers.sh` starts two pinned workers that share one queue, both
take jobs, and both serve Prometheus metrics that agree with the API's /metrics."""
import os
import socket
import subprocess

import pytest
import requests

from api import create_app
from common.celery_app import make_celery
from common.stores import Stores
from tests.support import ROOT
from tests.support.metrics import parse_metrics, value
from tests.support.servers import LiveServer
from tests.support.settings import cleanup_namespace, make_settings, settings_env
from tests.support.waiting import wait_for_job, wait_until
from worker.pinning import parse_cpus

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin two workers"),
]
QUESTIONS = ["Name a fruit.", "Name a colour.", "Name a planet.", "Name a river.", "Name a tree.",
             "Name a bird."]


def two_free_ports() -> int:
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


@pytest.fixture(scope="module")
def cluster(model_ref, tmp_path_factory):
    settings = make_settings(max_batch_size=2)
    run_dir = tmp_path_factory.mktemp("run")
    base = two_free_ports()
    env = {**settings_env(settings), "LLMQ_RUN_DIR": str(run_dir), "LLMQ_METRICS_PORT": str(base)}
    script = ["bash", "ops/workers.sh"]
    server = None
    try:
        subprocess.run(script + ["start", "--cpu", "2"], cwd=ROOT, env=env, check=True, timeout=120)
        wait_for_workers(settings, [f"{settings.namespace}-cpu0@", f"{settings.namespace}-cpu1@"], run_dir)
        server = LiveServer(create_app(settings))
        yield settings, server.url, run_dir, [base, base + 1]
    finally:
        if server:
            server.stop()
        subprocess.run(script + ["stop"], cwd=ROOT, env=env, timeout=120)
        cleanup_namespace(settings)


def wait_for_workers(settings, names, run_dir, timeout=240):
    app = make_celery(settings)

    def all_answer() -> bool:
        replies = [n for reply in app.control.ping(timeout=0.5) for n in reply]
        return all(any(n.startswith(name) for n in replies) for name in names)

    def logs() -> str:
        return "workers not ready:\n" + "\n".join(p.read_text()[-2000:] for p in run_dir.glob("*.log"))
    wait_until(all_answer, timeout, interval=0.5, message=logs)


@pytest.fixture(scope="module")
def finished_jobs(cluster):
    _, base, _, _ = cluster
    ids = [requests.post(f"{base}/v1/jobs", json={"messages": [{"role": "user", "content": q}],
                                                  "max_tokens": 24, "temperature": 0, "cache": False},
                         timeout=30).json()["id"] for q in QUESTIONS]
    return [wait_for_job(base, job_id, timeout=300) for job_id in ids]


def test_two_pinned_workers_share_the_queue(cluster, finished_jobs):
    settings, base, run_dir, _ = cluster
    assert all(job["status"] == "succeeded" for job in finished_jobs)
    store = Stores(settings).jobs
    workers = {store.get(job["id"])["worker"] for job in finished_jobs}
    assert len(workers) == 2, f"one worker took every job: {workers}"

    pids = [int(p.read_text()) for p in sorted(run_dir.glob("worker-*.pid"))]
    cpu_sets = [os.sched_getaffinity(pid) for pid in pids]
    assert len(cpu_sets) == 2 and not cpu_sets[0] & cpu_sets[1], cpu_sets  # each its own cores
    detail = requests.get(f"{base}/health", timeout=10).json()["workers_detail"]
    assert sorted(len(w["cpus"]) for w in detail) == sorted(len(s) for s in cpu_sets)
    # each computes on a thread per core of its own, and never loaded torch, which it does not use
    assert all(w["engine"] == "openvino" and w["threads"] == len(w["cpus"]) for w in detail), detail
    assert not any("torch_threads" in w for w in detail), detail
    status = subprocess.run(["bash", "ops/workers.sh", "status"], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "LLMQ_RUN_DIR": str(run_dir)}, check=True).stdout
    assert status.count("cpus") == 2 and all(parse_cpus(line.split("cpus ")[1]) for line in status.splitlines())


def test_worker_and_api_metrics_agree(cluster, finished_jobs):
    _, base, _, ports = cluster
    per_worker = [parse_metrics(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
                  for port in ports]
    finished = [value(s, "llmq_worker_jobs_finished_total", status="succeeded") or 0 for s in per_worker]
    assert sum(finished) == len(finished_jobs) and all(finished)
    for s, n in zip(per_worker, finished):
        assert value(s, "llmq_worker_time_in_queue_seconds_count") == n
        assert value(s, "llmq_worker_time_to_first_token_seconds_count") == n
        assert value(s, "llmq_worker_job_tokens_per_second_count") == n
        assert value(s, "llmq_worker_time_to_first_token_seconds_sum") > 0
        assert value(s, "llmq_worker_batch_size_count") > 0
        assert value(s, "llmq_worker_batch_size_bucket", le="2.0") == value(s, "llmq_worker_batch_size_count")
        assert value(s, "llmq_worker_tokens_generated_total") > 0
    api = parse_metrics(requests.get(f"{base}/metrics", timeout=10).text)
    assert value(api, "llmq_jobs_finished_total", status="succeeded") == len(finished_jobs)
    assert value(api, "llmq_workers_live") == 2
    assert value(api, "llmq_jobs", status="queued") == 0
    queue = [k for k in api if k[0] == "llmq_queue_depth"]
    assert len(queue) == 1 and api[queue[0]] == 0
