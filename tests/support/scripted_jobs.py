"""Jobs run in-process: queued straight into the store (no API) and run by the worker's job runner
on a scripted engine (no model), so each moment of a job can be staged."""
from __future__ import annotations

import time
import uuid

from tests.support.fakes import CharTokenizer, ScriptedRunner
from worker.engine.hf_engine import HFEngine
from worker.engine.loop import EngineLoop
from worker.job_runner import JobRunner

# settings for a job runner driven by a test: quick heartbeats and cancel polls, two attempts
RUNNER_SETTINGS = dict(heartbeat_s=0.2, cancel_poll_s=0.02, max_attempts=2, redis_retry_s=10)


class SlowRunner(ScriptedRunner):
    """A scripted runner that takes `delay` seconds per step, like a real model would."""

    def __init__(self, scripts, delay=0.02):
        super().__init__(scripts)
        self.delay = delay

    def prefill(self, request_ids, prompts):
        time.sleep(self.delay)  # the model's time for a step
        return super().prefill(request_ids, prompts)

    def decode(self, last_tokens):
        time.sleep(self.delay)  # the model's time for a step
        return super().decode(last_tokens)


def queue_job(store, max_tokens=64, top_logprobs=None, job_id=None, **fields) -> str:
    """A queued job (`top_logprobs`: it asks for logprobs with that many alternatives)."""
    job_id = job_id or uuid.uuid4().hex
    sampling = {"max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None,
                "stop": []}
    if top_logprobs is not None:
        sampling.update(logprobs=True, top_logprobs=top_logprobs)
    store.create(job_id, {"id": job_id, "status": "queued", "model": "m", "created_at": time.time(),
                          "prompt_tokens": 1, "request": {"prompt_token_ids": [1], "sampling": sampling},
                          **fields}, queue_limit=0)
    return job_id


def make_runner(store, settings, scripts, name="w2", delay=0.0):
    runner = SlowRunner(scripts, delay)
    loop = EngineLoop(HFEngine(runner, CharTokenizer()))
    return JobRunner(store, loop, name, settings), runner


def events_of(store, job_id):
    return [(event, data) for _, event, data in store.token_log.read_events(job_id)]
