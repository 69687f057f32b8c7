"""What one admission costs the API process: CPU time, Redis round trips and broker publishes per
non-streaming `POST /v1/jobs`, measured in process (Flask's test client, no HTTP server, no worker)
against the real Redis of `LLMQ_REDIS_URL`, in a namespace of its own that it deletes after.

    .venv/bin/python -m bench.studies.admission_cost --requests 300

Each request is a distinct chat prompt with `"cache": false` (a queued job, its ticket, and its
place in line in the answer). The CPU time is `time.process_time` over the measured requests,
after a few to warm up; it includes validation, tokenizing and the answer's JSON, as a real
admission does. `--system-tokens N` puts the same system prompt of about N tokens before every
question, as an application's instructions or an agent's tool list come with each request.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

import redis
from kombu import Producer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from api import create_app  # noqa: E402
from api.eta import queue_eta  # noqa: E402
from bench.harness.prompts import support_question, system_prompt  # noqa: E402
from common.schemas import JobRequest  # noqa: E402
from common.settings import get_settings  # noqa: E402

WARMUP = 20
_calls = {"round_trips": 0, "publishes": 0}


def _count(cls, name: str, counter: str) -> None:
    """Count every call of `cls.name` under `counter` (a pipeline is one round trip)."""
    original = getattr(cls, name)

    def counted(*args, **kwargs):
        _calls[counter] += 1
        return original(*args, **kwargs)
    setattr(cls, name, counted)


def body(i: int, system: str | None = None) -> dict:
    """Request i: a distinct question, under `system` when given."""
    messages = support_question([system], i) if system else \
        [{"role": "user", "content": f"Question {uuid.uuid4().hex} number {i}?"}]
    return {"messages": messages, "max_tokens": 16, "cache": False}


def whole_requests(app, count: int, system: str | None = None) -> dict:
    client = app.test_client()

    def post(i: int) -> None:
        resp = client.post("/v1/jobs", json=body(i, system))
        assert resp.status_code == 202, resp.get_data(as_text=True)
    return {"what": "POST /v1/jobs, whole", **measure(post, count)}


def admissions(app, count: int, system: str | None = None) -> dict:
    svc = app.extensions["llmq"]
    requests = [JobRequest.model_validate(body(i, system)) for i in range(count + WARMUP)]

    def admit(i: int) -> None:
        status, record, ahead = svc.admission.submit(requests[i], owner=None, priority="normal", place=True)
        assert status == 202 and "queue_position" in queue_eta(svc, record, ahead)
    return {"what": "admission alone", **measure(admit, count)}


def measure(one, count: int) -> dict:
    for i in range(WARMUP):
        one(i)
    _calls.update(round_trips=0, publishes=0)
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(WARMUP, WARMUP + count):
        one(i)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"requests": count, "cpu_ms_per_request": round(1000 * cpu / count, 3),
            "wall_ms_per_request": round(1000 * wall / count, 3),
            "redis_round_trips_per_request": round(_calls["round_trips"] / count, 2),
            "kombu_publishes_per_request": round(_calls["publishes"] / count, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--system-tokens", type=int, default=0,
                        help="the same system prompt of about this many tokens before every question")
    args = parser.parse_args()
    settings = get_settings().model_copy(update={
        "namespace": f"llmqbench-{uuid.uuid4().hex[:8]}", "max_queue": 100_000, "model": "embedded",
        "allow_download": False})
    _count(redis.connection.AbstractConnection, "send_packed_command", "round_trips")
    _count(Producer, "publish", "publishes")
    app = create_app(settings)
    system = system_prompt(app.extensions["llmq"].admission.model()[1], args.system_tokens, 0) \
        if args.system_tokens else None
    try:
        print(json.dumps(whole_requests(app, args.requests, system)), flush=True)
        print(json.dumps(admissions(app, args.requests, system)), flush=True)
    finally:
        r = redis.Redis.from_url(settings.redis_url)
        for key in r.scan_iter(f"{settings.namespace}*", count=1000):
            r.delete(key)


if __name__ == "__main__":
    main()
