"""The autoscaling signal against the truth during a load ramp: `llmq_model_desired_workers` (what
deploy/kubernetes/keda.yaml scales on) beside the true number of jobs waiting and running, and
beside what a scaler on the broker queue's length (KEDA's Redis list scaler) would ask for.

One worker with a small batch, jobs submitted in steps (a ramp), then left to drain; every half
second the API's /metrics is read and every outstanding job's status is looked up.

    python -m bench.studies.scaling_signal [--slots 4] [--steps 6] [--per-step 3]
"""
from __future__ import annotations

import argparse
import math
import tempfile
import threading
import time
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.results import markdown_table
from bench.harness.servers import Stack

PROMPT = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 400, "temperature": 0, "cache": False}


def metrics(url: str) -> dict[tuple[str, tuple], float]:
    text = requests.get(f"{url}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(url: str, jobs: list[str], slots: int) -> dict:
    statuses = [requests.get(f"{url}/v1/jobs/{j}", timeout=10).json()["status"] for j in jobs]
    m = metrics(url)
    model = next(dict(labels)["model"] for name, labels in m if name == "llmq_model_desired_workers")
    queue_list = sum(v for (name, _), v in m.items() if name == "llmq_queue_depth")
    truth_queued, truth_running = statuses.count("queued"), statuses.count("running")
    return {"queued": truth_queued, "running": truth_running,
            "desired_true": math.ceil((truth_queued + truth_running) / slots),
            "desired": int(m["llmq_model_desired_workers", (("model", model),)]),
            "list": int(queue_list), "list_scaler": math.ceil(queue_list / slots)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--slots", type=int, default=4, help="the worker's batch size")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--per-step", type=int, default=3, help="jobs added at each step")
    parser.add_argument("--step-s", type=float, default=1.0)
    args = parser.parse_args()

    stack = Stack(args.redis, args.model, Path(tempfile.mkdtemp(prefix="scaling-")),
                  {"LLMQ_MAX_BATCH_SIZE": str(args.slots)})
    try:
        stack.wait_ready()
        jobs: list[str] = []
        rows: list[dict] = []
        ramping = threading.Event()
        ramping.set()

        def ramp() -> None:
            for _ in range(args.steps):
                jobs.extend(requests.post(f"{stack.url}/v1/jobs", json=PROMPT, timeout=30).json()["id"]
                            for _ in range(args.per_step))
                time.sleep(args.step_s)
            ramping.clear()

        threading.Thread(target=ramp, daemon=True).start()
        started = time.monotonic()
        while ramping.is_set() or any(r for r in rows[-1:] if r["queued"] + r["running"]):
            row = sample(stack.url, list(jobs), args.slots)
            rows.append({"t": round(time.monotonic() - started, 1), **row})
            time.sleep(0.5)
        print(markdown_table(["t (s)", "queued", "running", "desired (true)", "llmq_model_desired_workers",
                              "broker list", "list scaler"],
                             [[r["t"], r["queued"], r["running"], r["desired_true"], r["desired"], r["list"],
                               r["list_scaler"]] for r in rows[::2]]))
        busy = [r for r in rows if r["queued"] + r["running"]]
        exact = sum(r["desired"] == r["desired_true"] for r in busy)
        under = sum(r["list_scaler"] < r["desired_true"] for r in busy)
        print(f"\nwhile there was work ({len(busy)} samples): llmq_model_desired_workers equal to the truth in "
              f"{exact}, off by one in {sum(abs(r['desired'] - r['desired_true']) == 1 for r in busy)}; "
              f"the list scaler asked for fewer workers than needed in {under}, "
              f"for none at all in {sum(r['list_scaler'] == 0 for r in busy)}")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
