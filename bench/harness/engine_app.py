"""The OpenVINO engine's ceiling: its pipeline, built by llmq's own `build_pipeline` on the source
llmq's worker would serve, driven in process by closed-loop clients, with no server, queue or
text relay around it. What llmq's OpenVINO stack delivers is measured against this.

    LLMQ_MODEL=embedded HF_HUB_OFFLINE=1 .venv/bin/python -m bench.harness.engine_app --port 8012

It is a process of its own (so the benchmark's own client threads never share its GIL), with one
endpoint: `POST /drive {"clients", "per_client", "max_tokens", "first_prompt", "workload"}` runs
that load to its end and answers every request's sample. The load is the harness's own: the same
prompts (`bench.harness.prompts.WORKLOADS`, as a user message under llmq's chat template), greedy,
the same lengths. Each of the clients adds its next request the moment its last one ends, between two steps
of the pipeline, the way a closed-loop HTTP client would, without the HTTP: time to first token
runs from adding the request to the step that made its first token, and tokens are the ids the
pipeline made (what a server reports as completion tokens).
"""
from __future__ import annotations

import argparse
import logging
import time

from flask import Flask, jsonify, request

from bench.harness.llmq_pipeline import llmq_pipeline
from bench.harness.prompts import WORKLOADS
from common.prompting import PromptBuilder
from common.settings import Settings
from worker.engine.model_config import eos_token_ids
from worker.engine.openvino_core import generation_config, read_new_tokens
from worker.engine.sequence import Sampling

log = logging.getLogger("engine_app")


def closed_loop(pipeline, prompts: list[list[list[int]]], config) -> tuple[list[dict], float]:
    """Each client's prompts (token ids) one after another, every client at once, on one thread:
    a sample per request ({"ok", "ttft", "latency", "tokens"}) and the wall time."""
    import numpy as np
    import openvino as ov

    samples: list[dict] = []
    live: dict[int, tuple[object, int, float, dict]] = {}  # request id -> (handle, client, start, sample)
    next_of = [0] * len(prompts)
    ids = iter(range(10**9))

    def submit(client: int) -> None:
        if next_of[client] < len(prompts[client]):
            tensor = ov.Tensor(np.asarray([prompts[client][next_of[client]]], dtype=np.int64))
            next_of[client] += 1
            request_id = next(ids)
            handle = pipeline.add_request(request_id, tensor, config)
            live[request_id] = (handle, client, time.perf_counter(), {"ok": False, "ttft": 0.0, "tokens": 0})

    start = time.perf_counter()
    for client in range(len(prompts)):
        submit(client)
    while live:
        pipeline.step()
        now = time.perf_counter()
        for request_id, (handle, client, began, sample) in list(live.items()):
            if not handle.can_read():
                continue
            new_ids, reason, _ = read_new_tokens(handle)
            if new_ids and not sample["tokens"]:
                sample["ttft"] = now - began
            sample["tokens"] += len(new_ids)
            if reason is not None:
                sample.update(ok=True, latency=now - began)
                samples.append(sample)
                del live[request_id]
                submit(client)
    return samples, time.perf_counter() - start


logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
settings = Settings()
model, pipeline, info = llmq_pipeline(settings)
prompts, eos = PromptBuilder(model.path, settings.max_model_len), eos_token_ids(model.path)
app = Flask(__name__)


@app.get("/health")
def health():
    return jsonify(status="ok", model=model.name, **info)


@app.post("/drive")
def drive():
    body = request.get_json()
    clients, per_client, first = body["clients"], body["per_client"], body.get("first_prompt", 0)
    prompt = WORKLOADS[body.get("workload", "stories")]
    load = [[prompts.build([{"role": "user", "content": prompt(n)}], None)[1]
             for n in range(first + c * per_client, first + (c + 1) * per_client)] for c in range(clients)]
    config = generation_config(Sampling(max_tokens=body["max_tokens"], temperature=0.0), eos)
    samples, wall = closed_loop(pipeline, load, config)
    return jsonify(samples=samples, wall_s=wall)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8012)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app.run(args.host, args.port, threaded=False)
