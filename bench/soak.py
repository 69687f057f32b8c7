"""Soak test: many concurrent clients for a while, with random cancels and disconnects.

    python bench/soak.py                         # 64 clients for 120 s on a stack of its own
    python bench/soak.py --clients 16 --duration 20
    python bench/soak.py --url http://127.0.0.1:8000 --api-pid P --worker-pid Q
    python bench/soak.py --chaos --duration 300     # the chaos soak (below)

Without --url it starts its own stack on loopback: a private redis-server on a free port, one
worker (`python -m worker`) and the API under gunicorn, and stops them at the end. Each client
loops until the duration is up (or --max-jobs were submitted): submit a job, then stream it to the
end, or stream a little, drop the connection and resume with Last-Event-ID, or cancel it after a
random delay, or poll it. Some requests repeat a deterministic prompt, so the result cache answers
them. When time is up, clients follow their last job to its end; then every job is read back.

Streaming clients follow their job to `done` across broken streams (resuming with Last-Event-ID,
dropping their text on `restart`) and compare what they assembled with the job's record; at the end
every succeeded job is also replayed from the start and compared. Submissions and reads answered
503 are retried after Retry-After.

Reported: submitted = succeeded + cancelled + failed + lost (lost: unknown or never ended; must be
0), failed must be 0 (each failure is listed with its reason), answers with duplicated or missing
text (must be 0), requests refused with 429/503, client-side errors, and the memory of every process
(and Redis clients) at the start and end. Exit status 1 if the accounting does not hold.
Loopback only: it refuses any other host.

`--chaos` adds faults on its own stack: Redis as a Sentinel group (master, replica, three
sentinels), `--workers 2`, a kill -9 of a random worker every 30-60 s (`--kill-every`), restarted
at once, and one master failover in the middle (`--failover-at`). Jobs of a killed worker are
redelivered and continued from their logs (a `restart` on their streams only where they cannot
be: docs/reliability.md), so with chaos `failed` may hold jobs that hit `LLMQ_MAX_ATTEMPTS`; each
is listed with its reason.

`--responses` runs the same load as OpenAI background responses through the `openai` package
(bench/soak_responses.py: tool calls, resumes by sequence number, cancels, polls), with or without
`--chaos`; `--apis 2` gives the stack a second API process, so resumes move between processes:

    python bench/soak.py --responses --chaos --apis 2 --clients 16 --duration 300
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.chaos import Chaos  # noqa: E402
from bench.harness.measures import rss_mb  # noqa: E402
from bench.harness.prompts import TOPICS  # noqa: E402
from bench.harness.servers import Stack  # noqa: E402
from bench.harness.soak_clients import SoakClients  # noqa: E402
from bench.soak_responses import ResponsesSoak  # noqa: E402
from common.sseclient import follow_job  # noqa: E402
from tests.support.ports import redis_port  # noqa: E402
from tests.support.processes import PrivateRedis  # noqa: E402
from tests.support.redis_group import RedisGroup  # noqa: E402

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class OwnRedis:
    """The soak's own Redis on loopback: one redis-server, or with `ha` a Sentinel group (master,
    replica, three sentinels) whose master a failover moves. Ports from `LLMQ_TEST_REDIS_PORTS`
    (--redis-ports) where set."""

    def __init__(self, folder: Path, ha: bool):
        self.group = RedisGroup(folder / "redis", redis_port) if ha else None
        self.server = None if ha else PrivateRedis(folder)
        (self.group or self.server).start()

    @property
    def url(self) -> str:
        port = self.group.master_port() if self.group else self.server.port
        return f"redis://127.0.0.1:{port}/0"

    def stack_env(self) -> dict[str, str]:
        if not self.group:
            return {}
        # workers lose jobs to kill -9: redeliver them within seconds, not minutes
        return {"LLMQ_REDIS_SENTINELS": self.group.sentinels_setting, "LLMQ_VISIBILITY_TIMEOUT_S": "10",
                "LLMQ_BROKER_RESTORE_INTERVAL_S": "1", "LLMQ_HEARTBEAT_S": "1"}

    def pids(self) -> dict[str, int]:
        return self.group.pids() if self.group else {"redis": self.server.proc.pid}

    def stop(self) -> None:
        (self.group or self.server).stop()


def own_stack(args, folder: Path) -> tuple[Stack, OwnRedis]:
    """Redis, `--workers` workers and `--apis` API processes, all on 127.0.0.1, logs in `folder`."""
    if args.redis_ports:
        os.environ["LLMQ_TEST_REDIS_PORTS"] = args.redis_ports
    own_redis = OwnRedis(folder, ha=args.chaos)
    env = {"LLMQ_MAX_BATCH_SIZE": str(args.max_batch), "LLMQ_MAX_QUEUE": "10000",
           "TOKENIZERS_PARALLELISM": "false", **own_redis.stack_env()}
    stack = Stack(own_redis.url, os.environ.get("LLMQ_MODEL", "embedded"), folder, env, workers=args.workers,
                  apis=args.apis, result_cache=True, named_workers=True, api_timeout_s=300)
    return stack, own_redis


class Soak(SoakClients):
    def __init__(self, url: str, args: argparse.Namespace):
        super().__init__(args)
        self.url = url
        self.jobs: dict[str, str] = {}  # job id -> final status seen by its client
        self.bad_answers: list[dict] = []

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
        if resp.status_code in (429, 503):  # queue full, or Redis switching masters: come back later
            self.count(f"refused_{resp.status_code}")
            time.sleep(min(float(resp.headers.get("Retry-After", "1")), 5))
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
        elif action in ("stream", "disconnect"):  # a disconnecting client drops and resumes
            answer = follow_job(self.url, job["id"], timeout=self.args.drain,
                                stop_after_chunks=rng.randint(1, 4) if action == "disconnect" else None)
        final = self.poll(job["id"])
        if action in ("stream", "disconnect"):
            self.check_answer(answer, final)
        with self.lock:
            self.jobs[job["id"]] = final.get("status", "unknown")

    def check_answer(self, answer, final: dict) -> None:
        """What the client assembled from the stream is the job's answer: nothing twice, nothing missing."""
        if answer.reconnects:
            self.count("streams_resumed")
        if answer.restarts:
            self.count("streams_with_restart")
        if final.get("status") != "succeeded" or answer.done is None:
            return
        ok = answer.text == final["text"] and not answer.out_of_order
        self.count("answers_ok" if ok else "answers_bad")
        if not ok:
            with self.lock:
                self.bad_answers.append({"id": final["id"], "streamed": answer.text, "record": final["text"],
                                         "out_of_order": answer.out_of_order})

    def get_job(self, job_id: str) -> dict:
        """The job record, reading through 503s (a Redis switch) and dropped connections."""
        for _ in range(120):
            try:
                resp = requests.get(f"{self.url}/v1/jobs/{job_id}", timeout=30)
                if resp.status_code in (200, 404):
                    return resp.json() if resp.status_code == 200 else {"status": "missing"}
            except requests.RequestException:
                pass
            time.sleep(0.5)
        return {"status": "unreachable"}

    def poll(self, job_id: str) -> dict:
        deadline = time.monotonic() + self.args.drain
        while time.monotonic() < deadline:
            job = self.get_job(job_id)
            if job["status"] not in ("queued", "running"):
                return job
            time.sleep(0.25)
        return job

    def reconcile(self) -> dict:
        """Read every submitted job back: each must have ended; a succeeded one's log, replayed
        from the start, must give exactly its text."""
        outcome: Counter[str] = Counter()
        failures, lost, replay_bad = [], [], []
        for job_id in list(self.jobs):
            job = self.get_job(job_id)
            status = job.get("status", "missing")
            key = status if status in ("succeeded", "cancelled", "failed", "expired") else "lost"
            outcome[key] += 1
            if key in ("failed", "expired"):
                failures.append({"id": job_id, "status": status, "error": job.get("error"),
                                 "attempts": job.get("attempts")})
            elif key == "lost":
                lost.append({"id": job_id, "status": status})
            elif key == "succeeded":
                replay = follow_job(self.url, job_id, timeout=60)
                if replay.text != job["text"] or replay.out_of_order:
                    replay_bad.append({"id": job_id, "replayed": replay.text, "record": job["text"]})
        return {"submitted": len(self.jobs), "succeeded": outcome["succeeded"],
                "cancelled": outcome["cancelled"], "failed": outcome["failed"] + outcome["expired"],
                "lost": outcome["lost"], "failures": failures, "lost_jobs": lost[:10],
                "answers_bad": len(self.bad_answers) + len(replay_bad),
                "bad_answers": (self.bad_answers + replay_bad)[:5],
                "client_counts": dict(sorted(self.counts.items()))}


