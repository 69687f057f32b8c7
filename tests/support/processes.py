"""Real processes a test starts and stops: a worker, a private redis-server."""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import redis
import requests

from common.celery_app import make_celery
from common.settings import Settings
from tests.support import ROOT
from tests.support.ports import redis_port
from tests.support.settings import settings_env
from tests.support.waiting import wait_until


class WorkerProcess:
    """A real `python -m worker` subprocess (or `python -m worker.control`: module='worker.control')."""

    def __init__(self, settings: Settings, name: str, log_path: Path, concurrency: int | None = None,
                 module: str = "worker", args: tuple[str, ...] = ()):
        self.settings = settings
        self.name = name
        cmd = [sys.executable, "-m", module, "--name", f"{name}@%h", "--loglevel", "INFO"]
        if concurrency:
            cmd += ["--concurrency", str(concurrency)]
        cmd += list(args)
        self.log_path = log_path
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=settings_env(settings),
                                     stdout=open(log_path, "w"), stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120) -> None:
        app = make_celery(self.settings)

        def answers() -> bool:
            assert self.proc.poll() is None, f"worker exited: {self.log_path.read_text()[-3000:]}"
            return any(self.name in n for reply in app.control.ping(timeout=0.5) for n in reply)
        wait_until(answers, timeout, interval=0,  # each ping waits half a second for replies
                   message=lambda: f"worker not ready: {self.log_path.read_text()[-3000:]}")

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


def kill_9_mid_job(url: str, worker: WorkerProcess, job_id: str) -> None:
    """Once the job has text, kill -9 its worker; none of the worker's child processes (an engine
    core) may outlive it."""
    import psutil

    children = psutil.Process(worker.proc.pid).children(recursive=True)
    assert children, "the engine runs in child processes"
    wait_until(lambda: requests.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()["text"], 120, interval=0.1,
               message="the job did not start")
    worker.kill()
    _, alive = psutil.wait_procs(children, timeout=20)
    assert not alive, f"engine processes outlived their worker: {alive}"


class PrivateRedis:
    """A `redis-server` of the test's own on a free port, configured as llmq's scripts start Redis
    (append-only file fsynced every second, noeviction), so a restart keeps the data; the shared
    test Redis is never touched."""

    def __init__(self, directory):
        self.port, self.dir, self.proc = redis_port(), directory, None
        self.url = f"redis://127.0.0.1:{self.port}"

    def start(self):
        self.proc = subprocess.Popen(
            [shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.dir), "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
             "--maxmemory-policy", "noeviction"], stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        wait_until(client.ping, 5, interval=0.05, ignoring=(redis.ConnectionError,),
                   message="private redis did not start")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # SHUTDOWN: the append-only file is complete
            self.proc.wait(30)

    def crash(self):
        """SIGKILL: only what the append-only file had fsynced (up to a second ago) survives."""
        self.proc.kill()
        self.proc.wait(30)
