"""A worker holding many jobs at once: queue N jobs, start a worker of batch N, let it run them
all, and read what it cost beside its engine (threads, memory, Redis connections, CPU) while it
held them. The e2e test asserts on it; `python -m bench.studies.held_jobs` reports it per level."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import psutil

from common.settings import Settings, subprocess_env
from tests.support import ROOT

PROMPTS = ["Count from one to fifty in words, one per line.", "List every month of the year, with a fact each.",
           "Name forty animals, one per line.", "Write the alphabet, one letter a line, with a word each."]


def footprint(worker_pid: int, redis_port: int) -> dict:
    """The worker process's own share (its engine's child processes apart): threads, resident
    memory, open connections to Redis, and CPU seconds so far; and its engine's CPU seconds."""
    worker = psutil.Process(worker_pid)
    children = worker.children(recursive=True)
    own_cpu = worker.cpu_times()
    engine_cpu = 0.0
    for child in children:
        try:
            times = child.cpu_times()
            engine_cpu += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    to_redis = [c for c in worker.net_connections(kind="tcp") if c.raddr and c.raddr.port == redis_port]
    return {"threads": worker.num_threads(), "rss_mb": worker.memory_info().rss / 2**20,
            "redis_connections": len(to_redis), "cpu_s": own_cpu.user + own_cpu.system,
            "engine_cpu_s": engine_cpu}


def hold(settings: Settings, jobs: int, max_tokens: int, log_path: Path, timeout: float = 900) -> dict:
    """Queue `jobs` jobs, start a worker of batch `jobs`, let it run them all; its footprint at
    its fullest, the largest batch one step saw, and how the jobs ended."""
    from api import create_app

    app = create_app(settings)
    client, jobs_store = app.test_client(), app.extensions["llmq"].jobs
    ids = []
    for i in range(jobs):
        body = {"messages": [{"role": "user", "content": f"{PROMPTS[i % len(PROMPTS)]} ({i})"}],
                "max_tokens": max_tokens, "temperature": 0, "cache": False}
        reply = client.post("/v1/jobs", json=body)
        assert reply.status_code == 202, reply.get_json()
        ids.append(reply.get_json()["id"])
    cmd = [sys.executable, "-m", "worker", "--concurrency", str(jobs), "--name", f"held-{uuid.uuid4().hex[:6]}@%h"]
    env = {**subprocess_env(settings, os.environ), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log_path, "w"),
                            stderr=subprocess.STDOUT)
    redis_port = urlparse(settings.redis_url).port or 6379
    peak: dict = {}
    started = None
    deadline = time.monotonic() + timeout
    try:
        while True:
            assert proc.poll() is None, f"the worker exited: {log_path.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "the jobs did not finish in time"
            # every record in one round trip: reading them through the API took a core from the
            # worker being watched (hundreds of requests every poll)
            records = jobs_store.get_many(ids)
            running = sum(r["status"] == "running" for r in records)
            if running and started is None:
                started, start_cpu = time.monotonic(), footprint(proc.pid, redis_port)
            if started is not None and running >= peak.get("held", 0):  # read only at the peak: it scans /proc
                peak = {**footprint(proc.pid, redis_port), "held": running}
            if all(r["status"] not in ("queued", "running") for r in records):
                break
            time.sleep(0.2)
        end = footprint(proc.pid, redis_port)
    finally:
        proc.terminate()
        proc.wait(60)
    tokens = sum(r.get("completion_tokens") or 0 for r in records)
    return {"jobs": jobs, "succeeded": sum(r["status"] == "succeeded" for r in records),
            "max_batch": max((r.get("batch_size_max") or 0) for r in records), "held_at_peak": peak.get("held", 0),
            "threads": peak.get("threads"), "rss_mb": round(peak.get("rss_mb", 0), 1),
            "redis_connections": peak.get("redis_connections"), "tokens": tokens,
            "seconds": round(time.monotonic() - started, 2),
            "worker_cpu_s": round(end["cpu_s"] - start_cpu["cpu_s"], 2),
            "engine_cpu_s": round(end["engine_cpu_s"] - start_cpu["engine_cpu_s"], 2)}