class Sampler(threading.Thread):
    """Memory and Redis connections every few seconds while the soak runs: a leak climbs, a
    pool or allocator that warms up levels off."""

    def __init__(self, pids, redis_url, every_s: float = 5):
        super().__init__(daemon=True)
        self.pids, self.redis_url, self.every_s = pids, redis_url, every_s  # callables: they change
        self.samples: list[dict] = []
        self.done = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.done.wait(self.every_s):
            self.samples.append({"t": round(time.monotonic() - started),
                                 **{n: rss_mb(p) for n, p in self.pids().items()},
                                 "redis_clients": redis_clients(self.redis_url())})


def redis_clients(redis_url: str | None) -> int | None:
    if not redis_url:
        return None
    import redis

    try:
        return redis.Redis.from_url(redis_url).info("clients")["connected_clients"]
    except redis.RedisError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds of submitting (default 120; 300 with --chaos)")
    parser.add_argument("--max-jobs", type=int, default=100_000, help="stop submitting after this many")
    parser.add_argument("--drain", type=float, default=600, help="seconds to wait for the last jobs")
    parser.add_argument("--max-tokens", type=int, default=48, help="largest max_tokens asked")
    parser.add_argument("--cancel-rate", type=float, default=0.15)
    parser.add_argument("--disconnect-rate", type=float, default=0.15)
    parser.add_argument("--workers", type=int, default=None, help="workers of the own stack (1; 2 with --chaos)")
    parser.add_argument("--max-batch", type=int, default=16, help="the own stack's engine batch")
    parser.add_argument("--chaos", action="store_true", help="Sentinel-managed Redis, worker kills, a failover")
    parser.add_argument("--responses", action="store_true",
                        help="background responses through the openai package (bench/soak_responses.py)")
    parser.add_argument("--tool-rate", type=float, default=0.3, help="with --responses: share with a tool forced")
    parser.add_argument("--apis", type=int, default=1, help="API processes of the own stack")
    parser.add_argument("--kill-every", default="30-60", help="with --chaos: seconds between worker kills")
    parser.add_argument("--failover-at", type=float, help="with --chaos: seconds in (default: half the duration)")
    parser.add_argument("--redis-ports", help="'first-last': ports for the own Redis servers and sentinels")
    parser.add_argument("--keep-logs", action="store_true", help="keep the own stack's logs")
    parser.add_argument("--url", help="target a running API instead (loopback only)")
    parser.add_argument("--api-pid", type=int, help="with --url: the API's pid, for its memory")
    parser.add_argument("--worker-pid", type=int, action="append", default=[], help="with --url")
    parser.add_argument("--redis-url", help="with --url: to count Redis clients")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the report as JSON only")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    args.duration = args.duration if args.duration is not None else (300 if args.chaos else 120)
    args.workers = args.workers or (2 if args.chaos else 1)

    stack = own_redis = chaos = folder = None
    if args.url:
        if urlparse(args.url).hostname not in LOOPBACK:
            parser.error("--url must point at this machine (127.0.0.1, localhost or ::1)")
        if args.chaos:
            parser.error("--chaos needs the soak's own stack (no --url)")
        url = args.url.rstrip("/")
        fixed = {"api": args.api_pid, **{f"worker{i}": p for i, p in enumerate(args.worker_pid)}}
        fixed = {k: v for k, v in fixed.items() if v}
        pids, redis_url = (lambda: fixed), (lambda: args.redis_url)
    else:
        folder = Path(tempfile.mkdtemp(prefix="llmq-soak-"))
    try:
        if folder:
            stack, own_redis = own_stack(args, folder)
            url, redis_url = stack.url, (lambda: own_redis.url)
            pids = lambda: {**stack.pids(), **own_redis.pids()}  # noqa: E731
            stack.wait_ready(300)
            requests.post(f"{url}/v1/jobs", json={"prompt": "warm up", "max_tokens": 4, "cache": False},
                          timeout=30)  # first request loads the tokenizer in the API
            time.sleep(2)
        before = {name: rss_mb(pid) for name, pid in pids().items()}
        clients_before = redis_clients(redis_url())
        started = time.monotonic()
        sampler = Sampler(pids, redis_url)
        sampler.start()
        soak = ResponsesSoak(stack.urls if stack else [url], args) if args.responses else Soak(url, args)
        if args.chaos:
            low, high = map(float, args.kill_every.split("-"))
            failover_at = args.failover_at if args.failover_at is not None else args.duration / 2
            chaos = Chaos(stack, own_redis.group, (low, high), failover_at, soak.stop_at, seed=args.seed)
            chaos.start()
        report = soak.run()
        elapsed = time.monotonic() - started
        if chaos:
            chaos.done.set()
            chaos.join(90)
        time.sleep(2)  # let dropped SSE connections be noticed
        sampler.done.set()
        report.update(
            clients=args.clients, duration_s=args.duration, wall_s=round(elapsed, 1),
            rss_mb_before=before, rss_mb_after={name: rss_mb(pid) for name, pid in pids().items()},
            redis_clients_before=clients_before, redis_clients_after=redis_clients(redis_url()),
            chaos=chaos.events if chaos else None, samples=sampler.samples)
    finally:
        if stack:
            stack.stop(forget=False)  # its Redis goes with it
        if own_redis:
            own_redis.stop()
        if folder and args.keep_logs:
            print(f"logs kept in {folder}", file=sys.stderr)
        elif folder:
            shutil.rmtree(folder, ignore_errors=True)
    return print_report(report, args.json, strict=not args.chaos)


