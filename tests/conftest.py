"""Fixtures: a real Redis (own db + key namespace per run), real Celery worker subprocesses running
the embedded model, the Flask app, and a live HTTP server for SSE and client-library tests."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis
import requests
from werkzeug.serving import make_server

from api import create_app
from common.celery_app import make_celery
from common.models import embedded_model
from common.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
REDIS_HOST = os.environ.get("LLMQ_TEST_REDIS", "redis://127.0.0.1:6379")
REDIS_DB = int(os.environ.get("LLMQ_TEST_REDIS_DB", "11"))
# Two webhook signing secrets (a rotation in progress): every delivery carries both signatures.
WEBHOOK_SECRETS = ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")


def make_settings(**overrides) -> Settings:
    base = dict(redis_url=f"{REDIS_HOST}/{REDIS_DB}", namespace=f"llmqtest-{uuid.uuid4().hex[:8]}",
                model="embedded", allow_download=False, max_batch_size=16, max_tokens_cap=512,
                # f32: answers and seeded samples that do not depend on the host's bf16 kernels
                # (bf16 on AMD Zen 4 answers the capital of France in French) or on the batch
                dtype="float32",
                default_max_tokens=64, cache_ttl_s=600, sse_heartbeat_s=1.0, heartbeat_s=1.0,
                health_ping_timeout_s=0.5, max_queue=1000, job_ttl_s=3600,
                # webhooks to test receivers on loopback, retried quickly over a short horizon
                webhook_secrets=" ".join(WEBHOOK_SECRETS), webhook_allow_networks="127.0.0.0/8",
                webhook_timeout_s=1.0, webhook_backoff_s=0.3, webhook_backoff_max_s=2.0,
                webhook_retry_horizon_s=8.0)
    base.update(overrides)
    return Settings(**base)


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a subprocess see `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMQ_")}
    for name, value in settings.model_dump().items():
        if value is not None:
            env[f"LLMQ_{name.upper()}"] = str(value)
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               PYTHON=sys.executable)  # ops scripts run with the tests' Python, not a .venv of their own
    return env


def cleanup_namespace(settings: Settings) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    for key in client.scan_iter(f"{settings.namespace}*", count=1000):
        client.delete(key)


@pytest.fixture(scope="session", autouse=True)
def _redis_up():
    try:
        redis.Redis.from_url(f"{REDIS_HOST}/{REDIS_DB}").ping()
    except redis.RedisError as exc:
        pytest.exit(f"Redis is not reachable at {REDIS_HOST} ({exc}); run `bash ops/test.sh`", 2)


@pytest.fixture(scope="session")
def model_ref():
    return embedded_model(make_settings(), prepare=True)


class WorkerProcess:
    """A real `python -m worker` subprocess (or `python -m worker.control`: module='worker.control')."""

    def __init__(self, settings: Settings, name: str, log_path: Path, concurrency: int | None = None,
                 module: str = "worker"):
        self.settings = settings
        self.name = name
        cmd = [sys.executable, "-m", module, "--name", f"{name}@%h", "--loglevel", "INFO"]
        if concurrency:
            cmd += ["--concurrency", str(concurrency)]
        self.log_path = log_path
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=settings_env(settings),
                                     stdout=open(log_path, "w"), stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120) -> None:
        app = make_celery(self.settings)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited: {self.log_path.read_text()[-3000:]}")
            if any(self.name in n for reply in app.control.ping(timeout=0.5) for n in reply):
                return
        raise TimeoutError(f"worker not ready: {self.log_path.read_text()[-3000:]}")

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


@pytest.fixture(scope="session")
def start_worker(model_ref, tmp_path_factory):
    """Factory: start a worker for some settings; all are stopped at the end of the session."""
    started: list[WorkerProcess] = []

    def start(settings: Settings, concurrency: int | None = None, wait: bool = True) -> WorkerProcess:
        name = f"w{len(started)}-{settings.namespace}"
        worker = WorkerProcess(settings, name, tmp_path_factory.mktemp("logs") / f"{name}.log", concurrency)
        started.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(scope="session")
def start_control_worker(tmp_path_factory):
    """Factory: start a `python -m worker.control` (webhook deliveries) for some settings; all are
    stopped at the end of the session. No model: it starts in a few seconds."""
    started: list[WorkerProcess] = []

    def start(settings: Settings) -> WorkerProcess:
        name = f"control{len(started)}-{settings.namespace}"
        worker = WorkerProcess(settings, name, tmp_path_factory.mktemp("logs") / f"{name}.log",
                               module="worker.control")
        started.append(worker)
        worker.wait_ready(timeout=60)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(scope="session")
def control_worker(stack_settings, start_control_worker):
    """The session's control worker, next to the shared model worker."""
    return start_control_worker(stack_settings)


@pytest.fixture(scope="session")
def stack_settings():
    settings = make_settings()
    yield settings
    cleanup_namespace(settings)


@pytest.fixture(scope="session")
def worker(stack_settings, start_worker):
    """The session's shared worker."""
    return start_worker(stack_settings)


@pytest.fixture(scope="session")
def app(stack_settings, model_ref):
    return create_app(stack_settings)


@pytest.fixture
def client(app):
    return app.test_client()


class LiveServer:
    def __init__(self, app):
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()


@pytest.fixture(scope="session")
def live_api(app, worker):
    """The API on a real socket, backed by the shared worker."""
    server = LiveServer(app)
    yield server.url
    server.stop()


def wait_until(predicate, timeout: float = 10) -> None:
    """Poll `predicate` every 10 ms until it holds; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def wait_for_job(base_url: str, job_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = requests.get(f"{base_url}/v1/jobs/{job_id}", timeout=10).json()
        if job["status"] not in ("queued", "running"):
            return job
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id} still {job['status']}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_port() -> int:
    """A free port for a Redis server or sentinel a test starts: from `LLMQ_TEST_REDIS_PORTS`
    ("first-last", for a machine whose users share out port ranges) if set, else any free port."""
    span = os.environ.get("LLMQ_TEST_REDIS_PORTS")
    if not span:
        return free_port()
    first, last = map(int, span.split("-"))
    for port in range(first, last + 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            if port not in _ports_given:
                _ports_given.add(port)
                return port
    raise RuntimeError(f"no free port left in LLMQ_TEST_REDIS_PORTS={span}")


_ports_given: set[int] = set()  # a port handed out but not yet bound by its server stays taken


def kill_9_mid_job(url: str, worker: "WorkerProcess", job_id: str) -> None:
    """Once the job has text, kill -9 its worker; none of the worker's child processes (an engine
    core) may outlive it."""
    import psutil

    children = psutil.Process(worker.proc.pid).children(recursive=True)
    assert children, "the engine runs in child processes"
    deadline = time.monotonic() + 120
    while requests.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()["text"] == "":
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.1)
    worker.kill()
    _, alive = psutil.wait_procs(children, timeout=20)
    assert not alive, f"engine processes outlived their worker: {alive}"

