"""Soak test: many concurrent clients for a while, with random cancels and disconnects.

    python bench/soak.py                         # 64 clients for 120 s on a stack of its own
    python bench/soak.py --clients 16 --duration 20
    python bench/soak.py --url http://127.0.0.1:8000 --api-pid P --worker-pid Q

Without --url it starts its own stack on loopback: a private redis-server on a free port, one
worker (`python -m worker`) and the API under gunicorn, and stops them at the end. Each client
loops until the duration is up (or --max-jobs were submitted): submit a job, then stream it to the
end, or stream a little, drop the connection and resume with Last-Event-ID, or cancel it after a
random delay, or poll it. Some requests repeat a deterministic prompt, so the result cache answers
them. When time is up, clients follow their last job to its end; then every job is read back.

Reported: submitted / completed / cancelled / failed (failed must be 0, and completed + cancelled
must equal submitted: nothing lost), requests refused with 429, client-side errors, SSE resumes
checked, and the RSS of the API and worker processes (and Redis clients) before and after.
Exit status 1 if the accounting does not hold. Loopback only: it refuses any other host.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

import psutil
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.sseclient import iter_sse  # noqa: E402

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
TOPICS = ["the sea", "bread", "a small town", "winter", "bees", "trains", "the moon", "a garden",
          "music", "rivers", "mountains", "a library"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OwnStack:
    """redis-server + worker + gunicorn API, all on 127.0.0.1, in a temporary folder."""

    def __init__(self, workers: int, max_batch: int, api_threads: int):
        self.dir = Path(tempfile.mkdtemp(prefix="llmq-soak-"))
        self.redis_port, self.api_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.api_port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMQ_")}
        env.update({k: v for k, v in os.environ.items() if k.startswith("LLMQ_")})
        env.update(LLMQ_REDIS_URL=f"redis://127.0.0.1:{self.redis_port}/0",
                   LLMQ_NAMESPACE=f"soak-{uuid.uuid4().hex[:6]}", LLMQ_MAX_BATCH_SIZE=str(max_batch),
                   LLMQ_MODEL=os.environ.get("LLMQ_MODEL", "embedded"), LLMQ_MAX_QUEUE="10000",
                   HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
        self.redis_url = env["LLMQ_REDIS_URL"]
        self.procs: dict[str, subprocess.Popen] = {}
        self._spawn("redis", [shutil.which("redis-server"), "--port", str(self.redis_port), "--bind",
                              "127.0.0.1", "--save", "", "--appendonly", "no",
                              "--maxmemory-policy", "noeviction", "--dir", str(self.dir)], env)
        for i in range(workers):
            self._spawn(f"worker{i}", [sys.executable, "-m", "worker", "--name", f"soak{i}@%h"], env)
        self._spawn("api", [sys.executable, "-m", "gunicorn", "-k", "gthread", "--threads",
                            str(api_threads), "-w", "1", "-b", f"127.0.0.1:{self.api_port}",
                            "--timeout", "300", "api.wsgi:app"], env)

    def _spawn(self, name: str, cmd: list[str], env: dict) -> None:
        log = open(self.dir / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited; see {self.dir / (name + '.log')}")
            try:
                if requests.get(f"{self.url}/health", timeout=5).json().get("workers"):
                    return
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"stack not ready; logs in {self.dir}")

    def pids(self) -> dict[str, int]:
        return {"api": self.procs["api"].pid,
                **{n: p.pid for n, p in self.procs.items() if n.startswith("worker")}}

    def stop(self) -> None:
        for name in ("api", *[n for n in self.procs if n.startswith("worker")], "redis"):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (gunicorn's worker), in MiB."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
        return round(sum(p.memory_info().rss for p in procs) / 2**20, 1)
    except psutil.NoSuchProcess:
        return float("nan")


class Soak:
    def __init__(self, url: str, args: argparse.Namespace):
        self.url, self.args = url, args
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.jobs: dict[str, str] = {}  # job id -> final status seen by its client
        self.stop_at = time.monotonic() + args.duration

    # --- one client --------------------------------------------------------------------------
    def client(self, n: int) -> None:
        rng = random.Random(self.args.seed * 1000 + n)
        while time.monotonic() < self.stop_at:
            with self.lock:
                if sum(self.counts[k] for k in ("submitted", "cached")) >= self.args.max_jobs:
                    return
            try:
                self.one_job(rng)
            except requests.RequestException as exc:
                self.count("client_errors")
                self.note(f"client {n}: {type(exc).__name__}: {exc}")
                time.sleep(1)

    def one_job(self, rng: random.Random) -> None:
        repeat = rng.random() < 0.2  # the same deterministic request: answered from the cache
        topic = rng.choice(TOPICS)
        body = {"messages": [{"role": "user", "content": f"Write two sentences about {topic}."}],
                "max_tokens": rng.randint(8, self.args.max_tokens), "temperature": 0.8,
                "cache": repeat, "seed": 7 if repeat else rng.randrange(2**31)}
        if repeat:
            body.update(max_tokens=16, temperature=0, seed=None)
        resp = requests.post(f"{self.url}/v1/jobs", json=body, timeout=30)
        if resp.status_code == 429:
            self.count("rejected_429")
            time.sleep(float(resp.headers.get("Retry-After", "1")))
            return
        if resp.status_code not in (200, 202):
            self.count(f"http_{resp.status_code}")
            self.note(f"submit answered {resp.status_code}: {resp.text[:200]}")
            return
        job = resp.json()
        with self.lock:
            self.counts["submitted"] += 1
            self.counts["cache_hits"] += job.get("cached", False)
            self.jobs[job["id"]] = job["status"]
        action = rng.choices(["stream", "disconnect", "cancel", "poll"],
                             [1 - self.args.cancel_rate - self.args.disconnect_rate - 0.1,
                              self.args.disconnect_rate, self.args.cancel_rate, 0.1])[0]
        if action == "cancel":
            time.sleep(rng.uniform(0, 2))
            requests.delete(f"{self.url}/v1/jobs/{job['id']}", timeout=30)
            final = self.poll(job["id"])
        elif action == "disconnect":
            first = self.stream(job["id"], stop_after=rng.randint(1, 4))
            time.sleep(rng.uniform(0, 1))
            last_id = next((e.id for e in reversed(first) if e.id), None)
            rest = self.stream(job["id"], last_event_id=last_id)
            self.check_resume(first, rest)
            final = self.poll(job["id"])
        elif action == "stream":
            self.stream(job["id"])
            final = self.poll(job["id"])
        else:
            final = self.poll(job["id"])
        with self.lock:
            self.jobs[job["id"]] = final["status"]

    def stream(self, job_id: str, last_event_id: str | None = None, stop_after: int | None = None):
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        events = []
        with requests.get(f"{self.url}/v1/jobs/{job_id}/events", headers=headers, stream=True,
                          timeout=(10, 120)) as resp:
            for event in iter_sse(resp.iter_lines()):
                events.append(event)
                if event.event == "done" or (stop_after and len(events) >= stop_after):
                    break  # leaving the `with` drops the connection mid-stream
        return events

    def check_resume(self, first, rest) -> None:
        """After a resume, chunk indices go on from where the first connection stopped."""
        if first and first[-1].event == "chunk" and rest and rest[0].event == "chunk":
            ok = rest[0].json()["index"] == first[-1].json()["index"] + 1
            self.count("resumes_ok" if ok else "resumes_bad")

    def poll(self, job_id: str) -> dict:
        deadline = time.monotonic() + self.args.drain
        while time.monotonic() < deadline:
            job = requests.get(f"{self.url}/v1/jobs/{job_id}", timeout=30).json()
            if job["status"] not in ("queued", "running"):
                return job
            time.sleep(0.25)
        return job

    def count(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def note(self, message: str) -> None:
        if self.args.verbose:
            print(message, file=sys.stderr)

    # --- the run -----------------------------------------------------------------------------
    def run(self) -> dict:
        threads = [threading.Thread(target=self.client, args=(n,), daemon=True)
                   for n in range(self.args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.args.duration + self.args.drain + 60)
        return self.reconcile()

    def reconcile(self) -> dict:
        """Read every submitted job back: each must have ended, completed or cancelled."""
        outcome: Counter[str] = Counter()
        failures = []
        for job_id in list(self.jobs):
            job = requests.get(f"{self.url}/v1/jobs/{job_id}", timeout=30).json()
            status = job.get("status", "missing")
            key = {"succeeded": "completed", "cancelled": "cancelled"}.get(status, "failed")
            outcome[key] += 1
            if key == "failed":
                failures.append({"id": job_id, "status": status, "error": job.get("error")})
        return {"submitted": len(self.jobs), "completed": outcome["completed"],
                "cancelled": outcome["cancelled"], "failed": outcome["failed"],
                "failures": failures[:10], "client_counts": dict(sorted(self.counts.items()))}


class Sampler(threading.Thread):
    """Memory and Redis connections every few seconds while the soak runs: a leak climbs, a
    pool or allocator that warms up levels off."""

    def __init__(self, pids: dict[str, int], redis_url: str | None, every_s: float = 5):
        super().__init__(daemon=True)
        self.pids, self.redis_url, self.every_s = pids, redis_url, every_s
        self.samples: list[dict] = []
        self.done = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.done.wait(self.every_s):
            self.samples.append({"t": round(time.monotonic() - started),
                                 **{n: rss_mb(p) for n, p in self.pids.items()},
                                 "redis_clients": redis_clients(self.redis_url)})


def redis_clients(redis_url: str | None) -> int | None:
    if not redis_url:
        return None
    import redis

    return redis.Redis.from_url(redis_url).info("clients")["connected_clients"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=120, help="seconds of submitting")
    parser.add_argument("--max-jobs", type=int, default=100_000, help="stop submitting after this many")
    parser.add_argument("--drain", type=float, default=600, help="seconds to wait for the last jobs")
    parser.add_argument("--max-tokens", type=int, default=48, help="largest max_tokens asked")
    parser.add_argument("--cancel-rate", type=float, default=0.15)
    parser.add_argument("--disconnect-rate", type=float, default=0.15)
    parser.add_argument("--workers", type=int, default=1, help="workers of the own stack")
    parser.add_argument("--max-batch", type=int, default=16, help="the own stack's engine batch")
    parser.add_argument("--url", help="target a running API instead (loopback only)")
    parser.add_argument("--api-pid", type=int, help="with --url: the API's pid, for its memory")
    parser.add_argument("--worker-pid", type=int, action="append", default=[], help="with --url")
    parser.add_argument("--redis-url", help="with --url: to count Redis clients")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the report as JSON only")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)

    stack = None
    if args.url:
        if urlparse(args.url).hostname not in LOOPBACK:
            parser.error("--url must point at this machine (127.0.0.1, localhost or ::1)")
        url, redis_url = args.url.rstrip("/"), args.redis_url
        pids = {"api": args.api_pid, **{f"worker{i}": p for i, p in enumerate(args.worker_pid)}}
        pids = {k: v for k, v in pids.items() if v}
    else:
        stack = OwnStack(args.workers, args.max_batch, api_threads=max(64, 2 * args.clients + 16))
        url, redis_url, pids = stack.url, stack.redis_url, {}
    try:
        if stack:
            stack.wait_ready()
            pids = stack.pids()
            requests.post(f"{url}/v1/jobs", json={"prompt": "warm up", "max_tokens": 4, "cache": False},
                          timeout=30)  # first request loads the tokenizer in the API
            time.sleep(2)
        before = {name: rss_mb(pid) for name, pid in pids.items()}
        clients_before = redis_clients(redis_url)
        started = time.monotonic()
        sampler = Sampler(pids, redis_url)
        sampler.start()
        report = Soak(url, args).run()
        elapsed = time.monotonic() - started
        time.sleep(2)  # let dropped SSE connections be noticed
        sampler.done.set()
        report.update(
            clients=args.clients, duration_s=args.duration, wall_s=round(elapsed, 1),
            rss_mb_before=before, rss_mb_after={name: rss_mb(pid) for name, pid in pids.items()},
            redis_clients_before=clients_before, redis_clients_after=redis_clients(redis_url),
            samples=sampler.samples)
    finally:
        if stack:
            stack.stop()
    return print_report(report, args.json)


def print_report(report: dict, as_json: bool) -> int:
    ok = report["failed"] == 0 and report["completed"] + report["cancelled"] == report["submitted"]
    report["ok"] = ok
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print(f"soak: {report['clients']} clients, {report['duration_s']:g} s of submitting "
              f"({report['wall_s']:g} s with the drain)")
        for key in ("submitted", "completed", "cancelled", "failed"):
            print(f"  {key:<10} {report[key]}")
        print(f"  client side {report['client_counts']}")
        print(f"  memory MiB before {report['rss_mb_before']} after {report['rss_mb_after']}")
        print(f"  redis clients before {report['redis_clients_before']} "
              f"after {report['redis_clients_after']}; every 5 s during the run:")
        for sample in report["samples"]:
            print(f"    t={sample.pop('t'):>4}s {sample}")
        print(f"  {'OK' if ok else 'FAILED'}: failed == 0 and completed + cancelled == submitted")
        if report["failures"]:
            print("  first failures:", json.dumps(report["failures"], indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