def print_report(report: dict, as_json: bool, strict: bool = True) -> int:
    """OK: every submitted job is accounted for (succeeded + cancelled + failed), none lost, every
    failure has a reason (and, without chaos, there is none), no answer with text twice or missing."""
    accounted = report["succeeded"] + report["cancelled"] + report["failed"] == report["submitted"]
    reasons = all(f.get("error") for f in report["failures"])
    ok = (accounted and report["lost"] == 0 and reasons and report["answers_bad"] == 0
          and (report["failed"] == 0 or not strict))
    report["ok"] = ok
    if as_json:
        print(json.dumps(report, indent=2))
        return 0 if ok else 1
    print(f"soak: {report['clients']} clients, {report['duration_s']:g} s of submitting "
          f"({report['wall_s']:g} s with the drain)")
    for key in ("submitted", "succeeded", "completed", "incomplete", "cancelled", "failed", "lost",
                "answers_bad"):
        if key in report:
            print(f"  {key:<11} {report[key]}")
    for failure in report["failures"]:
        print(f"    failed {failure['id']}: {failure['status']}, {failure['error']}, attempts {failure['attempts']}")
    print(f"  client side {report['client_counts']}")
    if report["chaos"]:
        print("  chaos:")
        for event in report["chaos"]:
            print(f"    {event}")
    print("  memory MiB, start -> end:")
    for name in sorted(set(report["rss_mb_before"]) | set(report["rss_mb_after"])):
        print(f"    {name:<16} {report['rss_mb_before'].get(name, '-')} -> {report['rss_mb_after'].get(name, '-')}")
    print(f"  redis clients before {report['redis_clients_before']} "
          f"after {report['redis_clients_after']}; every 5 s during the run:")
    for sample in report["samples"]:
        print(f"    t={sample.pop('t'):>4}s {sample}")
    print(f"  {'OK' if ok else 'FAILED'}: submitted == succeeded + cancelled + failed, lost == 0, "
          f"every failure has a reason{', failed == 0' if strict else ''}, answers_bad == 0")
    if report["lost_jobs"] or report["bad_answers"]:
        print("  lost:", json.dumps(report["lost_jobs"]), "bad answers:", json.dumps(report["bad_answers"], indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
