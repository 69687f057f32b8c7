"""How true are the ETAs? A burst of jobs, each 202's `estimated_start` / `estimated_finish` against
when the job really started and finished.

    python -m bench.studies.eta_bench [--burst 32] [--max-tokens 64] [--warmup 8] [--url http://...]

Starts its own llmq stack (worker + API, fresh namespace) unless --url is given; warms the worker
up with a few jobs so its heartbeat carries measured rates (the ETAs come from those), waits one
heartbeat, then submits the burst at once and polls every job to its end. Prints the error
(estimate - actual, seconds) of starts and finishes: median, p90 and max of the absolute error,
the mean signed error (bias), and the same relative to the real wait. Loopback only.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from bench.harness.prompts import TOPICS
from bench.harness.results import save
from bench.harness.servers import Stack
from bench.harness.stats import percentile, rounded


def submit(url: str, index: int, max_tokens: int) -> dict:
    body = {"messages": [{"role": "user", "content": f"Tell me about {TOPICS[index % len(TOPICS)]} ({index})."}],
            "max_tokens": max_tokens, "temperature": 0, "cache": False}
    resp = requests.post(f"{url}/v1/jobs", json=body, timeout=60)
    resp.raise_for_status()
    return resp.json()


def wait_all(url: str, ids: list[str], timeout: float) -> dict[str, dict]:
    done: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    while len(done) < len(ids) and time.monotonic() < deadline:
        for job_id in ids:
            if job_id not in done:
                job = requests.get(f"{url}/v1/jobs/{job_id}", timeout=30).json()
                if job["status"] not in ("queued", "running"):
                    done[job_id] = job
        time.sleep(0.5)
    return done


def error_stats(errors: list[float], waits: list[float]) -> dict:
    absolute = [abs(e) for e in errors]
    relative = [abs(e) / w for e, w in zip(errors, waits) if w > 1.0]
    return {"abs_p50_s": rounded(percentile(absolute, 50), 2), "abs_p90_s": rounded(percentile(absolute, 90), 2),
            "abs_max_s": rounded(percentile(absolute, 100), 2), "bias_s": round(statistics.mean(errors), 2),
            "rel_p50": rounded(percentile(relative, 50)), "rel_p90": rounded(percentile(relative, 90))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burst", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--url")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()

    stack = None if args.url else Stack(args.redis_url, args.model, args.out / "logs", {"LLMQ_HEARTBEAT_S": "1"})
    try:
        if stack:
            stack.wait_ready()
        url = stack.url if stack else args.url
        with ThreadPoolExecutor(args.warmup) as pool:  # measured rates for the heartbeat
            warm = list(pool.map(lambda i: submit(url, 1000 + i, args.max_tokens), range(args.warmup)))
        wait_all(url, [j["id"] for j in warm], 600)
        time.sleep(3)  # a heartbeat with the measurements

        with ThreadPoolExecutor(args.burst) as pool:
            burst = list(pool.map(lambda i: submit(url, i, args.max_tokens), range(args.burst)))
        ended = wait_all(url, [j["id"] for j in burst], 1800)
    finally:
        if stack:
            stack.stop()

    rows = []
    for job in burst:
        end = ended.get(job["id"])
        if not end or "estimated_start" not in job or not end.get("started_at"):
            continue
        rows.append({"position": job["queue_position"], "created": job["created_at"],
                     "est_start": job["estimated_start"], "start": end["started_at"],
                     "est_finish": job["estimated_finish"], "finish": end["finished_at"]})
    rows.sort(key=lambda r: r["position"])
    start_err = [r["est_start"] - r["start"] for r in rows]
    finish_err = [r["est_finish"] - r["finish"] for r in rows]
    start_wait = [r["start"] - r["created"] for r in rows]
    finish_wait = [r["finish"] - r["created"] for r in rows]
    # a job a free slot took before its 202 was written is no longer queued: it has no ETA
    result = {"burst": args.burst, "max_tokens": args.max_tokens, "with_eta": len(rows),
              "taken_before_202": sum("queue_position" not in job for job in burst),
              "ended": len(ended), "start": error_stats(start_err, start_wait),
              "finish": error_stats(finish_err, finish_wait),
              "real_start_wait_max_s": round(max(start_wait), 1),
              "real_finish_wait_max_s": round(max(finish_wait), 1)}
    print(f"{'pos':>4} {'est start':>9} {'start':>7} {'est fin':>8} {'finish':>7}   (s after submit)")
    for r in rows:
        c = r["created"]
        print(f"{r['position']:>4} {r['est_start'] - c:9.1f} {r['start'] - c:7.1f} "
              f"{r['est_finish'] - c:8.1f} {r['finish'] - c:7.1f}")
    print(json.dumps(result, indent=2))
    save(args.out, "eta", {**result, "rows": rows})


if __name__ == "__main__":
    main()
