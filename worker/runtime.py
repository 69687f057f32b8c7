"""The per-process worker runtime: one model, one engine loop, one heartbeat.

Built once before the Celery consumer starts, so no job is taken before the model is loaded and
no model exists before a fork (the worker uses Celery's threads pool: one thread per batch slot).
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

import redis
import torch

from common.jobs import JobStore
from common.keys import Keys
from common.models import ModelRef, resolve_model
from common.settings import Settings
from worker.engine.engine import LLMEngine
from worker.engine.loop import EngineLoop

log = logging.getLogger(__name__)


class WorkerRuntime:
    def __init__(self, settings: Settings, model: ModelRef, loop: EngineLoop, engine_kind: str):
        self.settings = settings
        self.model = model
        self.loop = loop
        self.engine_kind = engine_kind
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.keys = Keys(settings.namespace)
        self.redis = redis.Redis.from_url(settings.redis_url, decode_responses=True,
                                          health_check_interval=30)
        self.store = JobStore(self.redis, self.keys, settings.job_ttl_s, settings.events_maxlen)

    @classmethod
    def build(cls, settings: Settings) -> "WorkerRuntime":
        model = resolve_model(settings, prepare=True)
        log.info("loading model %s from %s (%s), engine=%s", model.name, model.path, model.source,
                 settings.engine)
        engine = _build_engine(settings, model)
        return cls(settings, model, EngineLoop(engine), settings.engine)

    @property
    def queue(self) -> str:
        return self.keys.queue(self.model.name)

    def start_heartbeat(self) -> None:
        threading.Thread(target=self._heartbeat_forever, name="heartbeat", daemon=True).start()

    def _heartbeat_forever(self) -> None:
        while True:
            try:
                self.heartbeat()
            except redis.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)
            time.sleep(self.settings.heartbeat_s)

    def heartbeat(self) -> None:
        stats = self.loop.engine.stats
        info = {
            "name": self.name, "model": self.model.name, "queue": self.queue, "pid": os.getpid(),
            "engine": self.engine_kind, "max_batch_size": self.settings.max_batch_size,
            "cpus": sorted(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
            "steps": stats.steps, "tokens_generated": stats.tokens_generated,
            "max_batch_seen": stats.max_batch_size, "updated_at": time.time(),
        }
        pipe = self.redis.pipeline()
        pipe.hset(self.keys.workers, self.name, json.dumps(info))
        pipe.set(self.keys.worker_alive(self.name), "1", ex=max(3, int(3 * self.settings.heartbeat_s)))
        pipe.execute()


def _build_engine(settings: Settings, model: ModelRef):
    if settings.engine == "vllm":
        from worker.engine.vllm_engine import VLLMEngine

        return VLLMEngine(model.path, settings)
    from transformers import AutoTokenizer

    from worker.engine.runner_hf import HFModelRunner
    from worker.engine.structured import StructuredOutput

    runner = HFModelRunner(model.path, settings.dtype)
    tokenizer = AutoTokenizer.from_pretrained(model.path)
    structured = StructuredOutput.from_tokenizer(tokenizer, runner.config.vocab_size, runner.eos_token_ids)
    return LLMEngine(runner, tokenizer, settings.max_batch_size, settings.max_batch_tokens, structured)


_runtime: WorkerRuntime | None = None


def set_runtime(runtime: WorkerRuntime) -> None:
    global _runtime
    _runtime = runtime


def get_runtime() -> WorkerRuntime:
    if _runtime is None:
        raise RuntimeError("worker runtime not built; start workers with `python -m worker`")
    return _runtime
